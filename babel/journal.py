"""Job state of one sync in RocksDB (``rocksdict``), so a killed job resumes where it stopped.

One database per job under ``<state_dir>/<job_id>/db``, plus ``job.json`` (the job's
description and last summary, rewritten atomically) that ``babel jobs`` reads without
opening RocksDB. Records, keyed by a one-letter kind and the object key in UTF-8
(byte order = S3 key order, so RocksDB's sorted runs double as the external sort of
listings; memory stays flat however many keys there are):

==========  ==========================================================================
``s/KEY``   source listing entry (size, mtime, etag, metadata)
``d/KEY``   destination listing entry
``p/KEY``   the plan: ``copy`` / ``delete`` and why
``u/KEY``   an unfinished multipart upload: upload id, part size, finished parts
``c/KEY``   a finished copy: size, in-stream CRC32C, runtime-check results
``v/KEY``   verification result
``e/KEY``   the last error for the key
``i/KEY``   bytes of the key being sent right now (what a resume after a crash sends again)
``m/NAME``  phase markers (``listed``, ``planned``, ...)
==========  ==========================================================================

Writes go to RocksDB's write-ahead log without fsync: a ``kill -9`` of the process
loses nothing (the log is in the page cache); a power cut may lose the last records,
which only means redoing those objects.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import rocksdict

from objstore.base import ObjectInfo
from objstore.errors import StoreError as BabelError
from pcache.common.process import process_alive

KINDS = "sdpucvem"


def new_job_id() -> str:
    """A unique job id, sortable to the second: ``YYYYmmdd-HHMMSS-xxxxxx`` (jobs created within one
    second are ordered by their ``created`` time, see :func:`list_jobs`)."""
    return time.strftime("%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def default_state_dir() -> str:
    """``$BABEL_STATE_DIR``, else ``$XDG_STATE_HOME/babel``, else ``~/.local/state/babel``."""
    if os.environ.get("BABEL_STATE_DIR"):
        return os.environ["BABEL_STATE_DIR"]
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "babel")


def _k(kind: str, key: str) -> bytes:
    return kind.encode() + b"/" + key.encode("utf-8", "surrogateescape")


def encode_info(info: ObjectInfo) -> bytes:
    """Compact JSON of a listing entry."""
    rec: dict[str, Any] = {"z": info.size, "t": info.mtime}
    if info.etag:
        rec["e"] = info.etag
    if info.metadata:
        rec["m"] = info.metadata
    return json.dumps(rec, separators=(",", ":")).encode()


def decode_info(key: str, raw: bytes) -> ObjectInfo:
    """The listing entry stored by :func:`encode_info`."""
    rec = json.loads(raw)
    return ObjectInfo(key, rec["z"], rec["t"], rec.get("e", ""), rec.get("m", {}))


class JobBusy(BabelError):
    """Another process has the job open (its journal's RocksDB lock)."""


class Journal:
    """The RocksDB state of one job (see the module docstring for the record layout)."""

    def __init__(self, state_dir: str, job_id: str, *, create: bool = False) -> None:
        self.job_id = job_id
        self.dir = os.path.join(state_dir, job_id)
        if not create and not os.path.isdir(os.path.join(self.dir, "db")):
            raise FileNotFoundError(f"no job {job_id!r} in {state_dir}")
        os.makedirs(self.dir, exist_ok=True)
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(create)
        opts.set_write_buffer_size(16 << 20)  # memtables flush as sorted runs: memory stays bounded
        opts.set_max_write_buffer_number(2)
        try:
            self._db = rocksdict.Rdict(os.path.join(self.dir, "db"), opts)
        except Exception as exc:  # rocksdict raises a bare Exception for RocksDB's IO errors
            if "LOCK" not in str(exc):
                raise
            pid = self.describe().get("pid")
            if not process_alive(pid):  # the run before it (killed); the one running has not written its own yet
                pid = None
            raise JobBusy(
                f"job {job_id} is running{f' (pid {pid})' if pid else ''}: wait for it (babel jobs), or stop it"
                " and resume it then",
                uri=self.dir,
            ) from exc
        self._wopts = rocksdict.WriteOptions()
        self._observers: dict[str, Callable[[str, Any], None]] = {}

    # ------------------------------------------------------------ the job --

    def describe(self) -> dict[str, Any]:
        """The job's ``job.json`` (src, dst, options, state, summary), {} when not written yet."""
        try:
            with open(os.path.join(self.dir, "job.json")) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return {}

    def update(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into ``job.json`` (atomic rename) and return the result."""
        doc = self.describe()
        now = time.time()
        doc.setdefault("created", now)
        doc.update(fields, id=self.job_id, updated=now)
        tmp = os.path.join(self.dir, "job.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(self.dir, "job.json"))
        return doc

    # ------------------------------------------------------------ records --

    def watch(self, kind: str, observer: Callable[[str, Any], None]) -> None:
        """Tell ``observer(key, value)`` of every put of a ``kind`` record, ``(key, None)`` of every
        delete (a shared job mirrors its open multipart uploads to etcd this way)."""
        self._observers[kind] = observer

    def put(self, kind: str, key: str, value: Any) -> None:
        """Store one JSON record."""
        self._db.put(_k(kind, key), json.dumps(value, separators=(",", ":")).encode(), self._wopts)
        if kind in self._observers:
            self._observers[kind](key, value)

    def put_dropping(self, kind: str, key: str, value: Any, drop: str) -> None:
        """Store one JSON record and drop the ``drop`` kind's record of the same key, in one
        WriteBatch (one write to the log: a finished copy and its stale error, atomically)."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.put(_k(kind, key), json.dumps(value, separators=(",", ":")).encode())
        batch.delete(_k(drop, key))
        self._db.write(batch, self._wopts)
        if kind in self._observers:
            self._observers[kind](key, value)
        if drop in self._observers:
            self._observers[drop](key, None)

    def get(self, kind: str, key: str) -> Any:
        """One JSON record, or None."""
        raw = self._db.get(_k(kind, key))
        return None if raw is None else json.loads(raw)

    def delete(self, kind: str, key: str) -> None:
        """Drop one record."""
        self._db.delete(_k(kind, key), self._wopts)
        if kind in self._observers:
            self._observers[kind](key, None)

    def put_listing(self, kind: str, infos: Iterable[ObjectInfo]) -> None:
        """Store a page of listing entries in one WriteBatch."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        for info in infos:
            batch.put(_k(kind, info.key), encode_info(info))
        self._db.write(batch, self._wopts)

    def scan_raw(self, kind: str, start_after: str | None = None) -> Iterator[tuple[str, bytes]]:
        """(key, raw value) of every ``kind`` record in key order."""
        prefix = kind.encode() + b"/"
        it = self._db.iter()
        if start_after is None:
            it.seek(prefix)
        else:
            it.seek(_k(kind, start_after))
        while it.valid():
            raw_key = it.key()
            if not raw_key.startswith(prefix):
                return
            key = raw_key[len(prefix) :].decode("utf-8", "surrogateescape")
            if start_after is None or key > start_after:
                yield key, it.value()
            it.next()

    def scan(self, kind: str) -> Iterator[tuple[str, Any]]:
        """(key, JSON record) of every ``kind`` record in key order."""
        for key, raw in self.scan_raw(kind):
            yield key, json.loads(raw)

    def scan_listing(self, kind: str) -> Iterator[ObjectInfo]:
        """The stored listing ``kind`` (``s`` or ``d``) in key order."""
        for key, raw in self.scan_raw(kind):
            yield decode_info(key, raw)

    def get_listing(self, kind: str, key: str) -> ObjectInfo | None:
        """One stored listing entry (``s`` or ``d``), or None."""
        raw = self._db.get(_k(kind, key))
        return None if raw is None else decode_info(key, raw)

    def count(self, kind: str) -> int:
        """Number of ``kind`` records (a full scan)."""
        return sum(1 for _ in self.scan_raw(kind))

    def clear(self, kind: str) -> None:
        """Drop every ``kind`` record (a phase is redone from scratch)."""
        prefix = kind.encode() + b"/"
        self._db.delete_range(prefix, kind.encode() + b"0")  # '0' is the byte after '/'

    def marked(self, name: str) -> bool:
        """Whether phase marker ``name`` is set."""
        return self.get("m", name) is not None

    def mark(self, name: str, value: Any = True) -> None:
        """Set phase marker ``name``."""
        self.put("m", name, value)

    def close(self) -> None:
        """Flush and close the database."""
        self._db.close()


def list_jobs(state_dir: str) -> list[dict[str, Any]]:
    """Every job's ``job.json`` under ``state_dir``, newest first: by its ``created`` time (the
    ids of a shared job's chunks, ``NAME.SHARD.CHUNK``, say nothing of when; a job without one
    last), then by id."""
    jobs = []
    try:
        names = os.listdir(state_dir)
    except FileNotFoundError:
        return []
    for name in names:
        try:
            with open(os.path.join(state_dir, name, "job.json")) as fh:
                jobs.append(json.load(fh))
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            continue
    jobs.sort(key=lambda job: (float(job.get("created") or 0.0), str(job.get("id", ""))), reverse=True)
    return jobs
