"""``babel daemon``: runs submitted and scheduled sync jobs and keeps their history.

The daemon owns one state directory (the one ``babel sync`` uses, see
:func:`babel.journal.default_state_dir`): every job is an ordinary resumable job there
(a RocksDB journal plus ``job.json``), so ``babel jobs`` and the daemon show the same
history, jobs run by the CLI included. Schedules live in ``<state_dir>/schedules.json``
(rewritten by atomic rename) and survive restarts. One daemon per state directory
(``daemon.lock``, an ``flock``); liveness of other owners is judged by pid, so the state
directory must be local to one machine.

Jobs run as asyncio tasks through :func:`babel.sync.run_sync`, at most ``max_jobs`` at a
time; the others wait with state ``queued``. On SIGTERM/SIGINT the daemon stops listening
and cancels its jobs (cancellation is a safe point: jobs resume from their journal); at
start it resumes the jobs a stopped or killed daemon left ``queued`` or ``running``.

HTTP/JSON API (errors are ``{"error": MESSAGE, "type": CLASS, "field": NAME}``; 400 for
a malformed request, naming the field, 401 without the bearer token, 403 for a URI outside
the allowed prefixes or a foreign ``Host`` header, 404 for an unknown id, 409 for a busy job,
415 for a body that is not ``application/json``). Every request carries
``Authorization: Bearer TOKEN`` (:mod:`~babel.daemon.security`: where the token lives, the
Host and prefix rules); a bare ``GET /healthz`` answers ``{ok}`` without it:

=============================  =================================================================
``POST /jobs``                 ``{src, dst, options?}`` -> 202 ``{id, state: "queued"}``;
                               ``options`` are :class:`babel.sync.SyncOptions` fields by name
``GET /jobs[?limit=N]``        every job's ``job.json``, newest first
``GET /jobs/{id}``             one ``job.json``: src, dst, options, state (queued, running, ok,
                               partial, failed, canceled), phase, summary (the sync report), pid
``POST /jobs/{id}/resume``     queue a stopped job again -> 202 ``{id, state}``; 409 when it is
                               queued or running already
``POST /jobs/{id}/cancel``     stop a queued or running job -> 202 ``{id, state: "canceling"}``;
                               it ends ``canceled`` (resumable); 409 when it is not active here
``POST /schedules``            ``{src, dst, every, newest_checkpoint?, options?}`` -> 201, the
                               schedule (``id`` included); ``every`` in seconds
``GET /schedules``             every schedule, oldest first
``GET /schedules/{id}``        one schedule: its fields plus last_run (seconds since the epoch),
                               last_job, last_synced, last_error, active (a job of it is queued
                               or running)
``DELETE /schedules/{id}``     drop a schedule (its running job goes on) -> ``{id, deleted}``
``GET /healthz``               ``{ok, pid, running, queued, schedules, state_dir}``
=============================  =================================================================

A schedule submits a sync every ``every`` seconds unless its previous job is still queued
or running. With ``newest_checkpoint`` the source is a directory of checkpoint directories
(``step-100/``, ``step-200/``, ...): the newest committed one (it holds ``.metadata``,
which ``torch.distributed.checkpoint`` writes last), by the number in its name, is synced
from ``SRC/NAME/`` to ``DST/NAME/``, once. It is copied in two jobs so the destination,
too, gets ``.metadata`` last: a ``data`` job excluding it, then a ``commit`` job of
``.metadata`` alone; a reader of the destination never takes a half-copied checkpoint for
a committed one.

The client functions (:func:`submit`, :func:`fetch_jobs`, :func:`fetch_job`) are what
``babel sync --daemon`` and ``babel jobs --daemon`` call; they are synchronous (the CLI is).

Modules: :mod:`~babel.daemon.engine` (the :class:`Daemon`: queue, schedules, history),
:mod:`~babel.daemon.api` (HTTP routes, :func:`serve`), :mod:`~babel.daemon.client`,
:mod:`~babel.daemon.checkpoints` (the newest committed checkpoint),
:mod:`~babel.daemon.validate` (request fields; sync options by :mod:`babel.options`' rules),
:mod:`~babel.daemon.security` (token, Host header, allowed URI prefixes),
:mod:`~babel.daemon.config` and :mod:`~babel.daemon.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use: the HTTP server (aiohttp.web) costs every babel command 0.15 s
    from babel.daemon.api import make_app, serve
    from babel.daemon.checkpoints import join_uri, natural_key, newest_checkpoint
    from babel.daemon.client import CLIENT_TIMEOUT, cancel_job, fetch_job, fetch_jobs, submit
    from babel.daemon.config import DEFAULT_LISTEN, DaemonConfig, Schedule, split_addr
    from babel.daemon.engine import Daemon
    from babel.daemon.errors import Conflict, Forbidden, NotFound, RequestRejected, Unauthorized, UnsupportedMediaType
    from babel.daemon.security import DEFAULT_ALLOW, TOKEN_ENV, check_allowed, client_token, server_token
    from babel.daemon.validate import options_from_json

_HOME = {
    "make_app": "api", "serve": "api",
    "join_uri": "checkpoints", "natural_key": "checkpoints", "newest_checkpoint": "checkpoints",
    "CLIENT_TIMEOUT": "client", "cancel_job": "client", "fetch_job": "client", "fetch_jobs": "client",
    "submit": "client",
    "DEFAULT_LISTEN": "config", "DaemonConfig": "config", "Schedule": "config", "split_addr": "config",
    "Daemon": "engine",
    "Conflict": "errors", "Forbidden": "errors", "NotFound": "errors", "RequestRejected": "errors",
    "Unauthorized": "errors", "UnsupportedMediaType": "errors",
    "DEFAULT_ALLOW": "security", "TOKEN_ENV": "security", "check_allowed": "security", "client_token": "security",
    "server_token": "security",
    "options_from_json": "validate",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """The package's names, each imported from its module when first used (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'babel.daemon' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"babel.daemon.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CLIENT_TIMEOUT",
    "DEFAULT_ALLOW",
    "DEFAULT_LISTEN",
    "TOKEN_ENV",
    "Conflict",
    "Daemon",
    "DaemonConfig",
    "Forbidden",
    "NotFound",
    "RequestRejected",
    "Schedule",
    "Unauthorized",
    "UnsupportedMediaType",
    "cancel_job",
    "check_allowed",
    "client_token",
    "server_token",
    "fetch_job",
    "fetch_jobs",
    "join_uri",
    "make_app",
    "natural_key",
    "newest_checkpoint",
    "options_from_json",
    "serve",
    "split_addr",
    "submit",
]
