"""The daemon's HTTP/JSON API (see :mod:`babel.daemon`): handlers translate and delegate to :class:`Daemon`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import asdict
from typing import Any

from aiohttp import web

from babel.daemon.config import DaemonConfig, split_addr
from babel.daemon.engine import Daemon
from babel.daemon.errors import HTTP_STATUS, Forbidden, RequestRejected, Unauthorized, UnsupportedMediaType
from babel.daemon.security import host_allowed, server_token, token_matches
from babel.daemon.validate import check_bool, options_from_json
from babel.errors import BabelError

logger = logging.getLogger(__name__)


def _error_body(exc: BabelError) -> dict[str, Any]:
    return {"error": str(exc), "type": type(exc).__name__, "field": getattr(exc, "field", "")}


@web.middleware
async def _translate_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except tuple(HTTP_STATUS) as exc:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return web.json_response(_error_body(exc), status=HTTP_STATUS[type(exc)], headers=headers)
    except web.HTTPException as exc:  # unknown route or method: JSON too
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "type": "HTTPError", "field": ""}, status=exc.status)


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _guard(daemon: Daemon, token: str):
    """Middleware: the Host header names this daemon, the bearer token is the daemon's, a body is
    JSON (:mod:`babel.daemon.security`). A bare ``GET /healthz`` (a liveness probe) needs no token
    and gets ``{ok}`` only."""

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        port = sockname[1] if sockname else -1
        if not host_allowed(request.headers.get("Host", ""), port, daemon.cfg.allowed_hosts):
            raise Forbidden(
                f"Host {request.headers.get('Host', '')!r} does not name this daemon (see --allowed-host)", field="Host"
            )
        if not token_matches(request.headers.get("Authorization", ""), token):
            if request.method == "GET" and request.path == "/healthz":
                return web.json_response({"ok": True})
            if request.headers.get("Authorization", ""):
                raise Unauthorized("the bearer token is not this daemon's (see `babel daemon --help`: its token file)")
            raise Unauthorized("a bearer token is required (Authorization: Bearer TOKEN; see `babel daemon --help`)")
        if request.method in BODY_METHODS and request.content_type != "application/json":
            raise UnsupportedMediaType(f"the body must be application/json, not {request.content_type or 'none'}")
        return await handler(request)

    return guard


async def _body(request: web.Request, allowed: set[str], required: set[str]) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, 4300+ digits, deep nesting
        raise RequestRejected("the body is not JSON", field="body") from exc
    if not isinstance(body, dict):
        raise RequestRejected("the body must be a JSON object", field="body")
    for name in body:
        if name not in allowed:
            raise RequestRejected(f"unknown field {name!r}", field=name)
    missing = sorted(required - body.keys())
    if missing:
        raise RequestRejected(f"{missing[0]} is required", field=missing[0])
    return body


def make_app(daemon: Daemon, token: str) -> web.Application:
    """The HTTP/JSON API (module docstring) over ``daemon``, open to holders of ``token``;
    handlers only translate and delegate."""
    routes = web.RouteTableDef()

    @routes.post("/jobs")
    async def post_job(request: web.Request) -> web.Response:
        body = await _body(request, {"src", "dst", "options"}, {"src", "dst"})
        options = options_from_json(body.get("options"))
        doc = daemon.submit(body["src"], body["dst"], options)
        return web.json_response({"id": doc["id"], "state": doc["state"]}, status=202)

    @routes.get("/jobs")
    async def get_jobs(request: web.Request) -> web.Response:
        limit = request.query.get("limit")
        if limit is not None and not (limit.isascii() and limit.isdigit()):
            raise RequestRejected("limit must be a non-negative integer", field="limit")
        return web.json_response(daemon.jobs(None if limit is None else int(limit)))

    @routes.get("/jobs/{id}")
    async def get_job(request: web.Request) -> web.Response:
        return web.json_response(daemon.job(request.match_info["id"]))

    @routes.post("/jobs/{id}/resume")
    async def resume_job(request: web.Request) -> web.Response:
        doc = daemon.resume(request.match_info["id"])
        return web.json_response({"id": doc["id"], "state": doc["state"]}, status=202)

    @routes.post("/jobs/{id}/cancel")
    async def cancel_job(request: web.Request) -> web.Response:
        doc = daemon.cancel(request.match_info["id"])
        return web.json_response({"id": doc["id"], "state": doc["state"]}, status=202)

    @routes.post("/schedules")
    async def post_schedule(request: web.Request) -> web.Response:
        body = await _body(request, {"src", "dst", "every", "newest_checkpoint", "options"}, {"src", "dst", "every"})
        newest = check_bool(body.get("newest_checkpoint", False), "newest_checkpoint")
        options = options_from_json(body.get("options"))
        doc = daemon.add_schedule(body["src"], body["dst"], body["every"], newest_checkpoint=newest, options=options)
        return web.json_response(doc, status=201)

    @routes.get("/schedules")
    async def get_schedules(request: web.Request) -> web.Response:
        return web.json_response(daemon.schedules())

    @routes.get("/schedules/{id}")
    async def get_schedule(request: web.Request) -> web.Response:
        return web.json_response(daemon.schedule(request.match_info["id"]))

    @routes.delete("/schedules/{id}")
    async def delete_schedule(request: web.Request) -> web.Response:
        daemon.remove_schedule(request.match_info["id"])
        return web.json_response({"id": request.match_info["id"], "deleted": True})

    @routes.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid(), "state_dir": daemon.state_dir, **daemon.counts()})

    app = web.Application(middlewares=[_translate_errors, _guard(daemon, token)])
    app.add_routes(routes)
    return app


async def serve(cfg: DaemonConfig) -> None:
    """Run the daemon until SIGTERM or SIGINT, then stop: no new requests, jobs cancelled (resumable).

    Raises:
        ValueError: ``cfg.listen`` is not HOST:PORT.
        BabelError: another daemon holds the state directory.
        OSError: the address cannot be bound, or the token file cannot be read or created.
    """
    logger.info("babel daemon config: %s", " ".join(f"{k}={v!r}" for k, v in asdict(cfg).items()))
    host, port = split_addr(cfg.listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    token = server_token(cfg.state_dir, cfg.token_file)
    daemon = Daemon(cfg)
    await daemon.start()
    runner = web.AppRunner(make_app(daemon, token), access_log=None, shutdown_timeout=1.0)
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port, shutdown_timeout=1.0).start()
        logger.info("babel daemon listening on %s", " ".join(f"http://{h}:{p}" for h, p in runner.addresses))
        await stop.wait()
        logger.info("babel daemon stopping")
    finally:
        await runner.cleanup()
        await daemon.close()
    logger.info("babel daemon stopped")
