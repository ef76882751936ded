"""Blocks allocated to writers and not yet committed (the master's in-flight write state).

A writer asks the master for a block id (``AllocateBlock``), stores the block on its pipeline of
workers, and names the id in its ``CommitFile``. Between the two the id is *reserved* here: the
reservation is what lets the commit adopt the block, and what keeps a worker's report of the
block from being taken for an orphan and deleted (HDFS keeps "under construction" blocks in its
block map likewise). A reservation ends with the commit, with the rollback of a failed placement,
or after ``grace`` seconds without a commit (the writer died; its replicas become orphans).

The state is in memory: a single master that restarts forgets it, and a commit naming a block
allocated before the restart is refused with a :class:`Conflict` that says so.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from pcache.common import errors as E

EXPIRED_REMEMBERED = 100_000  # expired ids kept to explain a late commit (then: "not this file's")


class Allocations:
    """Reservations of block ids for writers of inodes: reserve, commit, forget, expire.

    ``first_id`` is the first block id this master process can hand out (ids below it were
    allocated by an earlier run); ``grace`` is how long, in seconds, a reservation waits for its
    commit.
    """

    def __init__(self, first_id: int, *, grace: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.first_id = first_id
        self.grace = grace
        self._clock = clock
        self._reserved: dict[int, tuple[int, float]] = {}  # block id -> (inode, reserved at)
        self._expired: OrderedDict[int, int] = OrderedDict()  # block id -> inode, oldest first

    def __contains__(self, block_id: object) -> bool:
        """Whether ``block_id`` is being written (not an orphan, whatever a worker reports)."""
        return block_id in self._reserved

    def __len__(self) -> int:
        return len(self._reserved)

    def owner(self, block_id: int) -> int | None:
        """The inode ``block_id`` is reserved for, or None."""
        entry = self._reserved.get(block_id)
        return entry[0] if entry else None

    def reserve(self, block_id: int, inode: int) -> None:
        """Reserve a freshly issued ``block_id`` for a writer of ``inode``."""
        self._reserved[block_id] = (inode, self._clock())

    def forget(self, block_id: int) -> None:
        """Drop a reservation whose block will never be written (a placement that failed)."""
        self._reserved.pop(block_id, None)

    def check(self, block_id: int, inode: int) -> None:
        """A commit of ``inode`` may adopt ``block_id`` (not yet the file's) only if reserved for it.

        Raises:
            Conflict: the block is not reserved for this file: it was allocated before this master
                started, its reservation expired, it is reserved for another inode, or another
                writer's commit replaced it; the message says which. Nothing was committed.
        """
        owner = self.owner(block_id)
        if owner == inode:
            return
        if owner is not None:
            raise E.Conflict(
                f"inode {inode}: block {block_id} was allocated for inode {owner}, not for this file;"
                " this version was not committed"
            )
        if block_id < self.first_id:
            raise E.Conflict(
                f"inode {inode}: block {block_id} was allocated before the master restarted; a master forgets"
                " blocks allocated and not yet committed when it restarts, so this version was not committed"
                " (write the file again)"
            )
        if block_id in self._expired:
            raise E.Conflict(
                f"inode {inode}: the allocation of block {block_id} expired ({self.grace:.0f} s without a commit,"
                " master.orphan_grace); this version was not committed"
            )
        raise E.Conflict(
            f"inode {inode} changed since this writer opened it (block {block_id} is no longer its own):"
            " another writer committed first; this version was not committed"
        )

    def commit(self, block_ids: Iterable[int]) -> None:
        """End the reservations of blocks a commit adopted."""
        for block_id in block_ids:
            self._reserved.pop(block_id, None)

    def expire(self) -> list[int]:
        """End reservations older than ``grace`` seconds; returns their block ids."""
        horizon = self._clock() - self.grace
        gone = [b for b, (_ino, when) in self._reserved.items() if when < horizon]
        for block_id in gone:
            inode, _ = self._reserved.pop(block_id)
            self._expired[block_id] = inode
        while len(self._expired) > EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)
        return gone
