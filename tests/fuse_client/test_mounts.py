"""Two mounts of one cluster, a randomized sequence against a local directory, and faults."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pcache.client import Client
from pcache.worker.server import worker_id_for
from tests.fuse_client.conftest import Mount

pytestmark = pytest.mark.fuse
MiB = 1 << 20


@pytest.fixture(scope="module")
def second_mount(mounted_cluster, tmp_path_factory):
    cluster, _ = mounted_cluster
    # the reading mount keeps no kernel attribute cache: with one, the kernel trusts a cached file
    # size for up to --attr-timeout and a reader can see the new bytes cut to the old length
    mnt = Mount(
        cluster.master_address, tmp_path_factory.mktemp("second") / "mnt", "--attr-timeout", "0", "--entry-timeout", "0"
    ).start()
    yield mnt
    mnt.stop()


def test_close_to_open_between_two_mounts(mounted_cluster, second_mount, mnt: Path) -> None:
    _, first = mounted_cluster
    other = second_mount.path / mnt.relative_to(first.path)
    (mnt / "f").write_bytes(b"version-1")
    assert (other / "f").read_bytes() == b"version-1"
    with open(mnt / "f", "r+b") as f:
        f.write(b"VERSION-2 longer")
    assert (other / "f").read_bytes() == b"VERSION-2 longer"  # seen at the next open
    os.unlink(mnt / "f")  # delete and recreate the same name
    (mnt / "f").write_bytes(b"new file")
    assert (other / "f").read_bytes() == b"new file"
    assert os.stat(other / "f").st_size == 8


def test_rename_is_atomic_for_the_other_mount(mounted_cluster, second_mount, mnt: Path) -> None:
    _, first = mounted_cluster
    other = second_mount.path / mnt.relative_to(first.path)
    versions = {bytes([65 + i]) * (100_000 + i) for i in range(10)}
    (mnt / "current").write_bytes(bytes([65]) * 100_000)
    seen: list[bytes] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append((other / "current").read_bytes())
            except OSError as exc:
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(1, 10):
        tmp = mnt / f"tmp{i}"
        tmp.write_bytes(bytes([65 + i]) * (100_000 + i))
        os.rename(tmp, mnt / "current")
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    assert not errors
    assert seen and all(s in versions for s in seen)  # never a mix, never torn


class MountVsLocal(RuleBasedStateMachine):
    """The same operations on the mount and on a local directory give the same results."""

    names = st.sampled_from(["a", "b", "c", "d/x", "d/y"])
    datas = st.binary(max_size=3000) | st.builds(
        lambda n, b: bytes([b]) * n, st.integers(0, 3 * 65536), st.integers(0, 255)
    )

    def __init__(self) -> None:
        super().__init__()
        self.roots = (MountVsLocal.mount_root, MountVsLocal.local_root)
        MountVsLocal.counter += 1
        self.roots = tuple(r / f"case{MountVsLocal.counter}" for r in self.roots)
        for r in self.roots:
            r.mkdir()
            (r / "d").mkdir()

    def both(self, fn):
        results = []
        for root in self.roots:
            try:
                results.append(("ok", fn(root)))
            except OSError as exc:
                results.append(("err", exc.errno))
        assert results[0] == results[1], results
        return results[0]

    @rule(name=names, data=datas)
    def write(self, name, data):
        self.both(lambda r: (r / name).write_bytes(data))

    @rule(name=names, data=st.binary(min_size=1, max_size=5000), offset=st.integers(0, 200_000))
    def pwrite(self, name, data, offset):
        def op(r):
            fd = os.open(r / name, os.O_WRONLY)
            try:
                return os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

        self.both(op)

    @rule(name=names, data=st.binary(max_size=500))
    def append(self, name, data):
        def op(r):
            with open(r / name, "ab") as f:
                f.write(data)

        self.both(op)

    @rule(name=names, size=st.integers(0, 200_000))
    def truncate(self, name, size):
        self.both(lambda r: os.truncate(r / name, size))

    @rule(src=names, dst=names)
    def rename(self, src, dst):
        self.both(lambda r: os.rename(r / src, r / dst))

    @rule(name=names)
    def unlink(self, name):
        self.both(lambda r: os.unlink(r / name))

    @rule(name=names)
    def read(self, name):
        self.both(lambda r: hashlib.sha256((r / name).read_bytes()).hexdigest())

    @invariant()
    def same_tree(self):
        def listing(r):
            return sorted(
                (str(p.relative_to(r)), p.is_dir(), 0 if p.is_dir() else p.stat().st_size) for p in r.rglob("*")
            )

        self.both(listing)


MountVsLocal.counter = 0


def test_random_operations_match_a_local_directory(mnt: Path, tmp_path: Path) -> None:
    MountVsLocal.mount_root = mnt
    MountVsLocal.local_root = tmp_path
    run = settings(max_examples=12, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck))(
        MountVsLocal
    ).TestCase
    run().runTest()


def test_worker_killed_during_a_large_read(fuse_ready, make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(workers=3)
    data = os.urandom(8 * MiB) * 24  # 192 MiB
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/big", data, replication=2, block_size=16 * MiB)
    mount = Mount(cluster.master_address, tmp_path / "mnt", "--timeout", "5", "--client.short_circuit=false").start()
    try:
        digest = hashlib.sha256()
        with open(mount.path / "big", "rb") as f:
            done = 0
            while chunk := f.read(MiB):
                digest.update(chunk)
                done += len(chunk)
                if done == 48 * MiB:
                    cluster.kill(cluster.worker_procs[0], signal.SIGKILL)
        assert digest.digest() == hashlib.sha256(data).digest()
    finally:
        mount.stop()


def test_readers_stuck_on_a_stopped_worker_leave_the_mount_free_for_the_others(
    fuse_ready, make_cluster, tmp_path: Path
) -> None:
    """A data loader's readers stuck on a stopped worker (SIGSTOP: no answer, no error yet) hold
    one mount thread each; libfuse's default of 10 threads then queued every other read of the
    job behind them, healthy workers' too. The mount serves up to ``--max-threads`` (64)
    requests at once: a read from the live worker answers at once, and the stuck ones finish
    with the right bytes once the worker runs again."""
    cluster = make_cluster(workers=2)
    bodies = {f"/f{i}": os.urandom(64 * 1024) for i in range(40)}
    with Client(master=cluster.master_address) as pc:
        for path, body in bodies.items():
            pc.write_file(path, body, replication=1)
        holder = {path: pc.layout(path).blocks[0].replicas[0].worker_id for path in bodies}
        stopped_id = pc.status().workers[0].info.addr.worker_id
    stuck = [p for p in bodies if holder[p] == stopped_id][:16]
    free = [p for p in bodies if holder[p] != stopped_id]
    assert len(stuck) >= 12 and free, holder  # block ids spread over both workers
    stopped = next(
        w for i, w in enumerate(cluster.worker_procs) if worker_id_for(str(cluster.root / f"worker-{i}")) == stopped_id
    )
    mount = Mount(cluster.master_address, tmp_path / "mnt", "--timeout", "60").start()
    got: dict[str, bytes | BaseException] = {}

    def read(path: str) -> None:
        try:
            got[path] = (mount.path / path.lstrip("/")).read_bytes()
        except OSError as exc:
            got[path] = exc

    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            readers = [threading.Thread(target=read, args=(p,)) for p in stuck]
            for t in readers:
                t.start()
            time.sleep(1.0)  # every one of them inside the mount, waiting on the stopped worker
            assert not got
            start = time.monotonic()
            assert (mount.path / free[0].lstrip("/")).read_bytes() == bodies[free[0]]
            waited = time.monotonic() - start
            print(f"a read beside {len(stuck)} stuck ones: {waited * 1000:.0f} ms")
            assert waited < 3.0
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        for t in readers:
            t.join(60)
        assert got == {p: bodies[p] for p in stuck}
    finally:
        mount.stop()


def test_master_down_fails_fast_then_recovers(fuse_ready, make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(workers=1)
    mount = Mount(
        cluster.master_address, tmp_path / "mnt", "--timeout", "3", "--attr-timeout", "0", "--entry-timeout", "0"
    ).start()
    try:
        (mount.path / "before").write_text("x")
        os.kill(cluster.master.pid, signal.SIGSTOP)  # a hung master: the worst case for timeouts
        try:
            for op in (lambda: os.stat(mount.path / "before"), lambda: (mount.path / "new").write_text("y"),
                       lambda: os.listdir(mount.path)):  # fmt: skip
                start = time.monotonic()
                with pytest.raises(OSError) as info:
                    op()
                assert info.value.errno in (errno.EIO, errno.ETIMEDOUT), info.value
                assert time.monotonic() - start < 15
        finally:
            os.kill(cluster.master.pid, signal.SIGCONT)
        assert (mount.path / "before").read_text() == "x"  # and it works again
    finally:
        mount.stop()


def test_killed_mount_process_is_recovered_by_the_next_mount(fuse_ready, make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(workers=1)
    mount = Mount(cluster.master_address, tmp_path / "mnt").start()
    (mount.path / "f").write_text("kept")
    mount.proc.kill()
    mount.proc.wait(10)
    with pytest.raises(OSError) as info:
        os.stat(mount.path / "f")
    assert info.value.errno == errno.ENOTCONN  # "Transport endpoint is not connected"
    again = Mount(cluster.master_address, tmp_path / "mnt").start()
    try:
        assert (again.path / "f").read_text() == "kept"
        assert "stale FUSE mount" in again.log.read_text()
    finally:
        again.stop()
    res = subprocess.run(["mountpoint", "-q", str(tmp_path / "mnt")], timeout=10)
    assert res.returncode != 0  # unmounted cleanly on SIGTERM


def test_the_readahead_thread_never_touches_the_mountpoint(tmp_path: Path, monkeypatch) -> None:
    """The mount process's read-ahead thread waits for the mount in mountinfo only. An lstat of
    the mountpoint from it (``realpath`` does one) waits for the daemon it runs in: a SIGKILL at
    that moment left a process that could never exit and a mount that hung every caller (CI)."""
    import importlib

    mount_mod = importlib.import_module("fuse_client.mount")  # the package's ``mount`` is a function

    seen: list[str] = []
    touched: list[str] = []
    monkeypatch.setattr(mount_mod, "mount_device", lambda target: seen.append(target))
    real_lstat, real_stat = os.lstat, os.stat

    def recording(real):
        def call(path, *args, **kwargs):
            if threading.current_thread().name == "pcache-readahead":
                touched.append(os.fspath(path))
            return real(path, *args, **kwargs)

        return call

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    mount_mod.raise_readahead(str(tmp_path / "link"), 1024, timeout=0.5)  # resolved here, not in the thread
    monkeypatch.setattr(os, "lstat", recording(real_lstat))
    monkeypatch.setattr(os, "stat", recording(real_stat))
    time.sleep(0.7)
    assert seen and set(seen) == {str(tmp_path / "real")}
    assert touched == []


def test_a_mount_that_exits_at_start_says_why_from_its_log(tmp_path: Path) -> None:
    """``pcache-mount --daemon`` with a bad token said only "mount process exited with 2"; the
    reason was in the log file alone."""
    from fuse_client.mount import wait_mounted
    from pcache.common.errors import PCacheError

    log = tmp_path / "mount.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; print('starting'); print('pcache-mount: malformed token'); sys.exit(2)",
            ],
            stdout=out,
        )
    with pytest.raises(PCacheError, match=r"exited with 2: pcache-mount: malformed token \(log: .*mount.log\)"):
        wait_mounted(str(tmp_path / "mnt"), 10, proc, str(log))


def test_a_daemon_mount_over_a_live_mount_is_refused_not_reported_mounted(mounted_cluster) -> None:
    """Replayed from an operator: `pcache-mount --daemon` on a directory another tenant's mount
    was serving printed "mounted ... (pid N)" and exit 0; the background process had refused it,
    and the directory still showed the other tenant's files (writes meant for one tenant would
    have gone to the other's namespace)."""
    cluster, mount = mounted_cluster
    started = time.monotonic()
    out = subprocess.run(
        ["pcache-mount", str(mount.path), "--master", cluster.master_address, "--daemon"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0 and "mounted" not in out.stdout
    assert f"{mount.path} is already mounted" in out.stderr
    assert time.monotonic() - started < 15
    assert os.listdir(mount.path) is not None  # the first mount serves on
    # without --log-file a mount that fails at start said only "mount process exited with 2"
    fresh = mount.path.parent / "daemon-fails"
    fresh.mkdir(exist_ok=True)
    out = subprocess.run(["pcache-mount", str(fresh), "--master", "127.0.0.1:1", "--daemon"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode != 0 and "Connection refused" in out.stderr and "pcache-mount-" in out.stderr, out.stderr


def test_a_stopped_mount_keeps_the_old_content_of_a_file_it_was_rewriting(mounted_cluster, tmp_path: Path) -> None:
    """Replayed from a user: SIGTERM to the mount (a pod's deletion stops its mount sidecar so)
    while a complete 1 MB checkpoint was being rewritten committed the 400 kB written so far
    over it; a SIGKILL kept the old one. A rewrite that never closed is dropped; a new file and
    appends are committed, as a close would."""
    cluster, _ = mounted_cluster
    mount = Mount(cluster.master_address, tmp_path / "m").start()
    fds: list[int] = []
    try:
        (mount.path / "stop").mkdir()
        old = os.urandom(1 << 20)
        (mount.path / "stop" / "ckpt.pt").write_bytes(old)
        fds.append(os.open(mount.path / "stop" / "ckpt.pt", os.O_WRONLY | os.O_TRUNC))
        os.write(fds[-1], os.urandom(400_000))
        fds.append(os.open(mount.path / "stop" / "new.log", os.O_WRONLY | os.O_CREAT, 0o644))
        os.write(fds[-1], b"a line\n")
        assert mount.proc is not None
        mount.proc.send_signal(signal.SIGTERM)
        mount.proc.wait(30)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        mount.stop()
    with Client(master=cluster.master_address) as pc:
        assert pc.read_file("/stop/ckpt.pt") == old
        assert pc.read_file("/stop/new.log") == b"a line\n"
    assert "still being rewritten when the mount stopped" in mount.log.read_text()
