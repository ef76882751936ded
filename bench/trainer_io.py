#!/usr/bin/env python
"""The reference trainer (``trainer_ref``) reading its data through PCache's FUSE mount, and checkpointing into PCache.

Starts a local cluster (one master, two workers, RF=1, data in a scratch directory) and mounts it
with ``pcache-mount`` (``python -m fuse_client``, as ``fuse_io.py`` does). Token shards are built once
(``python -m trainer_ref.data build --max-bytes ...``, the stdlib sources with a locally trained BPE)
into a local directory, copied into the mount with a plain file copy and checked there
(``trainer_ref.data.verify``). Then, as medians of ``--reps`` repetitions that alternate the two sides
(local first in even repetitions, FUSE first in odd ones):

1. ``train_ratio``: training tokens/s with ``--data.root`` on the FUSE mount over the same with it on
   the local directory. One rank (``python -m trainer_ref.train``, tiny preset, one torch thread),
   ``--steps`` steps; tokens/s of a run is the median of the per-step ``tokens_per_s`` of
   ``metrics-rank0.jsonl`` (batch read + forward + backward + optimizer step) after ``--warmup``
   steps. ``train_wall_ratio``: the same from the total tokens over the wall time of those steady
   steps (logging and heartbeats included); ``train_paired_ratio``: the median of each repetition's
   own FUSE/local ratio (its two runs are adjacent in time, so they share the machine's load). Both
   sides of a repetition use the same seed, so they read the same windows. Before every run the page cache of the shards (both copies) and of
   PCache's block files is dropped: each page is read cold once, as a job streaming a corpus larger
   than its page cache does. The default shape (``--seq-len 16 --micro-batch 32``: 32 windows of
   17 tokens, one ``pread`` each, per 512-token step) makes reading as large a part of a step as
   this trainer allows (its model costs ~0.2 ms of one core per token, its reader one ``pread`` per
   window); ``read_ms_per_step`` below says how large.
2. ``load_ratio``: tokens/s of a bare ``ShardDataset.next_batch()`` loop (no model) over the windows
   of one training run, FUSE over local, after the same cache drop; ``load_warm_ratio``: a second
   pass over the same windows (page cache). ``*_read_ms_per_step``: the cold loop's milliseconds per
   batch, next to the training step's (``step_ms``); ``expected_train_ratio``: the local step with
   its read time replaced by the mount's, over the local step (the training ratio the reads alone
   explain, without the run-to-run noise of the training measure).
3. Checkpoint blocking: the trainer with ``--ckpt.uri=pcache://MASTER/...`` on a wider model (the tiny
   preset with ``--ckpt-d-model``, registered as a preset in a child process that then runs the
   trainer's own ``main``), ``--ckpt-saves`` saves every ``--ckpt-interval`` steps per run,
   ``--ckpt-reps`` runs each of ``--ckpt.async_save=false`` and ``true``, alternating.
   ``sync_blocked_s`` / ``async_blocked_s``: the median over saves of the seconds ``save()`` held
   the step (``CheckpointManager.last_blocked_s``, the trainer's ``ckpt_blocked_s``), without the
   first save of each run (it allocates the staging buffers); ``ckpt_blocked_ratio`` = async / sync.
   ``*_persist_s``: from ``save()`` to the checkpoint's commit.

The last line of output is ``RESULT key=value ...``; rates are tokens/s, times seconds unless named
``_ms``, sizes MB (10**6 bytes).

Usage::

    python bench/trainer_io.py --quick      # 8 MB corpus, 2 reps of 30 steps, 120 MB checkpoints; ~2 minutes
    python bench/trainer_io.py              # 16 MB corpus, 5 reps of 40 steps, 250 MB checkpoints; ~5 minutes
    python bench/trainer_io.py --seq-len 128 --micro-batch 8 --dir /mnt/nvme --keep

``python bench/trainer_io.py --trainer-child SPEC.json -- TRAIN_ARGS`` is the checkpoint run's child.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchlib import REPO as _REPO
from benchlib import block_files, drop_page_cache, print_result
from fuse_io import MountProc

from fuse_client.mount import mounted
from pcache.client import Client
from pcache.common.logs import setup_logging
from pcache.common.process import reap_children
from pcache.local import LocalCluster
from trainer_ref.data import verify

MB = 1_000_000
WORKERS = 2
VOCAB = 4096
SHARD_TOKENS = 1 << 20  # 2 MiB shard files: several shards, as a real corpus has
SEED = 1234
TRAIN_TARGET = 0.95
CKPT_PRESET = "bench-ckpt"
SIDES = ("local", "fuse")
TRAIN_TIMEOUT = 600.0  # seconds one trainer run may take


def log(msg: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ckpt_model(d_model: int) -> dict[str, int]:
    """The checkpoint runs' model: the tiny preset widened to ``d_model`` (64-wide heads, 4 layers)."""
    heads = max(2, d_model // 64)
    return {"d_model": d_model, "n_layers": 4, "n_heads": heads, "n_kv_heads": heads // 2,
            "intermediate_size": 4 * d_model, "moe_intermediate_size": d_model}  # fmt: skip


def steady_rates(run_dir: Path, warmup: int, tokens_per_step: int) -> tuple[float, float]:
    """``(median per-step tokens/s, tokens / wall seconds)`` over the steps after ``warmup`` (>= 1).

    The wall time runs from the metrics line of step ``warmup`` to that of the last step.
    """
    rows = [json.loads(line) for line in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
    steady = rows[warmup:]
    if len(steady) < 2:
        raise RuntimeError(f"{run_dir}: {len(rows)} steps logged, fewer than warm-up {warmup} + 2")
    wall = steady[-1]["time"] - rows[warmup - 1]["time"]
    return median([r["tokens_per_s"] for r in steady]), len(steady) * tokens_per_step / wall


# ------------------------------------------------------------------ child --


def _tensor_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def trainer_child(spec_path: str, train_argv: list[str]) -> int:
    """Run ``trainer_ref.train.main`` with the spec's model as preset ``bench-ckpt``, timing every checkpoint.

    Writes ``ckpt-timing.json`` next to the spec: per save the seconds ``save()`` blocked, of which
    the seconds it waited for the previous persist, and the seconds from ``save()`` to the commit;
    and the tensor bytes of the saved state.
    """
    import dataclasses

    from ckpt_adapter import CheckpointManager
    from trainer_ref import train

    spec = json.loads(Path(spec_path).read_text())
    train.PRESETS[CKPT_PRESET] = dataclasses.replace(train.PRESETS["tiny"], **spec["model"])
    saves: list[dict[str, Any]] = []
    committed: dict[int, float] = {}
    state_bytes: list[int] = []
    save, wait, persist = CheckpointManager.save, CheckpointManager.wait, CheckpointManager._persist
    waited = {"s": 0.0}  # seconds the current save() spent waiting for the previous persist

    def timed_save(self: CheckpointManager, step: int, *, force: bool = False) -> bool:
        waited["s"] = 0.0
        started = time.perf_counter()
        did = save(self, step, force=force)
        if did:
            saves.append({"step": step, "blocked_s": self.last_blocked_s, "waited_s": waited["s"], "at": started})
        return did

    def timed_wait(self: CheckpointManager) -> None:
        t = time.perf_counter()
        try:
            wait(self)
        finally:
            waited["s"] += time.perf_counter() - t

    def timed_persist(self: CheckpointManager, state: dict[str, Any], step: int) -> None:
        if not state_bytes:
            state_bytes.append(_tensor_bytes(state))
        persist(self, state, step)
        committed[step] = time.perf_counter()

    CheckpointManager.save = timed_save  # type: ignore[method-assign]
    CheckpointManager.wait = timed_wait  # type: ignore[method-assign]
    CheckpointManager._persist = timed_persist  # type: ignore[method-assign]
    rc = train.main(train_argv)
    for s in saves:
        s["persist_s"] = committed[s["step"]] - s.pop("at") if s["step"] in committed else float("nan")
    out = {"saves": saves, "state_bytes": state_bytes[0] if state_bytes else 0}
    Path(spec_path).with_name("ckpt-timing.json").write_text(json.dumps(out, indent=1))
    return rc


# ------------------------------------------------------------------ benchmark --


class Bench:
    """One run: the cluster, the mount, both copies of the shards, the samples."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.local = root / "local" / "shards"
        self.runs = root / "runs"
        self.samples: dict[str, list[float]] = {}
        self.info: dict[str, Any] = {}
        self.cluster = LocalCluster(
            str(root / "cluster"), workers=WORKERS, master_args=["--master.default_replication=1"]
        )
        self.mount: MountProc | None = None

    @property
    def fuse(self) -> Path:
        assert self.mount is not None
        return self.mount.path / "shards"

    def data_root(self, side: str) -> Path:
        return self.local if side == "local" else self.fuse

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def med(self, key: str) -> float:
        return median(self.samples.get(key, []))

    def drop_caches(self) -> None:
        """Both copies of the shards and PCache's block files out of the page cache (dirty pages cannot be)."""
        os.sync()
        drop_page_cache([str(p) for p in (*self.local.glob("*.bin"), *self.fuse.glob("*.bin"))])
        drop_page_cache(block_files(self.root / "cluster"))

    # ------------------------------------------------------------ setup --

    def setup(self) -> None:
        t0 = time.perf_counter()
        self.cluster.start()
        self.mount = MountProc(
            "pcache",
            [sys.executable, "-m", "fuse_client", str(self.root / "mnt"), "--master", self.cluster.master_address],
            self.root / "mnt",
        ).start()
        log(f"cluster and mount up in {time.perf_counter() - t0:.1f}s: master {self.cluster.master_address}")
        t = time.perf_counter()
        build = subprocess.run(
            [sys.executable, "-m", "trainer_ref.data", "build", "--out", str(self.local),
             "--max-bytes", str(self.args.corpus_bytes), "--vocab-size", str(VOCAB),
             "--shard-tokens", str(SHARD_TOKENS)],
            cwd=_REPO, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if build.returncode:
            raise RuntimeError(f"building the shards failed:\n{build.stderr[-2000:]}")
        index = json.loads((self.local / "index.json").read_text())
        train = index["splits"]["train"]
        self.info["train_tokens"] = train["tokens"]
        self.info["shard_mb"] = sum(s["bytes"] for s in train["shards"]) / MB
        log(
            f"shards built in {time.perf_counter() - t:.1f}s: {train['tokens']} train tokens in "
            f"{len(train['shards'])} shards ({self.info['shard_mb']:.1f} MB)"
        )
        t = time.perf_counter()
        shutil.copytree(self.local, self.fuse)  # a plain file copy through the mount
        problems = verify(self.fuse)
        if problems:
            raise RuntimeError("the shards in the mount differ from the local ones: " + "; ".join(problems))
        log(f"copied into the mount and verified in {time.perf_counter() - t:.1f}s")

    # ------------------------------------------------------------ trainer --

    def run_trainer(self, name: str, train_args: list[str], spec: dict[str, Any] | None = None) -> Path:
        """Run one trainer process to completion in ``runs/NAME``; returns that run directory."""
        run_dir = self.runs / name
        run_dir.mkdir(parents=True)
        if spec is None:
            argv = [sys.executable, "-m", "trainer_ref.train"]
        else:
            (run_dir / "spec.json").write_text(json.dumps(spec))
            argv = [sys.executable, str(Path(__file__).resolve()), "--trainer-child", str(run_dir / "spec.json"), "--"]
        argv += [*train_args, f"--train.run_dir={run_dir}", "--train.save_final=false"]
        env = {**os.environ, "TRAINER_THREADS": str(self.args.threads)}
        with open(run_dir / "train.log", "wb") as out:
            proc = subprocess.Popen(argv, cwd=_REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(TRAIN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc:
            tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"trainer run {name} exited with {rc}:\n{tail}")
        return run_dir

    def bench_train(self) -> None:
        a = self.args
        tokens_per_step = a.seq_len * a.micro_batch
        for rep in range(a.reps):
            line = []
            for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                self.drop_caches()
                run = self.run_trainer(f"train-{side}-{rep}", [
                    f"--data.root={self.data_root(side)}", f"--data.seq_len={a.seq_len}",
                    f"--data.micro_batch={a.micro_batch}", f"--train.steps={a.steps}", f"--train.seed={SEED + rep}",
                ])  # fmt: skip
                per_step, wall = steady_rates(run, a.warmup, tokens_per_step)
                self.add(f"{side}_train", per_step)
                self.add(f"{side}_train_wall", wall)
                line.append(f"{side} {per_step:.0f} (wall {wall:.0f})")
            # the two runs of a repetition are adjacent in time: their ratio sees the same machine load
            self.add("train_paired", ratio(self.samples["fuse_train"][-1], self.samples["local_train"][-1]))
            log(f"train rep {rep + 1}/{a.reps} (tokens/s, median step): {'; '.join(line)}")

    # ------------------------------------------------------------ loader --

    def bench_load(self) -> None:
        import torch  # noqa: F401 - ShardDataset imports it at its first batch; not inside the timed loop

        from trainer_ref.data import ShardDataset

        a = self.args
        tokens = a.steps * a.seq_len * a.micro_batch
        for rep in range(a.reps):
            line = []
            for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                self.drop_caches()
                for key in ("load", "load_warm"):  # the windows of training rep `rep`, cold then from the page cache
                    with ShardDataset(self.data_root(side), seq_len=a.seq_len, micro_batch=a.micro_batch,
                                      seed=SEED + rep) as ds:  # fmt: skip
                        t = time.perf_counter()
                        for _ in range(a.steps):
                            ds.next_batch()
                        self.add(f"{side}_{key}", tokens / (time.perf_counter() - t))
                line.append(
                    f"{side} cold {self.samples[f'{side}_load'][-1]:.0f} warm {self.samples[f'{side}_load_warm'][-1]:.0f}"
                )
            log(f"load rep {rep + 1}/{a.reps} (tokens/s): {'; '.join(line)}")

    # ------------------------------------------------------------ checkpoints --

    def bench_ckpt(self) -> None:
        a = self.args
        steps = a.ckpt_interval * a.ckpt_saves
        spec = {"model": ckpt_model(a.ckpt_d_model)}
        with Client(master=self.cluster.master_address) as client:
            for rep in range(a.ckpt_reps):
                for mode in ("sync", "async") if rep % 2 == 0 else ("async", "sync"):
                    name = f"ckpt-{mode}-{rep}"
                    path = f"/bench-ckpt/{name}"
                    run = self.run_trainer(name, [
                        f"--data.root={self.local}", f"--data.seq_len={a.ckpt_seq_len}", "--data.micro_batch=2",
                        f"--model.preset={CKPT_PRESET}", f"--train.steps={steps}", f"--train.seed={SEED + rep}",
                        f"--ckpt.uri=pcache://{self.cluster.master_address}{path}", f"--ckpt.interval={a.ckpt_interval}",
                        "--ckpt.keep_last=2", f"--ckpt.async_save={'true' if mode == 'async' else 'false'}",
                    ], spec=spec)  # fmt: skip
                    client.remove(path, recursive=True)  # keep the disk flat across runs
                    timing = json.loads((run / "ckpt-timing.json").read_text())
                    summary = json.loads((run / "summary.json").read_text())
                    saves = timing["saves"]
                    if [s["blocked_s"] for s in saves] != summary["ckpt_blocked_s"]:
                        raise AssertionError(f"{name}: timed saves differ from the trainer's ckpt_blocked_s")
                    self.info["state_mb"] = timing["state_bytes"] / MB
                    self.add(f"{mode}_first_blocked", saves[0]["blocked_s"])
                    for s in saves[1:]:
                        self.add(f"{mode}_blocked", s["blocked_s"])
                        self.add(f"{mode}_waited", s["waited_s"])
                        self.add(f"{mode}_persist", s["persist_s"])
                    rows = [json.loads(x) for x in (run / "metrics-rank0.jsonl").read_text().splitlines()]
                    for r in rows[1:]:  # every step but the first; a step's time excludes its save
                        self.add(f"{mode}_step", a.ckpt_seq_len * 2 / r["tokens_per_s"])
                    log(
                        f"ckpt rep {rep + 1}/{a.ckpt_reps} {mode}: {timing['state_bytes'] / MB:.0f} MB state, blocked "
                        + " ".join(f"{s['blocked_s']:.3f}" for s in saves)
                        + " s; persist " + " ".join(f"{s['persist_s']:.2f}" for s in saves) + " s"
                    )  # fmt: skip

    def run(self) -> dict[str, float]:
        self.setup()
        for phase in (self.bench_train, self.bench_load, self.bench_ckpt):
            t = time.perf_counter()
            phase()
            log(f"{phase.__name__}: {time.perf_counter() - t:.1f}s")
        return {k: self.med(k) for k in self.samples}


# ------------------------------------------------------------------ report --


def report(m: dict[str, float], info: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the tables, the notes and the RESULT line (``m``: medians per measure)."""
    per_step = args.seq_len * args.micro_batch
    step_ms = {side: 1000 * per_step / m[f"{side}_train"] for side in SIDES}
    read_ms = {side: 1000 * per_step / m[f"{side}_load"] for side in SIDES}
    res: dict[str, Any] = {
        "train_ratio": ratio(m["fuse_train"], m["local_train"]),
        "train_wall_ratio": ratio(m["fuse_train_wall"], m["local_train_wall"]),
        "train_paired_ratio": m["train_paired"],
        "load_ratio": ratio(m["fuse_load"], m["local_load"]),
        "load_warm_ratio": ratio(m["fuse_load_warm"], m["local_load_warm"]),
        "sync_blocked_s": m["sync_blocked"],
        "async_blocked_s": m["async_blocked"],
        "ckpt_blocked_ratio": ratio(m["async_blocked"], m["sync_blocked"]),
    }
    print()
    print(
        f"Trainer I/O: tiny preset, 1 rank, {args.threads} torch thread(s), seq_len {args.seq_len} x micro_batch "
        f"{args.micro_batch} = {per_step} tokens/step, {args.steps} steps ({args.warmup} warm-up), medians of "
        f"{args.reps} reps; {info['train_tokens']} train tokens ({info['shard_mb']:.1f} MB of shards)"
    )
    header = f"{'measure':<40}{'local':>12}{'fuse':>12}{'fuse/local':>12}  target"
    print(header)
    print("-" * len(header))
    rows = [
        ("train tokens/s (median step)", "train", f">={TRAIN_TARGET} " + ("ok" if res["train_ratio"] >= TRAIN_TARGET else "MISS")),
        ("train tokens/s (steady wall)", "train_wall", ""),
        ("load tokens/s, cold (no model)", "load", ""),
        ("load tokens/s, page cache (no model)", "load_warm", ""),
    ]  # fmt: skip
    for name, key, verdict in rows:
        print(
            f"{name:<40}{m[f'local_{key}']:>12.0f}{m[f'fuse_{key}']:>12.0f}{ratio(m[f'fuse_{key}'], m[f'local_{key}']):>12.3f}  {verdict}"
        )
    print(f"{'train, median of per-rep fuse/local':<40}{'':>24}{res['train_paired_ratio']:>12.3f}")
    print(f"{'ms per step: training step':<40}{step_ms['local']:>12.1f}{step_ms['fuse']:>12.1f}")
    print(f"{'ms per step: cold batch read':<40}{read_ms['local']:>12.2f}{read_ms['fuse']:>12.2f}")
    print()
    print(
        f"Checkpoints: tiny preset at d_model {args.ckpt_d_model} ({info['state_mb']:.0f} MB of model + AdamW state), "
        f"{args.ckpt_saves} saves every {args.ckpt_interval} steps per run, {args.ckpt_reps} run(s) per mode; "
        f"medians without each run's first save"
    )
    header = f"{'measure':<40}{'sync':>12}{'async':>12}{'async/sync':>12}"
    print(header)
    print("-" * len(header))
    for name, key in (("step blocked per save (s)", "blocked"), ("first save of a run, blocked (s)", "first_blocked"),
                      ("save() to commit (s)", "persist"), ("training step without save (s)", "step")):  # fmt: skip
        print(
            f"{name:<40}{m[f'sync_{key}']:>12.3f}{m[f'async_{key}']:>12.3f}{ratio(m[f'async_{key}'], m[f'sync_{key}']):>12.3f}"
        )
    print(f"async saves waited {m['async_waited']:.3f} s (median) for the previous persist")
    print()
    print("train: per-step tokens_per_s of metrics-rank0.jsonl (batch read + forward + backward + AdamW), median")
    print("  after the warm-up; wall: tokens of the steady steps / their wall time. Before each run the page cache")
    print("  of both copies of the shards and of PCache's block files is dropped: every page is read cold once.")
    print("load: ShardDataset.next_batch() over the same windows as one training run, no model, same cache drop;")
    print("  'cold batch read' is its time per batch, to compare with the training step.")
    keys: dict[str, Any] = {k: round(v, 3) for k, v in res.items()}
    for side in SIDES:
        keys[f"{side}_train_tok_s"] = round(m[f"{side}_train"])
        keys[f"{side}_load_tok_s"] = round(m[f"{side}_load"])
        keys[f"{side}_read_ms_per_step"] = round(read_ms[side], 3)
    keys["step_ms"] = round(step_ms["local"], 1)
    # the training ratio the loader predicts: the local step with its cold reads replaced by the mount's
    keys["expected_train_ratio"] = round(step_ms["local"] / (step_ms["local"] - read_ms["local"] + read_ms["fuse"]), 3)
    keys["sync_persist_s"] = m["sync_persist"]
    keys["async_persist_s"] = m["async_persist"]
    keys["async_first_blocked_s"] = m["async_first_blocked"]
    keys["async_waited_s"] = m["async_waited"]
    keys["async_step_slowdown"] = ratio(m["async_step"], m["sync_step"])
    keys["state_mb"] = round(info["state_mb"], 1)
    keys["seq_len"] = args.seq_len
    keys["micro_batch"] = args.micro_batch
    keys["steps"] = args.steps
    keys["reps"] = args.reps
    print_result(keys)


# ------------------------------------------------------------------ main --


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--quick", action="store_true", help="8 MB corpus, 2 reps of 30 steps, 1 checkpoint run per mode (~2 minutes)"
    )
    p.add_argument("--corpus-bytes", type=int, help="stdlib bytes to tokenize (default 16e6, quick 8e6)")
    p.add_argument("--reps", type=int, help="training runs per side (default 5, quick 2)")
    p.add_argument("--steps", type=int, help="steps per training run (default 40, quick 30)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of each run's rate (default 5)")
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sample (default 16)")
    p.add_argument("--micro-batch", type=int, default=32, help="samples per step (default 32)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer (default 1)")
    p.add_argument("--ckpt-d-model", type=int, help="hidden size of the checkpointed model (default 384, quick 256)")
    p.add_argument("--ckpt-reps", type=int, help="checkpoint runs per mode (default 2, quick 1)")
    p.add_argument("--ckpt-saves", type=int, help="saves per checkpoint run (default 4, quick 3)")
    p.add_argument("--ckpt-interval", type=int, help="steps between saves (default 5, quick 4)")
    p.add_argument("--ckpt-seq-len", type=int, default=32, help="tokens per sample in checkpoint runs (micro batch 2)")
    p.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (cluster, mount and run logs)")
    args = p.parse_args(argv)
    defaults = {"corpus_bytes": (8 * MB, 16 * MB), "reps": (2, 5), "steps": (30, 40), "ckpt_d_model": (256, 384),
                "ckpt_reps": (1, 2), "ckpt_saves": (3, 4), "ckpt_interval": (4, 5)}  # fmt: skip
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.steps < args.warmup + 2 or min(args.reps, args.ckpt_reps, args.warmup) < 1 or args.ckpt_saves < 2:
        p.error("need --steps >= --warmup + 2, --reps, --ckpt-reps and --warmup >= 1, --ckpt-saves >= 2")
    if args.ckpt_d_model % 64:
        p.error("--ckpt-d-model must be a multiple of 64")
    return args


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cleanup(bench: Bench | None, root: Path, keep: bool) -> None:
    """Unmount, stop the cluster and every child, remove the scratch directory (never through a mount)."""
    if bench is not None:
        if bench.mount is not None:
            try:
                bench.mount.stop()
            except Exception as exc:  # keep cleaning
                log(f"stopping the mount: {exc}")
        try:
            bench.cluster.stop()
        except Exception as exc:
            log(f"stopping the cluster: {exc}")
    reap_children()
    if mounted(str(root / "mnt")):
        log(f"still mounted, scratch kept: {root / 'mnt'}")
    elif keep:
        log(f"scratch kept in {root}")
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(root)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--trainer-child"]:
        cut = argv.index("--") if "--" in argv else len(argv)
        return trainer_child(argv[1], argv[cut + 1 :])
    args = parse_args(argv)
    setup_logging("WARNING", fmt="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # run the finally blocks on kill/timeout too
    signal.signal(signal.SIGHUP, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="pcache-trainer-bench-", dir=args.dir))
    started = time.perf_counter()
    bench: Bench | None = None
    try:
        bench = Bench(args, root)
        medians = bench.run()
        info = bench.info
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not stop the cleanup
            signal.signal(sig, signal.SIG_IGN)
        cleanup(bench, root, args.keep)
    log(f"done in {time.perf_counter() - started:.1f}s")
    report(medians, info, args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; everything started was stopped")
        sys.exit(130)
