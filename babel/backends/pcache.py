"""``pcache://HOST:PORT/dir`` as an object store: keys are file paths under ``/dir`` of a PCache cluster.

No host means ``$PCACHE_MASTER`` (as ``ckpt_adapter.uri``). One async
:class:`~pcache.client.PCacheClient` per store, made on first use (it binds to the
running event loop) and closed by :meth:`PCacheStore.close`; its metadata cache is
off, so ``head`` and listings always ask the master.

* **Listing** is the shared tree walk of :mod:`objstore.tree`. A directory's
  names are read page by page and cached while its mtime stays the same (every
  create, rename and delete in it sets that); the files of a page are stat-ed
  fresh with one ``ListDir`` page from just before the first of them, so a listing
  page costs a few RPCs, not one per key. Only regular files are objects
  (symlinks are not followed).
* **Metadata**: :data:`META_MTIME` is the file's mtime (``repr`` of the master's
  double: ``float()`` gives it back exactly), :data:`META_CRC32C` the xattr
  ``user.babel-crc32c``. Both are in listings too: the master's directory pages
  carry whole inodes. Reading inodes goes through the client's control-plane stub
  (``client.master``) because :class:`~pcache.client.FileStat` has no xattrs.
* **put** writes a hidden temporary sibling (``.NAME.babel-TOKEN``), commits it at
  close, sets mtime and xattr, and renames it into place: a failed put leaves no
  partial object. ``delete`` leaves directories that become empty (an S3 listing
  would show nothing for them either).
* **Multipart**: PCache files are copy-on-write and committed at close, so the
  parts of one upload are ``pwrite``-n through one :class:`~pcache.client.PCacheFile`
  held by the store, concurrently (``PCacheFile.pwrite`` never touches the shared
  position and loads a block's old bytes once). The file's block size is the part size when PCache allows
  it (64 KiB..1 GiB), so every part is exactly one block, sent to the workers as
  soon as it is written and never read back. ``complete_multipart`` commits
  (close), sets the metadata and renames into place. The handle dies with the
  process: ``resumable_uploads`` is False, and :meth:`close` aborts open uploads.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlparse

from babel.errors import AccessDenied, BabelError, BadURI, NoSuchBucket, NoSuchKey, NoSuchUpload, TransientError
from objstore.base import META_CRC32C, META_MTIME, META_SRC_ETAG, ListPage, ObjectInfo, PartInfo, StoreLimits
from objstore.tree import (
    XATTR_CRC32C,
    XATTR_SRC_ETAG,
    DirCache,
    Entries,
    check_delimiter,
    check_key,
    check_parts,
    file_in_the_way,
    file_metadata,
    is_temp_of,
    is_token,
    new_token,
    parse_mtime,
    part_range,
    plan_page,
    run_plan_async,
    sort_entries,
    temp_name,
)
from pcache.client import PCacheClient, PCacheFile
from pcache.common.config import ClientConfig
from pcache.common.errors import (
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    PCacheError,
    PermissionDenied,
)
from pcache.common.layout import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from pcache.common.paths import normalize
from pcache.proto import pcache_pb2 as pb

T = TypeVar("T")

STAT_PAGES = 4  # ListDir pages one StatFiles answer reads before stat-ing the rest one by one
DELETE_CONCURRENCY = 32

ERRORS_BY_TYPE: list[tuple[type[PCacheError], type[BabelError]]] = [
    (NotFound, NoSuchKey),
    (PermissionDenied, AccessDenied),
    (InvalidPath, BadURI),
]


def translate(exc: PCacheError, uri: str) -> BabelError:
    """Map a PCache failure to the Babel error it stands for (retryable ones to TransientError)."""
    for pcache_type, babel_type in ERRORS_BY_TYPE:
        if isinstance(exc, pcache_type):
            return babel_type(str(exc), uri=uri)
    cls = TransientError if exc.retryable else BabelError
    return cls(f"{type(exc).__name__}: {exc}", uri=uri)


def parse_uri(uri: str) -> tuple[str, str]:
    """``pcache://host:port/a/b`` -> (``host:port``, ``/a/b``).

    Raises:
        BadURI: a bad path (``..``, ``//`` inside, over 32 KiB).
    """
    parsed = urlparse(uri)
    master = parsed.netloc or ClientConfig().master
    try:
        return master, normalize(parsed.path or "/")
    except InvalidPath as exc:
        raise BadURI(f"bad pcache:// path: {exc}", uri=uri) from exc


@dataclass
class _Upload:
    """One multipart upload in progress: its open temporary file."""

    key: str
    tmp: str
    size: int
    part_size: int
    metadata: dict[str, str]
    file: PCacheFile
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written: set[int] = field(default_factory=set)


class PCacheStore:
    """Object-store view of one directory of a PCache cluster."""

    def __init__(self, uri: str, master: str, root: str) -> None:
        self.uri = uri
        self.master = master
        self.root = root
        self.limits = StoreLimits(
            min_part_size=MIN_BLOCK_SIZE, max_part_size=MAX_BLOCK_SIZE, max_parts=100_000, resumable_uploads=False
        )
        self._client: PCacheClient | None = None
        self._dirs = DirCache()
        self._uploads: dict[str, _Upload] = {}

    def _c(self) -> PCacheClient:
        if self._client is None:
            self._client = PCacheClient(ClientConfig(master=self.master, metadata_ttl=0.0))
        return self._client

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, check_key(key, self.uri))

    def _temp_path(self, key: str, token: str) -> str:
        head, name = posixpath.split(self._path(key))
        return posixpath.join(head, temp_name(name, token))

    async def _call(self, uri: str, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except PCacheError as exc:
            raise translate(exc, uri) from exc

    def _info(self, key: str, node: pb.Inode) -> ObjectInfo:
        meta = file_metadata(repr(node.mtime), node.xattrs.get(XATTR_CRC32C), node.xattrs.get(XATTR_SRC_ETAG))
        return ObjectInfo(key, node.size, node.mtime, "", meta)

    # ------------------------------------------------------------ listing --

    async def _read_dir(self, rel: str) -> Entries:
        master = self._c().master
        path = posixpath.join(self.root, rel.rstrip("/"))
        try:
            node = await master.stat(path)
        except (NotFound, NotADirectory):
            return []
        if node.type != pb.DIRECTORY:
            return []
        version = (node.id, node.mtime)
        entries = self._dirs.get(path, version)
        if entries is None:
            found: list[tuple[str, bool]] = []
            after = ""
            while True:
                page = await master.listdir(path, start_after=after)
                found += [(e.name, e.type == pb.DIRECTORY) for e in page.entries]
                if not page.truncated or not page.entries:
                    break
                after = page.entries[-1].name
            entries = sort_entries(found)
            self._dirs.put(path, version, entries)
        return entries

    async def _stat_files(self, rel: str, names: Sequence[str]) -> list[ObjectInfo | None]:
        """Fresh inodes of ``names`` (files in key order, so a run of the raw directory order)."""
        master = self._c().master
        path = posixpath.join(self.root, rel.rstrip("/"))
        wanted = set(names)
        nodes: dict[str, pb.Inode] = {}
        after = names[0][:-1]  # sorts just before names[0]
        to_end = False  # the pages reached the end of the directory
        for _ in range(STAT_PAGES):
            try:
                page = await master.listdir(path, start_after=after)
            except (NotFound, NotADirectory):
                return [None] * len(names)
            nodes.update((e.name, e) for e in page.entries if e.name in wanted)
            if not page.truncated or not page.entries:
                to_end = True
                break
            after = page.entries[-1].name
            if after >= names[-1]:
                break
        # names the pages passed over are gone; those beyond the last page are stat-ed one by one
        rest = [] if to_end else [n for n in names if n not in nodes and n > after]

        async def one(name: str) -> None:
            try:
                nodes[name] = await master.stat(posixpath.join(path, name))
            except (NotFound, NotADirectory):
                pass

        await asyncio.gather(*(one(n) for n in rest))
        out: list[ObjectInfo | None] = []
        for name in names:
            node = nodes.get(name)
            out.append(self._info(rel + name, node) if node is not None and node.type == pb.REGULAR else None)
        return out

    async def check_destination(self) -> None:
        """Refuse a destination that is a file, or lies under one (every object failed alone,
        NotADirectory each, where ``file://`` gave one fatal line).

        Raises:
            BabelError: a file is in the way.
        """
        where = self.root
        while True:
            try:
                node = await self._c().master.stat(where)
                break
            except (NotFound, NotADirectory):  # not there, or under a file: look above
                if where in ("/", ""):
                    return
                where = posixpath.dirname(where.rstrip("/")) or "/"
            except PCacheError as exc:
                raise translate(exc, self.uri) from exc
        if node.type != pb.DIRECTORY:
            raise file_in_the_way(where, self.root, self.uri)

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        check_delimiter(delimiter, self.uri)
        try:
            root: pb.Inode | None = await self._c().master.stat(self.root)
        except (NotFound, NotADirectory):
            root = None
        except PCacheError as exc:
            raise translate(exc, self.uri) from exc
        if root is None or root.type != pb.DIRECTORY:
            raise NoSuchBucket("no such directory", uri=self.uri)
        plan = plan_page(prefix, delimiter, start_after, max_keys)
        return await self._call(self.uri, lambda: run_plan_async(plan, self._read_dir, self._stat_files))

    # ------------------------------------------------------------ objects --

    async def head(self, key: str) -> ObjectInfo:
        path, uri = self._path(key), f"{self.uri}/{key}"
        try:
            node = await self._c().master.stat(path)
        except (NotFound, NotADirectory) as exc:
            raise NoSuchKey("no such object", uri=uri) from exc
        except PCacheError as exc:
            raise translate(exc, uri) from exc
        if node.type != pb.REGULAR:
            raise NoSuchKey("no such object", uri=uri)
        return self._info(key, node)

    async def get(self, key: str, offset: int = 0, length: int | None = None, *, if_match: str = "") -> bytes:
        path, uri = self._path(key), f"{self.uri}/{key}"
        try:
            f = await self._c().open(path, "rb")
            try:
                return await f.pread(offset, max(0, f.size - offset) if length is None else length)
            finally:
                await f.close()
        except (NotFound, NotADirectory, IsADirectory) as exc:
            raise NoSuchKey("no such object", uri=uri) from exc
        except PCacheError as exc:
            raise translate(exc, uri) from exc

    async def _create(self, path: str, block_size: int = 0) -> PCacheFile:
        """Open a new file for writing, making its parent directories when missing."""
        client = self._c()
        try:
            return await client.open(path, "xb", block_size=block_size)
        except NotFound:
            await client.mkdir(posixpath.dirname(path), parents=True)
            return await client.open(path, "xb", block_size=block_size)

    async def _publish(self, tmp: str, path: str, metadata: dict[str, str]) -> pb.Inode:
        """Set metadata of the committed ``tmp`` and rename it to ``path``; return its inode."""
        client = self._c()
        mtime = parse_mtime(metadata[META_MTIME]) if META_MTIME in metadata else None
        xattrs = {
            xattr: metadata[meta].encode("ascii", "replace")
            for meta, xattr in ((META_CRC32C, XATTR_CRC32C), (META_SRC_ETAG, XATTR_SRC_ETAG))
            if meta in metadata
        } or None
        if mtime is not None or xattrs:
            await client.setattr(tmp, mtime=mtime, set_xattrs=xattrs)
        await client.rename(tmp, path)
        return await client.master.stat(path)

    async def _discard(self, tmp: str, f: PCacheFile | None = None) -> None:
        """Best effort: drop an unfinished temporary file."""
        try:
            if f is not None:
                await f.abort()
            await self._c().unlink(tmp)
        except OSError:
            pass

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        path, uri = self._path(key), f"{self.uri}/{key}"
        tmp = self._temp_path(key, new_token())
        f: PCacheFile | None = None
        try:
            f = await self._create(tmp)
            await f.write(data)
            await f.close()  # the commit: bytes are on the workers
            return self._info(key, await self._publish(tmp, path, metadata or {}))
        except BaseException as exc:
            await asyncio.shield(self._discard(tmp, f))
            if isinstance(exc, PCacheError):
                raise translate(exc, uri) from exc
            raise

    async def delete(self, keys: list[str]) -> None:
        client = self._c()
        paths = [self._path(key) for key in keys]
        slots = asyncio.Semaphore(DELETE_CONCURRENCY)

        async def one(path: str) -> None:
            async with slots:
                try:
                    await client.unlink(path)
                except (NotFound, NotADirectory, IsADirectory):
                    pass  # missing; a directory is no object either

        await self._call(self.uri, lambda: asyncio.gather(*(one(p) for p in paths)))

    # ---------------------------------------------------------- multipart --

    def _upload(self, key: str, upload_id: str) -> _Upload:
        upload = self._uploads.get(upload_id)
        if upload is None or upload.key != key:
            raise NoSuchUpload("no such upload (completed, aborted, or made by another process)", uri=self.uri)
        return upload

    async def create_multipart(self, key: str, size: int, part_size: int, metadata: dict[str, str]) -> str:
        uri = f"{self.uri}/{key}"
        if size < 0 or part_size < 1:
            raise BabelError(f"bad multipart upload: {size} bytes in parts of {part_size}", uri=uri)
        upload_id = new_token()
        tmp = self._temp_path(key, upload_id)
        block_size = part_size if MIN_BLOCK_SIZE <= part_size <= MAX_BLOCK_SIZE else 0
        f = await self._call(uri, lambda: self._create(tmp, block_size))
        self._uploads[upload_id] = _Upload(key, tmp, size, part_size, dict(metadata), f)
        return upload_id

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
        uri = f"{self.uri}/{key}"
        upload = self._upload(key, upload_id)
        offset, length = part_range(upload.size, upload.part_size, number)
        if number < 1 or len(data) != length or not length:
            raise BabelError(f"part {number} has {len(data)} bytes, the upload wants {length}", uri=uri)
        # parts go in concurrently (PCacheFile.pwrite is position-free); complete/abort take the lock
        await self._call(uri, lambda: upload.file.pwrite(data, offset))
        if self._uploads.get(upload_id) is not upload:
            raise NoSuchUpload("upload completed or aborted meanwhile", uri=uri)
        upload.written.add(number)
        return PartInfo(number, len(data))

    async def complete_multipart(self, key: str, upload_id: str, parts: list[PartInfo]) -> ObjectInfo:
        uri = f"{self.uri}/{key}"
        upload = self._upload(key, upload_id)
        check_parts(upload.size, upload.part_size, parts, uri)
        async with upload.lock:
            missing = {p.number for p in parts} - upload.written
            if missing:
                raise BabelError(f"parts {sorted(missing)[:5]} were never uploaded", uri=uri)
            del self._uploads[upload_id]
            try:
                await upload.file.close()
                node = await self._publish(upload.tmp, self._path(key), upload.metadata)
            except BaseException as exc:
                await asyncio.shield(self._discard(upload.tmp, upload.file))
                if isinstance(exc, PCacheError):
                    raise translate(exc, uri) from exc
                raise
        return self._info(key, node)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort an upload of this process, or drop the temporary file of another's (a killed
        run's, named by its journal: ``babel clean``, a resume)."""
        upload = self._uploads.get(upload_id)
        if upload is None or upload.key != key:
            if is_token(upload_id):  # no path in it
                await self._discard(self._temp_path(key, upload_id))
            return
        async with upload.lock:
            if self._uploads.pop(upload_id, None) is upload:
                await asyncio.shield(self._discard(upload.tmp, upload.file))

    async def remove_temp_files(self, keys: Iterable[str]) -> tuple[int, int]:
        """Delete the temporary files of uploads of ``keys`` (``.NAME.babel-TOKEN`` next to each:
        what a killed run had in flight, never listed); returns (files, bytes)."""
        client = self._c()
        files = nbytes = 0
        for key in keys:
            head, name = posixpath.split(self._path(key))
            try:
                entries = [e async for e in client.scandir(head)]
            except (NotFound, NotADirectory):
                continue
            for entry in entries:
                if entry.kind == "file" and is_temp_of(entry.name, name):
                    with contextlib.suppress(NotFound):
                        await client.unlink(entry.path)
                        files, nbytes = files + 1, nbytes + entry.size
        return files, nbytes

    async def close(self) -> None:
        for upload_id, upload in list(self._uploads.items()):
            await self.abort_multipart(upload.key, upload_id)
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
