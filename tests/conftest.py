"""Shared fixtures: real PCache clusters of processes on loopback."""

from __future__ import annotations

import os
import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster

if TYPE_CHECKING:
    from babel.testing.servers import Server

REQUIRES_ETCD = pytest.mark.skipif(
    shutil.which("etcd") is None, reason="etcd is not installed (apt-get install etcd-server; .ci/run installs it)"
)
"""Marks tests that start a real etcd (Debian package etcd-server)."""

FAST_MASTER = ["--master.dead_after=3", "--master.replication_check_interval=0.5", "--master.heartbeat_interval=0.5"]


def fake_credentials() -> tuple[str, str]:
    """Put test credentials in the environment (unless some are there); return (access key, secret)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    return os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """moto's S3 server on loopback in a process of its own (fake credentials in the environment).

    In the test process (moto's ``ThreadedMotoServer``) it shared one GIL with the client under
    test: 1,500 small PUTs, then a sync of them, took 7-9 s each; 4.3-5.2 s in its own process.
    """
    from babel.testing.servers import start_moto

    fake_credentials()
    with start_moto(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def moto_endpoint(moto_server: Server) -> str:
    """The moto S3 server's ``http://127.0.0.1:PORT``."""
    return moto_server.endpoint


def log_mark(server: Server) -> int:
    """Where a server's log ends now (bytes): pass it to :func:`logged_requests`."""
    return server.log_path.stat().st_size


def logged_requests(server: Server, since: int) -> list[str]:
    """The request lines (``"GET /bucket/key?query HTTP/1.1"``) moto logged after ``since``.

    werkzeug logs a request once its answer's headers are sent: a client holding the whole answer
    finds its request here; one of another process may still be on its way.
    """
    with open(server.log_path, "rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    return [line.split('"')[1] for line in text.splitlines() if line.count('"') >= 2]


_buckets = iter(range(1_000_000))


def create_bucket(endpoint: str, verify: str | None = None) -> str:
    """Make a fresh bucket ``bucket-N`` on the S3 server at ``endpoint``; returns its name."""
    import boto3

    bucket = f"bucket-{next(_buckets)}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=verify).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator:
    """Factory: ``make_cluster(workers=3, master_args=[...], worker_args=[...])`` -> started LocalCluster."""
    clusters: list[LocalCluster] = []

    def make(workers: int = 3, **kwargs) -> LocalCluster:
        kwargs.setdefault("master_args", [])
        kwargs["master_args"] = FAST_MASTER + kwargs["master_args"]
        cluster = LocalCluster(str(tmp_path / f"cluster{len(clusters)}"), workers=workers, **kwargs)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One 3-worker cluster shared by a test module (tests use distinct paths)."""
    root = tmp_path_factory.mktemp("shared")
    cluster = LocalCluster(
        str(root),
        workers=3,
        master_args=[*FAST_MASTER, "--master.metrics_port=0"],
        worker_args=["--worker.metrics_port=0"],
    )
    with cluster:
        yield cluster


@pytest.fixture
def client(shared_cluster: LocalCluster) -> Iterator[Client]:
    with Client(ClientConfig(master=shared_cluster.master_address)) as pc:
        yield pc


def stdlib_copy(dest: Path) -> Path:
    """A copy of the Python standard library's sources (no site-packages, no caches, not its own
    test suite ``Lib/test``, which is 55 % of the files and none of the variety): ~1,100 real
    files, 33 MiB (sources, data, C extensions, deep and wide directories)."""
    src = sysconfig.get_paths()["stdlib"]

    def ignore(where: str, names: list[str]) -> set[str]:
        skip = shutil.ignore_patterns("site-packages", "__pycache__", "*.pyc")(where, names)
        return skip | ({"test"} if os.path.samefile(where, src) else set())

    shutil.copytree(src, dest, symlinks=True, ignore=ignore)
    return dest


def tree_digest(root: Path) -> dict[str, tuple[int, bytes]]:
    """{relative path: (size, sha256)} of every regular file under ``root``."""
    import hashlib

    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = Path(base) / name
            if path.is_symlink():
                out[str(path.relative_to(root))] = (-1, os.readlink(path).encode())
                continue
            data = path.read_bytes()
            out[str(path.relative_to(root))] = (len(data), hashlib.sha256(data).digest())
    return out


def leftovers(work_dir: str) -> list[str]:
    """Processes whose command line names ``work_dir``, and mounts under it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if work_dir in cmdline:
            found.append(f"pid {pid}: {cmdline[:200]}")
    found += [line for line in Path("/proc/mounts").read_text().splitlines() if work_dir in line]
    return found
