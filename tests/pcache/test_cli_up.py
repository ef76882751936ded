"""`pcache up` as a user runs it: start, use, SIGTERM, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REQUIRES_ETCD, leftovers


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone for our purpose
        return fh.read().split(")")[1].split()[0] != "Z"


def up_started(up: subprocess.Popen, data: Path, timeout: float = 60.0) -> Path:
    """``data/cluster.json`` once ``pcache up`` wrote it (it is up); fails if ``up`` exits first."""
    manifest = data / "cluster.json"
    deadline = time.monotonic() + timeout
    while not manifest.exists():
        assert up.poll() is None, up.stderr.read() if up.stderr else up.returncode
        assert time.monotonic() < deadline, "cluster.json never appeared"
        time.sleep(0.1)
    return manifest


def test_pcache_up_serves_and_stops_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    up = subprocess.Popen(
        [sys.executable, "-m", "pcache", "up", "--data-dir", str(data), "--workers", "2", "--port", "0",
         "--worker.mem_tier_bytes=16MiB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        manifest = up_started(up, data)
        info = json.loads(manifest.read_text())
        assert len(info["workers"]) == 2 and info["master"].startswith("127.0.0.1:")
        pids = list(info["pids"].values())
        assert all(pid_alive(p) for p in pids)
        env = {**os.environ, "PCACHE_CLUSTER_DIR": str(data)}  # found through cluster.json
        (tmp_path / "hello.txt").write_text("hello\n")

        def run(*args: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "pcache", *args]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

        assert run("put", str(tmp_path / "hello.txt"), "/hello.txt").returncode == 0
        assert run("cat", "/hello.txt").stdout == "hello\n"
        assert run("ln", "/hello.txt", "/hello-again.txt").returncode == 0
        assert run("ln", "-s", "hello.txt", "/hello-link").returncode == 0
        assert json.loads(run("stat", "/hello-again.txt").stdout)["nlink"] == 2
        assert run("cat", "/hello-link").stdout == "hello\n"
        assert run("mkdir", "/dir").returncode == 0
        refused = run("ln", "/dir", "/dir-link")
        assert refused.returncode == 2 and "cannot be hard-linked" in refused.stderr
        status = run("status", "--json")
        assert status.returncode == 0
        assert sum(w["alive"] for w in json.loads(status.stdout)["workers"]) == 2
        bad = run("--master", "127.0.0.1:1", "ls", "/")
        assert bad.returncode == 2 and "unavailable" in bad.stderr.lower() and bad.stderr.count("\n") == 1
    finally:
        up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=60)
    assert up.returncode == 0, err
    assert "cluster stopped" in err
    assert not (data / "cluster.json").exists()
    assert not any(pid_alive(p) for p in pids)


def test_second_up_on_a_busy_dir_refuses_and_keeps_the_manifest(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    cmd = [sys.executable, "-m", "pcache", "up", "--data-dir", str(data), "--workers", "1", "--port", "0"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        up_started(first, data)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 3
        assert "in use by a running cluster" in second.stderr and second.stderr.count("\n") == 1
        assert (data / "cluster.json").exists()
        # its master killed: the worker still holds the directory (a second cluster there shared
        # its blocks, and stopping the first deleted the second's manifest), and `pcache up`
        # starts the master again
        manifest = json.loads((data / "cluster.json").read_text())
        os.kill(manifest["pids"]["master"], signal.SIGKILL)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 3 and "in use by a running cluster" in second.stderr, second.stderr
        deadline = time.monotonic() + 30
        while json.loads((data / "cluster.json").read_text())["pids"]["master"] == manifest["pids"]["master"]:
            assert time.monotonic() < deadline, "the master was not restarted"
            time.sleep(0.2)
        ls = subprocess.run([sys.executable, "-m", "pcache", "--cluster-dir", str(data), "ls", "/"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert ls.returncode == 0, ls.stderr
        # a worker started by hand on a directory a worker holds is refused
        worker_dir = manifest["workers"][0]["data_dir"]
        rogue = subprocess.run(
            [sys.executable, "-m", "pcache", "worker", f"--worker.data_dir={worker_dir}",
             f"--worker.master={manifest['master']}"], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert rogue.returncode != 0 and "in use by another worker (pid" in rogue.stderr, rogue.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)


@REQUIRES_ETCD
def test_pcache_up_restarts_a_dead_etcd_and_stops_it_at_the_end(tmp_path: Path) -> None:
    """`pcache up --masters 2` supervises its etcd as it does its masters: etcd killed, it comes
    back on its data directory (the pair leads again), and SIGTERM stops the new one too."""
    data = tmp_path / "cluster"
    up = subprocess.Popen(
        [sys.executable, "-m", "pcache", "up", "--data-dir", str(data), "--workers", "1", "--masters", "2",
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        manifest = up_started(up, data, timeout=90)
        first = json.loads(manifest.read_text())["etcd_pid"]
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while json.loads(manifest.read_text()).get("etcd_pid") == first:
            assert up.poll() is None and time.monotonic() < deadline, "etcd was not restarted"
            time.sleep(0.2)
        second = json.loads(manifest.read_text())["etcd_pid"]
        assert pid_alive(second)
        mk = subprocess.run([sys.executable, "-m", "pcache", "--cluster-dir", str(data), "mkdir", "/after-etcd"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert mk.returncode == 0, mk.stderr  # a leader again: its record in etcd was kept
    finally:
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=90)
    assert "etcd exited" in err and "restarting it" in err, err
    assert not pid_alive(second)


def test_a_worker_that_cannot_start_stops_the_ones_started_beside_it(tmp_path: Path) -> None:
    """The workers of a cluster start side by side: one that exits at start fails the start by
    name with its log's tail, and the others and the master, already running, are stopped (the
    master and worker-0 were left running before)."""
    from pcache.common.errors import Unavailable
    from pcache.local import LocalCluster

    cluster = LocalCluster(str(tmp_path / "c"), workers=3, per_worker_args={1: ["--worker.no_such_option=1"]})
    with pytest.raises(Unavailable, match="worker-1 exited with 3 at start:\n.*unknown option worker.no_such_option"):
        cluster.start()
    assert cluster.worker_procs == []
    started = list((tmp_path / "c").glob("worker-*.ready"))
    assert started, "the others were not started beside worker-1"
    for log in ("worker-0.log", "worker-2.log"):
        assert (tmp_path / "c" / "logs" / log).exists()
    assert leftovers(str(tmp_path / "c")) == []  # nor the master


def test_a_master_restarted_by_hand_is_left_to_it_and_a_second_one_is_refused_in_one_line(tmp_path: Path) -> None:
    """From a helper's drill: an operator restarted a killed master by hand, as the operator
    guide says, before ``pcache up`` did. ``pcache up``'s own restart then died on the RocksDB
    lock with a full traceback, and it said "master exited (-9); restarting it" with another
    traceback every 10 s, for ever. Now it leaves that master to its operator, once said, and a
    second master on a data directory in use says so in one line."""
    data = tmp_path / "cluster"
    up = subprocess.Popen(
        [sys.executable, "-m", "pcache", "up", "--data-dir", str(data), "--workers", "1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    by_hand: subprocess.Popen | None = None
    try:
        info = json.loads(up_started(up, data).read_text())
        master_cmd = [
            sys.executable, "-m", "pcache", "master", f"--master.data_dir={data / 'master'}",
            f"--master.port={info['master'].rsplit(':', 1)[1]}", f"--master.keys_file={data / 'secrets' / 'keys.json'}",
        ]  # fmt: skip
        os.kill(up.pid, signal.SIGSTOP)  # the operator is first
        try:
            os.kill(info["pids"]["master"], signal.SIGKILL)
            time.sleep(0.5)
            ready = tmp_path / "by-hand.ready"
            by_hand = subprocess.Popen([*master_cmd, "--ready-file", str(ready)], stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert by_hand.poll() is None and time.monotonic() < deadline, (
                    "the master started by hand did not serve"
                )
                time.sleep(0.05)
        finally:
            os.kill(up.pid, signal.SIGCONT)
        time.sleep(2.5)  # pcache up looks every second
        second = subprocess.run(master_cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "in use by another process" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        env = {**os.environ, "PCACHE_CLUSTER_DIR": str(data)}
        status = subprocess.run([sys.executable, "-m", "pcache", "status"], env=env, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr  # the hand-started master serves the cluster
    finally:
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=90)
        if by_hand is not None:
            alive_after_up = by_hand.poll() is None
            by_hand.terminate()
            by_hand.wait(30)
    assert "another process holds its data directory" in err and "restarting it" not in err, err
    assert "Traceback" not in err, err
    assert alive_after_up  # not ours to stop
