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
import bisect
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from babel.errors import Throttled
from babel.retry import with_retries
from objstore.base import ObjectInfo, ObjectStore

logger = logging.getLogger(__name__)

EMBED_DIGITS = 16  # characters of a key that its numeric position is computed from


class _Embedding:
    """Keys as integers in a mixed radix learned from a page: position ``j`` (after ``start``) has
    the characters seen there (all ten digits once one is seen; a run of letters from the lowest
    to the highest seen) plus 0 for "key ended". Key order is number order for keys made of those
    characters, so distances between keys can be measured and extrapolated."""

    def __init__(self, keys: list[str], start: int) -> None:
        self.start = start
        self.chars: list[str] = []
        columns = [{k[j] for k in keys if j < len(k)} for j in range(start, start + EMBED_DIGITS)]
        # letters that share a position with digits (hex names): every digit position may hold them
        mixed = {c for col in columns if any(ch.isdigit() for ch in col) for c in col if c.isalpha() and c.isascii()}
        for seen in columns:
            if mixed and any(ch.isdigit() or ch in mixed for ch in seen):
                seen |= mixed | set("0123456789")
            for lo, hi in (("0", "9"), ("a", "z"), ("A", "Z")):
                inside = [c for c in seen if lo <= c <= hi]
                if inside:
                    a, b = (lo, hi) if lo == "0" else (min(inside), max(inside))
                    seen.update(chr(c) for c in range(ord(a), ord(b) + 1))
            self.chars.append("".join(sorted(seen)))
        self.top = 1
        for chars in self.chars:
            self.top *= len(chars) + 1

    def __call__(self, key: str) -> int:
        v = 0
        for i, chars in enumerate(self.chars):
            j = self.start + i
            d = 0
            if j < len(key):
                d = min(bisect.bisect_left(chars, key[j]) + 1, len(chars))  # unseen characters round up
            v = v * (len(chars) + 1) + d
        return v

    def key(self, head: str, v: int) -> str:
        digits = []
        for chars in reversed(self.chars):
            v, d = divmod(v, len(chars) + 1)
            digits.append(d)
        digits.reverse()
        while digits and digits[-1] == 0:  # "key ended"
            digits.pop()
        return head + "".join(self.chars[i][max(d, 1) - 1] for i, d in enumerate(digits) if self.chars[i])


def split_points(
    first: str,
    low: str,
    high: str | None,
    pieces: int,
    keys: list[str],
    *,
    page_keys: int,
    page_size: int,
    prefix: str = "",
) -> list[str]:
    """Up to ``pieces - 1`` increasing keys strictly between ``low`` and ``high`` (None: unbounded)
    at which to cut the rest of a listing, from the density of the page just listed.

    The page held ``page_keys`` keys from ``first`` to ``low`` (``keys``: a sample of them);
    keys are mapped to numbers (:class:`_Embedding`) and that density is extrapolated. A bounded rest is cut evenly, into
    pieces of at least one page; an unbounded one at 1, 3, 7, 15, ... pages' worth above ``low``
    (the near pieces are likely full, the far ones cheap to find empty, and any that turn out
    large are cut again when listed). Keys of datasets share long prefixes and use few characters,
    so cutting the code-point range in half, the obvious alternative, leaves every key on one side.
    """
    if pieces <= 1 or page_keys <= 0:
        return []
    start = len(prefix)  # an unbounded rest may hold any key under the prefix
    if high is not None:
        while start < len(low) and start < len(high) and low[start] == high[start]:
            start += 1
    emb = _Embedding([*keys, low] if high is None else [*keys, low, high], start)
    head = low[:start]
    e_low = emb(low)
    e_high = emb(high) if high is not None else emb.top
    per_page = max(1, (e_low - emb(first)) * page_size // page_keys)
    if high is not None or (e_high - e_low) // per_page <= 64 * pieces:
        # a known end (or a dense key space, e.g. hashes): even cuts of at least a page
        step = max(per_page, (e_high - e_low) // pieces)
        offsets = [step * k for k in range(1, pieces)]
    else:
        offsets = [per_page * ((1 << k) - 1) for k in range(1, pieces)]
    points: list[str] = []
    for off in offsets:
        if e_low + off >= e_high:
            break
        q = emb.key(head, e_low + off)
        if q > low and (high is None or q < high) and (not points or q > points[-1]):
            points.append(q)
    return points


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
    after: str = "",
    until: str | None = None,
    flat: bool | None = None,
) -> AsyncGenerator[list[ObjectInfo], None]:
    """Yield every object under ``prefix`` in pages (lists, in no order across pages), listing
    many key ranges at once.

    Args:
        store: the backend. prefix: key prefix (a directory when it ends in ``/``).
        after, until: only keys ``after < key <= until`` (None: no upper bound); a bounded
            listing (a shard of a job shared by several daemons) is listed flat from ``after``.
        flat: list without the ``/`` delimiter fan-out even from the root (default: only a bounded
            listing): every page is then a run of consecutive keys, and no two pages overlap.
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
        delimiter = None if rng.flat else "/"

        async def once():
            async with window:
                return await store.list_page(rng.prefix, delimiter=delimiter, start_after=rng.after, max_keys=page_size)

        return await with_retries(once, attempts=retries, initial=0.05, cap=5.0)

    def split(rng: KeyRange, objects: list[ObjectInfo], last: str) -> KeyRange:
        """Cut (last, until] into pieces; queue all but the first, which the caller goes on with."""
        idle = concurrency - pending
        sample = [o.key for o in objects[:: max(1, len(objects) // 128)]] + [last]
        points = split_points(
            objects[0].key if objects else last,
            last,
            rng.until,
            max(1, min(fanout, idle + 1)),
            sample,
            page_keys=len(objects),
            page_size=page_size,
            prefix=rng.prefix,
        )
        ends: list[str | None] = [*points[1:], rng.until] if points else []  # each piece (points[i], ends[i]]
        for lo, hi in zip(points, ends, strict=True):
            push(KeyRange(rng.prefix, lo, hi, rng.flat))
        return KeyRange(rng.prefix, last, points[0] if points else rng.until, rng.flat)

    async def work(rng: KeyRange) -> None:
        while True:
            result = await page(rng)
            objects = result.objects
            if rng.until is not None and objects and objects[-1].key > rng.until:
                objects = objects[: bisect.bisect_right(objects, rng.until, key=lambda o: o.key)]
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
            rng = split(rng, objects, last)

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

    push(KeyRange(prefix, after, until, flat=bool(after) or until is not None if flat is None else flat))
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
