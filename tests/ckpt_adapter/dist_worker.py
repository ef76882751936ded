"""One rank of a distributed checkpoint test (gloo on CPU), run as a process by the tests.

Usage: python -m tests.ckpt_adapter.dist_worker SCENARIO ROOT_URI RANK WORLD PORT TP STEP [MB]
The state is a TP-sharded (DTensor, Shard(0)) and DP-replicated model plus optimizer moments,
generated from a fixed seed, so any rank layout can check what it loaded.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from ckpt_adapter import CheckpointManager

SHAPES = [(48, 64), (96, 32), (24, 128), (12, 8), (240, 100)]


def expected(scale_mb: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    out = {f"w{i}": torch.randn(shape, generator=gen) for i, shape in enumerate(SHAPES)}
    if scale_mb:
        out["big"] = torch.randn(scale_mb * (1 << 18) // 96 * 96, 1, generator=gen)  # scale_mb MiB of fp32
    return out


def build(mesh, tensors: dict[str, torch.Tensor], zero: bool) -> dict[str, DTensor]:
    placements = [Replicate(), Shard(0)] if mesh.ndim == 2 else [Shard(0)]
    return {k: distribute_tensor(torch.zeros_like(v) if zero else v, mesh, placements) for k, v in tensors.items()}


def main() -> int:
    scenario, root, rank, world, port, tp, step = sys.argv[1:8]
    mb = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    rank, world, tp, step = int(rank), int(world), int(tp), int(step)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dp = world // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp")) if dp > 1 else init_device_mesh("cpu", (tp,))
    want = expected(mb)
    zero = scenario == "load"
    model = build(mesh, want, zero)
    optim = {"exp_avg": build(mesh, {k: v * 2 for k, v in want.items()}, zero), "step": 0 if zero else 7}
    mgr = CheckpointManager(root, {"model": model, "optim": optim}, keep_last=2, async_mode=scenario == "save_async")
    result: dict = {"rank": rank}
    if scenario == "save":
        mgr.save(step, force=True)
    elif scenario == "save_async":
        mgr.save(step, force=True)  # returns after staging this rank's shards
        for v in [*model.values(), *optim["exp_avg"].values()]:
            v.to_local().add_(1000.0)  # training mutates in place right away
        total = torch.zeros(1)
        dist.all_reduce(total)  # and runs collectives on the default group meanwhile
        mgr.wait()
    elif scenario == "load":
        assert mgr.load(step), "no checkpoint"
        for k, v in want.items():
            assert torch.equal(model[k].full_tensor(), v), k
            assert torch.equal(optim["exp_avg"][k].full_tensor(), v * 2), k
        assert optim["step"] == 7
        result["loaded"] = mgr.loaded_step
    mgr.close()
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
