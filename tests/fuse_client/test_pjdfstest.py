"""pjdfstest's link, rename, unlink, open and truncate suites, whole, on a live mount.

The suite (vendored in ``pjdfstest/``, see its README) is compiled here with a Linux
``config.h`` and run with ``prove`` from a directory inside the mount, as root. The mount
runs with ``--attr-timeout 0 --entry-timeout 0`` (pjdfstest checks ``nlink`` and ``ctime``
right after each call, which kernel attribute caching would answer from before it) and
``--allow-other`` (some tests switch to other uids to check permissions).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FAST_MASTER
from tests.fuse_client.conftest import Mount

SOURCE = Path(__file__).parent / "pjdfstest"
SUITES = ("link", "rename", "unlink", "open", "truncate")
CONFIG_H = """\
#define _GNU_SOURCE 1
#define HAVE_SYS_SYSMACROS_H 1
#define HAVE_FACCESSAT 1
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_LINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_OPENAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_READLINKAT 1
#define HAVE_RENAMEAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_UNLINKAT 1
#define HAVE_UTIMENSAT 1
"""


@pytest.fixture(scope="module")
def pjdfstest(tmp_path_factory) -> Path:
    """The suite's tree with the compiled ``pjdfstest`` binary next to its ``tests``."""
    for tool in ("cc", "prove"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (scripts/install.sh installs gcc and perl)")
    root = tmp_path_factory.mktemp("pjdfstest")
    shutil.copytree(SOURCE / "tests", root / "tests")
    (root / "config.h").write_text(CONFIG_H)
    subprocess.run(
        ["cc", "-O1", "-I", str(root), "-o", str(root / "pjdfstest"), str(SOURCE / "pjdfstest.c")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def strict_mount(fuse_ready, tmp_path_factory) -> Iterator[Path]:
    from pcache.local import LocalCluster

    root = tmp_path_factory.mktemp("pjd-cluster")
    with LocalCluster(str(root / "cluster"), workers=1, master_args=FAST_MASTER) as cluster:
        mount = Mount(
            cluster.master_address, root / "mnt", "--attr-timeout", "0", "--entry-timeout", "0", "--allow-other"
        ).start()
        try:
            yield mount.path
        finally:
            mount.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("suite", SUITES)
def test_pjdfstest_suite(suite: str, pjdfstest: Path, strict_mount: Path) -> None:
    work = strict_mount / f"pjd-{suite}"
    work.mkdir()
    res = subprocess.run(
        ["prove", "-j", "4", "-r", str(pjdfstest / "tests" / suite)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=800,
    )
    failed = [line for line in res.stdout.splitlines() if "Failed" in line or "not ok" in line]
    summary = [line for line in res.stdout.splitlines() if line.startswith(("Files=", "Result:"))]
    print(f"\npjdfstest {suite}: {' '.join(summary)}")
    assert res.returncode == 0 and "Result: PASS" in res.stdout, "\n".join(failed[:40]) or res.stdout[-3000:]
