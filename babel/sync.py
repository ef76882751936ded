"""``babel sync`` and ``babel verify`` as resumable jobs: list, plan, copy, delete, verify.

Each phase reads and writes the job's :class:`~babel.journal.Journal`, so a job killed
at any point (even ``kill -9``) resumes with :func:`run_sync` on the same journal:

1. **list** — both sides with the parallel lister (:mod:`babel.lister`) into RocksDB
   (``s/`` and ``d/`` records); redone from scratch when it had not finished.
2. **plan** — merge-join of the two sorted listings (:mod:`babel.planner`), with up to
   ``checkers`` HEAD requests in flight for destination entries whose listing lacks
   Babel's metadata; ``p/`` records; redone when it had not finished.
3. **copy** — every planned copy without a ``c/`` record (:mod:`babel.transfer`);
   multipart uploads resume from their recorded parts.
4. **delete** — with ``delete=True``, after all copies succeeded and only within
   ``max_delete`` (rclone's ``--delete-after`` and ``--max-delete``).
5. **verify** — metadata validation of every copied object (always), plus sampled or
   full content CRCs (:mod:`babel.verify`); ``v/`` records.

Phases 1 to 3 run as one pipeline (:meth:`SyncJob._pipeline`) when a job starts or had not
finished listing: the destination is listed, then the source's pages are planned as they
arrive and their copies start at once, each verified as it lands; ``--dry-run`` and a job
resumed after its listing run the phases one after the other.

Sources: Ling report (arXiv 2503.05139 §2.3.2) for the phases; rclone ``fs/sync`` for
the copy/delete semantics.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import ssl
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
)
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from babel.backends import open_store
from babel.errors import BabelError, BadURI, Corrupt, NoSuchBucket, NoSuchKey, NoSuchUpload, TransientError
from babel.journal import Journal, new_job_id
from babel.lister import list_parallel_pages
from babel.options import BadOption, SyncOptions, options_from_dict
from babel.planner import Decision, decide, merge_join, needs_head, needs_source_head
from babel.retry import ATTEMPTS, describe, with_retries
from babel.transfer import Bandwidth, CopyResult, Transferer
from babel.verify import VerifyResult, check_full, check_metadata, check_sample
from objstore.base import META_CRC32C, ObjectInfo, ObjectStore
from objstore.tree import check_key

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_REPORTED = 50  # errors and verification failures listed in a report


@dataclass
class Progress:
    """Callbacks a front end (the CLI's progress bar) receives; all optional."""

    phase: Callable[[str, int, int], None] = lambda name, total_bytes, total_objects: None
    advance: Callable[[int, int], None] = lambda nbytes, nobjects: None
    grow: Callable[[int, int], None] = lambda nbytes, nobjects: None  # the phase's totals grow (pipeline)


@dataclass
class SyncReport:
    """What a sync (or verify) did; ``state`` is ok, partial (some objects failed) or failed."""

    job: str
    src: str
    dst: str
    state: str = "running"
    dry_run: bool = False
    listed_src: int = 0
    listed_dst: int = 0
    copied: int = 0
    copied_bytes: int = 0
    skipped: int = 0
    already_done: int = 0
    deleted: int = 0
    planned_delete: int = 0
    failed: int = 0
    retries: int = 0
    parts_reused: int = 0
    vanished: int = 0  # planned copies whose source was deleted before its turn (not failures)
    resent_bytes: int = 0  # bytes an interrupted run had on their way, sent again (resumed jobs)
    not_files: dict[str, int] = field(default_factory=dict)  # source symlinks, FIFOs... skipped, by kind
    seconds: float = 0.0
    verification: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    errors_total: int = 0  # errors listed or not: the list keeps the first MAX_REPORTED
    fatal: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``--json`` report)."""
        doc = asdict(self)
        doc["bytes_per_second"] = self.copied_bytes / self.seconds if self.seconds > 0 else 0.0
        doc["errors_not_listed"] = max(0, self.errors_total - len(self.errors))
        return doc

    @property
    def exit_code(self) -> int:
        """0 ok, 1 partial, 2 fatal."""
        return {"ok": 0, "partial": 1}.get(self.state, 2)


def new_verification(mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "metadata": {"checked": 0, "failed": 0, "proves": "size, and source mtime / CRC32C stored as metadata"},
        "runtime": {
            "crc32c_in_stream": 0,
            "store_checksum_compared": 0,
            "proves": "bytes read from the source hashed as they passed; the destination's own "
            "checksum (OSS CRC64) compared per part and per object where it reports one",
        },
        "sample": {"checked": 0, "failed": 0, "bytes_read": 0, "proves": "sampled ranges (head, tail, strided) equal"},
        "full": {"checked": 0, "failed": 0, "bytes_read": 0, "proves": "every destination byte matches the CRC32C"},
        "failures": [],
    }


def _note_verify(report: SyncReport, kind: str, result: VerifyResult) -> None:
    section = report.verification[kind]
    section["checked"] += 1
    if "bytes_read" in section:
        section["bytes_read"] += result.bytes_read
    if not result.ok:
        section["failed"] += 1
        if len(report.verification["failures"]) < MAX_REPORTED:
            report.verification["failures"].append({"key": result.key, "check": kind, "detail": result.detail})
        report.errors_total += 1
        if len(report.errors) < MAX_REPORTED:  # a partial job always names what failed, and why
            report.errors.append({"key": result.key, "error": f"verification ({kind}) failed: {result.detail}"})


def _is_filesystem(store: ObjectStore) -> bool:
    return store.uri.startswith(("file:", "pcache:"))


def _keys_are_paths(store: ObjectStore) -> bool:
    """A file system, or an S3 server that keeps objects as files (``provider=rclone``): a
    ``dir/`` marker key cannot be stored there (the directory exists by its files)."""
    return _is_filesystem(store) or bool(getattr(store, "keys_are_paths", False))


class SyncJob:
    """One sync between two URIs, driven phase by phase through its journal."""

    def __init__(
        self,
        src_uri: str,
        dst_uri: str,
        options: SyncOptions,
        journal: Journal,
        progress: Progress | None = None,
        *,
        key_range: tuple[str, str | None] = ("", None),
        bandwidth: Bandwidth | None = None,
    ) -> None:
        """``key_range`` ``(after, until)``: only keys ``after < key <= until`` (None: no upper
        bound) are listed, copied and deleted on both sides (one chunk of a shared job's shard);
        ``bandwidth``: a limit shared with other jobs of this process (else ``options.bwlimit``)."""
        self.key_range = key_range
        self.bandwidth = bandwidth
        self.src_uri = src_uri
        self.dst_uri = dst_uri
        self.opts = options
        self.journal = journal
        self.progress = progress or Progress()
        self.filters = options.filters()
        self.report = SyncReport(journal.job_id, src_uri, dst_uri, dry_run=options.dry_run)
        self.report.verification = new_verification(options.verify)
        self.src: ObjectStore = open_store(src_uri)
        self.dst: ObjectStore = open_store(dst_uri)
        self._keys_are_paths: bool | None = None  # of the destination (_dst_keys_are_paths)
        self._checkers = asyncio.Semaphore(options.checkers)  # verification requests in flight
        self._incomplete = False  # a job-level failure (deletions refused): partial without a failed object

    # ------------------------------------------------------------ phases --

    async def _list_into(self, store: ObjectStore, kind: str, *, missing_ok: bool) -> int:
        count = 0
        try:
            after, until = self.key_range
            pages = list_parallel_pages(store, concurrency=self.opts.list_concurrency, after=after, until=until)
            async for page in pages:
                self.journal.put_listing(kind, page)
                count += len(page)
                self.progress.advance(0, len(page))
        except NoSuchBucket:
            if not missing_ok:
                raise
        return count

    async def list(self) -> None:
        """Phase 1: both listings into the journal (skipped when a previous run finished it)."""
        if self.journal.marked("listed"):
            counts = self.journal.get("m", "listed")
            self.report.listed_src, self.report.listed_dst = counts["src"], counts["dst"]
            self.report.not_files = counts.get("not_files", {})
            return
        self.journal.clear("s")
        self.journal.clear("d")
        self._phase("listing", 0, 0)
        src_n, dst_n = await asyncio.gather(
            self._list_into(self.src, "s", missing_ok=False),
            self._list_into(self.dst, "d", missing_ok=_is_filesystem(self.dst)),
        )
        self.report.listed_src, self.report.listed_dst = src_n, dst_n
        self._note_not_files()
        self.journal.mark("listed", {"src": src_n, "dst": dst_n, "not_files": self.report.not_files})

    def _note_not_files(self) -> None:
        """Count the source entries that are no regular files (symlinks, FIFOs), which the source skipped."""
        kinds = list(getattr(self.src, "not_files", {}).values())
        self.report.not_files = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
        if kinds:
            logger.warning("%d source entries are no regular files and are not copied: %s", len(kinds),
                           ", ".join(f"{n} {k}s" for k, n in self.report.not_files.items()))  # fmt: skip

    async def plan(self) -> None:
        """Phase 2: copy/skip/delete decisions into ``p/`` records."""
        if self.journal.marked("planned"):
            return
        self.journal.clear("p")
        self._phase("planning", 0, self.report.listed_src)
        planning = _Planning(self)
        for src, dst in merge_join(self.journal.scan_listing("s"), self.journal.scan_listing("d")):
            await planning.pair(src, dst)
        await planning.finish()
        self.journal.mark("planned", planning.counts)

    async def _dst_keys_are_paths(self) -> bool:
        """Whether the destination keeps keys as file paths, where a ``dir/`` marker would become a
        file shadowing the directory of the keys under it. Known for file systems and
        ``provider=rclone``; for another S3-like store found once per run with a probe: a
        zero-byte ``.babel-probe-RANDOM/`` is PUT, listed and deleted (an S3 store lists the
        key with its slash; ``rclone serve s3`` on a disk lists a file without it)."""
        if self._keys_are_paths is None:
            self._keys_are_paths = _keys_are_paths(self.dst)
            if not self._keys_are_paths and not self.opts.dry_run:
                probe = f".babel-probe-{secrets.token_hex(6)}/"
                try:
                    await self._retry(lambda: self.dst.put(probe, b""))
                    page = await self._retry(lambda: self.dst.list_page(probe[:-1], max_keys=4))
                    self._keys_are_paths = probe not in {o.key for o in page.objects}
                except (BabelError, OSError) as exc:  # cannot tell: copy markers as objects
                    logger.info("probing %s for directory markers failed: %s", self.dst.uri, exc)
                finally:  # retried as any request (a throttled delete left the probe behind)
                    with contextlib.suppress(BabelError, OSError):
                        await self._retry(lambda: self.dst.delete([probe, probe[:-1]]))
                if self._keys_are_paths:
                    logger.info("%s keeps keys as file paths: directory markers are not copied", self.dst.uri)
        return self._keys_are_paths

    def _decide(self, src: ObjectInfo, dst: ObjectInfo | None) -> Decision:
        o = self.opts
        return decide(src, dst, size_only=o.size_only, checksum=o.checksum, ignore_times=o.ignore_times)

    async def copy(self) -> None:
        """Phase 3: every planned copy not yet recorded as done."""
        counts = self.journal.get("m", "planned")
        self._planned(counts)
        if counts.get("fail"):  # objects the plan found impossible to copy, by name (every run says so)
            for key, rec in self.journal.scan("p"):
                if rec["a"] == "fail":
                    self._error(key, rec["r"])
        todo_objects = todo_bytes = 0
        for key in self._to_copy():
            todo_objects += 1
            todo_bytes += self._source(key).size
        self._take_resent()
        vanished = self.journal.get("m", "vanished") or 0  # planned copies found gone
        self.report.already_done = counts["copy"] - todo_objects - vanished + counts.get("done", 0)
        if self.opts.dry_run:
            self.report.copied = todo_objects
            self.report.copied_bytes = todo_bytes
            return
        self._phase("copying", todo_bytes, todo_objects)
        xfer = self._transferer()
        await _bounded((self._copy_one(xfer, self._source(k)) for k in self._to_copy()), self._copy_slots())
        self.report.retries += xfer.stats.retries

    async def _pipeline(self) -> None:
        """Phases 1 to 3 at once (a job that has not finished listing; not ``--dry-run``): the
        destination is listed first, then every page of the source listing is planned as it
        arrives (each key looked up in the destination's listing) and its copies start while the
        listing goes on; each copied object is verified as it lands (``v/``, which the verify
        phase then only counts). Memory stays bounded: when copies fall behind, planning and
        then listing wait. Resumable at every point: a run killed before the listing and plan
        were complete lists and plans again, finding what it copied at the destination (skipped
        there), and one killed later goes on with the copies left (:meth:`copy`)."""
        for kind in ("s", "d", "p"):
            self.journal.clear(kind)
        self._phase("listing", 0, 0, label="list dst")  # the source is listed while copying
        self.report.listed_dst = await self._list_into(self.dst, "d", missing_ok=_is_filesystem(self.dst))
        self._take_resent()
        self._phase("copying", 0, 0)
        xfer = self._transferer()
        ready: list[ObjectInfo] = []

        async def on_copy(info: ObjectInfo) -> None:
            ready.append(info)
            self.progress.grow(info.size, 1)

        planning = _Planning(self, on_copy)

        async def planned_copies() -> AsyncIterator[Awaitable[None]]:
            after, until = self.key_range
            pages = list_parallel_pages(self.src, concurrency=self.opts.list_concurrency, after=after, until=until)
            async with contextlib.aclosing(pages):  # a failed copy stops the listing's workers too
                async for page in pages:
                    self.journal.put_listing("s", page)
                    self.report.listed_src += len(page)
                    for src in page:
                        await planning.pair(src, self.journal.get_listing("d", src.key))
                        while ready:
                            yield self._copy_one(xfer, ready.pop(0), verify=True)
            if self.opts.delete:  # extraneous destination keys: the whole source listing is known now
                for only_src, dst in merge_join(self.journal.scan_listing("s"), self.journal.scan_listing("d")):
                    if only_src is None:
                        await planning.pair(None, dst)
            await planning.finish()
            self._note_not_files()
            listed = {"src": self.report.listed_src, "dst": self.report.listed_dst, "not_files": self.report.not_files}
            self.journal.mark("listed", listed)
            self.journal.mark("planned", planning.counts)  # from here a resume goes on with copy()
            self._planned(planning.counts)
            self.report.already_done = planning.counts.get("done", 0)
            await self._drop_unplanned_uploads(xfer)
            for info in ready:
                yield self._copy_one(xfer, info, verify=True)

        try:
            await _bounded(planned_copies(), self._copy_slots())
        finally:
            self.report.retries += xfer.stats.retries

    def _planned(self, counts: dict[str, int]) -> None:
        self.report.skipped = counts["skip"]
        self.report.planned_delete = counts["delete"]

    def _take_resent(self) -> None:
        """Count what an interrupted run had on its way (small objects, parts): sent again now."""
        resent = sum(int(n) for _key, n in self.journal.scan("i"))
        if resent:
            self.journal.clear("i")
            self.journal.put("m", "resent", (self.journal.get("m", "resent") or 0) + resent)
        self.report.resent_bytes = self.journal.get("m", "resent") or 0
        self.report.vanished = (self.journal.get("m", "vanished") or 0) + (
            self.journal.get("m", "vanished_unplanned") or 0
        )

    def _copy_slots(self) -> int:
        """Copies alive at once: twice the transfers, so the next ones wait ready (and verify)."""
        return max(2 * self.opts.transfers, 32)

    def _transferer(self) -> Transferer:
        xfer = Transferer(
            self.src,
            self.dst,
            transfers=self.opts.transfers,
            multipart_threshold=self.opts.multipart_threshold,
            part_size=self.opts.part_size,
            bwlimit=self.opts.bwlimit,
            memory=self.opts.memory,
            journal=self.journal,
            bandwidth=self.bandwidth,
        )
        xfer.stats.listeners.append(lambda n: self.progress.advance(n, 0))
        return xfer

    async def _copy_one(self, xfer: Transferer, info: ObjectInfo, *, verify: bool = False) -> None:
        """Copy one object and record the outcome; ``verify``: check the copy at once (``v/``)."""
        try:
            result: CopyResult = await xfer.copy(info)
        except NoSuchKey as exc:
            if not await self._source_gone(info.key):
                self._copy_failed(info.key, exc)
                return
            await self._vanished(xfer, info.key)
            return
        except (BabelError, OSError, ValueError) as exc:  # ValueError: e.g. a key the destination cannot encode
            self._copy_failed(info.key, exc)
            return
        rec = self._copied(info, result)
        if verify:
            async with self._checkers:
                await self._verify_record(info.key, rec, info)

    def _copied(self, info: ObjectInfo, result: CopyResult) -> dict[str, Any]:
        """Record a finished copy: its ``c/`` record (what verification checks, returned) and the report."""
        rec = {"size": result.size, "crc32c": result.crc32c, "parts": result.parts, "store": result.store_checksum}
        self.journal.put_dropping("c", info.key, rec, drop="e")
        self.report.copied += 1
        self.report.copied_bytes += result.size
        self.report.parts_reused += result.resumed_parts
        self.progress.advance(0, 1)
        return rec

    def _copy_failed(self, key: str, exc: BaseException) -> None:
        message = describe(exc).encode("utf-8", "backslashreplace").decode()
        self.journal.put("e", key, message)
        self._error(key, message)

    async def _source_gone(self, key: str) -> bool:
        """Whether the source object was deleted since it was listed (a HEAD says no such key)."""
        try:
            await self._retry(lambda: self.src.head(key))
        except FileNotFoundError:
            return True
        except (BabelError, OSError):
            return False
        return False

    async def _drop_unplanned_uploads(self, xfer: Transferer) -> None:
        """After a plan made again (a run killed before its plan was complete): abort the multipart
        uploads the killed run left open for keys this plan does not copy. A key no longer listed
        was deleted at the source (``vanished``, as when a planned copy finds it gone); one now
        skipped needs no upload. Without this, such an upload stayed open for ever under a job
        that said ``ok``."""
        for key, rec in list(self.journal.scan("u")):
            plan = self.journal.get("p", key)
            if plan is not None and plan["a"] == "copy":
                continue
            await xfer.abort(key, rec["upload_id"])
            self.journal.delete("u", key)
            if plan is None:  # not a planned copy: counted apart from those (``copy``'s arithmetic)
                self.report.vanished += 1
                self.journal.put("m", "vanished_unplanned", (self.journal.get("m", "vanished_unplanned") or 0) + 1)
                logger.info("%s: deleted at the source since a killed run listed it; its upload aborted", key)

    async def _vanished(self, xfer: Transferer, key: str) -> None:
        """A planned copy whose source is gone: noted (``vanished``), not failed, its open multipart
        upload (of this run or a killed one) aborted, and never tried again on resume."""
        upload = self.journal.get("u", key)
        if upload is not None:
            await xfer.abort(key, upload["upload_id"])
            self.journal.delete("u", key)
        self.journal.put("p", key, {"a": "vanished", "r": "deleted at the source since it was listed"})
        self.journal.delete("e", key)
        self.report.vanished += 1
        self.journal.put("m", "vanished", (self.journal.get("m", "vanished") or 0) + 1)
        logger.info("%s: deleted at the source since it was listed; not copied", key)

    def _to_copy(self):
        """Keys planned for copying that have no ``c/`` record yet, in key order (streamed)."""
        for key, rec in self.journal.scan("p"):
            if rec["a"] == "copy" and self.journal.get("c", key) is None:
                yield key

    def _source(self, key: str) -> ObjectInfo:
        info = self.journal.get_listing("s", key)
        if info is None:
            raise BabelError(f"journal has a plan but no source entry for {key!r}", uri=self.journal.dir)
        return info

    async def delete(self) -> None:
        """Phase 4: deletions, only when every copy succeeded and within ``max_delete``."""
        if not self.opts.delete or self.report.planned_delete == 0:
            return
        if self.report.failed:
            self._job_error(f"not deleting {self.report.planned_delete} objects: some copies failed")
            return
        if 0 <= self.opts.max_delete < self.report.planned_delete:
            self._job_error(
                f"refusing to delete {self.report.planned_delete} objects: more than --max-delete "
                f"{self.opts.max_delete}"
            )
            return
        if self.opts.dry_run:
            self.report.deleted = self.report.planned_delete
            return
        self._phase("deleting", 0, self.report.planned_delete)
        batch: list[str] = []
        for key, rec in self.journal.scan("p"):
            if rec["a"] == "delete":
                batch.append(key)
            if len(batch) >= 1000:
                await self.dst.delete(batch)
                self.report.deleted += len(batch)
                self.progress.advance(0, len(batch))
                batch = []
        if batch:
            await self.dst.delete(batch)
            self.report.deleted += len(batch)
            self.progress.advance(0, len(batch))

    async def verify(self) -> None:
        """Phase 5: metadata validation of every copied object, plus sample/full content checks."""
        if self.opts.dry_run:
            return
        self._phase("verifying", 0, self.report.copied + self.report.already_done)

        async def one(key: str, rec: dict[str, Any]) -> None:
            previous = self.journal.get("v", key)
            if previous is not None and previous.get("mode") == self.opts.verify:
                results = [VerifyResult(**r) for r in previous["results"]]
            else:
                async with self._checkers:
                    results = await self._verify_record(key, rec)
            runtime = self.report.verification["runtime"]
            runtime["crc32c_in_stream"] += 1
            if rec.get("store"):
                runtime["store_checksum_compared"] += 1
            for result in results:
                _note_verify(self.report, result.mode, result)
            self.progress.advance(0, 1)

        await _bounded((one(k, r) for k, r in self.journal.scan("c")), 4 * self.opts.checkers)

    async def _verify_record(
        self, key: str, rec: dict[str, Any], src: ObjectInfo | None = None
    ) -> builtins.list[VerifyResult]:
        """Verify one copied object (:meth:`_verify_one`; an error is a failed check) into its ``v/`` record."""
        try:
            results = await self._verify_one(key, rec, src)
        except (BabelError, OSError, ValueError) as exc:
            results = [VerifyResult(key, "metadata", False, describe(exc), 0, 0)]
        self.journal.put("v", key, {"mode": self.opts.verify, "results": [dict(vars(r)) for r in results]})
        return results

    async def _verify_one(  # builtins.list: SyncJob.list is a phase
        self, key: str, rec: dict[str, Any], src: ObjectInfo | None = None
    ) -> builtins.list[VerifyResult]:
        """The checks of one copied object; a throttled or transient store error is retried
        (:meth:`_retry`), so a failed check means the bytes or metadata differ."""
        src = src or self._source(key)  # the listing entry: given by a copy that just landed
        try:
            dst = await self._retry(lambda: self.dst.head(key))
        except FileNotFoundError:
            return [VerifyResult(key, "metadata", False, "missing at the destination", 0, 0)]
        meta = await check_metadata(src, dst)
        if meta.ok and META_CRC32C in dst.metadata and int(dst.metadata[META_CRC32C], 16) != rec["crc32c"]:
            meta = VerifyResult(key, "metadata", False, "stored crc32c differs from the in-stream crc32c", 0, 0)
        results = [meta]
        small = src.size <= self.opts.samples * self.opts.sample_size
        if self.opts.verify == "full" or (self.opts.verify == "sample" and small):
            # an object no bigger than the sample reads whole anyway: check it against the in-stream
            # CRC32C (stronger, and the source is not read again)
            results.append(await check_full(self._checked(self.dst), key, src.size, rec["crc32c"], dst_info=dst))
        elif self.opts.verify == "sample":
            results.append(
                await check_sample(
                    self._checked(self.src),
                    self._checked(self.dst),
                    key,
                    src.size,
                    samples=self.opts.samples,
                    sample_size=self.opts.sample_size,
                )
            )
        return results

    def _checked(self, store: ObjectStore) -> ObjectStore:
        """``store`` with every HEAD and GET retried (:meth:`_retry`): verification reads many
        ranges per object, and each must ride out throttling on its own."""
        return cast(ObjectStore, _RetryingReads(store, self._retry))

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` retried on throttling and transient errors as copies are
        (:func:`~babel.retry.with_retries`, :data:`~babel.retry.ATTEMPTS` tries), counted in the report."""

        def count(_exc: BaseException) -> None:
            self.report.retries += 1

        return await with_retries(fn, attempts=ATTEMPTS, on_retry=count)

    # ------------------------------------------------------------ driver --

    def _phase(self, name: str, total_bytes: int, total_objects: int, *, label: str = "") -> None:
        """Enter a phase: recorded in ``job.json`` (``babel jobs`` shows it) and shown by the
        progress bar (as ``label`` when given)."""
        self.journal.update(phase=name)
        self.progress.phase(label or name, total_bytes, total_objects)

    def _error(self, key: str, message: str) -> None:
        """One object failed (``key``): counted in ``failed`` and listed with its cause."""
        self.report.failed += 1
        self._job_error(message, key)

    def _job_error(self, message: str, key: str = "") -> None:
        """A failure listed in the report's errors; without a key (the job's own, e.g. deletions
        refused) it counts no object but still makes the job partial."""
        self.report.errors_total += 1
        if not key:
            self._incomplete = True
        if len(self.report.errors) < MAX_REPORTED:
            self.report.errors.append({"key": key, "error": message})

    async def run(self) -> SyncReport:
        """Run (or resume) every phase and return the report; fatal errors end in state ``failed``."""
        start = time.monotonic()
        self.journal.update(state="running", pid=os.getpid())
        try:
            await asyncio.gather(check_reachable(self.src), check_reachable(self.dst))
            check = getattr(self.dst, "check_destination", None)  # stores of paths: a file in the way
            if check is not None:
                await check()
            await check_source_prefix(self.src, self._retry)
            if self.opts.dry_run or self.journal.marked("listed"):
                await self.list()
                await self.plan()
                await self.copy()
            else:
                await self._pipeline()
            await self.delete()
            await self.verify()
        except BabelError as exc:
            self.report.fatal = describe(exc)
            self.report.state = "failed"
        finally:
            self.report.retries += getattr(self.src, "retries", 0) + getattr(self.dst, "retries", 0)
            await asyncio.gather(self.src.close(), self.dst.close(), return_exceptions=True)
        self.report.seconds = time.monotonic() - start
        if self.report.state != "failed":
            v = self.report.verification
            bad = v["metadata"]["failed"] + v["sample"]["failed"] + v["full"]["failed"]
            self.report.state = "partial" if (self.report.failed or bad or self._incomplete) else "ok"
        self.journal.update(state=self.report.state, phase="done", summary=self.report.to_dict(), pid=None)
        return self.report


NAME_MAX = 255  # bytes of one file name on the file systems under path-keyed stores (Linux's NAME_MAX)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # what rclone's default encoding (Ctl, Del) renames on disk


class _Planning:
    """The decisions of one job, pair by pair (:mod:`babel.planner`): ``p/`` records and their
    counts; a destination entry without Babel's metadata is HEADed first (``checkers`` at a
    time, in the background); ``on_copy`` (the pipeline's) hears of every planned copy."""

    def __init__(self, job: SyncJob, on_copy: Callable[[ObjectInfo], Awaitable[None]] | None = None) -> None:
        self.job = job
        self.on_copy = on_copy
        self.counts: dict[str, int] = {"copy": 0, "skip": 0, "delete": 0, "copy_bytes": 0}
        self.checkers = asyncio.Semaphore(job.opts.checkers)
        self.pending: set[asyncio.Task] = set()
        self._paths = _keys_are_paths(job.dst)

    async def pair(self, src: ObjectInfo | None, dst: ObjectInfo | None) -> None:
        """Plan one key: ``(src, dst)``, ``(src, None)`` or ``(None, dst)``."""
        job, opts = self.job, self.job.opts
        key = (src or dst).key  # type: ignore[union-attr]
        if not job.filters.admits(key):
            return
        if src is None:
            if opts.delete:
                await self.record(None, dst, Decision("delete", "extraneous"))
            return
        if src.key.endswith("/") and await job._dst_keys_are_paths():
            if src.size:  # a marker with content: skipping it would lose bytes without a word
                self._fail(src.key, f"a directory marker with {src.size} bytes of content cannot be stored on"
                                    f" {job.dst.uri} (its keys are file paths): not copied")  # fmt: skip
            else:
                await self.record(src, dst, Decision("skip", "directory marker"))
            return
        if self._paths:  # known so: no probe per job
            if reason := self._path_problem(src.key):
                self._fail(src.key, reason)
                return
            if dst is not None:
                # a file there already (copied by an earlier run): a key under it is impossible
                # too, and is checked before a HEAD decides this one (a copy's plan replaces this)
                job.journal.put("p", src.key, {"a": "skip", "r": "at the destination"})
        if (
            dst is not None
            and dst.size == src.size
            and (needs_head(dst, size_only=opts.size_only) or needs_source_head(src, dst))
            and not opts.size_only
            and not opts.ignore_times
        ):
            task = asyncio.create_task(self._head_then_decide(src, dst))
            self.pending.add(task)
            if len(self.pending) >= 4 * opts.checkers:
                done, _ = await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)
                self.pending.difference_update(done)
                for t in done:
                    t.result()
            return
        await self.record(src, dst, job._decide(src, dst))

    def _fail(self, key: str, reason: str) -> None:
        """Plan ``key`` as impossible to copy, by name (never retried: the destination cannot hold it)."""
        self.job.journal.put("p", key, {"a": "fail", "r": reason})
        self.counts["fail"] = self.counts.get("fail", 0) + 1
        if self.on_copy is not None:  # the pipeline reports it now (copy() does otherwise)
            self.job._error(key, reason)

    def _path_problem(self, key: str) -> str:
        """Why a destination that keeps keys as file paths cannot store ``key`` ("" when it can):
        a segment longer than a file name may be, or a file of this job where a directory of the
        path must be (``both`` and ``both/child.txt``; keys come in order, so the file was planned
        first, or found at the destination by an earlier run's copy). rclone's ``serve s3`` answered both with 500 InternalError, retried for a minute.
        Also a key no file path can be (``x/../y``, ``a//b``: the dry run planned a copy the run
        failed), and on an S3 server that keeps keys as files a control character (rclone's
        encoding stores ``tab\tin.txt`` as ``tab␉in.txt``: copied again on every run, and
        verify found it missing)."""
        try:
            check_key(key, self.job.dst.uri)
        except BadURI as exc:
            return f"{exc}: not copied"
        if not _is_filesystem(self.job.dst) and (control := CONTROL.search(key)):
            return (f"a control character ({control.group()!r}) in the key: {self.job.dst.uri} keeps keys as"
                    " file paths and stores it under another name (rclone's encoding): not copied")  # fmt: skip
        parts = key.split("/")
        long = next((p for p in parts if len(p.encode("utf-8", "surrogateescape")) > NAME_MAX), None)
        if long is not None:
            return (f"a path segment of {len(long.encode('utf-8', 'surrogateescape'))} bytes cannot be a file name"
                    f" on {self.job.dst.uri} (its keys are file paths, names at most {NAME_MAX} bytes): not copied")  # fmt: skip
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            plan = self.job.journal.get("p", above)
            if plan is not None and plan["a"] != "fail":
                return (f"{above!r} is a file of this job, and {self.job.dst.uri} keeps keys as file paths: nothing"
                        " can be stored under it: not copied")  # fmt: skip
        for below, raw in self.job.journal.scan_raw("p", start_after=key + "/"):  # pages come in any order
            if below.startswith(key + "/") and json.loads(raw)["a"] != "fail":
                return (f"{below!r} of this job is under it, and {self.job.dst.uri} keeps keys as file paths: a"
                        " file cannot also be a directory: not copied")  # fmt: skip
            break
        return ""

    async def _head_then_decide(self, src: ObjectInfo, dst: ObjectInfo) -> None:
        full: ObjectInfo | None = dst
        async with self.checkers:
            if needs_head(dst):
                try:
                    full = await self.job._retry(lambda: self.job.dst.head(dst.key))
                except FileNotFoundError:
                    full = None  # deleted since it was listed
            if full is not None and needs_source_head(src, full):
                try:  # the mtime Babel carried into the source object (a copy of a copy)
                    src = await self.job._retry(lambda: self.job.src.head(src.key))
                except FileNotFoundError:
                    pass  # deleted since it was listed: its copy fails by name
        await self.record(src, full, self.job._decide(src, full))

    async def record(self, src: ObjectInfo | None, dst: ObjectInfo | None, decision: Decision) -> None:
        journal = self.job.journal
        if decision.action == "skip" and src is not None and journal.get("c", src.key) is not None:
            self.counts["done"] = self.counts.get("done", 0) + 1  # copied by an earlier run of this job
        else:
            self.counts[decision.action] += 1
        if decision.action == "copy":
            assert src is not None
            self.counts["copy_bytes"] += src.size
            journal.put("p", src.key, {"a": "copy", "r": decision.reason})
            if self.on_copy is not None:
                await self.on_copy(src)
        elif decision.action == "delete":
            assert dst is not None
            journal.put("p", dst.key, {"a": "delete", "r": decision.reason})
        if self.on_copy is None:
            self.job.progress.advance(0, 1 if src is not None else 0)

    async def finish(self) -> None:
        """Wait for the HEADs still in flight; their errors are raised."""
        if self.pending:
            for outcome in await asyncio.gather(*self.pending, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
            self.pending.clear()


class _RetryingReads:
    """A store whose ``head`` and ``get`` go through ``retry``; everything else as the store's."""

    def __init__(self, store: ObjectStore, retry: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]) -> None:
        self._store, self._with_retries = store, retry

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def head(self, key: str) -> ObjectInfo:
        return await self._with_retries(lambda: self._store.head(key))

    async def get(self, key: str, offset: int = 0, length: int | None = None, *, if_match: str = "") -> bytes:
        return await self._with_retries(lambda: self._store.get(key, offset, length, if_match=if_match))


REACH_TIMEOUT = 4.0  # seconds per TCP connect of the start-up check
REACH_TRIES = 3  # connects before an endpoint is called unreachable (about 10 s at most)
ANSWER_TIMEOUT = 10.0  # seconds the start-up check waits for the first byte of an HTTP answer


async def check_reachable(store: ObjectStore) -> None:
    """Fail fast when an object store's endpoint does not answer HTTP: it takes no TCP connection
    (refused, no route, unknown host), or takes one and sends nothing back (a hung server, a
    black-holing firewall): the job's request retries, made to ride out a store's hiccups, would
    spend minutes on one that is not there. A ``HEAD /`` that gets any answer, even an error,
    within :data:`ANSWER_TIMEOUT` passes; so do stores without an endpoint URL (AWS's own, file
    systems), and every store when an HTTP(S) proxy is configured.

    Raises:
        TransientError: ``REACH_TRIES`` connects in a row failed, or a connection got no answer.
    """
    endpoint_url = getattr(store, "endpoint_url", None)
    url = endpoint_url() if callable(endpoint_url) else None
    if not url or any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return  # behind a proxy only the proxy takes connections: the requests themselves will tell
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    tls: ssl.SSLContext | None = None
    if parts.scheme == "https":  # liveness only: nothing is sent but the probe, so no certificate check
        tls = ssl.create_default_context()
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    error: BaseException | None = None
    for attempt in range(REACH_TRIES):
        try:
            async with asyncio.timeout(REACH_TIMEOUT):
                reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        except (OSError, TimeoutError) as exc:
            error = exc
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        try:
            writer.write(f"HEAD / HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n".encode())
            async with asyncio.timeout(ANSWER_TIMEOUT):
                await writer.drain()
                answer = await reader.read(1)
        except (OSError, TimeoutError) as exc:
            raise TransientError(
                f"endpoint {url} took the connection but sent no answer within {ANSWER_TIMEOUT:.0f} s"
                f" ({type(exc).__name__}): a hung server or a firewall dropping its answers",
                uri=store.uri,
            ) from exc
        finally:
            writer.close()
        if not answer:
            raise TransientError(f"endpoint {url} closed the connection without an HTTP answer", uri=store.uri)
        return
    raise TransientError(
        f"endpoint {url} unreachable: {REACH_TRIES} connections failed ({type(error).__name__}: {error})",
        uri=store.uri,
    ) from error


async def _bounded(coros: Iterable[Awaitable[None]] | AsyncIterable[Awaitable[None]], limit: int) -> None:
    """Run coroutines from a lazy iterable (or async iterable) with at most ``limit`` alive, so
    memory stays bounded and a producer waits for room; the first failure stops taking more,
    and is raised once the running ones ended (a failing producer's error likewise)."""
    sem = asyncio.Semaphore(limit)
    tasks: set[asyncio.Task] = set()
    failure: list[BaseException] = []

    async def guarded(coro: Awaitable[None]) -> None:
        try:
            await coro
        except BaseException as exc:
            failure.append(exc)
        finally:
            sem.release()

    source = coros if isinstance(coros, AsyncIterable) else _as_async(coros)
    try:
        async for coro in source:
            try:
                await sem.acquire()
            except BaseException:  # cancelled (Ctrl-C) while waiting for a slot: it never runs
                cast(Coroutine, coro).close()
                raise
            if failure:
                cast(Coroutine, coro).close()
                sem.release()
                break
            task = asyncio.create_task(guarded(coro))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except Exception as exc:  # the producer failed (the source's listing): the copies under way end first
        failure.insert(0, exc)
    finally:
        if isinstance(source, AsyncGenerator):  # a producer left early (a failure) stops its own work
            await source.aclose()
    if tasks:
        await asyncio.gather(*tasks)
    if failure:
        raise failure[0]


async def _as_async(items: Iterable[T]) -> AsyncGenerator[T, None]:
    for item in items:
        yield item


def create_job(src_uri: str, dst_uri: str, options: SyncOptions | None, state_dir: str) -> str:
    """Create a sync job (its journal and ``job.json``) without running it; return its id.

    :func:`run_sync` with ``job_id`` runs it later (``babel daemon`` queues jobs this way).

    Raises:
        BadURI: an unknown scheme or malformed URI (before anything is created).
        BadOption: an option out of bounds (:meth:`SyncOptions.check`).
    """
    options = (options or SyncOptions()).check()
    check_not_overlapping(src_uri, dst_uri)
    journal = Journal(state_dir, new_job_id(), create=True)
    try:
        journal.update(src=src_uri, dst=dst_uri, options=asdict(options), created=time.time(), kind="sync")
    finally:
        journal.close()
    return journal.job_id


async def check_source_prefix(
    src: ObjectStore, retry: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
) -> None:
    """Refuse a bucket source whose prefix holds no object, as rclone fails such a path
    ("directory not found") and as a missing directory of ``file://`` fails: a mistyped prefix,
    or one object's key given as the prefix, listed nothing and the job was "ok", and with
    ``--delete`` it emptied the destination. A bucket's root may be empty. ``retry`` runs each
    request (throttling, transient errors).

    Raises:
        NoSuchKey: no object under the prefix (naming the object when the prefix is one).
    """
    base = getattr(src, "base", "")
    if not base or getattr(src, "bucket", None) is None:
        return
    page = await retry(lambda: src.list_page("", max_keys=1))
    if page.objects or page.prefixes:
        return
    name = base.rstrip("/").rsplit("/", 1)[-1]
    parent = type(src)(src.uri, src.bucket, base.rstrip("/")[: -len(name)], dict(src.options))  # type: ignore[call-arg, attr-defined]
    try:
        found = await retry(lambda: parent.head(name))
    except NoSuchKey:
        found = None
    finally:
        await parent.close()
    if found is not None:
        raise NoSuchKey(
            f"{base.rstrip('/')!r} is an object, not a prefix: sync the prefix it is in with --include '/{name}'",
            uri=src.uri,
        )
    raise NoSuchKey(
        f"no object under the prefix {base!r} (a mistyped prefix lists nothing: refused, as a missing"
        " directory is, rather than copying nothing or, with --delete, emptying the destination)",
        uri=src.uri,
    )


def check_not_overlapping(src_uri: str, dst_uri: str) -> None:
    """Open both URIs (BadURI first) and refuse a destination inside the source or the other way
    round: each run would copy the previous run's copy into itself."""
    src, dst = open_store(src_uri), open_store(dst_uri)

    def place(store: ObjectStore) -> tuple[str, str, str, str] | None:
        """(kind, endpoint, bucket, path prefix) of a store's keys."""
        root = getattr(store, "root", None)
        if store.uri.startswith("file:") and root:
            return ("file", "", "", os.path.realpath(root).rstrip("/") + "/")
        if store.uri.startswith("pcache:") and root is not None:
            return ("pcache", str(getattr(store, "master", "")), "", root.rstrip("/") + "/")
        bucket = getattr(store, "bucket", None)
        if bucket is not None:
            endpoint = getattr(store, "options", {}).get("endpoint_url") or ""
            return (type(store).__name__, endpoint, bucket, getattr(store, "base", ""))
        return None

    a, b = place(src), place(dst)
    if not (a and b and a[0] == b[0] and a[2] == b[2] and (a[3].startswith(b[3]) or b[3].startswith(a[3]))):
        return
    if a[1] == b[1] or _same_endpoint(a[1], b[1]):
        raise BadURI(f"source and destination overlap ({src_uri} and {dst_uri})", uri=dst_uri)


def _same_endpoint(a: str, b: str) -> bool:
    """Whether two spellings of endpoints (``http://localhost:9000`` and
    ``http://127.0.0.1:9000``; PCache master lists ``host:port,host:port``) reach one server: a
    port in common and an address both names resolve to. Resolved only here, for two URIs of one
    bucket and prefix; a name that does not resolve is only equal to itself."""

    def addresses(spec: str) -> set[tuple[str, int]]:
        out: set[tuple[str, int]] = set()
        for one in spec.split(","):
            parsed = urlsplit(one if "//" in one else f"//{one}")
            try:
                port = parsed.port or {"https": 443, "http": 80}.get(parsed.scheme, 0)
                infos = socket.getaddrinfo(parsed.hostname or "", port, type=socket.SOCK_STREAM)
            except (OSError, ValueError, UnicodeError):
                continue
            out.update((str(info[4][0]), port) for info in infos)
        return out

    return bool(a and b and addresses(a) & addresses(b))


async def run_sync(
    src_uri: str,
    dst_uri: str,
    options: SyncOptions | None = None,
    *,
    state_dir: str,
    job_id: str | None = None,
    progress: Progress | None = None,
    on_job: Callable[[str], None] | None = None,
) -> SyncReport:
    """Sync ``src_uri`` to ``dst_uri`` as a new job, or resume ``job_id``; ``on_job`` is told
    the job's id as soon as its journal exists (what a resume needs after Ctrl-C).

    A resumed job takes its URIs and options from its journal (``src_uri``/``dst_uri``
    may then be empty).

    Raises:
        BadURI: an unknown scheme or malformed URI (before anything runs).
        BadOption: an option out of bounds (:meth:`SyncOptions.check`).
        FileNotFoundError: ``job_id`` names no job in ``state_dir``. BadOption: it names a verify job,
            or a chunk of a shared job (its processes on etcd resume it).
    """
    if job_id is not None:
        journal = Journal(state_dir, job_id)
        desc = journal.describe()
        if desc.get("kind") == "verify":
            journal.close()
            raise BadOption("--resume", f"{job_id} is a verify job, not a sync: give the babel verify command"
                            " again (babel sync --ignore-times repairs what it found)")  # fmt: skip
        if desc.get("kind") == "shared":  # resumed alone it would copy beside the shard's owner, unfenced
            journal.close()
            raise BadOption("--resume", f"{job_id} is a chunk of shared job {desc.get('shared', '?')!r}, which a"
                            " process on etcd resumes: babel sync --etcd HOST:PORT --job "
                            f"{desc.get('shared', 'NAME')} (babel jobs --etcd HOST:PORT shows it)")  # fmt: skip
        src_uri, dst_uri = desc["src"], desc["dst"]
        options = options_from_dict(desc["options"])
    else:
        options = options or SyncOptions()
        journal = Journal(state_dir, create_job(src_uri, dst_uri, options, state_dir))
    if on_job is not None:  # a new job's id, or the resumed one's
        on_job(journal.job_id)
    try:
        job = SyncJob(src_uri, dst_uri, options, journal, progress)
        return await job.run()
    finally:
        journal.close()


async def clean_job(state_dir: str, job_id: str, *, temp_files: bool = True) -> dict[str, int]:
    """Clean up after an abandoned job: abort the multipart uploads its journal has open (a
    killed run's, kept for resume), delete the temporary files of the objects it had on their
    way in a file-system destination (``temp_files``; its journal's ``i/`` keys: never another
    job's), then delete the job's state directory.

    Returns:
        ``{"uploads_aborted": n, "temp_files": n, "temp_bytes": n}``.

    Raises:
        FileNotFoundError: no such job. JobBusy: a process has it open. BabelError: the
            destination refused (the job is kept, to try again).
    """
    journal = Journal(state_dir, job_id)
    store: ObjectStore | None = None
    aborted = files = nbytes = 0
    try:
        store = open_store(journal.describe().get("dst", ""))
        for key, rec in journal.scan("u"):
            try:
                await store.abort_multipart(key, rec["upload_id"])
            except NoSuchUpload:
                pass  # expired, or finished by the run that died before its record
            aborted += 1
        remove = getattr(store, "remove_temp_files", None)
        in_flight = [key for key, _n in journal.scan("i")]
        if temp_files and remove is not None and in_flight:
            files, nbytes = await remove(in_flight)
    finally:
        journal.close()
        if store is not None:
            await store.close()
    shutil.rmtree(journal.dir)
    return {"uploads_aborted": aborted, "temp_files": files, "temp_bytes": nbytes}


def mark_interrupted(state_dir: str, job_id: str) -> None:
    """Record that a job's process stopped it (Ctrl-C, SIGTERM): ``interrupted``, no pid (best
    effort: a job whose journal cannot be opened keeps what it said)."""
    try:
        journal = Journal(state_dir, job_id)
    except (OSError, BabelError):
        return
    try:
        journal.update(state="interrupted", pid=None)
    finally:
        journal.close()


def planned(state_dir: str, job_id: str) -> Iterator[tuple[str, str, str]]:
    """A job's plan as ``(action, key, reason)`` in key order: ``copy`` and ``delete`` steps,
    and objects that cannot be copied (``fail``); what ``babel sync --dry-run`` prints."""
    journal = Journal(state_dir, job_id)
    try:
        for key, rec in journal.scan("p"):
            if rec["a"] in ("copy", "delete", "fail"):
                yield rec["a"], key, rec.get("r", "")
    finally:
        journal.close()


async def run_verify(
    src_uri: str,
    dst_uri: str,
    options: SyncOptions | None = None,
    *,
    state_dir: str,
    progress: Progress | None = None,
) -> SyncReport:
    """Compare two trees without copying: every key on both sides, sizes and stored metadata
    always, content by ``options.verify`` (``sample`` or ``full``: CRC32C of both sides).

    Keys missing on either side count as failures. Returns the report (state ok/partial/failed).
    """
    options = (options or SyncOptions()).check()
    open_store(src_uri), open_store(dst_uri)  # noqa: B018 - raises BadURI first
    journal = Journal(state_dir, new_job_id(), create=True)
    journal.update(src=src_uri, dst=dst_uri, options=asdict(options), created=time.time(), kind="verify")
    job = SyncJob(src_uri, dst_uri, options, journal, progress)
    report = job.report
    start = time.monotonic()
    try:
        await job.list()
        job._phase("verifying", 0, report.listed_src)
        sem = asyncio.Semaphore(options.checkers)

        async def pair(src: ObjectInfo | None, dst: ObjectInfo | None) -> None:
            key = (src or dst).key  # type: ignore[union-attr]
            if src is None or dst is None:
                side = "destination" if dst is None else "source"
                _note_verify(report, "metadata", VerifyResult(key, "metadata", False, f"missing at the {side}", 0, 0))
                report.failed += 1
                return
            async with sem:
                try:
                    if needs_head(dst):
                        dst = await job._retry(lambda: job.dst.head(key))
                    results = [await check_metadata(src, dst)]
                    # an object no bigger than the sample is read whole either way: counted under
                    # "full", as a sync counts it
                    small = src.size <= options.samples * options.sample_size
                    if options.verify == "full" or (options.verify == "sample" and small):
                        results.append(await check_full(job._checked(job.dst), key, src.size, None,
                                                        src=job._checked(job.src)))  # fmt: skip
                    elif options.verify == "sample":
                        results.append(await check_sample(
                            job._checked(job.src), job._checked(job.dst), key, src.size, samples=options.samples,
                            sample_size=options.sample_size,
                        ))  # fmt: skip
                except (BabelError, OSError) as exc:  # a store's own checksum failing is the content check's
                    mode = options.verify if isinstance(exc, Corrupt) and options.verify != "none" else "metadata"
                    results = [VerifyResult(key, mode, False, describe(exc), 0, 0)]
            for result in results:
                _note_verify(report, result.mode, result)
            if not all(r.ok for r in results):
                report.failed += 1  # objects, not checks: one object may fail several
            job.progress.advance(0, 1)

        pairs = merge_join(journal.scan_listing("s"), journal.scan_listing("d"))
        await _bounded(
            (pair(s, d) for s, d in pairs if job.filters.admits((s or d).key)),  # type: ignore[union-attr]
            4 * options.checkers,
        )
        v = report.verification
        report.state = "partial" if v["metadata"]["failed"] + v["sample"]["failed"] + v["full"]["failed"] else "ok"
    except BabelError as exc:
        report.fatal = describe(exc)
        report.state = "failed"
    finally:
        await asyncio.gather(job.src.close(), job.dst.close(), return_exceptions=True)
        report.seconds = time.monotonic() - start
        journal.update(state=report.state, summary=report.to_dict())
        journal.close()
    return report


async def iter_listing(uri: str, *, concurrency: int = 32) -> AsyncIterator[list[ObjectInfo]]:
    """Pages of a parallel listing of ``uri`` (``babel ls``)."""
    store = open_store(uri)
    try:
        async for page in list_parallel_pages(store, concurrency=concurrency):
            yield page
    finally:
        await store.close()
