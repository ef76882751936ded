"""``CheckpointManager``: periodic DCP checkpoints in PCache, keep-last-N, async save.

The contract follows torchtitan's checkpoint manager: ``save(step, force=False)``,
``load(step=-1) -> bool``, background work stopped by an explicit ``close()``.

Layout: ``ROOT/step-00000100/`` is one DCP checkpoint (torch's file layout); it
is *complete* once its ``.metadata`` exists (written last, by rename). Loading
only ever considers complete checkpoints; incomplete ones (a crash mid-save)
are reported by :meth:`CheckpointManager.list` and removed by the next garbage
collection.

"Newest" means the last *committed* (the ``.metadata``'s time in the master), not the highest
step, as Megatron-LM's ``latest_checkpointed_iteration.txt`` names the last save: a run rolled
back to step 10 (a loss spike) that then saves 11, 12 resumes from 12 after a crash, not from the
abandoned step 20, and keep-last keeps 11 and 12, not 20.

Async mode: ``save`` copies every tensor into a staging buffer in shared host
memory (allocated once per tensor and reused, so memory stays flat across
saves), then returns; a background thread persists the staged copy with its
own gloo process group, so training collectives are not disturbed. Training
is blocked only for the copy, and in-place updates after ``save`` returns
never reach the checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from ckpt_adapter.planner import NodeAwareSavePlanner, gather_nodes
from ckpt_adapter.storage import METADATA, PCacheStorageReader, PCacheStorageWriter
from ckpt_adapter.uri import client_for, join_uri, split_uri
from pcache.common.errors import InvalidArgument, NotFound, PCacheError, Timeout, from_name

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d{8,})$")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory under the manager's root.

    ``committed``: when its ``.metadata`` was written (seconds since the epoch, the master's
    clock; 0.0 when incomplete); ``modified``: the directory's last change (seconds).
    """

    step: int
    uri: str
    complete: bool
    committed: float = 0.0
    modified: float = 0.0


class _Stager:
    """Copies a state dict into reusable shared-memory CPU buffers (one per tensor path)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def stage(self, obj: Any, path: str = "") -> Any:
        if isinstance(obj, DTensor):  # stage this rank's shard; keep mesh, placements, global shape
            local = self.stage(obj.to_local(), path + ".local")
            return DTensor.from_local(
                local, obj.device_mesh, obj.placements, run_check=False, shape=obj.shape, stride=obj.stride()
            )
        if isinstance(obj, torch.Tensor):
            buf = self._buffers.get(path)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu").share_memory_()
                self._buffers[path] = buf
            buf.copy_(obj.detach())
            return buf
        if isinstance(obj, Mapping):
            return {k: self.stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            staged = [self.stage(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            return type(obj)(staged) if isinstance(obj, tuple) else staged
        return copy.deepcopy(obj)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


class CheckpointManager:
    """Save and restore training state as DCP checkpoints under ``root`` (a ``pcache://`` URI).

    Args:
        root: ``pcache://MASTER/dir`` holding one ``step-NNNNNNNN`` directory per checkpoint.
        states: name -> a ``Stateful`` (model, optimizer, scheduler, data loader ...) or a
            plain state dict; saved under its name.
        interval: ``save(step)`` only saves when ``step % interval == 0`` (or ``force``).
        keep_last: complete checkpoints to keep (0 keeps all); older and incomplete ones are removed.
        async_mode: stage into shared memory and persist in the background.
        planner_factory: the DCP save planner (default: node-aware, Ling report §2.3.1).
        thread_count: shard-writing threads per rank.
        collective_timeout: seconds a rank waits for the others in a checkpoint's collectives
            (they run on the manager's own gloo group, never on the training's default group).

    Raises:
        InvalidArgument: ``root`` is not a ``pcache://`` URI.
    """

    def __init__(
        self,
        root: str,
        states: Mapping[str, Any],
        *,
        interval: int = 1,
        keep_last: int = 3,
        async_mode: bool = False,
        planner_factory: Callable[[], dcp.SavePlanner] = NodeAwareSavePlanner,
        thread_count: int = 1,
        collective_timeout: float = 300.0,
    ) -> None:
        self.master, self.root_path = split_uri(root)
        self.root = root.rstrip("/")
        self.states = dict(states)
        self.interval = max(1, interval)
        self.keep_last = keep_last
        self.async_mode = async_mode
        self.planner_factory = planner_factory
        self.thread_count = thread_count
        self.client = client_for(self.master)
        self._distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if self._distributed else 0
        self.collective_timeout = collective_timeout
        # the checkpoint's own group, sync or async: a save called on one rank alone must not meet
        # the other ranks' training collectives (a barrier() would match one of DCP's and hang for
        # gloo's 30-minute default); its timeout bounds every wait for a missing or dead rank
        self._pg = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=collective_timeout)) if self._distributed else None
        )
        # node ids once, here on the caller's thread: a planner gathering them on the persist
        # thread would run a collective on the default group next to the training's own
        self.nodes = gather_nodes()
        self._stager = _Stager()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-persist") if async_mode else None
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self.last_blocked_s = 0.0  # seconds the last save() held the caller
        if self._rank == 0:
            self.client.mkdir(self.root_path, parents=True)

    # ------------------------------------------------------------ naming --

    def uri_of(self, step: int) -> str:
        """The checkpoint directory URI of ``step``."""
        return join_uri(self.root, f"step-{step:08d}")

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint directory under the root, by step, complete or not.

        Raises:
            PCacheError: the listing failed (Unavailable, StoreTimeout ...).
        """
        out = []
        try:
            entries = self.client.listdir(self.root_path)
        except NotFound:
            return []
        for entry in entries:
            match = STEP_DIR.match(entry.name)
            if not match or not entry.is_dir:
                continue
            try:
                committed = self.client.stat(f"{entry.path}/{METADATA}").mtime
            except NotFound:
                committed = 0.0
            out.append(
                CheckpointInfo(
                    int(match.group(1)), join_uri(self.root, entry.name), committed > 0, committed, entry.mtime
                )
            )
        return sorted(out, key=lambda c: c.step)

    def committed(self) -> list[CheckpointInfo]:
        """The complete checkpoints, in the order they were committed (the last: the newest)."""
        return sorted((c for c in self.list() if c.complete), key=lambda c: (c.committed, c.step))

    # ------------------------------------------------------------- state --

    def _state_dict(self) -> dict[str, Any]:
        return {name: s.state_dict() if isinstance(s, Stateful) else s for name, s in self.states.items()}

    # -------------------------------------------------------------- save --

    def save(self, step: int, *, force: bool = False) -> bool:
        """Checkpoint the states as ``step`` if due (every ``interval`` steps) or ``force``.

        In async mode this returns after staging; :meth:`wait` or :meth:`close`
        waits for the persist. Returns whether a checkpoint was started.

        Raises:
            InvalidArgument: ``step`` is not an int >= 0 (``save(-1)`` made ``step--0000001``,
                which nothing would ever list, load or remove).
            PCacheError: a sync save failed, or the previous async persist did (surfaced here, its
                step named): the error of the rank that failed (``QuotaExceeded``, ``NoSpace``,
                ``Unavailable`` ...), whichever rank raises. RuntimeError: a failure that is not
                PCache's (torch's, the planner's), with its cause.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgument(f"checkpoint step {step!r}: a step is an int >= 0")
        if not force and step % self.interval != 0:
            return False
        started = time.perf_counter()
        self.wait()  # one staging buffer: the previous persist must be done before it is reused
        state = self._state_dict()
        if self.async_mode:
            staged = self._stager.stage(state)
            assert self._executor is not None
            self._pending = self._executor.submit(self._persist, staged, step)
            self.last_blocked_s = time.perf_counter() - started
            return True
        self._persist(state, step)
        self.last_blocked_s = time.perf_counter() - started
        return True

    def _persist(self, state: dict[str, Any], step: int) -> None:
        uri = self.uri_of(step)
        writer = PCacheStorageWriter(uri, thread_count=self.thread_count)
        planner = self.planner_factory()
        if isinstance(planner, NodeAwareSavePlanner):
            planner.use_nodes(self.nodes)
        self._agree("save", step)
        if self._rank == 0:  # room first: a quota full of failed saves' leftovers let none commit again
            self.collect_garbage(keep_step=step, saving=True)
        with self._unwrapped("save", step), self._bounded("save", step):
            dcp.save(state, storage_writer=writer, planner=planner, process_group=self._pg)
        logger.info("checkpoint step %d committed at %s", step, uri)
        if self._rank == 0:
            self.collect_garbage(keep_step=step)

    def _agree(self, what: str, step: int) -> int:
        """Every rank joins ``what`` for the same step, within ``collective_timeout``; returns rank 0's step.

        Raises:
            Timeout: a rank did not join (it skipped the call, died or hangs).
            InvalidArgument: the ranks asked for different steps (a save).
        """
        if self._pg is None:
            return step
        steps: list[int | None] = [None] * dist.get_world_size(self._pg)
        with self._bounded(what, step):
            dist.all_gather_object(steps, step, group=self._pg)
        if what == "save" and len(set(steps)) != 1:
            raise InvalidArgument(
                f"checkpoint save: the ranks asked for different steps {steps}; every rank saves the same step"
            )
        return int(steps[0])  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _bounded(self, what: str, step: int) -> Iterator[None]:
        try:
            yield
        except RuntimeError as exc:  # gloo: a timed-out or broken collective (DistBackendError too)
            raise Timeout(
                f"checkpoint {what} of step {step} on rank {self._rank}: a collective failed (a rank's"
                f" connection closed, or not every rank took part within {self.collective_timeout:.0f} s,"
                f" collective_timeout). Every rank must call {what}() for the same step; a rank that"
                f" skipped it, died or hangs fails the others ({exc})"
            ) from exc

    @contextlib.contextmanager
    def _unwrapped(self, what: str, step: int) -> Iterator[None]:
        """torch's ``CheckpointException`` (a ``BaseException``: ``except Exception`` missed it)
        as the failing rank's own error, this rank's first, with the step named (outside
        :meth:`_bounded`, which takes a gloo collective's own ``RuntimeError``)."""
        try:
            yield
        except CheckpointException as exc:
            failures = exc.failures
            rank = self._rank if self._rank in failures else min(failures, default=-1)
            cause = failures[rank][0] if rank in failures else exc
            where = f"checkpoint {what} of step {step} failed on rank {rank}"
            if isinstance(cause, PCacheError):
                error = from_name(type(cause).__name__, f"{where}: {cause.message}", path=cause.filename)
            else:
                error = RuntimeError(f"{where}: {cause!r}")
            raise error from cause

    def _agree_load(self, step: int, error: PCacheError | None) -> tuple[int, tuple[int, str, str] | None]:
        """Rank 0's step to load, and the first rank's listing error (rank, error name, message).

        Raises:
            Timeout: a rank did not join.
        """
        mine = (step, None if error is None else (self._rank, type(error).__name__, str(error)))
        if self._pg is None:
            return mine
        views: list[Any] = [None] * dist.get_world_size(self._pg)
        with self._bounded("load", step):
            dist.all_gather_object(views, mine, group=self._pg)
        failed = next((view[1] for view in views if view[1] is not None), None)
        return int(views[0][0]), failed

    def wait(self) -> None:
        """Block until a pending async persist is done; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def collect_garbage(self, keep_step: int | None = None, *, saving: bool = False) -> list[int]:
        """Remove checkpoints beyond the ``keep_last`` last committed ones, and incomplete ones
        last changed before the last commit (a save that died: one root has one save at a time);
        returns the removed steps. Keeping ``keep_last`` takes room for one more while a save
        runs: a quota or a cluster must hold ``keep_last + 1`` checkpoints.

        ``saving``: a save of ``keep_step`` starts now (:meth:`save` calls it so on rank 0), so
        every other incomplete checkpoint is a dead save's, however recent: a save that failed
        for want of room (``QuotaExceeded``) left one behind, no later save could commit, and
        nothing removed it (from a helper's drill)."""
        infos = self.list()
        complete = sorted((c for c in infos if c.complete), key=lambda c: (c.committed, c.step))
        newest = float("inf") if saving else complete[-1].committed if complete else 0.0
        doomed = [c for c in infos if not c.complete and c.modified < newest and c.step != keep_step]
        if self.keep_last > 0:
            doomed += complete[: -self.keep_last]
        for info in doomed:
            _, path = split_uri(info.uri)
            try:
                self.client.remove(path, recursive=True)
                logger.info("removed %s checkpoint step %d", "complete" if info.complete else "incomplete", info.step)
            except NotFound:
                pass
        return sorted(c.step for c in doomed)

    # -------------------------------------------------------------- load --

    def load(self, step: int = -1) -> bool:
        """Restore the states from checkpoint ``step`` (-1: the last committed complete one).

        Every rank comes to the same outcome: rank 0's choice is loaded (a commit may land
        between two ranks' listings), and a rank that cannot list the root fails them all.

        Returns:
            False when there is no complete checkpoint to load (a fresh start).

        Raises:
            FileNotFoundError: ``step`` was asked for explicitly and is not complete.
            PCacheError: a rank could not list the checkpoints (Unavailable, StoreTimeout ...):
                its error, on every rank.
        """
        self.wait()
        complete: list[CheckpointInfo] = []
        error: PCacheError | None = None
        try:
            complete = self.committed()
        except PCacheError as exc:
            error = exc
        mine = step if step >= 0 else (complete[-1].step if complete else -1)  # -1: nothing to load
        chosen, failed = self._agree_load(mine, error)
        if failed is not None:
            rank, name, message = failed
            if error is not None:
                raise error
            raise from_name(name, f"checkpoint load: rank {rank} could not list {self.root}: {message}")
        if chosen < 0:
            return False
        matches = [c for c in complete if c.step == chosen]
        if not matches:
            if step >= 0:
                raise NotFound(f"no complete checkpoint for step {step}", path=self.uri_of(step))
            raise NotFound(f"rank 0 loads step {chosen}, which is not complete here", path=self.uri_of(chosen))
        info = matches[0]
        state = self._state_dict()
        with self._unwrapped("load", info.step), self._bounded("load", info.step):
            dcp.load(state, storage_reader=PCacheStorageReader(info.uri), process_group=self._pg)
        for name, obj in self.states.items():
            if isinstance(obj, Stateful):
                obj.load_state_dict(state[name])
        logger.info("restored checkpoint step %d from %s", info.step, info.uri)
        self.loaded_step = info.step
        return True

    loaded_step: int = -1

    # ------------------------------------------------------------- close --

    def close(self) -> None:
        """Wait for pending persists and stop the background thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
