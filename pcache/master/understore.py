"""The master's side of under storage: lazy metadata of bound directories (Ling report §2.3.1, a
file cache over object storage; ``../shared/DESIGN.md``, "under storage"; Alluxio's metadata
sync, JuiceFS's and Fluid's lazy listing).

A call that looks at a path under a bind first brings what it looks at up to date
(:meth:`UnderStores.ready`): a name a bound directory does not know (and whose listing is not
fresh) is looked up alone in the store; a ``ListDir`` lists the level (delimiter ``/``, paged)
when it never was or its bind's ``meta_ttl`` passed, answering each page as soon as the store
has listed past it; a file listed or checked longer ago than the TTL is checked with a HEAD. What a listing finds is written as
namespace mutations (replicated like any other), so the follower that takes over knows it. A
failed listing is an error for the call and is never recorded as an empty directory; concurrent
calls on one directory share one listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from objstore import ObjectStore, open_store
from objstore import errors as S
from pcache.common import errors as E
from pcache.common import ufs
from pcache.common.metrics import MASTER_UFS_CALLS
from pcache.common.paths import normalize
from pcache.master.binds import stale
from pcache.proto import pcache_pb2 as pb

if TYPE_CHECKING:
    from pcache.master.server import MasterServer

logger = logging.getLogger(__name__)

PAGE = 1000  # keys per listed page
NAME_MAX = 255  # bytes of one name


def _key_bound(name: str) -> str:
    """The store key a listing must have passed for every name up to ``name`` (in name order) to
    be recorded. A directory is listed as ``dir/``, and ``/`` sorts after ``-``, ``.`` and the other
    characters below it: ``data/`` comes after ``data.csv`` in the store, before it by name. So
    the bound is ``name/`` cut at the first character below ``/`` (``data.csv`` -> ``data/``)."""
    for i, ch in enumerate(name):
        if ch < "/":
            return name[:i] + "/"
    return name + "/"


def _name_ok(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\x00" not in name and len(name.encode()) <= NAME_MAX


class UnderStores:
    """One :class:`~objstore.base.ObjectStore` per bound URI, and the listings in flight."""

    def __init__(self, master: MasterServer) -> None:
        self.m = master
        self._stores: dict[str, ObjectStore] = {}
        self._listing: dict[int, asyncio.Future] = {}
        self._progress: dict[int, str] = {}  # directory inode -> the last key its running listing recorded

    def store(self, bind: pb.Bind) -> ObjectStore:
        """The store of ``bind`` (opened once; credentials resolve on this host)."""
        store = self._stores.get(bind.uri)
        if store is None:
            try:
                store = self._stores[bind.uri] = open_store(bind.uri)
            except S.StoreError as exc:
                raise ufs.translate(exc, bind.uri) from exc
        return store

    async def close(self) -> None:
        for store in self._stores.values():
            with contextlib.suppress(S.StoreError, OSError, TimeoutError):
                await asyncio.wait_for(store.close(), 5.0)
        self._stores.clear()

    async def ready(self, path: str, *, listing: bool = False, unknown: bool = False) -> None:
        """Bring what a call at ``path`` (a namespace path) looks at up to date with the store:
        each name on the way that a bound directory does not know (and whose listing is not
        fresh) is looked up alone (HEAD of the key, else one key under ``name/``), so a ``stat`` or
        ``open`` deep in a large bucket costs a request or two, not a listing; ``path`` itself is
        HEAD-checked when it is a bound file older than the TTL, and listed when it is a bound
        directory and ``listing`` (a ``ListDir``; :meth:`page_ready` answers its pages as they come).
        ``unknown``: look a name up even when its directory's listing is fresh (``pcache refresh``
        of an object put in the store since).

        Raises:
            NotFound, PermissionDenied, Unavailable, Timeout: the store's answer (nothing is
                recorded then).
        """
        ns, _ = self.m.leading()
        bind = ns.binds.covering(path)
        if bind is None:
            return
        path = normalize(path)
        rest = path[len(bind.path) :].strip("/")
        parts = rest.split("/") if rest else []
        ino, listed_at = bind.inode, 0.0
        for i in range(len(parts) + 1):
            ns, _ = self.m.leading()
            try:
                node = ns.get_inode(ino)
            except E.NotFound:
                return  # gone meanwhile: the call itself says so
            if node.type != pb.DIRECTORY:
                if i == len(parts) and node.bind and node.type == pb.REGULAR:
                    await self._check_file(node, bind, max(node.seen, listed_at))
                return
            if ns.ufs_level(node) is None:
                return  # a directory written here, not listed from the store
            if i == len(parts):
                if listing:
                    await self.listed(node)
                return
            child = ns.child(ino, parts[i])
            if child is None and (unknown or stale(bind, node.listed, time.time())):
                await self._probe(node, parts[i])
                ns, _ = self.m.leading()
                child = ns.child(ino, parts[i])
            if child is None:
                return
            listed_at = node.listed
            ino = child

    def listing(self, node: pb.Inode, *, force: bool = False) -> asyncio.Future | None:
        """The listing of the bound directory ``node`` under way: started when it never was
        listed or its TTL passed (or ``force``); None when it is fresh or not bound."""
        ns, _ = self.m.leading()
        level = ns.ufs_level(node)
        if level is None:
            return None
        bind, _prefix = level
        running = self._listing.get(node.id)
        if running is None:
            if not force and not stale(bind, node.listed, time.time()):
                return None
            running = self._listing[node.id] = asyncio.ensure_future(self._list(node.id))
            running.add_done_callback(lambda _: self._listing.pop(node.id, None))
            running.add_done_callback(lambda task: task.cancelled() or task.exception())  # seen, even if unread
        return running

    async def listed(self, node: pb.Inode, *, force: bool = False) -> None:
        """List the bound directory ``node`` from its store unless its listing is fresh."""
        running = self.listing(node, force=force)
        if running is not None:
            await asyncio.shield(running)

    async def page_ready(self, node: pb.Inode, start_after: str, limit: int) -> None:
        """Wait until a page of ``node`` (``limit`` names after ``start_after``) is final: its
        listing is done, or has recorded names past the page's last one (a store lists in key
        order, the namespace in name order: the same order), so a client paging a huge
        directory gets each page as soon as the store has listed that far.

        Raises:
            as :meth:`ready`.
        """
        running = self.listing(node)
        while running is not None and not running.done():
            ns, _ = self.m.leading()
            entries, more = ns.listdir_of(node.id, start_after=start_after, limit=limit)
            if more and _key_bound(entries[-1].name) <= self._progress.get(node.id, ""):
                return
            await asyncio.wait([running], timeout=0.2)
        if running is not None:
            running.result()

    async def _probe(self, node: pb.Inode, name: str) -> None:
        """Look one name up in the store (a HEAD, else one key under ``name/``) and record it."""
        if not _name_ok(name):
            return
        ns, _ = self.m.leading()
        level = ns.ufs_level(node)
        if level is None:
            return
        bind, prefix = level
        store = self.store(bind)
        objects: list[tuple[str, int, str, float]] = []
        dirs: list[str] = []
        MASTER_UFS_CALLS.labels("lookup").inc()
        try:
            info = await ufs.call(store.head(prefix + name), bind.uri, self.m.cfg.ufs_timeout)
            objects.append((name, info.size, ufs.version_tag(info), info.mtime))
        except E.NotFound:
            page = await ufs.call(
                store.list_page(prefix + name + "/", delimiter="/", max_keys=1), bind.uri, self.m.cfg.ufs_timeout
            )
            if page.objects or page.prefixes:
                dirs.append(name)
        if objects or dirs:
            ns, blocks = self.m.leading()
            blocks.freed(ns.merge_listing(node.id, objects, dirs, time.time()))
            await self.m.commit()

    async def _list(self, dir_id: int) -> None:
        try:
            await self._list_pages(dir_id)
        finally:
            self._progress.pop(dir_id, None)

    async def _list_pages(self, dir_id: int) -> None:
        started = time.time()
        ns, _ = self.m.leading()
        level = ns.ufs_level(ns.get_inode(dir_id))
        if level is None:
            return
        bind, prefix = level
        store = self.store(bind)
        names: set[str] = set()
        after = ""
        skipped = 0
        while True:
            MASTER_UFS_CALLS.labels("list").inc()
            page = await ufs.call(
                store.list_page(prefix, delimiter="/", start_after=after, max_keys=PAGE),
                bind.uri, self.m.cfg.ufs_timeout,
            )  # fmt: skip
            objects = []
            for info in page.objects:
                name = info.key[len(prefix) :]
                if name == "":
                    continue  # the directory's own marker key
                if _name_ok(name):
                    objects.append((name, info.size, ufs.version_tag(info), info.mtime))
                else:
                    skipped += 1
            dirs = []
            for common in page.prefixes:
                name = common[len(prefix) :].rstrip("/")
                if _name_ok(name):
                    dirs.append(name)
                else:
                    skipped += 1
            names.update(n for n, *_ in objects)
            names.update(dirs)
            ns, blocks = self.m.leading()
            blocks.freed(ns.merge_listing(dir_id, objects, dirs, time.time()))
            last = [*(o.key for o in page.objects), *page.prefixes]
            if not page.truncated or not last:
                break
            after = max(last)
            self._progress[dir_id] = after[len(prefix) :]
        ns, blocks = self.m.leading()
        blocks.freed(ns.finish_listing(dir_id, names, started))
        if skipped:
            logger.warning("%s%s: %d keys are not file names here (., .., //, over 255 bytes); not shown",
                           bind.uri, "/" + prefix if prefix else "", skipped)  # fmt: skip
        await self.m.commit()

    async def _check_file(self, node: pb.Inode, bind: pb.Bind, when: float) -> None:
        if not stale(bind, when, time.time()):
            return
        store = self.store(bind)
        MASTER_UFS_CALLS.labels("head").inc()
        try:
            info = await ufs.call(store.head(node.ufs_key), bind.uri, self.m.cfg.ufs_timeout)
            found: tuple[int, str, float] | None = (info.size, ufs.version_tag(info), info.mtime)
        except E.NotFound:
            found = None
        ns, blocks = self.m.leading()
        blocks.freed(ns.ufs_checked(node.id, found, time.time()))
        await self.m.commit()

    async def refresh(self, path: str) -> None:
        """``pcache refresh``: list the bound directory at ``path`` again now (a file: HEAD it).

        Raises:
            NotFound: no such path, here or in the store. InvalidArgument: not under a bind.
        """
        await self.ready(path, unknown=True)  # a name not seen yet (put upstream since): looked up
        ns, _ = self.m.leading()
        node = ns.resolve(path)
        if node.type == pb.DIRECTORY:
            if ns.ufs_level(node) is None:
                raise E.InvalidArgument("not a directory listed from a bound store (pcache binds)", path=path)
            await self.listed(node, force=True)
            return
        bind = ns.binds.of_inode(node.bind) if node.bind else None
        if bind is None:
            raise E.InvalidArgument("not a file listed from a bound store (pcache binds)", path=path)
        await self._check_file(node, bind, 0.0)
