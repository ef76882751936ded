"""Conformance suite of the MetaStore contract, run against every engine."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from pcache.common import errors as E
from pcache.master.metastore import MemoryMetaStore, MetaStore, RocksMetaStore, open_metastore

U64 = struct.Struct(">Q")


def keys(pairs) -> list[bytes]:
    return [k for k, _ in pairs]


def test_open_by_scheme(tmp_path: Path) -> None:
    assert isinstance(open_metastore("memory://"), MemoryMetaStore)
    rocks = open_metastore(f"rocksdb://{tmp_path}/db")
    try:
        assert isinstance(rocks, RocksMetaStore)
        assert (tmp_path / "db").is_dir()
    finally:
        rocks.close()


@pytest.mark.parametrize("uri", ["rocksdb://", "s3://bucket/x", "nope", ""])
def test_open_rejects_bad_uri(uri: str) -> None:
    with pytest.raises(E.InvalidArgument):
        open_metastore(uri)


def test_get_put_delete(store: MetaStore) -> None:
    assert store.get(b"k") is None
    store.write([(b"k", b"v1")])
    assert store.get(b"k") == b"v1"
    store.write([(b"k", b"v2")])
    assert store.get(b"k") == b"v2"
    store.write(deletes=[b"k"])
    assert store.get(b"k") is None
    # deleting a missing key is not an error
    store.write(deletes=[b"k", b"never"])
    assert store.get(b"k") is None
    assert list(store.scan(b"")) == []


def test_values_are_bytes_and_binary_safe(store: MetaStore) -> None:
    blob = bytes(range(256)) * 4
    store.write([(b"\x00\xff", blob), (b"empty", b""), (b"ba", bytearray(b"xy"))])
    assert store.get(b"\x00\xff") == blob
    assert store.get(b"empty") == b""
    got = store.get(b"ba")
    assert got == b"xy" and isinstance(got, bytes)
    assert list(store.scan(b"")) == [(b"\x00\xff", blob), (b"ba", b"xy"), (b"empty", b"")]


def test_batch_applies_puts_and_deletes_together(store: MetaStore) -> None:
    store.write([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    store.write(puts=[(b"d", b"4"), (b"a", b"10")], deletes=[b"b", b"c"])
    assert list(store.scan(b"")) == [(b"a", b"10"), (b"d", b"4")]


def test_put_wins_over_delete_of_same_key_in_one_batch(store: MetaStore) -> None:
    store.write([(b"x", b"old")])
    store.write(puts=[(b"x", b"new")], deletes=[b"x"])
    assert store.get(b"x") == b"new"
    assert list(store.scan(b"x")) == [(b"x", b"new")]


def test_last_put_of_same_key_in_one_batch_wins(store: MetaStore) -> None:
    store.write([(b"x", b"1"), (b"x", b"2"), (b"x", b"3")])
    assert store.get(b"x") == b"3"
    assert list(store.scan(b"")) == [(b"x", b"3")]


def test_batch_accepts_generators(store: MetaStore) -> None:
    store.write((bytes([65 + i]), b"v") for i in range(5))
    store.write(deletes=(k for k in (b"A", b"C")))
    assert keys(store.scan(b"")) == [b"B", b"D", b"E"]


def test_failed_batch_changes_nothing(store: MetaStore) -> None:
    store.write([(b"keep", b"1")])

    def puts():
        yield (b"a", b"1")
        yield (b"b", b"2")
        raise RuntimeError("writer crashed while building the batch")

    with pytest.raises(RuntimeError):
        store.write(puts(), deletes=[b"keep"])
    assert store.get(b"a") is None and store.get(b"b") is None
    assert store.get(b"keep") == b"1"
    # a value that is not bytes-like fails the whole batch, not half of it
    with pytest.raises((TypeError, ValueError)):
        store.write([(b"a", b"1"), (b"b", "not bytes")], deletes=[b"keep"])
    assert store.get(b"a") is None and store.get(b"b") is None
    assert store.get(b"keep") == b"1"
    assert list(store.scan(b"")) == [(b"keep", b"1")]


@pytest.mark.parametrize("bad", [5, "str", None])
def test_non_bytes_keys_and_values_are_refused(store: MetaStore, bad) -> None:
    # bytes(5) would silently store five NULs
    with pytest.raises(TypeError):
        store.write([(b"k", bad)])
    with pytest.raises(TypeError):
        store.write([(bad, b"v")])
    with pytest.raises(TypeError):
        store.write(deletes=[bad])
    assert list(store.scan(b"")) == []


def test_scan_prefix(store: MetaStore) -> None:
    store.write([(k, k.upper()) for k in (b"a", b"ab", b"abc", b"abd", b"ac", b"b", b"ba")])
    assert list(store.scan(b"ab")) == [(b"ab", b"AB"), (b"abc", b"ABC"), (b"abd", b"ABD")]
    assert keys(store.scan(b"a")) == [b"a", b"ab", b"abc", b"abd", b"ac"]
    assert keys(store.scan(b"b")) == [b"b", b"ba"]
    assert keys(store.scan(b"")) == [b"a", b"ab", b"abc", b"abd", b"ac", b"b", b"ba"]
    assert list(store.scan(b"abz")) == []
    assert list(store.scan(b"c")) == []
    assert list(store.scan(b"0")) == []


def test_scan_start_after_is_exclusive(store: MetaStore) -> None:
    store.write([(b"p" + bytes([i]), bytes([i])) for i in range(10)] + [(b"q", b"q"), (b"o", b"o")])
    # an existing key is excluded
    assert keys(store.scan(b"p", b"p\x03")) == [b"p" + bytes([i]) for i in range(4, 10)]
    # a key between two keys starts at the next one
    assert keys(store.scan(b"p", b"p\x03\x00")) == [b"p" + bytes([i]) for i in range(4, 10)]
    # before the prefix (or equal to it): the whole prefix
    assert len(list(store.scan(b"p", b"a"))) == 10
    assert len(list(store.scan(b"p", b"p"))) == 10
    # past the prefix or at its last key: nothing, and never keys of another prefix
    assert list(store.scan(b"p", b"p\x09")) == []
    assert list(store.scan(b"p", b"pz")) == []
    assert list(store.scan(b"p", b"zzz")) == []
    # empty prefix with start_after walks to the end of the keyspace
    assert keys(store.scan(b"", b"p\x08")) == [b"p\x09", b"q"]


def test_scan_pages_with_start_after(store: MetaStore) -> None:
    want = [b"k" + U64.pack(i) for i in range(0, 500, 3)]
    store.write((k, b"") for k in want)
    got: list[bytes] = []
    after = None
    while True:
        page = []
        for key, _ in store.scan(b"k", after):
            page.append(key)
            if len(page) == 17:
                break
        if not page:
            break
        got += page
        after = page[-1]
    assert got == want


def test_big_endian_keys_sort_numerically(store: MetaStore) -> None:
    numbers = [0, 1, 2, 127, 128, 255, 256, 257, 65535, 65536, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    numbers += random.Random(7).sample(range(2**40), 200)
    shuffled = numbers[:]
    random.Random(3).shuffle(shuffled)
    store.write((b"n" + U64.pack(n), U64.pack(n)) for n in shuffled)
    scanned = [U64.unpack(v)[0] for _, v in store.scan(b"n")]
    assert scanned == sorted(set(numbers))
    # a numeric start_after resumes at the next larger number
    after = [U64.unpack(k[1:])[0] for k, _ in store.scan(b"n", b"n" + U64.pack(256))]
    assert after == [n for n in sorted(set(numbers)) if n > 256]


def test_scan_while_writing(store: MetaStore) -> None:
    """A lazy scan survives writes between its steps: no error, keys strictly ascending, and
    every key that was there before and is never deleted is seen exactly once. Whether keys
    written after the scan began show up is engine-specific (RocksDB iterators are snapshots)."""
    start = [b"s%03d" % i for i in range(0, 200, 2)]
    store.write((k, b"0") for k in start)
    model = dict.fromkeys(start, b"0")
    deleted: set[bytes] = set()
    inserted: set[bytes] = set()
    seen: list[bytes] = []
    for n, (key, _) in enumerate(store.scan(b"s")):
        seen.append(key)
        i = int(key[1:])
        puts = [(key, b"upd"), (b"t%03d" % i, b"other prefix")]
        if i % 4 == 0 and i > 0:
            puts.append((b"s%03d" % (i - 1), b"behind"))  # behind the cursor: never seen
        if n == 0:
            puts.append((b"s199", b"ahead"))  # ahead of the cursor: may be seen
        dels = [b"s%03d" % (i + 4)] if n % 5 == 0 else []
        store.write(puts, dels)
        for k in dels:
            model.pop(k, None)
            deleted.add(k)
        model.update(puts)
        inserted.update(k for k, _ in puts)
    assert seen == sorted(set(seen))
    for key in start:
        if key not in deleted:
            assert seen.count(key) == 1, key
    assert set(seen) <= set(start) | inserted
    assert not any(k.endswith(b"1") or k.endswith(b"3") for k in seen if k != b"s199")
    assert dict(store.scan(b"")) == model
    assert store.get(b"s000") == b"upd" and store.get(b"s198") == b"upd"
    assert store.get(b"s199") in (b"ahead", b"upd") and store.get(b"t000") == b"other prefix"
    assert store.get(b"s007") == b"behind"


def test_scan_while_deleting_everything(store: MetaStore) -> None:
    store.write((b"d%02d" % i, b"") for i in range(20))
    seen = []
    for key, _ in store.scan(b"d"):
        seen.append(key)
        store.write(deletes=[key])
    assert seen == [b"d%02d" % i for i in range(20)]
    assert list(store.scan(b"d")) == []


def test_abandoned_scan_does_not_block_writes(store: MetaStore) -> None:
    store.write((b"a%d" % i, b"") for i in range(10))
    it = store.scan(b"a")
    assert next(it)[0] == b"a0"
    store.write([(b"a99", b"x")], deletes=[b"a5"])
    del it
    assert store.get(b"a99") == b"x"
    assert len(list(store.scan(b"a"))) == 10


def test_rocksdb_data_survives_close_and_reopen(tmp_path: Path) -> None:
    def engine() -> MetaStore:
        return open_metastore(f"rocksdb://{tmp_path}/db")

    store = engine()
    store.write([(b"i" + U64.pack(n), b"v%d" % n) for n in range(1000)])
    store.write([(b"x", b"1"), (b"y", b"2")], deletes=[b"i" + U64.pack(500)])
    # a suspended scan must not keep the database open after close
    it = store.scan(b"i")
    next(it)
    del it
    store.close()
    again = engine()
    assert again.get(b"x") == b"1"
    assert again.get(b"i" + U64.pack(500)) is None
    assert again.get(b"i" + U64.pack(999)) == b"v999"
    assert len(list(again.scan(b"i"))) == 999
    again.write(deletes=[b"x"])
    again.close()
    third = engine()
    try:
        assert third.get(b"x") is None and third.get(b"y") == b"2"
    finally:
        third.close()


def test_sync_option(tmp_path: Path) -> None:
    store = open_metastore(f"rocksdb://{tmp_path}/s", sync=True)
    try:
        store.write([(b"a", b"b")])
        assert store.get(b"a") == b"b"
    finally:
        store.close()


def test_the_rocksdb_directory_is_the_masters_alone(tmp_path) -> None:
    path = tmp_path / "meta"
    path.mkdir(mode=0o755)
    store = open_metastore(f"rocksdb://{path}")
    try:
        assert (path.stat().st_mode & 0o777) == 0o700
    finally:
        store.close()


def test_write_many_applies_batches_in_order(store: MetaStore) -> None:
    store.write_many([([(b"k", b"1"), (b"j", b"1")], []), ([], [b"k"]), ([(b"j", b"2")], [])])
    assert store.get(b"k") is None and store.get(b"j") == b"2"
    store.write_many([([], [b"j"]), ([(b"j", b"3")], [b"x"])])
    assert store.get(b"j") == b"3"


def test_reads_see_every_write_through_the_read_cache(store: MetaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """RocksDB reads go through a cache of values and of absent keys (a small one here, so that
    it also fills and starts over): against a dict model, 3,000 random reads, puts, deletes and
    multi-batch writes of 40 keys never read a value other than the last one written."""
    monkeypatch.setattr(RocksMetaStore, "CACHE_ENTRIES", 16)
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    names = [b"k%02d" % i for i in range(40)]
    for step in range(3000):
        key = rng.choice(names)
        roll = rng.random()
        if roll < 0.5:
            assert store.get(key) == model.get(key), (step, key)
        elif roll < 0.7:
            value = b"v%d" % step
            store.write([(key, value)])
            model[key] = value
        elif roll < 0.85:
            store.write(deletes=[key])
            model.pop(key, None)
        else:
            other = rng.choice(names)
            store.write_many([([(key, b"a%d" % step)], [other]), ([(other, b"b%d" % step)], [key])])
            model.pop(key, None)  # (the same key twice: a put wins over a delete in one batch)
            model[other] = b"b%d" % step
    assert {k: store.get(k) for k in names} == {k: model.get(k) for k in names}
    assert dict(store.scan(b"k")) == model


def test_the_read_cache_holds_small_values_and_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    """An inode with large xattrs is not cached (a tenant filling its inodes with 126 KiB of
    xattrs grew the master by their size), and what is cached stays under ``CACHE_BYTES``."""
    store = RocksMetaStore(str(tmp_path / "db"))
    try:
        big = b"x" * (RocksMetaStore.CACHE_VALUE_BYTES + 1)
        store.write([(b"big", big)])
        assert store.get(b"big") == big and b"big" not in store._cache
        small = b"y" * 1000
        store.write([(b"s%06d" % i, small) for i in range(40_000)])  # 40 MB of reads
        for i in range(40_000):
            assert store.get(b"s%06d" % i) == small
            assert store._cache_bytes <= RocksMetaStore.CACHE_BYTES
        assert 0 < len(store._cache) <= RocksMetaStore.CACHE_BYTES // 1000
        store.write(deletes=[b"s039999"])
        assert store.get(b"s039999") is None
        assert store._cache_bytes == sum(len(k) + len(v or b"") for k, v in store._cache.items())
    finally:
        store.close()
