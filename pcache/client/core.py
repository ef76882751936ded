"""The async PCache client: namespace calls and files (tree copies live in :mod:`pcache.client.tree`).

One :class:`PCacheClient` per process and master. It owns a
:class:`~pcache.client.master.MasterClient` (control plane) and a
:class:`~pcache.client.data.DataClient` (data plane), caches ``stat`` results
for ``metadata_ttl`` seconds (a cached stat makes no RPC; the client's own
mutations invalidate at once), and places each new block through the master
(load-aware, local worker first), retrying on another worker when the first
target is dead or full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import stat as stat_mod
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from cachetools import TTLCache
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from pcache.client import tree
from pcache.client.budget import ReadBudget, WriteBudget
from pcache.client.data import BlockStream, DataClient
from pcache.client.file import PCacheFile, View, parse_mode
from pcache.client.load import LoadReport, free, load
from pcache.client.master import FAILOVER_ERRORS, MasterClient
from pcache.client.salvage import SalvageResult, salvage
from pcache.common.config import ClientConfig, default_node_id
from pcache.common.errors import (
    InvalidArgument,
    IsADirectory,
    NoSpace,
    NotFound,
    NotSupported,
    PCacheError,
    QuotaExceeded,
    SymlinkLoop,
    Timeout,
    Unavailable,
)
from pcache.common.inodes import file_mode, type_of_mode
from pcache.common.layout import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from pcache.common.paths import join, normalize
from pcache.proto import pcache_pb2 as pb

logger = logging.getLogger(__name__)

WRITE_RETRY_ERRORS = (Unavailable, Timeout, NoSpace)
WAIT_REPORT_EVERY = 10.0  # seconds between two reports of a wait_persisted still waiting
STREAM_RETRY_SECONDS = 30.0  # after a block placed on another host, writes buffer this long before trying again
DISCARD_RETRY_SECONDS = 5.0  # between two tries to remove the files failed writers created
DISCARD_GIVE_UP_SECONDS = 600.0  # ... for so long at most
VERDICT_SECONDS = 2.0  # how often a client with suspects asks the master which workers are dead
METADATA_CACHE_ENTRIES = 100_000
MAX_SYMLINK_HOPS = 40  # as Linux's MAXSYMLINKS
LAYOUT_CACHE_ENTRIES = 10_000
STATAHEAD_DIRS = 1024  # directories whose uncached stats a client watches for a rising sequence


_GRPC_PID: list[int] = []  # the process that made this module's first client: gRPC started there


def check_not_forked() -> None:
    """Refuse a client in a process forked from one that had made a client: gRPC does not
    survive ``fork`` (the forked child of a process that used it crashed with SIGSEGV or hung
    for a timeout; PyTorch's ``DataLoader`` forks its workers by default on Linux).

    Raises:
        NotSupported: this process is such a child.
    """
    if _GRPC_PID and _GRPC_PID[0] != os.getpid():
        raise NotSupported(
            f"this process was forked from one that had used PCache (pid {_GRPC_PID[0]}), and gRPC does not"
            " survive fork: start worker processes with spawn (DataLoader(multiprocessing_context='spawn'),"
            " multiprocessing.get_context('spawn')), or read through the FUSE mount"
        )


KIND_NAMES = {
    pb.REGULAR: "file",
    pb.DIRECTORY: "dir",
    pb.SYMLINK: "symlink",
    pb.FIFO: "fifo",
    pb.CHAR_DEVICE: "chardev",
    pb.BLOCK_DEVICE: "blockdev",
    pb.SOCKET: "socket",
}


PERSIST_NAMES = {pb.PERSIST_PENDING: "pending", pb.PERSIST_DONE: "done", pb.PERSIST_FAILED: "failed"}


@dataclass(frozen=True)
class FileStat:
    """What ``stat`` returns: sizes in bytes, times in seconds since the epoch."""

    path: str
    name: str
    inode: int
    kind: str  # "file", "dir", "symlink", "fifo", "chardev", "blockdev", "socket"
    mode: int  # st_mode: type bits | permissions
    size: int
    mtime: float
    ctime: float
    atime: float
    block_size: int
    replication: int
    blocks: int
    version: int
    symlink_target: str = ""
    uid: int = 0
    gid: int = 0
    rdev: int = 0
    etag: str = ""  # listed from a bound under-store: the object's ETag when last listed or checked
    persist: str = ""  # under a write-back bind: "pending", "done" or "failed" ("" elsewhere)
    persist_error: str = ""  # the last failed upload's error
    nlink: int = 1  # names of a file (hard links); a directory's 2 + its subdirectories
    listed: bool = False  # listed from a bound under-store (its content is the store's object)

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @classmethod
    def from_inode(cls, path: str, node: pb.Inode) -> FileStat:
        kind = KIND_NAMES.get(node.type, "file")
        return cls(
            path=path,
            name=node.name,
            inode=node.id,
            kind=kind,
            mode=file_mode(node),
            size=node.size,
            mtime=node.mtime,
            ctime=node.ctime,
            atime=node.atime,
            block_size=node.block_size,
            replication=node.replication,
            blocks=len(node.blocks),
            version=node.version,
            nlink=2 + node.subdirs if node.type == pb.DIRECTORY else node.nlink or 1,
            symlink_target=node.symlink_target,
            uid=node.uid,
            gid=node.gid,
            rdev=node.rdev,
            etag=node.etag,
            persist=PERSIST_NAMES.get(node.persist, ""),
            persist_error=node.persist_error,
            listed=bool(node.bind),
        )


def _link_target(link: str, target: str) -> str:
    """Absolute path a symlink at ``link`` points to (relative targets from its directory)."""
    return normalize(posixpath.normpath(posixpath.join(posixpath.dirname(link), target)))


def check_block_size(block_size: int) -> None:
    """Raise InvalidArgument unless ``block_size`` is 0 (default) or within the allowed range."""
    if block_size and not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidArgument(
            f"block size must be 0 (default) or {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} bytes, got {block_size}"
        )


def _owner(owner: tuple[int, int] | None) -> pb.Owner:
    uid, gid = owner if owner is not None else (os.getuid(), os.getgid())
    return pb.Owner(uid=uid, gid=gid)


class PCacheClient:
    """Async client of one PCache cluster. Close it with :meth:`close`."""

    def __init__(self, cfg: ClientConfig | None = None, *, master: str | None = None) -> None:
        check_not_forked()
        _GRPC_PID[:] = _GRPC_PID or [os.getpid()]
        cfg = cfg or ClientConfig()
        if master:
            cfg.master = master
        self.cfg = cfg
        self.client_id = f"{default_node_id()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.node_id = cfg.node_id or default_node_id()
        self.master = MasterClient(cfg, self.client_id)
        self.data = DataClient(cfg, self.master.tls)
        self._stream_off_until = 0.0  # monotonic: no block streaming before (the last went to another host)
        self.data.health.on_suspect = self._follow_verdicts_soon
        self.read_budget = ReadBudget(cfg.read_budget)
        self.write_budget = WriteBudget(cfg.write_budget)
        self._verdicts: asyncio.Task | None = None
        self._owed_discards: dict[int, str] = {}  # inode -> path a failed writer created (discard_created)
        self._owed_abandons: dict[int, set[int]] = {}  # inode -> blocks a failed writer gives up (abandon_blocks)
        self._settling: asyncio.Task | None = None  # tries the owed ones again (_settle_owed)
        ttl = max(cfg.metadata_ttl, 1e-9)
        self._stat_cache: TTLCache[str, pb.Inode] = TTLCache(maxsize=METADATA_CACHE_ENTRIES, ttl=ttl)
        self._layout_cache: TTLCache[str, pb.FileLayout] = TTLCache(maxsize=LAYOUT_CACHE_ENTRIES, ttl=ttl)
        self._names: dict[int, set[str]] = {}  # inode with several names -> the paths it is cached under
        self._misses: dict[str, tuple[str, int]] = {}  # directory -> (last uncached name stat-ed, rising streak)
        # inodes a statahead listed, for a client without the metadata cache (the mount)
        self._ahead: TTLCache[str, pb.Inode] = TTLCache(
            maxsize=METADATA_CACHE_ENTRIES, ttl=max(cfg.statahead_ttl, 1e-9)
        )

    async def close(self) -> None:
        """Close connections (files failed writers created that are still owed a removal are named
        in a warning)."""
        if self._verdicts is not None:
            self._verdicts.cancel()
        if self._settling is not None:
            self._settling.cancel()
        for path in self._owed_discards.values():
            logger.warning("%s: the empty file a failed writer created is left: the client closed first", path)
        await self.data.close()
        await self.master.close()

    def _follow_verdicts_soon(self) -> None:
        if self._verdicts is None or self._verdicts.done():
            self._verdicts = asyncio.ensure_future(self._follow_verdicts())

    async def _follow_verdicts(self) -> None:
        """While a worker is suspect or dead: every ``VERDICT_SECONDS``, take the master's verdicts.

        A worker the master declared dead is avoided by every open file of this client, not only
        by those that already stalled on it; one it sees alive again (SIGCONT, a restart) is used
        again at once.
        """
        while self.data.health.watching():
            try:
                status = await self.master.cluster_status()
            except PCacheError as exc:
                logger.debug("cannot fetch worker verdicts: %s", exc)
            else:
                self.data.health.verdicts({w.info.addr.worker_id: w.alive for w in status.workers})
            await asyncio.sleep(VERDICT_SECONDS)

    async def __aenter__(self) -> PCacheClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------- metadata ---

    def invalidate(self, path: str, *, tree: bool = False, inode: int = 0) -> None:
        """Drop cached metadata of ``path`` (and, with ``tree``, of everything under it), of its
        parent directory (a change of an entry changes the directory's mtime and nlink), and of
        every other name cached for the same file (hard links; ``inode`` names it when the
        caller knows it)."""
        ids = {inode} if inode else set()
        paths = [path]
        if tree:
            prefix = path.rstrip("/") + "/"
            paths += [
                k
                for cache in (self._stat_cache, self._layout_cache, self._ahead)
                for k in list(cache)
                if k.startswith(prefix)
            ]
        for p in paths:
            ids |= self._drop(p)
        if path not in ("", "/"):
            self._drop(posixpath.dirname(path.rstrip("/")) or "/")
        for ino in ids:
            for other in self._names.pop(ino, ()):
                self._drop(other)

    def _drop(self, path: str) -> set[int]:
        """Forget ``path`` in both caches; the inode numbers it was cached with."""
        ids = set()
        for cache in (self._stat_cache, self._ahead):
            node = cache.pop(path, None)
            if node is not None:
                ids.add(node.id)
        layout = self._layout_cache.pop(path, None)
        if layout is not None:
            ids.add(layout.inode.id)
        return ids

    def _cached_name(self, path: str, node: pb.Inode) -> None:
        """Index a cached file with several names (hard links), so that a change made here
        through one name drops what is cached under the others."""
        if node.nlink > 1:
            if len(self._names) > METADATA_CACHE_ENTRIES:  # names of expired entries pile up
                self._names.clear()
            self._names.setdefault(node.id, set()).add(path)

    async def stat(self, path: str) -> FileStat:
        """Metadata of ``path`` (no symlink following); cached for ``metadata_ttl`` s.

        Raises:
            NotFound, NotADirectory, InvalidPath.
        """
        path = normalize(path)
        node = self._cached_stat(path)
        if node is None and (self.cfg.metadata_ttl > 0 or self.cfg.statahead_ttl > 0) and await self._stat_ahead(path):
            node = self._cached_stat(path)
        if node is None:
            node = await self.master.stat(path)
            if self.cfg.metadata_ttl > 0:
                self._stat_cache[path] = node
                self._cached_name(path, node)
        return FileStat.from_inode(path, node)

    def _cached_stat(self, path: str) -> pb.Inode | None:
        node = self._stat_cache.get(path)
        return node if node is not None else self._ahead.get(path)

    async def _stat_ahead(self, path: str) -> bool:
        """Statahead (Lustre's): the third uncached stat in a row of names rising in one directory
        (``ls``-order loops, ``find -newer``, ``os.walk`` + ``stat``) lists the directory's next
        page from the last of them instead: up to ``listdir_limit`` whole inodes in one round
        trip, cached as stats are. True when it listed (the path may still be absent)."""
        parent, name = posixpath.split(path)
        if not name:
            return False
        last, streak = self._misses.pop(parent, ("", 0))
        streak = streak + 1 if last and name > last else 0
        if streak < 2:
            self._misses[parent] = (name, streak)
            while len(self._misses) > STATAHEAD_DIRS:
                self._misses.pop(next(iter(self._misses)))
            return False
        try:
            page = await self.master.listdir(parent, start_after=last)
        except FAILOVER_ERRORS + (Timeout,):
            raise  # no master answers: the stat would wait as long again for the same answer
        except PCacheError:
            return False  # the stat itself says what is wrong
        cache = self._stat_cache if self.cfg.metadata_ttl > 0 else self._ahead
        for entry in page.entries:
            child = join(parent, entry.name)
            cache[child] = entry
            self._cached_name(child, entry)
        if page.entries:
            self._misses[parent] = (page.entries[-1].name, 0)  # the next miss past this page starts over
        return True

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def mkdir(
        self, path: str, mode: int = 0o755, *, parents: bool = False, owner: tuple[int, int] | None = None
    ) -> FileStat:
        """Create a directory (``parents``: like ``mkdir -p``), owned by ``owner`` (uid, gid; default: this process)."""
        path = normalize(path)
        self.invalidate(path)
        return FileStat.from_inode(path, await self.master.mkdir(path, mode, parents, _owner(owner)))

    async def listdir(self, path: str) -> list[FileStat]:
        """Every entry of a directory, in name order (pages through large ones)."""
        return [entry async for entry in self.scandir(path)]

    async def listdir_page(self, path: str, start_after: str = "") -> tuple[list[FileStat], bool]:
        """One page of a directory after ``start_after``: (entries in name order, whether more follow)."""
        path = normalize(path)
        page = await self.master.listdir(path, start_after=start_after)
        return [FileStat.from_inode(join(path, node.name), node) for node in page.entries], page.truncated

    async def scandir(self, path: str) -> AsyncIterator[FileStat]:
        """Stream a directory's entries page by page."""
        after = ""
        while True:
            entries, more = await self.listdir_page(path, after)
            for entry in entries:
                yield entry
            if not more or not entries:
                return
            after = entries[-1].name

    async def rename(self, src: str, dst: str, *, no_replace: bool = False) -> None:
        """Atomically rename ``src`` to ``dst`` (replacing a file or empty directory)."""
        src, dst = normalize(src), normalize(dst)
        self.invalidate(src, tree=True)
        self.invalidate(dst, tree=True)
        await self.master.rename(src, dst, no_replace)

    async def unlink(self, path: str) -> None:
        """Remove a file or symlink. Raises IsADirectory for a directory."""
        path = normalize(path)
        self.invalidate(path)
        await self.master.delete(path, file=True)

    async def rmdir(self, path: str) -> None:
        """Remove an empty directory. Raises DirectoryNotEmpty, NotADirectory."""
        path = normalize(path)
        self.invalidate(path)
        await self.master.delete(path, directory=True)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove anything; a non-empty directory only with ``recursive`` (atomic in the master)."""
        path = normalize(path)
        self.invalidate(path, tree=True)
        await self.master.delete(path, recursive=recursive)

    async def symlink(self, target: str, path: str, *, owner: tuple[int, int] | None = None) -> None:
        """Create symlink ``path`` -> ``target``."""
        path = normalize(path)
        self.invalidate(path)
        await self.master.symlink(path, target, _owner(owner))

    async def link(self, src: str, dst: str) -> FileStat:
        """Make ``dst`` another name (a hard link) of the file at ``src`` (not followed if a symlink).

        Raises:
            NotFound, AlreadyExists, NotPermitted (a directory: EPERM), CrossTenant (EXDEV),
            NotSupported (under a bound path).
        """
        src, dst = normalize(src), normalize(dst)
        self.invalidate(src)
        self.invalidate(dst)
        return FileStat.from_inode(dst, await self.master.link(src, dst))

    async def mknod(self, path: str, mode: int, rdev: int = 0, *, owner: tuple[int, int] | None = None) -> FileStat:
        """Create a FIFO, socket or device node (``mode`` carries the ``S_IF*`` type bits).

        Raises:
            AlreadyExists: the path exists. InvalidArgument: a regular-file or directory mode.
        """
        path = normalize(path)
        kind = type_of_mode(mode)
        if kind == pb.REGULAR or kind == pb.DIRECTORY or kind == pb.SYMLINK:
            raise InvalidArgument("mknod makes FIFOs, sockets and device nodes", path=path)
        self.invalidate(path)
        node = await self.master.create(
            path, mode=stat_mod.S_IMODE(mode), exclusive=True, truncate=False, block_size=0, replication=0,
            owner=_owner(owner), kind=kind, rdev=rdev,
        )  # fmt: skip
        return FileStat.from_inode(path, node)

    async def readlink(self, path: str) -> str:
        """Target of a symlink. Raises InvalidArgument if not a symlink."""
        st = await self.stat(path)
        if st.kind != "symlink":
            raise InvalidArgument("not a symbolic link", path=path)
        return st.symlink_target

    async def setattr(
        self,
        path: str,
        *,
        mode: int | None = None,
        mtime: float | None = None,
        atime: float | None = None,
        set_xattrs: dict[str, bytes] | None = None,
        remove_xattrs: list[str] | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> FileStat:
        """Change permissions, owner, times or extended attributes (times in seconds)."""
        path = normalize(path)
        self.invalidate(path)
        req = pb.SetAttrRequest(path=path, set_xattrs=set_xattrs or {}, remove_xattrs=remove_xattrs or [])
        if mode is not None:
            req.mode = mode & 0o7777
        if mtime is not None:
            req.mtime = mtime
        if atime is not None:
            req.atime = atime
        if uid is not None:
            req.uid = uid
        if gid is not None:
            req.gid = gid
        return FileStat.from_inode(path, await self.master.setattr(req))

    async def getxattrs(self, path: str) -> dict[str, bytes]:
        """Extended attributes of ``path``."""
        node = await self.master.stat(normalize(path))
        return dict(node.xattrs)

    async def truncate(self, path: str, size: int) -> None:
        """Cut or zero-extend a file to ``size`` bytes."""
        f = await self.open(path, "r+b")
        try:
            await f.truncate(size)
        finally:
            await f.close()

    async def status(self) -> pb.ClusterStatus:
        """Workers, capacity, load and replication health (from the leader)."""
        return await self.master.cluster_status()

    async def create_tenant(
        self, name: str, root: str = "", *, quota_bytes: int = 0, quota_inodes: int = 0
    ) -> pb.Tenant:
        """Make tenant ``name`` with its namespace root (default ``/NAME``) and quotas (bytes and
        inodes, 0: none); an admin token's call. ``issue_token`` gives it a token.

        Raises:
            PermissionDenied: not an admin token. AlreadyExists: the tenant exists.
            InvalidArgument: a bad name, or a root that is not new or empty, or is inside
                (or holds) another tenant's tree.
        """
        return await self.master.create_tenant(name, root, quota_bytes=quota_bytes, quota_inodes=quota_inodes)

    async def delete_tenant(self, name: str, *, purge: bool = False) -> None:
        """Remove tenant ``name``: its tokens stop working at once; with ``purge`` its files go
        too (else its root must be empty). An admin token's call.

        Raises:
            PermissionDenied. NotFound: no such tenant. DirectoryNotEmpty: files left, no purge.
        """
        await self.master.delete_tenant(name, purge=purge)

    async def set_quota(self, name: str, *, quota_bytes: int, quota_inodes: int) -> pb.Tenant:
        """Set tenant ``name``'s quotas in bytes and inodes (0: no limit). An admin token's call.

        Raises:
            PermissionDenied. NotFound: no such tenant.
        """
        return await self.master.set_quota(name, quota_bytes=quota_bytes, quota_inodes=quota_inodes)

    async def tenants(self) -> list[pb.Tenant]:
        """Every tenant with its root, quotas and usage (bytes, inodes, bytes reserved by open
        writers). An admin token's call; a tenant sees its own in ``status().tenants``."""
        return await self.master.list_tenants()

    async def issue_token(self, name: str, ttl: float = 0.0) -> str:
        """A new token of tenant ``name`` valid ``ttl`` seconds (0: until the key that signed it is
        dropped, or the tenant deleted). An admin token's call.

        Raises:
            PermissionDenied. NotFound: no such tenant.
        """
        return await self.master.issue_token(name, ttl)

    async def revoke_tokens(self, name: str) -> pb.Tenant:
        """Refuse every token of tenant ``name`` issued until now, on every master (a leaked one:
        no key rotation needed, no other tenant touched); tokens issued afterwards work. Returns
        the tenant's record (``revoked_before_ms``: milliseconds since the epoch). Block tokens
        the holders already got stay valid until they expire (``master.block_token_ttl``). An
        admin token's call.

        Raises:
            PermissionDenied. NotFound: no such tenant.
        """
        return await self.master.revoke_tokens(name)

    async def bind(
        self, path: str, uri: str, *, mode: str = "ro", meta_ttl: float = 60.0, check: bool = True
    ) -> pb.Bind:
        """Bind directory ``path`` to the under-store ``uri`` (``file:///abs``,
        ``s3://bucket/prefix?endpoint_url=...&profile=...``, ``oss://...``): made here, or an
        empty directory taken. ``mode``: ``ro`` or ``writeback``; ``meta_ttl``: seconds a listed
        entry is trusted before it is checked again (-1: never, the objects never change);
        ``check``: the master lists the store once first. An admin token's call.

        Raises:
            PermissionDenied: not an admin token, or the store refused the master's credentials.
            InvalidArgument: a bad mode, TTL or URI (credentials in it among them).
            Busy: binds do not nest. AlreadyExists: a file or non-empty directory is there.
            NotFound: no such bucket or parent directory. Unavailable, Timeout: the store.
        """
        return await self.master.bind(path, uri, mode=mode, meta_ttl=meta_ttl, check=check)

    async def unbind(self, path: str, *, force: bool = False) -> None:
        """Remove the bind at ``path`` and what is cached under it (the store keeps its objects).
        An admin token's call. Under a write-back bind, files not uploaded yet exist nowhere
        else: refused while any is waiting, unless ``force`` (they are dropped).

        Raises:
            PermissionDenied. NotFound: no bind there. Busy: write-back steps not done.
        """
        await self.master.unbind(path, force=force)

    async def refresh(self, path: str) -> FileStat:
        """List the bound directory ``path`` from its under-store again now (a bound file: check
        it with a HEAD), whatever its metadata TTL; returns its stat.

        Raises:
            NotFound: no such path. InvalidArgument: not listed from a bound store.
            PermissionDenied, Unavailable, Timeout: the store's answer.
        """
        return FileStat.from_inode(path, await self.master.refresh(path))

    async def load(
        self,
        path: str,
        *,
        metadata_only: bool = False,
        check: bool = False,
        concurrency: int = 32,
        on_progress: Callable[[LoadReport], None] | None = None,
    ) -> LoadReport:
        """Bring the files under ``path`` into the cache (``pcache load``); see :func:`pcache.client.load.load`.

        Raises:
            NotFound: no such path. PermissionDenied, Unavailable.
        """
        return await load(
            self, path, metadata_only=metadata_only, check=check, concurrency=concurrency, on_progress=on_progress
        )

    async def free(self, path: str) -> pb.FreeReport:
        """Evict the cached blocks of the bound files under ``path`` (``pcache free``).

        Raises:
            NotFound: no such path. PermissionDenied: outside the caller's tenant.
        """
        return await free(self, path)

    async def wait_persisted(
        self,
        path: str,
        *,
        timeout: float = 600.0,
        poll: float = 0.2,
        on_wait: Callable[[list[FileStat]], None] | None = None,
    ) -> int:
        """Block until every file at or under ``path`` in a write-back bind is in its store
        (``pcache persist --wait``); returns how many files were looked at. A file there that its
        writer has not closed yet (:meth:`unclosed`) is waited for too: it is uploaded once closed.
        ``on_wait`` hears the files still pending every :data:`WAIT_REPORT_EVERY` seconds (their
        ``persist_error``: why the last attempt failed, while it is retried).

        Raises:
            Unavailable: a file's upload keeps failing (``persist: failed``, its error named).
            Timeout: still pending after ``timeout`` seconds (a file never closed: named so).
            NotFound: no such path.
        """
        deadline = time.monotonic() + timeout
        waiting = [s async for s in self.files_under(path)]
        count = len(waiting)
        unclosed = await self.unclosed_check()
        report_at = time.monotonic() + WAIT_REPORT_EVERY
        while True:
            failed = [s for s in waiting if s.persist == "failed"]
            if failed:
                raise Unavailable(f"write-back of {failed[0].path} keeps failing: {failed[0].persist_error}")
            waiting = [s for s in waiting if s.persist == "pending" or unclosed(s)]
            if not waiting:
                return count
            if time.monotonic() > deadline:
                first = waiting[0]
                why = " (not closed by its writer: uploaded once it is)" if unclosed(first) else ""
                raise Timeout(
                    f"{len(waiting)} files under {path} not persisted after {timeout:g} s ({first.path}{why} ...)"
                )
            if on_wait is not None and time.monotonic() >= report_at:
                on_wait(waiting)
                report_at = time.monotonic() + WAIT_REPORT_EVERY
            await asyncio.sleep(poll)
            fresh = []
            for st in waiting:
                self.invalidate(st.path)
                with contextlib.suppress(NotFound):  # deleted meanwhile: nothing to wait for
                    fresh.append(await self.stat(st.path))
            waiting = fresh

    async def unclosed_check(self) -> Callable[[FileStat], bool]:
        """A test of whether a file is under a write-back bind and its writer has not closed it
        yet (no write-back state, not listed from the store): nothing is uploaded until it is
        (a writer that died leaves it so)."""
        roots = [b.path.rstrip("/") + "/" for b in await self.binds() if b.mode == "writeback"]

        def unclosed(st: FileStat) -> bool:
            return not st.persist and not st.listed and any(st.path.startswith(root) for root in roots)

        return unclosed

    async def files_under(self, path: str) -> AsyncIterator[FileStat]:
        self.invalidate(path)
        top = await self.stat(path)
        if not top.is_dir:
            yield top
            return
        stack = [top.path]
        while stack:
            async for entry in self.scandir(stack.pop()):
                if entry.is_dir:
                    stack.append(entry.path)
                elif entry.is_file:
                    yield entry

    async def binds(self) -> list[pb.Bind]:
        """The bound directories: every one for an admin, a tenant's own (in its view) else."""
        return await self.master.list_binds()

    async def master_statuses(self) -> list[tuple[str, pb.ClusterStatus | PCacheError]]:
        """Every master's own status (role, epoch, log position): (address, status or the error)."""
        return await self.master.master_statuses()

    async def layout(self, path: str, exclude_fetchers: Iterable[str] = ()) -> pb.FileLayout:
        """A file's inode and blocks, each with the addresses of its live replicas (not cached);
        an uncached block of a bound file names the worker that fetches it, never one of
        ``exclude_fetchers`` (worker ids found down).

        Raises:
            NotFound. IsADirectory. Unavailable: no live worker to fetch from.
        """
        return await self.master.layout(path=normalize(path), exclude_fetchers=exclude_fetchers)

    async def fsck(self, path: str = "/") -> pb.FsckReport:
        """Files under ``path`` with corrupt, missing or under-replicated blocks (see ``pcache fsck``)."""
        return await self.master.fsck(normalize(path))

    async def salvage(self, path: str, dest: str) -> SalvageResult:
        """Copy every readable chunk of a (damaged) file to the local file ``dest``; see :mod:`pcache.client.salvage`."""
        return await salvage(self, path, dest)

    # ----------------------------------------------------------- files ---

    async def open(
        self,
        path: str,
        mode: str = "rb",
        *,
        perm: int = 0o644,
        block_size: int = 0,
        replication: int = 0,
        owner: tuple[int, int] | None = None,
    ) -> PCacheFile:
        """Open a file. Modes as Python's binary modes: r, w, a, x, with optional +.

        ``block_size`` (bytes) and ``replication`` apply to files this call creates.

        Raises:
            NotFound: 'r' of a missing file. AlreadyExists: 'x' of an existing one.
            IsADirectory: the path is a directory.
        """
        path = normalize(path)
        _readable, writable, kind = parse_mode(mode)
        check_block_size(block_size)
        if replication < 0:
            raise InvalidArgument(f"replication must be >= 0, got {replication}")
        for _hop in range(MAX_SYMLINK_HOPS):
            layout = None
            if writable and kind != "r":
                self.invalidate(path)
                node = await self.master.create(
                    path,
                    mode=perm,
                    exclusive=kind == "x",
                    truncate=False,  # 'w' empties the file at commit: a failed writer leaves the old bytes
                    block_size=block_size or self.cfg.block_size,
                    replication=replication or self.cfg.replication,
                    owner=_owner(owner),
                )
                if node.type == pb.REGULAR and kind in "wx":
                    had_content = bool(node.size or node.blocks)
                    del node.blocks[:]
                    node.size = 0
                    f = PCacheFile(self, path, mode, pb.FileLayout(inode=node))  # empty: no layout RPC
                    # even with nothing written, close() commits the truncation, and under a
                    # write-back bind the close itself (the file is uploaded once it is closed)
                    f.dirty = had_content or node.persist != pb.PERSIST_NONE
                    return f
                if node.type == pb.SYMLINK:
                    path = _link_target(path, node.symlink_target)
                    continue
            cached = False
            if layout is None:
                layout = self._layout_cache.get(path) if not writable else None
                cached = layout is not None
            if layout is None:
                layout = await self.master.layout(path=path)
                if self.cfg.metadata_ttl > 0 and not writable:
                    self._layout_cache[path] = layout
                    self._cached_name(path, layout.inode)
            if layout.inode.type == pb.SYMLINK:
                path = _link_target(path, layout.inode.symlink_target)
                continue
            if layout.inode.type == pb.DIRECTORY:
                raise IsADirectory("is a directory", path=path)
            if layout.inode.type != pb.REGULAR:
                raise InvalidArgument(f"not a regular file ({KIND_NAMES.get(layout.inode.type)})", path=path)
            return PCacheFile(self, path, mode, layout, cached=cached)
        raise SymlinkLoop("too many levels of symbolic links", path=path)

    async def write_block(
        self,
        inode: int,
        data: bytes | bytearray,
        crc: int,
        chunk_crcs: list[int] | None = None,
        on_allocated: Callable[[int], None] | None = None,
    ) -> tuple[int, list[str], list[pb.WorkerAddr], str]:
        """Allocate a block for ``inode`` and store ``data`` on its pipeline; ``on_allocated``
        hears of every allocation as it is made (a caller cancelled meanwhile can give it back).

        Retries on another worker when the first target is dead, stalled or
        full, and waits up to ``client.nospace_wait`` seconds when every worker
        is full. Returns (block id, ids of replicas that stored it, their addresses,
        the block token that reads it back there).

        Raises:
            NoSpace: every worker stayed full. Unavailable: no worker took it.
            QuotaExceeded: the tenant's byte quota has no room for the block.
        """
        give_up_at = time.monotonic() + self.cfg.nospace_wait
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(NoSpace),
            stop=stop_after_delay(self.cfg.nospace_wait),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        ):
            with attempt:  # deletions free space within seconds: a full cluster is waited for a little
                return await self._write_block_once(inode, data, crc, chunk_crcs, give_up_at, on_allocated)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _write_block_once(
        self,
        inode: int,
        data: bytes | bytearray,
        crc: int,
        chunk_crcs: list[int] | None,
        give_up_at: float,
        on_allocated: Callable[[int], None] | None = None,
    ) -> tuple[int, list[str], list[pb.WorkerAddr], str]:
        """One allocation after another until a pipeline stores the block: up to 6 workers, but
        no other one after a worker out of room once ``give_up_at`` (``time.monotonic()``) passed
        (each full worker may spend its ``io_timeout`` making room first)."""
        exclude: list[str] = []
        last: PCacheError | None = None
        for _ in range(6):
            # workers that stalled or failed for this client lately are left out of the pipeline
            # (the master falls back to them only if nobody else has room)
            loc = await self._allocate(inode, len(data), exclude)
            if on_allocated is not None:
                on_allocated(loc.block_id)
            try:
                stored = await self.data.write(list(loc.replicas), loc.block_id, data, crc, loc.token, chunk_crcs)
            except WRITE_RETRY_ERRORS as exc:  # handled: INFO (a training job's stderr is not the place)
                logger.info(
                    "block %d on %s failed (%s); trying another worker", loc.block_id, loc.replicas[0].worker_id, exc
                )
                exclude.append(loc.replicas[0].worker_id)
                last = exc
                await self._give_up(inode, loc)  # its quota and whatever part of it a worker stored
                if isinstance(exc, NoSpace) and time.monotonic() >= give_up_at:
                    break
                continue
            return loc.block_id, stored, self.stored_at(list(loc.replicas), stored), loc.token
        assert last is not None
        raise last

    def stored_at(self, targets: list[pb.WorkerAddr], stored: list[str]) -> list[pb.WorkerAddr]:
        """The addresses of the ``targets`` that stored a block (the others become suspects:
        dropped from the pipeline, stalled or failed downstream)."""
        for addr in targets:
            if addr.worker_id not in stored:
                self.data.health.suspect(addr.worker_id)
        by_id = {a.worker_id: a for a in targets}
        return [by_id[w] for w in stored if w in by_id]

    async def open_stream(self, inode: int, length: int) -> BlockStream | None:
        """Allocate a block of ``length`` bytes for ``inode`` and open it for writing straight into
        its file on this host's worker (:class:`BlockStream`). None when the block was placed on
        another host or the local worker cannot take it: the caller buffers the block, and the
        allocation is given up (``AbandonBlocks``: its token cannot be revoked, but its workers
        refuse the id).

        Raises:
            Unavailable, Timeout: the master.
        """
        if time.monotonic() < self._stream_off_until:
            return None
        try:
            loc = await self._allocate(inode, length, [])
        except NoSpace:
            return None  # the buffered block waits for room when it is stored (nospace_wait)
        except QuotaExceeded:
            # a whole block does not fit the quota; the file may end before the block does, and a
            # buffered block is allocated at its own length when stored (a 40 MiB file needed
            # 64 MiB of quota: its second block was reserved whole)
            return None
        targets = list(loc.replicas)
        if not (targets and self.data.can_short_circuit(targets[0])):
            # no worker on this host (or it is full or suspect): buffer for a while, so that a
            # client on a node without a worker does not spend an allocation per file finding out
            self._stream_off_until = time.monotonic() + STREAM_RETRY_SECONDS
            await self._give_up(inode, loc)
            return None
        try:
            return await self.data.open_stream(targets, loc.block_id, length, loc.token)
        except PCacheError as exc:  # full, gone: the buffered path places the block elsewhere
            logger.debug("block %d: cannot stream into %s: %s", loc.block_id, targets[0].worker_id, exc)
            await self._give_up(inode, loc)
            return None

    async def _give_up(self, inode: int, loc: pb.BlockLocation) -> None:
        """Abandon an allocation nothing was written to, best effort (else it expires)."""
        try:
            await self.abandon_blocks(inode, [loc.block_id])
        except PCacheError as exc:
            logger.debug("block %d: cannot give it up: %s", loc.block_id, exc)

    async def _allocate(self, inode: int, size: int, exclude: list[str]) -> pb.BlockLocation:
        suspects = [w for w in self.data.health.suspects() if w not in exclude]
        if suspects:
            try:
                return await self.master.allocate_block(inode, size, self.node_id, exclude + suspects)
            except NoSpace:
                pass  # only the suspects have room: better them than nothing
        return await self.master.allocate_block(inode, size, self.node_id, exclude)

    async def commit(
        self,
        path: str,
        inode: int,
        size: int,
        blocks: list[pb.CommittedBlock],
        view: View,
        *,
        closing: bool = False,
        mtime: float = 0.0,
    ) -> pb.Inode:
        """Publish a file's new block list (called by :meth:`PCacheFile.fsync`); returns the committed inode.

        ``view`` is the commit the writer's view starts from; the master merges the blocks it
        changed with other writers' commits since, unless ``view.replace`` (see
        ``Namespace.commit_file``). ``mtime`` (seconds since the epoch) defaults to now.

        Raises:
            Conflict: another writer changed the same blocks since that view; nothing was committed.
        """
        self.invalidate(path, inode=inode)
        return await self.master.commit_file(
            inode, size, blocks, mtime or time.time(), base_version=view.version, base_blocks=view.blocks, replace=view.replace,
            path=normalize(path), closing=closing,
        )  # fmt: skip

    async def layout_of(self, inode: int, exclude_fetchers: Iterable[str] = ()) -> pb.FileLayout:
        """The committed layout of ``inode`` (always asked of the master: no cache); uncached
        blocks name a fetcher other than ``exclude_fetchers`` (worker ids found hung or gone)."""
        return await self.master.layout(inode=inode, exclude_fetchers=exclude_fetchers)

    async def report_bad_block(self, worker_id: str, block_id: int) -> None:
        """Tell the master the replica of ``block_id`` on ``worker_id`` failed its CRC check."""
        await self.master.report_bad_block(worker_id, block_id)

    async def abandon_blocks(self, inode: int, block_ids: list[int]) -> None:
        """Tell the master this client gives up blocks allocated for ``inode`` that it will not
        commit (``AbandonBlocks``): they stop holding the tenant's quota, and the workers
        delete them now. A master of a release without the call ignores them (they expire).

        Raises:
            Unavailable, Timeout: the master. NotFound: no such inode.
        """
        try:
            await self.master.abandon_blocks(inode, block_ids)
        except NotSupported:
            pass
        except (Unavailable, Timeout):  # told again once the master answers (a close failed in an outage)
            self._owed_abandons.setdefault(inode, set()).update(block_ids)
            self._settle_later()
            raise

    async def discard_created(self, path: str, inode: int) -> None:
        """Remove ``path`` if it is still ``inode`` and still empty (untouched by another writer).

        A master that does not answer (a failed close during an outage) has it tried again in
        the background every ``DISCARD_RETRY_SECONDS`` while this client is open, for up to
        ``DISCARD_GIVE_UP_SECONDS`` (the empty file stayed for good, taken for a finished output).

        Raises:
            Unavailable, Timeout: not removed yet (it will be tried again).
        """
        try:
            await self._discard_created_now(path, inode)
        except (Unavailable, Timeout):
            self._owed_discards[inode] = path
            self._settle_later()
            raise

    def _settle_later(self) -> None:
        if self._settling is None or self._settling.done():
            self._settling = asyncio.ensure_future(self._settle_owed())

    async def _discard_created_now(self, path: str, inode: int) -> None:
        st = await self.stat(path)
        if st.inode == inode and st.size == 0:
            await self.unlink(path)

    async def _settle_owed(self) -> None:
        """Once the master answers, remove the files failed writers created (:meth:`discard_created`)
        and give up the blocks they were allocated (:meth:`abandon_blocks`: a close that failed
        while the master restarted left them charged to the tenant's quota for ``orphan_grace``,
        600 s, and a tenant near its quota got EDQUOT for that long)."""
        give_up = time.monotonic() + DISCARD_GIVE_UP_SECONDS
        while (self._owed_discards or self._owed_abandons) and time.monotonic() < give_up:
            await asyncio.sleep(DISCARD_RETRY_SECONDS)
            for inode, block_ids in list(self._owed_abandons.items()):
                try:
                    await self.master.abandon_blocks(inode, sorted(block_ids))
                except (Unavailable, Timeout):
                    continue
                except PCacheError as exc:  # the inode is gone: its reservations went with it
                    logger.debug("blocks %s of inode %d not given up: %s", sorted(block_ids), inode, exc)
                del self._owed_abandons[inode]
            for inode, path in list(self._owed_discards.items()):
                try:
                    await self._discard_created_now(path, inode)
                except (Unavailable, Timeout):
                    continue
                except PCacheError as exc:  # gone, or another one now: nothing of that writer's to remove
                    logger.debug("%s: the file a failed writer created was not removed: %s", path, exc)
                else:
                    logger.info("%s: removed the empty file a failed writer created", path)
                del self._owed_discards[inode]
        for path in self._owed_discards.values():
            logger.warning("%s: the empty file a failed writer created is left: the master did not answer", path)
        self._owed_discards.clear()

    async def read_file(self, path: str) -> bytes:
        """Whole content of a file."""
        async with await self.open(path, "rb") as f:
            return await f.read()

    async def write_file(self, path: str, data: bytes, **kwargs) -> None:
        """Replace a file's content with ``data``."""
        async with await self.open(path, "wb", **kwargs) as f:
            await f.write(data)

    # ------------------------------------------------------ tree copies ---

    async def put(self, local: str, remote: str) -> tuple[int, int]:
        """Copy a local file or directory tree into PCache; returns (files, bytes). See :func:`tree.put`."""
        return await tree.put(self, local, remote)

    async def get(self, remote: str, local: str) -> tuple[int, int]:
        """Copy a PCache file or tree to the local disk; returns (files, bytes). See :func:`tree.get`."""
        return await tree.get(self, remote, local)

    async def du(self, path: str) -> tuple[int, int, int]:
        """(bytes, files, directories) under ``path``. See :func:`tree.du`."""
        return await tree.du(self, path)
