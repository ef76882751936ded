"""Blocks allocated to writers and not yet committed (the master's in-flight write state).

A writer asks the master for a block id (``AllocateBlock``), stores the block on its pipeline of
workers, and names the id in its ``CommitFile``. Between the two the id is *reserved* here: the
reservation is what lets the commit adopt the block, and what keeps a worker's report of the
block from being taken for an orphan and deleted (HDFS keeps "under construction" blocks in its
block map likewise). A reservation ends with the commit, with the rollback of a failed placement,
or after ``grace`` seconds without a commit (the writer died; its replicas become orphans).

Reservations are stored in the metastore (``a<block:8> -> <inode:8><reserved at:8><bytes:8><tenant>``,
wall-clock seconds; ``bytes`` is what the block may hold, counted against the tenant's byte quota
until the commit, :mod:`.tenants`), so they survive a master restart and are replicated to the follower like every other
mutation: a writer whose file is open across a failover commits it on the new leader.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from pcache.common import errors as E
from pcache.master.metastore import MetaStore

EXPIRED_REMEMBERED = 100_000  # expired ids kept to explain a late commit
PREFIX = b"a"
_U64 = struct.Struct(">Q")
_RECORD = struct.Struct(">Qd")  # inode, reserved at
_QUOTA = struct.Struct(">Q")  # bytes reserved; the tenant's name follows


def _key(block_id: int) -> bytes:
    return PREFIX + _U64.pack(block_id)


class Allocations:
    """Reservations of block ids for writers of inodes: reserve, commit, forget, expire.

    ``issued()`` is the next block id the master would hand out (ids at or above it were never
    allocated); ``grace`` is how long, in seconds, a reservation waits for its commit; ``clock``
    gives wall-clock seconds (reservations outlive the process).
    """

    def __init__(
        self,
        store: MetaStore,
        issued: Callable[[], int],
        *,
        grace: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.issued = issued
        self.grace = grace
        self._clock = clock
        self._reserved: dict[int, tuple[int, float]] = {}  # block id -> (inode, reserved at)
        self._quota: dict[int, tuple[str, int]] = {}  # block id -> (tenant, bytes reserved: the block's length)
        self._by_tenant: dict[str, int] = {}  # tenant -> bytes reserved
        for key, value in store.scan(PREFIX):
            if len(key) == len(PREFIX) + 8:
                block_id = _U64.unpack(key[1:])[0]
                self._reserved[block_id] = _RECORD.unpack_from(value)
                if len(value) >= _RECORD.size + _QUOTA.size:
                    nbytes = _QUOTA.unpack_from(value, _RECORD.size)[0]
                    self._hold(block_id, value[_RECORD.size + _QUOTA.size :].decode(), nbytes)
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

    def reserved_bytes(self, tenant: str) -> int:
        """Bytes reserved by ``tenant``'s uncommitted blocks."""
        return self._by_tenant.get(tenant, 0)

    def _hold(self, block_id: int, tenant: str, nbytes: int) -> None:
        if nbytes:
            self._quota[block_id] = (tenant, nbytes)  # the length is checked at the commit
        if tenant and nbytes:
            self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + nbytes

    def _end(self, block_id: int) -> None:
        self._reserved.pop(block_id, None)
        tenant, nbytes = self._quota.pop(block_id, ("", 0))
        if tenant:
            left = self._by_tenant.get(tenant, 0) - nbytes
            if left > 0:
                self._by_tenant[tenant] = left
            else:
                self._by_tenant.pop(tenant, None)

    def reserve(self, block_id: int, inode: int, tenant: str = "", nbytes: int = 0) -> None:
        """Reserve a freshly issued ``block_id`` for a writer of ``inode``, holding ``nbytes`` of
        ``tenant``'s byte quota until the commit (one metastore write)."""
        entry = (inode, self._clock())
        record = _RECORD.pack(*entry) + _QUOTA.pack(nbytes) + tenant.encode()
        self.store.write([(_key(block_id), record)])
        self._reserved[block_id] = entry
        self._hold(block_id, tenant, nbytes)

    def forget(self, block_id: int) -> None:
        """Drop a reservation whose block will never be written (a placement that failed)."""
        if block_id in self._reserved:
            self.store.write(deletes=[_key(block_id)])
            self._end(block_id)

    def abandon(self, inode: int, block_ids: Iterable[int]) -> list[int]:
        """End the reservations among ``block_ids`` held for ``inode`` (a writer gave them up:
        one metastore write); returns their ids. Ids reserved for another inode, or for none,
        are left alone."""
        mine = sorted({b for b in block_ids if self.owner(b) == inode})
        if mine:
            self.store.write(deletes=[_key(b) for b in mine])
            for block_id in mine:
                self._end(block_id)
        return mine

    def check(self, block_id: int, inode: int, length: int | None = None) -> None:
        """A commit of ``inode`` may adopt ``block_id`` (not yet the file's) only if reserved for it,
        and (``length`` given) only with the length it was allocated for: the byte count the
        block token let the writer store, and the tenant's quota is charged.

        Raises:
            Conflict: the block is not reserved for this file: it is reserved for another inode,
                its reservation expired, it was never allocated, or it was committed before and
                has been replaced since; the message says which. Nothing was committed.
            InvalidArgument: another length than the allocation's.
        """
        owner = self.owner(block_id)
        if owner == inode:
            held = self._quota.get(block_id, ("", 0))[1]
            if length is not None and held and length != held:
                raise E.InvalidArgument(
                    f"inode {inode}: block {block_id} was allocated for {held} bytes, not {length};"
                    " this version was not committed"
                )
            return
        if owner is not None:
            raise E.Conflict(
                f"inode {inode}: block {block_id} was allocated for inode {owner}, not for this file;"
                " this version was not committed"
            )
        if block_id in self._expired:
            raise E.Conflict(
                f"inode {inode}: the allocation of block {block_id} expired ({self.grace:.0f} s without a commit,"
                " master.orphan_grace); this version was not committed"
            )
        if block_id >= self.issued():
            raise E.Conflict(
                f"inode {inode}: block {block_id} was never allocated by this master (it has issued ids below"
                f" {self.issued()} only); this version was not committed"
            )
        raise E.Conflict(
            f"inode {inode}: the master holds no allocation of block {block_id}: the block was committed before and"
            " has since been replaced (another writer committed first), or its allocation expired or was released;"
            " this version was not committed"
        )

    def of_tenant(self, tenant: str) -> list[int]:
        """Block ids reserved by ``tenant``'s writers."""
        return [b for b, (owner, _) in self._quota.items() if owner == tenant and b in self._reserved]

    def keys(self, block_ids: Iterable[int]) -> list[bytes]:
        """Metastore keys of the reservations among ``block_ids`` (a commit deletes them in its batch)."""
        return [_key(b) for b in block_ids if b in self._reserved]

    def committed(self, block_ids: Iterable[int]) -> None:
        """Forget the reservations a commit adopted (their keys went in the commit's batch)."""
        for block_id in block_ids:
            self._end(block_id)

    def expire(self) -> list[int]:
        """End reservations older than ``grace`` seconds; returns their block ids."""
        horizon = self._clock() - self.grace
        gone = [b for b, (_ino, when) in self._reserved.items() if when < horizon]
        if gone:
            self.store.write(deletes=[_key(b) for b in gone])
        for block_id in gone:
            self._expired[block_id] = self._reserved[block_id][0]
            self._end(block_id)
        while len(self._expired) > EXPIRED_REMEMBERED:
            self._expired.popitem(last=False)
        return gone
