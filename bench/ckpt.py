#!/usr/bin/env python
"""Checkpoint SDK (``ckpt_adapter``): node-aware saves, async saves, and PCache vs the local disk.

Starts two local clusters of real processes (one master and 4 workers each, RF=1, every
worker with its own ``--worker.node_id=node{i}``) and 8 gloo ranks on the CPU as
subprocesses, 2 per simulated node (``PCACHE_NODE_ID=node{rank // 2}``), so that each
rank's blocks land on its own node's worker. The state is a model plus Adam moments,
TP-sharded (DTensor ``Shard(0)``, ``--tp``) and replicated over the DP dimension, so every
item of a checkpoint has several candidate writers. The ranks start once and run every
measure, as medians of ``--reps`` repetitions that go through all variants in turn:

1. ``node_aware_vs_baseline_time``: save time with ``NodeAwareSavePlanner`` over save time
   with ``LowestRankSavePlanner`` (rank 0 of each DP group writes every replicated item),
   on the cluster whose workers are throttled to ``--bwlimit`` bytes/s each (a node's
   NIC/ingest, short-circuit writes included). The bytes each node stored (block files
   of its worker, before/after each save) are reported per planner as max and mean.
2. ``async_blocked_ratio``: seconds ``CheckpointManager(async_mode=True).save()`` blocks
   the caller (the slowest rank: staging into shared memory) over the sync node-aware
   save time of the same repetition. The background persist is waited for before the
   next variant runs.
3. ``sdk_vs_local_fs_throughput``: MB/s of the SDK save (``CheckpointManager``,
   node-aware) into the second, unthrottled cluster over MB/s of torch's stock
   ``FileSystemWriter`` (``sync_files=True``: every file fsynced, as PCache fsyncs every
   block) into a directory on the same disk; same ranks, same state, same planner.

Targets: ``node_aware_vs_baseline_time <= 0.6`` and ``async_blocked_ratio <= 0.1``.

The last line of output is ``RESULT key=value ...``; times are seconds, throughputs MB/s
(10**6 bytes/s) of checkpoint bytes (the unique tensor bytes of the state), node bytes MB.

Usage::

    python bench/ckpt.py --quick                 # 96 MB checkpoint, 2 reps; under two minutes
    python bench/ckpt.py                         # 384 MB checkpoint, 5 reps; a few minutes
    python bench/ckpt.py --size 1GiB --bwlimit 100MiB --tp 1 --dir /mnt/nvme   # binary suffixes
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from benchlib import REPO as _REPO  # noqa: E402
from benchlib import mbps, print_result

from pcache.common.config import parse_size  # noqa: E402
from pcache.common.logs import setup_logging
from pcache.common.process import free_port

MiB = 1 << 20
NODES = 4
RANKS_PER_NODE = 2
WORLD = NODES * RANKS_PER_NODE
LAYERS = 8
NODE_AWARE_TARGET = 0.6
ASYNC_TARGET = 0.1
WORKER_MEM_TIER = 64 * MiB  # short-circuit writes bypass the tier; keep 8 workers' RAM modest

# variant -> what it measures (order = order within one repetition)
VARIANTS = ("baseline", "node_aware", "async", "sdk", "local_fs")


def log(msg: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def node_disk_bytes(worker_dirs: list[str]) -> list[int]:
    """Bytes of committed block files (data + CRC record) under each worker's data directory."""
    out = []
    for d in worker_dirs:
        total = 0
        for p in Path(d, "blocks").glob("*/*.blk"):
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
        out.append(total)
    return out


# ------------------------------------------------------------------ state --


def hidden_size(total_bytes: int, tp: int) -> int:
    """Hidden size H whose state (LAYERS layers of 12 H^2 + H fp32 parameters, embedding
    and head of 4 H^2 each, times 3 for the parameters and two Adam moments) is close to
    ``total_bytes``; a multiple of 16 * tp so that every TP shard splits evenly."""
    unit = 16 * tp
    h = math.sqrt(total_bytes / (3 * 4 * (12 * LAYERS + 8)))
    return max(unit, round(h / unit) * unit)


def param_shapes(h: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (4 * h, h)}
    for i in range(LAYERS):
        shapes[f"layers.{i}.attn.qkv"] = (3 * h, h)
        shapes[f"layers.{i}.attn.out"] = (h, h)
        shapes[f"layers.{i}.mlp.up"] = (4 * h, h)
        shapes[f"layers.{i}.mlp.down"] = (h, 4 * h)
        shapes[f"layers.{i}.norm"] = (h,)
    shapes["norm"] = (h,)
    shapes["head.weight"] = (4 * h, h)
    return shapes


def local_bytes(obj: Any) -> int:
    """Tensor bytes one rank holds (its local shards)."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(local_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(local_bytes(v) for v in obj)
    return 0


def state_bytes(h: int) -> int:
    """Unique tensor bytes of the checkpoint: parameters and two moments, fp32."""
    return 3 * 4 * sum(math.prod(s) for s in param_shapes(h).values())


def build_state(h: int, rank: int, tp: int) -> dict[str, Any]:
    """Model and optimizer state of one rank: TP-sharded DTensors (Shard(0) over 'tp',
    replicated over 'dp'), or plain tensors identical on every rank when tp == 1."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (WORLD // tp, tp), mesh_dim_names=("dp", "tp")) if tp > 1 else None
    tp_rank = rank % tp  # mesh (dp, tp) is row-major: rank = dp_index * tp + tp_index

    def tensor(name: str, shape: tuple[int, ...], salt: int):
        local_shape = (shape[0] // tp, *shape[1:])
        # same seed on every DP replica of a shard: DP ranks hold the same bytes
        gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{salt}/{tp_rank}".encode()))
        local = torch.rand(local_shape, generator=gen)
        if mesh is None:
            return local
        return DTensor.from_local(local, mesh, [Replicate(), Shard(0)], run_check=False)

    shapes = param_shapes(h)
    model = {name: tensor(name, shape, 0) for name, shape in shapes.items()}
    optim = {
        "state": {
            name: {"exp_avg": tensor(name, shape, 1), "exp_avg_sq": tensor(name, shape, 2), "step": 100}
            for name, shape in shapes.items()
        },
        "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "params": sorted(shapes)}],
    }
    return {"model": model, "optim": optim}


# ------------------------------------------------------------------ one rank --


def rank_main(spec_path: str, rank: int) -> int:
    """Body of one rank (``python bench/ckpt.py --_rank RANK --_spec FILE``)."""
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ckpt_adapter import CheckpointManager, LowestRankSavePlanner, NodeAwareSavePlanner

    spec = json.loads(Path(spec_path).read_text())
    tp, reps = spec["tp"], spec["reps"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=WORLD)
    lead = rank == 0
    state = build_state(spec["hidden"], rank, tp)
    total = state_bytes(spec["hidden"])
    if lead:
        log(f"ranks up: {WORLD} ranks, tp={tp}, hidden {spec['hidden']}, checkpoint {total / 1e6:.1f} MB")

    # Node of every rank, gathered once here. The async manager's planner gets them up front:
    # a NodeAwareSavePlanner without ``nodes`` gathers them on the *default* process group
    # inside dcp.save, which the async persist runs on a background thread, concurrently with
    # the caller's own collectives (a deadlock; see bench/README.md).
    nodes: list[str] = [""] * WORLD
    dist.all_gather_object(nodes, os.environ.get("PCACHE_NODE_ID", ""))
    states = {"model": state["model"], "optim": state["optim"]}
    slow, fast = spec["limited_uri"], spec["unlimited_uri"]
    managers = {
        "baseline": CheckpointManager(f"{slow}/baseline", states, keep_last=0, planner_factory=LowestRankSavePlanner),
        "node_aware": CheckpointManager(
            f"{slow}/node_aware", states, keep_last=0, planner_factory=NodeAwareSavePlanner
        ),
        "async": CheckpointManager(
            f"{slow}/async",
            states,
            keep_last=0,
            async_mode=True,
            planner_factory=functools.partial(NodeAwareSavePlanner, nodes=nodes),
        ),
        "sdk": CheckpointManager(f"{fast}/sdk", states, keep_last=0, planner_factory=NodeAwareSavePlanner),
    }
    local_root = Path(spec["local_dir"])
    samples: dict[str, list] = {}

    def add(key: str, value: Any) -> None:
        samples.setdefault(key, []).append(value)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def run(variant: str, step: int) -> dict[str, float]:
        """One save of ``variant`` between barriers; returns its timings (same on every rank)."""
        if lead:
            os.sync()  # no dirty pages of an earlier save under this one
        dist.barrier()
        started = time.perf_counter()
        out: dict[str, float] = {}
        if variant == "local_fs":
            writer = dcp.FileSystemWriter(str(local_root / f"step-{step:08d}"), sync_files=True)
            dcp.save(state, storage_writer=writer, planner=NodeAwareSavePlanner())
        elif variant == "async":
            mgr = managers[variant]
            mgr.save(step, force=True)
            out["blocked"] = slowest(mgr.last_blocked_s)
            mgr.wait()
        else:
            managers[variant].save(step, force=True)
        dist.barrier()
        out["seconds"] = time.perf_counter() - started
        if variant == "local_fs" and lead:
            shutil.rmtree(local_root / f"step-{step:08d}", ignore_errors=True)
        return out

    variants = list(VARIANTS)
    async_error = ""
    try:
        # warm-up: client connections, staging buffers of the async manager, first-call costs
        for variant in VARIANTS:
            try:
                run(variant, 0)
            except RuntimeError as exc:
                if variant != "async":
                    raise
                # staging runs before any collective of the save, on every rank alike: all ranks
                # fail here together (DTensor state, see bench/README.md) and go on without it
                async_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                variants.remove("async")
                if lead:
                    log(f"async save skipped, CheckpointManager(async_mode=True).save() failed: {async_error}")
        if lead:
            log("warm-up saves done")
        for rep in range(reps):
            step = rep + 1
            line = []
            for variant in variants:
                before = node_disk_bytes(spec["limited_worker_dirs"]) if lead else []
                res = run(variant, step)
                add(f"{variant}_s", res["seconds"])
                if "blocked" in res:
                    add("async_blocked_s", res["blocked"])
                if lead and variant in ("baseline", "node_aware"):
                    after = node_disk_bytes(spec["limited_worker_dirs"])
                    add(f"{variant}_node_bytes", [a - b for a, b in zip(after, before, strict=True)])
                line.append(
                    f"{variant} {res['seconds']:.2f}s"
                    + (f" (blocked {res['blocked']:.3f}s)" if "blocked" in res else "")
                )
            if lead:
                nb = samples["baseline_node_bytes"][-1], samples["node_aware_node_bytes"][-1]
                log(
                    f"rep {rep + 1}/{reps}: " + ", ".join(line) + "; node MB baseline "
                    + "/".join(f"{b / 1e6:.0f}" for b in nb[0]) + ", node-aware " + "/".join(f"{b / 1e6:.0f}" for b in nb[1])
                )  # fmt: skip
    finally:
        for mgr in managers.values():
            mgr.close()
    dist.barrier()
    dist.destroy_process_group()
    if lead:
        out = {"samples": samples, "total_bytes": total, "rank_bytes": local_bytes(state), "async_error": async_error}
        print(json.dumps(out))
    return 0


# ------------------------------------------------------------------ driver --


class Bench:
    """The clusters, the rank processes and the scratch directory of one run."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        from pcache.local import LocalCluster

        self.args = args
        self.root = root
        per_worker = {i: [f"--worker.node_id=node{i}"] for i in range(NODES)}
        common = ["--master.default_replication=1"]
        worker_common = [f"--worker.mem_tier_bytes={WORKER_MEM_TIER}"]
        self.limited = LocalCluster(
            str(root / "limited"),
            workers=NODES,
            master_args=common,
            worker_args=[*worker_common, f"--worker.bandwidth_limit={args.bwlimit}"],
            per_worker_args=per_worker,
        )
        self.unlimited = LocalCluster(
            str(root / "unlimited"),
            workers=NODES,
            master_args=common,
            worker_args=worker_common,
            per_worker_args=per_worker,
        )
        self.procs: list[subprocess.Popen] = []
        self.started: list[Any] = []

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        for cluster in (self.limited, self.unlimited):
            self.started.append(cluster)
            cluster.start()
        log(
            f"clusters up in {time.perf_counter() - t0:.1f}s: throttled {self.limited.master_address} "
            f"({self.args.bwlimit / 1e6:.0f} MB/s per node), unthrottled {self.unlimited.master_address}; "
            f"{NODES} workers each"
        )
        local_dir = self.root / "localfs"
        local_dir.mkdir()
        spec = {
            "port": free_port(),
            "tp": self.args.tp,
            "reps": self.args.reps,
            "hidden": self.args.hidden,
            "limited_uri": f"pcache://{self.limited.master_address}/bench",
            "unlimited_uri": f"pcache://{self.unlimited.master_address}/bench",
            "limited_worker_dirs": [str(self.limited.root / f"worker-{i}") for i in range(NODES)],
            "local_dir": str(local_dir),
        }
        spec_path = self.root / "spec.json"
        spec_path.write_text(json.dumps(spec))
        logs = self.root / "ranks"
        logs.mkdir()
        for rank in range(WORLD):
            env = {
                **os.environ,
                "PCACHE_NODE_ID": f"node{rank // RANKS_PER_NODE}",
                "OMP_NUM_THREADS": "1",
                "PYTHONWARNINGS": "ignore",
            }
            argv = [sys.executable, str(Path(__file__).resolve()), "--_rank", str(rank), "--_spec", str(spec_path)]
            with open(logs / f"rank{rank}.out", "wb") as out, open(logs / f"rank{rank}.err", "wb") as err:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=_REPO,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=None if rank == 0 else err,  # rank 0 reports progress on our stderr
                        start_new_session=True,
                    )
                )
        log(f"started {WORLD} ranks ({RANKS_PER_NODE} per node, PCACHE_NODE_ID=node0..node{NODES - 1})")
        deadline = time.monotonic() + self.args.timeout
        pending = list(enumerate(self.procs))
        while pending:
            for rank, proc in list(pending):
                rc = proc.poll()
                if rc is None:
                    continue
                pending.remove((rank, proc))
                if rc != 0:
                    err = (logs / f"rank{rank}.err").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"rank {rank} exited with {rc}" + (f":\n{err}" if err else " (see above)"))
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {self.args.timeout:.0f}s")
            time.sleep(0.1)
        lines = (logs / "rank0.out").read_text().strip().splitlines()
        return json.loads(lines[-1])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the rank and anything it started
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        for cluster in self.started:
            with contextlib.suppress(Exception):
                cluster.stop()


# ------------------------------------------------------------------ report --


def summarize(raw: dict[str, Any]) -> dict[str, float]:
    s = raw["samples"]
    m: dict[str, float] = {k: statistics.median(v) for k, v in s.items() if v and not isinstance(v[0], list)}
    for planner in ("baseline", "node_aware"):
        per_node = [statistics.median(col) for col in zip(*s[f"{planner}_node_bytes"], strict=True)]
        for i, b in enumerate(per_node):
            m[f"{planner}_node{i}_mb"] = b / 1e6
        m[f"{planner}_node_max_mb"] = max(per_node) / 1e6
        m[f"{planner}_node_mean_mb"] = statistics.mean(per_node) / 1e6
    for key in ("async_s", "async_blocked_s"):  # absent when the async save failed
        m.setdefault(key, math.nan)
    total = raw["total_bytes"]
    m["checkpoint_mb"] = total / 1e6
    for v in ("baseline", "node_aware", "sdk", "local_fs"):
        m[f"{v}_mbps"] = mbps(total, m[f"{v}_s"])
    m["rank_state_mb"] = raw["rank_bytes"] / 1e6
    m["async_stage_mbps"] = mbps(raw["rank_bytes"], m["async_blocked_s"])  # per rank
    return m


def report(m: dict[str, float], args: argparse.Namespace, async_error: str) -> None:
    res = {
        "node_aware_vs_baseline_time": m["node_aware_s"] / m["baseline_s"],
        "async_blocked_ratio": m["async_blocked_s"] / m["node_aware_s"],
        "sdk_vs_local_fs_throughput": m["sdk_mbps"] / m["local_fs_mbps"],
    }
    print()
    print(
        f"Checkpoint SDK benchmark: {m['checkpoint_mb']:.1f} MB checkpoint (hidden {args.hidden}, {LAYERS} layers, "
        f"params + 2 Adam moments, fp32), {WORLD} gloo ranks on {NODES} simulated nodes (2 each), "
        f"TP={args.tp} x DP={WORLD // args.tp}, RF=1, medians of {args.reps} reps"
    )
    header = f"{'measure':<48}{'value':>10}{'baseline':>10}{'ratio':>8}  target"
    print(header)
    print("-" * (len(header) + 8))
    bw = f"{args.bwlimit / 1e6:.0f} MB/s/node"
    rows = [
        (f"save s, node-aware vs lowest-rank ({bw})", m["node_aware_s"], m["baseline_s"],
         res["node_aware_vs_baseline_time"], f"<={NODE_AWARE_TARGET}",
         res["node_aware_vs_baseline_time"] <= NODE_AWARE_TARGET),
        (f"async save: s blocked vs sync save ({bw})", m["async_blocked_s"], m["node_aware_s"],
         res["async_blocked_ratio"], f"<={ASYNC_TARGET}",
         None if async_error else res["async_blocked_ratio"] <= ASYNC_TARGET),
        ("save MB/s, SDK (no limit) vs FileSystemWriter", m["sdk_mbps"], m["local_fs_mbps"],
         res["sdk_vs_local_fs_throughput"], "", None),
    ]  # fmt: skip
    for name, value, base, ratio, target, ok in rows:
        verdict = "" if ok is None else f"{target} " + ("ok" if ok else "MISS")
        print(f"{name:<48}{value:>10.3f}{base:>10.3f}{ratio:>8.2f}  {verdict}")
    print()
    print("MB stored per node in one save (block files of the node's worker):")
    for planner in ("baseline", "node_aware"):
        nodes = "  ".join(f"node{i} {m[f'{planner}_node{i}_mb']:6.1f}" for i in range(NODES))
        print(
            f"  {planner:<11} {nodes}   max {m[f'{planner}_node_max_mb']:.1f}, mean {m[f'{planner}_node_mean_mb']:.1f}"
        )
    print(
        f"save MB/s: lowest-rank {m['baseline_mbps']:.0f}, node-aware {m['node_aware_mbps']:.0f} "
        f"(node limit x {NODES} = {args.bwlimit * NODES / 1e6:.0f})"
    )
    if async_error:
        print(f"async save: FAILED on every rank, not measured: {async_error}")
    else:
        print(
            f"async save: save() blocked {m['async_blocked_s']:.3f}s (slowest rank) staging {m['rank_state_mb']:.0f} MB "
            f"per rank ({m['async_stage_mbps']:.0f} MB/s per rank, {WORLD} ranks copying at once); "
            f"background persist {m['async_s']:.2f}s"
        )
    print()
    print("baseline planner: LowestRankSavePlanner (rank 0 of each DP group writes every replicated item: all of")
    print("  them on node0); node-aware: NodeAwareSavePlanner. Both through CheckpointManager into the throttled")
    print("  cluster, whose workers move at most --bwlimit bytes/s each (short-circuit writes included).")
    print("SDK vs local: CheckpointManager (node-aware) into the unthrottled cluster vs dcp.save with the stock")
    print("  FileSystemWriter(sync_files=True) into a directory on the same disk, same planner and ranks.")
    print("Time ratios are lower-is-better; the throughput ratio is higher-is-better.")
    keys: dict[str, Any] = {
        **{k: round(v, 3) for k, v in res.items()},
        "baseline_save_s": m["baseline_s"],
        "node_aware_save_s": m["node_aware_s"],
        "baseline_mbps": m["baseline_mbps"],
        "node_aware_mbps": m["node_aware_mbps"],
        "baseline_node_max_mb": m["baseline_node_max_mb"],
        "baseline_node_mean_mb": m["baseline_node_mean_mb"],
        "node_aware_node_max_mb": m["node_aware_node_max_mb"],
        "node_aware_node_mean_mb": m["node_aware_node_mean_mb"],
        "async_blocked_s": m["async_blocked_s"],
        "async_persist_s": m["async_s"],
        "async_stage_mbps": m["async_stage_mbps"],
        "rank_state_mb": m["rank_state_mb"],
        "sync_save_s": m["node_aware_s"],
        "sdk_save_s": m["sdk_s"],
        "sdk_mbps": m["sdk_mbps"],
        "local_fs_save_s": m["local_fs_s"],
        "local_fs_mbps": m["local_fs_mbps"],
        "checkpoint_mb": m["checkpoint_mb"],
        "bwlimit_mbps": args.bwlimit / 1e6,
        "ranks": WORLD,
        "nodes": NODES,
        "tp": args.tp,
        "reps": args.reps,
    }
    print_result(keys)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="96 MB checkpoint, 2 reps (under two minutes)")
    p.add_argument("--size", type=parse_size, help="checkpoint bytes, about (binary suffixes: 1GiB); default 384 MB")
    p.add_argument("--reps", type=int, help="repetitions per measure (default 5, quick 2)")
    p.add_argument(
        "--bwlimit",
        type=parse_size,
        default=60_000_000,
        help="bytes/s per node (binary suffixes: 50MiB); default 60 MB/s",
    )
    p.add_argument("--tp", type=int, default=1, choices=(1, 2, 4), help="TP degree, DP = 8 / TP (default 1: pure DP)")
    p.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (cluster and rank logs)")
    p.add_argument("--timeout", type=float, help="seconds the ranks may run (default 1800, quick 300)")
    p.add_argument("--_rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._rank is not None:
        return args
    if args.size is None:
        args.size = 96_000_000 if args.quick else 384_000_000
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    if args.timeout is None:
        args.timeout = 300.0 if args.quick else 1800.0
    if args.reps < 1 or args.bwlimit < 1 or args.size < 1:
        p.error("--reps, --bwlimit and --size must be positive")
    if args.tp == WORLD:
        p.error(f"--tp {WORLD} leaves no data parallelism (nothing replicated to plan)")
    args.hidden = hidden_size(args.size, args.tp)
    return args


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._rank is not None:
        return rank_main(args._spec, args._rank)
    setup_logging("WARNING", fmt="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM cleans up like Ctrl-C
    root = Path(tempfile.mkdtemp(prefix="pcache-ckpt-bench-", dir=args.dir))
    started = time.perf_counter()
    bench: Bench | None = None
    try:
        bench = Bench(args, root)
        raw = bench.run()
    finally:
        if bench is not None:
            bench.stop()
        if args.keep:
            log(f"scratch kept in {root}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(root)
    log(f"done in {time.perf_counter() - started:.1f}s")
    report(summarize(raw), args, raw.get("async_error", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
