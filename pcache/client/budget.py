"""Byte budgets of one client: read units cached (:class:`ReadBudget`) and blocks being
written behind (:class:`WriteBudget`), each shared by every open file of the client.

Each open file reads in units (``read_unit`` bytes of one block) and keeps the unit being read
plus ``readahead_units`` prefetched ahead of a sequential reader. Without a global bound the
memory is per file: a FUSE mount serving 800 open files at once held 1.6 GiB. Here every cached
unit is admitted against :attr:`ReadBudget.limit` (``ClientConfig.read_budget``) under one LRU
over all the files: to make room, the least recently used unit of any file that is not being
fetched is dropped. A prefetch that still finds no room is skipped; a demand read that finds
none reads just the bytes asked for, uncached. A client's read memory is then ``read_budget``
plus the requests in flight, however many files are open (as JuiceFS's ``--buffer-size`` or
Alluxio's reader buffer bound theirs).

All calls come from the client's event loop thread: no locking.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Protocol

UnitKey = tuple[int, int]  # (block id, unit index in the block)


class UnitOwner(Protocol):
    def drop_unit(self, key: UnitKey) -> bool:
        """Drop a cached unit to make room; False when it cannot go now (still being fetched)."""
        ...


class ReadBudget:
    """Bytes of cached read units of every file of one client, with one LRU over them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.evicted = 0  # units dropped to make room (a file's own trimming is not counted)
        self.refused = 0  # units not admitted (prefetch skipped, or a demand read left uncached)
        # (owner id, key) -> [owner, bytes, read yet]; least recently used first
        self._lru: OrderedDict[tuple[int, UnitKey], list] = OrderedDict()

    def admit(self, owner: UnitOwner, key: UnitKey, nbytes: int, *, demand: bool) -> bool:
        """Account ``nbytes`` for ``owner``'s unit ``key``; False (nothing accounted) when there
        is no room.

        To make room, least recently used units of any owner are dropped: for a demand read any
        unit not being fetched; for a prefetch only units already read, so that read-ahead never
        pushes out another file's read-ahead that has not been used yet (which would be fetched
        twice)."""
        if self.used + nbytes > self.limit:
            for (_oid, okey), (other, _n, was_read) in list(self._lru.items()):
                if (demand or was_read) and other.drop_unit(okey):  # drop_unit calls release()
                    self.evicted += 1
                    if self.used + nbytes <= self.limit:
                        break
        if self.used + nbytes > self.limit:
            self.refused += 1
            return False
        self.used += nbytes
        self._lru[(id(owner), key)] = [owner, nbytes, demand]
        return True

    def touch(self, owner: UnitOwner, key: UnitKey) -> None:
        """A unit was just read: most recently used, and evictable by prefetches from now on."""
        entry = self._lru.get((id(owner), key))
        if entry is not None:
            entry[2] = True
            self._lru.move_to_end((id(owner), key))

    def release(self, owner: UnitOwner, key: UnitKey) -> None:
        """Give a unit's bytes back (dropped, trimmed, failed, or its file closed)."""
        entry = self._lru.pop((id(owner), key), None)
        if entry is not None:
            self.used -= entry[1]


class WriteBudget:
    """Bytes of full blocks every writer of one client has handed to the workers and not yet
    had acknowledged (write-behind). A writer whose next block would pass ``limit`` waits for
    others' blocks to land (backpressure): a mount with many writers holds at most ``limit`` in
    flight, plus each writer's block being filled (at most one block size per sequential writer).

    A flush always completes or fails on its own, so a waiting writer never waits on itself.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waits = 0  # flushes that had to wait for room
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self, nbytes: int) -> int:
        """Wait until ``nbytes`` (at most the whole limit) fit; returns the bytes granted."""
        grant = min(nbytes, self.limit)
        if self.used + grant > self.limit:
            self.waits += 1
        while self.used + grant > self.limit:
            room = asyncio.get_running_loop().create_future()
            self._waiters.append(room)
            try:
                await room
            finally:
                if room in self._waiters:
                    self._waiters.remove(room)
        self.used += grant
        return grant

    def release(self, grant: int) -> None:
        """A block landed (or failed): give its bytes back and wake the writers waiting (each
        checks again whether its block fits)."""
        self.used -= grant
        while self._waiters:
            room = self._waiters.popleft()
            if not room.done():
                room.set_result(None)
