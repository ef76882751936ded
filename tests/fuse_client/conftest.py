"""Real FUSE mounts of real clusters (root, /dev/fuse, fusermount3)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuse_client.mount import stop_mount, wait_mounted
from tests.conftest import FAST_MASTER

pytestmark = pytest.mark.fuse


def fuse_available() -> str | None:
    """Why FUSE tests cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount not installed (apt-get install fuse3)"
    if os.geteuid() != 0:
        return "FUSE tests mount as root"
    return None


class Mount:
    """A ``pcache-mount`` process in the foreground and its mountpoint."""

    def __init__(self, master: str, path: Path, *args: str) -> None:
        self.master = master
        self.path = path
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.log = path.parent / f"{path.name}.log"

    def start(self) -> Mount:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a stale mount is pcache-mount's to clean
            if exc.errno != errno.ENOTCONN:
                raise
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fuse_client", str(self.path), "--master", self.master, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_mounted(str(self.path), 30, self.proc)
        except Exception:
            raise AssertionError(self.log.read_text()) from None
        return self

    def stop(self) -> None:
        stop_mount(self.proc, str(self.path))


@pytest.fixture(scope="module")
def fuse_ready() -> None:
    reason = fuse_available()
    if reason:
        pytest.skip(f"FUSE unavailable: {reason}")


@pytest.fixture(scope="module")
def mounted_cluster(fuse_ready, tmp_path_factory) -> Iterator[tuple]:
    """One cluster (3 workers) and one mount shared by a module: (cluster, Mount)."""
    from pcache.local import LocalCluster

    root = tmp_path_factory.mktemp("fuse")
    with LocalCluster(str(root / "cluster"), workers=3, master_args=FAST_MASTER) as cluster:
        mnt = Mount(cluster.master_address, root / "mnt", "--attr-timeout", "0.5", "--entry-timeout", "0.5").start()
        try:
            yield cluster, mnt
        finally:
            mnt.stop()


@pytest.fixture
def mnt(mounted_cluster, request) -> Path:
    """A fresh directory inside the shared mount."""
    _cluster, mount = mounted_cluster
    path = mount.path / request.node.name.replace("[", "_").replace("]", "_")
    path.mkdir()
    return path
