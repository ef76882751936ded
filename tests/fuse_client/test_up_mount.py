"""`pcache up --mount DIR`: the local cluster mounted, and unmounted on SIGTERM."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuse_client.mount import mounted

pytestmark = pytest.mark.fuse


def test_up_with_mount(fuse_ready, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    up = subprocess.Popen(
        [sys.executable, "-m", "pcache", "up", "--data-dir", str(tmp_path / "c"), "--workers", "2", "--port", "0",
         "--mount", str(mnt)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "c" / "cluster.json").exists():
            assert up.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (mnt / "hello").write_text("through the mount")
        assert (mnt / "hello").read_text() == "through the mount"
        assert (mounted(str(mnt)) or "").startswith("fuse")
        # shared/cases/short_read_through_mount.py: 100 MiB in one write() (32 MiB blocks, the
        # later ones streamed to the worker), read back at once, pages dropped, any buffer size
        data = os.urandom(100 << 20)
        want = hashlib.sha256(data).hexdigest()
        with open(mnt / "f.bin", "wb") as f:
            f.write(data)
        for bufsize in (4096, 1 << 20, 100_003):
            fd = os.open(mnt / "f.bin", os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            h, n = hashlib.sha256(), 0
            while chunk := os.read(fd, bufsize):
                h.update(chunk)
                n += len(chunk)
            os.close(fd)
            assert (n, h.hexdigest()) == (len(data), want), bufsize
        out = subprocess.run(["sha256sum", str(mnt / "f.bin")], capture_output=True, text=True, timeout=120)
        assert out.stdout.split()[:1] == [want]
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)
    assert up.returncode == 0
    assert mounted(str(mnt)) is None


def test_a_killed_up_takes_its_cluster_and_mount_along(fuse_ready, tmp_path: Path) -> None:
    """SIGKILL to `pcache up`: master, workers and mount go too (PR_SET_PDEATHSIG), the port is
    free and the next `pcache up` on the same directory starts."""
    import json
    import socket

    from pcache.common.process import process_alive, stop_process
    from pcache.testing.faults import wait_for

    mnt, data = tmp_path / "mnt", tmp_path / "c"
    cmd = [sys.executable, "-m", "pcache", "up", "--data-dir", str(data), "--workers", "2", "--port", "0",
           "--mount", str(mnt)]  # fmt: skip
    up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (data / "cluster.json").exists() or up.poll() is not None, 60, "cluster.json")
        info = json.loads((data / "cluster.json").read_text())
        pids = list(info["pids"].values())
        assert len(pids) == 3 and all(process_alive(p) for p in pids) and mounted(str(mnt))
        up.kill()
        up.wait(10)
        wait_for(lambda: not any(process_alive(p) for p in pids), 30, "the master and workers to exit")
        wait_for(lambda: mounted(str(mnt)) is None, 30, "the mount to go")
        port = int(info["master"].rpartition(":")[2])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is fine
            s.bind(("127.0.0.1", port))  # nobody listens on the master's port
    finally:
        stop_process(up)
    again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(
            lambda: (
                (data / "cluster.json").exists()
                and json.loads((data / "cluster.json").read_text())["pids"] != info["pids"]
                or again.poll() is not None
            ),
            60,
            "the second cluster",
        )
        assert again.poll() is None, again.stderr.read()
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)
    assert again.returncode == 0
