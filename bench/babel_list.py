"""Parallel metadata prefetch vs serial ListObjectsV2 paging (Ling report §2.3.2: 36x).

A key space is served by a store that answers each list request after a fixed latency
(``--latency``, default 20 ms: a remote object store's round trip). ``--store memory`` (default)
answers from a sorted in-memory key list, as a remote service does, so the measurement is the
listing algorithm against latency; ``--store file`` uses Babel's real ``file://`` backend on a
scratch directory, where this process also pays for the directory walks. The key space is
listed serially and with ``babel.lister.list_parallel``; both are timed. Layout: nested "dataset"
directories (20 per 200k keys, of 100 subdirectories of 50 keys) plus one flat directory holding
half of the keys, so both directory probes and StartAfter range splitting are needed.

Memory: the parallel listing of ``--keys`` and of ten times as many keys (``--memory-concurrency``
requests in flight, default 64, the lister's default), each page built afresh by the "server" (as
a client parsing an answer does), RSS sampled at every page; the growth over the RSS before the
listing is reported for both sizes. It must stay flat: the lister holds the pages in flight and
64 queued ones plus a queue of ranges, never the keys, so its bound is (concurrency + 64) pages
(~300 bytes per key).

Target: parallel / serial speed-up >= 36x (paper), aim 50x; memory growth flat from 200k to 2M
keys. Ends with ``RESULT key=value ...``.

Usage: python bench/babel_list.py [--quick] [--keys N] [--latency S] [--concurrency N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import print_result  # first: it puts the checkout on sys.path

from babel import open_store  # noqa: E402
from babel.lister import list_parallel_pages, list_serial_pages  # noqa: E402
from babel.testing import MemoryBucket  # noqa: E402


class Delayed:
    """An ObjectStore wrapper that answers every list request ``latency`` seconds after it was sent.

    The answer is computed first and its time counted in the latency (a remote server's work
    happens on the server): the in-process "server" costs the lister no extra round time."""

    def __init__(self, store, latency: float) -> None:
        self._store = store
        self.latency = latency
        self.requests = 0

    async def list_page(self, *args, **kwargs):
        self.requests += 1
        sent = time.perf_counter()
        answer = await self._store.list_page(*args, **kwargs)
        await asyncio.sleep(max(0.0, self.latency - (time.perf_counter() - sent)))
        return answer

    def __getattr__(self, name):
        return getattr(self._store, name)


def key_names(keys: int) -> list[str]:
    """Half the keys flat in one prefix, the rest in a 3-level tree of 50-key leaves."""
    names = [f"flat/{(i * 2654435761) % (1 << 32):08x}-{i}" for i in range(keys // 2)]
    leaf = 0
    while len(names) < keys:
        names += [f"tree/d{leaf // 100:03d}/e{leaf % 100:03d}/f{j:04d}" for j in range(min(50, keys - len(names)))]
        leaf += 1
    return names


def build(root: Path, keys: int) -> int:
    """Half the keys flat in one directory, the rest in a 3-level tree; returns the count."""
    flat = root / "flat"
    flat.mkdir(parents=True)
    made = 0
    for i in range(keys // 2):
        (flat / f"{(i * 2654435761) % (1 << 32):08x}-{i}").touch()
        made += 1
    per_leaf = 50
    leaf = 0
    while made < keys:
        d = root / "tree" / f"d{leaf // 100:03d}" / f"e{leaf % 100:03d}"
        d.mkdir(parents=True)
        for j in range(min(per_leaf, keys - made)):
            (d / f"f{j:04d}").touch()
            made += 1
        leaf += 1
    return made


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def memory_run(keys: int, latency: float, concurrency: int) -> tuple[float, float, int]:
    """List ``keys`` keys in parallel with fresh pages; returns (seconds, RSS growth MiB, keys)."""
    store = Delayed(MemoryBucket(key_names(keys), fresh=True), latency)
    gc.collect()
    base = peak = rss_mib()
    start = time.perf_counter()
    count = 0
    async for page in list_parallel_pages(store, concurrency=concurrency):
        count += len(page)
        peak = max(peak, rss_mib())
    return time.perf_counter() - start, peak - base, count


async def timed(fn, make_store, latency: float, **kwargs) -> tuple[float, int, int]:
    store = Delayed(make_store(), latency)
    start = time.perf_counter()
    count = 0
    async for page in fn(store, **kwargs):
        count += len(page)
    return time.perf_counter() - start, count, store.requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20k keys, 1 rep (under a minute)")
    ap.add_argument("--keys", type=int, help="keys to list (default 200k, quick 20k)")
    ap.add_argument("--latency", type=float, default=0.020, help="seconds added per list request")
    ap.add_argument("--concurrency", type=int, default=256, help="parallel lister's requests in flight")
    ap.add_argument("--memory-concurrency", type=int, default=64, help="requests in flight in the memory runs")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    ap.add_argument("--store", choices=["memory", "file"], default="memory", help="what answers the list requests")
    args = ap.parse_args()
    keys = args.keys or (20_000 if args.quick else 200_000)
    reps = args.reps or (1 if args.quick else 3)
    scratch = Path(tempfile.mkdtemp(prefix="babel-list-"))
    try:
        t = time.perf_counter()
        memory = names = None
        if args.store == "file":
            made = build(scratch / "root", keys)
            uri = f"file://{scratch}/root"

            def make_store():
                return open_store(uri)
        else:
            names = key_names(keys)
            made = len(names)
            memory = MemoryBucket(names)

            def make_store():
                return memory

        print(f"built {made} keys ({args.store}) in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        serial, parallel = [], []
        for rep in range(reps):
            s = asyncio.run(timed(list_serial_pages, make_store, args.latency))
            p = asyncio.run(timed(list_parallel_pages, make_store, args.latency, concurrency=args.concurrency))
            assert s[1] == p[1] == made, (s[1], p[1], made)
            serial.append(s)
            parallel.append(p)
            print(
                f"rep {rep + 1}/{reps}: serial {s[0]:.1f}s ({s[2]} requests), parallel {p[0]:.2f}s ({p[2]} requests)",
                file=sys.stderr,
            )
        s_time = statistics.median(x[0] for x in serial)
        p_time = statistics.median(x[0] for x in parallel)
        memory = names = None  # the memory runs build their own key spaces
        sizes = [keys, keys * 10]
        mem = []
        for n in sizes:
            mem.append(asyncio.run(memory_run(n, args.latency, args.memory_concurrency)))
            assert mem[-1][2] == n, (mem[-1][2], n)
            print(f"memory run: {n} keys in {mem[-1][0]:.2f}s, RSS +{mem[-1][1]:.1f} MiB", file=sys.stderr)
        print(
            f"\nBabel listing: {made} keys ({args.store} store), {args.latency * 1000:.0f} ms per request, medians of {reps}"
        )
        print(f"  serial ListObjectsV2 paging   {s_time:8.2f} s  {made / s_time:10.0f} keys/s  {serial[0][2]} requests")
        print(
            f"  parallel (concurrency {args.concurrency:3d})  {p_time:8.2f} s  {made / p_time:10.0f} keys/s  {parallel[0][2]} requests"
        )
        print(f"  speed-up {s_time / p_time:.1f}x (target >= 36x, aim 50x)")
        for n, (secs, growth, _) in zip(sizes, mem, strict=True):
            print(
                f"  memory: {n:9d} keys listed in {secs:6.2f} s, RSS growth {growth:6.1f} MiB"
                f" (fresh pages, concurrency {args.memory_concurrency})"
            )
        print_result(
            {
                "speedup": s_time / p_time,
                "serial_s": s_time,
                "parallel_s": p_time,
                "keys": made,
                "latency_ms": args.latency * 1000,
                "concurrency": args.concurrency,
                "serial_requests": serial[0][2],
                "parallel_requests": parallel[0][2],
                "rss_growth_mib": mem[0][1],
                "big_keys": sizes[1],
                "big_parallel_s": mem[1][0],
                "big_rss_growth_mib": mem[1][1],
                "memory_concurrency": args.memory_concurrency,
            }
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
