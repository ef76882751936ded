"""Worker registry and load-aware placement.

Workers register, then heartbeat with capacity, free bytes and in-flight
I/O. Placement picks replica targets for a new block: never a dead, draining
or full worker; the writer's local worker first when it has room; the rest by
*power of two choices* on reported load (Mitzenmacher, "The Power of Two
Choices in Randomized Load Balancing"), preferring distinct nodes, so that
many concurrent writers do not pile onto one worker.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pcache.proto import pcache_pb2 as pb


@dataclass
class WorkerState:
    """What the master knows of one worker."""

    info: pb.WorkerInfo
    last_seen: float  # time.monotonic() of the last heartbeat
    alive: bool = True
    commands: list[pb.WorkerCommand] = field(default_factory=list)
    assigned: int = 0  # blocks placed since its last heartbeat
    reserved: int = 0  # bytes placed since its last heartbeat
    releasing: int = 0  # bytes of evicted blocks it is told to delete, not yet seen in its heartbeats
    releasing_until: float = 0.0  # time.monotonic() after which its heartbeats show them freed

    @property
    def worker_id(self) -> str:
        return self.info.addr.worker_id

    @property
    def free(self) -> int:
        releasing = self.releasing if time.monotonic() < self.releasing_until else 0
        return max(0, self.info.free_bytes + releasing - self.reserved)

    def release(self, nbytes: int, settle: float) -> None:
        """Count ``nbytes`` of evicted blocks as free for ``settle`` seconds (until its heartbeats
        report them freed): placement may aim a block at room being made."""
        now = time.monotonic()
        self.releasing = (self.releasing if now < self.releasing_until else 0) + nbytes
        self.releasing_until = now + settle

    def load(self) -> float:
        """Load score: in-flight requests plus blocks already sent its way."""
        return self.info.inflight + self.assigned


class WorkerRegistry:
    """Live view of the workers, fed by registration and heartbeats."""

    def __init__(self, dead_after: float, rng: random.Random | None = None) -> None:
        self.dead_after = dead_after
        self.workers: dict[str, WorkerState] = {}
        self._rng = rng or random.Random()

    def register(self, info: pb.WorkerInfo) -> WorkerState:
        """Add or refresh a worker from its registration."""
        state = self.workers.get(info.addr.worker_id)
        if state is None:
            state = WorkerState(info=info, last_seen=time.monotonic())
            self.workers[state.worker_id] = state
        state.info = info
        state.last_seen = time.monotonic()
        state.alive = True
        state.assigned = state.reserved = 0
        return state

    def readdress(self, commands: list[pb.WorkerCommand]) -> None:
        """Give the workers each command names (a copy's targets, an upload's block holders) the
        address they registered last: a copy queued before its target restarted on another port
        went to the old one, was refused and was chosen again (a warning and about a second, seen
        in a helper's drill)."""
        for cmd in commands:
            for addr in [*cmd.targets, *(r for b in cmd.blocks for r in b.replicas)]:
                state = self.workers.get(addr.worker_id)
                if state is not None and state.info.addr != addr:
                    addr.CopyFrom(state.info.addr)

    def heartbeat(self, info: pb.WorkerInfo) -> WorkerState | None:
        """Record a heartbeat; None when the worker must register first."""
        state = self.workers.get(info.addr.worker_id)
        if state is None or not state.alive:
            return None
        state.info = info
        state.last_seen = time.monotonic()
        state.assigned = state.reserved = 0
        return state

    def expire(self) -> list[WorkerState]:
        """Mark workers silent for ``dead_after`` seconds dead; return the newly dead."""
        now = time.monotonic()
        dead = []
        for state in self.workers.values():
            if state.alive and now - state.last_seen > self.dead_after:
                state.alive = False
                state.commands.clear()
                dead.append(state)
        return dead

    def alive(self) -> list[WorkerState]:
        """Workers currently considered alive."""
        return [w for w in self.workers.values() if w.alive]

    def get_alive(self, worker_id: str) -> WorkerState | None:
        """The live worker with this id, or None."""
        state = self.workers.get(worker_id)
        return state if state is not None and state.alive else None

    def choose(
        self,
        count: int,
        *,
        size: int,
        client_node: str = "",
        exclude: Iterable[str] = (),
    ) -> list[WorkerState]:
        """Pick up to ``count`` distinct targets for a block of ``size`` bytes.

        Returns fewer than ``count`` (possibly none) when not enough workers
        have room; the caller decides whether that is an error.
        """
        banned = set(exclude)
        candidates = [
            w for w in self.workers.values()
            if w.alive and not w.info.draining and w.worker_id not in banned and w.free >= size
        ]  # fmt: skip
        chosen: list[WorkerState] = []
        if client_node:
            local = [w for w in candidates if w.info.addr.node_id == client_node]
            if local:
                chosen.append(self._two_choices(local))
        while len(chosen) < count:
            rest = [w for w in candidates if w not in chosen]
            if not rest:
                break
            used_nodes = {w.info.addr.node_id for w in chosen}
            other_nodes = [w for w in rest if w.info.addr.node_id not in used_nodes]
            chosen.append(self._two_choices(other_nodes or rest))
        for w in chosen[:count]:
            w.assigned += 1
            w.reserved += size
        return chosen[:count]

    def _two_choices(self, pool: list[WorkerState]) -> WorkerState:
        if len(pool) == 1:
            return pool[0]
        a, b = self._rng.sample(pool, 2)
        la, lb = a.load(), b.load()
        if la != lb:
            return a if la < lb else b
        return a if a.free >= b.free else b
