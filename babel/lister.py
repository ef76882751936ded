"""Parallel metadata prefetch: list a bucket with many concurrent ListObjectsV2 calls.

The Ling report (arXiv 2503.05139, §2.3.2) lists 190 M files in ~10 minutes
instead of >6 hours by listing in parallel. Here every unit of work is a key
range of one "directory": ``(prefix, after, before)``, listed with the ``/``
delimiter so that

* **delimiter fan-out**: the top level is listed with the ``/`` delimiter; every common prefix
  found becomes a range of its own, listed flat (no delimiter, so pages are full);
* **StartAfter range splitting**: when a page comes back truncated, the rest of
  the range ``(last key, until]`` is cut at keys in between (up to ``fanout``
  pieces while workers are idle); the pieces go back on the queue for any idle
  worker (work stealing), the worker goes on with the first. Prefixes with
  millions of keys thus spread over all workers after a page or two;
* **bounded concurrency with AIMD**: at most ``concurrency`` requests are in
  flight; a throttling answer (503 SlowDown) halves the allowance and each
  success adds one back, as TCP does.

Every key and common prefix falls in exactly one range, so nothing is listed
twice. Entries stream out as pages arrive (not sorted across ranges); memory
holds only the queue of pending ranges, not the keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from babel.backends.base import ObjectInfo, ObjectStore
from babel.errors import Throttled

logger = logging.getLogger(__name__)

ASCII_TOP = "\x7f"  # keys are mostly printable ASCII: split there, and keep the rest as one range
MAX_CHAR = 0x10FFFF


@dataclass(frozen=True)
class KeyRange:
    """Keys ``k`` under ``prefix`` with ``after < k <= until`` (None: no bound).

    ``flat`` ranges are listed without a delimiter (full pages of keys from any depth);
    the first range lists one level with the ``/`` delimiter to find the common prefixes.
    """

    prefix: str
    after: str = ""
    until: str | None = None
    flat: bool = False


def split_key(low: str, high: str) -> str | None:
    """A key strictly between ``low`` and ``high`` (``low < high``), or None when there is none worth it."""
    i = 0
    while i < len(low) and i < len(high) and low[i] == high[i]:
        i += 1
    lo = ord(low[i]) if i < len(low) else 0
    hi = ord(high[i]) if i < len(high) else 0
    if hi - lo > 1:
        return high[:i] + chr((lo + hi) // 2)
    if i < len(high) and hi - lo == 1:  # adjacent characters: split inside low's tail
        tail_lo = ord(low[i + 1]) if i + 1 < len(low) else 0
        top = min(MAX_CHAR, 0x7E) if tail_lo < 0x7E else MAX_CHAR
        if top - tail_lo > 1:
            return low[: i + 1] + chr((tail_lo + top) // 2)
    return None


def split_points(low: str, high: str, pieces: int) -> list[str]:
    """Up to ``pieces - 1`` increasing keys strictly between ``low`` and ``high`` (recursive halving)."""
    if pieces <= 1:
        return []
    mid = split_key(low, high)
    if mid is None:
        return []
    half = pieces // 2
    return [*split_points(low, mid, half), mid, *split_points(mid, high, pieces - half)]


class _Window:
    """AIMD concurrency window: halve on throttling, +1 per success."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.allowed = float(limit)
        self.inflight = 0
        self.cond = asyncio.Condition()
        self.throttled = 0

    async def __aenter__(self) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: self.inflight < max(1, int(self.allowed)))
            self.inflight += 1

    async def __aexit__(self, exc_type, exc, tb) -> None:
        async with self.cond:
            self.inflight -= 1
            if exc_type is not None and issubclass(exc_type, Throttled):
                self.allowed = max(1.0, self.allowed / 2)
                self.throttled += 1
            elif exc_type is None:
                self.allowed = min(float(self.limit), self.allowed + 1)
            self.cond.notify_all()


async def list_parallel(store: ObjectStore, prefix: str = "", **kwargs) -> AsyncIterator[ObjectInfo]:
    """Yield every object under ``prefix``, listing many key ranges at once (see :func:`list_parallel_pages`)."""
    async for page in list_parallel_pages(store, prefix, **kwargs):
        for obj in page:
            yield obj


async def list_parallel_pages(
    store: ObjectStore,
    prefix: str = "",
    *,
    concurrency: int = 32,
    page_size: int = 1000,
    retries: int = 8,
    fanout: int = 16,
) -> AsyncIterator[list[ObjectInfo]]:
    """Yield every object under ``prefix`` in pages (lists, in no order across pages), listing
    many key ranges at once.

    Args:
        store: the backend. prefix: key prefix (a directory when it ends in ``/``).
        concurrency: most ListObjectsV2 calls in flight. page_size: keys per call.
        retries: attempts per page on throttling or transient errors (exponential backoff).
        fanout: most pieces a truncated range is cut into at once (while workers are idle).

    Raises:
        BabelError: a page failed ``retries`` times, or a non-retryable error (missing bucket,
            denied access).
    """
    queue: asyncio.Queue[KeyRange | None] = asyncio.Queue()
    out: asyncio.Queue[list[ObjectInfo] | BaseException | None] = asyncio.Queue(maxsize=64)
    window = _Window(concurrency)
    pending = 0  # ranges queued or being listed

    def push(rng: KeyRange) -> None:
        nonlocal pending
        pending += 1
        queue.put_nowait(rng)

    async def page(rng: KeyRange):
        delay = 0.05
        delimiter = None if rng.flat else "/"
        for attempt in range(retries):
            try:
                async with window:
                    return await store.list_page(
                        rng.prefix, delimiter=delimiter, start_after=rng.after, max_keys=page_size
                    )
            except Exception as exc:
                if not getattr(exc, "retryable", False) or attempt == retries - 1:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def split(rng: KeyRange, last: str) -> KeyRange:
        """Cut (last, until] into pieces; queue all but the first, which the caller goes on with."""
        high = rng.until if rng.until is not None else rng.prefix + ASCII_TOP
        if rng.until is None and last >= high:
            high = rng.prefix + chr(MAX_CHAR)
        points = split_points(last, high, max(1, min(fanout, concurrency - pending + 1)))
        bounds = [last, *points, rng.until]
        for lo, hi in zip(bounds[1:-1], bounds[2:], strict=True):
            push(KeyRange(rng.prefix, lo, hi, rng.flat))
        return KeyRange(rng.prefix, last, bounds[1], rng.flat)

    async def work(rng: KeyRange) -> None:
        while True:
            result = await page(rng)
            objects = result.objects
            if rng.until is not None and objects and objects[-1].key > rng.until:
                objects = [o for o in objects if o.key <= rng.until]
            if objects:
                await out.put(objects)  # whole pages: one queue hand-off per request, not per key
            last = objects[-1].key if objects else ""
            if len(objects) < len(result.objects):
                return
            for common in result.prefixes:
                if rng.until is not None and common > rng.until:
                    return
                # a common prefix is a natural boundary: list everything under it flat
                push(KeyRange(common, flat=True))
                last = max(last, common)
            if not result.truncated or not last:
                return
            rng = split(rng, last)

    async def worker() -> None:
        nonlocal pending
        while True:
            rng = await queue.get()
            if rng is None:
                return
            try:
                await work(rng)
            except BaseException as exc:
                await out.put(exc)
                return
            finally:
                pending -= 1
                if pending == 0:
                    await out.put(None)

    push(KeyRange(prefix))
    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        while True:
            item = await out.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        for _ in tasks:
            queue.put_nowait(None)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if window.throttled:
            logger.info("listing was throttled %d times", window.throttled)


async def list_serial(store: ObjectStore, prefix: str = "", **kwargs) -> AsyncIterator[ObjectInfo]:
    """Yield every object under ``prefix`` with plain sequential ListObjectsV2 paging (the baseline)."""
    async for page in list_serial_pages(store, prefix, **kwargs):
        for obj in page:
            yield obj


async def list_serial_pages(
    store: ObjectStore, prefix: str = "", *, page_size: int = 1000
) -> AsyncIterator[list[ObjectInfo]]:
    """Sequential ListObjectsV2 paging, one page at a time."""
    after = ""
    while True:
        result = await store.list_page(prefix, start_after=after, max_keys=page_size)
        if result.objects:
            yield result.objects
        if not result.truncated or not result.objects:
            return
        after = result.objects[-1].key
