"""POSIX permissions through the mount, from another user's side: a process of uid 12345
(``setpriv``, a real process) cannot read or chmod root's 0600 file, its own files are created
with its uid, root's chown is honoured, and without ``--allow-other`` it cannot enter at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.fuse_client.conftest import Mount

UID = GID = 12345


def as_user(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--", *cmd],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def reachable_dir() -> Path:
    """A fresh directory every user can traverse (pytest's own are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="pcache-perm-", dir="/tmp"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def shared_mount(mounted_cluster):
    if os.geteuid() != 0:
        pytest.skip("needs root (setpriv to another uid)")
    cluster, _ = mounted_cluster
    where = reachable_dir()
    mount = Mount(cluster.master_address, where / "mnt", "--allow-other", "--attr-timeout", "0").start()
    try:
        assert as_user("ls", str(where / "mnt")).returncode == 0  # the other uid gets in
        yield mount
    finally:
        mount.stop()
        shutil.rmtree(where, ignore_errors=True)


def test_another_uid_cannot_read_or_chmod_a_0600_file(shared_mount) -> None:
    root = shared_mount.path
    secret = root / "secret"
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    public = root / "public"
    public.write_bytes(b"for all")
    public.chmod(0o644)
    r = as_user("cat", str(secret))
    assert r.returncode != 0 and "Permission denied" in r.stderr and r.stdout == ""
    r = as_user("chmod", "777", str(secret))
    assert r.returncode != 0 and "Operation not permitted" in r.stderr
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.read_bytes() == b"root only"
    r = as_user("sh", "-c", f"echo x >> {secret}")
    assert r.returncode != 0 and secret.read_bytes() == b"root only"
    r = as_user("cat", str(public))
    assert r.returncode == 0 and r.stdout == "for all"
    r = as_user("rm", "-f", str(public))  # the directory is root's 0755: no unlink for others
    assert r.returncode != 0 and public.exists()


def test_files_are_owned_by_their_creator_and_root_may_chown(shared_mount) -> None:
    drop = shared_mount.path / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    r = as_user("sh", "-c", f"echo mine > {drop}/mine && chmod 600 {drop}/mine")
    assert r.returncode == 0, r.stderr
    st = (drop / "mine").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (UID, GID, 0o600)
    assert as_user("cat", str(drop / "mine")).stdout == "mine\n"
    r = as_user("chown", "0", str(drop / "mine"))  # giving a file away is root's alone
    assert r.returncode != 0 and (drop / "mine").stat().st_uid == UID
    os.chown(drop / "mine", 4242, 4242)
    assert (drop / "mine").stat().st_uid == 4242
    r = as_user("cat", str(drop / "mine"))  # no longer its file: 0600 of uid 4242
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_without_allow_other_no_other_uid_gets_in(mounted_cluster) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (setpriv to another uid)")
    cluster, _ = mounted_cluster
    where = reachable_dir()
    assert as_user("ls", str(where)).returncode == 0  # the directory itself is open to it
    mount = Mount(cluster.master_address, where / "mnt").start()
    try:
        (where / "mnt" / "open-file").write_bytes(b"x")
        (where / "mnt" / "open-file").chmod(0o644)
        r = as_user("cat", str(where / "mnt" / "open-file"))
        assert r.returncode != 0 and "Permission denied" in r.stderr
    finally:
        mount.stop()
        shutil.rmtree(where, ignore_errors=True)


def test_a_truncate_by_another_uid_of_a_setuid_file_shows_the_truncate_not_the_mode_change(mounted_cluster) -> None:
    """Another uid's truncate of a set-id file reaches the mount as one SETATTR that libfuse runs
    as a chmod (the kernel clears the set-id bits) then a truncate, then one getattr: that getattr
    must give the truncate's attributes, not the chmod's (the mtime before the truncate stayed in
    the kernel for the attribute timeout). A truncate that fails after the chmod (EFBIG) leaves
    nothing behind: the mount's next getattr on that thread gave the chmod's mode, after another
    client had changed it (one FUSE thread, so that it is the same thread)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (setpriv to another uid)")
    import stat as stat_mod
    import sys
    import time

    from pcache.client import Client

    cluster, _ = mounted_cluster
    where = reachable_dir()
    client = Client(master=cluster.master_address)
    cached = Mount(cluster.master_address, where / "cached", "--allow-other", "--attr-timeout", "1",
                   "--entry-timeout", "1").start()  # fmt: skip
    try:
        path = cached.path / "setuid"
        path.write_bytes(b"0123456789")
        os.chmod(path, 0o4777)
        time.sleep(0.05)  # the truncate's mtime is later than the chmod's
        script = "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY)\nos.ftruncate(fd, 3)\nst = os.fstat(fd)\nprint(st.st_mode, st.st_size, st.st_mtime_ns)"  # noqa: E501
        r = as_user(sys.executable, "-c", script, str(path))
        assert r.returncode == 0, r.stderr
        mode, size, mtime_ns = map(int, r.stdout.split())
        truth = client.stat("/setuid")
        assert (stat_mod.S_IMODE(mode), size) == (0o777, 3) == (truth.mode & 0o7777, truth.size)
        assert mtime_ns == int(truth.mtime * 1e9)  # the truncate's, as the master has it
    finally:
        cached.stop()
    one = Mount(cluster.master_address, where / "one", "--allow-other", "--attr-timeout", "0", "--entry-timeout", "0",
                "--max-threads", "1").start()  # fmt: skip
    try:
        path = one.path / "setuid"
        with open(path, "rb") as f:  # an fstat of it: a getattr on the one FUSE thread, no path walk
            for _ in range(5):
                os.chmod(path, 0o4777)
                r = as_user(sys.executable, "-c", "import os, sys\nos.truncate(sys.argv[1], 1 << 43)", str(path))
                assert r.returncode != 0 and "File too large" in r.stderr  # after the chmod step
                client.setattr("/setuid", mode=0o700)  # another client, after the failed SETATTR
                assert stat_mod.S_IMODE(os.fstat(f.fileno()).st_mode) == 0o700
    finally:
        client.close()
        one.stop()
        shutil.rmtree(where, ignore_errors=True)
