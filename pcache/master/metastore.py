"""Metastore contract and its engines, picked by URI scheme.

The master keeps its namespace and block map in an ordered key-value store.
Every mutation is one atomic batch (:meth:`MetaStore.write`): after it returns
the change survives ``kill -9`` of the master (the RocksDB WAL is in the OS
page cache; with ``sync=True`` it also survives power loss).

Engines: ``memory://`` (tests, throw-away clusters) and ``rocksdb:///path``
(``rocksdict``). The shape follows JuiceFS ``pkg/meta`` engines.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator
from typing import Protocol
from urllib.parse import urlparse

from pcache.common.errors import Busy, InvalidArgument, PCacheError


class MetaStore(Protocol):
    """An ordered byte-key store with atomic multi-key writes."""

    def get(self, key: bytes) -> bytes | None:
        """Return the value of ``key``, or None."""
        ...

    def scan(self, prefix: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) pairs with ``prefix`` in key order, after ``start_after``."""
        ...

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (), deletes: Iterable[bytes] = ()) -> None:
        """Apply puts and deletes as one atomic batch."""
        ...

    def write_many(self, batches: Iterable[tuple[Iterable[tuple[bytes, bytes]], Iterable[bytes]]]) -> None:
        """Apply several (puts, deletes) batches in order as one atomic batch (a follower's group)."""
        ...

    def close(self) -> None:
        """Flush and release the store."""
        ...


def _bytes(data: bytes) -> bytes:
    """Copy a bytes-like object; refuse str and int (``bytes(5)`` would be five NULs)."""
    return bytes(memoryview(data))


class MemoryMetaStore:
    """In-process engine: a dict plus a sorted key list. Not durable."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def scan(self, prefix: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        if start_after is not None and start_after >= prefix:
            i = bisect.bisect_right(self._keys, start_after)
        else:
            i = bisect.bisect_left(self._keys, prefix)
        while i < len(self._keys):
            key = self._keys[i]
            if not key.startswith(prefix):
                return
            value = self._data.get(key)
            if value is not None:
                yield key, value
            # the list may change under a lazy consumer: find our place again
            i = bisect.bisect_right(self._keys, key)

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (), deletes: Iterable[bytes] = ()) -> None:
        # convert everything first: a bad item must fail the batch before any of it applies
        puts = [(_bytes(key), _bytes(value)) for key, value in puts]
        deletes = [_bytes(key) for key in deletes]
        for key in deletes:
            if self._data.pop(key, None) is not None:
                del self._keys[bisect.bisect_left(self._keys, key)]
        for key, value in puts:
            if key not in self._data:
                bisect.insort(self._keys, key)
            self._data[key] = value

    def write_many(self, batches: Iterable[tuple[Iterable[tuple[bytes, bytes]], Iterable[bytes]]]) -> None:
        for puts, deletes in batches:
            self.write(puts, deletes)

    def close(self) -> None:
        pass


class RocksMetaStore:
    """RocksDB engine (``rocksdict``); one WriteBatch per mutation.

    Point reads go through a bounded cache of values (and of absent keys) in front of RocksDB:
    resolving ``/a/b/c`` reads seven keys, and a RocksDB get through ``rocksdict`` costs about
    as much as the rest of a ``stat``. Every write goes through :meth:`write_many`, which drops
    the keys it touches, and only the master's event-loop thread uses a store, so the cache
    never answers with a value older than the database's. It holds values of up to
    ``CACHE_VALUE_BYTES`` (an inode with large xattrs or a long block list is read from
    RocksDB each time) and at most ``CACHE_BYTES`` of them; full, it starts over.
    """

    CACHE_ENTRIES = 65_536
    CACHE_BYTES = 16 << 20  # of keys and values (a tenant's 126 KiB xattrs on every inode cannot grow it)
    CACHE_VALUE_BYTES = 4096

    def __init__(self, path: str, *, sync: bool = False) -> None:
        import rocksdict

        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # the namespace (names, xattrs, tenants later) is the master's alone
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        self._rd = rocksdict
        try:
            self._db = rocksdict.Rdict(path, opts)
        except Exception as exc:  # rocksdict raises a bare Exception ("IO error: ... LOCK: ...")
            if "LOCK" in str(exc):
                raise Busy(
                    f"the metastore {path} is in use by another process (its RocksDB LOCK is held):"
                    " another master runs on this data directory"
                ) from exc
            raise PCacheError(f"cannot open the metastore {path}: {exc}") from exc
        self._wopts = rocksdict.WriteOptions()
        self._wopts.sync = sync
        self._cache: dict[bytes, bytes | None] = {}
        self._cache_bytes = 0

    def get(self, key: bytes) -> bytes | None:
        if type(key) is not bytes:
            key = _bytes(key)
        try:
            return self._cache[key]
        except KeyError:
            pass
        value = self._db.get(key)
        size = len(key) + (len(value) if value is not None else 0)
        if size > self.CACHE_VALUE_BYTES:
            return value
        if len(self._cache) >= self.CACHE_ENTRIES or self._cache_bytes + size > self.CACHE_BYTES:
            self._cache.clear()
            self._cache_bytes = 0
        self._cache[key] = value
        self._cache_bytes += size
        return value

    def scan(self, prefix: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        start = prefix if start_after is None or start_after < prefix else start_after
        it.seek(start)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            if start_after is None or key > start_after:
                yield key, it.value()
            it.next()

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (), deletes: Iterable[bytes] = ()) -> None:
        self.write_many([(puts, deletes)])

    def write_many(self, batches: Iterable[tuple[Iterable[tuple[bytes, bytes]], Iterable[bytes]]]) -> None:
        batch = self._rd.WriteBatch(raw_mode=True)
        touched: list[bytes] = []
        for puts, deletes in batches:
            for key in deletes:
                touched.append(key := _bytes(key))
                batch.delete(key)
            for key, value in puts:
                touched.append(key := _bytes(key))
                batch.put(key, _bytes(value))
        try:
            self._db.write(batch, self._wopts)
        finally:  # written or not, the database answers for these keys from now on
            for key in touched:
                if key in self._cache:
                    cached = self._cache.pop(key)
                    self._cache_bytes -= len(key) + (len(cached) if cached is not None else 0)

    def checkpoint(self, dest: str) -> None:
        """Write a consistent copy of the store to the new directory ``dest`` (RocksDB Checkpoint:
        hard links to the SST files plus the live WAL; cheap, and a full database on its own)."""
        self._rd.Checkpoint(self._db).create_checkpoint(dest)

    def close(self) -> None:
        self._db.close()


def open_metastore(uri: str, *, sync: bool = False) -> MetaStore:
    """Open the engine named by ``uri``: ``memory://`` or ``rocksdb:///abs/path``.

    Raises:
        InvalidArgument: unknown scheme or missing path.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "memory":
        return MemoryMetaStore()
    if parsed.scheme == "rocksdb":
        path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
        if not path:
            raise InvalidArgument(f"metastore URI has no path: {uri}")
        return RocksMetaStore(path, sync=sync)
    raise InvalidArgument(f"unknown metastore scheme in {uri!r} (memory://, rocksdb:///path)")
