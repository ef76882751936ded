"""`pcache up --mount DIR`: the local cluster mounted, and unmounted on SIGTERM."""

from __future__ import annotations

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
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)
    assert up.returncode == 0
    assert mounted(str(mnt)) is None
