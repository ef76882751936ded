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
a malformed request, naming the field, 404 for an unknown id, 409 for a busy job):

=============================  =================================================================
``POST /jobs``                 ``{src, dst, options?}`` -> 202 ``{id, state: "queued"}``;
                               ``options`` are :class:`babel.sync.SyncOptions` fields by name
``GET /jobs[?limit=N]``        every job's ``job.json``, newest first
``GET /jobs/{id}``             one ``job.json``: src, dst, options, state (queued, running, ok,
                               partial, failed), phase, summary (the sync report), pid
``POST /jobs/{id}/resume``     queue a stopped job again -> 202 ``{id, state}``; 409 when it is
                               queued or running already
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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, get_args
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from babel.backends import open_store
from babel.errors import BabelError, BadURI, TransientError
from babel.journal import Journal, default_state_dir, list_jobs
from babel.sync import SyncOptions, VerifyMode, create_job, run_sync

logger = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7700"
CLIENT_TIMEOUT = 10.0  # seconds per client call
COMMIT_MARKER = ".metadata"  # torch.distributed.checkpoint writes it last (see ckpt_adapter.storage)
ACTIVE = ("queued", "running")
SCHEDULES_FILE = "schedules.json"
LOCK_FILE = "daemon.lock"
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


# ---------------------------------------------------------------- errors --


class RequestRejected(BabelError, ValueError):
    """A malformed request (HTTP 400): a bad URI, an unknown option, a wrong type; ``field`` names it."""

    errno_code = errno.EINVAL

    def __init__(self, message: str = "", *, field: str = "", uri: str | None = None) -> None:
        super().__init__(message, uri=uri)
        self.field = field


class NotFound(BabelError, FileNotFoundError):
    """No job or schedule with that id (HTTP 404)."""

    errno_code = errno.ENOENT


class Conflict(BabelError):
    """The job is queued or running already, here or in another live process (HTTP 409)."""

    errno_code = errno.EBUSY


# the one table between the error tree and HTTP, both ways (the client maps ``type`` back)
_HTTP_STATUS: dict[type[BabelError], int] = {RequestRejected: 400, NotFound: 404, Conflict: 409}
_BY_NAME: dict[str, type[BabelError]] = {cls.__name__: cls for cls in _HTTP_STATUS}


# ---------------------------------------------------------------- config --


@dataclass
class DaemonConfig:
    """``babel daemon``'s configuration."""

    listen: str = DEFAULT_LISTEN
    """HOST:PORT the HTTP API listens on (port 0: a free port, logged at start)."""
    state_dir: str = field(default_factory=default_state_dir)
    """Where job journals, ``job.json`` files and ``schedules.json`` live."""
    max_jobs: int = 2
    """Jobs running at once; the others wait with state ``queued``."""
    stop_grace: float = 5.0
    """Seconds the jobs get to stop after SIGTERM/SIGINT before the process exits anyway."""


@dataclass
class Schedule:
    """A recurring sync (persisted in ``schedules.json``); times in seconds."""

    id: str
    src: str
    dst: str
    every: float
    """Period in seconds."""
    newest_checkpoint: bool = False
    """``src`` is a directory of checkpoints; sync only the newest committed one, once."""
    options: dict[str, Any] = field(default_factory=dict)
    """:class:`SyncOptions` fields (JSON form)."""
    created: float = 0.0
    last_run: float | None = None
    """When it last submitted a job (seconds since the epoch)."""
    last_job: str | None = None
    """The id of the job it submitted last."""
    last_synced: str | None = None
    """With ``newest_checkpoint``: the checkpoint name last synced successfully."""
    last_error: str = ""
    """Why the last tick or job failed ("" when it did not)."""


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:7700``, an ``http://`` prefix allowed) as (host, port).

    Raises:
        ValueError: not HOST:PORT.
    """
    rest = addr.removeprefix("http://").rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------- options --


def _int_at_least(low: int):
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be an integer >= {low}")
        return value

    return check


def _optional(check):
    return lambda value: None if value is None else check(value)


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError("must be a number > 0")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _patterns(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise ValueError("must be a list of glob patterns")
    return tuple(value)


def _verify_mode(value: Any) -> str:
    if value not in get_args(VerifyMode):
        raise ValueError(f"must be one of {', '.join(get_args(VerifyMode))}")
    return value


# SyncOptions fields by annotation (``from __future__ import annotations``: strings)
_CHECKS = {
    "tuple[str, ...]": _patterns,
    "bool": _bool,
    "int": _int_at_least(1),
    "int | None": _optional(_int_at_least(1)),
    "float | None": _optional(_positive_number),
    "VerifyMode": _verify_mode,
}
_FIELD_CHECKS = {"max_delete": _int_at_least(-1)}


def options_from_json(doc: Any) -> SyncOptions:
    """:class:`SyncOptions` from its JSON form (``asdict``; missing fields take their defaults).

    Raises:
        RequestRejected: not an object, an unknown option name, or a value of the wrong
            type; ``field`` is ``options`` or ``options.NAME``.
    """
    if doc is None:
        return SyncOptions()
    if not isinstance(doc, dict):
        raise RequestRejected("options must be an object", field="options")
    known = {f.name: f for f in fields(SyncOptions)}
    kwargs = {}
    for name, value in doc.items():
        where = f"options.{name}"
        if name not in known:
            raise RequestRejected(f"unknown option {name!r}", field=where)
        check = _FIELD_CHECKS.get(name) or _CHECKS.get(str(known[name].type))
        if check is None:
            raise RequestRejected(f"option {name!r} cannot be set through the daemon", field=where)
        try:
            kwargs[name] = check(value)
        except ValueError as exc:
            raise RequestRejected(f"{where} {exc}", field=where) from None
    options = SyncOptions(**kwargs)
    try:
        options.filters()
    except ValueError as exc:
        raise RequestRejected(str(exc), field="options.include") from None
    return options


def _check_uri(uri: Any, name: str) -> str:
    if not isinstance(uri, str) or not uri:
        raise RequestRejected(f"{name} must be a URI string", field=name)
    try:
        open_store(uri)
    except BadURI as exc:
        raise RequestRejected(f"{name}: BadURI: {exc}", field=name) from None
    return uri


# ---------------------------------------------------------------- checkpoints --


def natural_key(name: str) -> list[Any]:
    """Sort key ordering numbers by value: ``step-90`` < ``step-200`` < ``step-1000``."""
    parts: list[Any] = re.split(r"([0-9]+)", name)
    parts[1::2] = [int(p) for p in parts[1::2]]
    return parts


def join_uri(uri: str, name: str) -> str:
    """``uri`` with ``NAME/`` appended to its path (the query, e.g. ``endpoint_url``, kept)."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + name + "/"))


async def newest_checkpoint(uri: str) -> str | None:
    """The newest committed checkpoint directory directly under ``uri``, or None.

    Lists the common prefixes of ``uri`` (``/`` delimiter), keeps those holding
    ``.metadata`` and returns the greatest name by :func:`natural_key` (no trailing ``/``).
    Names with ``?``, ``#`` or ``%`` are skipped: they cannot go into a URI path as is.

    Raises:
        BadURI: ``uri`` is malformed.
        NoSuchBucket, AccessDenied, TransientError: the listing failed.
    """
    store = open_store(uri)
    try:
        names: set[str] = set()
        after = ""
        while True:
            page = await store.list_page("", delimiter="/", start_after=after)
            names.update(p.rstrip("/") for p in page.prefixes)
            last = max([after, *page.prefixes, *(o.key for o in page.objects)])
            if not page.truncated or last == after:
                break
            after = last  # a common prefix as start_after skips its whole subtree (S3 semantics)
        for name in sorted(names, key=natural_key, reverse=True):
            if not name or any(c in name for c in "?#%"):
                continue
            try:
                await store.head(f"{name}/{COMMIT_MARKER}")
            except FileNotFoundError:
                continue  # still being written (or abandoned)
            return name
        return None
    finally:
        await store.close()


# ---------------------------------------------------------------- the daemon --


def _held_by_live_process(pid: Any) -> bool:
    """Whether ``pid`` (from a job.json) is another process that is still alive."""
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False  # our own pid in an old job.json: a previous daemon with the same pid (containers)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Daemon:
    """Job queue, schedules and history over one state directory (no network: :func:`make_app` serves it).

    Call :meth:`start` inside a running event loop and :meth:`close` at the end.
    """

    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_dir
        self._slots = asyncio.Semaphore(max(1, cfg.max_jobs))
        self._tasks: dict[str, asyncio.Task] = {}  # queued or running jobs
        self._running: set[str] = set()
        self._schedules: dict[str, Schedule] = {}
        self._tickers: dict[str, asyncio.Task] = {}
        self._lock_fd: int | None = None
        self._closing = False

    # ------------------------------------------------------------ lifecycle --

    async def start(self) -> None:
        """Lock the state directory, load schedules, resume orphaned jobs, start the schedules.

        Raises:
            BabelError: another daemon holds the state directory, or ``schedules.json`` is corrupt.
        """
        os.makedirs(self.state_dir, exist_ok=True)
        fd = os.open(os.path.join(self.state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BabelError("another babel daemon uses this state directory", uri=self.state_dir) from None
        self._lock_fd = fd
        self._schedules = self._load_schedules()
        resumed = self.recover()
        if resumed:
            logger.info("resuming %d jobs a stopped daemon left: %s", len(resumed), " ".join(resumed))
        for sched in self._schedules.values():
            self._start_ticker(sched)

    async def close(self) -> None:
        """Stop the schedules and cancel the jobs (they stay queued/running in job.json and resume at the next start)."""
        self._closing = True
        tasks = [*self._tickers.values(), *self._tasks.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.cfg.stop_grace)
            if late:
                logger.warning("%d tasks did not stop within %.1f s", len(late), self.cfg.stop_grace)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def recover(self) -> list[str]:
        """Queue again the jobs a daemon left ``queued``/``running`` whose process is gone; return their ids."""
        resumed = []
        for doc in reversed(list_jobs(self.state_dir)):  # oldest first: they keep their order
            if (
                doc.get("runner") == "daemon"
                and doc.get("state") in ACTIVE
                and doc.get("kind", "sync") == "sync"
                and doc.get("id") not in self._tasks
                and not _held_by_live_process(doc.get("pid"))
            ):
                self._queue(doc["id"])
                resumed.append(doc["id"])
        return resumed

    # ------------------------------------------------------------ jobs --

    def submit(self, src: str, dst: str, options: SyncOptions | None = None, **extra: Any) -> dict[str, Any]:
        """Create a sync job and queue it; ``extra`` goes into its job.json. Returns the job.json.

        Raises:
            RequestRejected: a bad URI (``field`` src or dst).
        """
        _check_uri(src, "src")
        _check_uri(dst, "dst")
        job_id = create_job(src, dst, options or SyncOptions(), self.state_dir)
        return self._queue(job_id, **extra)

    def resume(self, job_id: str) -> dict[str, Any]:
        """Queue a stopped (failed, partial, killed) sync job again. Returns its job.json.

        Raises:
            NotFound: no such job.
            Conflict: it is queued or running (here or in a live process), or not a sync job.
        """
        doc = self.job(job_id)
        if job_id in self._tasks:
            raise Conflict(f"job {job_id} is {doc.get('state', 'queued')} already")
        if doc.get("kind", "sync") != "sync":
            raise Conflict(f"job {job_id} is a {doc['kind']} job; only sync jobs resume")
        if doc.get("state") in ACTIVE and _held_by_live_process(doc.get("pid")):
            raise Conflict(f"job {job_id} is {doc['state']} in process {doc['pid']}")
        return self._queue(job_id)

    def jobs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every job's job.json in the state directory, newest first (at most ``limit``)."""
        return list_jobs(self.state_dir)[:limit]

    def job(self, job_id: str) -> dict[str, Any]:
        """One job's job.json.

        Raises:
            NotFound: no such job.
        """
        if not _JOB_ID.match(job_id):
            raise NotFound(f"no job {job_id!r}")
        try:
            with open(os.path.join(self.state_dir, job_id, "job.json")) as fh:
                return json.load(fh)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no job {job_id!r}") from None

    def counts(self) -> dict[str, int]:
        """Jobs running and queued in this daemon, and schedules."""
        running = len(self._running)
        return {"running": running, "queued": len(self._tasks) - running, "schedules": len(self._schedules)}

    def _queue(self, job_id: str, **extra: Any) -> dict[str, Any]:
        # pid marks the owner: a daemon starting later resumes the job only once this process is gone
        try:
            journal = Journal(self.state_dir, job_id)
        except FileNotFoundError:
            raise NotFound(f"no job {job_id!r}") from None
        except Exception as exc:  # rocksdict reports a held lock as a plain Exception
            raise Conflict(f"job {job_id} is in use: {exc}") from None
        try:
            doc = journal.update(state="queued", pid=os.getpid(), runner="daemon", queued=time.time(), **extra)
        finally:
            journal.close()
        self._tasks[job_id] = asyncio.create_task(self._run(job_id), name=f"babel-job-{job_id}")
        logger.info("job %s queued: %s -> %s", job_id, doc.get("src"), doc.get("dst"))
        return doc

    async def _run(self, job_id: str) -> None:
        state = "failed"
        try:
            async with self._slots:
                self._running.add(job_id)
                logger.info("job %s running", job_id)
                report = await run_sync("", "", state_dir=self.state_dir, job_id=job_id)
                state = report.state
        except asyncio.CancelledError:
            raise  # the journal keeps it queued/running: the next daemon resumes it
        except Exception as exc:  # outside the job's own error handling (a bug, a vanished journal): record it
            logger.exception("job %s crashed", job_id)
            self._mark(job_id, state="failed", pid=None, fatal=f"{type(exc).__name__}: {exc}")
        finally:
            self._running.discard(job_id)
            self._tasks.pop(job_id, None)
        logger.info("job %s %s", job_id, state)
        try:
            self._job_done(job_id, state)
        except Exception:
            logger.exception("schedule bookkeeping after job %s failed", job_id)

    def _mark(self, job_id: str, **fields: Any) -> None:
        try:
            journal = Journal(self.state_dir, job_id)
            try:
                journal.update(**fields)
            finally:
                journal.close()
        except Exception:
            logger.exception("cannot record %s in job %s", fields, job_id)

    # ------------------------------------------------------------ schedules --

    def add_schedule(
        self, src: str, dst: str, every: float, *, newest_checkpoint: bool = False, options: SyncOptions | None = None
    ) -> dict[str, Any]:
        """Add a schedule (persisted) and run its first tick now. Returns it (see :meth:`schedule`).

        Raises:
            RequestRejected: a bad URI or ``every`` not > 0 seconds.
        """
        _check_uri(src, "src")
        _check_uri(dst, "dst")
        try:
            every = _positive_number(every)
        except ValueError as exc:
            raise RequestRejected(f"every {exc} (seconds)", field="every") from None
        sched = Schedule(
            id="sched-" + secrets.token_hex(4), src=src, dst=dst, every=float(every),
            newest_checkpoint=bool(newest_checkpoint), options=asdict(options or SyncOptions()), created=time.time(),
        )  # fmt: skip
        self._schedules[sched.id] = sched
        self._save_schedules()
        self._start_ticker(sched)
        logger.info("schedule %s added: %s -> %s every %.1f s", sched.id, src, dst, every)
        return self.schedule(sched.id)

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule, oldest first."""
        return [self.schedule(sid) for sid in sorted(self._schedules, key=lambda s: self._schedules[s].created)]

    def schedule(self, sched_id: str) -> dict[str, Any]:
        """One schedule's fields plus ``active`` (a job of it is queued or running).

        Raises:
            NotFound: no such schedule.
        """
        sched = self._schedules.get(sched_id)
        if sched is None:
            raise NotFound(f"no schedule {sched_id!r}")
        return {**asdict(sched), "active": sched.last_job in self._tasks}

    def remove_schedule(self, sched_id: str) -> None:
        """Drop a schedule; a job of it that is running goes on.

        Raises:
            NotFound: no such schedule.
        """
        if self._schedules.pop(sched_id, None) is None:
            raise NotFound(f"no schedule {sched_id!r}")
        ticker = self._tickers.pop(sched_id, None)
        if ticker is not None:
            ticker.cancel()
        self._save_schedules()
        logger.info("schedule %s removed", sched_id)

    def _start_ticker(self, sched: Schedule) -> None:
        self._tickers[sched.id] = asyncio.create_task(self._ticker(sched), name=f"babel-schedule-{sched.id}")

    async def _ticker(self, sched: Schedule) -> None:
        # fixed rate, on the wall clock so a restart keeps the period; missed ticks are skipped, not bunched
        next_at = time.time() if sched.last_run is None else max(time.time(), sched.last_run + sched.every)
        while True:
            await asyncio.sleep(max(0.0, next_at - time.time()))
            try:
                await self.tick(sched)
            except Exception as exc:  # a failed listing (or a bug) must not end the schedule: try next period
                sched.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("schedule %s: %s", sched.id, sched.last_error, exc_info=not isinstance(exc, OSError))
                with contextlib.suppress(OSError):
                    self._save_schedules()
            next_at = max(next_at + sched.every, time.time())

    async def tick(self, sched: Schedule) -> str | None:
        """One period of ``sched``: submit its sync unless its last job is active or nothing is new.

        Returns the id of the job submitted, or None.

        Raises:
            BabelError: listing the checkpoints failed.
        """
        if sched.last_job in self._tasks:
            logger.debug("schedule %s: job %s still active", sched.id, sched.last_job)
            return None
        options = options_from_json(sched.options)
        src, dst, extra = sched.src, sched.dst, {"schedule": sched.id}
        if sched.newest_checkpoint:
            name = await newest_checkpoint(sched.src)
            if sched.id not in self._schedules or self._closing:
                return None  # removed while listing
            if name is None or name == sched.last_synced:
                return None
            src, dst = join_uri(src, name), join_uri(dst, name)
            options = replace(options, exclude=(*options.exclude, "/" + COMMIT_MARKER))
            extra.update(checkpoint=name, stage="data")
        doc = self.submit(src, dst, options, **extra)
        sched.last_job, sched.last_run = doc["id"], time.time()
        self._save_schedules()
        return doc["id"]

    def _job_done(self, job_id: str, state: str) -> None:
        """Schedule bookkeeping after a job ends (also for jobs resumed after a restart: job.json says whose)."""
        try:
            doc = self.job(job_id)
        except NotFound:
            return
        sched = self._schedules.get(doc.get("schedule", ""))
        if sched is None:
            return
        name = doc.get("checkpoint")
        if state != "ok":
            sched.last_error = f"job {job_id} ended {state}"
        elif name and doc.get("stage") == "data" and not self._closing:
            # the shards are there: now publish the commit marker, last, as the writer did
            options = replace(options_from_json(sched.options), include=("/" + COMMIT_MARKER,), exclude=())
            commit = self.submit(doc["src"], doc["dst"], options, schedule=sched.id, checkpoint=name, stage="commit")
            sched.last_job, sched.last_error = commit["id"], ""
        elif name and doc.get("stage") == "commit":
            sched.last_synced, sched.last_error = name, ""
            logger.info("schedule %s: checkpoint %s synced", sched.id, name)
        else:
            sched.last_error = ""
        self._save_schedules()

    def _load_schedules(self) -> dict[str, Schedule]:
        path = os.path.join(self.state_dir, SCHEDULES_FILE)
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise BabelError(f"corrupt schedules file ({exc})", uri=path) from None
        known = {f.name for f in fields(Schedule)}
        out = {}
        for raw in doc.get("schedules", []):
            sched = Schedule(**{k: v for k, v in raw.items() if k in known})
            out[sched.id] = sched
        return out

    def _save_schedules(self) -> None:
        path = os.path.join(self.state_dir, SCHEDULES_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"schedules": [asdict(s) for s in self._schedules.values()]}, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


# ---------------------------------------------------------------- HTTP --


def _error_body(exc: BabelError) -> dict[str, Any]:
    return {"error": str(exc), "type": type(exc).__name__, "field": getattr(exc, "field", "")}


@web.middleware
async def _translate_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except tuple(_HTTP_STATUS) as exc:
        return web.json_response(_error_body(exc), status=_HTTP_STATUS[type(exc)])
    except web.HTTPException as exc:  # unknown route or method: JSON too
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "type": "HTTPError", "field": ""}, status=exc.status)


async def _body(request: web.Request, allowed: set[str], required: set[str]) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestRejected("the body is not JSON", field="body") from None
    if not isinstance(body, dict):
        raise RequestRejected("the body must be a JSON object", field="body")
    for name in body:
        if name not in allowed:
            raise RequestRejected(f"unknown field {name!r}", field=name)
    missing = sorted(required - body.keys())
    if missing:
        raise RequestRejected(f"{missing[0]} is required", field=missing[0])
    return body


def make_app(daemon: Daemon) -> web.Application:
    """The HTTP/JSON API (module docstring) over ``daemon``; handlers only translate and delegate."""
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
        if limit is not None and not limit.isdigit():
            raise RequestRejected("limit must be a non-negative integer", field="limit")
        return web.json_response(daemon.jobs(None if limit is None else int(limit)))

    @routes.get("/jobs/{id}")
    async def get_job(request: web.Request) -> web.Response:
        return web.json_response(daemon.job(request.match_info["id"]))

    @routes.post("/jobs/{id}/resume")
    async def resume_job(request: web.Request) -> web.Response:
        doc = daemon.resume(request.match_info["id"])
        return web.json_response({"id": doc["id"], "state": doc["state"]}, status=202)

    @routes.post("/schedules")
    async def post_schedule(request: web.Request) -> web.Response:
        body = await _body(request, {"src", "dst", "every", "newest_checkpoint", "options"}, {"src", "dst", "every"})
        try:
            newest = _bool(body.get("newest_checkpoint", False))
        except ValueError as exc:
            raise RequestRejected(f"newest_checkpoint {exc}", field="newest_checkpoint") from None
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

    app = web.Application(middlewares=[_translate_errors])
    app.add_routes(routes)
    return app


async def serve(cfg: DaemonConfig) -> None:
    """Run the daemon until SIGTERM or SIGINT, then stop: no new requests, jobs cancelled (resumable).

    Raises:
        ValueError: ``cfg.listen`` is not HOST:PORT.
        BabelError: another daemon holds the state directory.
        OSError: the address cannot be bound.
    """
    logger.info("babel daemon config: %s", " ".join(f"{k}={v!r}" for k, v in asdict(cfg).items()))
    host, port = split_addr(cfg.listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    daemon = Daemon(cfg)
    await daemon.start()
    runner = web.AppRunner(make_app(daemon), access_log=None, shutdown_timeout=1.0)
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


# ---------------------------------------------------------------- client --

# no proxies: the daemon is on loopback or in the cluster, where http_proxy would only get in the way
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _call(addr: str, method: str, path: str, body: Any = None, *, timeout: float = CLIENT_TIMEOUT) -> Any:
    host, port = split_addr(addr)
    host = f"[{host}]" if ":" in host else host
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{host}:{port}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
        except (ValueError, OSError):
            doc = {}
        message = doc.get("error") or f"HTTP {exc.code}"
        cls = _BY_NAME.get(doc.get("type", ""))
        if cls is RequestRejected:
            raise RequestRejected(message, field=doc.get("field", "")) from None
        if cls is not None:
            raise cls(message) from None
        if exc.code >= 500:
            raise TransientError(f"babel daemon at {addr}: {message}") from None
        raise BabelError(f"babel daemon at {addr}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out
        reason = getattr(exc, "reason", None) or exc
        raise TransientError(f"babel daemon at {addr} is not reachable ({reason})") from None


def submit(
    addr: str, src: str, dst: str, options: SyncOptions | None = None, *, timeout: float = CLIENT_TIMEOUT
) -> dict:
    """Queue ``babel sync SRC DST`` in the daemon at ``addr`` (HOST:PORT); ``timeout`` in seconds.

    Returns:
        ``{"id": JOB, "state": "queued"}``.

    Raises:
        RequestRejected: a bad URI or option (``field`` names it).
        TransientError: the daemon is not reachable (or did not answer within ``timeout``).
    """
    return _call(addr, "POST", "/jobs", {"src": src, "dst": dst, "options": asdict(options or SyncOptions())},
                 timeout=timeout)  # fmt: skip


def fetch_jobs(addr: str, *, timeout: float = CLIENT_TIMEOUT) -> list[dict]:
    """The job history of the daemon at ``addr``: every job.json, newest first.

    Raises:
        TransientError: the daemon is not reachable.
    """
    return _call(addr, "GET", "/jobs", timeout=timeout)


def fetch_job(addr: str, job_id: str, *, timeout: float = CLIENT_TIMEOUT) -> dict:
    """One job's job.json (state, phase, summary) from the daemon at ``addr``.

    Raises:
        NotFound: no such job.
        TransientError: the daemon is not reachable.
    """
    return _call(addr, "GET", f"/jobs/{urllib.parse.quote(job_id, safe='')}", timeout=timeout)
