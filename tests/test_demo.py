"""The main job (``scripts/demo.py --quick``) end to end, twice: every outcome it reports holds, and
it leaves nothing running, mounted or on disk behind it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import leftovers

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs FUSE (/dev/fuse)")


def run_demo(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, timeout=840, cwd=out.parent,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return proc, summary


def check_outcomes(proc: subprocess.CompletedProcess, s: dict, steps: int, kill_at: int) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert s["status"] == 0 and s["checks"] and all(s["checks"].values()), s["checks"]
    assert len(s["checks"]) == 20  # 15, 2 for the leader master's SIGKILL, 2 for ls -l and fsspec, 1 for etcd
    # 1: two regions and a cluster of a leader + follower pair and 3 workers with a mount
    assert s["services"]["workers"] == 3 and s["services"]["region_a"] != s["services"]["region_b"]
    assert s["services"]["masters"] == 2
    # 2: the shards went local -> A with every object CRC'd in-stream and checked
    rep = s["dataset"]["upload"]
    v = rep["verification"]
    assert rep["state"] == "ok" and rep["copied"] == s["dataset"]["shards"] + 2  # + index.json, tokenizer.json
    assert v["runtime"]["crc32c_in_stream"] == rep["copied"] and v["metadata"]["failed"] == 0
    assert v["metadata"]["checked"] == rep["copied"] and not v["failures"]
    # 3: region A's dataset bound into PCache, not copied: the mount lists every object, reads through
    bound = s["dataset"]["bind"]
    assert bound["listed_equal"] and bound["objects"] == rep["copied"] and bound["uri"] == "s3://datasets/stdlib-tokens"
    assert bound["bytes"] == rep["copied_bytes"]
    load = bound["load"]  # pcache load: the whole dataset fetched by the workers, nothing failed
    assert load["files"] == bound["objects"] and load["bytes"] == bound["bytes"] and load["failed"] == 0
    assert load["fetched_blocks"] == load["blocks"] > 0 and load["fetched_bytes"] == bound["bytes"]
    assert s["dataset"]["train_tokens"] > 500_000
    views = s["dataset"]["views"]  # ls -l on the mount and fsspec's pcache:// see the same objects
    assert views["ls_l_entries"] == views["fsspec_objects"] == bound["objects"]
    # 3: a byte flipped on a worker's disk was caught, never served, and repaired from the good replica
    assert s["integrity"]["served_right"] and s["integrity"]["repaired"]
    # 3: a second tenant stops at its quota with EDQUOT; a block read without a token is refused
    assert s["tenants"] == {
        "kept_mib": 4, "stopped_errno": 122, "tokenless_read": "PermissionDenied", "revoked_token_refused": True,
    }  # fmt: skip
    # 4-5: trained to the end through one SIGKILL and one recovery from a checkpoint before the kill
    tr = s["training"]
    assert tr["steps"] == steps and tr["restarts"] == 1 and tr["events"][-1] == "finished"
    assert tr["killed"]["step"] >= kill_at and "signal 9" in tr["failure"]
    assert 0 < tr["resumed_from_step"] <= tr["killed"]["step"] and tr["resumed_from_step"] % 10 == 0
    assert tr["recovery_seconds"] > 0 and tr["last_loss"] < tr["first_loss"] - 1.0
    assert tr["tokens_per_s_median"] > 0
    # 5: the leader master SIGKILLed mid-run, before the rank: the follower took over
    lk = tr["leader_killed"]
    assert 0 < lk["step"] < tr["killed"]["step"] and lk["epoch_after"] > lk["epoch_before"]
    assert 0 < lk["first_mutation_s"] < 30 and tr["failover_stall_seconds"] is not None
    # 5: etcd's data lost under the pair: halted, `pcache ha recover`, higher epochs, nothing lost
    el = s["etcd_loss"]
    assert el["checkpoints_kept"] and el["epoch_after"] > el["epoch_before"] + 1_000_000
    assert 0 < el["halted_s"] <= el["first_mutation_s"] < 120
    # 6: the newest checkpoint (the last step) went to region B, data sampled, nothing failed
    ck = s["checkpoint"]
    assert ck["name"] == f"step-{steps:08d}" and ck["region_b"].startswith("s3://checkpoints/")
    data = ck["data"]["verification"]
    assert data["sample"]["checked"] >= 1 and data["sample"]["failed"] == 0
    assert data["runtime"]["crc32c_in_stream"] == ck["data"]["copied"] >= 1
    assert ck["marker"]["copied"] == 1  # .metadata, after the data
    # 7: what came back from region B is the trainer's final state, tensor for tensor
    assert s["restore"]["equal"] is True and s["restore"]["step"] == steps and s["restore"]["tensors"] > 10
    assert s["restore"]["sync"]["copied_bytes"] == ck["bytes"]
    # 8: the plot, and nothing left behind
    assert s["cluster"]["missing"] == 0 and s["cluster"]["under_replicated"] == 0 and s["cluster"]["corrupt"] == 0
    assert s["cleanup_problems"] == []
    assert not os.path.exists(s["work_dir"])
    assert leftovers(s["work_dir"]) == []


@pytest.mark.timeout(1800)
def test_the_main_job_runs_twice_and_leaves_the_machine_clean(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first, s1 = run_demo(out)
    check_outcomes(first, s1, steps=30, kill_at=18)
    png = (out / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "checks              20/20 held" in first.stdout
    for needle in (
        "loss                first",
        "tokens/s",
        "recovery",
        "where the data lives",
        "region B",
        "other views         ls -l on the mount",
        "etcd data lost      masters halted in",
    ):
        assert needle in first.stdout
    (out / "loss.png").unlink()
    second, s2 = run_demo(out, "--steps", "24", "--kill-at", "16")
    check_outcomes(second, s2, steps=24, kill_at=16)
    assert (out / "loss.png").exists() and s2["work_dir"] != s1["work_dir"]


def _start_until_stage_2(out: Path, scratch: Path) -> subprocess.Popen:
    """The demo, running, once its services (regions, cluster, mount) are up."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--quick", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out.parent,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[2/8]"):
            return proc
    raise AssertionError("the demo ended before stage 2:\n" + "".join(seen[-40:]))


@pytest.mark.slow
def test_an_interrupted_main_job_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM, then Ctrl-C and a closed terminal during the clean-up: the clean-up finishes. SIGKILL:
    the children follow their parent (PR_SET_PDEATHSIG) and stop on their own."""
    import shutil
    import tempfile

    from pcache.testing.faults import wait_for

    out = tmp_path / "out"
    scratch = Path(tempfile.mkdtemp(prefix="pd-", dir="/tmp"))  # short: worker UNIX socket paths live under it
    try:
        _interrupt_twice(out, scratch, wait_for)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _interrupt_twice(out: Path, scratch: Path, wait_for) -> None:
    proc = _start_until_stage_2(out, scratch)
    assert leftovers(str(scratch))  # services are running under the scratch directory
    proc.send_signal(signal.SIGTERM)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        proc.send_signal(sig)  # impatient user: none of these may cut the clean-up short
    rest, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, rest[-3000:]
    assert leftovers(str(scratch)) == [], rest[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == 130

    proc = _start_until_stage_2(out, scratch)
    proc.kill()
    proc.wait(10)
    wait_for(lambda: leftovers(str(scratch)) == [], 90, "the killed demo's servers, cluster and mount to stop")
