"""``babel sync`` / ``babel verify`` end to end on real stores: file:// and moto's S3 server on loopback.

The destination is always checked with an independent client (boto3, or the file system).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from babel.sync import SyncOptions, run_sync, run_verify
from tests.conftest import stdlib_copy

pytestmark = pytest.mark.s3

_n = iter(range(1_000_000))


@pytest.fixture
def new_bucket(moto_endpoint):
    """A factory of fresh buckets: returns (uri, bucket name)."""

    def make(prefix: str = "data") -> tuple[str, str]:
        bucket = f"sync-{next(_n)}"
        boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        uri = (
            f"s3://{bucket}/{prefix}?endpoint_url={moto_endpoint}"
            if prefix
            else f"s3://{bucket}?endpoint_url={moto_endpoint}"
        )
        return uri, bucket

    return make


@pytest.fixture
def s3(moto_endpoint):
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


def bucket_contents(s3, bucket: str, prefix: str = "data/") -> dict[str, bytes]:
    """Every object under ``prefix`` by key (relative), read with boto3."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) :]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def tree_contents(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and ".babel-" not in p.name
    }


def sync(src: str, dst: str, state: Path, **opts) -> dict:
    report = asyncio.run(run_sync(src, dst, SyncOptions(**opts), state_dir=str(state)))
    return report.to_dict()


def babel(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "babel.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(900)
def test_stdlib_tree_to_s3_and_back_is_identical(tmp_path: Path, rclone_uri: str) -> None:
    """The standard library through ``rclone serve s3`` (moto is too slow for 1,100 files x 5 passes)."""
    from tests.babel.test_sync_regions import contents

    src = stdlib_copy(tmp_path / "stdlib")
    want = tree_contents(src)
    uri = rclone_uri
    report = sync(f"file://{src}", uri, tmp_path / "state", transfers=32)
    assert report["state"] == "ok", report["errors"]
    assert report["copied"] == len(want) and report["failed"] == 0
    assert report["verification"]["metadata"]["checked"] == len(want)
    v = report["verification"]
    assert v["sample"]["checked"] + v["full"]["checked"] == len(want)  # files up to 32 MiB are checked whole
    assert v["full"]["failed"] == v["sample"]["failed"] == 0 and v["full"]["checked"] > 1000
    got = contents(uri)
    assert got.keys() == want.keys()
    assert all(got[k] == want[k] for k in want)

    # a second run copies nothing; a changed file is copied alone
    again = sync(f"file://{src}", uri, tmp_path / "state")
    assert again["copied"] == 0 and again["skipped"] == len(want)
    (src / "json" / "decoder.py").write_bytes(b"changed")
    again = sync(f"file://{src}", uri, tmp_path / "state")
    assert again["copied"] == 1 and contents(uri)["json/decoder.py"] == b"changed"

    # and back to a new directory
    back = tmp_path / "back"
    report = sync(uri, f"file://{back}", tmp_path / "state", verify="full")
    assert report["state"] == "ok", report["errors"]
    assert report["verification"]["full"]["checked"] == len(want)
    assert tree_contents(back) == {**want, "json/decoder.py": b"changed"}


def test_large_file_multipart_s3_to_s3(tmp_path: Path, new_bucket, s3) -> None:
    size = 200 * (1 << 20) + 12345  # not a multiple of the part size
    blob = os.urandom(1 << 20) * 200 + os.urandom(12345)
    src_uri, src_bucket = new_bucket()
    s3.put_object(Bucket=src_bucket, Key="data/big.bin", Body=blob)
    dst_uri, dst_bucket = new_bucket("copy/")
    report = sync(src_uri, dst_uri, tmp_path / "state", verify="full", part_size=16 << 20)
    assert report["state"] == "ok", report
    assert report["copied_bytes"] == size
    head = s3.head_object(Bucket=dst_bucket, Key="copy/big.bin")
    assert head["ContentLength"] == size and head["ETag"].strip('"').endswith("-13")  # multipart, 13 parts
    body = s3.get_object(Bucket=dst_bucket, Key="copy/big.bin")["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(blob).digest()
    assert report["verification"]["full"]["checked"] == 1 and report["verification"]["full"]["failed"] == 0


HARD_KEYS = [
    "plus+sign", "colon:name", "dollar$", "at@host", "hash#tag", "percent%20literal", "question?mark", "with space",
    "trailing space ", "žluťoučký kůň.txt", "日本語/ファイル", "emoji-\U0001f600", "zero\u200bwidth", "bidi\u202eabc",
    "caf\u00e9", "cafe\u0301", "dir/", "dir/a", "dir-1.txt", "deep/a/b/c/d/e/f.txt", "empty",
]  # fmt: skip


def test_keys_that_break_sync_tools(tmp_path: Path, new_bucket, s3) -> None:
    src_uri, src_bucket = new_bucket()
    for key in HARD_KEYS:
        s3.put_object(Bucket=src_bucket, Key=f"data/{key}", Body=b"" if key in ("empty", "dir/") else key.encode() * 7)
    dst_uri, dst_bucket = new_bucket()
    report = sync(src_uri, dst_uri, tmp_path / "state")
    assert report["state"] == "ok", report["errors"]
    got = bucket_contents(s3, dst_bucket)
    assert sorted(got) == sorted(HARD_KEYS)  # NFC café and NFD café stay two keys; dir/ marker kept
    assert got["dir/"] == b"" and got["empty"] == b"" and got["caf\u00e9"] != got["cafe\u0301"]

    # --delete: remove dir-1.txt at the source; dir/ and dir/a must stay, dir-1.txt must go
    s3.delete_object(Bucket=src_bucket, Key="data/dir-1.txt")
    report = sync(src_uri, dst_uri, tmp_path / "state", delete=True)
    assert report["state"] == "ok" and report["deleted"] == 1
    got = bucket_contents(s3, dst_bucket)
    assert "dir-1.txt" not in got and {"dir/", "dir/a"} <= got.keys()

    # to a file system: the directory marker is a directory, every other key a file
    out = tmp_path / "fs"
    report = sync(src_uri, f"file://{out}", tmp_path / "state", delete=True)
    assert report["state"] == "ok", report["errors"]
    files = tree_contents(out)
    assert sorted(files) == sorted(k for k in HARD_KEYS if k not in ("dir/", "dir-1.txt"))


def test_empty_source_and_mass_delete_guard(tmp_path: Path, new_bucket, s3) -> None:
    src_uri, _ = new_bucket("")  # an empty bucket (an empty prefix is refused: a mistyped one lists nothing)
    dst_uri, dst_bucket = new_bucket()
    keys = [f"data/k{i:05d}" for i in range(1200)]
    for key in keys:
        s3.put_object(Bucket=dst_bucket, Key=key, Body=b"x")
    # an empty source copies nothing and, without --delete, deletes nothing
    report = sync(src_uri, dst_uri, tmp_path / "state")
    assert report["state"] == "ok" and report["copied"] == 0 and report["deleted"] == 0
    # --max-delete refuses the whole deletion
    report = sync(src_uri, dst_uri, tmp_path / "state", delete=True, max_delete=1000)
    assert report["state"] == "partial" and report["deleted"] == 0 and report["planned_delete"] == 1200
    assert report["failed"] == 0 and "--max-delete" in report["errors"][0]["error"]  # no object failed
    assert len(bucket_contents(s3, dst_bucket)) == 1200
    # more than 1000 deletions (two DeleteObjects batches) when allowed
    report = sync(src_uri, dst_uri, tmp_path / "state", delete=True)
    assert report["state"] == "ok" and report["deleted"] == 1200
    assert bucket_contents(s3, dst_bucket) == {}


def test_filters_and_dry_run(tmp_path: Path, new_bucket, s3) -> None:
    src = tmp_path / "src"
    for rel in ("a.txt", "b.log", "logs/x.log", "logs/y.txt", "keep/z.txt"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    uri, bucket = new_bucket()
    report = sync(f"file://{src}", uri, tmp_path / "state", dry_run=True)
    assert report["copied"] == 5 and bucket_contents(s3, bucket) == {}
    shown = babel("jobs", env={"BABEL_STATE_DIR": str(tmp_path / "state")}).stdout
    assert "sync (dry run)" in shown  # it looked like a job that had copied 5 objects
    report = sync(f"file://{src}", uri, tmp_path / "state", exclude=("*.log",), include=("*.txt", "logs/**"))
    assert sorted(bucket_contents(s3, bucket)) == ["a.txt", "keep/z.txt", "logs/y.txt"]


def test_corruption_caught_by_full_and_by_sample_when_sampled(tmp_path: Path, new_bucket, s3) -> None:
    from babel.checksum import sample_ranges

    size = 64 << 20
    blob = bytearray(os.urandom(size))
    src_uri, src_bucket = new_bucket()
    s3.put_object(Bucket=src_bucket, Key="data/obj", Body=bytes(blob))
    dst_uri, dst_bucket = new_bucket()
    assert sync(src_uri, dst_uri, tmp_path / "state")["state"] == "ok"

    ranges = sample_ranges(size, seed="obj", samples=8, sample_size=1 << 20)
    inside = ranges[len(ranges) // 2][0] + 100  # a byte inside a sampled range
    outside = next(o for o in range(0, size, 1 << 20) if not any(s <= o < s + n for s, n in ranges)) + 5

    def corrupt_at(offset: int) -> None:
        bad = bytearray(blob)
        bad[offset] ^= 0xFF
        s3.put_object(Bucket=dst_bucket, Key="data/obj", Body=bytes(bad), Metadata=s3.head_object(
            Bucket=dst_bucket, Key="data/obj")["Metadata"])  # fmt: skip

    def verify(mode: str) -> dict:
        return asyncio.run(
            run_verify(src_uri, dst_uri, SyncOptions(verify=mode, samples=8), state_dir=str(tmp_path / "s"))
        ).to_dict()

    corrupt_at(inside)
    for mode in ("sample", "full"):
        report = verify(mode)
        assert report["state"] == "partial"
        assert [f["check"] for f in report["verification"]["failures"]] == [mode]
    corrupt_at(outside)
    assert verify("sample")["state"] == "ok"  # sampling is a pre-check: it missed this byte
    report = verify("full")
    assert report["state"] == "partial" and report["verification"]["failures"][0]["check"] == "full"
    assert report["failed"] == 1  # objects that failed (it read 0 while errors_total said 1)

    # the CLI names the repair, and refuses to "resume" a verify job as a sync (which skipped the
    # damaged object, said ok and overwrote the verify job's failure)
    env = {"BABEL_STATE_DIR": str(tmp_path / "cli")}
    r = babel("verify", src_uri, dst_uri, "--mode", "full", "--no-progress", env=env)
    assert r.returncode == 1 and "babel sync" in r.stderr and "--ignore-times" in r.stderr, r.stderr
    assert "--resume" not in r.stderr
    job = next((tmp_path / "cli").glob("*/job.json")).parent.name
    r = babel("sync", "--resume", job, "--json", "--no-progress", env=env)
    assert r.returncode == 3 and "is a verify job" in r.stderr, r.stderr
    assert json.loads((tmp_path / "cli" / job / "job.json").read_text())["state"] == "partial"


def test_cli_exit_codes_and_clear_errors(tmp_path: Path, moto_endpoint, new_bucket) -> None:
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    r = babel("sync", "nope://x/y", "file:///tmp", env=env)
    assert r.returncode == 3 and "no backend for scheme" in r.stderr and "Traceback" not in r.stderr
    r = babel("sync", f"s3://missing-bucket/p?endpoint_url={moto_endpoint}", f"file://{tmp_path}/o", "--json", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "NoSuchBucket" in json.loads(r.stdout)["fatal"]
    r = babel("sync", "--resume", "no-such-job", env=env)
    assert r.returncode == 3 and "no job 'no-such-job'" in r.stderr and "babel jobs lists them" in r.stderr  # a typo
    r = babel("sync", "file:///only-one", env=env)
    assert r.returncode == 3
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"1")
    uri, _ = new_bucket()
    r = babel("sync", f"file://{src}", uri, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["copied"] == 1
    r = babel("ls", uri, "--summary")
    assert r.returncode == 0 and r.stdout.startswith("1 objects")
    r = babel("jobs", "--json", env=env)
    jobs = json.loads(r.stdout)
    assert r.returncode == 0 and jobs[0]["state"] == "ok" and jobs[0]["src"] == f"file://{src}"


@pytest.mark.parametrize("server", ["none", "silent"])
def test_an_unreachable_endpoint_is_one_fatal_line_within_15_seconds(tmp_path: Path, server: str) -> None:
    """A port nobody listens on, or a server that takes connections and sends nothing (hung, or
    a firewall dropping answers: it took 2.5 minutes of retried requests), is named in one fatal
    line within 15 s."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        if server == "silent":  # listening, never accepting: the kernel completes the handshakes
            sock.listen(16)
        else:
            sock.close()
        t0 = time.monotonic()
        r = babel("sync", f"file://{tmp_path}", f"s3://bkt/p?endpoint_url=http://127.0.0.1:{port}", "--json",
                  "--no-progress", env={"BABEL_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
        took = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr
    want = "sent no answer" if server == "silent" else f"127.0.0.1:{port} unreachable"
    assert want in json.loads(r.stdout)["fatal"] and took < 15, (r.stdout, took)


def _wait_phase(state: Path, phase: str, timeout: float = 60) -> str:
    """Wait until the only job in ``state`` reports ``phase``; return its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in state.glob("*/job.json"):
            try:
                doc = json.loads(job.read_text())
            except json.JSONDecodeError:
                continue
            if doc.get("phase") == phase:
                return doc["id"]
        time.sleep(0.02)
    raise AssertionError(f"job never reached {phase}")


def _start(args: list[str], state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "babel.cli.main", "sync", *args, "--json", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "BABEL_STATE_DIR": str(state)},
    )


def _kill_while_copying(args: list[str], state: Path, after: float = 1.5) -> str:
    """Start ``babel sync ARGS``, SIGKILL it ``after`` seconds into its copying phase; its job id."""
    proc = _start(args, state)
    job = _wait_phase(state, "copying")
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return job


def _landed_parts(s3, bucket: str) -> int:
    """Parts the store holds for the bucket's open multipart uploads."""
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return sum(
        len(s3.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", [])) for u in uploads
    )


@pytest.mark.parametrize("point", ["listing", "copying", "mid-multipart", "verifying"])
def test_kill_9_then_resume_finishes_without_recopying(
    tmp_path: Path, new_bucket, s3, moto_endpoint: str, point: str
) -> None:
    from babel.testing import S3Proxy

    src = tmp_path / "src"
    src.mkdir()
    small = {f"small/{i:03d}.bin": os.urandom(50_000 + i) for i in range(120)}
    for rel, data in small.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    big = os.urandom(48 << 20)
    (src / "big.bin").write_bytes(big)
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    proxy = S3Proxy(moto_endpoint, delay=1.0, ops={"list"}).__enter__()  # a slow listing of the destination
    if point == "listing":
        uri = uri.replace(moto_endpoint, proxy.endpoint)
    args = [f"file://{src}", uri, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "4"]
    if point == "mid-multipart":
        args += ["--bwlimit", "12M", "--include", "big.bin"]
    if point == "verifying":
        args += ["--verify", "full", "--checkers", "1"]
    proc = _start(args, state)
    # objects are verified as they land (a pipelined job): "verifying" kills one mid-copy too
    job = _wait_phase(state, {"mid-multipart": "copying", "verifying": "copying"}.get(point, point))
    if point in ("copying", "verifying"):  # kill once some objects have landed (the machine may be slow)
        deadline = time.monotonic() + 60
        while s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) < 12 and time.monotonic() < deadline:
            time.sleep(0.02)
    elif point == "mid-multipart":  # kill once parts have landed ("copying" begins before the source is listed)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _landed_parts(s3, bucket) < 2:
            time.sleep(0.05)
        time.sleep(0.3)
    else:
        time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    doc = json.loads((state / job / "job.json").read_text())
    assert doc["state"] == "running"  # killed: never finished
    listed = babel("jobs", "--json", env={"BABEL_STATE_DIR": str(state)})
    assert [j["state"] for j in json.loads(listed.stdout)] == ["interrupted"]  # as the table says it

    try:
        r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    finally:
        proxy.__exit__(None, None, None)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    want = {"big.bin": big} if point == "mid-multipart" else {**small, "big.bin": big}
    assert bucket_contents(s3, bucket) == want
    if point == "mid-multipart":
        assert report["parts_reused"] > 0  # the finished parts of the killed upload were not sent again
        assert report["copied"] == 1
        assert report["resent_bytes"] <= 4 * (5 << 20)  # at most --transfers parts were on their way
    elif point == "listing":
        assert report["copied"] == len(want) and report["already_done"] == 0 and report["resent_bytes"] == 0
    else:  # killed before the listing's end: planned again; objects that landed but were not yet
        # journaled are found at the destination, equal, and skipped
        assert report["already_done"] > 0
        assert report["copied"] + report["already_done"] + report["skipped"] == len(want)
        assert report["skipped"] <= 2 * 4  # at most the copies that were on their way (--transfers 4)
        if point == "verifying":  # what the killed run verified counts, the rest is verified now
            assert report["verification"]["full"]["checked"] == report["copied"] + report["already_done"]
            assert report["verification"]["full"]["failed"] == 0
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_s3_to_pcache_and_back(tmp_path: Path, new_bucket, s3, shared_cluster) -> None:
    """A dataset in a bucket goes into PCache (multipart for the large object), then out to another bucket."""
    src_uri, src_bucket = new_bucket()
    want = {f"shards/{i:04d}.bin": os.urandom(30_000 + 997 * i) for i in range(40)}
    want["big/model.safetensors"] = os.urandom(20 << 20) + b"tail"
    want["dir/"] = b""
    for key, data in want.items():
        s3.put_object(Bucket=src_bucket, Key=f"data/{key}", Body=data)
    pc = f"pcache://{shared_cluster.master_address}/{tmp_path.name}/ds"
    report = sync(src_uri, pc, tmp_path / "state", verify="full", multipart_threshold=8 << 20, part_size=5 << 20)
    assert report["state"] == "ok", report["errors"]
    assert report["copied"] == len(want) - 1 and report["skipped"] == 1  # the dir/ marker is a directory there

    from pcache.client import Client

    with Client(master=shared_cluster.master_address) as pcc:
        for key, data in want.items():
            if not key.endswith("/"):
                assert pcc.read_file(f"/{tmp_path.name}/ds/{key}") == data

    assert sync(src_uri, pc, tmp_path / "state")["copied"] == 0  # stored mtimes match: nothing to do
    dst_uri, dst_bucket = new_bucket()
    report = sync(pc, dst_uri, tmp_path / "state", multipart_threshold=8 << 20, part_size=5 << 20)
    assert report["state"] == "ok", report["errors"]
    got = bucket_contents(s3, dst_bucket)
    assert got == {k: v for k, v in want.items() if not k.endswith("/")}


def test_uris_are_taken_literally_and_overlaps_refused(tmp_path: Path, moto_endpoint: str) -> None:
    from babel import open_store
    from babel.errors import BadURI

    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    odd = tmp_path / "hash#dir?q=1 %20"
    report = sync(f"file://{src}", f"file://{odd}", tmp_path / "state")
    assert report["state"] == "ok" and (odd / "f").read_bytes() == b"x"  # not cut at '#' or '?'
    for bad in (f"s3://b/p#frag?endpoint_url={moto_endpoint}", f"s3://b/p?endpoint_urll={moto_endpoint}"):
        with pytest.raises(BadURI):
            open_store(bad)
    with pytest.raises(BadURI, match="overlap"):
        sync(f"file://{src}", f"file://{src}/sub", tmp_path / "state")
    r = babel("sync", "--resume", "JOB", "--dry-run", env={"BABEL_STATE_DIR": str(tmp_path / "state")})
    assert r.returncode == 3 and "--dry-run" in r.stderr


def test_one_store_spelled_two_ways_is_an_overlap_and_never_loses_the_source(
    tmp_path: Path, new_bucket, s3, moto_endpoint: str
) -> None:
    """``--delete`` from ``ov/sub`` into ``ov`` with the endpoint spelled ``127.0.0.1`` on one
    side and ``localhost`` on the other passed the overlap check, and deleted the source."""
    _, bucket = new_bucket("")
    for key in ("ov/a", "ov/sub/c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    other = moto_endpoint.replace("127.0.0.1", "localhost")
    assert other != moto_endpoint
    r = babel("sync", f"s3://{bucket}/ov/sub?endpoint_url={moto_endpoint}", f"s3://{bucket}/ov?endpoint_url={other}",
              "--delete", env={"BABEL_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
    assert r.returncode == 3 and "overlap" in r.stderr, r.stderr
    assert sorted(bucket_contents(s3, bucket, "ov/")) == ["a", "sub/c"]


def test_a_source_prefix_with_no_object_is_refused_not_synced_as_empty(
    tmp_path: Path, new_bucket, s3, moto_endpoint: str
) -> None:
    """A mistyped prefix listed nothing, the job was "ok", and ``--delete`` emptied the
    destination; an object's key given as the source copied nothing, exit 0."""
    uri, bucket = new_bucket("ds")
    s3.put_object(Bucket=bucket, Key="ds/shard-1.bin", Body=b"1")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep").write_bytes(b"k")
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    typo = f"s3://{bucket}/ds-typo?endpoint_url={moto_endpoint}"
    r = babel("sync", typo, f"file://{tmp_path}/dst", "--delete", env=env)
    assert r.returncode == 2 and "NoSuchKey" in r.stderr and "no object under the prefix 'ds-typo/'" in r.stderr, r
    assert (tmp_path / "dst" / "keep").read_bytes() == b"k"
    one = f"s3://{bucket}/ds/shard-1.bin?endpoint_url={moto_endpoint}"
    r = babel("sync", one, f"file://{tmp_path}/dst", env=env)
    assert r.returncode == 2 and "'ds/shard-1.bin' is an object, not a prefix" in r.stderr, r.stderr
    assert "--include '/shard-1.bin'" in r.stderr
    r = babel("sync", uri, f"file://{tmp_path}/dst", "--include", "/shard-1.bin", env=env)
    assert r.returncode == 0 and (tmp_path / "dst" / "shard-1.bin").read_bytes() == b"1", r.stderr
    empty_uri, _ = new_bucket("")
    assert sync(empty_uri, f"file://{tmp_path}/empty", tmp_path / "state")["state"] == "ok"  # an empty bucket is


def test_a_small_object_rewritten_since_it_was_listed_fails_at_once_as_changed(tmp_path: Path) -> None:
    """The listing said 10 bytes, the GET returned 12: the source was rewritten. It was a
    ChecksumMismatch, retried with backoff (every try reads the same new bytes) and named
    "source returned 12 bytes, listed 10"; it is SourceChanged at once, nothing published."""
    from babel import open_store
    from babel.transfer import SourceChanged, Transferer

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.txt").write_bytes(b"0123456789")

    async def go() -> None:
        src, dst = open_store(f"file://{tmp_path}/src/"), open_store(f"file://{tmp_path}/dst")
        listed = await src.head("f.txt")
        (tmp_path / "src" / "f.txt").write_bytes(b"0123456789ab")
        xfer = Transferer(src, dst)
        started = time.monotonic()
        with pytest.raises(SourceChanged, match="10 bytes listed, 12 read") as info:
            await xfer.copy(listed)
        assert time.monotonic() - started < 1 and xfer.stats.retries == 0
        assert f"file://{tmp_path}/src/f.txt" in str(info.value)  # one slash between store and key
        assert not (tmp_path / "dst" / "f.txt").exists()

    asyncio.run(go())


def test_resume_after_the_source_changed_publishes_nothing_mixed(tmp_path: Path, new_bucket, s3) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(40 << 20))
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    args = [f"file://{src}", uri, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "2"]
    job = _kill_while_copying([*args, "--bwlimit", "10M"], state)
    new = os.urandom(40 << 20)
    (src / "big.bin").write_bytes(new)  # same size, new bytes and mtime
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["failed"] == 1 and "changed while it was copied" in report["errors"][0]["error"]
    assert bucket_contents(s3, bucket) == {}  # nothing mixed was published
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    again = sync(f"file://{src}", uri, tmp_path / "state2")
    assert again["state"] == "ok" and bucket_contents(s3, bucket) == {"big.bin": new}


def test_resuming_a_running_job_and_a_file_destination_are_one_line_each(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(8 << 20))
    state = tmp_path / "state"
    proc = _start([f"file://{src}", f"file://{tmp_path}/dst", "--bwlimit", "1M"], state)
    try:
        job = _wait_phase(state, "copying")
        r = babel("sync", "--resume", job, "--no-progress", env={"BABEL_STATE_DIR": str(state)})
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert f"job {job} is running (pid {proc.pid})" in r.stderr
    finally:
        proc.kill()
        proc.wait()
    (tmp_path / "afile").write_bytes(b"x")
    r = babel("sync", f"file://{src}", f"file://{tmp_path}/afile", "--json", "--no-progress",
              env={"BABEL_STATE_DIR": str(tmp_path / "state2")})  # fmt: skip
    report = json.loads(r.stdout)
    assert r.returncode == 2 and "the destination is a file" in report["fatal"] and report["errors"] == []
    under = babel("sync", f"file://{src}", f"file://{tmp_path}/afile/sub", "--no-progress",
                  env={"BABEL_STATE_DIR": str(tmp_path / "state2")})  # fmt: skip
    assert under.returncode == 2 and "(above the destination) is a file" in under.stderr
    assert len(under.stderr.strip().splitlines()) == 1  # one fatal line, not a report
    assert (tmp_path / "afile").read_bytes() == b"x"


def test_ctrl_c_prints_the_resume_command(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(body := os.urandom(6 << 20))
    state = tmp_path / "state"
    proc = _start([f"file://{src}", f"file://{tmp_path}/dst", "--bwlimit", "2M"], state)
    job = _wait_phase(state, "copying")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and f"resume with: babel sync --resume {job}" in err.decode(), err
    assert json.loads((state / job / "job.json").read_text())["state"] == "interrupted"
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "ok"
    assert (tmp_path / "dst" / "a.bin").read_bytes() == body


def test_ignore_times_repairs_what_verify_found_corrupt(tmp_path: Path, new_bucket, s3) -> None:
    """An object damaged at the destination keeps its size and stored mtime, so a plain sync
    skips it; ``babel verify --mode full`` finds it and ``--ignore-times`` copies it again."""
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}.bin": os.urandom(2000 + i) for i in range(5)}
    for name, body in files.items():
        (src / name).write_bytes(body)
    uri, bucket = new_bucket()
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    assert babel("sync", f"file://{src}", uri, "--no-progress", env=env).returncode == 0
    head = s3.head_object(Bucket=bucket, Key="data/f2.bin")
    bad = bytes(b ^ 0xFF for b in files["f2.bin"][:10]) + files["f2.bin"][10:]
    s3.put_object(Bucket=bucket, Key="data/f2.bin", Body=bad, Metadata=head["Metadata"])  # same size and mtime
    found = babel("verify", f"file://{src}", uri, "--mode", "full", "--json", env=env)
    assert found.returncode == 1 and "f2.bin" in found.stdout
    plain = json.loads(babel("sync", f"file://{src}", uri, "--json", "--no-progress", env=env).stdout)
    assert plain["copied"] == 0  # size and mtime match: skipped
    fixed = json.loads(babel("sync", f"file://{src}", uri, "--ignore-times", "--json", "--no-progress", env=env).stdout)
    assert fixed["state"] == "ok" and fixed["copied"] == len(files)
    assert bucket_contents(s3, bucket) == files
    assert babel("verify", f"file://{src}", uri, "--mode", "full", env=env).returncode == 0
    # the default (sample) mode reads objects no bigger than the sample whole: counted under full,
    # as a sync counts them (a newcomer's drill found verify saying "sample")
    sampled = json.loads(babel("verify", f"file://{src}", uri, "--json", env=env).stdout)["verification"]
    assert (sampled["full"]["checked"], sampled["sample"]["checked"]) == (len(files), 0), sampled
    both = babel("sync", f"file://{src}", uri, "--ignore-times", "--size-only", env=env)
    assert both.returncode == 3 and "cannot be combined with size_only" in both.stderr


def test_more_errors_than_the_report_lists_are_counted(tmp_path: Path, new_bucket, s3) -> None:
    uri, bucket = new_bucket()
    for i in range(60):  # markers with a body: each fails by name on a file system
        s3.put_object(Bucket=bucket, Key=f"data/m{i:02d}/", Body=b"body")
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    r = babel("sync", uri, f"file://{tmp_path}/out", "--json", "--no-progress", env=env)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["failed"] == report["errors_total"] == 60
    assert len(report["errors"]) == 50 and report["errors_not_listed"] == 10
    text = babel("sync", uri, f"file://{tmp_path}/out2", "--no-progress", env=env)
    assert "60 errors in all; --json lists the first 50 (10 not listed)" in " ".join(text.stderr.split())


def test_symlinks_and_fifos_in_the_source_are_counted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "real.txt").write_bytes(b"real")
    (src / "link.txt").symlink_to(src / "d" / "real.txt")
    (src / "dirlink").symlink_to(src / "d")
    os.mkfifo(src / "d" / "pipe")
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    r = babel("sync", f"file://{src}", f"file://{tmp_path}/out", "--json", "--no-progress", env=env)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["copied"] == 1 and report["not_files"] == {"fifo": 1, "symlink": 2}
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["d", "real.txt"]
    text = babel("sync", f"file://{src}", f"file://{tmp_path}/out2", "--no-progress", env=env)
    assert "1 fifo, 2 symlinks in the source: not copied" in " ".join(text.stderr.split())


def test_dry_run_prints_each_key_it_would_copy_or_delete(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for name in ("a.txt", "b.txt", "same.txt"):
        (src / name).write_bytes(name.encode())
    (dst / "same.txt").write_bytes(b"same.txt")
    os.utime(dst / "same.txt", ns=(os.stat(src / "same.txt").st_mtime_ns,) * 2)
    (dst / "b.txt").write_bytes(b"old, longer")
    (dst / "extra.txt").write_bytes(b"x")
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    r = babel("sync", f"file://{src}", f"file://{dst}", "--dry-run", "--delete", "--no-progress", env=env)
    assert r.returncode == 0, r.stderr
    lines = [" ".join(line.split()) for line in r.stdout.splitlines()]
    assert lines == ["would copy a.txt (new)", "would copy b.txt (size)", "would delete extra.txt (extraneous)"]
    as_json = babel("sync", f"file://{src}", f"file://{dst}", "--dry-run", "--delete", "--json", env=env)
    assert json.loads(as_json.stdout)["plan"] == [
        {"action": "copy", "key": "a.txt", "reason": "new"},
        {"action": "copy", "key": "b.txt", "reason": "size"},
        {"action": "delete", "key": "extra.txt", "reason": "extraneous"},
    ]
    assert sorted(p.name for p in dst.iterdir()) == ["b.txt", "extra.txt", "same.txt"]  # nothing changed


def test_clean_aborts_uploads_and_deletes_temp_files_of_abandoned_jobs(tmp_path: Path, new_bucket, s3) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(20 << 20))
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    env = {"BABEL_STATE_DIR": str(state)}
    killed = []
    for dst in (uri, f"file://{tmp_path}/out"):
        proc = _start([f"file://{src}", dst, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "2",
                       "--bwlimit", "5M"], state)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(list(state.glob("*/job.json"))) <= len(killed) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed.append(proc)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [p for p in (tmp_path / "out").rglob(".*") if ".babel-" in p.name]  # the killed upload's file
    # a put the killed file:// job had on its way (its journal says so), and another job's temp file
    from babel.journal import Journal

    file_job = next(
        p.parent.name for p in state.glob("*/job.json") if json.loads(p.read_text())["dst"].endswith("/out")
    )
    journal = Journal(str(state), file_job)
    journal.put("i", "small.bin", 4)
    journal.close()
    (tmp_path / "out" / ".small.bin.babel-0123456789abcdef").write_bytes(b"half")
    (tmp_path / "out" / ".theirs.bin.babel-fedcba9876543210").write_bytes(b"not ours")
    before = {p.parent.name for p in state.glob("*/job.json")}
    running = _start([f"file://{src}", f"file://{tmp_path}/out3", "--bwlimit", "1M"], state)
    try:
        deadline = time.monotonic() + 60
        while not (fresh := {p.parent.name for p in state.glob("*/job.json")} - before):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (job,) = fresh
        refused = babel("clean", job, env=env)
        assert refused.returncode == 1 and f"running (pid {running.pid})" in refused.stderr
        dry = babel("clean", "--all", "--dry-run", env=env)
        assert dry.returncode == 0 and dry.stdout.count("would clean") == 2
        r = babel("clean", "--all", "--json", env=env)
        done = json.loads(r.stdout)
        assert r.returncode == 0 and len(done) == 2, r.stderr
        assert sum(d["uploads_aborted"] for d in done) == 2 and sum(d["temp_files"] for d in done) == 1
    finally:
        running.kill()
        running.wait()
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert [p.name for p in (tmp_path / "out").rglob(".*") if ".babel-" in p.name] == [
        ".theirs.bin.babel-fedcba9876543210"  # another job's: never touched
    ]
    assert [j["id"] for j in json.loads(babel("jobs", "--json", env=env).stdout)] == [job]


def test_a_killed_upload_into_pcache_leaves_no_temporary_file_after_clean_or_resume(
    tmp_path: Path, shared_cluster
) -> None:
    """A ``pcache://`` upload lives in its process (a hidden ``.NAME.babel-TOKEN``): killed between
    two parts, nothing in the journal named it, and neither ``babel clean`` nor the resume that
    finished the job removed it (a 0-byte file left in a checkpoint directory)."""
    from pcache.client import Client

    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(big := os.urandom(24 << 20))
    dir_ = f"/{tmp_path.name}/killed"
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    with Client(master=shared_cluster.master_address) as pc:

        def temp_files(d: str) -> list[str]:
            return [e.name for e in pc.listdir(d) if ".babel-" in e.name] if pc.exists(d) else []

        for n, finish in enumerate(("clean", "resume")):
            dst = f"pcache://{shared_cluster.master_address}{dir_}{n}"
            job = _kill_while_copying([f"file://{src}", dst, "--part-size", "4M", "--multipart-threshold", "8M",
                                       "--transfers", "1", "--bwlimit", "4M"], tmp_path / "state", after=2.5)  # fmt: skip
            assert temp_files(f"{dir_}{n}"), "the killed upload's temporary file"
            if finish == "clean":
                r = babel("clean", job, env=env)
                assert r.returncode == 0 and "1 upload aborted" in r.stdout, (r.stdout, r.stderr)
            else:
                r = babel("sync", "--resume", job, "--json", "--no-progress", env=env)
                assert r.returncode == 0, r.stderr
                assert pc.read_file(f"{dir_}{n}/big.bin") == big
            assert temp_files(f"{dir_}{n}") == []


def test_a_pcache_destination_that_is_a_file_is_one_fatal_line(tmp_path: Path, shared_cluster) -> None:
    """Each object failed NotADirectory on its own (partial, exit 1); file:// said it in one line."""
    from pcache.client import Client

    (tmp_path / "src" / "d").mkdir(parents=True)
    for name in ("a", "b", "d/c"):
        (tmp_path / "src" / name).write_bytes(b"x")
    with Client(master=shared_cluster.master_address) as pc:
        pc.write_file(f"/{tmp_path.name}-file", b"a file")
    env = {"BABEL_STATE_DIR": str(tmp_path / "state")}
    for dst, words in ((f"/{tmp_path.name}-file", "the destination is a file"),
                       (f"/{tmp_path.name}-file/under", f"/{tmp_path.name}-file (above the destination) is a file")):  # fmt: skip
        r = babel("sync", f"file://{tmp_path}/src", f"pcache://{shared_cluster.master_address}{dst}", env=env)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_resumed_job_says_how_many_bytes_it_sent_again(tmp_path: Path, new_bucket, s3, moto_endpoint) -> None:
    """Parts on their way when the job was killed are sent again by the resume: the report says
    how many bytes (here every part is slow to land, so the kill finds some in flight)."""
    from babel.testing import S3Proxy

    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(big := os.urandom(30 << 20))
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    with S3Proxy(moto_endpoint, delay=1.5, ops={"PUT"}) as proxy:
        slow = uri.replace(moto_endpoint, proxy.endpoint)
        proc = _start([f"file://{src}", slow, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "2"],
                      state)  # fmt: skip
        job = _wait_phase(state, "copying")
        time.sleep(2.5)  # the first parts landed, the next are on their way
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["state"] == "ok", report["errors"]
    assert report["resent_bytes"] in (5 << 20, 10 << 20)  # the 2 (--transfers) parts in flight, or 1
    assert bucket_contents(s3, bucket) == {"big.bin": big}
    text = babel("jobs", "--json", env={"BABEL_STATE_DIR": str(state)})
    assert json.loads(text.stdout)[0]["summary"]["resent_bytes"] == report["resent_bytes"]


def test_a_resume_whose_upload_the_store_dropped_starts_it_over(tmp_path: Path) -> None:
    """The unfinished multipart upload of a killed job vanished from the store meanwhile (an S3
    lifecycle rule, an abort by someone else): the resume starts that upload over, once."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(body := os.urandom(20 << 20))
    state = tmp_path / "state"
    args = [f"file://{src}", f"file://{tmp_path}/out", "--part-size", "5M", "--multipart-threshold", "8M"]
    job = _kill_while_copying([*args, "--transfers", "2", "--bwlimit", "5M"], state)
    (upload,) = [p for p in (tmp_path / "out").glob(".*") if ".babel-" in p.name]
    upload.unlink()  # the store forgot it
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["state"] == "ok" and report["parts_reused"] == 0, report["errors"]
    assert (tmp_path / "out" / "big.bin").read_bytes() == body


def _killed_with_an_open_upload(
    tmp_path: Path, new_bucket, s3, big: str, small: dict[str, int], bwlimit: str
) -> tuple[Path, str, Path, str]:
    """A tree of one 20 MiB object ``big`` and ``small`` ones (name: bytes) synced to a new bucket
    at ``bwlimit`` and SIGKILLed while copying, with ``big``'s multipart upload open; returns
    (source dir, bucket, state dir, job id)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / big).write_bytes(os.urandom(20 << 20))
    for name, size in small.items():
        (src / name).write_bytes(os.urandom(size))
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    args = [f"file://{src}", uri, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "2"]
    job = _kill_while_copying([*args, "--bwlimit", bwlimit], state)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])  # the killed run's upload is open
    return src, bucket, state, job


def test_resume_after_source_deletions_notices_them(tmp_path: Path, new_bucket, s3) -> None:
    """Replayed from users: source objects deleted between a crash and the resume are noticed
    (``vanished``, not ``NoSuchKey`` failures), and the multipart upload the killed run left
    open for one of them is aborted."""
    src, bucket, state, job = _killed_with_an_open_upload(
        tmp_path, new_bucket, s3, "big.bin", {f"z{i:02d}.bin": 50_000 for i in range(20)}, "5M"
    )
    gone = ["big.bin", *(f"z{i:02d}.bin" for i in range(0, 20, 2))]
    for name in gone:
        (src / name).unlink()
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["state"] == "ok", report["errors"]
    have = bucket_contents(s3, bucket)
    assert report["failed"] == 0 and report["vanished"] == len([g for g in gone if g not in have]) >= 1
    assert "big.bin" not in have
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert set(bucket_contents(s3, bucket)) >= {f"z{i:02d}.bin" for i in range(1, 20, 2)}


def test_resume_of_a_run_killed_before_its_plan_was_complete_aborts_uploads_of_deleted_sources(
    tmp_path: Path, new_bucket, s3
) -> None:
    """Replayed from a user: a run killed while it still listed and planned (many small objects
    behind a large one) left the large one's multipart upload open; deleted at the source before
    the resume, it was not listed again, so nothing aborted its upload, and the resumed job said
    ``ok`` with ``vanished: 0`` (an upload billed for ever; ``babel clean --all`` skips ok jobs)."""
    src, bucket, state, job = _killed_with_an_open_upload(
        tmp_path, new_bucket, s3, "a-big.bin", {f"z{i:03d}.bin": 4000 for i in range(600)}, "2M"
    )
    from babel.journal import Journal

    journal = Journal(str(state), job)
    try:
        assert journal.get("m", "planned") is None  # killed before its plan was complete
    finally:
        journal.close()
    (src / "a-big.bin").unlink()
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["state"] == "ok", report["errors"]
    assert report["vanished"] == 1 and report["failed"] == 0
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert set(bucket_contents(s3, bucket)) == {f"z{i:03d}.bin" for i in range(600)}


def test_resume_after_a_rewrite_with_the_same_size_and_mtime_mixes_nothing(tmp_path: Path, new_bucket, s3) -> None:
    """Replayed from users: the source rewritten between the crash and the resume with its size
    and mtime kept (``cp -p``, ``rsync -t``, a restored backup). The finished parts are checked
    against the source again (their CRC32Cs): the upload starts over and the new bytes are
    published whole, proven by a full verification."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(20 << 20))
    stamp = (src / "big.bin").stat().st_mtime_ns
    uri, bucket = new_bucket()
    state = tmp_path / "state"
    args = [f"file://{src}", uri, "--part-size", "5M", "--multipart-threshold", "8M", "--transfers", "2"]
    job = _kill_while_copying([*args, "--bwlimit", "5M", "--verify", "full"], state)
    new = os.urandom(20 << 20)
    (src / "big.bin").write_bytes(new)
    os.utime(src / "big.bin", ns=(stamp, stamp))  # same size, same mtime, new bytes
    r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["state"] == "ok", report["errors"]
    assert report["parts_reused"] == 0 and report["verification"]["full"]["failed"] == 0
    assert bucket_contents(s3, bucket) == {"big.bin": new}
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_copies_start_while_the_source_is_listed_and_random_kills_lose_nothing(
    tmp_path: Path, new_bucket, s3, moto_endpoint: str
) -> None:
    """Pipelined phases: with every source list request taking 2 s, the first object lands
    well before the listing's last answer; a pipelined job SIGKILLed at three random moments and
    resumed each time ends with every object, byte for byte, and no temporary file left."""
    import random
    import threading

    from babel.testing import S3Proxy

    uri, bucket = new_bucket()
    want = {f"{random.Random(i).getrandbits(64):016x}.bin": os.urandom(2000 + i) for i in range(1500)}
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=bucket, Key=f"data/{item[0]}", Body=item[1]), want.items()))
    with S3Proxy(moto_endpoint, delay=2.0, ops={"list"}) as proxy:
        slow = uri.replace(moto_endpoint, proxy.endpoint)
        dst = tmp_path / "dst"
        first: list[float] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set() and not first:
                if dst.is_dir() and any(dst.iterdir()):
                    first.append(time.monotonic())
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            report = sync(slow, f"file://{dst}", tmp_path / "st", transfers=8)
        finally:
            stop.set()
            watcher.join()
        listed_at = proxy.stats().last_answer["list"]
        assert report["state"] == "ok", report["errors"]
        assert tree_contents(dst) == want
        assert first and first[0] < listed_at - 0.5, (first, listed_at)  # copying overlapped the listing

        dst2, state = tmp_path / "dst2", tmp_path / "st2"
        rng = random.Random(11)
        job = None
        for _ in range(3):
            args = ["--resume", job] if job else [slow, f"file://{dst2}", "--transfers", "8"]
            proc = subprocess.Popen(
                [sys.executable, "-m", "babel.cli.main", "sync", *args, "--json", "--no-progress"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "BABEL_STATE_DIR": str(state)},
            )  # fmt: skip
            time.sleep(rng.uniform(1.0, 4.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            job = job or next(state.glob("*/job.json")).parent.name
        r = babel("sync", "--resume", job, "--json", "--no-progress", env={"BABEL_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    resumed = json.loads(r.stdout)
    assert resumed["state"] == "ok" and resumed["failed"] == 0
    assert tree_contents(dst2) == want
    assert not [p for p in dst2.rglob("*") if ".babel-" in p.name]  # no temporary file left behind
