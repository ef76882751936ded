"""An open PCache file: block slots, read-ahead, write-behind, commit on close.

A file is a list of *slots*, one per block. A clean slot names a stored
block (and its replicas); a dirty slot holds new bytes in memory. Writes fill
dirty slots; a slot that becomes full is written in the background
(write-behind, at most ``max_inflight_blocks`` at once), each block to a
freshly allocated pipeline of workers; a changed block is always written as a
new block (copy-on-write), so readers keep seeing the old content until the
writer commits the new block list on ``close``/``fsync`` (close-to-open).

Reads go through fixed *read units* (``read_unit`` bytes), cached per handle,
with ``readahead_units`` prefetched once the reader is sequential. A unit is
read from a local replica through the short circuit when possible, else over
TCP, falling back to the other replicas and finally to fresh locations from
the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from pcache.client.budget import ReadBudget, WriteBudget
from pcache.client.data import BlockStream, WrongBlock
from pcache.common.checksum import chunk_crcs
from pcache.common.errors import (
    CorruptBlock,
    InvalidArgument,
    NotFound,
    PCacheError,
    PermissionDenied,
    StaleHandle,
    Timeout,
    Unavailable,
)
from pcache.common.layout import HOLE, check_file_size
from pcache.proto import pcache_pb2 as pb

if TYPE_CHECKING:
    from pcache.client.data import DataClient
    from pcache.common.config import ClientConfig

logger = logging.getLogger(__name__)
Buffer = bytes | bytearray  # block bytes as read: a TCP read lands in a bytearray (no copy to bytes)

# PermissionDenied: a block token expired (or the replica moved): the next replica, then fresh locations
READ_FAILOVER_ERRORS = (Unavailable, Timeout, CorruptBlock, NotFound, PermissionDenied)
STREAM_AFTER = 4 << 20  # bytes a new block holds in memory before the rest streams to the local worker


@dataclass
class Slot:
    """One block position of an open file."""

    block_id: int = 0
    length: int = 0
    crc: int = 0
    replicas: list[str] = field(default_factory=list)
    locations: list[pb.WorkerAddr] = field(default_factory=list)
    token: str = ""  # block token for the block at its locations (from the master)
    uncached: bool = False  # a bound file's block the worker fetches from the under-store first
    data: bytearray | None = None
    pending: asyncio.Task | None = None
    fresh: bool = False  # the buffered data is a new block's, written from its start (no old content)
    stream: BlockStream | None = None  # being written straight into its file on this host's worker
    # set once its buffered block's flush has its allocation (or ended without one): a stream of
    # a later block allocates after it (a stream allocated first took the quota an earlier,
    # already full block needed)
    allocated: asyncio.Event | None = None


class View(NamedTuple):
    """The commit a writer's view starts from, as its ``CommitFile`` names it."""

    version: int  # the inode version the handle opened (or last committed)
    blocks: list[int]  # that version's block ids
    replace: bool  # the whole content is the writer's (a truncation, 'w'): no merge with others


class FileService(Protocol):
    """What an open file needs from its client, and nothing more (``PCacheClient`` provides it).

    The file reads through ``data`` (TCP, short circuit, worker health); every call to the
    master goes through the methods below.
    """

    cfg: ClientConfig
    data: DataClient
    client_id: str  # spreads this client's readers of one file over its replicas
    read_budget: ReadBudget  # bytes of read units all of this client's files may cache
    write_budget: WriteBudget  # bytes of blocks all of this client's writers may have in flight

    async def layout_of(self, inode: int, exclude_fetchers: Iterable[str] = ()) -> pb.FileLayout:
        """The committed layout (size, version, blocks and their replicas) of ``inode``; an
        uncached block names a fetcher other than ``exclude_fetchers``."""
        ...

    async def report_bad_block(self, worker_id: str, block_id: int) -> None:
        """Tell the master a replica failed its CRC check (it quarantines and repairs it)."""
        ...

    async def write_block(
        self,
        inode: int,
        data: bytes | bytearray,
        crc: int,
        chunk_crcs: list[int] | None = None,
        on_allocated: Callable[[int], None] | None = None,
    ) -> tuple[int, list[str], list[pb.WorkerAddr], str]:
        """Allocate and store a new block: (block id, replicas that stored it, their addresses,
        the block token that reads it there); ``on_allocated(block_id)`` hears of each
        allocation as it is made."""
        ...

    async def open_stream(self, inode: int, length: int) -> BlockStream | None:
        """Allocate a block and open it on this host's worker; None when it cannot be streamed."""
        ...

    def stored_at(self, targets: list[pb.WorkerAddr], stored: list[str]) -> list[pb.WorkerAddr]:
        """The addresses of the ``targets`` whose ids are in ``stored``."""
        ...

    async def abandon_blocks(self, inode: int, block_ids: list[int]) -> None:
        """Give up blocks allocated for ``inode`` that will not be committed (the workers
        delete them now; the tenant's quota no longer holds them)."""
        ...

    async def commit(
        self,
        path: str,
        inode: int,
        size: int,
        blocks: list[pb.CommittedBlock],
        view: View,
        *,
        closing: bool = False,
        mtime: float = 0.0,
    ) -> pb.Inode:
        """Publish the file's block list (merged with other writers' commits since ``view``);
        ``closing``: the writer's close; ``mtime``: 0 for now."""
        ...

    async def discard_created(self, path: str, inode: int) -> None:
        """Remove ``path`` if it is still ``inode`` and still empty (a failed create leaves nothing)."""
        ...

    def invalidate(self, path: str) -> None:
        """Drop the client's cached metadata of ``path`` (it was found stale)."""
        ...


def parse_mode(mode: str) -> tuple[bool, bool, str]:
    """(readable, writable, base) of a Python-style binary mode.

    Raises:
        InvalidArgument: unknown mode.
    """
    if mode.count("b") + mode.count("t") > 1:
        raise InvalidArgument(f"invalid mode {mode!r}")
    base = mode.replace("b", "").replace("t", "")
    table = {"r": (True, False), "w": (False, True), "a": (False, True), "x": (False, True),
             "r+": (True, True), "w+": (True, True), "a+": (True, True), "x+": (True, True)}  # fmt: skip
    if base not in table:
        raise InvalidArgument(f"invalid mode {mode!r}")
    readable, writable = table[base]
    return readable, writable, base[0]


class PCacheFile:
    """Async file handle; create through :meth:`PCacheClient.open`."""

    def __init__(
        self, service: FileService, path: str, mode: str, layout: pb.FileLayout, *, cached: bool = False
    ) -> None:
        self.service = service
        self.cfg = service.cfg
        self.path = path
        self.mode = mode
        self.readable, self.writable, kind = parse_mode(mode)
        self.append = kind == "a"
        self.inode = layout.inode.id
        self.node = layout.inode  # the inode as this open found it
        self.block_size = layout.inode.block_size or (32 << 20)
        self.size = layout.inode.size
        self.slots: list[Slot] = _slots(layout)
        self.version = layout.inode.version  # the commit this handle's view starts from
        self.etag = layout.inode.etag  # a bound file's: the under-store object this view reads
        self.base_blocks = [slot.block_id for slot in self.slots]  # that commit's block ids
        # blocks allocated to this handle since its last commit: those the commit does not name
        # (rewritten, streamed then buffered), or all of them when the handle is aborted or its
        # close fails, are given up (AbandonBlocks)
        self._allocated: set[int] = set()
        self.replace = kind in "wx"  # the whole content is this handle's: no merge with others
        self.pos = self.size if self.append else 0
        self.closed = False
        self.dirty = False
        self.created = layout.inode.created  # made by this open (the master says so)
        self.cached = cached  # the layout came from the client's metadata cache (up to metadata_ttl old)
        # the block positions this view returned bytes of: a later commit's layout is taken
        # only where those positions keep their blocks (unchanged bytes), by an explicit
        # refresh, or when follow_versions
        self.served: set[int] = set()
        # take a later commit's layout when this view's blocks are gone, even after serving
        # bytes: the mount's handles, which read the version the kernel's page cache holds
        self.follow_versions = False
        self._committed = False
        # a writer's close the master waits for (write-back): an fsync committed this handle's
        # writes, or another writer's fsync did and left the file pending (see _fsync_locked)
        self._close_owed = self.writable and layout.inode.persist == pb.PERSIST_PENDING and not self.created
        self._mtime = layout.inode.mtime  # of the last commit this handle knows (kept by a bare close)
        # a modification time set while this handle writes (utimens on the open file: tar, cp -p):
        # the commit keeps it, until a later write makes it now again (File.keep_mtime)
        self.mtime_set: float | None = None
        self._units: OrderedDict[tuple[int, int], asyncio.Task] = OrderedDict()
        self._last_unit: tuple[int, int] | None = None
        self._budget = service.read_budget
        self._write_budget = service.write_budget
        # the unit a demand read last used: (file offset, bytes, unit key); the sync bridge serves
        # small reads inside it from the caller's thread. Cleared when the unit is dropped.
        self.hot: tuple[int, Buffer, tuple[int, int]] | None = None
        self._flush_slots = asyncio.Semaphore(max(1, self.cfg.max_inflight_blocks))
        self._slot_lock = asyncio.Lock()  # concurrent pwrites into one block load its old bytes once
        self._append_lock = asyncio.Lock()
        self._gate = _CommitGate()
        self._error: BaseException | None = None
        self._streaming = self.cfg.stream_writes and self.cfg.short_circuit  # until a block lands elsewhere

    # ------------------------------------------------------------ basics --

    def tell(self) -> int:
        """Current position in bytes."""
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move the position; returns it.

        Raises:
            InvalidArgument: a negative resulting position or bad ``whence``.
        """
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self.pos + offset
        elif whence == os.SEEK_END:
            pos = self.size + offset
        else:
            raise InvalidArgument(f"invalid whence {whence}")
        if pos < 0:
            raise InvalidArgument("negative seek position")
        self.pos = pos
        return pos

    async def refresh(self) -> bool:
        """Re-read the layout of a read-only handle: a commit made since it opened becomes readable.

        Returns:
            True when the file had changed.

        Raises:
            NotFound: the file was deleted. Unavailable, Timeout: the master cannot answer.
        """
        if self.writable:
            return False  # a writer's own slots are the truth for it
        layout = await self.service.layout_of(self.inode)
        if layout.inode.version == self.version:
            return False
        if self.follow_versions and self._replaced_upstream(layout):
            raise _replaced(self, layout)
        self._take(layout)
        self.served.clear()  # a new snapshot
        return True

    def _take(self, layout: pb.FileLayout) -> None:
        self.slots = _slots(layout)
        self.size = layout.inode.size
        self.version = layout.inode.version
        self.etag = layout.inode.etag
        self._last_unit = None
        self.hot = None

    def _replaced_upstream(self, layout: pb.FileLayout) -> bool:
        """Whether ``layout`` is another object of the under-store than the one this view was
        opened on (a bound file replaced in its bucket). A handle that follows versions (the
        mount's) does not follow that: the kernel's pages and size of the file may be the old
        object's, whatever this handle returned itself. Within one open, old and new bytes never
        mix: the reader gets ``StaleHandle``."""
        return bool(self.etag) and layout.inode.etag != self.etag

    def _keeps_served(self, layout: pb.FileLayout) -> bool:
        """Whether ``layout`` has the same block at every position this view returned bytes of."""
        new = [b.block_id for b in layout.blocks]
        old = [slot.block_id for slot in self.slots]
        return all((new[i] if i < len(new) else HOLE) == (old[i] if i < len(old) else HOLE) for i in self.served)

    def _check(self, want_write: bool) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if want_write and not self.writable:
            raise io.UnsupportedOperation("file not open for writing")
        if not want_write and not self.readable:
            raise io.UnsupportedOperation("file not open for reading")
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------- reads --

    async def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (all remaining when negative) from the position."""
        self._check(want_write=False)
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        if end <= self.pos:
            return b""
        data = await self.pread(self.pos, end - self.pos)
        self.pos += len(data)
        return data

    async def pread(self, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` without moving the position.

        A read-only handle whose blocks are gone takes the file's current layout once and reads
        again, when that changes none of the bytes it returned: it was opened from the client's
        metadata cache (``metadata_ttl``) after a commit that replaced them (copy-on-write frees
        the old blocks at once), or such a commit landed after its open, at positions it had not
        read. A commit that replaced a block it had returned bytes of fails the read
        (``StaleHandle``) rather than mixing two versions in one read of the file, unless the
        handle follows versions (``follow_versions``: the mount's). A writer reads the blocks
        that replaced its clean ones (:meth:`_fetch`).

        Raises:
            Unavailable: no replica of a block could be read. StaleHandle: the file was replaced
                (rewritten and committed elsewhere) after this handle returned bytes the new
                version changed: reopen it.
        """
        try:
            return await self._pread(offset, length)
        except Unavailable as exc:
            if self.writable:
                raise
            self.cached = False
            self.service.invalidate(self.path)
            layout = await self.service.layout_of(self.inode)
            if layout.inode.version == self.version:
                raise
            if self.follow_versions and self._replaced_upstream(layout):
                raise _replaced(self, layout) from exc
            if not self.follow_versions and not self._keeps_served(layout):
                raise _replaced(self, layout) from exc
            self._take(layout)
            logger.debug("%s: its blocks were replaced; reading version %d", self.path, self.version)
            return await self._pread(offset, length)

    async def _pread(self, offset: int, length: int) -> bytes:
        end = min(self.size, offset + length)
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            idx, off = divmod(pos, self.block_size)
            n = min(self.block_size - off, end - pos)
            parts.append(await self._read_slot(idx, off, n))
            self.served.add(idx)
            pos += n
        return b"".join(parts)

    async def _read_slot(self, idx: int, off: int, n: int) -> bytes:
        if idx >= len(self.slots):
            return bytes(n)  # a hole past the last written block
        slot = self.slots[idx]
        if slot.stream is not None:  # the writer reads what it streamed: it becomes buffered again
            slot = await self._dirty_slot(idx)
        if slot.pending is not None:
            await self._settle(slot)
        if slot.data is not None:
            chunk = bytes(slot.data[off : off + n])
            return chunk + bytes(n - len(chunk))  # holes inside a dirty block read as zeros
        if off >= slot.length or slot.block_id == HOLE:
            return bytes(n)
        avail = min(n, slot.length - off)
        unit = self.cfg.read_unit
        out: list[Buffer | memoryview] = []
        pos = off
        while pos < off + avail:
            k = pos // unit
            take = min((k + 1) * unit, off + avail) - pos
            data = await self._unit(idx, k)
            if data is None:  # no room in the client's read budget: just these bytes, uncached
                out.append(await self._fetch(idx, pos, take))
            else:
                start = pos - k * unit
                take = min(len(data) - start, take)
                whole = start == 0 and take == len(data) and isinstance(data, bytes)
                out.append(data if whole else memoryview(data)[start : start + take])  # copied by the join
            pos += take
        if avail < n:
            out.append(bytes(n - avail))
        if len(out) == 1 and isinstance(out[0], bytes):
            return out[0]  # a whole unit, received into its bytes: no copy
        return b"".join(out)

    async def _unit(self, idx: int, k: int) -> Buffer | None:
        """Unit ``k`` of slot ``idx`` (cached, admitted against the client's read budget), after
        starting the read-ahead of a sequential reader; None when the budget has no room."""
        slot = self.slots[idx]
        key = (slot.block_id, k)
        task = self._units.get(key)
        if task is None:
            task = self._start_unit(idx, k, demand=True)
        else:
            self._units.move_to_end(key)
            self._budget.touch(self, key)
        sequential = self._last_unit is None or (idx, k) in (self._last_unit, self._next_unit(*self._last_unit))
        self._last_unit = (idx, k)
        if task is None:
            return None
        if sequential and self.cfg.readahead_units > 0:
            nxt: tuple[int, int] | None = (idx, k)
            for _ in range(self.cfg.readahead_units):
                nxt = self._next_unit(*nxt) if nxt else None
                if nxt is None:
                    break
                s = self.slots[nxt[0]]
                wanted = s.data is None and s.pending is None and (s.block_id, nxt[1]) not in self._units
                if wanted and self._start_unit(*nxt) is None:
                    break  # the budget is full: read ahead no further
        try:
            data = await asyncio.shield(task)
        except BaseException:
            self._pop_unit(key)
            raise
        if self._units.get(key) is task:
            self.hot = (idx * self.block_size + k * self.cfg.read_unit, data, key)
        return data

    def _next_unit(self, idx: int, k: int) -> tuple[int, int] | None:
        if idx >= len(self.slots):  # the file shrank since that unit was read
            return None
        unit = self.cfg.read_unit
        if (k + 1) * unit < self.slots[idx].length:
            return idx, k + 1
        if idx + 1 < len(self.slots) and self.slots[idx + 1].block_id:
            return idx + 1, 0
        return None

    def _start_unit(self, idx: int, k: int, *, demand: bool = False) -> asyncio.Task | None:
        """Start reading unit ``k`` of slot ``idx`` into the cache (``demand``: a read waits for
        it, else read-ahead); None when the client's read budget has no room for it."""
        slot = self.slots[idx]
        unit = self.cfg.read_unit
        offset = k * unit
        length = min(unit, slot.length - offset)
        key = (slot.block_id, k)
        if not self._budget.admit(self, key, length, demand=demand):
            return None
        task = asyncio.ensure_future(self._fetch(idx, offset, length))
        task.add_done_callback(_consume_exception)
        self._units[key] = task
        while len(self._units) > 2 * self.cfg.readahead_units + 2:
            self._pop_unit(next(iter(self._units)))
        return task

    def _pop_unit(self, key: tuple[int, int]) -> None:
        """Forget a cached unit (cancelled if still being read) and give its bytes back."""
        task = self._units.pop(key, None)
        if task is not None:
            if not task.done():
                task.cancel()
            self._budget.release(self, key)
        if self.hot is not None and self.hot[2] == key:
            self.hot = None

    def drop_unit(self, key: tuple[int, int]) -> bool:
        """The budget's eviction: drop a cached unit that is not being read (False otherwise)."""
        task = self._units.get(key)
        if task is not None and not task.done():
            return False
        self._pop_unit(key)
        self._budget.release(self, key)  # also when the file forgot it already
        return True

    async def _fetch(self, idx: int, offset: int, length: int) -> Buffer:
        """Read a byte range of a clean slot's block, failing over between replicas.

        When every replica fails, the handle asks the master where the block is now. In a writer,
        a clean block that no longer belongs to the file was replaced by another handle's commit
        (copy-on-write) and its replicas deleted: the range is read from the block now at that
        position, the content a handle opened after that commit would see (the slot keeps its
        block id, so the writer's commit still conflicts if it changes that block). A read-only
        handle takes the whole new layout instead (:meth:`pread`).

        An uncached block of a bound file whose fetcher answered that its under-store did not
        answer in time (``worker.ufs_timeout``) is not asked again: the read fails then, and reads
        of that block fail at once for as long as this one waited, ``FAILED_FETCH_MEMORY`` seconds
        (10) at most (a hung store cost a read two timeouts, and a read through the mount, with the
        kernel's read-ahead, four; a read that failed within a second, on a store known to be down,
        is tried again a second later: the store back, it is served).

        Raises:
            Unavailable: no replica could be read. StaleHandle: the file no longer has that block
            position (a later commit shrank it).
        """
        slot = self.slots[idx]
        data = self.service.data
        if slot.uncached and (failed := data.fetch_failed(slot.block_id)) is not None:
            raise failed  # its store did not answer a moment ago: not another ufs_timeout
        started = time.monotonic()
        errors: list[tuple[str, BaseException]] = []

        def store_timed_out() -> bool:  # a fetcher that answered: its under-store did not, in time
            return slot.uncached and any(
                isinstance(e, Timeout) and not data.health.is_suspect(w) for w, e in errors
            )  # fmt: skip

        for attempt in range(2):
            got = await self._hedged(self._ordered(slot.locations, idx), slot, offset, length, errors)
            if got is not None:
                return got
            if attempt == 0:
                # a bound file's block whose fetcher, or every worker holding it, hung or died:
                # another fetcher (the master names one for a bound file's block only); its store
                # that did not answer in time: not again (asking again takes as long, ``worker.ufs_timeout``)
                # the workers this read tried, not only the slot's now: another block's refresh
                # may have moved the slot meanwhile, and a refresh that excluded nobody named the
                # dead fetcher again (seen on CI)
                tried = [w for w, _ in errors] + [a.worker_id for a in self.slots[idx].locations]
                hung = sorted({w for w in tried if data.health.is_suspect(w)})
                if not hung and store_timed_out():
                    break
                layout = await self._refresh_locations(hung)
                if layout is not None and self.writable and all(b.block_id != slot.block_id for b in layout.blocks):
                    return await self._read_successor(layout, idx, offset, length)
                slot = self.slots[idx]
        err = Unavailable(f"{self.path}: no replica of block {slot.block_id} could be read ({_reasons(errors)})")
        if store_timed_out():
            data.remember_failed_fetch(slot.block_id, err, time.monotonic() - started)
        raise err

    async def _read_successor(self, layout: pb.FileLayout, idx: int, offset: int, length: int) -> Buffer:
        """Read ``length`` bytes at ``offset`` of the block that replaced slot ``idx``'s block."""
        gone = self.slots[idx].block_id
        if idx >= len(layout.blocks):
            raise StaleHandle(f"{self.path}: block {gone} was removed by a later commit that shrank the file")
        successor = _slots(layout)[idx]
        logger.debug("%s: block %d was replaced by block %d; reading that", self.path, gone, successor.block_id)
        n = max(0, min(length, successor.length - offset))
        if successor.block_id == HOLE or n == 0:
            return bytes(length)
        errors: list[tuple[str, BaseException]] = []
        data = await self._hedged(self._ordered(successor.locations, idx), successor, offset, n, errors)
        if data is None:
            raise Unavailable(
                f"{self.path}: block {gone} was replaced by block {successor.block_id}, and no replica of that"
                f" could be read ({_reasons(errors)})"
            )
        return data + bytes(length - n)

    async def _hedged(
        self, order: list[pb.WorkerAddr], slot: Slot, offset: int, length: int, errors: list[tuple[str, BaseException]]
    ) -> Buffer | None:
        """Read from ``order[0]``; when it fails, or is slower than the hedging delay, from the next.

        The first good answer wins; the request that lost finishes or times out in the background
        (a timeout makes its worker a suspect, tried last for later blocks; so does losing after
        half the stall timeout without an answer, so that the next blocks do not wait for it
        meanwhile). Returns None when
        every replica failed (``errors`` says why). Source: hedged requests ("The Tail at Scale",
        Dean and Barroso 2013; HDFS ``dfs.client.hedged.read.threshold.millis``).
        """
        data = self.service.data
        pending: dict[asyncio.Task, pb.WorkerAddr] = {}
        started: dict[asyncio.Task, float] = {}
        queue = list(order)

        def ask(addr: pb.WorkerAddr) -> None:
            task = self._read_task(addr, slot, offset, length)
            pending[task], started[task] = addr, time.monotonic()

        try:
            while queue or pending:
                if not pending:  # nothing in flight: the next replica
                    ask(queue.pop(0))
                hedge = data.health.hedge_delay(self.cfg.stall_timeout) if self.cfg.hedge_reads and queue else None
                done, _ = await asyncio.wait(pending, timeout=hedge, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # slow: ask the next replica too
                    ask(queue.pop(0))
                    continue
                for task in done:
                    addr = pending.pop(task)
                    exc = task.exception()
                    if exc is None:
                        now = time.monotonic()
                        for loser, where in pending.items():
                            if now - started[loser] >= self.cfg.stall_timeout / 2:
                                data.health.suspect(where.worker_id)
                        return task.result()
                    if not isinstance(exc, READ_FAILOVER_ERRORS):
                        raise exc
                    errors.append((addr.worker_id, exc))
            return None
        finally:
            for task in pending:
                task.add_done_callback(_consume_exception)
                data.detach(task)

    def _read_task(self, addr: pb.WorkerAddr, slot: Slot, offset: int, length: int) -> asyncio.Task:
        # an uncached block's first byte waits for the worker's fetch from the under-store
        wait = self.cfg.fetch_timeout if slot.uncached else None
        return asyncio.ensure_future(self._read_one(addr, slot.block_id, offset, length, slot.token, slot.crc, wait))

    async def _read_one(
        self,
        addr: pb.WorkerAddr,
        block_id: int,
        offset: int,
        length: int,
        token: str,
        crc: int,
        first_byte: float | None = None,
    ) -> Buffer:
        data = self.service.data
        if not data.can_short_circuit(addr):
            try:
                return await data.read(addr, block_id, offset, length, token, crc, first_byte=first_byte)
            except WrongBlock:  # the worker's own checks passed: only the client saw it
                await self._report_bad(addr.worker_id, block_id)
                raise
        try:
            return await data.sc_read(addr, block_id, offset, length, token, crc, first_byte=first_byte)
        except READ_FAILOVER_ERRORS as exc:
            data.sc_forget(addr, block_id)
            if isinstance(exc, CorruptBlock):  # over TCP the worker reports it; here only the client saw it
                await self._report_bad(addr.worker_id, block_id)
            raise

    def _ordered(self, locations: list[pb.WorkerAddr], idx: int = 0) -> list[pb.WorkerAddr]:
        """Replicas in the order to try: local, then remote (rotated per file and block: readers of
        one file, and the consecutive blocks one reader has in flight, spread over the replicas),
        suspects last."""
        health = self.service.data.health
        local = [a for a in locations if self.service.data.can_short_circuit(a)]
        remote = [a for a in locations if a not in local]
        if remote:
            shift = (hash((self.service.client_id, self.inode)) + idx) % len(remote)
            remote = remote[shift:] + remote[:shift]
        ordered = local + remote
        return [a for a in ordered if not health.is_suspect(a.worker_id)] + [
            a for a in ordered if health.is_suspect(a.worker_id)
        ]

    async def _report_bad(self, worker_id: str, block_id: int) -> None:
        try:
            await self.service.report_bad_block(worker_id, block_id)
        except PCacheError as exc:
            logger.warning("cannot report corrupt block %d on %s: %s", block_id, worker_id, exc)

    async def _refresh_locations(self, exclude_fetchers: Iterable[str] = ()) -> pb.FileLayout | None:
        """Take the master's current replica locations (and tokens) of this handle's blocks; an
        uncached block's fetcher is none of ``exclude_fetchers``.

        Returns the file's current layout, or None when the master could not answer.
        """
        try:
            layout = await self.service.layout_of(self.inode, exclude_fetchers)
        except PCacheError as exc:
            logger.warning("%s: cannot refresh block locations: %s", self.path, exc)
            return None
        fresh = {b.block_id: b for b in layout.blocks}
        for slot in self.slots:
            if slot.block_id in fresh:
                loc = fresh[slot.block_id]
                slot.locations, slot.token, slot.uncached = list(loc.replicas), loc.token, loc.uncached
        return layout

    # ------------------------------------------------------------ writes --

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the position (at the end in append mode); returns its length."""
        self._check(want_write=True)
        if self.append:
            self.pos = self.size
        start = self.pos
        self.pos = start + len(memoryview(data).cast("B"))  # claimed first: concurrent writers never overlap
        try:
            return await self._write_at(data, start)
        except BaseException:
            self.pos = start
            raise

    async def append_write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the current end of the file; concurrent appends never overlap."""
        self._check(want_write=True)
        async with self._append_lock:
            return await self._write_at(data, self.size)

    async def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        """Write at ``offset`` without moving the position; safe to run concurrently on one handle."""
        self._check(want_write=True)
        return await self._write_at(data, offset)

    async def _write_at(self, data: bytes | bytearray | memoryview, pos: int) -> int:
        async with self._gate.shared():  # never in the middle of a commit
            return await self._write_blocks(data, pos)

    async def _write_blocks(self, data: bytes | bytearray | memoryview, pos: int) -> int:
        view = memoryview(data).cast("B")
        check_file_size(pos + len(view), self.block_size, self.path)
        total = len(view)
        while view:
            idx, off = divmod(pos, self.block_size)
            n = min(self.block_size - off, len(view))
            if not await self._stream_append(idx, off, view[:n]):
                slot = await self._dirty_slot(idx)
                assert slot.data is not None
                _put(slot.data, off, view[:n])
                if (
                    self._streaming
                    and idx
                    and slot.fresh
                    and STREAM_AFTER <= len(slot.data) == off + n < self.block_size
                ):
                    await self._start_stream(idx)
            view = view[n:]
            pos += n
            self.size = max(self.size, pos)
            self.dirty = True
            self.mtime_set = None
            if off + n == self.block_size:
                await self._start_flush(idx)
        return total

    async def _dirty_slot(self, idx: int) -> Slot:
        async with self._slot_lock:
            return await self._dirty_slot_locked(idx)

    async def _dirty_slot_locked(self, idx: int) -> Slot:
        while len(self.slots) <= idx:
            self.slots.append(Slot())  # a hole until written
        slot = self.slots[idx]
        if slot.stream is not None:
            await self._unstream(slot)
        if slot.pending is not None:
            await self._settle(slot)
        if slot.data is None:
            content = await self._read_slot(idx, 0, slot.length) if slot.block_id else b""
            slot.data = bytearray(content)
            slot.fresh = not slot.block_id
            self._forget_units(slot.block_id)
        return slot

    # ------------------------------------------------------- streaming --
    # A sequential writer's new block after its first (a file past one full block), once
    # STREAM_AFTER bytes of it are buffered, is allocated and opened on this host's worker (short
    # circuit) and the rest of it goes straight into its file: the kernel's one copy from the
    # caller's buffer, no block-sized buffer in this process, the CRCs computed as it goes and
    # taken by the worker (not read back). A full block is committed in the background like a
    # buffered one. Anything else (a file that ends inside the block, a write elsewhere in it, a
    # read of it, a truncation) reads the streamed bytes back from the descriptor and the block is
    # buffered again; its allocation is left to expire (``master.orphan_grace``), charged to the
    # tenant's quota until then like any allocation never committed: a block token names one
    # length and cannot be revoked, so an allocation is never shortened or released early.

    async def _start_stream(self, idx: int) -> None:
        for earlier in self.slots[:idx]:  # allocated in the file's order (see Slot.allocated)
            if earlier.allocated is not None:
                await earlier.allocated.wait()
        async with self._slot_lock:
            slot = self.slots[idx]
            data = slot.data
            if slot.stream is not None or slot.pending is not None or data is None or not self._streaming:
                return
            stream = await self.service.open_stream(self.inode, self.block_size)
            if stream is None:
                self._streaming = False  # placed on another host (or no local room): buffer this file
                return
            self._allocated.add(stream.block_id)
            try:
                await stream.append(data)
            except PCacheError as exc:
                logger.debug("%s: cannot stream block %d: %s", self.path, stream.block_id, exc)
                stream.close()
                self._streaming = False
                return
            slot.data, slot.stream = None, stream

    async def _stream_append(self, idx: int, off: int, piece: memoryview) -> bool:
        """Append ``piece`` to slot ``idx``'s stream when it continues it; False when there is no
        stream or ``off`` is not its end (the caller buffers the block again)."""
        stream = self.slots[idx].stream if idx < len(self.slots) else None
        if stream is None:
            return False
        async with stream.lock:
            if self.slots[idx].stream is not stream or off != stream.end:
                return False
            try:
                await stream.append(piece)
            except PCacheError as exc:  # a full disk here: what was written is read back and buffered
                logger.info("%s: streaming block %d failed (%s); buffering it", self.path, stream.block_id, exc)
                self._streaming = False
                return False
        return True

    async def _unstream(self, slot: Slot) -> None:
        """Buffer a streamed block again: its bytes read back, its allocation left to expire."""
        stream = slot.stream
        if stream is None:
            return
        async with stream.lock:
            if slot.stream is not stream:
                return
            data = await stream.read_back()
            slot.stream = None
            stream.close()
            slot.data, slot.fresh = bytearray(data), True

    async def _commit_stream(self, slot: Slot, stream: BlockStream) -> None:
        """Store a full streamed block; when that fails, its bytes are read back from the
        descriptor and stored as a buffered block would be."""
        try:
            async with stream.lock:
                try:
                    await stream.flush()
                    stored = await stream.commit()
                except (PCacheError, OSError) as exc:
                    logger.info("%s: block %d: %s; storing it another way", self.path, stream.block_id, exc)
                    data = bytearray(await stream.read_back())
                else:
                    slot.block_id, slot.length, slot.crc = stream.block_id, stream.written, stream.sums.crc
                    slot.replicas, slot.token = stored, stream.token
                    slot.locations = self.service.stored_at(stream.targets, stored)
                    return
        finally:
            stream.close()
        await self._store(slot, data)

    def _forget_units(self, block_id: int) -> None:
        for key in [k for k in self._units if k[0] == block_id]:
            self._pop_unit(key)

    async def _settle(self, slot: Slot) -> None:
        task = slot.pending
        if task is None:
            return
        try:
            await task
        finally:
            slot.pending = None

    async def _start_flush(self, idx: int) -> None:
        slot = self.slots[idx]
        stream = slot.stream
        if stream is not None:
            await self._flush_slots.acquire()
            if slot.stream is not stream:  # made buffered meanwhile
                self._flush_slots.release()
                return await self._start_flush(idx)
            slot.stream = None
            slot.pending = asyncio.ensure_future(self._commit_stream(slot, stream))
            slot.pending.add_done_callback(functools.partial(self._flush_done, 0))
            return
        data = slot.data
        if data is None:
            return
        await self._flush_slots.acquire()
        try:
            granted = await self._write_budget.acquire(len(data))  # the client's write-behind bound
        except BaseException:
            self._flush_slots.release()
            raise
        slot.data = None
        slot.allocated = allocated = asyncio.Event()
        slot.pending = asyncio.ensure_future(self._store(slot, data))
        slot.pending.add_done_callback(functools.partial(self._flush_done, granted))
        slot.pending.add_done_callback(lambda _: allocated.set())

    def _flush_done(self, granted: int, task: asyncio.Task) -> None:
        self._flush_slots.release()
        self._write_budget.release(granted)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()

    async def _store(self, slot: Slot, data: bytearray) -> None:
        crcs, crc = await asyncio.to_thread(chunk_crcs, data) if len(data) > (1 << 20) else chunk_crcs(data)

        # each allocation is known to the handle from the moment it exists: a close that fails
        # or is cancelled while this block is on its way gives it back too (AbandonBlocks)
        def allocated(block_id: int) -> None:
            self._allocated.add(block_id)
            if slot.allocated is not None:
                slot.allocated.set()

        block_id, stored, locations, token = await self.service.write_block(self.inode, data, crc, crcs, allocated)
        slot.block_id, slot.length, slot.crc = block_id, len(data), crc
        slot.replicas, slot.locations, slot.token = stored, locations, token

    async def _pad_slots(self) -> None:
        """Make the slot list match the file size: one slot per block, none longer than its place.

        A stored block shorter than its place (the old last block of a file that grew) is kept
        as it is: the rest reads as zeros, and a writer that only extends the file does not
        rewrite a block another writer may be changing.
        """
        nslots = (self.size + self.block_size - 1) // self.block_size
        for idx in range(nslots):
            want = min(self.block_size, self.size - idx * self.block_size)
            if idx >= len(self.slots):
                self.slots.append(Slot(length=want))  # zero-extension stays a hole: no bytes stored
                continue
            slot = self.slots[idx]
            if slot.pending is not None:
                await self._settle(slot)  # its length is known only once stored
            if slot.block_id == HOLE and slot.data is None and slot.pending is None:
                slot.length = want
                continue
            if slot.data is None and slot.length > want:  # cut: rewritten shorter
                slot = await self._dirty_slot(idx)
            if slot.data is not None and len(slot.data) != want:
                if len(slot.data) < want:
                    slot.data.extend(bytes(want - len(slot.data)))
                else:
                    del slot.data[want:]
        del self.slots[nslots:]

    async def truncate(self, size: int | None = None) -> int:
        """Cut or zero-extend the file to ``size`` bytes (default: the position)."""
        self._check(want_write=True)
        size = self.pos if size is None else size
        if size < 0:
            raise InvalidArgument("negative size")
        check_file_size(size, self.block_size, self.path)
        async with self._gate.shared():
            for slot in self.slots:
                await self._unstream(slot)
                if slot.pending is not None:
                    await self._settle(slot)
            self.size = size
            await self._pad_slots()
            self.dirty = True
            self.mtime_set = None
            self.replace = True  # a truncation is not merged with other writers' blocks
            self._last_unit = None
        return size

    async def fsync(self) -> None:
        """Write every dirty block and commit: the content becomes visible to other clients.

        Writes from other threads of the handle wait while it commits, so the block list and the
        size it commits are one moment's (a write in between was left uncommitted, or made the
        size cover bytes not yet stored).
        """
        self._check(want_write=True)
        async with self._gate.exclusive():
            await self._fsync_locked()

    async def _fsync_locked(self, *, closing: bool = False) -> None:
        if not self.dirty and not (closing and self._close_owed):
            return
        for idx, slot in enumerate(self.slots):  # a stream holding a whole block is committed as it is
            if slot.stream is not None:
                if slot.stream.end == self.block_size:
                    await self._start_flush(idx)
                else:
                    await self._unstream(slot)
        await self._pad_slots()
        for idx, slot in enumerate(self.slots):
            if slot.data is not None:
                await self._start_flush(idx)
        for slot in self.slots:
            await self._settle(slot)
        if self._error is not None:
            raise self._error
        blocks = [
            pb.CommittedBlock(block_id=s.block_id, length=s.length, crc32c=s.crc, replicas=s.replicas)
            for s in self.slots
        ]
        node = await self.service.commit(
            self.path,
            self.inode,
            self.size,
            blocks,
            View(self.version, self.base_blocks, self.replace),
            closing=closing,
            # a close with nothing new keeps the mtime; one set since the last write stays set
            mtime=self.mtime_set if self.mtime_set is not None else self._mtime if not self.dirty else 0.0,
        )
        # a write-back file committed by an fsync is queued for upload by its writer's close:
        # that close is owed to the master even when nothing is left to write
        self._close_owed = not closing and node.persist == pb.PERSIST_PENDING
        self._mtime = node.mtime
        self.dirty = False
        self.replace = False
        self._committed = True
        stale = self._allocated - {b.block_id for b in blocks}
        self._allocated = set()
        if stale:
            await self._abandon(stale)
        if list(node.blocks) != [b.block_id for b in blocks] or node.size != self.size:
            await self._adopt()  # merged with another writer's commit: its blocks are this handle's view now
        else:
            self.version = node.version
            self.base_blocks = [b.block_id for b in blocks]

    async def _adopt(self) -> None:
        """Take the committed layout as this handle's view (clean slots only: nothing is dirty now)."""
        layout = await self.service.layout_of(self.inode)
        fresh = _slots(layout)
        for idx, mine in enumerate(self.slots[: len(fresh)]):
            if mine.data is not None or mine.pending is not None or mine.stream is not None:
                fresh[idx] = mine  # written again meanwhile (another thread of this handle)
        self.slots = fresh
        self.size = max(self.size, layout.inode.size)
        self.version = layout.inode.version
        self.base_blocks = [b.block_id for b in layout.blocks]
        self._last_unit = None

    async def flush(self) -> None:
        """Python-level flush: blocks already full are on their way; nothing to do."""
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        """Commit pending writes (if any) and release resources. Idempotent."""
        if self.closed:
            return
        try:
            if self.writable and self._error is None:
                self._check(want_write=True)
                async with self._gate.exclusive():
                    await self._fsync_locked(closing=True)  # the close: write-back uploads this version
        except BaseException:
            await self._stop_pending()  # a block still on its way allocates nothing after the abandon
            await self._abandon(self._allocated)
            await self._discard_if_created()
            raise
        finally:
            self.closed = True
            for slot in self.slots:
                if slot.pending is not None and not slot.pending.done():
                    slot.pending.cancel()
                if slot.stream is not None:  # not committed: the worker drops it
                    slot.stream.close()
                    slot.stream = None
            for key in list(self._units):
                self._pop_unit(key)
            self.hot = None
        if self._error is not None:
            await self._stop_pending()
            await self._abandon(self._allocated)
            await self._discard_if_created()
            raise self._error

    async def _stop_pending(self) -> None:
        """Cancel the blocks still being stored and wait for them to end (best effort)."""
        pending = [s.pending for s in self.slots if s.pending is not None and not s.pending.done()]
        for task in pending:
            task.cancel()
        if pending:  # their own errors stay in them (asyncio.wait raises none); a cancel of this close does
            await asyncio.wait(pending, timeout=5.0)

    async def abort(self) -> None:
        """Drop the handle without committing: the file keeps its last committed content (a file
        this handle created goes away), and the blocks written since are given up."""
        if self.closed:
            return
        self.dirty = False
        self._error = None
        await self.close()
        await self._abandon(self._allocated)
        await self._discard_if_created()

    async def _abandon(self, blocks: set[int]) -> None:
        """Give up ``blocks``, best effort: a master that cannot be told lets their allocations
        expire (``master.orphan_grace``) and deletes them at the workers' next block reports."""
        if not blocks:
            return
        ids = sorted(blocks)
        if blocks is self._allocated:
            self._allocated = set()
        try:
            await self.service.abandon_blocks(self.inode, ids)
        except PCacheError as exc:
            logger.debug("%s: cannot give up blocks %s: %s", self.path, ids, exc)

    async def _discard_if_created(self) -> None:
        """A file this handle created and never committed goes with a failed close or an abort:
        a failed create leaves no empty file behind."""
        if not (self.created and self.writable and not self._committed):
            return
        self.created = False
        try:
            await self.service.discard_created(self.path, self.inode)
        except (Unavailable, Timeout) as exc:
            logger.warning(
                "%s: cannot remove the file a failed writer created yet (%s): tried again while the client is open",
                self.path,
                exc,
            )
        except PCacheError as exc:
            logger.warning("%s: cannot remove the file a failed writer created: %s", self.path, exc)

    async def __aenter__(self) -> PCacheFile:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.writable:
            await self.abort()  # an exception inside ``async with``: publish nothing
        else:
            await self.close()


class _CommitGate:
    """Writes share it; a commit holds it alone (a readers-writer lock on the event loop)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._writers = 0
        self._committing = False

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._committing)
            self._writers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._committing)
            self._committing = True
            await self._cond.wait_for(lambda: self._writers == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._committing = False
                self._cond.notify_all()


def _put(buf: bytearray, off: int, piece: memoryview) -> None:
    """Copy ``piece`` into ``buf`` at ``off``, growing it (zeros in any gap): one copy. (A slice
    assignment of anything but a bytearray, ``buf[a:b] = piece``, first copies it into a temporary
    bytearray: two copies and an allocation per write.)"""
    if off > len(buf):
        buf.extend(bytes(off - len(buf)))
    inside = max(0, min(len(piece), len(buf) - off))
    if inside:
        with memoryview(buf) as view:
            view[off : off + inside] = piece[:inside]
    if inside < len(piece):
        buf += piece[inside:]


def _slots(layout: pb.FileLayout) -> list[Slot]:
    return [
        Slot(b.block_id, b.length, b.crc32c, [r.worker_id for r in b.replicas], list(b.replicas), b.token, b.uncached)
        for b in layout.blocks
    ]


def _reasons(errors: list[tuple[str, BaseException]]) -> str:
    """Why each replica failed, for an error message."""
    return "; ".join(f"{worker}: {exc}" for worker, exc in errors) or (
        "no good replica on a live worker: pcache fsck says which"
    )


def _consume_exception(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _replaced(f: PCacheFile, layout: pb.FileLayout) -> StaleHandle:
    """The error of a read of handle ``f`` whose version ``layout`` replaced, when ``f`` may not
    go on in the new one (see :meth:`PCacheFile.pread`)."""
    if f._replaced_upstream(layout):
        why = "the file was replaced in its under-store since this handle opened it"
    else:
        why = "the file was replaced while this handle read it, and the blocks of the version it read are gone"
    return StaleHandle(
        f"{why} (version {f.version} -> {layout.inode.version}): reopen it to read the new one", path=f.path
    )
