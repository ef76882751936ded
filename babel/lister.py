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
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from babel.errors import Throttled
from babel.retry import with_retries
from objstore.base import ListPage, ObjectInfo, ObjectStore

logger = logging.getLogger(__name__)

EMBED_DIGITS = 16  # characters of a key that its numeric position is computed from
PAST = "\U0010ffff"  # appended to a common prefix: a StartAfter past every key under it


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
    far_pieces: int | None = None,
) -> list[str]:
    """Up to ``pieces - 1`` increasing keys strictly between ``low`` and ``high`` (None: unbounded)
    at which to cut the rest of a listing, from the density of the page just listed.

    The page held ``page_keys`` keys from ``first`` to ``low`` (``keys``: a sample of them);
    keys are mapped to numbers (:class:`_Embedding`) and that density is extrapolated. A bounded
    rest (or a dense unbounded one, e.g. hashes) is cut evenly, into pieces of ~0.7 page (most are
    then listed in one request); an unbounded one into ``far_pieces`` (default ``pieces``) at 1, 3,
    7, 15, ... pages' worth above ``low`` (the near pieces are likely full, the far ones cheap to
    find empty, and any that turn out large are cut again when listed). Keys of datasets share
    long prefixes and use few characters, so cutting the code-point range in half, the obvious
    alternative, leaves every key on one side.
    """
    if pieces <= 1 or page_keys <= 0:
        return []
    start = len(prefix)  # an unbounded rest may hold any key under the prefix
    if high is not None:
        # the page's first key must be inside the embedding too: its distance to low is the density
        while start < min(len(low), len(high), len(first)) and low[start] == high[start] == first[start]:
            start += 1
    emb = _Embedding([*keys, low] if high is None else [*keys, low, high], start)
    head = low[:start]
    e_low = emb(low)
    e_high = emb(high) if high is not None else emb.top
    per_page = max(1, (e_low - emb(first)) * page_size // page_keys)
    far = pieces if far_pieces is None else far_pieces
    if high is not None or (e_high - e_low) // per_page <= 64 * pieces:
        # a known end (or a dense key space, e.g. hashes): even cuts of ~0.7 page
        step = max(1, per_page * 7 // 10, (e_high - e_low) // pieces)
        offsets = [step * k for k in range(1, pieces)]
    else:
        offsets = [per_page * ((1 << k) - 1) for k in range(1, far)]
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
    """Keys ``k`` under ``prefix`` with ``after < k <= until`` (None: no bound), listed flat
    (without a delimiter: full pages of consecutive keys from any depth).

    A ``probe`` range also lists the prefix's next level (``/`` delimiter, from ``after``) with its
    first page: the common prefixes found tell how the rest is laid out (see :func:`_explore`).
    """

    prefix: str
    after: str = ""
    until: str | None = None
    probe: bool = False


def _child(prefix: str, key: str) -> str | None:
    """The common prefix (next level under ``prefix``) that ``key`` lies in; None for a direct object."""
    cut = key.find("/", len(prefix))
    return key[: cut + 1] if cut >= 0 else None


def _explore(rng: KeyRange, last: str, level: ListPage) -> tuple[list[KeyRange], list[list[ObjectInfo]]]:
    """Lay out the rest ``(last, until]`` of a probe range from its prefix's next level.

    The flat page ended at ``last``; ``level`` is the prefix's listing with the ``/`` delimiter from
    the same ``after``. Returns the ranges that cover the rest exactly once and the level's direct
    objects to hand out as they are (runs of consecutive keys: no range holds a key between two
    objects of a run):

    * children smaller than half a page (the flat page covered two or more whole ones) are grouped,
      ~0.7 page's worth per range, cut at child prefixes (bounded ranges, even further cuts);
    * larger children are each probed in turn (their own level tells their layout), the one the
      page ended in from ``last`` on; the level's direct objects between them are handed out;
    * a truncated level listing ends the layout at its last entry; a probe of the prefix from there
      covers the rest.

    Returns ``([], [])`` when the level has no children after ``last`` (a flat directory): the
    caller cuts the rest by key density instead.
    """
    entries: list[tuple[str, ObjectInfo | None]] = sorted(
        [(o.key, o) for o in level.objects] + [(c, None) for c in level.prefixes], key=lambda e: e[0]
    )
    until = rng.until
    ranges: list[KeyRange] = []
    cut = ""  # a common prefix that ends a truncated level: the new probe lists its keys
    if level.truncated and entries and entries[-1][0] > last and (until is None or entries[-1][0] < until):
        # the level was cut: the layout ends at its last entry, a new probe goes on from there
        end = entries[-1][0]
        bound: str | None = end
        ranges.append(KeyRange(rng.prefix, end, until, probe=True))
        if entries[-1][1] is None:
            cut = entries.pop()[0]
    else:
        bound = until
    entries = [(k, o) for k, o in entries if k > last and (bound is None or k <= bound)]
    children = [k for k, o in entries if o is None]
    if not children:
        if ranges:  # objects only up to the level's end: the page's rest is a plain range to there
            ranges.insert(0, KeyRange(rng.prefix, last, bound))
            return ranges, []
        return [], []
    covered = sum(1 for c in level.prefixes if c < last and not last.startswith(c) and not rng.after.startswith(c))
    if covered >= 2:  # small children: ~0.7 page's worth per range
        group = max(1, covered * 7 // 10)
        points = children[::group]
        ends: list[str | None] = [*points[1:], bound]
        ranges[:0] = [KeyRange(rng.prefix, last, points[0])] + [
            KeyRange(rng.prefix, lo, hi) for lo, hi in zip(points, ends, strict=True)
        ]
        return ranges, []
    star = _child(rng.prefix, last)
    head: list[KeyRange] = []
    if cut:  # probed on its own (its marker key, equal to the prefix, included); the new probe after it
        children.append(cut)
        ranges[0] = KeyRange(rng.prefix, cut + PAST, until, probe=True)
    if star is not None:  # the rest of the child the page ended in
        head.append(KeyRange(star, last, until, probe=True))
    head += [KeyRange(c, "", until, probe=True) for c in children]
    ranges[:0] = head
    runs: list[list[ObjectInfo]] = [[]]
    for _, o in entries:
        if o is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(o)
    return ranges, [run for run in runs if run]


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
    concurrency: int = 64,
    page_size: int = 1000,
    retries: int = 8,
    fanout: int = 16,
    after: str = "",
    until: str | None = None,
) -> AsyncGenerator[list[ObjectInfo], None]:
    """Yield every object under ``prefix`` in pages, listing many key ranges at once.

    Every page is a run of consecutive keys (no key of the listing lies between two keys of a
    page), and no two pages overlap; pages come in no order.

    Args:
        store: the backend. prefix: key prefix (a directory when it ends in ``/``).
        after, until: only keys ``after < key <= until`` (None: no upper bound), e.g. a shard of a
            job shared by several daemons.
        concurrency: most ListObjectsV2 calls in flight. page_size: keys per call.
        retries: attempts per page on throttling or transient errors (exponential backoff).
        fanout: most pieces a range of unknown extent is cut into at once (while workers are idle);
            a range whose extent is known is cut into pieces of ~0.7 page, up to ``concurrency``.

    Raises:
        BabelError: a page failed ``retries`` times, or a non-retryable error (missing bucket,
            denied access).
    """
    # probes first: what they find (a directory's layout) is the most work still to come
    queue: asyncio.PriorityQueue[tuple[int, int, KeyRange | None]] = asyncio.PriorityQueue()
    out: asyncio.Queue[list[ObjectInfo] | BaseException | None] = asyncio.Queue(maxsize=64)
    window = _Window(concurrency)
    pending = 0  # ranges queued or being listed
    order = itertools.count()  # first in, first out within a priority

    def push(rng: KeyRange) -> None:
        nonlocal pending
        pending += 1
        queue.put_nowait((0 if rng.probe else 1, next(order), rng))

    async def page(rng: KeyRange, delimiter: str | None) -> ListPage:
        async def once():
            async with window:
                return await store.list_page(rng.prefix, delimiter=delimiter, start_after=rng.after, max_keys=page_size)

        return await with_retries(once, attempts=retries, initial=0.05, cap=5.0)

    def split(rng: KeyRange, objects: list[ObjectInfo], last: str) -> KeyRange:
        """Cut (last, until] by key density; queue all but the first piece, which the caller goes on with."""
        sample = [o.key for o in objects[:: max(1, len(objects) // 128)]] + [last]
        points = split_points(
            objects[0].key,
            last,
            rng.until,
            max(fanout, concurrency),
            sample,
            page_keys=len(objects),
            page_size=page_size,
            prefix=rng.prefix,
            far_pieces=max(1, min(fanout, concurrency - pending + 1)),
        )
        ends: list[str | None] = [*points[1:], rng.until] if points else []  # each piece (points[i], ends[i]]
        for lo, hi in zip(points, ends, strict=True):
            push(KeyRange(rng.prefix, lo, hi))
        return KeyRange(rng.prefix, last, points[0] if points else rng.until)

    async def work(rng: KeyRange | None) -> None:
        while rng is not None:
            if rng.probe:  # the first page and the prefix's next level, at once
                result, level = await asyncio.gather(page(rng, None), page(rng, "/"))
            else:
                result, level = await page(rng, None), None
            objects = result.objects
            if rng.until is not None and objects and objects[-1].key > rng.until:
                objects = objects[: bisect.bisect_right(objects, rng.until, key=lambda o: o.key)]
            runs: list[list[ObjectInfo]] = []
            if len(objects) < len(result.objects) or not result.truncated or not objects:
                rng = None
            elif level is not None and (explored := _explore(rng, objects[-1].key, level))[0]:
                ranges, runs = explored
                for more in ranges[1:]:
                    push(more)
                rng = ranges[0]
            else:
                rng = split(rng, objects, objects[-1].key)
            # the next ranges are queued before the hand-off, which may wait for the consumer
            if objects:
                await out.put(objects)  # whole pages: one queue hand-off per request, not per key
            for run in runs:
                await out.put(run)

    async def worker() -> None:
        nonlocal pending
        while True:
            _, _, rng = await queue.get()
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

    push(KeyRange(prefix, after, until, probe=True))
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
            queue.put_nowait((2, 0, None))
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
