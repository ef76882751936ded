"""Block map upkeep: replica locations, re-replication, deletion, repair.

The stored ``BlockMeta.replicas`` is the last known replica set; this module
keeps the live one in memory (``locations``), feeds workers their DELETE and
REPLICATE commands through heartbeat replies (HDFS DataNode commands), and
tracks under-replicated blocks incrementally so that a scan costs the number
of under-replicated blocks, not the number of blocks.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from pcache.common import errors as E
from pcache.common.layout import HOLE
from pcache.common.metrics import (
    MASTER_BAD_REPLICAS,
    MASTER_EVICTED_BLOCKS,
    MASTER_EVICTED_BYTES,
    MASTER_FAILED_REPLICATIONS,
    MASTER_LOST_REPLICAS,
)
from pcache.master.namespace import Freed, Namespace
from pcache.master.registry import WorkerRegistry, WorkerState
from pcache.proto import pcache_pb2 as pb

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watermarks:
    """When clean blocks of bound files are evicted: a worker, or the cluster as a whole, filled
    above ``high`` (a fraction of its capacity) is brought down to ``low`` (Alluxio's
    ``alluxio.worker.tieredstore.level0.watermark.{high,low}.ratio``). ``settle`` seconds: how long
    an eviction takes to show in the workers' heartbeats (none evicted again from them meanwhile).
    """

    high: float = 0.9
    low: float = 0.8
    settle: float = 3.0

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high <= 1:
            raise E.InvalidArgument(
                f"cache watermarks must be 0 <= low <= high <= 1, got low {self.low:g}, high {self.high:g}"
            )


class BlockManager:
    """Replica bookkeeping for committed blocks."""

    def __init__(
        self,
        ns: Namespace,
        registry: WorkerRegistry,
        *,
        replication_timeout: float,
        watermarks: Watermarks | None = None,
        write_token_ttl: float = 600.0,
    ) -> None:
        self.ns = ns
        self.registry = registry
        self.replication_timeout = replication_timeout
        self.write_token_ttl = write_token_ttl  # the longest a write token lives (see ``freed``)
        self.watermarks = watermarks or Watermarks()
        self.locations: dict[int, set[str]] = {}
        self.target: dict[int, int] = {}
        self.by_worker: dict[str, set[int]] = {}
        self.under: set[int] = set()
        self.inflight: dict[int, float] = {}  # block -> time a REPLICATE was issued
        self.issued: dict[int, tuple[str, tuple[str, ...]]] = {}  # block -> (source, pipeline) of it
        # block -> {worker: until}: targets a REPLICATE of the block failed to reach lately, left
        # out of the next choices for ``replication_timeout`` seconds
        self.avoid: dict[int, dict[str, float]] = {}
        # worker -> (until, copies, last error): copies to it failed lately; chosen as a target
        # only when no other worker can take the block (a worker that heartbeats but cannot be
        # reached for data, or stalls, would otherwise take and time out copy after copy)
        self.failing: dict[str, tuple[float, int, str]] = {}
        self.without_target: set[int] = set()  # under-replicated blocks the last pass found no target for
        # block -> workers that held a copy when they died, until the block has its replicas back:
        # which workers to bring back for a missing block (`pcache fsck`)
        self.died_with: dict[int, set[str]] = {}
        # block -> workers holding a copy that failed its CRC. Kept (evidence, and often mostly
        # good: `pcache fsck --salvage` reads its good chunks), never served, and deleted only once
        # good replicas are back (HDFS likewise never deletes the last replica, even corrupt).
        self.quarantined: dict[int, set[str]] = {}
        self.corrupt: dict[int, set[str]] = {}  # block -> workers told to delete a bad copy
        # bound files' blocks: with no copy they are not missing, only not cached (fetched on a read)
        self.ufs: set[int] = set()
        # bound files' blocks with a copy in the cache, least recently used first: what eviction
        # takes (a block is clean: the under-store has its bytes); a layout moves a file's to the end
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.lengths: dict[int, int] = {}  # block -> bytes, for the blocks in ``lru``
        self.evicted_blocks = self.evicted_bytes = 0
        self._settling: dict[str, float] = {}  # worker -> time.monotonic() its evictions show by
        for meta in ns.iter_blocks():
            self._track(meta.block_id, set(meta.replicas), meta.replication or 1)
            if meta.ufs:
                self.ufs.add(meta.block_id)
                if meta.replicas:
                    self._cached(meta.block_id, meta.length)
            if meta.quarantined:
                self.quarantined[meta.block_id] = set(meta.quarantined)
        # until workers report in, every replica is unconfirmed
        self.under.update(self.locations)

    def confirm_known(self) -> None:
        """Confirm the replicas held by workers already alive in the registry.

        A follower that takes over has heard every worker's heartbeats, and its metastore holds
        the leader's last replica sets: no block report is needed before it can serve reads.
        """
        for block_id in list(self.under):
            self._check(block_id)

    def _track(self, block_id: int, replicas: set[str], target: int) -> None:
        self.locations[block_id] = replicas
        self.target[block_id] = target
        for wid in replicas:
            self.by_worker.setdefault(wid, set()).add(block_id)

    def allocate(self, inode: int, size: int, *, client_node: str, exclude: Iterable[str] = ()) -> pb.BlockLocation:
        """Issue a block id for a writer of ``inode`` and choose its pipeline of workers.

        ``size`` is the block's exact length in bytes (0: the file's block size): the block token
        allows a write of that many bytes and the commit must name that length. Placement is
        the registry's (local worker first, then by load and free space; ``exclude`` left out).
        The id stays reserved until the writer commits it (:class:`Allocations`).

        Raises:
            Unavailable: no live worker. NoSpace: no worker has ``size`` bytes free (nothing
            stays reserved). NotFound, IsADirectory: no such regular file. InvalidArgument:
            ``size`` larger than the file's block size. QuotaExceeded: no room in the tenant's quota.
        """
        alive = self.registry.alive()
        if not alive:
            raise E.Unavailable("no live worker to place a block on")
        block_id, node, size = self.ns.allocate_block(inode, size)
        count = max(1, min(node.replication or 1, len(alive)))
        targets = self.registry.choose(count, size=size, client_node=client_node, exclude=list(exclude))
        if not targets and self.make_room(size, count):  # a full cache: clean blocks make way
            targets = self.registry.choose(count, size=size, client_node=client_node, exclude=list(exclude))
        if not targets:
            self.ns.allocations.forget(block_id)
            raise E.NoSpace(f"no worker has {size} bytes free for a new block")
        return pb.BlockLocation(block_id=block_id, length=size, replicas=[t.info.addr for t in targets])

    def live_replicas(self, block_id: int) -> list[WorkerState]:
        """Alive workers holding a good copy of ``block_id``."""
        return self._alive(self.locations.get(block_id, ()))

    def quarantined_live(self, block_id: int) -> list[WorkerState]:
        """Alive workers holding a quarantined copy of ``block_id``."""
        return self._alive(self.quarantined.get(block_id, ()))

    def _alive(self, worker_ids: Iterable[str]) -> list[WorkerState]:
        return [s for s in (self.registry.get_alive(w) for w in worker_ids) if s is not None]

    # ----------------------------------------------------------- events --

    def committed(self, metas: list[pb.CommittedBlock], replication: int) -> None:
        """A file commit made these blocks part of the namespace."""
        for blk in metas:
            if blk.block_id == HOLE or blk.block_id in self.locations:
                continue
            self._track(blk.block_id, set(blk.replicas), replication)
            # count live holders: a replica's worker may have died (and been handled) before the commit
            if len(self.live_replicas(blk.block_id)) < replication:
                self.under.add(blk.block_id)

    def tracked_ufs(self, metas: list[pb.BlockMeta]) -> None:
        """A bound file's block records were made (:meth:`Namespace.ufs_blocks`): none cached yet."""
        for meta in metas:
            self._track(meta.block_id, set(), meta.replication or 1)
            self.ufs.add(meta.block_id)

    def fetcher(self, block_id: int, exclude: Collection[str] = ()) -> WorkerState:
        """The worker that fetches an uncached block of a bound file: one per block (every reader
        of it is sent there, and shares its one fetch), spread over the live workers but those
        in ``exclude`` (worker ids a caller found down before the master declared them dead).

        Raises:
            Unavailable: no live worker (but the excluded ones).
        """
        alive = sorted(
            (w for w in self.registry.alive() if w.info.addr.worker_id not in exclude),
            key=lambda w: w.info.addr.worker_id,
        )
        if not alive:
            but = f" but {', '.join(sorted(exclude))}" if exclude else ""
            raise E.Unavailable(f"no live worker{but} to fetch a block from the under-store")
        return alive[block_id % len(alive)]

    def fetched(self, worker_id: str, block_id: int, length: int, crc: int) -> None:
        """A worker stored a bound file's block it fetched, with this length and CRC32C. A copy that
        disagrees with the block's record (another length, or another CRC than the first copy's)
        is deleted, not served."""
        meta = self.ns.get_block(block_id)
        if meta is None or not meta.ufs or block_id not in self.locations:
            self._command(worker_id, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
            return
        if length != meta.length or (meta.crc32c and crc != meta.crc32c):
            logger.warning("block %d fetched by %s: %d bytes, CRC %08x; the record says %d, %08x: dropped",
                           block_id, worker_id, length, crc, meta.length, meta.crc32c)  # fmt: skip
            self._command(worker_id, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
            return
        self.ns.set_block_crc(block_id, crc)
        state = self.registry.workers.get(worker_id)
        if state is not None:  # evicted a moment ago and still there (pcache free, then load): kept
            state.commands = [
                c for c in state.commands if not (c.kind == pb.WorkerCommand.DELETE and c.block_id == block_id)
            ]
        self._add_replica(worker_id, block_id)
        self._check(block_id)
        self._cached(block_id, length)
        if len(self.live_replicas(block_id)) < self.target.get(block_id, 1):
            self.under.add(block_id)  # copied to ``replication`` workers, as every block

    def abandoned(self, block_ids: list[int]) -> None:
        """Blocks a writer gave up before committing them (their reservations ended): every
        worker deletes them, and refuses a write of the ids while a write token of them may
        still be valid. Every one: the master keeps no record of where an allocation went (and
        a new leader would have none), and the writer is not trusted to say."""
        for block_id in block_ids:
            for wid in self.registry.workers:
                self._delete_refusing(wid, block_id)

    def _delete_refusing(self, worker_id: str, block_id: int) -> None:
        """Have a worker delete ``block_id`` and refuse writes of it while a write token of it
        may still be valid (a block token cannot be revoked)."""
        self._command(
            worker_id,
            pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id, refuse_writes_s=self.write_token_ttl),
        )

    def freed(self, freed: Freed) -> None:
        """Blocks dropped from the namespace: delete every replica, and have its holders refuse
        writes of the id while a write token of it may still be valid (a block token cannot be
        revoked: replayed after the delete, it stored the block again, charged to nobody)."""
        for meta in freed.blocks:
            self.ufs.discard(meta.block_id)
            self._uncached(meta.block_id)
            replicas = self.locations.pop(meta.block_id, set(meta.replicas))
            self.target.pop(meta.block_id, None)
            self.under.discard(meta.block_id)
            self._settle(meta.block_id)
            self.avoid.pop(meta.block_id, None)
            self.died_with.pop(meta.block_id, None)
            self.corrupt.pop(meta.block_id, None)
            replicas |= self.quarantined.pop(meta.block_id, set())  # the file is gone: so is the evidence
            for wid in replicas:
                self.by_worker.get(wid, set()).discard(meta.block_id)
                self._delete_refusing(wid, meta.block_id)
        gone = {meta.block_id for meta in freed.blocks}
        for state in self.registry.workers.values():  # copies not asked for yet are not asked for at all
            if any(c.kind == pb.WorkerCommand.REPLICATE and c.block_id in gone for c in state.commands):
                state.commands = [
                    c for c in state.commands if not (c.kind == pb.WorkerCommand.REPLICATE and c.block_id in gone)
                ]

    def worker_registered(self, worker_id: str, reported: list[int]) -> None:
        """Reconcile a full block report: adopt known blocks, delete orphans."""
        self.failing.pop(worker_id, None)  # (re)started: a fresh chance as a target
        for block_id in [b for b, wids in self.died_with.items() if worker_id in wids]:
            self._forget_death(block_id, worker_id)
        have = set(reported)
        for block_id in have:
            if worker_id in self.quarantined.get(block_id, ()):
                continue  # its bad copy stays out of service
            if block_id in self.locations:
                if worker_id not in self.locations[block_id]:
                    self.locations[block_id].add(worker_id)
                    self.by_worker.setdefault(worker_id, set()).add(block_id)
                    self._persist(block_id)
                    if block_id in self.ufs and block_id not in self.lru:
                        meta = self.ns.get_block(block_id)
                        self._cached(block_id, meta.length if meta else 0)
                self._check(block_id)
            elif block_id not in self.ns.allocations:
                self._command(worker_id, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
        for block_id in list(self.by_worker.get(worker_id, ())):
            if block_id not in have:
                self._drop_replica(block_id, worker_id)
        for block_id, holders in list(self.quarantined.items()):
            if worker_id in holders and block_id not in have:
                self._unquarantine(block_id, worker_id)

    def lost(self, worker_id: str, block_ids: list[int]) -> None:
        """A worker found these block files gone (incremental report): re-replicate from others."""
        for block_id in block_ids:
            if worker_id in self.locations.get(block_id, ()):
                logger.warning("block %d: the copy on %s is lost; repairing", block_id, worker_id)
                MASTER_LOST_REPLICAS.inc()
                self._drop_replica(block_id, worker_id)
            if worker_id in self.quarantined.get(block_id, ()):
                self._unquarantine(block_id, worker_id)

    def worker_died(self, worker_id: str) -> None:
        """Forget every replica on a dead worker; its blocks become under-replicated."""
        held = list(self.by_worker.get(worker_id, ()))
        for block_id in held:
            self._drop_replica(block_id, worker_id)
            self.died_with.setdefault(block_id, set()).add(worker_id)
        now = time.monotonic()
        for block_id, (source, targets) in list(self.issued.items()):
            if worker_id != source and worker_id not in targets:
                continue
            self._settle(block_id)  # that copy will not come: choose again
            if worker_id != source:  # the pipeline's targets before the dead one may still get theirs
                for wid in targets[: targets.index(worker_id)]:
                    self.avoid.setdefault(block_id, {})[wid] = now + self.replication_timeout
        logger.warning(
            "worker %s is dead: %d blocks lost a copy; %d under-replicated, %d missing in all",
            worker_id, len(held), self.under_replicated(), self.missing(),
        )  # fmt: skip

    def replication_failed(self, worker_id: str, block_id: int, targets: list[str], error: str = "") -> None:
        """A REPLICATE sent to ``worker_id`` did not reach ``targets`` (worker ids; its other
        targets reported their copies): issue it again at the next pass, to other workers, rather
        than after ``replication_timeout`` seconds, which is how long a block can otherwise stay
        one failure away from loss. A report about an older command than the block's last one
        only marks the targets to avoid. (HDFS leaves a failed transfer to the NameNode's pending
        timeout; its DataNode reports only a missing source replica, as :meth:`lost` does here.)"""
        if block_id not in self.locations:
            return
        MASTER_FAILED_REPLICATIONS.inc(max(1, len(targets)))
        now = time.monotonic()
        for wid in targets:
            self.avoid.setdefault(block_id, {})[wid] = now + self.replication_timeout
            _, copies, _ = self.failing.get(wid, (0.0, 0, ""))
            self.failing[wid] = (now + self.replication_timeout, copies + 1, error)
        logger.warning(
            "block %d: re-replication from %s to %s failed (%s); choosing again",
            block_id, worker_id, ",".join(targets) or "-", error or "no reason given",
        )  # fmt: skip
        source, sent_to = self.issued.get(block_id, ("", ()))
        if source == worker_id and set(targets) <= set(sent_to):
            self._settle(block_id)
        if len(self.live_replicas(block_id)) < self.target.get(block_id, 1):
            self.under.add(block_id)

    def failing_targets(self, now: float | None = None) -> dict[str, tuple[int, str]]:
        """Workers copies failed to lately: worker id -> (failed copies, the last error)."""
        now = time.monotonic() if now is None else now
        for wid in [w for w, (until, _, _) in self.failing.items() if until <= now]:
            del self.failing[wid]
        return {wid: (copies, error) for wid, (_, copies, error) in self.failing.items()}

    def _forget_death(self, block_id: int, worker_id: str) -> None:
        """Drop ``worker_id`` from the block's dead holders (it is back)."""
        wids = self.died_with.get(block_id)
        if wids is not None:
            wids.discard(worker_id)
            if not wids:
                del self.died_with[block_id]

    def _settle(self, block_id: int) -> None:
        """The block's REPLICATE (if any) is over: stored, failed, or no longer needed."""
        self.inflight.pop(block_id, None)
        self.issued.pop(block_id, None)

    def _avoided(self, block_id: int, now: float) -> list[str]:
        """Targets a REPLICATE of this block failed to reach less than ``replication_timeout`` ago."""
        avoid = self.avoid.get(block_id)
        if not avoid:
            return []
        for wid in [w for w, until in avoid.items() if until <= now]:
            del avoid[wid]
        if not avoid:
            del self.avoid[block_id]
        return list(avoid)

    def block_received(self, worker_id: str, block_id: int) -> None:
        """A worker stored a copy made by re-replication. A copy of a bound file's block that
        was evicted meanwhile (no copy left: the REPLICATE was sent before the eviction or
        ``pcache free``) is deleted: only a fetch brings an evicted block back
        (:meth:`fetched`)."""
        if block_id not in self.locations or (block_id in self.ufs and not self.locations[block_id]):
            self._settle(block_id)
            self._command(worker_id, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
            return
        self._add_replica(worker_id, block_id)
        self._check(block_id)

    def _add_replica(self, worker_id: str, block_id: int) -> None:
        self.locations[block_id].add(worker_id)
        self.by_worker.setdefault(worker_id, set()).add(block_id)
        self._settle(block_id)
        self._persist(block_id)

    def bad_block(self, worker_id: str, block_id: int) -> None:
        """A replica failed its CRC: quarantine it (out of service, kept) and re-replicate from a
        good one; the bad copy is deleted once the block has its good replicas back."""
        if block_id not in self.locations:
            if block_id not in self.ns.allocations:  # no file has it: an orphan
                self._command(worker_id, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
            return
        if worker_id in self.quarantined.get(block_id, ()):
            return
        logger.warning("corrupt replica of block %d on %s: quarantined; repairing", block_id, worker_id)
        MASTER_BAD_REPLICAS.inc()
        self.locations[block_id].discard(worker_id)
        self.by_worker.get(worker_id, set()).discard(block_id)
        self.quarantined.setdefault(block_id, set()).add(worker_id)
        self.under.add(block_id)
        self._persist(block_id)
        if not self.live_replicas(block_id):
            logger.error("block %d has no good replica left: its copies are kept for salvage", block_id)
        self._check(block_id)

    def _unquarantine(self, block_id: int, worker_id: str) -> None:
        holders = self.quarantined.get(block_id, set())
        holders.discard(worker_id)
        if not holders:
            self.quarantined.pop(block_id, None)
        self._persist(block_id)

    def _release_quarantine(self, block_id: int) -> None:
        """Delete the bad copies of a block that has good replicas again."""
        for wid in self.quarantined.pop(block_id, set()):
            self.corrupt.setdefault(block_id, set()).add(wid)
            self._command(wid, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
        self._persist(block_id)

    # --------------------------------------------------------- eviction --

    def touch(self, block_ids: Iterable[int]) -> None:
        """A reader asked for these blocks' layout: they become the most recently used."""
        for block_id in block_ids:
            if block_id in self.lru:
                self.lru.move_to_end(block_id)

    def _cached(self, block_id: int, length: int) -> None:
        self.lru[block_id] = None
        self.lru.move_to_end(block_id)
        self.lengths[block_id] = length

    def _uncached(self, block_id: int) -> None:
        self.lru.pop(block_id, None)
        self.lengths.pop(block_id, None)

    def evictable(self) -> int:
        """Blocks of bound files with a copy in the cache (clean: evicted under pressure)."""
        return len(self.lru)

    def _evict(self, block_id: int, *, tell: bool = True, skip: str = "") -> dict[str, int]:
        """Forget every copy of a clean block (a read fetches it again) and queue their DELETEs
        (``tell``; none to ``skip``, which deletes its own). Returns bytes freed per worker."""
        length = self.lengths.get(block_id, 0)
        holders = self.locations.get(block_id, set())
        freed = dict.fromkeys(holders, length)
        for wid in holders:
            self.by_worker.get(wid, set()).discard(block_id)
            if tell and wid != skip:
                self._command(wid, pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=block_id))
        self.locations[block_id] = set()
        self.under.discard(block_id)
        self._settle(block_id)
        self._uncached(block_id)
        self._persist(block_id)
        self.evicted_blocks += 1
        self.evicted_bytes += length
        MASTER_EVICTED_BLOCKS.inc()
        MASTER_EVICTED_BYTES.inc(length)
        return freed

    def evict_block(self, block_id: int) -> int | None:
        """Evict a cached clean block now (``pcache free``); returns its bytes, None when it is
        not one (not a bound file's, not cached, or not yet persisted)."""
        if block_id not in self.lru:
            return None
        length = self.lengths.get(block_id, 0)
        self._evict(block_id)
        return length

    def evict(self) -> int:
        """One pass of eviction under capacity pressure; returns the blocks evicted.

        Every live worker filled above the high watermark, and the cluster as a whole when its
        sum is, is brought down to the low one by evicting clean blocks of bound files, least
        recently used first (all copies of a block go together: a block is cached or not, never
        re-replicated after an eviction). Blocks of files not yet persisted are never in the
        LRU list, so they are never evicted. Workers evicted from wait ``settle`` seconds for
        their heartbeats to show it.
        """
        mark = self.watermarks
        now = time.monotonic()
        alive = [
            w for w in self.registry.alive() if w.info.capacity_bytes and self._settling.get(w.worker_id, 0) <= now
        ]
        if not self.lru or not alive:
            return 0
        used = {w.worker_id: w.info.capacity_bytes - w.info.free_bytes for w in alive}
        need = {
            w.worker_id: used[w.worker_id] - int(mark.low * w.info.capacity_bytes)
            for w in alive
            if used[w.worker_id] > mark.high * w.info.capacity_bytes
        }
        capacity = sum(w.info.capacity_bytes for w in alive)
        total = sum(used.values())
        cluster_need = total - int(mark.low * capacity) if total > mark.high * capacity else 0
        if not need and cluster_need <= 0:
            return 0
        count = 0
        for block_id in list(self.lru):
            if cluster_need <= 0 and not any(n > 0 for n in need.values()):
                break
            holders = self.locations.get(block_id, set())
            if cluster_need <= 0 and not any(need.get(w, 0) > 0 for w in holders):
                continue
            for wid, nbytes in self._evict(block_id).items():
                cluster_need -= nbytes
                if wid in need:
                    need[wid] -= nbytes
                self._settling[wid] = now + mark.settle
            count += 1
        if count:
            logger.info("evicted %d clean blocks of bound files (cache above its high watermark)", count)
        return count

    def release_space(self, worker_id: str, nbytes: int, keep: int) -> tuple[list[int], int]:
        """Make ``nbytes`` of room on a worker that must store a block (``keep``) now: the DELETEs
        still queued for it, then its least recently used clean blocks, all copies of each.
        Returns the blocks it is to delete itself and their bytes (short when too little here is
        clean: the worker's write then fails with NoSpace, as before).
        """
        state = self.registry.workers.get(worker_id)
        evict: list[int] = []
        if state is not None:  # already forgotten, only waiting for its next heartbeat
            queued = [c for c in state.commands if c.kind == pb.WorkerCommand.DELETE]
            state.commands = [c for c in state.commands if c.kind != pb.WorkerCommand.DELETE]
            evict = [c.block_id for c in queued]
        freed = 0
        for block_id in list(self.lru):
            if freed >= nbytes:
                break
            if block_id == keep or worker_id not in self.locations.get(block_id, ()):
                continue
            freed += self._evict(block_id, skip=worker_id).get(worker_id, 0)
            evict.append(block_id)
        return evict, freed

    def make_room(self, size: int, count: int) -> int:
        """No worker has ``size`` bytes free for a new block: evict least recently used clean blocks
        until ``count`` workers will have (their DELETEs reach them with the next heartbeats, and a
        write that comes first asks for them itself, :meth:`release_space`). Returns bytes evicted."""
        alive = {w.worker_id: w for w in self.registry.alive() if not w.info.draining}
        short = {wid: size - w.free for wid, w in alive.items() if w.free < size}
        roomy = len(alive) - len(short)
        evicted = 0
        for block_id in list(self.lru):
            if roomy >= count:
                break
            if not any(w in short for w in self.locations.get(block_id, ())):
                continue
            for wid, nbytes in self._evict(block_id).items():
                evicted += nbytes
                if wid in alive:
                    alive[wid].release(nbytes, self.watermarks.settle)
                if wid in short:
                    short[wid] -= nbytes
                    if short[wid] <= 0:
                        del short[wid]
                        roomy += 1
        return evicted

    # ------------------------------------------------------------- work --

    def schedule(self) -> int:
        """Issue REPLICATE commands for under-replicated blocks; returns how many."""
        issued = 0
        now = time.monotonic()
        alive = len(self.registry.alive())
        failing = list(self.failing_targets(now))
        self.without_target.clear()
        for block_id in list(self.under):
            if block_id not in self.locations:
                self.under.discard(block_id)
                self.avoid.pop(block_id, None)
                self.died_with.pop(block_id, None)
                continue
            live = self.live_replicas(block_id)
            want = min(self.target.get(block_id, 1), alive)
            if len(live) >= want:
                if len(live) >= self.target.get(block_id, 1):
                    self.under.discard(block_id)
                    self.avoid.pop(block_id, None)
                    self.died_with.pop(block_id, None)
                continue
            if not live:
                if block_id in self.ufs:  # a bound file's, not cached: fetched again when read
                    self.under.discard(block_id)
                continue  # missing: nothing to copy from until a holder returns
            started = self.inflight.get(block_id)
            if started is not None and now - started < self.replication_timeout:
                continue
            meta = self.ns.get_block(block_id)
            size = meta.length if meta else 0
            holders = [w.worker_id for w in live] + list(self.locations[block_id])
            bad = list(self.quarantined.get(block_id, ()))
            # not the workers a copy of it failed to reach lately (with no other, it waits for them)
            avoided = self._avoided(block_id, now)
            exclude = holders + bad + self._deleting(block_id) + avoided
            targets = self.registry.choose(want - len(live), size=size, exclude=exclude + failing)
            if not targets and failing:  # only workers copies failed to lately: try them
                targets = self.registry.choose(want - len(live), size=size, exclude=exclude)
            if not targets:
                if bad and not avoided:  # only the bad copies' workers could take it: replace those copies
                    self._release_quarantine(block_id)
                self.without_target.add(block_id)
                continue
            source = min(live, key=lambda w: w.load())
            source.commands.append(
                pb.WorkerCommand(
                    kind=pb.WorkerCommand.REPLICATE, block_id=block_id, targets=[t.info.addr for t in targets]
                )
            )
            self.inflight[block_id] = now
            self.issued[block_id] = (source.worker_id, tuple(t.worker_id for t in targets))
            issued += 1
        return issued

    def missing(self) -> int:
        """Blocks with no copy at all on a live worker (not even a quarantined one)."""
        return sum(1 for b in self.unreadable() if not self.quarantined_live(b))

    def corrupt_blocks(self) -> int:
        """Blocks with no good replica but a quarantined copy: damaged, salvageable in part."""
        return sum(1 for b in self.unreadable() if self.quarantined_live(b))

    def unreadable(self) -> list[int]:
        """Blocks of files with no good live replica (a bound file's is fetched again instead)."""
        return [b for b in self.under if b in self.locations and b not in self.ufs and not self.live_replicas(b)]

    def under_replicated(self) -> int:
        """Blocks with some but fewer good live replicas than their target (capped by the live
        workers); blocks with none are counted as missing or corrupt instead, as ``pcache fsck`` does.
        Cached blocks of bound files are not counted: the under-store holds them (a full cache
        leaves them with fewer copies, and nothing is at risk)."""
        alive = len(self.registry.alive())
        return sum(
            1 for b in self.under
            if b in self.locations and b not in self.ufs
            and 0 < len(self.live_replicas(b)) < min(self.target.get(b, 1), alive)
        )  # fmt: skip

    # ---------------------------------------------------------- helpers --

    def _drop_replica(self, block_id: int, worker_id: str) -> None:
        self.locations.get(block_id, set()).discard(worker_id)
        self.by_worker.get(worker_id, set()).discard(block_id)
        self.under.add(block_id)
        self._persist(block_id)

    def _deleting(self, block_id: int) -> list[str]:
        """Workers whose DELETE of a bad copy of ``block_id`` is still queued.

        They are no target yet: a worker runs its commands concurrently, so a DELETE
        received after the new copy arrived would drop that copy.
        """
        waiting = []
        for wid in self.corrupt.get(block_id, ()):
            state = self.registry.get_alive(wid)
            if state is not None and any(
                c.kind == pb.WorkerCommand.DELETE and c.block_id == block_id for c in state.commands
            ):
                waiting.append(wid)
        if not waiting:
            self.corrupt.pop(block_id, None)
        return waiting

    def _check(self, block_id: int) -> None:
        if len(self.live_replicas(block_id)) >= self.target.get(block_id, 1):
            self.under.discard(block_id)
            self._settle(block_id)
            self.died_with.pop(block_id, None)
            if block_id in self.quarantined:
                self._release_quarantine(block_id)

    def _persist(self, block_id: int) -> None:
        self.ns.set_replicas(
            block_id, sorted(self.locations.get(block_id, ())), sorted(self.quarantined.get(block_id, ()))
        )

    def _command(self, worker_id: str, cmd: pb.WorkerCommand) -> None:
        state = self.registry.workers.get(worker_id)
        if state is not None and state.alive:
            state.commands.append(cmd)
