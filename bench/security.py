#!/usr/bin/env python
"""What security costs: TLS against plaintext, and the token checks against the operations.

Two local clusters run side by side (one master, one worker, RF=1, every process on this host):
one plaintext, one with mutual TLS (``LocalCluster(tls=True)``, as ``pcache up --tls``). Both
check tenant tokens and block tokens: PCache has no unauthenticated mode, so the cost of the
checks is measured directly instead, in this process, and set against the operations' own
times from the same run. As medians of ``--reps`` repetitions, alternating the two clusters:

1. ``tls_write_ratio``: one SDK stream writing a ``--size`` byte file, TLS over plaintext;
   ``tls_read_ratio``: reading it back over TCP (``short_circuit=False``: the short circuit is
   a local UNIX socket and stays the same with TLS; ``sc_read`` shows it);
2. ``tls_create_ratio`` / ``tls_stat_ratio``: create+close of ``--files`` empty files and
   ``stat`` of each (client cache off), TLS over plaintext;
3. ``auth_meta_ratio``: a stat's time without its token check over its time with it (the
   master's ``Guard.authorize`` of a remembered token, measured here), i.e. secured over open;
   ``auth_data_ratio``: the same for one read unit (``client.read_unit`` bytes) and its block
   token check on the worker (``BlockTokenChecker.check``); ``auth_layout_us``: the master's
   cost of signing one block token (each located block of a layout, each allocation).

Targets: ratios >= 0.9 for data and >= 0.8 for metadata. The last line is ``RESULT key=value
...`` (MB/s = 10**6 bytes/s, operations/s, microseconds).

Usage::

    python bench/security.py --quick     # 128 MiB, 3 reps, 300 files; about a minute
    python bench/security.py             # 512 MiB, 5 reps, 1000 files
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import mbps, print_result

from pcache.client import Client  # noqa: E402
from pcache.common.auth import BlockTokenChecker, Guard, KeyRing, bearer, mint_block_token, mint_token  # noqa: E402
from pcache.common.config import ClientConfig, parse_size  # noqa: E402
from pcache.local import LocalCluster  # noqa: E402

MiB = 1 << 20
BUF = 8 * MiB
DATA_TARGET, META_TARGET = 0.9, 0.8


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def per_call_seconds(fn, n: int = 200_000) -> float:
    """Median seconds per call of ``fn`` over 5 runs of ``n`` calls."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n)
    return statistics.median(runs)


def check_costs() -> dict[str, float]:
    """Seconds per check as the master and the workers do them (remembered tokens), and per mint."""
    ring = KeyRing.generate()
    guard = Guard(ring, {"Stat": frozenset({"tenant"})})
    metadata = bearer(mint_token(ring, "default"))
    checker = BlockTokenChecker("w-bench")
    checker.set_keys(ring.format())
    token = mint_block_token(ring, 7, "r", "default", 3600, ["w-bench", "w-other"])
    return {
        "guard": per_call_seconds(lambda: guard.authorize("Stat", metadata)),
        "block_check": per_call_seconds(lambda: checker.check(token, 7, "r")),
        "block_mint": per_call_seconds(lambda: mint_block_token(ring, 7, "r", "default", 3600, ["w-a", "w-b"]), 50_000),
    }


class Side:
    """One cluster and the client that measures it."""

    def __init__(self, root: Path, tls: bool) -> None:
        self.name = "tls" if tls else "plain"
        self.cluster = LocalCluster(
            str(root / self.name), workers=1, tls=tls, master_args=["--master.default_replication=1"]
        )
        self.cluster.start()
        cfg = ClientConfig(master=self.cluster.master_address, token=self.cluster.token, tls_dir=self.cluster.tls_dir,
                           short_circuit=False, metadata_ttl=0)  # fmt: skip
        self.client = Client(cfg)
        sc_cfg = ClientConfig(master=self.cluster.master_address, token=self.cluster.token,
                              tls_dir=self.cluster.tls_dir)  # fmt: skip
        self.sc_client = Client(sc_cfg)
        self.samples: dict[str, list[float]] = {}

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def median(self, key: str) -> float:
        return statistics.median(self.samples[key])

    def rep(self, rep: int, size: int, files: int, buf: bytes) -> None:
        pc = self.client
        path = f"/bench-{rep}"
        start = time.perf_counter()
        with pc.open(path, "wb", replication=1) as f:
            left = size
            while left:
                n = min(left, len(buf))
                f.write(memoryview(buf)[:n])
                left -= n
        self.add("write", mbps(size, time.perf_counter() - start))
        for key, client in (("read", pc), ("sc_read", self.sc_client)):
            start = time.perf_counter()
            total = 0
            with client.open(path, "rb") as f:
                while chunk := f.read(BUF):
                    total += len(chunk)
            assert total == size
            self.add(key, mbps(size, time.perf_counter() - start))
        pc.mkdir(f"/meta-{rep}")
        start = time.perf_counter()
        for i in range(files):
            with pc.open(f"/meta-{rep}/f{i}", "wb"):
                pass
        self.add("create", files / (time.perf_counter() - start))
        start = time.perf_counter()
        for i in range(files):
            pc.stat(f"/meta-{rep}/f{i}")
        self.add("stat", files / (time.perf_counter() - start))
        pc.remove(path)
        pc.remove(f"/meta-{rep}", recursive=True)

    def close(self) -> None:
        self.client.close()
        self.sc_client.close()
        self.cluster.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="128 MiB, 3 reps, 300 files")
    ap.add_argument("--size", default=None, help="bytes per file (default 512MiB)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args(argv)
    size = parse_size(args.size or ("128MiB" if args.quick else "512MiB"))
    reps = args.reps or (3 if args.quick else 5)
    files = args.files or (300 if args.quick else 1000)
    root = Path(tempfile.mkdtemp(prefix="pcache-sec-", dir=args.dir))
    buf = os.urandom(BUF)
    sides: list[Side] = []
    try:
        sides = [Side(root, tls=False), Side(root, tls=True)]
        for rep in range(reps):
            for side in sides if rep % 2 == 0 else reversed(sides):
                log(f"rep {rep + 1}/{reps}: {side.name}")
                side.rep(rep, size, files, buf)
        costs = check_costs()
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(root, ignore_errors=True)
    plain, tls = sides
    m = {f"{s.name}_{k}": s.median(k) for s in sides for k in ("write", "read", "sc_read", "create", "stat")}
    ratios = {k: tls.median(k) / plain.median(k) for k in ("write", "read", "sc_read", "create", "stat")}
    stat_s = 1 / plain.median("stat")
    unit = ClientConfig().read_unit
    unit_s = unit / (plain.median("read") * 1e6)
    auth_meta = (stat_s - costs["guard"]) / stat_s
    auth_data = (unit_s - costs["block_check"]) / unit_s
    print(f"{'':<22}{'plaintext':>12}{'TLS':>12}{'TLS/plain':>11}")
    for key, unit_name in (("write", "MB/s"), ("read", "MB/s"), ("sc_read", "MB/s"), ("create", "/s"), ("stat", "/s")):
        print(f"{key + ' ' + unit_name:<22}{plain.median(key):>12,.0f}{tls.median(key):>12,.0f}{ratios[key]:>11.2f}")
    print(f"token check per RPC (master, remembered)   {costs['guard'] * 1e6:.2f} us; a stat takes {stat_s * 1e6:.0f} us:"
          f" secured/open {auth_meta:.4f} (target {META_TARGET})")  # fmt: skip
    print(f"block token check per read unit (worker)   {costs['block_check'] * 1e6:.2f} us; a {unit >> 20} MiB unit takes"
          f" {unit_s * 1e3:.1f} ms: secured/open {auth_data:.5f} (target {DATA_TARGET})")  # fmt: skip
    print(f"block token signing per located block      {costs['block_mint'] * 1e6:.2f} us")
    data_ok = min(ratios["write"], ratios["read"]) >= DATA_TARGET
    meta_ok = min(ratios["create"], ratios["stat"]) >= META_TARGET
    print(f"TLS data >= {DATA_TARGET}: {'met' if data_ok else 'NOT met'}; TLS metadata >= {META_TARGET}: "
          f"{'met' if meta_ok else 'NOT met'}")  # fmt: skip
    print_result({
        **m,
        **{f"tls_{k}_ratio": v for k, v in ratios.items()},
        "auth_meta_ratio": auth_meta,
        "auth_data_ratio": auth_data,
        "guard_us": costs["guard"] * 1e6,
        "block_check_us": costs["block_check"] * 1e6,
        "auth_layout_us": costs["block_mint"] * 1e6,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
