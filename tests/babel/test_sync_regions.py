"""Sync between two independent S3 implementations (moto and rclone ``serve s3``) as two regions,
an OSS emulator, and a flaky, throttling link; every destination is checked with boto3."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import boto3
import pytest

from babel.sync import SyncOptions, run_sync
from tests.babel.test_sync import HARD_KEYS

pytestmark = pytest.mark.s3

MiB = 1 << 20


def client_for(uri: str):
    endpoint = parse_qs(urlparse(uri).query)["endpoint_url"][0]
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def contents(uri: str) -> dict[str, bytes]:
    """Every object under the URI's prefix, read with boto3 straight from the server."""
    parsed = urlparse(uri)
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/") + "/"
    s3 = client_for(uri)
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            assert len(body) == obj["Size"]
            out[obj["Key"][len(prefix) :]] = body
    return out


def sync(src: str, dst: str, state: Path, **opts) -> dict:
    return asyncio.run(run_sync(src, dst, SyncOptions(**opts), state_dir=str(state))).to_dict()


def real_tree(root: Path) -> dict[str, bytes]:
    """A few stdlib packages (real files, ~300) under ``root``; returns their bytes by key."""
    import shutil
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    for pkg in ("json", "email", "asyncio", "http", "urllib"):
        shutil.copytree(lib / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_moto_to_rclone_and_back(tmp_path: Path, s3_uri: str, rclone_uri: str) -> None:
    want = real_tree(tmp_path / "tree")
    safe = [k for k in HARD_KEYS if not k.endswith("/")]  # rclone stores keys as files: no dir/ markers
    want.update({f"odd/{k}": k.encode() * 3 for k in safe})
    seed = sync(f"file://{tmp_path}/tree", s3_uri, tmp_path / "st")
    assert seed["state"] == "ok", seed["errors"]
    s3 = client_for(s3_uri)
    bucket = urlparse(s3_uri).netloc
    for k in safe:
        s3.put_object(Bucket=bucket, Key=f"data/odd/{k}", Body=k.encode() * 3)

    report = sync(s3_uri, rclone_uri, tmp_path / "st", verify="full")  # region A -> region B
    assert report["state"] == "ok", report["errors"]
    assert contents(rclone_uri) == want
    assert sync(s3_uri, rclone_uri, tmp_path / "st")["copied"] == 0  # nothing changed: nothing copied

    back = s3_uri.replace("/data?", "/back?")
    report = sync(rclone_uri, back, tmp_path / "st", verify="sample")  # region B -> region A
    assert report["state"] == "ok", report["errors"]
    assert contents(back) == want


@pytest.mark.slow
def test_one_gib_file_through_rclone(tmp_path: Path, rclone_uri: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    digest = hashlib.sha256()
    with open(src / "model.bin", "wb") as fh:
        for i in range(1024):
            block = os.urandom(MiB) if i % 64 == 0 else bytes([i % 251]) * MiB
            digest.update(block)
            fh.write(block)
    report = sync(f"file://{src}", rclone_uri, tmp_path / "st", verify="sample", transfers=8)
    assert report["state"] == "ok", report["errors"]
    assert report["copied_bytes"] == 1 << 30
    parsed = urlparse(rclone_uri)
    s3 = client_for(rclone_uri)
    head = s3.head_object(Bucket=parsed.netloc, Key="data/model.bin")
    assert head["ContentLength"] == 1 << 30
    body = s3.get_object(Bucket=parsed.netloc, Key="data/model.bin")["Body"]
    got = hashlib.sha256()
    for chunk in iter(lambda: body.read(8 * MiB), b""):
        got.update(chunk)
    assert got.hexdigest() == digest.hexdigest()

    out = tmp_path / "out"
    report = sync(rclone_uri, f"file://{out}", tmp_path / "st", verify="full", transfers=8)
    assert report["state"] == "ok" and report["verification"]["full"]["failed"] == 0
    with open(out / "model.bin", "rb") as fh:
        back = hashlib.sha256()
        for chunk in iter(lambda: fh.read(8 * MiB), b""):
            back.update(chunk)
    assert back.hexdigest() == digest.hexdigest()


def test_oss_crc64_checked_per_part_and_object(tmp_path: Path, oss_uri: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {"small.txt": b"hello oss", "big.bin": os.urandom(21 * MiB + 7)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    report = sync(f"file://{src}", oss_uri, tmp_path / "st", multipart_threshold=8 * MiB, part_size=5 * MiB)
    assert report["state"] == "ok", report["errors"]
    runtime = report["verification"]["runtime"]
    assert runtime["store_checksum_compared"] == runtime["crc32c_in_stream"] == 2
    assert contents(oss_uri.replace("oss://", "s3://")) == files


def test_throttling_and_flaky_link_are_survived(tmp_path: Path, moto_endpoint: str, s3_uri: str) -> None:
    from babel.testing import S3Proxy

    want = real_tree(tmp_path / "tree")
    (tmp_path / "tree" / "big.bin").write_bytes(big := os.urandom(12 * MiB))
    want["big.bin"] = big
    with S3Proxy(moto_endpoint, throttle_rate=0.15, fail_rate=0.05, delay=0.002, seed=7) as proxy:
        flaky = s3_uri.replace(moto_endpoint, proxy.endpoint)
        report = sync(
            f"file://{tmp_path}/tree", flaky, tmp_path / "st", verify="full", multipart_threshold=8 * MiB,
            part_size=5 * MiB,
        )  # fmt: skip
        stats = proxy.stats()
    assert report["state"] == "ok", report["errors"]
    assert stats.throttled > 0 and stats.failed > 0
    assert report["retries"] > 0
    assert contents(s3_uri) == want  # straight from moto, not through the proxy


@pytest.mark.parametrize("rate", [0.05, 0.3])
def test_429_too_many_requests_is_retried_in_every_phase(tmp_path: Path, moto_endpoint: str, s3_uri: str, rate) -> None:
    """Replayed from users of other S3 tools: stores and gateways that throttle with ``429
    TooManyRequests`` instead of ``503 SlowDown``. Every phase retries it with backoff (5 %:
    nothing may fail; 30 %: the job must not turn fatal), and the copy is right."""
    from babel.testing import S3Proxy

    src = tmp_path / "tree"
    want = {f"d{i % 4}/f{i:03d}.bin": os.urandom(100 + i) for i in range(60)}
    for key, body in want.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(body)
    with S3Proxy(moto_endpoint, throttle_rate=rate, throttle_status=429, seed=3) as proxy:
        flaky = s3_uri.replace(moto_endpoint, proxy.endpoint)
        report = sync(f"file://{src}", flaky, tmp_path / "st", verify="full", transfers=8)
        stats = proxy.stats()
    assert stats.throttled > 0
    assert report["state"] == "ok", report["errors"]
    assert report["retries"] > 0
    assert contents(s3_uri) == want


def test_throttled_verification_is_not_a_mismatch(tmp_path: Path, moto_endpoint: str, s3_uri: str) -> None:
    """A HEAD answered 503 SlowDown while verifying is retried: a verification failure means
    the bytes differ, never that the store was busy."""
    from babel.testing import S3Proxy

    src = tmp_path / "tree"
    src.mkdir()
    want = {f"f{i:02d}.bin": os.urandom(300 + i) for i in range(40)}
    for key, body in want.items():
        (src / key).write_bytes(body)
    assert sync(f"file://{src}", s3_uri, tmp_path / "st")["state"] == "ok"
    with S3Proxy(moto_endpoint, throttle_rate=0.6, ops={"HEAD"}, seed=5) as proxy:
        flaky = s3_uri.replace(moto_endpoint, proxy.endpoint)
        report = sync(f"file://{src}", flaky, tmp_path / "st2", verify="full")
        stats = proxy.stats()
    assert stats.throttled > 0
    assert report["state"] == "ok", report["errors"]


def test_directory_markers_to_stores_whose_keys_are_paths(tmp_path: Path, s3_uri: str, rclone_uri: str) -> None:
    """Replayed from users: zero-byte ``dir/`` markers next to files synced to ``rclone serve s3``
    (keys are files there) are skipped, never fatal and never costing the files; a marker with a
    body cannot be stored on a file system or such a store and fails by name, on every run."""
    s3 = client_for(s3_uri)
    bucket = urlparse(s3_uri).netloc
    objects = {"m/": b"", "m/inner/": b"", "m/inner/file.txt": b"file", "withbody/": b"eighteen bytes !!!"}
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=f"data/{key}", Body=body)
    report = sync(s3_uri, rclone_uri, tmp_path / "st")
    assert report["state"] == "partial" and report["copied"] == 1 and report["skipped"] == 2
    assert [e["key"] for e in report["errors"]] == ["withbody/"]
    assert "18 bytes of content" in report["errors"][0]["error"]
    assert contents(rclone_uri) == {"m/inner/file.txt": b"file"}
    again = sync(s3_uri, rclone_uri, tmp_path / "st")  # the next run says so too
    assert again["state"] == "partial" and [e["key"] for e in again["errors"]] == ["withbody/"]
    # the same server without provider=rclone: a probe finds that its keys are paths (before: the
    # marker became a file `m`, and `m/inner/file.txt` failed after 10 tries, 115 s in all)
    plain = rclone_uri.replace("&provider=rclone", "").replace("/data?", "/plain?")
    started = time.monotonic()
    report = sync(s3_uri, plain, tmp_path / "st3")
    assert time.monotonic() - started < 30
    assert report["copied"] == 1 and report["skipped"] == 2 and [e["key"] for e in report["errors"]] == ["withbody/"]
    assert contents(plain) == {"m/inner/file.txt": b"file"}  # the probe left nothing behind
    again = sync(s3_uri, plain, tmp_path / "st4")
    assert again["copied"] == 0 and again["skipped"] == 3 and [e["key"] for e in again["errors"]] == ["withbody/"]
    local = sync(s3_uri, f"file://{tmp_path}/out", tmp_path / "st2")
    assert local["state"] == "partial" and [e["key"] for e in local["errors"]] == ["withbody/"]
    assert (tmp_path / "out" / "m" / "inner" / "file.txt").read_bytes() == b"file"


def test_keys_a_path_keyed_store_cannot_hold_fail_at_once_by_name(tmp_path: Path, s3_uri: str, rclone_uri: str) -> None:
    """Replayed from a user: ``both`` and ``both/child.txt`` (a key that is a file and a prefix),
    and a 904-character key, synced to ``rclone serve s3``: each was answered 500 InternalError
    and retried as transient, 120 retries and 51 s, then ``both/child.txt`` failed verification
    with NoSuchKey. A destination that keeps keys as file paths cannot hold them: each fails at
    once, by name and cause, and the rest is copied."""
    s3 = client_for(s3_uri)
    bucket = urlparse(s3_uri).netloc
    long = "L" * 904
    objects = {"both": b"file", "both/child.txt": b"child", long: b"long", "ok/x": b"x", "tab\tin.txt": b"t",
               "x/../y": b"dots"}  # fmt: skip
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=f"data/{key}", Body=body)
    # a dry run plans what the run does (it planned a copy of x/../y, which the run failed)
    r = subprocess.run([sys.executable, "-m", "babel.cli.main", "sync", s3_uri, rclone_uri, "--dry-run", "--json",
                        "--state-dir", str(tmp_path / "dry")], capture_output=True, text=True, timeout=120)  # fmt: skip
    plan = {step["key"]: step["action"] for step in json.loads(r.stdout)["plan"]}
    assert plan["x/../y"] == plan["tab\tin.txt"] == plan[long] == "fail" and plan["ok/x"] == "copy", plan
    started = time.monotonic()
    report = sync(s3_uri, rclone_uri, tmp_path / "st")
    assert time.monotonic() - started < 20
    assert report["state"] == "partial" and report["retries"] == 0
    errors = {e["key"]: e["error"] for e in report["errors"]}
    assert set(errors) == {"both/child.txt", long, "tab\tin.txt", "x/../y"}
    assert "'both' is a file of this job" in errors["both/child.txt"] and "904 bytes" in errors[long]
    assert "control character ('\\t')" in errors["tab\tin.txt"] and "cannot be a file path" in errors["x/../y"]
    assert contents(rclone_uri) == {"both": b"file", "ok/x": b"x"}
    # the next run skips `both` (copied): it is a file of the job all the same (before: 60
    # retries of a 500 InternalError, 51 s, "TransientError" for `both/child.txt`)
    started = time.monotonic()
    again = sync(s3_uri, rclone_uri, tmp_path / "st2")
    assert time.monotonic() - started < 20
    assert again["state"] == "partial" and again["retries"] == 0 and again["skipped"] == 2
    errors = {e["key"]: e["error"] for e in again["errors"]}
    assert set(errors) == {"both/child.txt", long, "tab\tin.txt", "x/../y"}
    assert "'both' is a file of this job" in errors["both/child.txt"]


def test_mtimes_are_carried_across_hops_and_resyncs_copy_nothing(tmp_path: Path, s3_uri: str, rclone_uri: str) -> None:
    """file -> moto -> rclone -> file: the last copy has the first file's mtime (a copy of a
    copy carries it), every hop verifies in full, and syncing any hop again copies nothing (the
    source ETag a copy recorded says the object did not change)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"a.bin": os.urandom(3000), "d/b.bin": os.urandom(12 * MiB)}  # b: a multipart copy on every hop
    for rel, body in files.items():
        (src / rel).write_bytes(body)
        os.utime(src / rel, ns=(1_600_000_000_123_456_789,) * 2)
    out = f"file://{tmp_path}/out"
    hops = [(f"file://{src}", s3_uri), (s3_uri, rclone_uri), (rclone_uri, out)]
    for n, (a, b) in enumerate(hops):
        report = sync(a, b, tmp_path / f"st{n}", verify="full", multipart_threshold=8 * MiB, part_size=5 * MiB)
        assert report["state"] == "ok" and report["copied"] == len(files), report["errors"]
    for rel, body in files.items():
        got = tmp_path / "out" / rel
        assert got.read_bytes() == body
        assert abs(got.stat().st_mtime_ns - 1_600_000_000_123_456_789) < 1_000_000  # within 1 ms
    for n, (a, b) in enumerate(hops):
        again = sync(a, b, tmp_path / f"again{n}", verify="full")
        assert again["state"] == "ok" and again["copied"] == 0 and again["skipped"] == len(files), (n, again)
    # the other replica feeding the same copy: b.bin is multipart in moto (an ETag of 3 parts),
    # whole in rclone (an MD5), the same bytes: it was copied again from whichever replica fed it
    for a in (s3_uri, rclone_uri, s3_uri):
        again = sync(a, out, tmp_path / f"other{a[:2]}{time.monotonic_ns()}", verify="full")
        assert again["state"] == "ok" and again["copied"] == 0 and again["skipped"] == len(files), (a, again)


def test_wrong_credentials_are_one_clear_line(tmp_path: Path, rclone_uri: str) -> None:
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "wrong", "BABEL_STATE_DIR": str(tmp_path / "st")}
    (tmp_path / "f").write_bytes(b"x")
    r = subprocess.run(
        [sys.executable, "-m", "babel.cli.main", "sync", rclone_uri, f"file://{tmp_path}/out", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "AccessDenied" in r.stderr and "Traceback" not in r.stderr
