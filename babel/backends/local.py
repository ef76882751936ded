"""``file:///dir`` as an object store: keys are file paths relative to ``dir``.

Listing walks the tree in S3 key order (a directory sorts as ``name/``, so
``dir-1.txt`` comes before ``dir/a``), prunes subtrees that lie entirely at or
before ``start_after``, and folds subdirectories into common prefixes when a
``/`` delimiter is given. Blocking file-system calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import stat as stat_mod
from collections.abc import Iterator

from babel.backends.base import ListPage, ObjectInfo
from babel.errors import BadURI, NoSuchBucket, NoSuchKey


class LocalStore:
    """Object-store view of a local directory."""

    def __init__(self, uri: str, root: str) -> None:
        if not root.startswith("/"):
            raise BadURI("file:// URIs need an absolute path", uri=uri)
        self.uri = uri
        self.root = os.path.normpath(root)
        self._dir_cache: dict[str, tuple[int, list[tuple[str, bool]]]] = {}

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or "\x00" in key or ".." in key.split("/"):
            raise BadURI(f"key {key!r} cannot be a file path", uri=self.uri)
        return os.path.join(self.root, key)

    # ------------------------------------------------------------ listing --

    def _entries(self, path: str) -> list[tuple[str, bool]]:
        """Sorted (name, or name + '/' for a directory; is_dir) of ``path``, cached until it changes.

        Paging through a flat directory of N files would otherwise rescan and re-sort all N
        entries for every page of 1000.
        """
        try:
            mtime = os.stat(path).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            return []
        cached = self._dir_cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        with os.scandir(path) as it:
            entries = sorted((e.name + "/", True) if e.is_dir(follow_symlinks=False) else (e.name, False) for e in it)
        if len(self._dir_cache) > 4096:
            self._dir_cache.clear()
        self._dir_cache[path] = (mtime, entries)
        return entries

    def _walk(self, rel: str, after: str, prefix: str) -> Iterator[tuple[str, os.stat_result | None]]:
        """Yield (key, stat) of files and (``dir/`` key, None) of directories, in key order,
        skipping subtrees that lie entirely at or before ``after`` or before ``prefix``."""
        path = os.path.join(self.root, rel) if rel else self.root
        entries = self._entries(path)
        # entries sorting before both bounds cannot match: start at the later of them
        floor = max(after, prefix)[len(rel) :] if max(after, prefix).startswith(rel) else ""
        start = bisect.bisect_left(entries, (floor[: floor.find("/") + 1] if "/" in floor else floor, False))
        for sort_name, is_dir in entries[max(0, start - 1) :]:
            key = rel + sort_name
            if is_dir:
                if key <= after and not after.startswith(key):
                    continue
                if key < prefix and not prefix.startswith(key):
                    continue
                yield key, None
                yield from self._walk(key, after, prefix)
            elif key > after:
                try:
                    st = os.stat(os.path.join(path, sort_name))
                except FileNotFoundError:
                    continue  # deleted since the directory was read
                if stat_mod.S_ISREG(st.st_mode):
                    yield key, st

    def _list(self, prefix: str, delimiter: str | None, start_after: str, max_keys: int) -> ListPage:
        if not os.path.isdir(self.root):
            raise NoSuchBucket("no such directory", uri=self.uri)
        if delimiter not in (None, "", "/"):
            raise BadURI(f"file:// listings support only the '/' delimiter, not {delimiter!r}", uri=self.uri)
        base = prefix[: prefix.rfind("/") + 1]  # the directory the prefix points into
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        folded = ""  # a common prefix whose keys are folded away
        for key, entry in self._walk(base, start_after, prefix):
            if not key.startswith(prefix):
                if key > prefix:
                    break  # key order: nothing further can match
                continue
            if folded and key.startswith(folded):
                continue
            if entry is None:
                if delimiter == "/" and key != prefix:
                    folded = key
                    if key > start_after:
                        prefixes.append(key)
                    else:
                        continue
                else:
                    continue
            else:
                objects.append(ObjectInfo(key, entry.st_size, entry.st_mtime))
            if len(objects) + len(prefixes) >= max_keys:
                return ListPage(objects, prefixes, truncated=True)
        return ListPage(objects, prefixes, truncated=False)

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        return await asyncio.to_thread(self._list, prefix, delimiter, start_after, max_keys)

    # ------------------------------------------------------------ objects --

    async def head(self, key: str) -> ObjectInfo:
        try:
            st = await asyncio.to_thread(os.stat, self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchKey("no such object", uri=f"{self.uri}/{key}") from None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        def read() -> bytes:
            with open(self._path(key), "rb") as fh:
                fh.seek(offset)
                return fh.read() if length is None else fh.read(length)

        try:
            return await asyncio.to_thread(read)
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchKey("no such object", uri=f"{self.uri}/{key}") from None

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        path = self._path(key)

        def write() -> ObjectInfo:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.babel-part"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # readers never see a half-written object
            st = os.stat(path)
            return ObjectInfo(key, st.st_size, st.st_mtime)

        return await asyncio.to_thread(write)

    async def delete(self, keys: list[str]) -> None:
        def remove() -> None:
            for key in keys:
                try:
                    os.unlink(self._path(key))
                except FileNotFoundError:
                    pass

        await asyncio.to_thread(remove)

    async def close(self) -> None:
        pass
