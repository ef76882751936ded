"""Shell tools and Python file patterns inside a real mount, compared with a local copy."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import stdlib_copy, tree_digest

pytestmark = pytest.mark.fuse
MiB = 1 << 20


def sh(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{cmd}: {res.stderr}"
    return res


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 190 s on 2 cores in a full run with the whole stdlib; its test suite is left out now
def test_shell_tools_on_the_stdlib_tree(mnt: Path, tmp_path: Path) -> None:
    src = stdlib_copy(tmp_path / "stdlib")
    sh(f"cp -r {src} {mnt}/stdlib", mnt)
    sh(f"diff -r {src} {mnt}/stdlib", mnt)
    assert tree_digest(mnt / "stdlib") == tree_digest(src)
    local_find = sh("find . | sort", src).stdout
    assert sh("find . | sort", mnt / "stdlib").stdout == local_find
    # du counts st_blocks: equal up to rounding of the last block of each file
    du_local = int(sh("du -s --apparent-size -B1 .", src).stdout.split()[0])
    du_mnt = int(sh("du -s --apparent-size -B1 .", mnt / "stdlib").stdout.split()[0])
    assert abs(du_mnt - du_local) < 4096 * 2000  # directories count 4096 on both sides
    sh(f"tar cf {tmp_path}/t.tar -C {mnt} stdlib", mnt)
    (mnt / "x").mkdir()
    sh(f"tar xf {tmp_path}/t.tar -C {mnt}/x", mnt)
    sh(f"diff -r {src} {mnt}/x/stdlib", mnt)
    sh(f"mv {mnt}/x/stdlib {mnt}/moved", mnt)
    assert not (mnt / "x" / "stdlib").exists() and (mnt / "moved" / "os.py").is_file()
    sh(f"rm -r {mnt}/moved {mnt}/x {mnt}/stdlib", mnt)
    assert list(mnt.iterdir()) == []


def test_git_init_and_commit_inside_the_mount(mnt: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = mnt / "repo"
    repo.mkdir()
    env = "GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e"
    sh("git init -q .", repo)
    (repo / "a.py").write_text("print('hello')\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "b.txt").write_text("b\n" * 1000)
    sh(f"git add -A && {env} git commit -q -m first", repo)
    (repo / "a.py").write_text("print('changed')\n")
    sh(f"{env} git commit -q -am second", repo)
    log = sh("git log --oneline", repo).stdout.splitlines()
    assert len(log) == 2
    assert sh("git status --porcelain", repo).stdout == ""
    sh("git fsck --strict", repo)


def test_python_file_patterns_match_a_local_file(mnt: Path, tmp_path: Path) -> None:
    local, remote = tmp_path / "f", mnt / "f"
    data = os.urandom(3 * MiB + 1234)
    for path in (local, remote):
        with open(path, "wb") as f:
            f.write(data)
        with open(path, "r+b") as f:
            f.seek(MiB - 7)
            f.write(b"overwrite" * 100)
            f.seek(0, os.SEEK_END)
            f.write(b"appended")
            f.truncate(2 * MiB + 5)
        with open(path, "ab") as f:
            f.write(b"tail")
        with open(path, "r+b") as f:
            f.seek(5 * MiB)  # a hole: reads as zeros
            f.write(b"end")
        os.truncate(path, 5 * MiB + 1)
    assert remote.read_bytes() == local.read_bytes()
    assert os.stat(remote).st_size == os.stat(local).st_size == 5 * MiB + 1
    with open(remote, "rb") as f:
        f.seek(3 * MiB)
        assert f.read(10) == bytes(10)


def test_metadata_operations_and_errors(mnt: Path) -> None:
    (mnt / "a").write_text("x")
    os.chmod(mnt / "a", 0o640)
    assert os.stat(mnt / "a").st_mode & 0o777 == 0o640
    os.utime(mnt / "a", (1_000_000_000, 1_500_000_000))
    assert int(os.stat(mnt / "a").st_mtime) == 1_500_000_000
    os.symlink("a", mnt / "link")
    assert os.readlink(mnt / "link") == "a" and (mnt / "link").read_text() == "x"
    os.setxattr(mnt / "a", "user.tag", b"v1")
    assert os.getxattr(mnt / "a", "user.tag") == b"v1"
    assert "user.tag" in os.listxattr(mnt / "a")
    os.removexattr(mnt / "a", "user.tag")
    (mnt / "b").write_text("y")
    os.rename(mnt / "a", mnt / "b")  # replaces
    assert (mnt / "b").read_text() == "x" and not (mnt / "a").exists()
    (mnt / "d").mkdir()
    (mnt / "d" / "f").write_text("z")
    with pytest.raises(OSError) as info:
        os.rmdir(mnt / "d")
    assert info.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        os.open(mnt / "b", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    with pytest.raises(FileNotFoundError):
        (mnt / "nope").read_text()
    os.link(mnt / "b", mnt / "hard")  # a hard link (test_hard_links_through_the_mount has the rest)
    assert os.stat(mnt / "hard").st_nlink == 2
    os.unlink(mnt / "hard")
    os.mkfifo(mnt / "fifo")  # special files are inodes; the kernel runs the pipe
    assert stat.S_ISFIFO(os.stat(mnt / "fifo").st_mode)
    os.mknod(mnt / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert stat.S_ISCHR(os.stat(mnt / "null").st_mode) and os.stat(mnt / "null").st_rdev == os.makedev(1, 3)
    os.unlink(mnt / "fifo")
    os.unlink(mnt / "null")
    st = os.statvfs(mnt)
    assert st.f_blocks > 0 and st.f_bavail > 0 and st.f_namemax == 255
    names = sorted(os.listdir(mnt))
    assert names == ["b", "d", "link"]


def test_large_directory_listing(mnt: Path) -> None:
    for i in range(2300):
        (mnt / f"f{i:05d}").touch()
    assert sorted(os.listdir(mnt)) == [f"f{i:05d}" for i in range(2300)]


def test_torch_save_and_load_through_the_mount(mnt: Path) -> None:
    torch = pytest.importorskip("torch")
    state = {"w": torch.randn(256, 128), "b": torch.arange(1000), "nested": {"x": torch.ones(3, dtype=torch.bfloat16)}}
    torch.save(state, mnt / "state.pt")
    back = torch.load(mnt / "state.pt")
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
    assert torch.equal(back["nested"]["x"], state["nested"]["x"])


def test_fallocate_modes(mnt: Path) -> None:
    path = mnt / "falloc.bin"
    path.write_bytes(b"a" * 5000)
    sh(f"fallocate -l 3MiB {path}", mnt)  # mode 0: the size grows, the new range reads as zeros
    data = path.read_bytes()
    assert len(data) == 3 * MiB and data[:5000] == b"a" * 5000 and data[5000:] == bytes(3 * MiB - 5000)
    sh(f"fallocate --keep-size -o 0 -l 8MiB {path}", mnt)
    assert path.stat().st_size == 3 * MiB
    sh(f"fallocate --punch-hole -o 1000 -l 2000 {path}", mnt)
    data = path.read_bytes()
    assert data[:1000] == b"a" * 1000 and data[1000:3000] == bytes(2000) and data[3000:5000] == b"a" * 2000
    sh(f"fallocate --zero-range -o 4000 -l 4MiB {path}", mnt)  # past the end: zeroed and extended
    data = path.read_bytes()
    assert len(data) == 4 * MiB + 4000 and data[3000:4000] == b"a" * 1000 and not any(data[4000:])
    res = subprocess.run(["fallocate", "--collapse-range", "-o", "0", "-l", "4096", str(path)], capture_output=True)
    assert res.returncode != 0 and b"not supported" in res.stderr
    # what was fallocated is committed at close, for another reader of the cluster
    os.sync()
    assert os.stat(path).st_size == 4 * MiB + 4000


def test_flock_and_posix_locks_between_processes_of_one_mount(mnt: Path) -> None:
    import fcntl

    path = mnt / "locked"
    path.write_bytes(b"x")
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n"
        "    (fcntl.flock if sys.argv[2] == 'flock' else fcntl.lockf)(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n"
        "    sys.exit(3)\n"
    )

    def other_process_can_lock(kind: str) -> bool:
        res = subprocess.run([sys.executable, "-c", probe, str(path), kind], capture_output=True, timeout=30)
        assert res.returncode in (0, 3), res.stderr
        return res.returncode == 0

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert not other_process_can_lock("flock")
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert other_process_can_lock("flock")
        fcntl.lockf(fd, fcntl.LOCK_EX)
        assert not other_process_can_lock("posix")
    finally:
        os.close(fd)  # closing drops the POSIX lock
    assert other_process_can_lock("posix")


def test_hard_links_through_the_mount(mnt: Path) -> None:
    a, b = mnt / "a.txt", mnt / "sub" / "b.txt"
    (mnt / "sub").mkdir()
    a.write_bytes(b"first")
    os.link(a, b)
    assert a.stat().st_nlink == 2 and b.stat().st_ino == a.stat().st_ino
    with open(b, "ab") as f:  # written through one name, read through the other
        f.write(b" second")
    # the kernel caches attributes per name (libfuse's high-level API gives each name its own
    # node): the other name shows the new size once its --attr-timeout (0.5 s here) has passed
    time.sleep(0.6)
    assert a.read_bytes() == b"first second"
    res = subprocess.run(["ls", "-l", str(mnt / "sub")], capture_output=True, text=True, check=True)
    assert " 2 " in res.stdout.splitlines()[1]  # READDIRPLUS carries the link count too
    a.unlink()
    assert b.read_bytes() == b"first second" and b.stat().st_nlink == 1
    os.link(b, mnt / "c.txt")
    os.rename(mnt / "c.txt", b)  # two names of one file: rename(2) does nothing
    assert (mnt / "c.txt").exists() and b.stat().st_nlink == 2
    with pytest.raises(PermissionError):
        os.link(mnt / "sub", mnt / "sub2")  # directories cannot be linked
    with pytest.raises(FileExistsError):
        os.link(b, mnt / "c.txt")
    assert (mnt / "sub").stat().st_nlink == 2
    (mnt / "sub" / "d1").mkdir()
    (mnt / "sub" / "d2").mkdir()
    assert (mnt / "sub").stat().st_nlink == 4  # 2 + its subdirectories, as on ext4
    # git and cp -al rely on links
    sh("cp -al sub sub-linked", mnt)
    assert (mnt / "sub-linked" / "b.txt").stat().st_ino == b.stat().st_ino


def test_a_modification_time_set_on_an_open_file_survives_its_close(mnt: Path, tmp_path: Path) -> None:
    """Replayed from a user: `tar xf`, `cp -a`, `cp -p` and `install -p` write, set the times
    on the open file (futimens), then close; the close committed "now" over the time set, so
    every extracted file was new (rsync -a re-sent them all, find -newer matched them). A write
    after the futimens makes it now again, as on a local disk."""
    fd = os.open(mnt / "set-then-close", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 100)
    os.utime(fd, (1_000_000_000, 1_000_000_000))
    os.close(fd)
    time.sleep(1.0)  # past the mount's attribute cache (0.5 s): what the master keeps
    assert os.stat(mnt / "set-then-close").st_mtime == 1_000_000_000
    fd = os.open(mnt / "set-then-write", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"y")
    os.utime(fd, (1_000_000_000, 1_000_000_000))
    os.write(fd, b"z")  # written after: the close's time
    os.close(fd)
    assert os.stat(mnt / "set-then-write").st_mtime > time.time() - 60
    src = tmp_path / "tree"
    (src / "d").mkdir(parents=True)
    for name in ("a.txt", "d/b.bin"):
        (src / name).write_bytes(os.urandom(3000))
        os.utime(src / name, (1_600_000_000, 1_600_000_000))
    sh(f"tar cf {tmp_path}/t.tar -C {src} .", tmp_path)
    (mnt / "x").mkdir()
    sh(f"tar xf {tmp_path}/t.tar -C {mnt}/x", mnt)
    sh(f"cp -a {src} {mnt}/copied", mnt)
    time.sleep(1.0)
    for top in ("x", "copied"):
        for name in ("a.txt", "d/b.bin"):
            assert os.stat(mnt / top / name).st_mtime == 1_600_000_000, (top, name)
            assert (mnt / top / name).read_bytes() == (src / name).read_bytes()
