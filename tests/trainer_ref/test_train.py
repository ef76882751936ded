"""The reference trainer on the real corpus: loss falls, spikes are skipped and retried, and a rank
killed with SIGKILL is recovered by the supervisor to the same bits as an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainer_ref.train import OptimSection, SpikeHandler, SpikeSection, lr_at

STEPS = 30
INJECT = 14  # a corrupted batch here: a spike, retried RETRY batches later
RETRY = 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    subprocess.run([sys.executable, "-m", "trainer_ref.data", "build", "--out", str(out), "--max-bytes", "2000000",
                    "--vocab-size", "4096"], check=True, capture_output=True, timeout=300)  # fmt: skip
    return out


def train_args(shards: Path, ckpt: str, **extra) -> list[str]:
    args = {
        "data.root": shards, "data.seq_len": 64, "data.micro_batch": 4, "train.steps": STEPS,
        "train.inject_bad_batch_at": INJECT, "spike.retry_delay": RETRY, "spike.window": 8, "spike.min_history": 5,
        "spike.sigmas": 3, "ckpt.uri": ckpt, "ckpt.interval": 3, "ckpt.keep_last": 2, "optim.warmup_steps": 5,
        "model.routing_warmup_steps": 10, **extra,
    }  # fmt: skip
    return [f"--{k}={v}" for k, v in args.items()]


def launch(
    run_dir: Path, args: list[str], *, kill_at: int | None = None, sig: int = signal.SIGKILL, hang_timeout: float = 120
) -> tuple[int, float]:
    """Run 2 ranks under the supervisor; with ``kill_at``, send ``sig`` to rank 1 once it reports that step."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_ref.launch", "--nproc", "2", "--max-restarts", "2", "--run-dir", str(run_dir),
         "--hang-timeout", str(hang_timeout), "--grace", "3", "--", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    killed_at = -1.0
    deadline = time.monotonic() + 600
    beat = run_dir / "heartbeat-rank1.json"
    while kill_at is not None and killed_at < 0 and proc.poll() is None and time.monotonic() < deadline:
        try:
            doc = json.loads(beat.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            doc = {}
        if doc.get("step", -1) >= kill_at and doc.get("state") == "training":
            os.kill(doc["pid"], sig)
            killed_at = doc["step"]
        time.sleep(0.01)
    out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    assert proc.returncode == 0, out + "".join(p.read_text() for p in run_dir.glob("rank*.log"))[-4000:]
    return proc.returncode, killed_at


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics-rank0.jsonl").read_text().splitlines()]


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final-model.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(shards, shared_cluster, tmp_path_factory) -> Path:
    """An uninterrupted 2-rank run with the injected bad batch."""
    run = tmp_path_factory.mktemp("ref")
    launch(run, train_args(shards, f"pcache://{shared_cluster.master_address}/train-test/{run.name}"))
    return run


def test_loss_falls_and_the_spike_is_skipped_then_retried(reference: Path) -> None:
    rows = metrics(reference)
    losses = [r["loss"] for r in rows if r["verdict"] == "ok"]
    assert losses[-1] < losses[0] - 1.0  # the tiny model learns the stdlib corpus
    spikes = [r for r in rows if r["verdict"] != "ok"]
    assert [r["step"] for r in spikes] == [INJECT + 1]  # logged after the step counter moved on
    bad = spikes[0]["batch"]
    served = [r["batch"] for r in rows]
    assert served.count(bad) == 2  # skipped once, served again later...
    retry_step = served.index(bad, served.index(bad) + 1)
    assert rows[retry_step]["verdict"] == "ok" and rows[retry_step]["step"] > INJECT + RETRY  # ...and learned from
    assert all("load_max_over_mean/0" in r and "balance_loss" in r and "z_loss" in r for r in rows)
    assert [e["event"] for e in events(reference)] == ["start", "finished"]


def test_kill_9_of_a_rank_recovers_to_the_same_bits(reference, shards, shared_cluster, tmp_path) -> None:
    kill_at = random.Random().randint(4, STEPS - 4)
    run = tmp_path / "run"
    _, killed = launch(run, train_args(shards, f"pcache://{shared_cluster.master_address}/train-test/k{tmp_path.name}"),
                       kill_at=kill_at)  # fmt: skip
    assert killed >= kill_at
    kinds = [e["event"] for e in events(run)]
    assert kinds[:3] == ["start", "failure", "start"] and kinds[-1] == "finished", kinds
    assert "recovered" in kinds
    want, got = final_state(reference), final_state(run)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want), f"killed at step {killed}: parameters differ"


def test_resume_between_skip_and_retry_gives_the_same_bits(reference, shards, shared_cluster, tmp_path) -> None:
    run = tmp_path / "run"
    _, killed = launch(run, train_args(shards, f"pcache://{shared_cluster.master_address}/train-test/s{tmp_path.name}"),
                       kill_at=INJECT + 3)  # fmt: skip
    assert INJECT < killed < INJECT + RETRY
    resumed = [e for e in events(run) if e["event"] == "recovered"]
    assert resumed, events(run)
    want, got = final_state(reference), final_state(run)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_hung_rank_is_restarted(reference, shards, shared_cluster, tmp_path) -> None:
    """SIGSTOP: the rank's own watchdog cannot act; its stale heartbeat makes the supervisor restart."""
    run = tmp_path / "run"
    _, stopped = launch(run, train_args(shards, f"pcache://{shared_cluster.master_address}/train-test/h{tmp_path.name}"),
                        kill_at=8, sig=signal.SIGSTOP, hang_timeout=10)  # fmt: skip
    failures = [e for e in events(run) if e["event"] == "failure"]
    assert failures and "hung" in failures[0]["reason"], events(run)
    want, got = final_state(reference), final_state(run)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_spike_handler_lowers_lr_while_spikes_persist_and_recovers() -> None:
    h = SpikeHandler(SpikeSection(window=10, min_history=5, sigmas=3, ratio=1.3, lr_decay=0.5, lr_recover=2.0))
    for i in range(8):
        assert h.check(i, 2.0 + 0.01 * (i % 2), 1.0) == "ok"
    assert h.check(8, 9.0, 1.0) == "spike" and h.lr_scale == 0.5
    assert h.check(9, 9.5, 1.0) == "spike" and h.lr_scale == 0.25
    assert h.check(10, float("nan"), 1.0) == "nonfinite" and h.lr_scale == 0.125
    assert h.check(11, 2.0, float("inf")) == "nonfinite"
    assert h.check(12, 2.01, 1.0) == "ok" and h.lr_scale == 0.125
    assert h.check(13, 2.0, 50.0) == "spike"  # a gradient-norm spike alone counts too
    state = h.state_dict()
    again = SpikeHandler(h.cfg)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.state_dict() == state and again.skipped == [8, 9, 10, 11, 13]


def test_lr_schedule() -> None:
    cfg = OptimSection(lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, cfg, 100) == pytest.approx(0.1) and lr_at(9, cfg, 100) == pytest.approx(1.0)
    assert lr_at(10, cfg, 100) == pytest.approx(1.0) and lr_at(100, cfg, 100) == pytest.approx(0.1)
    assert lr_at(55, cfg, 100) == pytest.approx(0.55)


def test_runs_under_torchrun(shards: Path, tmp_path: Path) -> None:
    from pcache.common.process import free_port

    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         "-m", "trainer_ref.train", f"--data.root={shards}", "--data.seq_len=32", "--data.micro_batch=2",
         "--train.steps=3", f"--train.run_dir={tmp_path}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["step"] == 3
    assert (tmp_path / "metrics-rank1.jsonl").exists()
