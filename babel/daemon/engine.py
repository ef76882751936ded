"""The daemon's domain object: job queue, schedules and history over one state directory."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import time
from dataclasses import asdict, fields, replace
from typing import Any

from babel.daemon.checkpoints import join_uri, newest_checkpoint
from babel.daemon.config import DaemonConfig, Schedule
from babel.daemon.errors import Conflict, Forbidden, NotFound, RequestRejected
from babel.daemon.security import check_allowed, check_endpoint
from babel.daemon.validate import check_positive, check_uri, options_from_json
from babel.errors import BabelError, BadURI
from babel.journal import Journal, list_jobs
from babel.options import SyncOptions
from babel.sync import create_job, run_sync
from pcache.common.checkpoint import COMMIT_MARKER
from pcache.common.process import other_process_alive

logger = logging.getLogger(__name__)
MIN_EVERY = 0.25  # seconds between a schedule's ticks at least (a tighter one floods the state dir with jobs)

ACTIVE = ("queued", "running")
SCHEDULES_FILE = "schedules.json"
LOCK_FILE = "daemon.lock"
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


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
        self._canceled: set[str] = set()  # jobs a user canceled (not the daemon stopping)
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
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)  # job history, URIs, the token file
        fd = os.open(os.path.join(self.state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise BabelError("another babel daemon uses this state directory", uri=self.state_dir) from exc
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
                and not other_process_alive(doc.get("pid"))
            ):
                try:
                    self._check_uris(doc.get("src", ""), doc.get("dst", ""))  # this config's prefixes
                except BabelError as exc:
                    logger.warning("job %s not resumed: %s", doc["id"], exc)
                    self._mark(doc["id"], state="failed", pid=None, fatal=f"{type(exc).__name__}: {exc}")
                    continue
                self._queue(doc["id"])
                resumed.append(doc["id"])
        return resumed

    # ------------------------------------------------------------ jobs --

    def submit(self, src: str, dst: str, options: SyncOptions | None = None, **extra: Any) -> dict[str, Any]:
        """Create a sync job and queue it; ``extra`` goes into its job.json. Returns the job.json.

        Raises:
            RequestRejected: a bad URI (``field`` src or dst). Forbidden: outside ``cfg.allow``.
        """
        self._check_uris(src, dst)
        try:
            job_id = create_job(src, dst, options or SyncOptions(), self.state_dir)
        except BadURI as exc:  # e.g. a destination inside the source
            raise RequestRejected(f"BadURI: {exc}", field="dst") from exc
        return self._queue(job_id, **extra)

    def resume(self, job_id: str) -> dict[str, Any]:
        """Queue a stopped (failed, partial, killed) sync job again. Returns its job.json.

        Raises:
            NotFound: no such job.
            Conflict: it is queued or running (here or in a live process), or not a sync job.
            Forbidden: its URIs are outside ``cfg.allow`` now.
        """
        doc = self.job(job_id)
        if job_id in self._tasks:
            raise Conflict(f"job {job_id} is {doc.get('state', 'queued')} already")
        if doc.get("kind", "sync") != "sync":
            raise Conflict(f"job {job_id} is a {doc['kind']} job; only sync jobs resume")
        if doc.get("state") in ACTIVE and other_process_alive(doc.get("pid")):
            raise Conflict(f"job {job_id} is {doc['state']} in process {doc['pid']}")
        self._check_uris(doc.get("src", ""), doc.get("dst", ""))  # the prefixes allowed may have changed since
        return self._queue(job_id)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Stop a queued or running job of this daemon: it ends ``canceled`` (its multipart uploads
        stay open for a later resume, as a killed job's; ``babel clean`` aborts them).

        Raises:
            NotFound: no such job. Conflict: it is not queued or running here.
        """
        doc = self.job(job_id)
        task = self._tasks.get(job_id)
        if task is None:
            raise Conflict(f"job {job_id} is {doc.get('state', '?')}: not queued or running in this daemon")
        self._canceled.add(job_id)
        task.cancel()
        return {**doc, "state": "canceling"}

    def _check_uris(self, src: str, dst: str) -> None:
        """Raises RequestRejected (a bad URI) or Forbidden (outside ``cfg.allow``), naming the field."""
        for uri, field in ((src, "src"), (dst, "dst")):
            check_uri(uri, field)
            check_allowed(uri, field, self.cfg.allow)
            check_endpoint(uri, field, self.cfg.allow_endpoints)

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
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFound(f"no job {job_id!r}") from exc

    def counts(self) -> dict[str, int]:
        """Jobs running and queued in this daemon, and schedules."""
        running = len(self._running)
        return {"running": running, "queued": len(self._tasks) - running, "schedules": len(self._schedules)}

    def _queue(self, job_id: str, **extra: Any) -> dict[str, Any]:
        # pid marks the owner: a daemon starting later resumes the job only once this process is gone
        try:
            journal = Journal(self.state_dir, job_id)
        except FileNotFoundError as exc:
            raise NotFound(f"no job {job_id!r}") from exc
        except Exception as exc:  # rocksdict reports a held lock as a plain Exception
            raise Conflict(f"job {job_id} is in use: {exc}") from exc
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
                doc = self.job(job_id)
                # again now: a file:// root accepted at submit may have been swapped for a symlink since
                self._check_uris(doc.get("src", ""), doc.get("dst", ""))
                logger.info("job %s running", job_id)
                report = await run_sync("", "", state_dir=self.state_dir, job_id=job_id)
                state = report.state
        except asyncio.CancelledError:
            if job_id not in self._canceled:
                raise  # the daemon stops: the journal keeps it queued/running, the next daemon resumes it
            self._canceled.discard(job_id)
            state = "canceled"
            self._mark(job_id, state="canceled", phase="done", pid=None)
            logger.info("job %s canceled", job_id)
        except (Forbidden, RequestRejected) as exc:
            logger.warning("job %s refused at start: %s", job_id, exc)
            self._mark(job_id, state="failed", pid=None, fatal=f"{type(exc).__name__}: {exc}")
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
            RequestRejected: a bad URI or ``every`` not > 0 seconds. Forbidden: outside ``cfg.allow``.
        """
        self._check_uris(src, dst)
        every = check_positive(every, "every", "seconds")
        if every < MIN_EVERY:
            raise RequestRejected(f"every must be at least {MIN_EVERY:g} seconds", field="every")
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
            raise BabelError(f"corrupt schedules file ({exc})", uri=path) from exc
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
