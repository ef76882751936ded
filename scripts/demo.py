"""The main job on the embedded default: a local PCache cluster, a real tree in and out.

Starts ``pcache up`` (master + 3 workers under a temp dir), copies the Python
standard library's sources in with ``pcache put``, reads them back with
``pcache get``, checks every byte, prints a summary with throughput and the
cluster's status, and stops every process it started.

Usage: python scripts/demo.py [--workers N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from pcache.client import Client
from pcache.local import LocalCluster


def digest(root: Path) -> dict[str, str]:
    out = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = Path(base) / name
            if not path.is_symlink():
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--keep", help="Use (and keep) this directory instead of a temp dir.")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pcache-demo-"))
    src = work / "stdlib"
    if not src.exists():
        shutil.copytree(
            sysconfig.get_paths()["stdlib"],
            src,
            symlinks=True,
            ignore=shutil.ignore_patterns("site-packages", "__pycache__", "*.pyc"),
        )
    cluster = LocalCluster(str(work / "cluster"), workers=args.workers)
    try:
        t0 = time.monotonic()
        cluster.start()
        started = time.monotonic() - t0
        print(f"cluster up in {started:.1f}s: master {cluster.master_address}, {args.workers} workers")
        with Client(master=cluster.master_address) as pc:
            t0 = time.monotonic()
            files, nbytes = pc.put(str(src), "/datasets/stdlib")
            put_s = time.monotonic() - t0
            dst = work / "readback"
            shutil.rmtree(dst, ignore_errors=True)
            t0 = time.monotonic()
            got_files, got_bytes = pc.get("/datasets/stdlib", str(dst))
            get_s = time.monotonic() - t0
            status = pc.status()
        same = digest(src) == digest(dst)
        mb = nbytes / 1e6
        print()
        print("PCache demo summary")
        print(f"  source            {src}  ({files} files, {mb:.1f} MB)")
        print(f"  put               {put_s:6.2f}s  {mb / put_s:7.1f} MB/s  {files / put_s:7.0f} files/s")
        print(
            f"  get               {get_s:6.2f}s  {got_bytes / 1e6 / get_s:7.1f} MB/s  {got_files / get_s:7.0f} files/s"
        )
        print(f"  byte-identical    {'yes' if same else 'NO'}")
        print(f"  namespace         {status.inodes} inodes, {status.blocks} blocks, RF {status.default_replication}")
        print(f"  replication       {status.under_replicated_blocks} under-replicated, {status.missing_blocks} missing")
        for w in status.workers:
            print(
                f"  {w.info.addr.worker_id:<14} {w.info.addr.host}:{w.info.addr.port:<6} "
                f"used {w.info.used_bytes / 1e6:8.1f} MB  {'alive' if w.alive else 'DEAD'}"
            )
        print(f"  data and logs     {cluster.root}")
        return 0 if same and status.missing_blocks == 0 else 1
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
