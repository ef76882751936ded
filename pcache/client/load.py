"""Warm-up of bound paths: ``pcache load`` and ``pcache free`` (Fluid's DataLoad, ``juicefs warmup``).

A load runs in two overlapping phases:

* **metadata**: the tree under the path is walked through the master, ``concurrency``
  directories at a time; the master lists each bound directory's level of the under-store
  once (paged, with the ``/`` delimiter: lazy metadata) and keeps what it saw, so a load
  with ``metadata_only`` leaves every stat and listing answered from the cache;
* **data**: every file found is looked up (its layout makes its block records; the layouts
  of concurrent lookups travel in one ``Batch`` call), and each block not in the cache is sent
  to the worker the master names for it. The master spreads a file's blocks over every live
  worker (block id modulo the workers), so a load fetches on all of them at once; each worker
  fetches its byte range with one ranged GET, stores it as an ordinary block (CRC32C,
  replicated as configured) and shares the fetch with readers asking meanwhile. At most
  ``concurrency`` fetches run at once on each worker. Blocks of up to
  :data:`BATCHED_BLOCK_BYTES` (small files, where a request costs more than its bytes) go to
  their worker many at a time (``FETCH_BLOCKS``, up to 64 per request), which asks the master
  where they come from and reports them stored in one call each, as Alluxio's workers take a
  distributed load's blocks in batches; a larger block goes in a request of its own. A worker
  that does not answer (killed, or no answer to a PING for 1.5 ``client.stall_timeout``) gets nothing more
  from the load: the master is asked for the layouts again, naming other fetchers for its
  blocks (``exclude_fetchers``), once per file.

The listing goes through the master rather than straight to the store: the store is read
with the hosts' credentials, which a user running ``pcache load`` may not hold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from pcache.common.coalesce import Coalescer
from pcache.common.errors import PCacheError, StaleHandle, Timeout, Unavailable, from_name
from pcache.common.framing import MAX_FETCHES
from pcache.common.layout import HOLE
from pcache.common.paths import normalize
from pcache.proto import pcache_pb2 as pb

if TYPE_CHECKING:
    from pcache.client.core import PCacheClient

BATCHED_BLOCK_BYTES = 4 << 20  # blocks up to this size are fetched many per request
LOOKUP_GROUP = 64  # files a loader takes off the queue at once (their layouts asked together)


@dataclass
class LoadReport:
    """What a load (or a ``check``) found and did. Sizes in bytes, time in seconds."""

    files: int = 0  # regular files found
    dirs: int = 0  # directories listed
    bytes: int = 0  # bytes of the files found
    blocks: int = 0  # their blocks (holes not counted)
    cached_blocks: int = 0  # blocks already in the cache when looked at
    cached_bytes: int = 0
    fetched_blocks: int = 0  # blocks this load had the workers fetch
    fetched_bytes: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, error), first ``MAX_ERRORS``
    failed: int = 0  # files or directories that failed in all
    seconds: float = 0.0

    MAX_ERRORS = 50

    @property
    def missing_blocks(self) -> int:
        """Blocks neither cached before nor fetched now (a ``check``, or failures)."""
        return self.blocks - self.cached_blocks - self.fetched_blocks

    def fail(self, path: str, exc: BaseException) -> None:
        self.failed += 1
        if len(self.errors) < self.MAX_ERRORS:
            self.errors.append((path, str(exc)))


Progress = Callable[[LoadReport], None]


async def load(
    client: PCacheClient,
    path: str,
    *,
    metadata_only: bool = False,
    check: bool = False,
    concurrency: int = 32,
    on_progress: Progress | None = None,
) -> LoadReport:
    """Bring the files under ``path`` (a directory or one file) into the cache.

    Args:
        metadata_only: only walk the tree (the master lists each bound level and keeps it).
        check: fetch nothing; count what is cached (``cached_blocks`` of ``blocks``).
        concurrency: directories listed at once, and blocks each worker fetches at once (at most).
        on_progress: called with the report as it grows (from the event loop: keep it short).

    Returns the report; a file or directory that fails is counted in ``failed`` (with the first
    errors in ``errors``) and the load goes on.

    Raises:
        NotFound: no such path. PermissionDenied, Unavailable: the master's answer for the path itself.
    """
    started = time.monotonic()
    report = LoadReport()
    path = normalize(path)
    top = await client.stat(path)
    fetchers = _Fetchers(client, concurrency)
    dirs: asyncio.Queue[str] = asyncio.Queue()
    files: asyncio.Queue[str] = asyncio.Queue()
    tick = _Ticker(report, on_progress)

    async def walk_dirs() -> None:
        while True:
            where = await dirs.get()
            try:
                async for entry in client.scandir(where):
                    if entry.is_dir:
                        dirs.put_nowait(entry.path)
                    elif entry.is_file:
                        report.files += 1
                        report.bytes += entry.size
                        if not metadata_only:
                            files.put_nowait(entry.path)
                report.dirs += 1
            except Exception as exc:  # counted, never fatal: a dead walker would leave join() waiting
                report.fail(where, exc)
            finally:
                dirs.task_done()
                tick()

    async def load_one(name: str) -> None:
        try:
            await _load_file(client, name, report, check, fetchers, tick)
        except Exception as exc:  # as above
            report.fail(name, exc)
        finally:
            files.task_done()
            tick()

    async def load_files() -> None:
        while True:
            # the files found by then, looked up together (their layouts share Batch calls)
            names = [await files.get()]
            while len(names) < LOOKUP_GROUP and not files.empty():
                names.append(files.get_nowait())
            await asyncio.gather(*(load_one(name) for name in names))

    if top.is_dir:
        dirs.put_nowait(path)
    else:
        report.files, report.bytes = 1, top.size
        if not metadata_only:
            files.put_nowait(path)
    tasks = [asyncio.ensure_future(walk_dirs()) for _ in range(concurrency)]
    tasks += [asyncio.ensure_future(load_files()) for _ in range(concurrency)]
    try:
        await dirs.join()  # every directory listed: no more files come
        await files.join()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    report.seconds = time.monotonic() - started
    tick(force=True)
    return report


async def _load_file(
    client: PCacheClient,
    path: str,
    report: LoadReport,
    check: bool,
    fetchers: _Fetchers,
    tick: Callable[[], None],
) -> None:
    """Fetch the uncached blocks of one file; the blocks whose worker was found down are asked
    of other workers, once (the master names another fetcher for them).

    Raises:
        PCacheError: the first block that could not be fetched (the file counts as failed).
    """
    layout = await client.layout(path, exclude_fetchers=list(fetchers.down))
    blocks = [b for b in layout.blocks if b.block_id != HOLE]
    report.blocks += len(blocks)

    async def one(loc: pb.BlockLocation) -> None:
        if not loc.uncached:
            report.cached_blocks += 1
            report.cached_bytes += loc.length
            return
        if check:
            return
        if await fetchers.fetch(loc):
            report.fetched_blocks += 1
            report.fetched_bytes += loc.length
        else:  # fetched meanwhile (by a reader, or another load)
            report.cached_blocks += 1
            report.cached_bytes += loc.length
        tick()

    results = await asyncio.gather(*(one(b) for b in blocks), return_exceptions=True)
    retry = {b.block_id for b, r in zip(blocks, results, strict=True) if isinstance(r, WorkerDown)}
    if retry:  # the master names other workers for these (those it knows dead, and those we found down)
        try:
            again = await client.layout(path, exclude_fetchers=list(fetchers.down))
        except PCacheError as error:
            again, results = None, [error]
        if again is not None:
            moved = {b.block_id: b for b in again.blocks if b.block_id in retry}
            results = [r for r in results if not isinstance(r, WorkerDown)]
            if len(moved) < len(retry):  # the file changed meanwhile
                results.append(StaleHandle(f"{path}: changed while being loaded"))
            results += await asyncio.gather(*(one(b) for b in moved.values()), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    for exc in failures:
        if not isinstance(exc, PCacheError):
            raise exc
    if failures:
        raise failures[0]


async def free(client: PCacheClient, path: str) -> pb.FreeReport:
    """Evict the cached blocks of every bound file under ``path`` (the files stay, and are
    fetched again when read); files not bound, or not yet persisted, keep their blocks.

    Raises:
        NotFound: no such path. PermissionDenied: outside the caller's tenant.
    """
    return await client.master.free(normalize(path))


class WorkerDown(Unavailable):
    """A worker that did not answer a fetch (gone, or hung: it answers no PING meanwhile): the
    load sends it nothing more, and asks the master for other fetchers of its blocks."""


class _Fetchers:
    """The fetches of a load, by worker: at most ``concurrency`` blocks at once on each worker
    (so a load's speed grows with the cluster, as each worker has its own disks and network);
    blocks of up to :data:`BATCHED_BLOCK_BYTES` travel many per ``FETCH_BLOCKS`` request, two
    requests in flight per worker (the blocks asked meanwhile leave together in the next one), a
    larger block in a request of its own. A worker that does not answer is marked down (every
    block waiting for it fails at once with :class:`WorkerDown`, never waiting out its own
    timeout behind a stalled worker)."""

    def __init__(self, client: PCacheClient, concurrency: int) -> None:
        self.client = client
        self.concurrency = concurrency
        self.workers: dict[tuple[str, str, int], tuple[asyncio.Semaphore, Coalescer[pb.FetchItem, pb.FetchItem]]] = {}
        self.down: dict[str, PCacheError] = {}  # worker id -> why it is taken for down

    async def fetch(self, loc: pb.BlockLocation) -> int:
        """Have ``loc``'s worker fetch its block: the bytes stored for this load (0: it was
        cached meanwhile, by a reader or another load).

        Raises:
            WorkerDown: its worker did not answer (this fetch or an earlier one).
            PCacheError: the block's own error.
        """
        addr = loc.replicas[0]
        key = (addr.worker_id, addr.host, addr.port)
        if key not in self.workers:
            batcher: Coalescer[pb.FetchItem, pb.FetchItem] = Coalescer(
                partial(self._send, addr), min(MAX_FETCHES, self.concurrency), max_in_flight=2
            )
            self.workers[key] = (asyncio.Semaphore(self.concurrency), batcher)
        slots, batcher = self.workers[key]
        self._check(addr)
        async with slots:
            item = pb.FetchItem(block_id=loc.block_id, token=loc.token)
            if loc.length <= BATCHED_BLOCK_BYTES:
                done = await batcher.call(item)
            else:  # a large block alone: a request's answer waits for all of its blocks
                (answer,) = await self._send(addr, [item])
                if isinstance(answer, PCacheError):
                    raise answer
                done = answer
            return done.length

    def _check(self, addr: pb.WorkerAddr) -> None:
        why = self.down.get(addr.worker_id)
        if why is not None:
            raise WorkerDown(f"worker {addr.worker_id} ({addr.host}:{addr.port}) did not answer: {why}")

    async def _send(self, addr: pb.WorkerAddr, items: list[pb.FetchItem]) -> list[pb.FetchItem | PCacheError]:
        self._check(addr)
        try:
            answers = await self.client.data.fetch_blocks(addr, items)
        except (Unavailable, Timeout) as exc:
            self.down.setdefault(addr.worker_id, exc)
            raise WorkerDown(f"worker {addr.worker_id} ({addr.host}:{addr.port}) did not answer: {exc}") from exc
        return [from_name(a.error, a.message) if a.error else a for a in answers]


class _Ticker:
    """Calls ``on_progress`` at most ten times a second (and once at the end)."""

    def __init__(self, report: LoadReport, on_progress: Progress | None) -> None:
        self.report = report
        self.on_progress = on_progress
        self.last = 0.0

    def __call__(self, force: bool = False) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        if force or now - self.last >= 0.1:
            self.last = now
            self.on_progress(self.report)


__all__ = ["LoadReport", "WorkerDown", "free", "load"]
