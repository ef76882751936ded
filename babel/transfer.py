"""Copy objects between stores: adaptive sharding, in-stream CRC, bandwidth limit, retries.

Adaptive sharding (Ling report, arXiv 2503.05139 §2.3.2): an object below the
multipart threshold is one unit of work (GET, PUT); a larger one is cut into
parts whose size follows from the object size and the destination's part-count
limit (:func:`choose_part_size`), and every part is a unit of its own. Units of
all objects share one pool of ``transfers`` slots and one memory budget, so
many small objects and a few huge ones keep the same number of requests in
flight.

Every byte is CRC32C'd as it passes (per part, combined into the object CRC
with :func:`babel.checksum.crc32c_combine`); where the destination reports its
own checksum (OSS CRC64-ECMA per part and per object) the CRC64 of the same
bytes is computed too and compared at once: the **runtime check**. A part whose
checksum disagrees is uploaded again.

Retries (tenacity, exponential backoff with jitter) cover only errors whose type
says ``retryable`` (throttling, 5xx, resets, timeouts); a missing bucket or a
denied request fails at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiolimiter import AsyncLimiter

from babel.checksum import crc32c, crc64ecma, crc64ecma_combine
from babel.checksum import crc32c_combine as combine32
from babel.errors import BabelError, NoSuchUpload
from babel.retry import ATTEMPTS, with_retries
from objstore.base import META_CRC32C, META_MTIME, META_SRC_ETAG, MiB, ObjectInfo, ObjectStore, PartInfo, object_uri

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_THRESHOLD = 64 * MiB
MIN_AUTO_PART = 8 * MiB
TARGET_PARTS = 1000  # beyond 8 GiB, parts grow so an object stays near this many


class SourceChanged(BabelError):
    """The source object changed (size or mtime) while it was being copied: nothing was published."""


class ChecksumMismatch(BabelError):
    """The destination's checksum of bytes we sent differs from ours (retried)."""

    retryable = True


def choose_part_size(size: int, min_part: int, max_part: int, max_parts: int, requested: int | None = None) -> int:
    """Part size in bytes for an object of ``size`` bytes.

    ``requested`` (``--part-size``) wins when the store allows it; otherwise 8 MiB,
    doubled while the object would need more than ~1000 parts (fewer requests and
    journal records for huge objects), never below the store's minimum and always
    within its part-count limit (S3: 5 MiB..5 GiB, 10,000 parts).

    Raises:
        BabelError: the object is too large for the store even at the largest part size.
    """
    if size > max_part * max_parts:
        raise BabelError(f"{size} bytes exceed the store's limit of {max_parts} parts of {max_part} bytes")
    if requested:
        part = max(requested, min_part)
    else:
        part = max(MIN_AUTO_PART, min_part)
        while -(-size // part) > TARGET_PARTS and part * 2 <= max_part:
            part *= 2
    while -(-size // part) > max_parts:
        part = min(part * 2, max_part)
    return min(part, max_part)


class _ByteBudget:
    """At most ``limit`` bytes of object data held in memory by units in flight."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        n = min(n, self.limit)  # one unit bigger than the budget runs alone
        async with self.cond:
            await self.cond.wait_for(lambda: self.used + n <= self.limit)
            self.used += n

    async def release(self, n: int) -> None:
        async with self.cond:
            self.used -= min(n, self.limit)
            self.cond.notify_all()


@dataclass
class CopyResult:
    """One finished copy: bytes, the in-stream CRC32C, how it was sent and what the runtime check saw."""

    key: str
    size: int
    crc32c: int
    parts: int
    seconds: float
    store_checksum: str = ""  # e.g. "crc64ecma ok" when the destination's checksum was compared
    resumed_parts: int = 0


@dataclass
class TransferStats:
    """Running totals for progress reporting (bytes are payload bytes written)."""

    bytes: int = 0
    objects: int = 0
    retries: int = 0
    listeners: list[Callable[[int], None]] = field(default_factory=list)

    def add(self, n: int) -> None:
        self.bytes += n
        for fn in self.listeners:
            fn(n)


class Bandwidth:
    """A bandwidth limit in bytes per second over every transfer that shares it (all chunks of a
    shared job in one process, say): a leaky bucket (``aiolimiter``) of one second's worth,
    started full so that the first second sends no burst above the rate either."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._limiter = AsyncLimiter(rate, 1.0)
        self._primed = False

    async def take(self, n: int) -> None:
        """Wait until ``n`` more bytes may be sent; taken 1 MiB at a time, so no request waits
        for more than the bucket holds."""
        if not self._primed:
            self._primed = True
            await self._limiter.acquire(self._limiter.max_rate)
        step = max(1, int(self._limiter.max_rate))
        while n > 0:
            take = min(n, step, MiB)
            await self._limiter.acquire(take)
            n -= take


class Transferer:
    """Copies objects from ``src`` to ``dst`` with bounded concurrency and memory.

    Args:
        transfers: units (whole small objects or parts) in flight at once.
        multipart_threshold: objects of at least this many bytes go multipart.
        part_size: fixed part size in bytes (None: :func:`choose_part_size`).
        bwlimit: bytes per second over all transfers (None: unlimited).
        bandwidth: a :class:`Bandwidth` shared with other transferers (wins over ``bwlimit``).
        memory: bytes of object data held at once (parts and small objects in flight).
        retries: attempts per request on retryable errors.
        journal: where multipart progress is recorded for resume (``u/KEY`` records).
    """

    def __init__(
        self,
        src: ObjectStore,
        dst: ObjectStore,
        *,
        transfers: int = 16,
        multipart_threshold: int = DEFAULT_THRESHOLD,
        part_size: int | None = None,
        bwlimit: float | None = None,
        memory: int = 512 * MiB,
        retries: int = ATTEMPTS,
        journal: Any = None,
        bandwidth: Bandwidth | None = None,
    ) -> None:
        self.src = src
        self.dst = dst
        self.slots = asyncio.Semaphore(transfers)
        self.threshold = max(multipart_threshold, dst.limits.min_part_size)
        self.part_size = part_size
        self.budget = _ByteBudget(memory)
        self.retries = retries
        self.journal = journal
        self.stats = TransferStats()
        self._inflight: dict[str, int] = {}  # bytes being sent now, by key (journal i/KEY)
        self.bandwidth = bandwidth or (Bandwidth(bwlimit) if bwlimit and math.isfinite(bwlimit) else None)
        self.crc64 = "crc64ecma" in getattr(dst, "checksum_algorithms", ()) or dst.uri.startswith("oss://")

    # ------------------------------------------------------------ plumbing --

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        def count(_exc: BaseException) -> None:
            self.stats.retries += 1

        return await with_retries(fn, attempts=self.retries, on_retry=count)

    async def _throttle(self, n: int) -> None:
        if self.bandwidth is not None:
            await self.bandwidth.take(n)

    # ------------------------------------------------------------ copying --

    def metadata(self, info: ObjectInfo, crc: int | None, source: dict[str, str] | None = None) -> dict[str, str]:
        """User metadata Babel writes with a copy: the source mtime (the one the source itself
        carries when it is a Babel copy: mtimes survive every hop), the source's ETag (object
        stores) and, when known up front, the CRC32C."""
        carried = (source or info.metadata).get(META_MTIME)
        try:
            mtime = repr(float(carried)) if carried is not None else repr(float(info.mtime))
        except ValueError:
            mtime = repr(float(info.mtime))
        meta = {META_MTIME: mtime}
        if info.etag:
            meta[META_SRC_ETAG] = info.etag
        if crc is not None:
            meta[META_CRC32C] = f"{crc:08x}"
        return meta

    async def _source_metadata(self, info: ObjectInfo) -> dict[str, str] | None:
        """The source object's user metadata where its listing lacks it (S3 lists none): a HEAD,
        made once per multipart object. None when the listing has it."""
        if META_MTIME in info.metadata or not hasattr(self.src, "get_with_metadata"):
            return None
        return (await self._retry(lambda: self.src.head(info.key))).metadata

    async def copy(self, info: ObjectInfo) -> CopyResult:
        """Copy one object (``info`` from the source listing) and return what was sent.

        Raises:
            BabelError: the object could not be copied after retries; the destination
                keeps its previous version (a multipart upload is left for resume or aborted).
        """
        start = time.monotonic()
        if info.size >= self.threshold:
            try:
                result = await self._copy_multipart(info)
            except NoSuchUpload:  # the store dropped the upload a killed run left (a lifecycle rule,
                if self.journal is not None:  # an abort by someone else): start it over, once
                    self.journal.delete("u", info.key)
                logger.warning("%s: its unfinished multipart upload is gone from the store; starting over", info.key)
                result = await self._copy_multipart(info)
        else:
            result = await self._copy_small(info)
        result.seconds = time.monotonic() - start
        self.stats.objects += 1
        return result

    async def _copy_small(self, info: ObjectInfo) -> CopyResult:
        await self.budget.acquire(info.size)
        try:
            async with self.slots:

                async def once() -> tuple[int, str]:
                    source: dict[str, str] | None = None
                    getter = getattr(self.src, "get_with_metadata", None)
                    if getter is not None and META_MTIME not in info.metadata:  # S3 lists no metadata
                        data, source = await getter(info.key)
                    else:
                        data = await self.src.get(info.key)
                    if len(data) != info.size:  # rewritten since it was listed: tries again would read the same
                        raise SourceChanged(
                            f"changed since it was listed ({info.size} bytes listed, {len(data)} read); nothing"
                            " was published: run the sync again",
                            uri=object_uri(self.src.uri, info.key),
                        )
                    await self._throttle(len(data))
                    crc = crc32c(data)
                    self._sending(info.key, len(data))
                    try:
                        put = await self.dst.put(info.key, data, self.metadata(info, crc, source))
                    finally:
                        self._sending(info.key, -len(data))
                    note = self._check_store(put.checksums, data)
                    self.stats.add(len(data))
                    return crc, note

                crc, note = await self._retry(once)
        finally:
            await self.budget.release(info.size)
        return CopyResult(info.key, info.size, crc, 1, 0.0, note)

    def _sending(self, key: str, nbytes: int) -> None:
        """``nbytes`` more (or, negative, fewer) of ``key`` are on their way to the destination
        (journal ``i/KEY``): whatever is left there after a crash is sent again by the resume."""
        if self.journal is None:
            return
        total = self._inflight.get(key, 0) + nbytes
        if total > 0:
            self._inflight[key] = total
            self.journal.put("i", key, total)
        else:
            self._inflight.pop(key, None)
            self.journal.delete("i", key)

    def _check_store(self, checksums: dict[str, str], data: bytes | None, crc64: int | None = None) -> str:
        """Compare the destination's CRC64 of the bytes with ours; '' when it reports none."""
        theirs = checksums.get("crc64ecma")
        if not theirs:
            return ""
        ours = crc64 if crc64 is not None else crc64ecma(data or b"")
        if int(theirs) != ours:
            raise ChecksumMismatch(f"destination crc64ecma {theirs} != {ours} computed in-stream")
        return "crc64ecma ok"

    async def _copy_multipart(self, info: ObjectInfo) -> CopyResult:
        limits = self.dst.limits
        part_size = choose_part_size(
            info.size, limits.min_part_size, limits.max_part_size, limits.max_parts, self.part_size
        )
        count = -(-info.size // part_size)
        done: dict[int, dict[str, Any]] = {}
        upload_id = ""
        record: dict[str, Any] | None = self.journal.get("u", info.key) if self.journal is not None else None
        if (
            record
            and limits.resumable_uploads
            and record["size"] == info.size
            and record["mtime"] == info.mtime
            and record["part_size"] == part_size
            and record.get("etag", "") == info.etag
        ):
            upload_id = record["upload_id"]
            done = {int(n): p for n, p in record["parts"].items()}
            if done and not info.etag and not await self._parts_still_match(info, done, part_size):
                logger.warning("%s: rewritten since its upload began (same size and mtime): starting over", info.key)
                await self.abort(info.key, upload_id)
                upload_id, done = "", {}
        elif record:
            await self.abort(info.key, record["upload_id"])
        resumed = len(done)
        if not upload_id:
            meta = self.metadata(info, None, await self._source_metadata(info))
            upload_id = await self._retry(lambda: self.dst.create_multipart(info.key, info.size, part_size, meta))
            record = {"upload_id": upload_id, "size": info.size, "mtime": info.mtime, "part_size": part_size,
                      "etag": info.etag}  # fmt: skip
            self._save_upload(info.key, record, done)
        assert record is not None  # resumed, or created just above
        lock = asyncio.Lock()

        async def part(number: int) -> None:
            offset = (number - 1) * part_size
            length = min(part_size, info.size - offset)
            await self.budget.acquire(length)
            try:
                async with self.slots:

                    async def once() -> dict[str, Any]:
                        data = await self.src.get(info.key, offset, length)
                        if len(data) != length:
                            raise ChecksumMismatch(f"source returned {len(data)} bytes for a {length}-byte part")
                        await self._throttle(length)
                        crc = crc32c(data)
                        c64 = crc64ecma(data) if self.crc64 else None
                        self._sending(info.key, length)
                        try:
                            sent = await self.dst.upload_part(info.key, upload_id, number, data)
                        finally:
                            self._sending(info.key, -length)
                        self._check_store(sent.checksums, None, c64)
                        self.stats.add(length)
                        return {"size": length, "etag": sent.etag, "crc32c": crc, "crc64": c64}

                    rec = await self._retry(once)
            finally:
                await self.budget.release(length)
            async with lock:
                done[number] = rec
                self._save_upload(info.key, record, done)

        try:
            await _gather_all(part(n) for n in range(1, count + 1) if n not in done)
            # parts may come from an earlier run, or the file may have been rewritten meanwhile:
            # publish only if the source is still the object that was listed
            now = await self._retry(lambda: self.src.head(info.key))
            if _changed(info, now):
                await self.abort(info.key, upload_id)
                if self.journal is not None:
                    self.journal.delete("u", info.key)
                raise SourceChanged(
                    f"changed while it was copied (size {info.size} -> {now.size}, mtime {info.mtime} -> "
                    f"{now.mtime}); nothing was published: run the sync again",
                    uri=object_uri(self.src.uri, info.key),
                )
            parts = [PartInfo(n, done[n]["size"], done[n]["etag"]) for n in range(1, count + 1)]
            try:
                final = await self._retry(lambda: self.dst.complete_multipart(info.key, upload_id, parts))
            except NoSuchUpload:
                # the store dropped the upload (expired, or finished by a run that died before its record)
                if self.journal is not None:
                    self.journal.delete("u", info.key)
                raise
        except BaseException:
            if not limits.resumable_uploads:
                await self.abort(info.key, upload_id)
                if self.journal is not None:
                    self.journal.delete("u", info.key)
            raise
        crc = 0
        c64 = 0
        for n in range(1, count + 1):
            crc = combine32(crc, done[n]["crc32c"], done[n]["size"])
            if self.crc64:
                c64 = crc64ecma_combine(c64, done[n]["crc64"], done[n]["size"])
        note = self._check_store(final.checksums, None, c64 if self.crc64 else None)
        if note:
            note = f"crc64ecma ok ({count} parts combined)"
        if self.journal is not None:
            self.journal.delete("u", info.key)
        return CopyResult(info.key, info.size, crc, count, 0.0, note, resumed)

    async def _parts_still_match(self, info: ObjectInfo, done: dict[int, dict[str, Any]], part_size: int) -> bool:
        """Whether the source still holds the bytes of the parts an earlier run uploaded: their
        CRC32Cs, recorded as they were sent, against the source read again. A source without
        ETags (a file system) can be rewritten with the same size and mtime, and a resumed upload
        must not publish old parts with new ones."""
        for number in sorted(done):
            offset = (number - 1) * part_size
            length = done[number]["size"]
            data = await self._retry(functools.partial(self.src.get, info.key, offset, length))
            if len(data) != length or crc32c(data) != done[number]["crc32c"]:
                return False
        return True

    def _save_upload(self, key: str, record: dict[str, Any], done: dict[int, dict[str, Any]]) -> None:
        """Journal an upload (``u/KEY``): its parts, to resume it, or, where uploads do not outlive
        their process (PCache's temporary file), its id alone, for the resume or ``babel clean``
        to abort what a killed run left (a 0-byte ``.NAME.babel-TOKEN`` stayed in the directory)."""
        if self.journal is None:
            return
        if self.dst.limits.resumable_uploads:
            self.journal.put("u", key, {**record, "parts": {str(n): p for n, p in done.items()}})
        elif not done:
            self.journal.put("u", key, {**record, "parts": {}})

    async def abort(self, key: str, upload_id: str) -> None:
        """Abort a multipart upload (best effort: one that stays is expired by the store's lifecycle rules)."""
        try:
            await asyncio.shield(self.dst.abort_multipart(key, upload_id))
        except Exception as exc:  # the upload stays; the store's lifecycle rules expire it
            logger.warning("could not abort upload %s of %s: %s", upload_id, key, exc)


def _changed(listed: ObjectInfo, now: ObjectInfo) -> bool:
    """Whether the source object is no longer the one listed: size, then ETag where both have one
    (S3), else mtime (file systems, ns-exact; an HTTP Last-Modified is whole seconds, a listing's ms)."""
    if listed.size != now.size:
        return True
    if listed.etag and now.etag:
        return listed.etag != now.etag
    return abs(listed.mtime - now.mtime) > 1.0 if listed.etag or now.etag else abs(listed.mtime - now.mtime) > 1e-6


async def _gather_all(coros) -> None:
    """Run all, wait for all; raise the first error after the rest have stopped."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
