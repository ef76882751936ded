"""babel.verify on real backends: file:// in a temporary directory and s3:// on a moto server."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from babel import open_store
from babel.checksum import crc32c, sample_ranges
from babel.errors import BabelError, NoSuchKey
from babel.verify import VerifyResult, check_full, check_metadata, check_sample, object_crc32c
from objstore.base import META_CRC32C, META_MTIME, ObjectInfo

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def uris(request, tmp_path: Path) -> tuple[str, str]:
    """(source URI, destination URI) on one backend."""
    if request.param == "file":
        return f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    return copy_uri(request.getfixturevalue("s3_uri"))


def copy_uri(s3_uri: str) -> tuple[str, str]:
    """Two prefixes of one fresh bucket: ``s3://bucket-N/data?...`` and ``s3://bucket-N/copy?...``."""
    return s3_uri, s3_uri.replace("/data?", "/copy?", 1)


def run(coro):
    return asyncio.run(coro)


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


async def with_stores(uris: tuple[str, str], body):
    src, dst = open_store(uris[0]), open_store(uris[1])
    try:
        return await body(src, dst)
    finally:
        await asyncio.gather(src.close(), dst.close())


@pytest.mark.parametrize("size,chunk,concurrency", [(0, MiB, 4), (1000, MiB, 4), (3 * MiB + 123, MiB + 7, 3)])
def test_object_crc32c_equals_crc_of_bytes(uris, size: int, chunk: int, concurrency: int) -> None:
    data = os.urandom(size)

    async def body(src, _dst):
        await src.put("obj.bin", data)
        return await object_crc32c(src, "obj.bin", size, chunk=chunk, concurrency=concurrency)

    assert run(with_stores(uris, body)) == crc32c(data)


def test_object_crc32c_errors(uris) -> None:
    async def body(src, _dst):
        await src.put("short.bin", b"x" * 100)
        with pytest.raises(NoSuchKey):
            await object_crc32c(src, "missing.bin", 10 * MiB, chunk=MiB)
        with pytest.raises(BabelError):  # "read 100 of 150 bytes", or S3's InvalidRange for the second chunk
            await object_crc32c(src, "short.bin", 150, chunk=100)
        with pytest.raises(ValueError):
            await object_crc32c(src, "short.bin", 100, chunk=0)

    run(with_stores(uris, body))


def test_check_full_catches_every_flipped_byte(uris) -> None:
    size = 2 * MiB + 5
    data = os.urandom(size)
    crc = crc32c(data)
    rng = random.Random(7)
    positions = [0, size - 1, MiB - 1, MiB, *rng.sample(range(size), 4)]

    async def body(src, dst):
        await src.put("k", data)
        await dst.put("k", data)
        ok = await check_full(dst, "k", size, crc, chunk=MiB)
        assert ok == VerifyResult("k", "full", True, "", size, 3)
        assert (await check_full(dst, "k", size, src=src, chunk=MiB)).ok
        for at in positions:
            await dst.put("k", flipped(data, at))
            bad = await check_full(dst, "k", size, crc, chunk=MiB)
            assert not bad.ok and bad.detail == f"crc32c 0x{crc:08x} != 0x{crc32c(flipped(data, at)):08x}", at
            assert not (await check_full(dst, "k", size, src=src, chunk=MiB)).ok

    run(with_stores(uris, body))


def test_check_sample_catches_a_flip_exactly_in_sampled_ranges(uris) -> None:
    size, samples, sample_size = MiB, 6, 16 * KiB
    data = os.urandom(size)
    ranges = sample_ranges(size, seed="ckpt/shard-0", samples=samples, sample_size=sample_size)
    assert len(ranges) == samples
    inside = [0, size - 1, ranges[2][0], ranges[3][0] + sample_size - 1, ranges[4][0] + 100]
    gaps = [sample_size, ranges[2][0] - 1, ranges[3][0] + sample_size, size - sample_size - 1]
    assert not any(o <= at < o + n for at in gaps for o, n in ranges)

    async def body(src, dst):
        await src.put("ckpt/shard-0", data)
        kwargs = {"samples": samples, "sample_size": sample_size}
        await dst.put("ckpt/shard-0", data)
        ok = await check_sample(src, dst, "ckpt/shard-0", size, **kwargs)
        assert ok == VerifyResult("ckpt/shard-0", "sample", True, "", 2 * samples * sample_size, 2 * samples)
        for at in inside + gaps:
            await dst.put("ckpt/shard-0", flipped(data, at))
            result = await check_sample(src, dst, "ckpt/shard-0", size, **kwargs)
            i = next((i for i, (o, n) in enumerate(ranges) if o <= at < o + n), None)
            if i is None:
                assert result.ok, at  # between the samples: missed, as designed
            else:
                o, n = ranges[i]
                theirs, ours = crc32c(data[o : o + n]), crc32c(flipped(data, at)[o : o + n])
                assert result.detail == f"sample {i} at offset {o}+{n}: crc32c 0x{theirs:08x} != 0x{ours:08x}"

    run(with_stores(uris, body))


def test_check_sample_small_object_is_read_whole_and_dst_key(uris) -> None:
    data = os.urandom(100 * KiB)

    async def body(src, dst):
        await src.put("a", data)
        await dst.put("renamed/a", data)
        result = await check_sample(src, dst, "a", len(data), dst_key="renamed/a")
        assert result.ok and result.ranges == 2 and result.bytes_read == 2 * len(data)
        await dst.put("renamed/a", flipped(data, 50 * KiB))
        result = await check_sample(src, dst, "a", len(data), dst_key="renamed/a")
        assert result.detail.startswith(f"sample 0 at offset 0+{len(data)}: crc32c ")
        await asyncio.gather(src.put("e", b""), dst.put("e", b""))
        assert (await check_sample(src, dst, "e", 0)) == VerifyResult("e", "sample", True)

    run(with_stores(uris, body))


def test_size_differences_and_missing_objects(uris) -> None:
    data = os.urandom(3 * MiB)

    async def body(src, dst):
        await src.put("k", data)
        await dst.put("k", data + b"!")  # one byte too many: ranged reads of 3 MiB alone would not see it
        kwargs = {"samples": 4, "sample_size": 64 * KiB}
        assert (await check_sample(src, dst, "k", len(data), **kwargs)).detail == f"size {len(data)} != {len(data) + 1}"
        assert (await check_full(dst, "k", len(data), crc32c(data))).detail == f"size {len(data)} != {len(data) + 1}"
        assert (await check_full(dst, "k", len(data), src=src)).detail == f"size {len(data)} != {len(data) + 1}"
        await dst.put("k", data[:-10])
        assert (
            await check_sample(src, dst, "k", len(data), **kwargs)
        ).detail == f"size {len(data)} != {len(data) - 10}"
        with pytest.raises(NoSuchKey):
            await check_sample(src, dst, "missing", 10)
        with pytest.raises(NoSuchKey):
            await check_full(dst, "missing", 10, 0)
        with pytest.raises(ValueError):
            await check_full(dst, "k", len(data))

    run(with_stores(uris, body))


@pytest.mark.s3
def test_full_check_across_backends(tmp_path: Path, s3_uri: str) -> None:
    data = os.urandom(5 * MiB + 3)

    async def body(src, dst):
        await src.put("x/y.bin", data)
        await dst.put("x/y.bin", data)
        full = await check_full(dst, "x/y.bin", len(data), src=src, chunk=2 * MiB)
        assert full.ok and full.bytes_read == 2 * len(data) and full.ranges == 6
        sample = await check_sample(src, dst, "x/y.bin", len(data), samples=4, sample_size=256 * KiB)
        assert sample.ok and sample.bytes_read == 2 * MiB

    run(with_stores((f"file://{tmp_path}/src", s3_uri), body))


@pytest.mark.s3
def test_check_metadata_on_s3_heads(s3_uri: str) -> None:
    data = b"hello world"
    meta = {META_CRC32C: f"{crc32c(data):08x}", META_MTIME: "1700000000.123456"}

    async def body(src, dst):
        await src.put("a", data)
        await dst.put("a", data, meta)
        await dst.put("b", data, {**meta, META_CRC32C: "deadbeef"})
        src_info = await src.head("a")
        # the source's mtime is the store's; compare against what Babel would have stored
        src_info = ObjectInfo("a", src_info.size, 1700000000.123456, metadata={META_CRC32C: meta[META_CRC32C]})
        assert (await check_metadata(src_info, await dst.head("a"))).ok
        bad = await check_metadata(src_info, await dst.head("b"))
        assert bad.detail == f"{META_CRC32C} {meta[META_CRC32C]} != deadbeef"

    run(with_stores(copy_uri(s3_uri), body))


def info(size: int = 10, mtime: float = 1000.0, **metadata: str) -> ObjectInfo:
    return ObjectInfo("k", size, mtime, metadata={k.replace("_", "-"): v for k, v in metadata.items()})


def test_check_metadata_rules() -> None:
    def check(src: ObjectInfo, dst: ObjectInfo) -> str:
        result = run(check_metadata(src, dst))
        assert result.mode == "metadata" and result.ok == (not result.detail) and result.bytes_read == 0
        return result.detail

    assert check(info(), info()) == ""
    assert check(info(10), info(11)) == "size 10 != 11"
    assert check(info(babel_crc32c="0000abcd"), info(babel_crc32c="ABCD")) == ""  # compared as numbers
    assert check(info(babel_crc32c="0000abcd"), info(babel_crc32c="abce")) == "babel-crc32c 0000abcd != abce"
    assert check(info(babel_crc32c="0000abcd"), info()) == ""  # only one side knows it
    assert check(info(mtime=1000.0), info(mtime=5.0, babel_mtime="1000.0009")) == ""  # within 1 ms
    assert check(info(mtime=1000.0), info(babel_mtime="1000.002")) == "mtime 1000.000000 != babel-mtime 1000.002000"
    assert check(info(mtime=7.0, babel_mtime="1000.0"), info(babel_mtime="1000.0")) == ""  # a copy of a copy
    assert check(info(), info(babel_mtime="yesterday")) == "babel-mtime 'yesterday' is not a number"
    stores = ObjectInfo("k", 10, 0.0, checksums={"crc64ecma": "123"})
    assert check(stores, ObjectInfo("k", 10, 0.0, checksums={"crc64ecma": "124"})) == "crc64ecma 123 != 124"
    assert check(stores, ObjectInfo("k", 10, 0.0, checksums={"md5": "x"})) == ""


@pytest.mark.s3
def test_an_object_read_in_one_piece_is_a_whole_get(rclone_uri: str) -> None:
    """A check that reads an object in one range asks for the whole object: ``rclone serve s3``
    answers ranged GETs with 200, which sends every later range of the store through botocore's
    slower path (1.8 ms of CPU per request against obstore's 0.3); and a longer object shows."""
    data = os.urandom(100 * KiB)

    async def body(store):
        await store.put("v/one.bin", data)
        result = await check_full(store, "v/one.bin", len(data), crc32c(data), chunk=MiB)
        assert result.ok and (result.bytes_read, result.ranges) == (len(data), 1)
        assert store.fast_ranged_gets  # no ranged GET went out: the fast path still takes ranges
        await store.put("v/one.bin", data + b"tail")
        longer = await check_full(store, "v/one.bin", len(data), crc32c(data), chunk=MiB)
        assert longer.detail == f"size {len(data)} != {len(data) + 4}"
        assert (await object_crc32c(store, "v/one.bin", len(data) + 4)) == crc32c(data + b"tail")
        with pytest.raises(BabelError, match="shorter"):
            await object_crc32c(store, "v/one.bin", len(data) + 10)
        with pytest.raises(BabelError, match="longer"):
            await object_crc32c(store, "v/one.bin", len(data))

    async def go():
        store = open_store(rclone_uri)
        try:
            await body(store)
        finally:
            await store.close()

    run(go())


def test_an_object_damaged_at_rest_is_the_content_checks_failure_not_a_busy_store(
    tmp_path: Path, rclone_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A byte flipped in rclone's file behind an object (same size, same mtime): the full check
    names the damage (its CRC32C, or the store's own checksum failing a whole GET: ``Corrupt``),
    never as the metadata check's failure of a busy store (a user saw "verification (metadata)
    failed: TransientError: FlexibleChecksumError")."""
    from babel.sync import SyncOptions, run_sync, run_verify

    src = tmp_path / "src"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(100_000))
    report = asyncio.run(
        run_sync(f"file://{src}", rclone_uri, SyncOptions(verify="none"), state_dir=str(tmp_path / "s"))
    )
    assert report.state == "ok"
    bucket = rclone_uri.removeprefix("s3://").split("/", 1)[0]
    want = (src / "model.bin").read_bytes()
    (on_disk,) = {p.resolve() for p in tmp_path_factory.getbasetemp().glob(f"rclone*/root/{bucket}/data/model.bin")
                  if p.read_bytes() == want}  # fmt: skip
    with open(on_disk, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 0x40]))
    checked = asyncio.run(
        run_verify(f"file://{src}", rclone_uri, SyncOptions(verify="full"), state_dir=str(tmp_path / "v"))
    )
    failures = checked.verification["failures"]
    assert checked.state == "partial" and len(failures) == 1, checked.to_dict()
    assert failures[0]["check"] == "full" and failures[0]["detail"].startswith(("crc32c 0x", "Corrupt: ")), failures


def test_a_stores_own_checksum_failing_is_corrupt_and_retried() -> None:
    """botocore's FlexibleChecksumError (a whole GET whose bytes fail the checksum the store
    sent) was a TransientError, reported by verify as its metadata check failing."""
    from botocore.exceptions import FlexibleChecksumError

    from babel.errors import Corrupt, TransientError
    from objstore.s3 import translate

    error = translate(FlexibleChecksumError(error_msg="Expected checksum x did not match y"), "s3://b/k")
    assert isinstance(error, Corrupt) and isinstance(error, TransientError) and error.retryable
    assert "did not match" in str(error)
