"""One conformance suite for every backend (file://, s3:// on moto), and the parallel lister."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from babel import list_parallel, list_serial, open_store
from babel.errors import BadURI, NoSuchBucket, NoSuchKey
from babel.lister import split_points

pytestmark = pytest.mark.s3

KEYS = [
    "a.txt", "dir-1.txt", "dir/a", "dir/b/c", "dir/b/d", "dir0", "space name.bin", "uni/žluťoučký kůň",
    "uni/日本語.txt", "sym+bols:$@#%?.x", "z/0", "empty",
]  # fmt: skip


@pytest.fixture(params=["file", "s3", "pcache"])
def store_uri(request, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/root"
    if request.param == "pcache":  # a directory of its own on the module's cluster
        return f"pcache://{request.getfixturevalue('shared_cluster').master_address}/{tmp_path.name}/root"
    return request.getfixturevalue("s3_uri")


def run(coro):
    return asyncio.run(coro)


async def fill(uri: str, keys: list[str]) -> None:
    store = open_store(uri)
    try:
        await asyncio.gather(*(store.put(k, b"" if k == "empty" else k.encode() * 3) for k in keys))
    finally:
        await store.close()


async def list_all(uri: str, **kwargs) -> tuple[list[str], list[str]]:
    store = open_store(uri)
    objects, prefixes, after = [], [], ""
    try:
        while True:
            page = await store.list_page(start_after=after, **kwargs)
            objects += [o.key for o in page.objects]
            prefixes += page.prefixes
            if not page.truncated:
                return objects, prefixes
            after = max(([o.key for o in page.objects] or [""])[-1:] + page.prefixes[-1:])
    finally:
        await store.close()


def test_listing_order_delimiter_and_paging(store_uri: str) -> None:
    if store_uri.startswith("file"):
        Path(store_uri[7:]).mkdir(parents=True)
    run(fill(store_uri, KEYS))
    objects, prefixes = run(list_all(store_uri, max_keys=3))
    assert objects == sorted(KEYS) and prefixes == []  # byte order: dir-1.txt < dir/a < dir0
    objects, prefixes = run(list_all(store_uri, delimiter="/", max_keys=2))
    assert objects == sorted(k for k in KEYS if "/" not in k)
    assert prefixes == ["dir/", "uni/", "z/"]
    objects, prefixes = run(list_all(store_uri, prefix="dir/", delimiter="/"))
    assert objects == ["dir/a"] and prefixes == ["dir/b/"]


def test_objects_roundtrip_and_errors(store_uri: str) -> None:
    if store_uri.startswith("file"):
        Path(store_uri[7:]).mkdir(parents=True)

    async def go():
        store = open_store(store_uri)
        try:
            info = await store.put("x/y.bin", b"0123456789")
            assert info.size == 10
            head = await store.head("x/y.bin")
            assert head.size == 10 and head.mtime > 0
            assert await store.get("x/y.bin") == b"0123456789"
            assert await store.get("x/y.bin", 3, 4) == b"3456"
            await store.delete(["x/y.bin", "never-existed"])
            with pytest.raises(NoSuchKey):
                await store.head("x/y.bin")
            with pytest.raises(FileNotFoundError):
                await store.get("x/y.bin")
        finally:
            await store.close()

    run(go())


def test_missing_bucket_and_bad_uris(tmp_path: Path, moto_endpoint: str) -> None:
    async def go(uri):
        store = open_store(uri)
        try:
            return await store.list_page()
        finally:
            await store.close()

    with pytest.raises(NoSuchBucket):
        run(go(f"s3://no-such-bucket/x?endpoint_url={moto_endpoint}"))
    with pytest.raises(NoSuchBucket):
        run(go(f"file://{tmp_path}/missing"))
    for bad in ("ftp://x/y", "s3:///nobucket", "file://host/path", "file://relative"):
        with pytest.raises(BadURI):
            open_store(bad)


def test_split_points_are_strictly_between_and_increasing() -> None:
    rng = random.Random(5)
    alphabet = "ab/-_.09Zz~\u00e9\u65e5"
    for _ in range(3000):
        a, b = sorted("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(2))
        if a == b:
            continue
        high = None if rng.random() < 0.2 else b
        points = split_points(a[:2], a, high, rng.randint(2, 20), [a, b, a[:2]], page_keys=10, page_size=10)
        assert points == sorted(set(points))
        assert all(a < q and (high is None or q < high) for q in points), (a, high, points)


def test_split_points_cut_where_keys_are() -> None:
    # a dataset's keys share long prefixes: the cuts must land among them, not beyond them
    page = [f"tree/d000/e{e:03d}/f{f:04d}" for e in range(20) for f in range(50)]
    points = split_points(page[0], page[-1], None, 16, page, page_keys=1000, page_size=1000, prefix="tree/")
    assert len(points) >= 8 and all(q.startswith("tree/d000/e") for q in points[:4]), points


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_parallel_listing_equals_serial(kind: str, tmp_path: Path, request) -> None:
    rng = random.Random(1)
    keys = {f"flat/{rng.getrandbits(40):010x}" for _ in range(900)}  # one flat prefix: range splitting
    keys |= {f"tree/{a}/{b}/f{c}" for a in "abc" for b in range(4) for c in range(25)}  # fan-out
    keys |= {"top.txt", "tree/x.bin", "flat-sibling", "ütf/ñame"}
    uri = f"file://{tmp_path}/root" if kind == "file" else request.getfixturevalue("s3_uri")
    if kind == "file":
        Path(tmp_path / "root").mkdir()
    run(fill(uri, sorted(keys)))

    async def collect(fn, **kw):
        store = open_store(uri)
        calls = 0
        original = store.list_page

        async def counting(*a, **k):
            nonlocal calls
            calls += 1
            return await original(*a, **k)

        store.list_page = counting
        try:
            got = [o.key async for o in fn(store, **kw)]
        finally:
            await store.close()
        return got, calls

    serial, serial_calls = run(collect(list_serial, page_size=100))
    parallel, parallel_calls = run(collect(list_parallel, page_size=100, concurrency=8))
    assert sorted(serial) == sorted(keys)
    assert len(parallel) == len(set(parallel)) == len(keys)  # nothing twice
    assert set(parallel) == keys
    assert parallel_calls >= serial_calls  # fan-out and splits: more, smaller requests in flight at once
