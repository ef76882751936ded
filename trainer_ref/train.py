"""Data-parallel training of the reference Ling MoE model, checkpointed into PCache.

One process per rank, ``torchrun``-compatible (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``; gloo on CPU, nccl on GPU), or under
``python -m trainer_ref.launch`` which also restarts it after a failure:

    python -m trainer_ref.train --config run.toml --data.root=/mnt/pcache/shards \\
        --ckpt.uri=pcache://127.0.0.1:19600/ckpt/run-1 --train.steps=200

The :class:`Trainer` owns its collaborators as typed attributes: the model
(:mod:`trainer_ref.model`, which knows nothing of training), the AdamW optimizer,
the data (:class:`trainer_ref.data.ShardDataset`, plain file reads from any path, e.g.
the PCache FUSE mount), the :class:`~ckpt_adapter.CheckpointManager` (the only user
of ``torch.distributed.checkpoint``), the :class:`SpikeHandler` and a
:class:`Watchdog`.

Determinism: every rank builds the same initial model from the seed; gradients are
averaged with one ``all_reduce`` of a flat buffer (gloo's order is fixed); the data
order, routing noise and the spike handler's decisions are functions of (seed, step,
rank) and of checkpointed state. A run resumed from a checkpoint therefore reproduces
an uninterrupted run bit for bit on CPU.

Anomalies, by level (Ling report §3.4.4 and §6.1): a non-finite loss or gradient and a
loss spike skip the update (the batch is re-injected ``retry_delay`` batches later and
the learning rate is lowered while spikes persist); a step slower than ``slow_factor``
times the median is logged; a step that takes longer than ``hang_timeout`` makes the
rank exit with :data:`EXIT_HANG` so the supervisor restarts the job from the latest
complete checkpoint. Every rank writes a heartbeat file the supervisor watches.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from pcache.common.logs import setup_logging
from trainer_ref.data import BatchId, ShardDataset
from trainer_ref.model import PRESETS, LingMoE, ModelConfig

logger = logging.getLogger(__name__)

EXIT_HANG = 75  # a step outlived the hang timeout: restart me
EXIT_FATAL = 2


# ---------------------------------------------------------------------------------------------------- config --


@dataclass
class ModelSection:
    """Which model to train."""

    preset: str = "tiny"
    """A name from :data:`trainer_ref.model.PRESETS`; its vocabulary size is replaced by the data's."""
    routing_warmup_steps: int = 20
    """Stochastic Routing Warmup length W in steps (paper eq. 3); 0 disables it."""
    balance_loss_coeff: float = 0.01
    """Load-balance loss coefficient."""
    z_loss_coeff: float = 0.001
    """Router z-loss coefficient."""


@dataclass
class DataSection:
    """Where the token shards are and how batches are cut."""

    root: str = ""
    """Directory written by ``python -m trainer_ref.data build`` (any path: local disk or the FUSE mount)."""
    seq_len: int = 128
    """Tokens per sample."""
    micro_batch: int = 8
    """Samples per rank per step."""


@dataclass
class OptimSection:
    """AdamW with linear warmup and cosine decay."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr: float = 3e-4
    """Learning rate at the end of the cosine."""
    warmup_steps: int = 10
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""


@dataclass
class TrainSection:
    """The run."""

    steps: int = 100
    """Training steps (a skipped update counts as a step: its batch was consumed)."""
    seed: int = 1234
    """Seeds the model init, the data order and the routing noise."""
    log_every: int = 1
    """Log a metrics line every N steps."""
    run_dir: str = ""
    """Heartbeats, metrics and the final state go here (default: $TRAINER_RUN_DIR or ./run)."""
    save_final: bool = True
    """Write ``final-model.pt`` (rank 0) at the end, for comparisons."""
    inject_bad_batch_at: int = -1
    """Test hook: corrupt the batch of this step (random tokens) the first time it is served."""
    backend: str = ""
    """Process-group backend; default gloo on CPU, nccl when CUDA is available."""


@dataclass
class CkptSection:
    """Checkpoints through :class:`ckpt_adapter.CheckpointManager`."""

    uri: str = ""
    """``pcache://MASTER/dir``; empty disables checkpoints."""
    interval: int = 10
    """Save every N steps (and at the end)."""
    keep_last: int = 3
    """Complete checkpoints to keep."""
    async_save: bool = True
    """Stage into shared memory and persist in the background."""


@dataclass
class SpikeSection:
    """Loss-spike handling (Ling report §3.4.4)."""

    window: int = 50
    """Recent losses the running mean and deviation are taken over."""
    min_history: int = 10
    """No spike is declared before this many losses are in the window."""
    sigmas: float = 5.0
    """A loss above mean + sigmas * std ..."""
    ratio: float = 1.3
    """... and above ratio * mean is a spike."""
    retry_delay: int = 8
    """A skipped batch is served again after this many batches."""
    lr_decay: float = 0.5
    """The learning rate is multiplied by this for every spike in a row."""
    lr_recover: float = 1.1
    """... and by this (up to 1) for every normal step afterwards."""
    min_lr_scale: float = 0.05
    """The learning rate is never lowered below this fraction."""


@dataclass
class WatchdogSection:
    """Slow and hung steps."""

    hang_timeout: float = 300.0
    """Seconds a step may take before the rank exits with EXIT_HANG (the supervisor restarts the job)."""
    slow_factor: float = 3.0
    """A step slower than this times the median step is logged as slow."""


@dataclass
class TrainConfig:
    """Everything a run needs; TOML sections of the same names, ``--section.key=value`` overrides."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    ckpt: CkptSection = field(default_factory=CkptSection)
    spike: SpikeSection = field(default_factory=SpikeSection)
    watchdog: WatchdogSection = field(default_factory=WatchdogSection)


LIMITS: dict[tuple[str, str], tuple[float, float]] = {
    ("data", "seq_len"): (2, 1 << 20),
    ("data", "micro_batch"): (1, 1 << 16),
    ("optim", "lr"): (0, 10),
    ("train", "steps"): (0, 1 << 40),
    ("ckpt", "interval"): (1, 1 << 40),
    ("spike", "window"): (2, 1 << 20),
    ("spike", "lr_decay"): (0.001, 1),
    ("spike", "lr_recover"): (1, 100),
    ("watchdog", "hang_timeout"): (0.1, 1 << 30),
}


def load_config(path: str | None, overrides: Sequence[str]) -> TrainConfig:
    """The run's configuration from an optional TOML file and ``--section.key=value`` overrides.

    Raises:
        InvalidArgument: unknown key, wrong type or out-of-range value.
    """
    from pcache.common.config import configure

    return configure(TrainConfig(), path, tuple(overrides), LIMITS)


# ------------------------------------------------------------------------------------------- loss spikes --


class SpikeHandler:
    """Decide, from the globally averaged loss, whether an update is taken or skipped.

    Ling report §3.4.4: a spike (or a non-finite loss/gradient) skips the update and the batch
    is retried later; while spikes keep coming the learning rate is lowered, then it recovers.
    The state is small, identical on every rank, and checkpointed.
    """

    def __init__(self, cfg: SpikeSection) -> None:
        self.cfg = cfg
        self.losses: deque[float] = deque(maxlen=cfg.window)
        self.grad_norms: deque[float] = deque(maxlen=cfg.window)
        self.lr_scale = 1.0
        self.in_a_row = 0
        self.skipped: list[int] = []  # steps whose update was skipped

    def _outlier(self, history: deque[float], value: float) -> bool:
        if len(history) < self.cfg.min_history:
            return False
        mean = statistics.fmean(history)
        return value > mean + self.cfg.sigmas * statistics.pstdev(history) and value > self.cfg.ratio * mean

    def check(self, step: int, loss: float, grad_norm: float) -> str:
        """``"ok"``, ``"spike"`` (the loss or the gradient norm far above its recent history: both
        above mean + ``sigmas`` std and ``ratio`` x mean) or ``"nonfinite"``; updates the state."""
        verdict = "ok"
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            verdict = "nonfinite"
        elif self._outlier(self.losses, loss) or self._outlier(self.grad_norms, grad_norm):
            verdict = "spike"
        if verdict == "ok":
            self.losses.append(loss)
            self.grad_norms.append(grad_norm)
            self.in_a_row = 0
            self.lr_scale = min(1.0, self.lr_scale * self.cfg.lr_recover)
        else:
            self.in_a_row += 1
            self.lr_scale = max(self.cfg.min_lr_scale, self.lr_scale * self.cfg.lr_decay)
            self.skipped.append(step)
        return verdict

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms), "lr_scale": self.lr_scale,
                "in_a_row": self.in_a_row, "skipped": list(self.skipped)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = deque((float(x) for x in state["losses"]), maxlen=self.cfg.window)
        self.grad_norms = deque((float(x) for x in state["grad_norms"]), maxlen=self.cfg.window)
        self.lr_scale = float(state["lr_scale"])
        self.in_a_row = int(state["in_a_row"])
        self.skipped = [int(s) for s in state["skipped"]]


def lr_at(step: int, cfg: OptimSection, total: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


# -------------------------------------------------------------------------------------------- watchdog --


class Watchdog:
    """Per-rank step timer: logs slow steps, exits with :data:`EXIT_HANG` on a hung one, and writes
    the heartbeat file (``heartbeat-rank<r>.json``: step, time, pid) the supervisor watches."""

    def __init__(self, cfg: WatchdogSection, run_dir: str, rank: int) -> None:
        self.cfg = cfg
        self.path = os.path.join(run_dir, f"heartbeat-rank{rank}.json")
        self.rank = rank
        self.step_started = time.monotonic()
        self.times: deque[float] = deque(maxlen=50)
        self.slow_steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int, state: str = "training") -> None:
        """A step finished: record its time, log it if slow, refresh the heartbeat."""
        now = time.monotonic()
        took = now - self.step_started
        if len(self.times) >= 5 and took > self.cfg.slow_factor * statistics.median(self.times):
            self.slow_steps += 1
            logger.warning("rank %d: slow step %d took %.2fs (median %.2fs)", self.rank, step, took,
                           statistics.median(self.times))  # fmt: skip
        self.times.append(took)
        self.step_started = now
        doc = {"step": step, "time": time.time(), "pid": os.getpid(), "state": state, "step_seconds": took}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, self.path)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.cfg.hang_timeout / 4)):
            if time.monotonic() - self.step_started > self.cfg.hang_timeout:
                logger.error("rank %d: no step finished in %.0fs: exiting for a restart", self.rank,
                             self.cfg.hang_timeout)  # fmt: skip
                logging.shutdown()
                os._exit(EXIT_HANG)

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------------------------- trainer --


class AppState(Stateful):
    """Model and optimizer as one Stateful with FQN-keyed optimizer state (the DCP recipe)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class Progress(Stateful):
    """The step counter, the spike handler, and every rank's data cursor and RNG state.

    Per-rank entries are keyed by rank (``rank<r>``) so DCP's deduplication of replicated
    items keeps each of them.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def state_dict(self) -> dict[str, Any]:
        t = self.t
        return {
            "step": t.step,
            "spike": t.spike.state_dict(),
            "ranks": {f"rank{t.rank}": {"data": t.data.state_dict(), "rng": torch.get_rng_state()}},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        t = self.t
        t.step = int(state["step"])
        t.spike.load_state_dict(state["spike"])
        mine = state["ranks"][f"rank{t.rank}"]
        t.data.load_state_dict(mine["data"])
        torch.set_rng_state(mine["rng"])


class Trainer:
    """Data-parallel training loop; see the module docstring."""

    model: LingMoE
    optimizer: torch.optim.AdamW
    data: ShardDataset
    spike: SpikeHandler
    watchdog: Watchdog
    ckpt: Any  # ckpt_adapter.CheckpointManager, or None

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.run_dir = cfg.train.run_dir or os.environ.get("TRAINER_RUN_DIR", "./run")
        os.makedirs(self.run_dir, exist_ok=True)
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() \
            else torch.device("cpu")  # fmt: skip
        if self.world > 1 and not dist.is_initialized():
            backend = cfg.train.backend or ("nccl" if self.device.type == "cuda" else "gloo")
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group(backend)
        torch.manual_seed(cfg.train.seed)
        if not cfg.data.root:
            raise ValueError("data.root is not set: build shards with `python -m trainer_ref.data build --out DIR`")
        self.data = ShardDataset(cfg.data.root, seq_len=cfg.data.seq_len, micro_batch=cfg.data.micro_batch,
                                 dp_rank=self.rank, dp_world=self.world, seed=cfg.train.seed)  # fmt: skip
        base = PRESETS[cfg.model.preset]
        self.model_cfg = ModelConfig(**{
            **asdict(base), "vocab_size": self.data.vocab_size, "seed": cfg.train.seed,
            "max_seq_len": max(base.max_seq_len, cfg.data.seq_len),
            "routing_warmup_steps": cfg.model.routing_warmup_steps,
            "balance_loss_coeff": cfg.model.balance_loss_coeff, "z_loss_coeff": cfg.model.z_loss_coeff,
        })  # fmt: skip
        self.model = LingMoE(self.model_cfg).to(self.device)
        decay = [p for n, p in self.model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.ndim < 2]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o.lr, betas=(o.beta1, o.beta2), foreach=False,
        )  # fmt: skip
        self.spike = SpikeHandler(cfg.spike)
        self.step = 0
        self.injected = False
        self.ckpt = None
        if cfg.ckpt.uri:
            from ckpt_adapter import CheckpointManager

            self.ckpt = CheckpointManager(
                cfg.ckpt.uri, {"app": AppState(self.model, self.optimizer), "progress": Progress(self)},
                interval=cfg.ckpt.interval, keep_last=cfg.ckpt.keep_last, async_mode=cfg.ckpt.async_save,
            )  # fmt: skip
        self.metrics_path = os.path.join(self.run_dir, f"metrics-rank{self.rank}.jsonl")
        self.watchdog = Watchdog(cfg.watchdog, self.run_dir, self.rank)
        self.blocked: list[float] = []  # seconds each checkpoint blocked the step

    # ------------------------------------------------------------ pieces --

    def _allreduce_grads(self) -> None:
        """Average gradients over ranks with one flat all_reduce (unused experts contribute zeros)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.world > 1:
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat /= self.world
            grads = list(_unflatten_dense_tensors(flat, grads))
        for p, g in zip(params, grads, strict=True):
            p.grad = g

    def _sync_buffers(self) -> None:
        """Average floating-point buffers over ranks (the routing-warmup score statistics are updated
        from each rank's own batch): replicas stay identical, as data parallelism assumes and as a
        checkpoint that stores replicated state once requires."""
        if self.world == 1:
            return
        bufs = [b for b in self.model.buffers() if b.is_floating_point()]
        if bufs:
            flat = _flatten_dense_tensors(bufs)
            dist.all_reduce(flat)
            flat /= self.world
            for b, synced in zip(bufs, _unflatten_dense_tensors(flat, bufs), strict=True):
                b.copy_(synced)

    def _global_mean(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor, BatchId]:
        batch = self.data.next_batch()
        x, y = batch.x, batch.y
        if self.step == self.cfg.train.inject_bad_batch_at and not self.injected:
            # a corrupted read: random inputs and one rare token as every target (the retry reads the real batch)
            self.injected = True
            g = torch.Generator().manual_seed(self.cfg.train.seed + self.rank)
            x = torch.randint(0, self.data.vocab_size, x.shape, generator=g)
            y = torch.full_like(y, self.data.vocab_size - 1)
        return x.to(self.device), y.to(self.device), batch.batch_id

    # -------------------------------------------------------------- loop --

    def train(self) -> dict[str, Any]:
        """Resume from the newest complete checkpoint if any, train to ``train.steps``; returns a summary."""
        cfg = self.cfg
        resumed = self.ckpt.load() if self.ckpt is not None else False
        if resumed:
            logger.info("rank %d resumed at step %d", self.rank, self.step)
        self.watchdog.beat(self.step, "started")
        tokens_per_step = cfg.data.micro_batch * cfg.data.seq_len * self.world
        first_loss = last_loss = float("nan")
        while self.step < cfg.train.steps:
            t0 = time.perf_counter()
            x, y, batch_id = self._batch()
            out = self.model(x, y, step=self.step, rank=self.rank)
            assert out.loss is not None
            out.loss.backward()
            self._allreduce_grads()
            self._sync_buffers()
            clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
            # gradients are already averaged: the norm is the same on every rank
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
            loss = self._global_mean(float(out.loss.detach()))
            verdict = self.spike.check(self.step, loss, grad_norm)
            lr = lr_at(self.step, cfg.optim, cfg.train.steps) * self.spike.lr_scale
            if verdict == "ok":
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.step()
            else:
                self.data.defer(batch_id, delay=cfg.spike.retry_delay)
                logger.warning("step %d: %s (loss %.4f): update skipped, batch %s retried later, lr x%.3f",
                               self.step, verdict, loss, tuple(batch_id), self.spike.lr_scale)  # fmt: skip
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if math.isnan(first_loss):
                first_loss = loss
            last_loss = loss
            took = time.perf_counter() - t0
            if self.step % cfg.train.log_every == 0 or verdict != "ok":
                self._log(loss, lr, verdict, out.aux.load_stats(), tokens_per_step / took, batch_id, grad_norm)
            if self.ckpt is not None and self.ckpt.save(self.step, force=self.step == cfg.train.steps):
                self.blocked.append(self.ckpt.last_blocked_s)
            self.watchdog.beat(self.step)
        if self.ckpt is not None:
            self.ckpt.close()
        if cfg.train.save_final and self.rank == 0:
            tmp = os.path.join(self.run_dir, "final-model.pt.tmp")
            torch.save(self.model.state_dict(), tmp)
            os.replace(tmp, os.path.join(self.run_dir, "final-model.pt"))
        self.watchdog.beat(self.step, "finished")
        self.watchdog.stop()
        return {"step": self.step, "first_loss": first_loss, "last_loss": last_loss, "resumed": resumed,
                "skipped": self.spike.skipped, "ckpt_blocked_s": self.blocked}  # fmt: skip

    def _log(self, loss, lr, verdict, stats, tok_s, batch_id, grad_norm) -> None:
        rec = {"step": self.step, "loss": loss, "lr": lr, "verdict": verdict, "tokens_per_s": tok_s,
               "grad_norm": grad_norm, "batch": list(batch_id), "time": time.time(), **stats}  # fmt: skip
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if self.rank == 0:
            loads = [v for k, v in stats.items() if k.startswith("load_max_over_mean/")]
            logger.info("step %d loss %.4f lr %.2e %s tok/s %.0f balance %.4f z %.5f load max/mean %s",
                        self.step, loss, lr, verdict, tok_s, stats["balance_loss"], stats["z_loss"],
                        "/".join(f"{v:.2f}" for v in loads))  # fmt: skip

    def close(self) -> None:
        """Stop the watchdog and the data reader, and leave the process group."""
        self.watchdog.stop()
        self.data.close()
        if self.ckpt is not None:
            self.ckpt.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer_ref.train [--config FILE] [--section.key=value ...]``."""
    ap = argparse.ArgumentParser(prog="python -m trainer_ref.train", description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="TOML file with [model] [data] [optim] [train] [ckpt] [spike] [watchdog]")
    args, overrides = ap.parse_known_args(argv)
    setup_logging("INFO", fmt=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s")
    from pcache.common.errors import InvalidArgument

    try:
        cfg = load_config(args.config, overrides)
    except InvalidArgument as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return 3
    torch.set_num_threads(max(1, int(os.environ.get("TRAINER_THREADS", "1"))))
    logger.info("config: %s", json.dumps(asdict(cfg), sort_keys=True))
    trainer = Trainer(cfg)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    if trainer.rank == 0:
        with open(os.path.join(trainer.run_dir, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
        logger.info("done: %s", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
