"""One ``babel sync`` job shared by N processes on etcd vs the same job run by one process.

Each process is limited to ``--bwlimit`` bytes per second, as a host is by its NIC: what the
benchmark measures is how much of N hosts' bandwidth a shared job turns into throughput, after
the cut (one parallel listing), the claims, the per-chunk listings and verification, and the
processes' start. Source and destination are ``file://`` trees on this machine (object stores on
loopback would make the servers' CPU, not the processes' bandwidth, the limit on 2 cores).

Per repetition, in a rotating order: ``babel sync SRC DST --etcd E --job J`` started as 1 process
and as ``--procs`` processes (each into a fresh destination, each with its own state directory),
timed from the first start to the last exit; every copy is compared with the source file by file
(size and CRC32C) and must be complete. Also a plain local ``babel sync`` (no etcd) as the
reference the single shared process is compared with (the cost of sharing).

A shared process pays about 1-2 s that a copy at the limit does not amortize (interpreter start,
three processes importing on 2 cores at once; the cut; the last process's exit), so the defaults
move enough bytes (200 MB at 4 MB/s per process: ~50 s for one process) that the copy dominates.

Reported: median seconds of each over ``--reps``, ``scaleout_ratio`` = one process / N processes
(target >= 2.5 for 3 processes), ``sharing_cost`` = one shared process / plain local sync, the
shards and chunks of the cut. Ends with ``RESULT key=value ...``.

Usage: python bench/babel_scaleout.py [--quick] [--procs 3] [--files N] [--size BYTES]
       [--bwlimit BYTES] [--reps N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crc32c

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pcache.testing.etcd import start_etcd  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_tree(root: Path, files: int, size: int) -> None:
    rng = random.Random(1)
    block = rng.randbytes(size + files)
    for i in range(files):
        p = root / f"shard-{i % 16:02d}" / f"part-{i:06d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(block[i % 97 : i % 97 + size - 97] + i.to_bytes(97, "big"))


def digest(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and ".babel-" not in p.name:
            data = p.read_bytes()
            out[str(p.relative_to(root))] = (len(data), crc32c.crc32c(data))
    return out


def run_procs(n: int, src: Path, dst: Path, job: str, scratch: Path, args: list[str]) -> float:
    """Start ``n`` processes of ``babel sync src dst *args`` (each with its own state directory);
    seconds from the first start to the last exit."""
    cmd = [sys.executable, "-m", "babel.cli.main", "sync", f"file://{src}", f"file://{dst}", "--no-progress",
           "--json", *args]  # fmt: skip
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        procs = []
        for i in range(n):
            state = scratch / f"state-{job}-{i}"
            state.mkdir(parents=True)
            err = stack.enter_context(open(scratch / f"{job}-{i}.log", "w"))
            procs.append(subprocess.Popen([*cmd, "--state-dir", str(state)], stdout=subprocess.DEVNULL, stderr=err))
        codes = [p.wait(timeout=3600) for p in procs]
    seconds = time.monotonic() - started
    if any(codes):
        raise SystemExit(f"{job}: exit codes {codes}; logs in {scratch}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="600 files of 128 KiB at 2 MB/s, 1 rep (about 2 minutes)")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--files", type=int)
    ap.add_argument("--size", type=int, help="bytes per file")
    ap.add_argument("--bwlimit", type=int, help="bytes/s per process, a host's NIC (default 4 MB/s, quick 2)")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--dir", default=None)
    ns = ap.parse_args()
    files = ns.files or (600 if ns.quick else 1500)
    ns.bwlimit = ns.bwlimit or (2_000_000 if ns.quick else 4_000_000)
    size = ns.size or (128 << 10)
    reps = ns.reps or (1 if ns.quick else 3)
    shard_keys = max(1, files // (4 * ns.procs))  # 4 shards per process: a late or dead one leaves little behind
    chunk_keys = max(1, shard_keys // 4)
    scratch = Path(tempfile.mkdtemp(prefix="babel-scaleout-", dir=ns.dir))
    etcd = start_etcd(scratch / "etcd")
    try:
        src = scratch / "src"
        make_tree(src, files, size)
        want = digest(src)
        total = sum(s for s, _ in want.values())
        log(f"{files} files, {total / 1e6:.0f} MB, --bwlimit {ns.bwlimit / 1e6:g} MB/s per process, "
            f"shards of {shard_keys} keys, chunks of {chunk_keys}")  # fmt: skip
        common = ["--bwlimit", str(ns.bwlimit), "--transfers", "8", "--verify", "sample"]
        times: dict[str, list[float]] = {"local": [], "one": [], "many": []}
        kinds = list(times)
        for rep in range(reps):
            for kind in kinds[rep % 3 :] + kinds[: rep % 3]:
                dst = scratch / f"dst-{kind}-{rep}"
                n = ns.procs if kind == "many" else 1
                shared = [] if kind == "local" else ["--etcd", etcd.endpoint, "--job", f"{kind}-{rep}",
                                                     "--shard-keys", str(shard_keys), "--chunk-keys", str(chunk_keys)]  # fmt: skip
                t = run_procs(n, src, dst, f"{kind}-{rep}", scratch, [*common, *shared])
                got = digest(dst)
                if got != want:
                    raise SystemExit(f"{kind} rep {rep}: the copy differs ({len(got)} of {len(want)} files)")
                times[kind].append(t)
                log(f"rep {rep} {kind:>5} ({n} process{'es' if n > 1 else ''}): {t:.2f} s, {total / t / 1e6:.1f} MB/s")
                shutil.rmtree(dst)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["one"] / med["many"]
        print(f"{'run':<28}{'median s':>10}{'MB/s':>9}")
        for kind, label in (("local", "local babel sync"), ("one", "shared, 1 process"),
                            ("many", f"shared, {ns.procs} processes")):  # fmt: skip
            print(f"{label:<28}{med[kind]:>10.2f}{total / med[kind] / 1e6:>9.1f}")
        print(f"scale-out {ns.procs} / 1: {ratio:.2f} (target >= 2.5 for 3); sharing cost (1 shared / local): "
              f"{med['one'] / med['local']:.2f}")  # fmt: skip
        print(f"RESULT procs={ns.procs} files={files} bytes={total} bwlimit={ns.bwlimit} reps={reps} "
              f"local_s={med['local']:.3f} one_s={med['one']:.3f} many_s={med['many']:.3f} "
              f"scaleout_ratio={ratio:.3f} sharing_cost={med['one'] / med['local']:.3f} "
              f"shard_keys={shard_keys} chunk_keys={chunk_keys}")  # fmt: skip
    finally:
        etcd.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
