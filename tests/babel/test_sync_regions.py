"""Sync between two independent S3 implementations (moto and rclone ``serve s3``) as two regions,
an OSS emulator, and a flaky, throttling link; every destination is checked with boto3."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
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


def test_wrong_credentials_are_one_clear_line(tmp_path: Path, rclone_uri: str) -> None:
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "wrong", "BABEL_STATE_DIR": str(tmp_path / "st")}
    (tmp_path / "f").write_bytes(b"x")
    r = subprocess.run(
        [sys.executable, "-m", "babel.cli.main", "sync", rclone_uri, f"file://{tmp_path}/out", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "AccessDenied" in r.stderr and "Traceback" not in r.stderr
