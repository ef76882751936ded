"""``file:///dir`` as an object store: keys are file paths relative to ``dir``.

Listing is the shared tree walk of :mod:`objstore.tree` (S3 key order,
``start_after`` pruning, ``/`` folding), run one page per worker thread; every
blocking file-system call runs in a worker thread. Directory listings are cached
while the directory's mtime stays the same, except for directories changed within
the last :data:`RACY_NS` (file-system clocks tick coarsely: a file created in the
same tick as the cached listing would leave the mtime unchanged).

Metadata: :data:`META_MTIME` sets the file's mtime (ns exact) and is reported back
from it; :data:`META_CRC32C` is kept in the extended attribute
``user.babel-crc32c`` (silently dropped where the file system has no user xattrs).
Listings report both, at the cost of one ``getxattr`` per listed file, so a planner
comparing checksums needs no ``head``. Other metadata keys are not kept.

Writes are atomic: ``put`` writes a hidden temporary sibling
(``.NAME.babel-TOKEN``) and renames it into place. A multipart upload is such a
temporary file, sized at ``create_multipart``, into which parts are ``pwrite``-n at
their offsets and fsynced; ``complete_multipart`` renames it into place. The upload
id carries everything else (token, sizes, metadata), so a new process resumes an
upload with nothing but its id.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import json
import os
import re
import stat as stat_mod
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from objstore.base import (
    META_CRC32C,
    META_MTIME,
    META_SRC_ETAG,
    GiB,
    ListPage,
    ObjectInfo,
    PartInfo,
    StoreLimits,
    object_uri,
)
from objstore.errors import (
    AccessDenied,
    BadURI,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    PreconditionFailed,
    StoreError,
)
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
    format_mtime_ns,
    is_temp_of,
    new_token,
    parse_mtime_ns,
    part_range,
    plan_page,
    run_plan,
    sort_entries,
    temp_name,
)

RACY_NS = 1_000_000_000  # a directory changed this recently is not cached (coarse fs timestamps)
NO_XATTRS = (errno.ENOTSUP, errno.EOPNOTSUPP)
_GONE = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


class _Link(FileNotFoundError):
    """A key that is a symbolic link: no object."""


_TOKEN = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class _Upload:
    """What a ``file://`` upload id carries."""

    token: str
    size: int
    part_size: int
    metadata: dict[str, str]

    def encode(self) -> str:
        blob = json.dumps([self.size, self.part_size, self.metadata], separators=(",", ":")).encode()
        return f"{self.token}.{base64.urlsafe_b64encode(blob).decode().rstrip('=')}"

    @classmethod
    def decode(cls, upload_id: str, uri: str) -> _Upload:
        """Raises NoSuchUpload for an id this backend did not make."""
        try:
            token, blob = upload_id.split(".", 1)
            size, part_size, metadata = json.loads(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
            if not _TOKEN.fullmatch(token) or not isinstance(metadata, dict):
                raise ValueError(token)
            return cls(token, int(size), int(part_size), {str(k): str(v) for k, v in metadata.items()})
        except (ValueError, TypeError, binascii.Error) as exc:
            raise NoSuchUpload(f"not a file:// upload id: {upload_id!r}", uri=uri) from exc


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def weak_etag(st: os.stat_result) -> str:
    """The version tag of a file, which has no ETag: ``W/<size hex>-<mtime ns>`` (a weak ETag, as
    nginx's). A rewrite that keeps both size and mtime (within the file system's mtime
    resolution) is not told apart."""
    return f"W/{st.st_size:x}-{st.st_mtime_ns}"


class LocalStore:
    """Object-store view of a local directory.

    Symbolic links inside the tree are not objects: listing skips them (as rclone does without
    ``--copy-links``), reading one is NoSuchKey, and a read or write whose directory resolves
    outside the tree (a symlinked subdirectory) is refused with AccessDenied, so a link planted
    in a source or a destination never leads a sync out of it. The root itself may be a link.
    """

    def __init__(self, uri: str, root: str) -> None:
        if not root.startswith("/"):
            raise BadURI("file:// URIs need an absolute path", uri=uri)
        self.uri = uri
        self.root = os.path.normpath(root)
        self.limits = StoreLimits(min_part_size=1, max_part_size=5 * GiB, max_parts=10_000_000, resumable_uploads=True)
        self._dirs = DirCache()
        self.not_files: dict[str, str] = {}  # listed entries that are no regular file: key -> kind

    def _path(self, key: str) -> str:
        return os.path.join(self.root, check_key(key, self.uri))

    async def check_destination(self) -> None:
        """Refuse a destination that is a file, or lies under one (it may not exist yet).

        Raises:
            StoreError: a file is in the way (every object would fail on its own otherwise).
        """
        where = self.root
        while not os.path.exists(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)  # the nearest existing ancestor: a file there blocks it too
        if not os.path.isdir(where):
            raise file_in_the_way(where, self.root, self.uri)

    def _inside(self, path: str) -> str:
        """``path`` if its directory resolves inside the tree (call after creating it).

        Raises:
            AccessDenied: a symlinked directory leads it out.
        """
        root = os.path.realpath(self.root)
        where = os.path.realpath(os.path.dirname(path))
        if where != root and not where.startswith(root.rstrip("/") + "/"):
            raise AccessDenied(f"a directory on the path is a symlink out of {self.root} (to {where})", uri=self.uri)
        return path

    def _temp_path(self, key: str, token: str) -> str:
        head, name = os.path.split(self._path(key))
        return os.path.join(head, temp_name(name, token))

    # ------------------------------------------------------------ listing --

    def _read_dir(self, rel: str) -> Entries:
        path = os.path.join(self.root, rel) if rel else self.root
        try:
            st = os.stat(path)
        except _GONE:
            return []
        if not stat_mod.S_ISDIR(st.st_mode):
            return []
        version = (st.st_ino, st.st_mtime_ns)
        entries = self._dirs.get(path, version)
        if entries is None:
            read_at = time.time_ns()
            with os.scandir(path) as it:
                entries = sort_entries([(e.name, e.is_dir(follow_symlinks=False)) for e in it])
            if read_at - st.st_mtime_ns > RACY_NS:
                self._dirs.put(path, version, entries)
        return entries

    def _stat_files(self, rel: str, names: Sequence[str]) -> list[ObjectInfo | None]:
        out: list[ObjectInfo | None] = []
        for name in names:
            path = os.path.join(self.root, rel, name)
            try:
                st = os.lstat(path)  # a symlink is no object: not S_ISREG below
            except _GONE:
                out.append(None)  # deleted since the directory was read
                continue
            if stat_mod.S_ISREG(st.st_mode):
                out.append(self._info(rel + name, path, st))
            else:
                out.append(None)
                if not stat_mod.S_ISDIR(st.st_mode):
                    self.not_files[rel + name] = _kind(st.st_mode)
        return out

    def _info(self, key: str, path: str, st: os.stat_result) -> ObjectInfo:
        found: list[bytes | None] = []
        for name in (XATTR_CRC32C, XATTR_SRC_ETAG):
            try:
                found.append(os.getxattr(path, name))
            except OSError:  # ENODATA: none; ENOTSUP: no user xattrs here; ENOENT: a race
                found.append(None)
        meta = file_metadata(format_mtime_ns(st.st_mtime_ns), *found)
        return ObjectInfo(key, st.st_size, st.st_mtime, "", meta)

    def _list(self, prefix: str, delimiter: str | None, start_after: str, max_keys: int) -> ListPage:
        if not os.path.isdir(self.root):
            what = "a file, not a directory" if os.path.exists(self.root) else "no such directory"
            raise NoSuchBucket(what, uri=self.uri)
        check_delimiter(delimiter, self.uri)
        return run_plan(plan_page(prefix, delimiter, start_after, max_keys), self._read_dir, self._stat_files)

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        return await asyncio.to_thread(self._list, prefix, delimiter, start_after, max_keys)

    # ------------------------------------------------------------ objects --

    async def head(self, key: str) -> ObjectInfo:
        path = self._path(key)

        def stat() -> ObjectInfo:
            st = os.lstat(self._inside(path))
            if not stat_mod.S_ISREG(st.st_mode):
                raise FileNotFoundError(path)
            return self._info(key, path, st)

        try:
            return await asyncio.to_thread(stat)
        except _GONE as exc:
            raise NoSuchKey("no such object", uri=object_uri(self.uri, key)) from exc

    async def get(self, key: str, offset: int = 0, length: int | None = None, *, if_match: str = "") -> bytes:
        """As the contract says; ``if_match`` here is a :func:`weak_etag` (files have no ETag): the
        file must have that size and mtime before and after the read, else PreconditionFailed."""
        path = self._path(key)

        def read() -> bytes:
            try:
                fd = os.open(self._inside(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _Link(path) from exc
                raise
            with open(fd, "rb") as fh:
                if if_match and weak_etag(os.fstat(fd)) != if_match:
                    raise PreconditionFailed("the file changed since it was listed", uri=object_uri(self.uri, key))
                fh.seek(offset)
                data = fh.read() if length is None else fh.read(length)
                if if_match and weak_etag(os.fstat(fd)) != if_match:
                    raise PreconditionFailed("the file changed while it was read", uri=object_uri(self.uri, key))
                return data

        try:
            return await asyncio.to_thread(read)
        except _GONE as exc:
            raise NoSuchKey("no such object", uri=object_uri(self.uri, key)) from exc

    def _apply_metadata(self, fd: int, metadata: dict[str, str] | None) -> None:
        """Set the mtime (atime too, as rclone) and the CRC32C and source-ETag xattrs of an open file."""
        metadata = metadata or {}
        for meta, xattr in ((META_CRC32C, XATTR_CRC32C), (META_SRC_ETAG, XATTR_SRC_ETAG)):
            if meta not in metadata:
                continue
            try:
                os.setxattr(fd, xattr, metadata[meta].encode("ascii", "replace"))
            except OSError as exc:
                if exc.errno not in NO_XATTRS:
                    raise
        if META_MTIME in metadata:
            ns = parse_mtime_ns(metadata[META_MTIME])
            os.utime(fd, ns=(ns, ns))  # after the last write: writing sets the mtime again

    def _publish(self, fd: int, tmp: str, path: str, metadata: dict[str, str] | None, *, sync: bool) -> None:
        self._apply_metadata(fd, metadata)
        if sync:
            os.fsync(fd)
        os.replace(tmp, path)  # readers never see a half-written object
        if sync:
            dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        path = self._path(key)
        tmp = self._temp_path(key, new_token())

        def write() -> ObjectInfo:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._inside(path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                _write_all(fd, data, 0)
                self._publish(fd, tmp, path, metadata, sync=False)
            except BaseException:
                _unlink(tmp)
                raise
            finally:
                os.close(fd)
            return self._info(key, path, os.stat(path))

        return await asyncio.to_thread(write)

    async def delete(self, keys: list[str]) -> None:
        paths = [self._path(key) for key in keys]

        def remove() -> None:
            for path in paths:
                _unlink(self._inside(path))  # a key naming a directory is no object either

        await asyncio.to_thread(remove)

    # ---------------------------------------------------------- multipart --

    async def create_multipart(self, key: str, size: int, part_size: int, metadata: dict[str, str]) -> str:
        if size < 0 or part_size < 1:
            raise StoreError(
                f"bad multipart upload: {size} bytes in parts of {part_size}", uri=object_uri(self.uri, key)
            )
        upload = _Upload(new_token(), size, part_size, dict(metadata))
        path, tmp = self._path(key), self._temp_path(key, upload.token)

        def create() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._inside(path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                os.ftruncate(fd, size)  # sparse: parts fill it in any order
            finally:
                os.close(fd)

        await asyncio.to_thread(create)
        return upload.encode()

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
        uri = object_uri(self.uri, key)
        upload = _Upload.decode(upload_id, uri)
        offset, length = part_range(upload.size, upload.part_size, number)
        if number < 1 or len(data) != length or not length:
            raise StoreError(f"part {number} has {len(data)} bytes, the upload wants {length}", uri=uri)
        tmp = self._temp_path(key, upload.token)

        def write() -> None:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
            except _GONE as exc:
                raise NoSuchUpload("no such upload (completed or aborted)", uri=uri) from exc
            try:
                _write_all(fd, data, offset)  # pwrite: parts share no file position
                os.fdatasync(fd)  # a part reported done survives a crash: resume skips it
            finally:
                os.close(fd)

        await asyncio.to_thread(write)
        return PartInfo(number, len(data))

    async def complete_multipart(self, key: str, upload_id: str, parts: list[PartInfo]) -> ObjectInfo:
        uri = object_uri(self.uri, key)
        upload = _Upload.decode(upload_id, uri)
        check_parts(upload.size, upload.part_size, parts, uri)
        path, tmp = self._path(key), self._temp_path(key, upload.token)

        def finish() -> ObjectInfo:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
            except _GONE as exc:
                raise NoSuchUpload("no such upload (completed or aborted)", uri=uri) from exc
            try:
                if os.fstat(fd).st_size != upload.size:
                    raise StoreError(f"upload file is not {upload.size} bytes", uri=uri)
                self._publish(fd, tmp, path, upload.metadata, sync=True)
            finally:
                os.close(fd)
            return self._info(key, path, os.stat(path))

        return await asyncio.to_thread(finish)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            upload = _Upload.decode(upload_id, object_uri(self.uri, key))
        except NoSuchUpload:
            return
        await asyncio.to_thread(_unlink, self._temp_path(key, upload.token))

    async def remove_temp_files(self, keys: Iterable[str]) -> tuple[int, int]:
        """Delete the temporary files of uploads of ``keys`` (``.NAME.babel-TOKEN`` next to each:
        what a killed run had in flight, never listed); returns (files, bytes)."""

        def run() -> tuple[int, int]:
            files = nbytes = 0
            for key in keys:
                head, name = os.path.split(os.path.join(self.root, key))
                try:
                    names = os.listdir(head)
                except OSError:
                    continue
                for entry in names:
                    if is_temp_of(entry, name):
                        try:
                            size = os.lstat(os.path.join(head, entry)).st_size
                            os.unlink(os.path.join(head, entry))
                        except FileNotFoundError:
                            continue
                        files, nbytes = files + 1, nbytes + size
            return files, nbytes

        return await asyncio.to_thread(run)

    async def close(self) -> None:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except _GONE:
        pass


def _kind(mode: int) -> str:
    """What a listed entry that is no regular file is (symlinks are never followed)."""
    for test, name in ((stat_mod.S_ISLNK, "symlink"), (stat_mod.S_ISFIFO, "fifo"), (stat_mod.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "device"
