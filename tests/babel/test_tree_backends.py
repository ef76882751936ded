"""Directory trees as object stores (file://, pcache://): the listing plan against a model of S3,
metadata on files, hidden temporary files, multipart uploads (file:// resumes after a crash,
pcache:// takes concurrent out-of-order parts through one handle)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from babel import list_parallel, list_serial, open_store
from babel.errors import BabelError, BadURI, NoSuchBucket, NoSuchKey, NoSuchUpload
from objstore.base import META_CRC32C, META_MTIME, MiB, ObjectInfo, PartInfo
from objstore.tree import (
    XATTR_CRC32C,
    format_mtime_ns,
    is_temp_name,
    parse_mtime,
    parse_mtime_ns,
    plan_page,
    run_plan,
    sort_entries,
    temp_name,
)

pytestmark = pytest.mark.s3


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(params=["file", "pcache"])
def tree_uri(request, tmp_path: Path) -> str:
    if request.param == "file":
        (tmp_path / "root").mkdir()
        return f"file://{tmp_path}/root"
    cluster = request.getfixturevalue("shared_cluster")
    return f"pcache://{cluster.master_address}/{tmp_path.name}/root"


async def keys_of(store, **kwargs) -> list[str]:
    out, after = [], ""
    while True:
        page = await store.list_page(start_after=after, **kwargs)
        out += [o.key for o in page.objects] + page.prefixes
        if not page.truncated:
            return out
        after = max(([o.key for o in page.objects] or [""])[-1:] + page.prefixes[-1:])


# ------------------------------------------------------- the listing plan --


def model_page(keys: list[str], prefix: str, delimiter: str | None, start_after: str, max_keys: int):
    """ListObjectsV2 as S3 answers it (a folded prefix at or before start_after is not repeated)."""
    entries: dict[str, bool] = {}
    for key in sorted(keys):
        if not key.startswith(prefix) or key <= start_after:
            continue
        rest = key[len(prefix) :]
        if delimiter == "/" and "/" in rest:
            common = prefix + rest[: rest.index("/") + 1]
            if common > start_after:
                entries[common] = True
        else:
            entries[key] = False
    ordered = sorted(entries)
    page = ordered[:max_keys]
    return [k for k in page if not entries[k]], [k for k in page if entries[k]], len(ordered) >= max_keys


def fake_tree(keys: list[str]):
    """read_dir / stat_files answering from a set of keys, as a file system would hold them."""
    dirs: dict[str, dict[str, bool]] = {"": {}}
    for key in keys:
        parts = key.split("/")
        for depth in range(len(parts)):
            rel = "".join(p + "/" for p in parts[:depth])
            dirs.setdefault(rel, {})[parts[depth]] = depth < len(parts) - 1
    asked: list[int] = []

    def read_dir(rel: str):
        return sort_entries(list(dirs.get(rel, {}).items()))

    def stat_files(rel: str, names):
        asked.append(len(names))
        return [ObjectInfo(rel + n, len(rel + n), 1.0) if not is_temp_name(n) else None for n in names]

    return read_dir, stat_files, asked


def test_plan_matches_s3_model_on_random_trees() -> None:
    rng = random.Random(7)
    alphabet = ["a", "b", "a-", "a.", "a0", "b/", "a/", "é", "~", " ", "日"]
    for _ in range(300):
        keys = set()
        for _ in range(rng.randint(1, 40)):
            key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))).strip("/")
            if key and "//" not in key:
                keys.add(key)
        # a file and a directory cannot share a name
        keys = sorted(k for k in keys if not any(o.startswith(k + "/") for o in keys))
        read_dir, stat_files, _ = fake_tree(keys)
        probes = ["", *rng.sample(keys, min(3, len(keys))), "a", "a/", "a-", "b/a", "日"]
        for _ in range(10):
            prefix = rng.choice(["", "a", "a/", "b", "a/a", rng.choice(probes)[:2]])
            after = rng.choice(probes)
            delimiter = rng.choice([None, "/"])
            max_keys = rng.choice([1, 2, 3, 1000])
            page = run_plan(plan_page(prefix, delimiter, after, max_keys), read_dir, stat_files)
            want = model_page(keys, prefix, delimiter, after, max_keys)
            got = ([o.key for o in page.objects], page.prefixes, page.truncated)
            assert got == want, (keys, prefix, delimiter, after, max_keys)


def test_plan_batches_stats_and_hides_temp_files() -> None:
    keys = [f"flat/f{i:04d}" for i in range(2500)] + ["flat/.f0007.babel-0123456789abcdef", "flat/f0009.babel-part"]
    read_dir, stat_files, asked = fake_tree(keys)
    page = run_plan(plan_page("flat/", None, "", 1000), read_dir, stat_files)
    assert [o.key for o in page.objects] == [f"flat/f{i:04d}" for i in range(1000)] and page.truncated
    assert asked == [1000]  # one batch for the whole page, temp names never asked about
    page = run_plan(plan_page("", "/", "", 1000), read_dir, stat_files)
    assert page.prefixes == ["flat/"] and asked == [1000]  # folded: never descended into


def test_temp_names_and_mtime_format() -> None:
    assert is_temp_name(temp_name("x.bin", "0123456789abcdef")) and is_temp_name("x.bin.babel-part")
    assert not is_temp_name(".bashrc") and not is_temp_name(".x.babel-notatoken")
    long = temp_name("é" * 200, "0123456789abcdef")
    assert len(long.encode()) <= 255 and is_temp_name(long)
    for ns in (0, 1, 1_700_000_000_123_456_789, -1_500_000_000, 10**9):
        assert parse_mtime_ns(format_mtime_ns(ns)) == ns
    assert parse_mtime_ns("1700000000.5") == 1_700_000_000_500_000_000
    x = 1732872394.8181238
    assert parse_mtime(repr(x)) == x and float(format_mtime_ns(parse_mtime_ns(repr(x)))) == x
    with pytest.raises(BabelError):
        parse_mtime_ns("yesterday")


# -------------------------------------------------------------- metadata --


def test_metadata_roundtrip(tree_uri: str) -> None:
    mtime, crc = "1700000000.123456789", "0a1b2c3d"

    async def go():
        store = open_store(tree_uri)
        try:
            await store.put("m/a.bin", b"abc", {META_MTIME: mtime, META_CRC32C: crc})
            x = 1732872394.8181238  # what transfer.py writes: repr of the source's float mtime
            await store.put("m/b.bin", b"def", {META_MTIME: repr(x)})
            head = await store.head("m/a.bin")
            assert float(head.metadata[META_MTIME]) == float(mtime) and head.mtime == float(mtime)
            assert head.metadata[META_CRC32C] == crc
            b = await store.head("m/b.bin")
            assert float(b.metadata[META_MTIME]) == x and META_CRC32C not in b.metadata
            page = await store.list_page("m/")
            assert [o.metadata for o in page.objects] == [head.metadata, b.metadata]  # listings carry both
            uid = await store.create_multipart("m/c.bin", 10, 4, {META_MTIME: mtime, META_CRC32C: crc})
            for n, chunk in ((3, b"89"), (1, b"0123"), (2, b"4567")):
                await store.upload_part("m/c.bin", uid, n, chunk)
            parts = [PartInfo(1, 4), PartInfo(2, 4), PartInfo(3, 2)]
            done = await store.complete_multipart("m/c.bin", uid, parts)
            assert done.size == 10 and done.metadata == head.metadata
            assert await store.get("m/c.bin") == b"0123456789"
            return head
        finally:
            await store.close()

    head = run(go())
    if tree_uri.startswith("file://"):
        root = Path(tree_uri[len("file://") :])
        assert head.metadata[META_MTIME] == mtime  # ns exact, as a string too
        for name in ("a.bin", "c.bin"):
            assert os.stat(root / "m" / name).st_mtime_ns == 1_700_000_000_123_456_789
            try:
                assert os.getxattr(root / "m" / name, XATTR_CRC32C) == crc.encode()
            except OSError:  # no user xattrs on this file system: dropped
                pass


def test_failed_put_leaves_nothing(tree_uri: str) -> None:
    async def go():
        store = open_store(tree_uri)
        try:
            await store.put("d/keep", b"old")
            with pytest.raises(BabelError):
                await store.put("d/keep", b"new bytes", {META_MTIME: "not a time"})
            with pytest.raises(BabelError):
                await store.put("d/new", b"new bytes", {META_MTIME: "not a time"})
            assert await store.get("d/keep") == b"old"
            with pytest.raises(NoSuchKey):
                await store.head("d/new")
            assert await keys_of(store) == ["d/keep"]
            with pytest.raises(BadURI):
                await store.put("d/../x", b"")
        finally:
            await store.close()

    run(go())
    if tree_uri.startswith("file://"):
        assert os.listdir(Path(tree_uri[len("file://") :]) / "d") == ["keep"]  # no temp file left


# ------------------------------------------------------------- multipart --


def test_uploads_in_progress_are_invisible(tree_uri: str) -> None:
    async def go():
        store = open_store(tree_uri)
        try:
            await store.put("u/a", b"a")
            await store.put("u/z", b"z")
            uid = await store.create_multipart("u/m", 6, 3, {})
            await store.upload_part("u/m", uid, 2, b"def")
            assert await keys_of(store) == ["u/a", "u/z"]
            assert await keys_of(store, max_keys=1) == ["u/a", "u/z"]
            assert await keys_of(store, delimiter="/") == ["u/"]
            with pytest.raises(NoSuchKey):
                await store.head("u/m")
            with pytest.raises(BabelError):  # part 1 never came
                await store.complete_multipart("u/m", uid, [PartInfo(2, 3)])
            await store.abort_multipart("u/m", uid)
            await store.abort_multipart("u/m", uid)  # unknown now: not an error
            with pytest.raises(NoSuchUpload):
                await store.upload_part("u/m", uid, 1, b"abc")
            assert await keys_of(store) == ["u/a", "u/z"]
        finally:
            await store.close()

    run(go())
    if tree_uri.startswith("file://"):
        root = Path(tree_uri[len("file://") :])
        assert sorted(os.listdir(root / "u")) == ["a", "z"]
        (root / "u" / "old.babel-part").write_bytes(b"left by an older put")
        assert run(keys_of(open_store(tree_uri))) == ["u/a", "u/z"]


def test_file_multipart_resumes_after_crash(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/root"
    data = os.urandom(10 * MiB + 12345)
    part = 3 * MiB
    count = -(-len(data) // part)

    def chunk(n: int) -> bytes:
        return data[(n - 1) * part : n * part]

    async def first() -> str:
        store = open_store(uri)
        assert store.limits.resumable_uploads and store.limits.min_part_size == 1
        uid = await store.create_multipart("big/obj.bin", len(data), part, {META_MTIME: "1600000000.25"})
        await asyncio.gather(*(store.upload_part("big/obj.bin", uid, n, chunk(n)) for n in (4, 2)))
        return uid  # the process dies here: no close, no complete

    async def second(uid: str) -> ObjectInfo:
        store = open_store(uri)
        try:
            with pytest.raises(BabelError):  # a part of the wrong size is refused
                await store.upload_part("big/obj.bin", uid, 1, chunk(1)[:-1])
            await asyncio.gather(*(store.upload_part("big/obj.bin", uid, n, chunk(n)) for n in (3, 1)))
            parts = [PartInfo(n, len(chunk(n))) for n in range(1, count + 1)]
            info = await store.complete_multipart("big/obj.bin", uid, parts)
            assert await store.get("big/obj.bin") == data
            with pytest.raises(NoSuchUpload):  # done: the upload is gone
                await store.complete_multipart("big/obj.bin", uid, parts)
            return info
        finally:
            await store.close()

    uid = run(first())
    assert [p.name for p in (tmp_path / "root" / "big").iterdir()] == [temp_name("obj.bin", uid.split(".")[0])]
    info = run(second(uid))
    assert info.size == len(data) and info.metadata[META_MTIME] == "1600000000.250000000"
    assert os.listdir(tmp_path / "root" / "big") == ["obj.bin"]
    with pytest.raises(NoSuchUpload):
        run(open_store(uri).upload_part("big/obj.bin", "garbage/../../id", 1, b"x"))


def test_pcache_multipart_concurrent_out_of_order_parts(shared_cluster, tmp_path: Path) -> None:
    uri = f"pcache://{shared_cluster.master_address}/{tmp_path.name}"
    rng = random.Random(3)

    async def upload(store, key: str, data: bytes, part: int) -> ObjectInfo:
        count = -(-len(data) // part)
        uid = await store.create_multipart(key, len(data), part, {META_MTIME: "1650000000.5"})
        order = list(range(1, count + 1))
        rng.shuffle(order)
        parts = await asyncio.gather(*(store.upload_part(key, uid, n, data[(n - 1) * part : n * part]) for n in order))
        return await store.complete_multipart(key, uid, list(parts))

    async def go():
        store = open_store(uri)
        try:
            assert not store.limits.resumable_uploads
            big = os.urandom(72 * MiB + 999)  # 10 parts of 8 MiB, the last one short: one block each
            info = await upload(store, "big.bin", big, 8 * MiB)
            assert info.size == len(big) and info.mtime == 1650000000.5
            assert await store.get("big.bin") == big
            assert await store.get("big.bin", 8 * MiB - 10, 20) == big[8 * MiB - 10 : 8 * MiB + 10]
            small = os.urandom(2 * MiB + 7)  # parts below PCache's smallest block: many parts per block
            await upload(store, "small.bin", small, 40_000)
            assert await store.get("small.bin") == small
            assert await keys_of(store) == ["big.bin", "small.bin"]
            # an upload left open when the store closes is aborted: no temp file stays behind
            await store.create_multipart("left.bin", 10, 5, {})
        finally:
            await store.close()
        store = open_store(uri)
        try:
            client = store._c()
            names = sorted(e.name for e in await client.listdir(f"/{tmp_path.name}"))
            assert names == ["big.bin", "small.bin"]
        finally:
            await store.close()

    run(go())


def test_pcache_parallel_listing_equals_serial(shared_cluster, tmp_path: Path) -> None:
    rng = random.Random(1)
    keys = {f"flat/{rng.getrandbits(40):010x}" for _ in range(300)}
    keys |= {f"tree/{a}/{b}/f{c}" for a in "ab" for b in range(3) for c in range(10)}
    keys |= {"top.txt", "tree/x.bin", "flat-sibling", "tree-1", "ütf/ñame"}
    uri = f"pcache://{shared_cluster.master_address}/{tmp_path.name}"

    async def go():
        store = open_store(uri)
        try:
            slots = asyncio.Semaphore(32)

            async def put(key: str) -> None:
                async with slots:
                    await store.put(key, key.encode())

            await asyncio.gather(*(put(k) for k in keys))
            serial = [o.key async for o in list_serial(store, page_size=50)]
            parallel = [o.key async for o in list_parallel(store, page_size=50, concurrency=8)]
            return serial, parallel
        finally:
            await store.close()

    serial, parallel = run(go())
    assert serial == sorted(keys)
    assert sorted(parallel) == sorted(keys) and len(parallel) == len(keys)


def test_pcache_uris_and_missing_root(shared_cluster, tmp_path: Path) -> None:
    for bad in ("pcache://127.0.0.1:1/a/../b", "pcache://127.0.0.1:1/a//b"):
        with pytest.raises(BadURI):
            open_store(bad)
    assert open_store("pcache://127.0.0.1:1/a/b/").root == "/a/b"

    async def go():
        store = open_store(f"pcache://{shared_cluster.master_address}/{tmp_path.name}/missing")
        try:
            with pytest.raises(NoSuchBucket):
                await store.list_page()
            with pytest.raises(NoSuchKey):
                await store.head("x")
            with pytest.raises(NoSuchKey):
                await store.get("x")
            await store.delete(["x", "y/z"])  # missing keys are no error
        finally:
            await store.close()

    run(go())
