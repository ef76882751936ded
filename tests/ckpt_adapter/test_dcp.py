"""DCP through PCache with real ranks (gloo on CPU) on a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckpt_adapter import CheckpointManager
from pcache.common.process import free_port
from tests.ckpt_adapter.dist_worker import expected

REPO = Path(__file__).resolve().parents[2]


def run_ranks(scenario: str, root: str, world: int, tp: int, step: int, timeout: float = 240) -> list[dict]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "PCACHE_NODE_ID": f"node{rank // 2}", "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "tests.ckpt_adapter.dist_worker", scenario, root, str(rank), str(world),
                str(port), str(tp), str(step)]  # fmt: skip
        procs.append(
            subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.fixture(scope="module")
def saved(shared_cluster) -> str:
    """A checkpoint saved by 4 ranks: 2 simulated nodes x 2, TP=2 x DP=2 (DP groups of 2)."""
    root = f"pcache://{shared_cluster.master_address}/ckpt/run-4ranks"
    run_ranks("save", root, world=4, tp=2, step=100)
    return root


def test_save_and_load_with_four_ranks(saved: str) -> None:
    results = run_ranks("load", saved, world=4, tp=2, step=100)
    assert [r["loaded"] for r in results] == [100] * 4


@pytest.mark.parametrize("world", [2, 3])
def test_reshard_on_load(saved: str, world: int) -> None:
    results = run_ranks("load", saved, world=world, tp=world, step=100)
    assert len(results) == world


def test_layout_is_torchs_and_commit_is_last(saved: str, shared_cluster) -> None:
    from pcache.client import Client

    with Client(master=shared_cluster.master_address) as pc:
        names = sorted(e.name for e in pc.listdir("/ckpt/run-4ranks/step-00000100"))
    assert ".metadata" in names
    shards = [n for n in names if n.endswith(".distcp")]
    assert shards and all(n.startswith("__") for n in shards)
    assert not any(n.endswith(".tmp") for n in names)


def test_single_process_load_of_a_distributed_checkpoint(saved: str) -> None:
    want = expected()
    state = {"model": {k: torch.zeros_like(v) for k, v in want.items()}}
    mgr = CheckpointManager(saved, state)
    assert mgr.load()
    for k, v in want.items():
        assert torch.equal(state["model"][k], v)
    mgr.close()


def test_stock_filesystem_reader_over_the_fuse_mount(saved: str, shared_cluster, tmp_path: Path) -> None:
    from tests.fuse_client.conftest import Mount, fuse_available

    reason = fuse_available()
    if reason:
        pytest.skip(f"FUSE unavailable: {reason}")
    mount = Mount(shared_cluster.master_address, tmp_path / "mnt").start()
    try:
        want = expected()
        state = {"model": {k: torch.zeros_like(v) for k, v in want.items()},
                 "optim": {"exp_avg": {k: torch.zeros_like(v) for k, v in want.items()}, "step": 0}}  # fmt: skip
        reader = dcp.FileSystemReader(str(mount.path / "ckpt" / "run-4ranks" / "step-00000100"))
        dcp.load(state, storage_reader=reader)
        for k, v in want.items():
            assert torch.equal(state["model"][k], v) and torch.equal(state["optim"]["exp_avg"][k], v * 2)
        assert state["optim"]["step"] == 7
    finally:
        mount.stop()


def test_async_save_of_sharded_state_next_to_training_collectives(shared_cluster) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/run-async"
    run_ranks("save_async", root, world=4, tp=2, step=5)
    results = run_ranks("load", root, world=4, tp=2, step=5)  # the pre-mutation values
    assert [r["loaded"] for r in results] == [5] * 4


def test_a_save_over_a_checkpoint_that_dies_leaves_it_incomplete_not_mixed(shared_cluster) -> None:
    """torch rewrites an existing checkpoint's shards in place and replaces ``.metadata`` last:
    a save over step N that died after rewriting a shard left new shards under the old
    ``.metadata``, a mix of two saves (one rank's new, another's old) that loaded as complete.
    The writer removes ``.metadata`` before any shard is rewritten: the step is incomplete until
    the new save commits."""
    from torch.distributed.checkpoint.api import CheckpointException

    from ckpt_adapter.storage import PCacheStorageReader, PCacheStorageWriter
    from pcache.client import Client

    uri = f"pcache://{shared_cluster.master_address}/ckpt/resave/step-5"
    first = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10)}
    dcp.save(first, storage_writer=PCacheStorageWriter(uri))
    seen: list[bool] = []

    class DiesAfterTheShards(PCacheStorageWriter):
        def write_data(self, plan, planner):  # a rank killed once its shard is rewritten
            seen.append(self.fs.exists(self.fs.concat_path(self.path, ".metadata")))
            written = super().write_data(plan, planner)
            written.wait()
            raise RuntimeError("rank killed after rewriting its shard")

    second = {"w": torch.arange(1000, dtype=torch.float32) * -1, "b": torch.zeros(10)}
    with pytest.raises(CheckpointException) as died:  # a BaseException, not an Exception
        dcp.save(second, storage_writer=DiesAfterTheShards(uri))
    assert "rank killed" in repr(died.value.failures)
    assert seen == [False]  # decommitted before the rewrite began
    with Client(master=shared_cluster.master_address) as pc:
        names = {e.name for e in pc.listdir("/ckpt/resave/step-5")}
    assert ".metadata" not in names and any(n.endswith(".distcp") for n in names)
    into = {"w": torch.zeros(1000), "b": torch.zeros(10)}
    with pytest.raises(CheckpointException) as refused:  # torch wraps the reader's FileNotFoundError
        dcp.load(into, storage_reader=PCacheStorageReader(uri))
    assert ".metadata" in repr(refused.value.failures)
    dcp.save(second, storage_writer=PCacheStorageWriter(uri))  # the next save commits it whole
    dcp.load(into, storage_reader=PCacheStorageReader(uri))
    assert torch.equal(into["w"], second["w"]) and torch.equal(into["b"], second["b"])
