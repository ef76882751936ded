"""``pcache://`` for fsspec: :class:`PCacheFileSystem`, an ``AsyncFileSystem`` on :class:`PCacheClient`.

Registered through the ``fsspec.specs`` entry point, so once the package is installed
``fsspec.open("pcache://10.0.0.2:19600/datasets/web/part-0.parquet")``, pandas
(``pd.read_parquet("pcache://…")``), Hugging Face ``datasets`` and Lightning reach PCache
without importing anything of ours. No host (``pcache:///datasets/…``) means the
client's default master (``$PCACHE_MASTER``, else the embedded cluster), and its token
is found as every client finds it (:class:`~pcache.common.config.ClientConfig`).

* **URLs and paths**: ``pcache://HOST:PORT[,HOST2:PORT]/abs/path``; the filesystem's
  own paths are absolute PCache paths (``root_marker`` ``/``).
* **Options** (``storage_options`` / constructor keywords): every
  :class:`~pcache.common.config.ClientConfig` field (``master``, ``token``,
  ``metadata_ttl``, ``block_size``, ``replication``, ``short_circuit`` …), plus
  ``auto_mkdir`` (default True: writing ``a/b/c`` makes ``a/b`` as object-store
  filesystems do).
* **Consistency** is PCache's close-to-open: a written file becomes visible when the
  fsspec file is closed (its ``commit``); a stat from this instance may be up to
  ``metadata_ttl`` seconds old for paths other processes changed.
* **Files**: ``open`` in ``rb`` reads through one :class:`~pcache.client.PCacheFile`
  (its read-ahead, replica failover and CRC checks) under fsspec's block cache; ``wb``,
  ``xb`` and ``ab`` create the file at open (``xb`` raises ``FileExistsError`` then, as
  ``open(…, "x")`` does) and stream the buffer to the workers in ``block_size``-byte
  chunks. With ``autocommit=False`` (fsspec transactions) the bytes go to a hidden
  sibling renamed into place by ``commit`` (atomic in the master) and removed by
  ``discard``.
* ``rm(…, recursive=True)`` of a directory is one atomic master operation; ``mv`` of one
  path to a free destination is one atomic rename.

Errors are PCache's own, each a subclass of the built-in one fsspec callers catch
(``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``, ``PermissionError``…).
Peer: s3fs (``S3FileSystem``) for the layout of an fsspec async filesystem.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import datetime
import errno
import functools
import inspect
import io
import logging
import os
import posixpath
import secrets
import sys
import threading
import time
import weakref
from typing import Any

from fsspec.asyn import AbstractAsyncStreamedFile, AsyncFileSystem, sync
from fsspec.asyn import mirror_sync_methods as _mirror_sync_methods
from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.exceptions import FSTimeoutError
from fsspec.spec import AbstractBufferedFile

from pcache.client.core import MAX_SYMLINK_HOPS, FileStat, PCacheClient, _link_target
from pcache.client.file import PCacheFile
from pcache.common.config import ClientConfig
from pcache.common.credentials import clean_token
from pcache.common.errors import (
    AlreadyExists,
    InvalidArgument,
    NotADirectory,
    NotFound,
    PCacheError,
    StaleEpoch,
    SymlinkLoop,
    Timeout,
    Unavailable,
)

logger = logging.getLogger(__name__)

PROTOCOL = "pcache"
PREFIX = f"{PROTOCOL}://"
CHUNK = 8 << 20  # bytes per read/write step of put, get and copy
UNANSWERED = (Unavailable, Timeout, StaleEpoch)  # the master did not answer: nothing is known of the path


def _omit_unless_unanswered(exc: BaseException) -> None:
    """fsspec ``walk``'s ``on_error``: a path gone meanwhile is left out, silence is raised."""
    if isinstance(exc, UNANSWERED):
        raise exc


CLIENT_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientConfig))
KIND_TYPES = {"file": "file", "dir": "directory"}  # every other kind is fsspec's "other"


def _own_timeouts(method):
    """``method`` (a blocking call through fsspec's ``sync``) raising PCache's own ``Timeout`` or
    ``StoreTimeout``, not the empty ``FSTimeoutError`` fsspec's ``sync`` puts in front of every
    ``TimeoutError`` (which PCache's timeouts are): its message, and ``except pcache Timeout``,
    were lost. fsspec's own time limit (``timeout=``) still raises ``FSTimeoutError``."""

    def own(exc: FSTimeoutError) -> BaseException:
        cause = exc.__cause__
        return cause if isinstance(cause, PCacheError) else exc

    if inspect.isgeneratorfunction(method):  # walk: its errors come while it is iterated

        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(*args, **kwargs)
            except FSTimeoutError as exc:
                error = own(exc)
                raise error from error.__cause__

        return generator

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except FSTimeoutError as exc:
            error = own(exc)
            raise error from error.__cause__

    return wrapper


_sync = _own_timeouts(sync)  # fsspec's ``sync(loop, fn, *args)`` with PCache's own timeouts


def _sync_method(fn: Any) -> Any:
    """The blocking method of coroutine method ``fn`` (fsspec's ``sync_wrapper``, :func:`_own_timeouts`)."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _sync(self.loop, fn, self, *args, **kwargs)

    return wrapper


def split_url(url: str) -> tuple[str, str]:
    """``pcache://host:port/a/b`` -> (``host:port``, ``/a/b``); a bare path -> ("", path).

    Split by hand, not with ``urlsplit``: glob patterns (``?``, ``#``, ``[``) are path
    characters here, not a query or a fragment.
    """
    if url.startswith(PREFIX):
        rest = url[len(PREFIX) :]
        slash = rest.find("/")
        return (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    return "", url


_NAMED_MASTERS: set[str] = set()  # masters this process named in a URL or an option
_WARNED: set[str] = set()  # default masters a host-less URL was warned about (once each)


class _OneInstancePerMaster(type(AsyncFileSystem)):  # type: ignore[misc]
    """fsspec's instance cache (``_Cached``) keyed by the master however it was given: a URL's
    host (``url_master``), ``master=`` or the first argument. ``filesystem("pcache", master=M)``
    and ``pcache://M/...`` were two instances, two clients and two metadata caches, so a file
    written through one read back as its previous version through the other (``metadata_ttl``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args:
            if "master" in kwargs:
                raise TypeError("master given twice")
            kwargs["master"], args = args[0], args[1:]
        url_master = kwargs.pop("url_master", None)
        master = kwargs.get("master")
        if master and url_master and master != url_master:
            raise InvalidArgument(f"the URL names master {url_master} and the options master {master}: give one")
        if url_master:
            kwargs["master"] = master = url_master
        if master:
            _NAMED_MASTERS.add(str(master))
        elif _NAMED_MASTERS and (default := ClientConfig().master) not in _NAMED_MASTERS | _WARNED:
            _WARNED.add(default)  # once: a dataset's loader opens every file by such a URL
            logger.warning(
                "pcache:// with no master goes to %s (the default), while this process named %s: a library"
                " that drops a URL's host (Hugging Face datasets' data_files) reads that cluster instead;"
                " give the master in storage_options={'master': ...}",
                default,
                ", ".join(sorted(_NAMED_MASTERS)),
            )
        return super().__call__(*args, **dict(sorted(kwargs.items())))  # fsspec's token follows their order


class PCacheFileSystem(AsyncFileSystem, metaclass=_OneInstancePerMaster):
    """fsspec filesystem over a PCache cluster (see the module docstring).

    Args:
        master: master address(es), ``host:port[,host:port]``; default as :class:`ClientConfig`.
        auto_mkdir: create missing parent directories when writing a file (default True).
        **options: :class:`ClientConfig` fields, or fsspec's own options
            (``asynchronous``, ``loop``, ``batch_size``, ``use_listings_cache`` …).
    """

    protocol = (PROTOCOL,)
    root_marker = "/"
    async_impl = True
    mirror_sync_methods = False  # done by __init__, each blocking method raising PCache's own timeouts
    cachable = True
    blocksize = CHUNK

    def __init__(self, master: str | None = None, *, auto_mkdir: bool = True, **options: Any) -> None:
        """Raises InvalidArgument for an empty ``token`` (an unset variable passed as the token used
        this machine's default tenant), or a ``master`` that differs from the URL's host."""
        client_options = {k: options.pop(k) for k in list(options) if k in CLIENT_FIELDS}
        if master:
            client_options["master"] = master
        if "token" in client_options:  # a token read from a file keeps its newline
            client_options["token"] = clean_token(
                str(client_options["token"] or ""), "token (leave it out to use this machine's)"
            )
        super().__init__(**options)
        self.config = dataclasses.replace(ClientConfig(), **client_options)
        self.master = self.config.master
        self.auto_mkdir = auto_mkdir
        self._holder: list[PCacheClient] = []
        weakref.finalize(self, _close_client, self._holder, self._loop)
        _mirror_sync_methods(self)
        for name, method in list(vars(self).items()):  # the blocking methods fsspec made from ours
            own = getattr(self, f"_{name}", None)
            if callable(method) and (inspect.iscoroutinefunction(own) or inspect.isasyncgenfunction(own)):
                setattr(self, name, _own_timeouts(method))

    # ------------------------------------------------------------ paths --

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = split_url(os.fspath(path))[1]
        path = "/" + "/".join(part for part in path.split("/") if part)  # "//a//b/" is "/a/b"
        return path

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, str]:
        master = split_url(path)[0]  # not "master": fsspec merges it with the caller's options
        return {"url_master": master} if master else {}

    def unstrip_protocol(self, name: str) -> str:
        return f"{PREFIX}{self.master}{self._strip_protocol(name)}"

    # ----------------------------------------------------------- client --

    async def client(self) -> PCacheClient:
        """The :class:`PCacheClient` of this filesystem, made on first use on its event loop."""
        if not self._holder:
            self._holder.append(PCacheClient(self.config))
        return self._holder[0]

    def _sync_call(self, fn, *args: Any) -> Any:
        """Run ``fn(*args)`` (a coroutine function) on this filesystem's loop from a sync caller."""
        return _sync(self.loop, fn, *args)

    async def _commit_rename(self, tmp: str, path: str) -> None:
        await (await self.client()).rename(tmp, path)

    async def _open_pcache(self, path: str, mode: str, replication: int = 0) -> PCacheFile:
        """Open ``path`` through the client; a write makes missing parents when ``auto_mkdir``.
        ``replication``: copies of a file this open creates (0: the filesystem's)."""
        c = await self.client()
        try:
            return await c.open(path, mode, replication=replication)
        except NotFound:
            if mode.startswith("r") or not self.auto_mkdir or path == "/":
                raise
        await c.mkdir(posixpath.dirname(path), parents=True)
        return await c.open(path, mode, replication=replication)

    # --------------------------------------------------------- metadata --

    def _details(self, st: FileStat, target: FileStat | None = None) -> dict[str, Any]:
        seen = target or st
        out: dict[str, Any] = {
            "name": st.path,
            "size": seen.size if seen.kind == "file" else 0,
            "type": KIND_TYPES.get(seen.kind, "other"),
            "mtime": seen.mtime,
            "mode": seen.mode,
            "uid": seen.uid,
            "gid": seen.gid,
            "ino": seen.inode,
            "islink": st.kind == "symlink",
            "block_size": seen.block_size,
            "replication": seen.replication,
            "version": seen.version,
        }
        if st.kind == "symlink":
            out["destination"] = st.symlink_target
        if seen.etag:
            out["etag"] = seen.etag
        if seen.persist:
            out["persist"] = seen.persist
        return out

    async def _follow(self, st: FileStat) -> FileStat | None:
        """The file a symlink leads to (None when it dangles)."""
        c = await self.client()
        for _hop in range(MAX_SYMLINK_HOPS):
            try:
                st = await c.stat(_link_target(st.path, st.symlink_target))
            except (NotFound, NotADirectory):
                return None
            if st.kind != "symlink":
                return st
        raise SymlinkLoop("too many levels of symbolic links", path=st.path)

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """fsspec ``info``: name, size (bytes), type, mtime (s), mode, uid, gid, ino, islink, PCache fields.

        Raises:
            FileNotFoundError: no such path.
        """
        path = self._strip_protocol(path)
        st = await (await self.client()).stat(path)
        target = None
        if st.kind == "symlink":
            with contextlib.suppress(SymlinkLoop):  # the link itself, as ls lists it (du, find)
                target = await self._follow(st)
        return self._details(st, target)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        """Entries of a directory in name order (a file lists as itself).

        Raises:
            FileNotFoundError: no such path.
        """
        path = self._strip_protocol(path)
        c = await self.client()
        try:
            out = []
            async for st in c.scandir(path):
                target = None
                if st.kind == "symlink":
                    with contextlib.suppress(SymlinkLoop):  # listed as the link itself, as os.scandir does
                        target = await self._follow(st)
                out.append(self._details(st, target))
        except NotADirectory:
            out = [await self._info(path)]
        return out if detail else [entry["name"] for entry in out]

    async def _walk(self, path: str, maxdepth: int | None = None, topdown: bool = True, on_error: Any = None, **kwargs):
        """fsspec's walk, except that a master that does not answer is an error, never an empty
        directory (fsspec omits every ``OSError`` by default: ``find``, ``glob`` and ``du``
        answered ``[]`` and 0 during an outage, and a trainer looking for its newest checkpoint
        found none). Missing paths are still omitted unless ``on_error="raise"``."""
        async for entry in super()._walk(
            path, maxdepth=maxdepth, topdown=topdown, on_error=on_error or _omit_unless_unanswered, **kwargs
        ):
            yield entry

    async def _isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (a symlink to one is). Raises the master's silence
        (``Unavailable``, ``Timeout``) instead of answering False."""
        return await self._is(path, "directory")

    async def _isfile(self, path: str) -> bool:
        """Whether ``path`` is a regular file; raises as :meth:`_isdir`."""
        return await self._is(path, "file")

    async def _is(self, path: str, kind: str) -> bool:
        try:
            return (await self._info(path))["type"] == kind
        except UNANSWERED:
            raise
        except OSError:
            return False

    def modified(self, path: str) -> datetime.datetime:
        """Last modification time of ``path`` (UTC)."""
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.UTC)

    # -------------------------------------------------------- directories --

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Make a directory. Raises FileExistsError when the path exists."""
        path = self._strip_protocol(path)
        c = await self.client()
        if create_parents:
            if await c.exists(path):
                raise AlreadyExists("file exists", path=path)
            await c.mkdir(path, parents=True)
        else:
            await c.mkdir(path)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        """``mkdir -p``. Raises FileExistsError when the path exists and not ``exist_ok``."""
        path = self._strip_protocol(path)
        c = await self.client()
        if not exist_ok and await c.exists(path):
            raise AlreadyExists("file exists", path=path)
        await c.mkdir(path, parents=True)

    async def _rmdir(self, path: str) -> None:
        """Remove an empty directory. Raises OSError(ENOTEMPTY), NotADirectoryError."""
        await (await self.client()).rmdir(self._strip_protocol(path))

    rmdir = _sync_method(_rmdir)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        """Remove a file or symlink. Raises IsADirectoryError for a directory."""
        await (await self.client()).unlink(self._strip_protocol(path))

    async def _rm(
        self, path, recursive: bool = False, batch_size: int | None = None, maxdepth: int | None = None, **kwargs: Any
    ) -> None:
        """Remove paths (globs expanded); a directory needs ``recursive`` and goes in one master operation.

        Raises:
            FileNotFoundError: nothing matched. IsADirectoryError: a directory without ``recursive``.
        """
        c = await self.client()
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        infos = await asyncio.gather(*(self._info_or_none(p) for p in paths))
        if not any(infos):
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
        gone: list[str] = []  # directories removed whole: skip what was under them
        files = []
        for p, info in sorted(zip(paths, infos, strict=True), key=lambda pair: pair[0]):
            if info is None or any(p.startswith(d.rstrip("/") + "/") for d in gone):
                continue
            if info["type"] == "directory" and not info["islink"]:
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, "is a directory (rm(..., recursive=True) removes it)", p)
                if maxdepth is None:
                    await c.remove(p, recursive=True)
                    gone.append(p)
                    continue
            files.append((p, info))
        for p, info in files:  # maxdepth: files first, then the directories left empty, deepest first
            if info["type"] != "directory" or info["islink"]:
                await c.unlink(p)
        for p, info in sorted(files, key=lambda pair: pair[0], reverse=True):
            if info["type"] == "directory" and not info["islink"]:
                try:
                    await c.rmdir(p)
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:  # deeper than maxdepth: kept
                        raise

    async def _info_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._info(path)
        except FileNotFoundError:
            return None

    # --------------------------------------------------------------- data --

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes ``[start, end)`` of a file (negative offsets from the end, as fsspec).

        Raises:
            FileNotFoundError, IsADirectoryError.
        """
        f = await self._open_pcache(self._strip_protocol(path), "rb")
        try:
            lo, hi = _limits(f.size, start, end)
            return await f.pread(lo, hi - lo) if hi > lo else b""
        finally:
            await f.close()

    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write ``value`` as the whole file; ``mode="create"`` raises FileExistsError if it exists."""
        f = await self._open_pcache(self._strip_protocol(path), "xb" if mode == "create" else "wb")
        await _write_all(f, [memoryview(value)])

    async def _put_file(
        self, lpath: str, rpath: str, callback=DEFAULT_CALLBACK, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        """Copy one local file (or make one directory) to ``rpath``, ``CHUNK`` bytes at a time."""
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            await self._makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as src:
            callback.set_size(os.fstat(src.fileno()).st_size)
            f = await self._open_pcache(rpath, "xb" if mode == "create" else "wb")
            try:
                while chunk := await asyncio.to_thread(src.read, CHUNK):
                    await f.write(chunk)
                    callback.relative_update(len(chunk))
            except BaseException:
                await f.abort()
                raise
            await f.close()

    async def _get_file(self, rpath: str, lpath: str, callback=DEFAULT_CALLBACK, **kwargs: Any) -> None:
        """Copy one file (or make one directory) to the local ``lpath``; a failed copy leaves no partial file."""
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath) or (await self._info(rpath))["type"] == "directory":
            os.makedirs(lpath, exist_ok=True)
            return
        f = await self._open_pcache(rpath, "rb")
        tmp = f"{lpath}.pcache-{secrets.token_hex(4)}"
        try:
            callback.set_size(f.size)
            with open(tmp, "wb") as dst:
                while chunk := await f.read(CHUNK):
                    await asyncio.to_thread(dst.write, chunk)
                    callback.relative_update(len(chunk))
            os.replace(tmp, lpath)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            await f.close()

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy one file (or make one directory) inside the cluster, streamed through this client."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if (await self._info(path1))["type"] == "directory":
            await self._makedirs(path2, exist_ok=True)
            return
        src = await self._open_pcache(path1, "rb")
        try:
            dst = await self._open_pcache(path2, "wb")

            async def chunks():
                while chunk := await src.read(CHUNK):
                    yield chunk

            await _write_all(dst, chunks())
        finally:
            await src.close()

    async def _mv_one(self, path1: str, path2: str) -> bool:
        """Rename when the destination is free (atomic); False when fsspec's copy-and-delete must do it."""
        c = await self.client()
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if await c.exists(path2):
            return False
        try:
            await c.rename(path1, path2, no_replace=True)
        except (NotFound, AlreadyExists):
            if not await c.exists(path1):
                raise
            if not self.auto_mkdir or await c.exists(posixpath.dirname(path2)):
                return False
            await c.mkdir(posixpath.dirname(path2), parents=True)
            await c.rename(path1, path2, no_replace=True)
        return True

    def mv(self, path1, path2, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """Move: one atomic rename for a plain path to a free destination (into it when it is a
        directory, as ``mv`` does), else copy then delete.

        Raises:
            InvalidArgument: a path moved into the directory that holds it already, or into
                itself (fsspec's copy-then-delete copied it onto itself, then deleted it).
        """
        plain = isinstance(path1, str) and isinstance(path2, str) and not any(ch in path1 for ch in "*?[")
        if plain and self._strip_protocol(path1) == self._strip_protocol(path2):
            return
        if plain and (path2.endswith("/") or self.isdir(path2)):
            src, into = self._strip_protocol(path1), self._strip_protocol(path2).rstrip("/") or "/"
            target = posixpath.join(into, posixpath.basename(src))
            if target == src or into == src or into.startswith(src.rstrip("/") + "/"):
                why = "it is there already" if target == src else "it is inside it"
                raise InvalidArgument(f"cannot move {src} into {into}: {why}")
            path2 = target
        renamable = plain and maxdepth is None and not path2.endswith("/")
        if renamable and _sync(self.loop, self._mv_one, path1, path2):  # a directory moves whole, as mv(1) does
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    async def _touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """Create an empty file, or (``truncate=False``) set an existing one's mtime to now."""
        path = self._strip_protocol(path)
        c = await self.client()
        if not truncate and await c.exists(path):
            now = time.time()
            await c.setattr(path, mtime=now)
            return
        await (await self._open_pcache(path, "wb")).close()

    touch = _sync_method(_touch)

    # -------------------------------------------------------------- files --

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict | None = None,
        **kwargs: Any,
    ) -> PCacheBufferedFile:
        return PCacheBufferedFile(
            self, self._strip_protocol(path), mode, block_size, autocommit, cache_options, **kwargs
        )

    async def open_async(self, path: str, mode: str = "rb", **kwargs: Any) -> PCacheStreamedFile:
        """An async file (``await f.read(n)``, ``await f.write(b)``) for ``rb``, ``wb``, ``xb``, ``ab``."""
        if "b" not in mode or kwargs.get("compression"):
            raise ValueError("open_async takes binary modes without compression")
        path = self._strip_protocol(path)
        f = await self._open_pcache(path, mode, int(kwargs.get("replication", 0) or 0))
        return PCacheStreamedFile(self, path, mode, f)


class PCacheBufferedFile(AbstractBufferedFile):
    """fsspec's buffered file over one :class:`PCacheFile` (see :class:`PCacheFileSystem`)."""

    def __init__(
        self,
        fs: PCacheFileSystem,
        path: str,
        mode: str,
        block_size: int | None,
        autocommit: bool,
        cache_options: dict | None,
        **kwargs: Any,
    ) -> None:
        if mode not in {"rb", "wb", "xb", "ab"}:
            raise NotImplementedError(f"mode {mode!r} is not supported (rb, wb, xb, ab)")
        kwargs.pop("size", None)  # a caller's guess (fsspec's blockcache passes one): the open knows
        self.target = path if autocommit or mode == "rb" else _hidden_sibling(path)
        replication = int(kwargs.pop("replication", 0) or 0)  # open(p, "wb", replication=1): this file's copies
        self.file: PCacheFile = fs._sync_call(
            fs._open_pcache, self.target, mode, replication
        )  # errors here, like open()
        super().__init__(
            fs, path, mode, block_size, autocommit, cache_options=cache_options, size=self.file.size, **kwargs
        )
        if mode == "ab":
            self.loc = self.file.size
        _track_open(self)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs._sync_call(self.file.pread, start, end - start)

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getbuffer()
        try:
            if data.nbytes:
                self.fs._sync_call(self.file.write, bytes(data))
            if final and self.autocommit:
                self.fs._sync_call(self.file.close)
        except BaseException:
            self.fs._sync_call(self.file.abort)
            # closed with it: the ``with`` block's close must not try again and raise "I/O
            # operation on closed file" over this error (an OSError a caller catches)
            super().__setattr__("closed", True)
            raise
        finally:
            data.release()
        return True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """A ``with`` block that raised drops what it wrote (the SDK's ``with``, all or nothing):
        the file keeps its last committed content, and one this open created goes away. fsspec's
        own ``__exit__`` closes, which would commit the partial bytes over the previous file."""
        if exc_type is not None and self.mode != "rb" and not self.closed:
            try:
                self.discard()
            finally:
                self.buffer = io.BytesIO()
                super().__setattr__("closed", True)
            return
        self.close()

    def commit(self) -> None:
        """Make a transaction's file visible: commit the hidden sibling, rename it into place."""
        self.fs._sync_call(self.file.close)
        self.fs._sync_call(self.fs._commit_rename, self.target, self.path)

    def discard(self) -> None:
        """Drop a transaction's file."""
        self.fs._sync_call(self.file.abort)

    def close(self) -> None:
        if self.closed:
            return
        if sys.is_finalizing():  # collected after the loop's thread stopped: a sync() would wait for ever
            super().__setattr__("closed", True)  # (files left open at exit were closed by _close_open_files)
            return
        try:
            super().close()
        finally:
            if self.mode == "rb":
                if _on_loop(self.fs.loop):  # garbage-collected on the filesystem's own loop
                    asyncio.ensure_future(self.file.close())
                else:
                    self.fs._sync_call(self.file.close)


class PCacheStreamedFile(AbstractAsyncStreamedFile):
    """``open_async``'s file: reads and writes go straight to the :class:`PCacheFile`."""

    def __init__(self, fs: PCacheFileSystem, path: str, mode: str, file: PCacheFile) -> None:
        super().__init__(fs, path, mode, size=file.size)
        self.file = file
        self.writes = 0

    async def read(self, length: int = -1) -> bytes:
        data = await self.file.read(length)
        self.loc += len(data)
        return data

    async def write(self, data: bytes) -> int:
        n = await self.file.write(data)
        self.loc += n
        return n

    async def flush(self, force: bool = False) -> None:
        """Nothing is buffered here; the file is committed at ``close``."""

    async def close(self) -> None:
        if not self.file.closed:
            self.closed = True
            await self.file.close()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """As :meth:`PCacheBufferedFile.__exit__`: a block that raised drops what it wrote."""
        if exc_type is not None and self.mode != "rb" and not self.file.closed:
            self.closed = True
            await self.file.abort()
            return
        await self.close()


_OPEN_FILES: weakref.WeakSet[PCacheBufferedFile] = weakref.WeakSet()


_AT_EXIT: list[bool] = []  # registered once


def _track_open(f: PCacheBufferedFile) -> None:
    """Remember an open file for :func:`_close_open_files`, run at exit before the thread pools
    stop (``threading._register_atexit``, as ``concurrent.futures`` does: later registered runs
    first) and before the clients' own ``weakref.finalize``, while their channels are open."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        register = getattr(threading, "_register_atexit", atexit.register)
        register(_close_open_files)
    _OPEN_FILES.add(f)


def _close_open_files() -> None:
    """Close the files a program left open when it exits, while the filesystem's loop still runs:
    a writer's bytes are committed, as a local file's are (the interpreter hung for ever in the
    files' ``__del__``, and a writer left an empty file)."""
    for f in list(_OPEN_FILES):
        try:
            f.close()
        except Exception as exc:  # one file's failure must not keep the others open
            print(f"pcache: {f.path} left open at exit: its close failed: {exc}", file=sys.stderr)


def _on_loop(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Whether this thread runs ``loop`` (where a blocking ``sync()`` call would deadlock)."""
    try:
        return loop is not None and asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _hidden_sibling(path: str) -> str:
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.fsspec-{secrets.token_hex(6)}")


def _limits(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """fsspec's [start, end) with negatives from the end, clipped to ``size``."""
    lo = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
    hi = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
    return lo, hi


async def _write_all(f: PCacheFile, chunks) -> None:
    """Write every chunk (an iterable or async iterable of bytes) and commit; abort on any failure."""
    try:
        if hasattr(chunks, "__aiter__"):
            async for chunk in chunks:
                await f.write(chunk)
        else:
            for chunk in chunks:
                await f.write(chunk)
    except BaseException:
        await f.abort()
        raise
    await f.close()


def _close_client(holder: list[PCacheClient], loop: asyncio.AbstractEventLoop | None) -> None:
    """Close the filesystem's client at garbage collection or exit (best effort, 2 s)."""
    if not holder or loop is None or loop.is_closed() or not loop.is_running():
        return
    try:
        sync(loop, holder[0].close, timeout=2.0)
    except Exception:  # the loop's thread may be gone at interpreter exit
        pass
