"""Sampled verification (babel.verify.check_sample) vs full MD5 and CRC64 of the same bytes from disk.

Two copies of a ``--size`` file (default 10 GiB, 1 GiB with ``--quick``) of incompressible,
non-repeating bytes (random blocks, each stamped with its index) are written to a scratch
directory on the disk and fsynced. Each repetition, after ``posix_fadvise(DONTNEED)`` of both
files, times in turn: ``check_sample`` between the two ``file://`` copies (32 ranges of 1 MiB
from each by default: head, tail and one per stripe), a full ``hashlib.md5`` and a full CRC64
(crcmod's C extension, OSS's CRC64-ECMA) of one copy, each read cold in 8 MiB buffers.

Then the same for a ``--s3-size`` object (default 1 GiB, 256 MiB with ``--quick``) on
``rclone serve s3`` on loopback (its own process, backed by a scratch directory, so a ranged
GET reads just its range from a file, as a real store reads from disk): the object's file and
a local copy are written in one pass, then ``check_sample`` compares the local file
(``file://``) with the object; the baselines hash the local file. Before each measure both
files are dropped from the page cache, so the server reads cold too. Each store's client is
set up (one HEAD, untimed) before the clock starts, as in a sync that verifies many objects.
rclone computes an object's MD5 (its ETag) on the first HEAD and keeps it in memory; that HEAD
is made once, untimed (``s3_first_head_s``), as a store that keeps ETags would have it.
``s3_get_ms`` is the median time of one warm ranged GET of ``--sample-size`` bytes;
``--s3-concurrency`` (default 8) bounds the ranged GETs in flight per store.

``detection_probability`` is the chance that the configured sampling reads part of one
corrupted ``--region`` (1 MiB) placed uniformly at random: sampling is a pre-check, the full
CRC32C (check_full) is the integrity guarantee.

Target: sampled / MD5 speed-up >= 100x on the large file. Ends with ``RESULT key=value ...``.

Usage: python bench/babel_verify.py [--quick] [--size 10GiB] [--s3-size 1GiB] [--reps N] [--dir DIR] [--no-s3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import drop_page_cache, mbps, print_result  # first: it puts the checkout on sys.path

from babel import open_store  # noqa: E402
from babel.checksum import crc64ecma, detection_probability, sample_ranges  # noqa: E402
from babel.verify import check_sample  # noqa: E402
from pcache.common.config import parse_size  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
BUF = 8 * MiB  # write and hash buffer
KEY = "data.bin"
TARGET = 100.0


def log(msg: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def write_copies(paths: list[Path], size: int) -> None:
    """Write the same ``size`` incompressible bytes to every path (no holes, no two equal blocks), fsynced."""
    pool = os.urandom(64 * MiB + BUF)
    fds = []
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    try:
        for index, offset in enumerate(range(0, size, BUF)):
            start = (index * 7_919 * 4096) % (len(pool) - BUF)  # a different window of the pool per block
            block = bytearray(pool[start : start + min(BUF, size - offset)])
            stamp = index.to_bytes(8, "little")
            block[: len(stamp)] = stamp[: len(block)]
            for fd in fds:
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def hash_file(path: Path, update: Callable[[memoryview], None]) -> int:
    """Feed the whole file to ``update`` in 8 MiB reads; return the bytes read."""
    buf = bytearray(BUF)
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            update(memoryview(buf)[:n])
            total += n
    return total


def md5_file(path: Path) -> float:
    h = hashlib.md5()
    start = time.perf_counter()
    hash_file(path, h.update)
    return time.perf_counter() - start


def crc64_file(path: Path) -> float:
    crc = 0

    def update(view: memoryview) -> None:
        nonlocal crc
        crc = crc64ecma(view, crc)

    start = time.perf_counter()
    hash_file(path, update)
    return time.perf_counter() - start


def sample_check(src_uri: str, dst_uri: str, size: int, args: argparse.Namespace, concurrency: int) -> float:
    async def go() -> float:
        src, dst = open_store(src_uri), open_store(dst_uri)
        try:
            await asyncio.gather(src.head(KEY), dst.head(KEY))  # S3: the client and a connection exist
            start = time.perf_counter()
            result = await check_sample(
                src, dst, KEY, size, samples=args.samples, sample_size=args.sample_size, concurrency=concurrency
            )
            elapsed = time.perf_counter() - start
        finally:
            await asyncio.gather(src.close(), dst.close())
        if not result.ok:
            raise SystemExit(f"copies differ: {result.detail}")
        return elapsed

    return asyncio.run(go())


def measure(label: str, files: list[Path], src_uri: str, dst_uri: str, size: int, reps: int, args, conc: int):
    """Medians (sample, md5, crc64 seconds) over ``reps``, each measure after dropping ``files`` from the page cache."""
    times: dict[str, list[float]] = {"sample": [], "md5": [], "crc64": []}
    for rep in range(reps):
        drop_page_cache([str(f) for f in files])
        times["sample"].append(sample_check(src_uri, dst_uri, size, args, conc))
        drop_page_cache([str(f) for f in files])
        times["md5"].append(md5_file(files[0]))
        drop_page_cache([str(f) for f in files])
        times["crc64"].append(crc64_file(files[0]))
        log(
            f"{label} rep {rep + 1}/{reps}: sample {times['sample'][-1] * 1000:.1f} ms, "
            f"md5 {times['md5'][-1]:.2f} s, crc64 {times['crc64'][-1]:.2f} s"
        )
    return {k: statistics.median(v) for k, v in times.items()}


def get_latency_ms(uri: str, size: int, sample_size: int) -> float:
    """Median milliseconds of one ranged GET of ``sample_size`` bytes (5 tries)."""

    async def go() -> float:
        store = open_store(uri)
        times = []
        try:
            for i in range(5):
                start = time.perf_counter()
                await store.get(KEY, (size - sample_size) * i // 4, sample_size)
                times.append(time.perf_counter() - start)
        finally:
            await store.close()
        return statistics.median(times) * 1000

    return asyncio.run(go())


def s3_section(scratch: Path, args: argparse.Namespace, reps: int) -> dict[str, float]:
    """The S3 measure on ``rclone serve s3`` (bucket ``bench``, object ``verify/data.bin``)."""
    from babel_sync import ACCESS, REGION, SECRET, s3_client, start_rclone_serve

    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)
    size = args.s3_size
    root = scratch / "s3root"
    local, served = scratch / "s3src" / KEY, root / "bench" / "verify" / KEY
    t = time.perf_counter()
    write_copies([local, served], size)  # the server's file is the object: no upload through it
    server = start_rclone_serve(root, scratch, exist_ok=True)
    try:
        uri = f"s3://bench/verify?endpoint_url={server.endpoint}&provider=rclone"
        t_head = time.perf_counter()
        s3_client(server.endpoint).head_object(Bucket="bench", Key=f"verify/{KEY}")
        first_head = time.perf_counter() - t_head
        log(
            f"s3: wrote 2 x {size / MiB:.0f} MiB in {t_head - t:.1f}s; rclone serve s3 at {server.endpoint}, "
            f"first HEAD (MD5 of the object) {first_head:.1f}s"
        )
        m = measure("s3", [local, served], f"file://{local.parent}", uri, size, reps, args, args.s3_concurrency)
        m["get_ms"] = get_latency_ms(uri, size, args.sample_size)
        m["first_head_s"] = first_head
        return m
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 GiB file, 256 MiB S3 object, 3 reps (about a minute)")
    ap.add_argument("--size", type=parse_size, help="file bytes (suffixes ok: 10GiB); default 10 GiB, quick 1 GiB")
    ap.add_argument("--s3-size", type=parse_size, help="S3 object bytes; default 1 GiB, quick 256 MiB")
    ap.add_argument("--reps", type=int, help="repetitions (default 5, quick 3; S3 at most 3, quick 1)")
    ap.add_argument("--samples", type=int, default=32, help="sampled ranges per object (head, tail, stripes)")
    ap.add_argument("--sample-size", type=parse_size, default=MiB, help="bytes per sampled range")
    ap.add_argument("--region", type=parse_size, default=MiB, help="corrupted region for detection_probability")
    ap.add_argument("--concurrency", type=int, default=8, help="ranges in flight per store (file://)")
    ap.add_argument("--s3-concurrency", type=int, default=8, help="ranged GETs in flight per store (S3)")
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 measure (rclone serve s3)")
    ap.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    args = ap.parse_args()
    size = args.size or (GiB if args.quick else 10 * GiB)
    args.s3_size = args.s3_size or (256 * MiB if args.quick else GiB)
    reps = args.reps or (3 if args.quick else 5)
    s3_reps = 1 if args.quick and not args.reps else min(reps, 3)
    scratch = Path(tempfile.mkdtemp(prefix="babel-verify-", dir=args.dir))
    try:
        t = time.perf_counter()
        src, dst = scratch / "src" / KEY, scratch / "dst" / KEY
        write_copies([src, dst], size)
        log(f"wrote 2 x {size / GiB:.2f} GiB in {time.perf_counter() - t:.1f}s under {scratch}")
        f = measure(
            "file", [src, dst], f"file://{src.parent}", f"file://{dst.parent}", size, reps, args, args.concurrency
        )
        src.unlink()
        dst.unlink()
        s3 = None if args.no_s3 else s3_section(scratch, args, s3_reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def detect(n: int) -> float:
        ranges = sample_ranges(n, seed=KEY, samples=args.samples, sample_size=args.sample_size)
        return detection_probability(n, ranges, args.region)

    sampled = min(size, args.samples * args.sample_size)
    print(
        f"\nBabel verification, cold page cache, medians of {reps}: "
        f"{args.samples} x {args.sample_size / MiB:g} MiB sampled per object"
    )
    print(f"  file:// {size / GiB:.2f} GiB, two copies ({2 * sampled / MiB:.0f} MiB read by the sampled check)")
    print(f"    sampled check_sample  {f['sample'] * 1000:9.1f} ms")
    print(
        f"    full MD5              {f['md5']:9.2f} s   {mbps(size, f['md5']):7.0f} MB/s   {f['md5'] / f['sample']:7.0f}x"
    )
    print(
        f"    full CRC64 (crcmod)   {f['crc64']:9.2f} s   {mbps(size, f['crc64']):7.0f} MB/s   {f['crc64'] / f['sample']:7.0f}x"
    )
    print(f"    detection probability of one random {args.region / MiB:g} MiB corrupted region: {detect(size):.4%}")
    result: dict[str, object] = {
        "speedup_md5": f["md5"] / f["sample"],
        "speedup_crc64": f["crc64"] / f["sample"],
        "file_gib": size / GiB,
        "file_sample_ms": f["sample"] * 1000,
        "file_md5_s": f["md5"],
        "file_crc64_s": f["crc64"],
        "file_detect_pct": 100 * detect(size),
    }
    if s3 is not None:
        n = args.s3_size
        print(f"  s3:// on rclone serve s3, {n / MiB:.0f} MiB object vs a local file, medians of {s3_reps}")
        print(f"    sampled check_sample  {s3['sample'] * 1000:9.1f} ms   (one ranged GET {s3['get_ms']:.1f} ms)")
        print(f"    full MD5 from disk    {s3['md5']:9.2f} s   {s3['md5'] / s3['sample']:7.2f}x")
        print(f"    full CRC64 from disk  {s3['crc64']:9.2f} s   {s3['crc64'] / s3['sample']:7.2f}x")
        print(f"    detection probability: {detect(n):.4%}")
        print(f"    (untimed: rclone's first HEAD, which computes the object's MD5, took {s3['first_head_s']:.1f} s)")
        result |= {
            "s3_mib": n / MiB,
            "s3_sample_ms": s3["sample"] * 1000,
            "s3_get_ms": s3["get_ms"],
            "s3_first_head_s": s3["first_head_s"],
            "s3_md5_s": s3["md5"],
            "s3_crc64_s": s3["crc64"],
            "s3_speedup_md5": s3["md5"] / s3["sample"],
            "s3_speedup_crc64": s3["crc64"] / s3["sample"],
            "s3_detect_pct": 100 * detect(n),
        }
    verdict = "met" if result["speedup_md5"] >= TARGET else "not met"  # type: ignore[operator]
    print(
        f"  target: sampled >= {TARGET:.0f}x faster than MD5 on the 10 GiB file: {verdict} at {size / GiB:.2f} GiB "
        f"(the sampled read is a fixed {2 * sampled / MiB:.0f} MiB, so the ratio grows with the size)"
    )
    print_result(result | {"samples": args.samples, "sample_mib": args.sample_size / MiB, "reps": reps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
