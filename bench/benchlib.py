"""Helpers shared by the benchmark scripts (run as ``python bench/NAME.py``).

Importing it makes the checkout importable without an install: this process and its children
(the cluster's ``python -m pcache ...``, ``python -m fuse_client``) all use the repository's code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if (REPO / "pcache" / "__init__.py").exists():
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def mbps(nbytes: int, seconds: float) -> float:
    """MB/s (10^6 bytes per second)."""
    return nbytes / seconds / 1e6 if seconds > 0 else float("inf")


def drop_page_cache(paths: list[str]) -> None:
    """Ask the kernel to drop clean cached pages of ``paths`` (best effort; works on FUSE files too)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def block_files(cluster_dir: Path) -> list[str]:
    """Every block file of a LocalCluster's workers."""
    return [str(p) for p in cluster_dir.glob("worker-*/blocks/*/*.blk")]


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a process in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def print_result(keys: dict[str, object]) -> None:
    """The closing ``RESULT key=value ...`` line (floats with 3 decimals)."""
    print("RESULT " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in keys.items()))
