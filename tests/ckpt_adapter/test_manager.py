"""CheckpointManager in one process (async staging, keep-last-N, helpers) and a rank killed mid-save."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from ckpt_adapter import CheckpointManager, load, save
from ckpt_adapter.storage import PCacheFileSystem
from pcache.client import Client
from pcache.common.errors import InvalidArgument, QuotaExceeded
from pcache.common.process import free_port
from tests.ckpt_adapter.dist_worker import expected
from tests.ckpt_adapter.test_dcp import REPO, run_ranks

MiB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Counter:
    """A Stateful with a tensor and a Python value."""

    def __init__(self) -> None:
        self.t = torch.zeros(4)
        self.n = 0

    def state_dict(self):
        return {"t": self.t, "n": self.n}

    def load_state_dict(self, sd):
        self.t.copy_(sd["t"])
        self.n = sd["n"]


def test_sync_save_load_keep_last(shared_cluster) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/keep"
    counter = Counter()
    weights = {"w": torch.arange(10.0)}
    mgr = CheckpointManager(root, {"c": counter, "weights": weights}, keep_last=2, interval=10)
    assert mgr.load() is False  # nothing yet: a fresh start
    for step in range(1, 51):
        counter.n = step
        counter.t.fill_(step)
        weights["w"].add_(1)
        mgr.save(step)
    assert [c.step for c in mgr.list()] == [40, 50] and all(c.complete for c in mgr.list())
    counter.n, weights["w"] = -1, torch.zeros(10)
    restore = CheckpointManager(root, {"c": counter, "weights": weights})
    assert restore.load() and restore.loaded_step == 50
    assert counter.n == 50 and torch.equal(counter.t, torch.full((4,), 50.0))
    assert torch.equal(weights["w"], torch.arange(10.0) + 50)
    assert restore.load(40) and counter.n == 40
    with pytest.raises(FileNotFoundError):
        restore.load(30)
    mgr.close()
    restore.close()


def test_async_save_is_immune_to_later_updates_and_memory_stays_flat(shared_cluster) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/async"
    state = {"p": torch.randn(1024, 1024), "q": torch.randn(2 * MiB // 4)}  # 4 MiB + 2 MiB
    staging = sum(t.numel() * t.element_size() for t in state.values())
    mgr = CheckpointManager(root, {"model": state}, async_mode=True, keep_last=1)
    before = {k: v.clone() for k, v in state.items()}
    mgr.save(1, force=True)
    for t in state.values():
        t.add_(1000.0)  # training goes on right after save() returns
    mgr.wait()
    check = {"model": {k: torch.zeros_like(v) for k, v in state.items()}}
    assert CheckpointManager(root, check).load(1)
    for k in state:
        assert torch.equal(check["model"][k], before[k])
    rss_after_one = rss_bytes()
    for step in range(2, 22):
        mgr.save(step, force=True)
        for t in state.values():
            t.add_(1.0)
    mgr.close()
    assert rss_bytes() - rss_after_one < staging + 48 * MiB  # one staging buffer, not twenty
    assert mgr.last_blocked_s < 5


def test_torch_save_style_helpers(shared_cluster) -> None:
    uri = f"pcache://{shared_cluster.master_address}/ckpt/single/model.pt"
    obj = {"w": torch.randn(300, 300), "meta": {"epoch": 3}}
    save(obj, uri)
    back = load(uri)
    assert torch.equal(back["w"], obj["w"]) and back["meta"] == {"epoch": 3}
    with pytest.raises(FileNotFoundError):
        load(f"pcache://{shared_cluster.master_address}/ckpt/single/missing.pt")


class _Unpicklable:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise pickle.PicklingError("not this one")


def test_a_save_that_fails_leaves_the_last_good_file_and_no_new_one(shared_cluster) -> None:
    """From a helper's drill: ``save`` wrote through ``with io.BufferedWriter(...)``, whose exit
    closes (commits) the file even when ``torch.save`` raised: a failed save replaced the last
    good checkpoint with a truncated one (674 bytes, "PytorchStreamReader failed locating file
    data.pkl"), and left one behind on a new path."""
    base = f"pcache://{shared_cluster.master_address}/ckpt/failing"
    good = {"w": torch.randn(200, 200), "step": 1}
    save(good, f"{base}/model.pt")
    big_then_bad = {"w": torch.randn(600, 600), "z": _Unpicklable()}  # its zip header is written, then it fails
    with pytest.raises(pickle.PicklingError):
        save(big_then_bad, f"{base}/model.pt")
    back = load(f"{base}/model.pt")
    assert torch.equal(back["w"], good["w"]) and back["step"] == 1
    with pytest.raises(pickle.PicklingError):
        save(big_then_bad, f"{base}/new.pt")
    with pytest.raises(FileNotFoundError):
        load(f"{base}/new.pt")


@pytest.mark.slow
def test_rank_killed_mid_save_leaves_the_last_complete_checkpoint(make_cluster) -> None:
    cluster = make_cluster(workers=2, worker_args=["--worker.bandwidth_limit=24MiB"])
    root = f"pcache://{cluster.master_address}/ckpt/crash"
    run_ranks_big = [sys.executable, "-m", "tests.ckpt_adapter.dist_worker", "save", root]
    run_ranks("save", root, world=2, tp=2, step=1)  # small and complete
    port = free_port()
    procs = [
        subprocess.Popen([*run_ranks_big, str(r), "2", str(port), "2", "2", "96"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        for r in range(2)
    ]  # fmt: skip
    with Client(master=cluster.master_address) as pc:
        deadline = time.monotonic() + 60
        while not pc.exists("/ckpt/crash/step-00000002"):
            assert time.monotonic() < deadline, "the second save never started"
            time.sleep(0.05)
        time.sleep(0.5)  # in the middle of writing 96 MiB at 24 MiB/s
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(10)
        procs[0].kill()  # its peer is gone: the launcher tears the job down
        procs[0].wait(10)
        want = expected()
        state = {"model": {k: torch.zeros_like(v) for k, v in want.items()}}
        mgr = CheckpointManager(root, state, keep_last=2)
        infos = {c.step: c.complete for c in mgr.list()}
        assert infos == {1: True, 2: False}  # the partial one is reported as incomplete
        assert mgr.load() and mgr.loaded_step == 1
        assert all(torch.equal(state["model"][k], v) for k, v in want.items())
        mgr.save(3, force=True)  # the next complete checkpoint garbage-collects the partial one
        assert {c.step: c.complete for c in mgr.list()} == {1: True, 3: True}
        mgr.close()


def _misuse_ranks(scenario: str, root: str) -> list[tuple[str, str]]:
    """Run the two ranks of a :mod:`tests.ckpt_adapter.misuse_worker` scenario; their (stdout, stderr)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.ckpt_adapter.misuse_worker", scenario, root, str(r), str(port)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    return [p.communicate(timeout=120) for p in procs]


@pytest.mark.parametrize("scenario", ["alone", "dead"])
def test_a_save_not_every_rank_joins_fails_in_bounded_time_naming_the_cause(shared_cluster, scenario: str) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/misuse-{scenario}"
    outs = _misuse_ranks(scenario, root)
    rank0 = json.loads(outs[0][0].strip().splitlines()[-1])
    assert "Timeout" in rank0["error"] and "not every rank took part" in rank0["error"], outs[0][1][-2000:]
    assert rank0["seconds"] < 30  # collective_timeout=5, not gloo's 30 minutes
    if scenario == "alone":
        assert json.loads(outs[1][0].strip().splitlines()[-1])["rank"] == 1  # its barrier completed
    with Client(master=shared_cluster.master_address) as pc:  # nothing was committed
        assert not pc.exists(f"/ckpt/misuse-{scenario}/step-00000001/.metadata")


def test_ranks_whose_listings_differ_come_to_one_outcome(shared_cluster) -> None:
    """Rank 1 cannot list the root (its store does not answer), rank 0 finds nothing: rank 0
    decided on a fresh start and died in the training's next collective, while rank 1 failed."""
    outs = _misuse_ranks("unlisted", f"pcache://{shared_cluster.master_address}/ckpt/misuse-unlisted")
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r.get("loaded") for r in ranks] == [None, None], outs
    assert ranks[0]["error"].startswith("StoreTimeout: checkpoint load: rank 1 could not list"), ranks[0]
    assert ranks[1]["error"].startswith("StoreTimeout: the under-store did not answer"), ranks[1]


class _Quota:
    """Fails the shard streams torch opens on its writer threads beyond the first, as a full
    quota fails them (torch 2.x drops those threads' errors)."""

    def __init__(self, monkeypatch) -> None:
        real = PCacheFileSystem.create_stream
        self.failed = 0

        @contextlib.contextmanager
        def create_stream(fs, path, mode):
            if threading.current_thread() is not threading.main_thread() and str(path).endswith(".distcp"):
                self.failed += 1
                exc = QuotaExceeded("tenant 'team' has used 40 MiB of its 40 MiB (pcache tenant quota)")
                getattr(fs, "failures", []).append(exc)  # as the real stream records it
                raise exc
            with real(fs, path, mode) as stream:
                yield stream

        monkeypatch.setattr(PCacheFileSystem, "create_stream", create_stream)


def test_a_shard_failing_on_a_writer_thread_fails_the_save_and_keeps_the_last_good_checkpoint(
    shared_cluster, monkeypatch
) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/threads"
    state = {"a": torch.randn(1 << 20), "b": torch.randn(1 << 19), "c": torch.randn(1 << 18)}
    mgr = CheckpointManager(root, {"model": state}, keep_last=1, thread_count=2)
    mgr.save(1, force=True)
    quota = _Quota(monkeypatch)
    with pytest.raises(QuotaExceeded) as err:  # a PCacheError, not torch's CheckpointException
        mgr.save(2, force=True)
    assert quota.failed and "checkpoint save of step 2 failed on rank 0" in str(err.value)
    monkeypatch.undo()
    assert [(c.step, c.complete) for c in mgr.list()] == [(1, True), (2, False)]
    check = {"model": {k: torch.zeros_like(v) for k, v in state.items()}}
    assert CheckpointManager(root, check).load() and all(torch.equal(check["model"][k], state[k]) for k in state)
    mgr.close()


def test_an_async_save_that_failed_is_raised_by_the_next_call_naming_its_step(shared_cluster, monkeypatch) -> None:
    root = f"pcache://{shared_cluster.master_address}/ckpt/async-fail"
    mgr = CheckpointManager(root, {"model": {"w": torch.randn(1 << 18)}}, async_mode=True, thread_count=2)
    quota = _Quota(monkeypatch)
    mgr.save(3, force=True)  # returns once staged
    with pytest.raises(QuotaExceeded) as err:
        mgr.save(4, force=True)
    assert quota.failed and "checkpoint save of step 3 failed" in str(err.value)
    monkeypatch.undo()
    mgr.save(5, force=True)
    mgr.close()
    assert [(c.step, c.complete) for c in mgr.list()] == [(5, True)]  # the failed one was collected


def test_a_save_makes_room_first_so_a_full_quota_of_failed_saves_does_not_stick(shared_cluster, monkeypatch) -> None:
    """From a helper's drill: a save that failed on a full quota left its incomplete step, which
    collect_garbage removed only once a later save committed, and none could: a job restarted
    with a smaller ``keep_last`` failed every save. A save now removes every other incomplete
    step and the complete ones beyond ``keep_last`` before it writes (one save at a time per
    root); and a negative step is refused (``save(-1)`` made ``step--0000001``, never listed)."""
    root = f"pcache://{shared_cluster.master_address}/ckpt/room"
    state = {"w": torch.randn(1 << 18)}
    first = CheckpointManager(root, {"model": state}, keep_last=3, thread_count=2)
    for step in (1, 2, 3):
        first.save(step, force=True)
    _Quota(monkeypatch)
    with pytest.raises(QuotaExceeded):
        first.save(4, force=True)
    monkeypatch.undo()
    first.close()
    assert [(c.step, c.complete) for c in first.list()] == [(1, True), (2, True), (3, True), (4, False)]

    restarted = CheckpointManager(root, {"model": state}, keep_last=1, thread_count=2)
    with pytest.raises(InvalidArgument, match="a step is an int >= 0"):
        restarted.save(-1, force=True)
    seen: list[list[tuple[int, bool]]] = []
    real = PCacheFileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(fs, path, mode):
        if not seen:  # the save's first shard: what the root holds once the save has made room
            seen.append([(c.step, c.complete) for c in restarted.list()])
        with real(fs, path, mode) as stream:
            yield stream

    monkeypatch.setattr(PCacheFileSystem, "create_stream", create_stream)
    restarted.save(5, force=True)
    monkeypatch.undo()
    assert seen and all(got == [(3, True), (5, False)] for got in seen), seen  # two writer threads may both look
    assert [(c.step, c.complete) for c in restarted.list()] == [(5, True)]
    restarted.close()


def test_after_a_rollback_the_last_saves_are_kept_and_loaded_not_the_abandoned_steps(shared_cluster) -> None:
    """A run rolled back to step 10 (a loss spike) saves 11, 12, 13: keep-last kept only the
    newest of them beside the abandoned 20, and a restart resumed from 20."""
    root = f"pcache://{shared_cluster.master_address}/ckpt/rollback"
    counter = Counter()
    mgr = CheckpointManager(root, {"c": counter}, keep_last=2)
    for step in (10, 20):
        counter.n = step
        mgr.save(step, force=True)
    assert mgr.load(10) and counter.n == 10
    for step in (11, 12, 13):
        counter.n = step
        mgr.save(step, force=True)
    mgr.close()
    assert [c.step for c in mgr.list()] == [12, 13]
    assert [c.step for c in mgr.committed()] == [12, 13]
    counter.n = -1
    restart = CheckpointManager(root, {"c": counter})
    assert restart.load() and restart.loaded_step == 13 and counter.n == 13
    restart.close()
