#!/usr/bin/env python
"""PCache SDK I/O against the physical limits of the same machine.

Starts a local cluster (one master, two workers, every process on this host, data in
a temporary directory on one disk) and measures, as medians of ``--reps`` repetitions:

1. ``write_ratio``: one SDK stream writing a ``--size`` byte file with RF=1, over a raw
   sequential ``os.write`` of the same bytes to the same disk at equal durability (8 MiB
   buffers, ``fsync`` before the clock stops; PCache fsyncs every block before it acks).
   ``rf2_write_ratio`` is the same with RF=2, reported apart: on one machine both
   replicas share one disk, so every byte is written twice and ~0.5 is the ceiling.
2. ``write4_ratio``: 4 threads, each writing its own file of ``size / 4`` bytes through
   one shared SDK client, over 4 concurrent raw writers.
3. ``cached_read_ratio``: the second SDK read of a file just read once (served from the
   worker's memory tier or the page cache; a same-host client reads block files through
   the short circuit) over the second plain ``os.read`` pass of a raw file of the same
   size (page cache). The first, cold-ish reads (page cache dropped with
   ``posix_fadvise(DONTNEED)`` where the kernel honours it) are reported as
   ``cold_read_ratio``; a TCP-only client (``short_circuit=False``) shows the memory tier.
4. ``create_ratio`` / ``stat_ratio``: create+close of N empty files and ``stat`` of N
   files through the SDK (stat from a client with ``metadata_ttl=0``, so every call is a
   master RPC) over ``os.open``/``os.close`` and ``os.stat`` in a local directory.
5. Peak RSS (``VmHWM``) of each worker process at the end, and the memory of a reader: the most
   bytes of read units (the unit being read and its read-ahead) the TCP reader held, against its
   client's ``read_budget`` (``reader_units_mib``, ``read_budget_mib``).

6. The loopback wire: what a Python process receives from another one over ``WIRE_CONNECTIONS``
   sockets with ``recv(MSG_WAITALL)`` (``tcp_vs_wire_ratio``: the TCP reader against it).

Targets: ``write_ratio >= 0.8``, ``write4_ratio >= 0.8``, ``cached_read_ratio >= 0.7`` and
``tcp_cached_read_ratio >= 0.5`` (issue #18; on two cores the wire row is the ceiling of the last).

The last line of output is ``RESULT key=value ...``; throughputs are MB/s (10**6 bytes/s),
metadata rates are operations/s, RSS is MiB.

Usage::

    python bench/pcache_io.py --quick            # 256 MiB, 3 reps, N=500; under a minute
    python bench/pcache_io.py                    # 2 GiB, 7 reps, N=2000; a few minutes
    python bench/pcache_io.py --size 4GiB --reps 3 --dir /mnt/nvme
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import block_files, drop_page_cache, mbps, peak_rss_mib, print_result

from pcache.client import Client  # noqa: E402
from pcache.common.config import ClientConfig, parse_size  # noqa: E402
from pcache.common.logs import setup_logging
from pcache.local import LocalCluster  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
BUF = 8 * MiB  # write/read buffer of both sides
STREAMS = 4
WORKERS = 2  # RF=2 needs two workers
WRITE_TARGET = 0.8
WRITE4_TARGET = 0.8
CACHED_READ_TARGET = 0.7
TCP_READ_TARGET = 0.5
WIRE_CONNECTIONS = 2  # a reader's demand unit and its read-ahead come over about this many at once


def log(msg: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def parallel(fns: list[Callable[[], None]]) -> float:
    """Run ``fns`` on one thread each, released together; wall seconds until all finished."""
    barrier = threading.Barrier(len(fns) + 1)
    errors: list[BaseException] = []

    def body(fn: Callable[[], None]) -> None:
        barrier.wait()
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


# ------------------------------------------------------------------ raw side --


def raw_write(path: str, size: int, buf: bytes) -> None:
    """Sequential write of ``size`` bytes, then fsync: the durability PCache gives on close."""
    view = memoryview(buf)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left:
            left -= os.write(fd, view[: min(left, len(view))])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        while chunk := os.read(fd, BUF):
            total += len(chunk)
    finally:
        os.close(fd)
    return total


WIRE_SENDER = """
import socket, sys
size, piece = int(sys.argv[1]), int(sys.argv[2])
data = memoryview(bytes(range(256)) * (piece // 256))
with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            sent = 0
            while sent < size:
                conn.sendall(data[: min(piece, size - sent)])
                sent += min(piece, size - sent)
"""


def wire_read(size: int, connections: int) -> float:
    """The loopback ceiling of this machine for Python: another process sends ``size`` bytes over
    ``connections`` sockets at once (from memory, as a worker's memory tier does) and this one
    receives them in ``BUF`` pieces with ``recv(MSG_WAITALL)``, one thread per socket, as the SDK
    does. Returns MB/s."""
    part = size // connections
    proc = subprocess.Popen([sys.executable, "-c", WIRE_SENDER, str(part), str(BUF)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]

        def drain(sock: socket.socket) -> None:
            left = part
            while left:
                got = sock.recv(min(BUF, left), socket.MSG_WAITALL)
                if not got:
                    raise AssertionError("the sender closed early")
                left -= len(got)

        secs = parallel([lambda s=s: drain(s) for s in socks])
        for sock in socks:
            sock.close()
        return mbps(part * connections, secs)
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ SDK side --


def sdk_write(client: Client, path: str, size: int, buf: bytes, replication: int, block_size: int) -> None:
    """Write ``size`` bytes and close (close commits: blocks fsynced on the workers)."""
    view = memoryview(buf)
    with client.open(path, "wb", replication=replication, block_size=block_size) as f:
        left = size
        while left:
            n = min(left, len(view))
            f.write(view[:n])
            left -= n


def sdk_read(client: Client, path: str, held: list[int] | None = None) -> int:
    """Read a file in ``BUF`` pieces; ``held`` gets the most bytes of read units the client held."""
    total = 0
    with client.open(path, "rb") as f:
        while chunk := f.read(BUF):
            total += len(chunk)
            if held is not None:
                held.append(client.aio.read_budget.used)
    return total


# ------------------------------------------------------------------ benchmark --


class Bench:
    """One benchmark run: the cluster, the local scratch directory, the samples."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.size: int = args.size
        self.reps: int = args.reps
        self.nmeta: int = args.files
        self.root = root
        self.local = root / "local"
        self.local.mkdir()
        self.buf = os.urandom(BUF)
        self.samples: dict[str, list[float]] = {}
        self.cluster = LocalCluster(
            str(root / "cluster"),
            workers=WORKERS,
            master_args=["--master.default_replication=1"],
            worker_args=[f"--worker.mem_tier_bytes={args.mem_tier}"],
        )
        self.client: Client | None = None

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def med(self, key: str) -> float:
        return statistics.median(self.samples[key])

    def open_client(self, **overrides) -> Client:
        return Client(ClientConfig(master=self.cluster.master_address, **overrides))

    # -------------------------------------------------------------- phases --

    def run(self) -> dict[str, float]:
        t0 = time.perf_counter()
        self.cluster.start()
        log(f"cluster up in {time.perf_counter() - t0:.1f}s: master {self.cluster.master_address}, {WORKERS} workers")
        self.client = self.open_client()
        try:
            self.client.mkdir("/bench", parents=True)
            self.bench_write()
            self.bench_write4()
            self.bench_read()
            self.bench_meta()
            rss = [peak_rss_mib(p.pid) for p in self.cluster.worker_procs]
            for i, value in enumerate(rss):
                self.samples[f"worker{i}_peak_rss_mib"] = [value]
            self.samples["worker_peak_rss_mib"] = [max(rss)]
            self.samples["master_peak_rss_mib"] = [peak_rss_mib(self.cluster.master.pid)] if self.cluster.master else []
            self.samples["bench_peak_rss_mib"] = [peak_rss_mib(os.getpid())]
        finally:
            self.client.close()
        return {k: self.med(k) for k, v in self.samples.items() if v}

    def bench_write(self) -> None:
        """Single stream: raw, SDK RF=1, SDK RF=2, interleaved per repetition to share drift."""
        assert self.client is not None
        raw = str(self.local / "raw-write.bin")
        for rep in range(self.reps):
            os.sync()  # no earlier dirty pages in the next measurement
            t = time.perf_counter()
            raw_write(raw, self.size, self.buf)
            self.add("raw_write", mbps(self.size, time.perf_counter() - t))
            os.unlink(raw)
            for rf, key in ((1, "sdk_write"), (2, "sdk_rf2_write")):
                path = f"/bench/w{rf}-{rep}.bin"
                os.sync()
                t = time.perf_counter()
                sdk_write(self.client, path, self.size, self.buf, rf, self.args.block_size)
                self.add(key, mbps(self.size, time.perf_counter() - t))
                self.client.unlink(path)
            log(
                f"write rep {rep + 1}/{self.reps}: raw {self.samples['raw_write'][-1]:.0f} MB/s, "
                f"sdk rf1 {self.samples['sdk_write'][-1]:.0f}, rf2 {self.samples['sdk_rf2_write'][-1]:.0f}"
            )

    def bench_write4(self) -> None:
        """STREAMS concurrent writers, each its own file of size/STREAMS bytes."""
        client = self.client
        assert client is not None
        part = self.size // STREAMS
        total = part * STREAMS
        for rep in range(self.reps):
            raws = [str(self.local / f"raw4-{i}.bin") for i in range(STREAMS)]
            os.sync()
            secs = parallel([lambda p=p: raw_write(p, part, self.buf) for p in raws])
            self.add("raw_write4", mbps(total, secs))
            for p in raws:
                os.unlink(p)
            paths = [f"/bench/w4-{rep}-{i}.bin" for i in range(STREAMS)]
            os.sync()
            secs = parallel([lambda p=p: sdk_write(client, p, part, self.buf, 1, self.args.block_size) for p in paths])
            self.add("sdk_write4", mbps(total, secs))
            for p in paths:
                client.unlink(p)
            log(
                f"write x{STREAMS} rep {rep + 1}/{self.reps}: raw {self.samples['raw_write4'][-1]:.0f} MB/s, "
                f"sdk {self.samples['sdk_write4'][-1]:.0f}"
            )

    def bench_read(self) -> None:
        """Cold-ish then cached reads of one SDK file and one raw file of the same size."""
        assert self.client is not None
        raw = str(self.local / "raw-read.bin")
        path = "/bench/read.bin"
        raw_write(raw, self.size, self.buf)
        sdk_write(self.client, path, self.size, self.buf, 1, self.args.block_size)
        with self.client.open(path, "rb") as f:  # the bytes are right, not just their count
            if f.pread(0, BUF) != self.buf[: min(BUF, self.size)]:
                raise AssertionError("SDK read returned other bytes than written")
        tcp = self.open_client(short_circuit=False)
        self.held: list[int] = []
        self.samples["read_budget_mib"] = [tcp.aio.read_budget.limit / MiB]
        try:
            for rep in range(self.reps):
                drop_page_cache([raw, *block_files(self.root / "cluster")])
                for key, fn in (
                    ("raw_cold_read", lambda: raw_read(raw)),
                    ("page_cache_read", lambda: raw_read(raw)),
                    ("sdk_cold_read", lambda: sdk_read(self.client, path)),
                    ("sdk_cached_read", lambda: sdk_read(self.client, path)),
                    ("sdk_tcp_read", lambda: sdk_read(tcp, path, self.held)),
                    ("sdk_tcp_cached_read", lambda: sdk_read(tcp, path)),
                ):
                    if key == "sdk_tcp_read":
                        self.add("wire_read", wire_read(self.size, WIRE_CONNECTIONS))
                    t = time.perf_counter()
                    got = fn()
                    secs = time.perf_counter() - t
                    if got != self.size:
                        raise AssertionError(f"{key}: read {got} bytes, expected {self.size}")
                    self.add(key, mbps(self.size, secs))
                s = self.samples
                log(
                    f"read rep {rep + 1}/{self.reps}: raw cold {s['raw_cold_read'][-1]:.0f} MB/s, "
                    f"cached {s['page_cache_read'][-1]:.0f}; sdk cold {s['sdk_cold_read'][-1]:.0f}, "
                    f"cached {s['sdk_cached_read'][-1]:.0f}, tcp cached {s['sdk_tcp_cached_read'][-1]:.0f}, "
                    f"wire {s['wire_read'][-1]:.0f}"
                )
        finally:
            tcp.close()
        self.samples["reader_units_mib"] = [max(self.held, default=0) / MiB]
        os.unlink(raw)
        self.client.unlink(path)

    def bench_meta(self) -> None:
        """create+close and stat of N files: SDK (stat uncached) vs the local file system."""
        client = self.client
        assert client is not None
        n = self.nmeta
        fresh = self.open_client(metadata_ttl=0)
        try:
            for rep in range(self.reps):
                d = f"/bench/meta-{rep}"
                client.mkdir(d)
                names = [f"{d}/f{i:06d}" for i in range(n)]
                os.sync()  # no writeback of the data phases under the metadata timings
                t = time.perf_counter()
                for p in names:
                    client.open(p, "wb").close()
                self.add("sdk_create", n / (time.perf_counter() - t))
                t = time.perf_counter()
                for p in names:
                    fresh.stat(p)
                self.add("sdk_stat", n / (time.perf_counter() - t))
                client.remove(d, recursive=True)

                ld = self.local / f"meta-{rep}"
                ld.mkdir()
                lnames = [str(ld / f"f{i:06d}") for i in range(n)]
                os.sync()
                t = time.perf_counter()
                for p in lnames:
                    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
                self.add("local_create", n / (time.perf_counter() - t))
                t = time.perf_counter()
                for p in lnames:
                    os.stat(p)
                self.add("local_stat", n / (time.perf_counter() - t))
                shutil.rmtree(ld)
                s = self.samples
                log(
                    f"meta rep {rep + 1}/{self.reps}: create sdk {s['sdk_create'][-1]:.0f}/s "
                    f"local {s['local_create'][-1]:.0f}/s; stat sdk {s['sdk_stat'][-1]:.0f}/s "
                    f"local {s['local_stat'][-1]:.0f}/s"
                )
        finally:
            fresh.close()


# ------------------------------------------------------------------ report --


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def report(m: dict[str, float], args: argparse.Namespace) -> None:
    """Print the table, the notes and the RESULT line."""
    res: dict[str, float] = {
        "write_ratio": ratio(m["sdk_write"], m["raw_write"]),
        "write4_ratio": ratio(m["sdk_write4"], m["raw_write4"]),
        "rf2_write_ratio": ratio(m["sdk_rf2_write"], m["raw_write"]),
        "cached_read_ratio": ratio(m["sdk_cached_read"], m["page_cache_read"]),
        "cold_read_ratio": ratio(m["sdk_cold_read"], m["raw_cold_read"]),
        "tcp_cached_read_ratio": ratio(m["sdk_tcp_cached_read"], m["page_cache_read"]),
        "tcp_vs_wire_ratio": ratio(m["sdk_tcp_cached_read"], m["wire_read"]),
        "create_ratio": ratio(m["sdk_create"], m["local_create"]),
        "stat_ratio": ratio(m["sdk_stat"], m["local_stat"]),
    }
    rows = [
        ("write 1 stream RF=1 (MB/s)", m["sdk_write"], m["raw_write"], res["write_ratio"], WRITE_TARGET),
        ("write 1 stream RF=2 (MB/s)", m["sdk_rf2_write"], m["raw_write"], res["rf2_write_ratio"], None),
        (f"write {STREAMS} streams RF=1 (MB/s)", m["sdk_write4"], m["raw_write4"], res["write4_ratio"], WRITE4_TARGET),
        ("read cold-ish (MB/s)", m["sdk_cold_read"], m["raw_cold_read"], res["cold_read_ratio"], None),
        ("read cached (MB/s)", m["sdk_cached_read"], m["page_cache_read"], res["cached_read_ratio"], CACHED_READ_TARGET),
        ("read cached, TCP path (MB/s)", m["sdk_tcp_cached_read"], m["page_cache_read"], res["tcp_cached_read_ratio"], TCP_READ_TARGET),
        ("  TCP path vs loopback wire (MB/s)", m["sdk_tcp_cached_read"], m["wire_read"], res["tcp_vs_wire_ratio"], None),
        ("create+close (ops/s)", m["sdk_create"], m["local_create"], res["create_ratio"], None),
        ("stat, uncached (ops/s)", m["sdk_stat"], m["local_stat"], res["stat_ratio"], None),
    ]  # fmt: skip
    print()
    print(
        f"PCache I/O benchmark: size {args.size / MiB:.0f} MiB, medians of {args.reps} reps, "
        f"{args.files} files for metadata, {WORKERS} workers on this host, mem tier {args.mem_tier / MiB:.0f} MiB each"
    )
    header = f"{'measure':<34}{'pcache':>12}{'baseline':>12}{'ratio':>8}  {'target':<8}"
    print(header)
    print("-" * len(header))
    for name, sdk, base, r, target in rows:
        verdict = "" if target is None else (f">={target} " + ("ok" if r >= target else "MISS"))
        print(f"{name:<34}{sdk:>12.0f}{base:>12.0f}{r:>8.2f}  {verdict}")
    rss = [m[k] for k in sorted(m) if k.startswith("worker") and k[6:7].isdigit()]
    print(
        "peak RSS (VmHWM, MiB): workers "
        + ", ".join(f"{v:.0f}" for v in rss)
        + f"; master {m.get('master_peak_rss_mib', 0):.0f}; this process (client) {m.get('bench_peak_rss_mib', 0):.0f}"
    )
    print(
        f"memory of a reader: a TCP reader held at most {m['reader_units_mib']:.0f} MiB of read units "
        f"(the unit being read and its read-ahead), bound by the client's read_budget {m['read_budget_mib']:.0f} MiB"
    )
    print()
    print("baselines: raw = os.write of 8 MiB buffers + fsync on the same disk (PCache fsyncs each block);")
    print(f"  {STREAMS} streams = {STREAMS} threads with their own file of size/{STREAMS}, one shared SDK client;")
    print("  cached read = second os.read pass (8 MiB) over a raw file of the same size (page cache);")
    print("  cold-ish = first read after posix_fadvise(DONTNEED) of the raw file and the block files.")
    print("RF=2: every worker runs on this one host and shares one disk, so RF=2 writes each byte twice")
    print("  to the same device; its ratio is against the single-copy raw write (ceiling ~0.5 here).")
    print("SDK reads on this host use the short circuit (block fds, page cache); the TCP row uses a")
    print("  client with short_circuit=False, whose second read is served from the workers' memory tier.")
    print(f"loopback wire = {WIRE_CONNECTIONS} sockets from another Python process (sending from memory) received")
    print("  with recv(MSG_WAITALL) in 8 MiB pieces: the most a Python reader gets over loopback on this machine.")
    keys = {
        **{k: round(v, 3) for k, v in res.items()},
        "sdk_write_mbps": m["sdk_write"],
        "raw_write_mbps": m["raw_write"],
        "sdk_rf2_write_mbps": m["sdk_rf2_write"],
        "sdk_write4_mbps": m["sdk_write4"],
        "raw_write4_mbps": m["raw_write4"],
        "sdk_cold_read_mbps": m["sdk_cold_read"],
        "raw_cold_read_mbps": m["raw_cold_read"],
        "sdk_cached_read_mbps": m["sdk_cached_read"],
        "page_cache_read_mbps": m["page_cache_read"],
        "sdk_tcp_cached_read_mbps": m["sdk_tcp_cached_read"],
        "wire_read_mbps": m["wire_read"],
        "sdk_create_ops": m["sdk_create"],
        "local_create_ops": m["local_create"],
        "sdk_stat_ops": m["sdk_stat"],
        "local_stat_ops": m["local_stat"],
        "worker_peak_rss_mib": m["worker_peak_rss_mib"],
        "reader_units_mib": round(m["reader_units_mib"], 1),
        "read_budget_mib": m["read_budget_mib"],
        "size_bytes": args.size,
        "reps": args.reps,
    }
    print_result(keys)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="256 MiB, 3 reps, 500 files (under a minute)")
    p.add_argument("--size", type=parse_size, help="bytes per file (suffixes ok: 2GiB); default 2 GiB")
    p.add_argument("--reps", type=int, help="repetitions per measure (default 7, quick 3)")
    p.add_argument("--files", type=int, help="files for the metadata test (default 2000, quick 500)")
    p.add_argument("--block-size", type=parse_size, default=0, help="SDK block size (default: master's, 32 MiB)")
    p.add_argument("--mem-tier", type=parse_size, help="worker memory tier bytes (default: fits one file)")
    p.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (cluster logs) afterwards")
    args = p.parse_args(argv)
    if args.size is None:
        args.size = 256 * MiB if args.quick else 2 * GiB
    if args.reps is None:
        args.reps = 3 if args.quick else 7
    if args.files is None:
        args.files = 500 if args.quick else 2000
    if args.mem_tier is None:
        # the cached TCP read needs the whole file in one worker's tier (RF=1 may put every block on one)
        args.mem_tier = max(512 * MiB, args.size + args.size // 4)
    if args.size < BUF or args.reps < 1 or args.files < 1:
        p.error("--size must be at least 8 MiB, --reps and --files at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("WARNING", fmt="%(levelname)s %(name)s: %(message)s")
    root = Path(tempfile.mkdtemp(prefix="pcache-bench-", dir=args.dir))
    started = time.perf_counter()
    bench: Bench | None = None
    try:
        bench = Bench(args, root)
        medians = bench.run()
    finally:
        if bench is not None:
            bench.cluster.stop()
        if args.keep:
            log(f"scratch kept in {root}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(root)
    log(f"done in {time.perf_counter() - started:.1f}s")
    report(medians, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
