"""The namespace: inodes, dentries and the file → block map, on a MetaStore.

Key layout (all integers big-endian so that key order is numeric order)::

    i<inode:8>             -> Inode      (protobuf)
    d<parent:8><name>      -> <inode:8>  (dentry)
    b<block:8>             -> BlockMeta  (protobuf)
    c<counter>             -> <value:8>  (id high-water marks)
    a<block:8>             -> reservation of an uncommitted block (:mod:`.allocations`)
    t<name>                -> Tenant     (root, quotas, usage: :mod:`.tenants`)
    u<path>                -> Bind       (a directory bound to an under-store: :mod:`.binds`)

Each public method is one mutation applied as one atomic batch, so a crash
leaves either the old or the new tree. Methods are synchronous and are called
from the master's single event loop, which serialises them (no locks). Paths
are looked up without following symlinks (the kernel resolves them for FUSE).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pcache.common import errors as E
from pcache.common.auth import check_name
from pcache.common.layout import HOLE, MAX_BLOCK_SIZE, MAX_REPLICATION, MIN_BLOCK_SIZE, check_file_size
from pcache.common.paths import PATH_MAX, normalize, parent_and_name, split_path
from pcache.master.allocations import Allocations
from pcache.master.binds import IMMUTABLE, MODES, Binds, check_uri, overlap
from pcache.master.metastore import MetaStore
from pcache.master.tenants import RESERVED_TENANTS, Tenants, add, freed_bytes
from pcache.master.writeback import PersistQueue
from pcache.proto import pcache_pb2 as pb

ROOT = 1
SPECIAL_TYPES = (pb.FIFO, pb.CHAR_DEVICE, pb.BLOCK_DEVICE, pb.SOCKET)
U64 = struct.Struct(">Q")
ID_BATCH = 1024  # ids reserved per counter write


def _ikey(ino: int) -> bytes:
    return b"i" + U64.pack(ino)


def _dkey(parent: int, name: str) -> bytes:
    return b"d" + U64.pack(parent) + name.encode("utf-8", "surrogateescape")


def links(node: pb.Inode) -> int:
    """Names of a non-directory inode (``nlink``; inodes made before hard links count 1)."""
    return node.nlink or 1


def _bkey(block: int) -> bytes:
    return b"b" + U64.pack(block)


@dataclass
class Freed:
    """Blocks dropped by a mutation; their replicas must be deleted on workers."""

    blocks: list[pb.BlockMeta]


class _Counter:
    """Monotonic id source persisted in ranges of ``ID_BATCH`` (gaps after restart are fine)."""

    def __init__(self, store: MetaStore, key: bytes, first: int) -> None:
        self._store = store
        self._key = key
        raw = store.get(key)
        self._next = U64.unpack(raw)[0] if raw else first
        self._limit = self._next

    def peek(self) -> int:
        """The next id :meth:`take` returns."""
        return self._next

    def take(self) -> int:
        if self._next >= self._limit:
            self._limit = self._next + ID_BATCH
            self._store.write([(self._key, U64.pack(self._limit))])
        value = self._next
        self._next += 1
        return value


class Namespace:
    """Domain object behind the master's namespace RPCs; no network in here."""

    def __init__(
        self,
        store: MetaStore,
        *,
        default_block_size: int,
        default_replication: int,
        allocation_grace: float = 600.0,
        default_tenant: str = "",
    ) -> None:
        self.store = store
        self.default_block_size = default_block_size
        self.default_replication = default_replication
        self._inodes = _Counter(store, b"cinode", ROOT + 1)
        self._blocks = _Counter(store, b"cblock", 1)
        # blocks allocated and not yet committed: a commit may adopt only those of its own inode
        self.allocations = Allocations(store, self._blocks.peek, grace=allocation_grace)
        if self.store.get(_ikey(ROOT)) is None:
            now = time.time()
            root = pb.Inode(id=ROOT, type=pb.DIRECTORY, mode=0o755, mtime=now, ctime=now, atime=now)
            self.store.write([(_ikey(ROOT), root.SerializeToString())])
        self.tenants = Tenants(store)
        self.binds = Binds(store)
        self.persist = PersistQueue(store)  # write-back steps of writeback binds (pcache.master.writeback)
        if default_tenant and default_tenant not in self.tenants and not self.tenants.deleted(default_tenant):
            self.create_tenant(default_tenant)  # made at the first start; an admin's delete stands

    # ------------------------------------------------------------ lookups --

    def _get_inode(self, ino: int) -> pb.Inode:
        raw = self.store.get(_ikey(ino))
        if raw is None:
            raise E.NotFound(f"inode {ino} does not exist")
        node = pb.Inode()
        node.ParseFromString(raw)
        return node

    def _lookup(self, parent: int, name: str) -> int | None:
        raw = self.store.get(_dkey(parent, name))
        return U64.unpack(raw)[0] if raw else None

    def child(self, parent: int, name: str) -> int | None:
        """The inode number of entry ``name`` of directory ``parent``, or None."""
        return self._lookup(parent, name)

    def resolve(self, path: str) -> pb.Inode:
        """Return the inode at ``path`` (with ``name`` filled in).

        Raises:
            InvalidPath: malformed path. NotFound: a component is missing.
            NotADirectory: a middle component is not a directory.
        """
        parts = split_path(path)
        node = self._get_inode(ROOT)
        for i, part in enumerate(parts):
            if node.type != pb.DIRECTORY:
                raise E.NotADirectory("not a directory", path="/" + "/".join(parts[:i]))
            child = self._lookup(node.id, part)
            if child is None:
                raise E.NotFound("no such file or directory", path=path)
            node = self._get_inode(child)
        node.name = parts[-1] if parts else "/"
        return node

    def _resolve_parent(self, path: str) -> tuple[pb.Inode, str]:
        parent_path, name = parent_and_name(path)
        try:
            parent = self.resolve(parent_path)
        except E.NotFound as exc:
            raise E.NotFound("parent directory does not exist", path=parent_path) from exc  # the one missing
        if parent.type != pb.DIRECTORY:
            raise E.NotADirectory("parent is not a directory", path=parent_path)
        return parent, name

    def get_block(self, block_id: int) -> pb.BlockMeta | None:
        """Return the stored record of ``block_id``, or None."""
        raw = self.store.get(_bkey(block_id))
        if raw is None:
            return None
        meta = pb.BlockMeta()
        meta.ParseFromString(raw)
        return meta

    def iter_blocks(self) -> Iterable[pb.BlockMeta]:
        """Yield every committed block record."""
        for _, raw in self.store.scan(b"b"):
            meta = pb.BlockMeta()
            meta.ParseFromString(raw)
            yield meta

    def count(self) -> tuple[int, int]:
        """(inodes, blocks) currently stored; a full scan."""
        inodes = sum(1 for _ in self.store.scan(b"i"))
        blocks = sum(1 for _ in self.store.scan(b"b"))
        return inodes, blocks

    def _is_empty_dir(self, ino: int) -> bool:
        prefix = b"d" + U64.pack(ino)
        return next(iter(self.store.scan(prefix)), None) is None

    # ---------------------------------------------------------- mutations --

    def _new_inode(self, parent: pb.Inode, kind: pb.FileType, mode: int, *, listed: bool = False, **fields) -> pb.Inode:
        """A fresh inode in ``parent``: of its tenant, within the tenant's inode quota, unless it is
        ``listed`` from an under-store (cache of the store an admin bound, as its blocks are: not
        counted, so a tenant at its quota still lists its datasets, and a dataset listed does
        not use up the quota its checkpoints need).

        Raises:
            QuotaExceeded: the tenant has used its inode quota.
        """
        if not listed:
            self.tenants.check_inodes(parent.tenant)
        now = time.time()
        return pb.Inode(
            id=self._inodes.take(),
            type=kind,
            mode=mode & 0o7777,
            mtime=now,
            ctime=now,
            atime=now,
            version=1,
            tenant=parent.tenant,
            **fields,
        )

    def _added(self, node: pb.Inode) -> list[tuple[bytes, bytes]]:
        """Batch entries counting the new ``node`` against its tenant's usage."""
        return self.tenants.charge({node.tenant: [1, 0]})

    def _touch(self, node: pb.Inode, now: float) -> bytes:
        node.mtime = node.ctime = now
        return _record(node)

    def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False, uid: int = 0, gid: int = 0) -> pb.Inode:
        """Create a directory (``mkdir -p`` with ``parents``).

        Raises:
            AlreadyExists: the path exists (unless ``parents`` and it is a directory).
            NotFound: the parent is missing and ``parents`` is false.
            NotADirectory: a component is a file.
        """
        parts = split_path(path)
        if not parts:
            if parents:
                return self.resolve("/")
            raise E.AlreadyExists("the root exists", path="/")
        if parents:
            node = self._get_inode(ROOT)
            for i, part in enumerate(parts):
                child = self._lookup(node.id, part)
                if child is None:
                    self.binds.check_writable("/" + "/".join(parts[: i + 1]))
                    node = self._mkdir_in(node, part, mode, uid, gid)
                else:
                    node = self._get_inode(child)
                    if node.type != pb.DIRECTORY:
                        if i == len(parts) - 1:  # as `mkdir -p` and os.makedirs: the path itself exists
                            raise E.AlreadyExists("file exists", path=path)
                        raise E.NotADirectory("not a directory", path="/" + "/".join(parts[: i + 1]))
            node.name = parts[-1]
            return node
        parent, name = self._resolve_parent(path)
        if self._lookup(parent.id, name) is not None:
            raise E.AlreadyExists("file exists", path=path)
        self.binds.check_writable(path)
        node = self._mkdir_in(parent, name, mode, uid, gid)
        node.name = name
        return node

    def _mkdir_in(self, parent: pb.Inode, name: str, mode: int, uid: int = 0, gid: int = 0) -> pb.Inode:
        node = self._new_inode(parent, pb.DIRECTORY, mode, uid=uid, gid=gid)
        now = node.mtime
        parent.subdirs += 1
        self.store.write(
            [
                (_ikey(node.id), node.SerializeToString()),
                (_dkey(parent.id, name), U64.pack(node.id)),
                (_ikey(parent.id), self._touch(parent, now)),
                *self._added(node),
            ]
        )
        return node

    def create(
        self,
        path: str,
        mode: int = 0o644,
        *,
        exclusive: bool = False,
        truncate: bool = False,
        block_size: int = 0,
        replication: int = 0,
        uid: int = 0,
        gid: int = 0,
        kind: pb.FileType = pb.REGULAR,
        rdev: int = 0,
    ) -> tuple[pb.Inode, Freed]:
        """Create (or open, or truncate) a regular file.

        Returns:
            (the inode, blocks freed by truncation)

        Raises:
            AlreadyExists: ``exclusive`` and the path exists.
            IsADirectory: the path is a directory.
            NotFound / NotADirectory: bad parent.
        """
        parent, name = self._resolve_parent(path)
        existing = self._lookup(parent.id, name)
        if existing is None or (truncate and not exclusive):  # opening what is there changes nothing
            self.binds.check_writable(path)
        if kind not in SPECIAL_TYPES and kind != pb.REGULAR:
            raise E.InvalidArgument(f"create makes regular or special files, not type {kind}", path=path)
        if existing is not None:
            if exclusive or kind != pb.REGULAR:
                raise E.AlreadyExists("file exists", path=path)
            node = self._get_inode(existing)
            if node.type == pb.DIRECTORY:
                raise E.IsADirectory("is a directory", path=path)
            if truncate:
                self._check_bound_writable(node, path)
            freed = Freed([])
            # only a regular file has content to drop (a symlink's size is its target's length)
            if truncate and node.type == pb.REGULAR and (node.size or node.blocks):
                freed = self._replace_blocks(node, [], 0, time.time())
            node.name = name
            return node, freed
        if block_size and not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
            raise E.InvalidArgument(f"block size must be {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} bytes", path=path)
        if replication < 0 or replication > MAX_REPLICATION:
            raise E.InvalidArgument(f"replication must be 0 (default) .. {MAX_REPLICATION}", path=path)
        node = self._new_inode(
            parent,
            kind,
            mode,
            rdev=rdev,
            block_size=block_size or self.default_block_size,
            replication=replication or self.default_replication,
            uid=uid,
            gid=gid,
        )
        self.store.write(
            [
                (_ikey(node.id), node.SerializeToString()),
                (_dkey(parent.id, name), U64.pack(node.id)),
                (_ikey(parent.id), self._touch(parent, node.mtime)),
                *self._added(node),
            ]
        )
        node.name = name
        node.created = True
        if kind == pb.REGULAR and self.writeback_target(path) is not None:
            node.persist = pb.PERSIST_PENDING  # in the reply only: its close uploads it (the commit queues it)
        return node, Freed([])

    def symlink(self, path: str, target: str, *, uid: int = 0, gid: int = 0) -> pb.Inode:
        """Create a symbolic link at ``path`` pointing to ``target`` (not validated).

        Raises:
            AlreadyExists: the path exists. InvalidArgument: empty target.
        """
        self.binds.check_writable(path)
        if not target or "\x00" in target:
            raise E.InvalidArgument("symlink target must be non-empty without NUL", path=path)
        if len(target.encode("utf-8", "surrogateescape")) >= PATH_MAX:
            raise E.NameTooLong(f"a symlink target holds fewer than {PATH_MAX} bytes", path=path)
        parent, name = self._resolve_parent(path)
        if self._lookup(parent.id, name) is not None:
            raise E.AlreadyExists("file exists", path=path)
        node = self._new_inode(
            parent,
            pb.SYMLINK,
            0o777,
            symlink_target=target,
            size=len(target.encode("utf-8", "surrogateescape")),
            uid=uid,
            gid=gid,
        )
        self.store.write(
            [
                (_ikey(node.id), node.SerializeToString()),
                (_dkey(parent.id, name), U64.pack(node.id)),
                (_ikey(parent.id), self._touch(parent, node.mtime)),
                *self._added(node),
            ]
        )
        node.name = name
        return node

    def link(self, src: str, dst: str) -> pb.Inode:
        """Make ``dst`` another name of the non-directory at ``src`` (a hard link; a symlink at
        ``src`` is linked itself, as ``linkat`` without ``AT_SYMLINK_FOLLOW``). The inode counts its
        names (``nlink``); its content, blocks and byte charge are shared, and it goes when its
        last name does. Each name counts against the tenant's inode quota (a quota of entries:
        otherwise links would make names without bound).

        Raises:
            NotFound: ``src``, or ``dst``'s parent. AlreadyExists: ``dst`` exists.
            NotPermitted: ``src`` is a directory (link(2)'s EPERM).
            QuotaExceeded: the tenant has used its inode quota.
            CrossTenant: the names are in two tenants' trees (EXDEV).
            NotSupported: either name is under a bound path (one object per name in the store).
        """
        src_parent, src_name = self._resolve_parent(src)
        ino = self._lookup(src_parent.id, src_name)
        if ino is None:
            raise E.NotFound("no such file or directory", path=src)
        node = self._get_inode(ino)
        if node.type == pb.DIRECTORY:
            raise E.NotPermitted("a directory cannot be hard-linked", path=src)
        dst_parent, dst_name = self._resolve_parent(dst)
        if self._lookup(dst_parent.id, dst_name) is not None:
            raise E.AlreadyExists("file exists", path=dst)
        for path in (src, dst):
            bind = self.binds.covering(path)
            if bind is not None or node.bind:
                raise E.NotSupported(f"hard links are not supported under a bound path ({bind.uri if bind else 'bound'})",
                                     path=path)  # fmt: skip
        if node.tenant != dst_parent.tenant:
            raise E.CrossTenant(
                f"cannot link across tenants ({node.tenant or 'no tenant'!r} -> {dst_parent.tenant or 'no tenant'!r})",
                path=dst,
            )
        self.tenants.check_inodes(node.tenant)  # each name is charged: links cannot make free entries
        now = time.time()
        node.nlink = links(node) + 1
        node.ctime = now
        self.store.write(
            [
                (_ikey(node.id), node.SerializeToString()),
                (_dkey(dst_parent.id, dst_name), U64.pack(node.id)),
                (_ikey(dst_parent.id), self._touch(dst_parent, now)),
                *self.tenants.charge({node.tenant: [1, 0]}),
            ]
        )
        node.name = dst_name
        return node

    def listdir(self, path: str, *, start_after: str = "", limit: int = 1000) -> tuple[list[pb.Inode], bool]:
        """List a directory in name order, one page at a time.

        Returns:
            (entries after ``start_after``, at most ``limit``; whether more follow)

        Raises:
            NotFound, NotADirectory.
        """
        node = self.resolve(path)
        if node.type != pb.DIRECTORY:
            raise E.NotADirectory("not a directory", path=path)
        return self.listdir_of(node.id, start_after=start_after, limit=limit)

    def listdir_of(self, dir_id: int, *, start_after: str = "", limit: int = 1000) -> tuple[list[pb.Inode], bool]:
        """As :meth:`listdir`, for directory inode ``dir_id``."""
        prefix = b"d" + U64.pack(dir_id)
        after = _dkey(dir_id, start_after) if start_after else None
        entries: list[pb.Inode] = []
        for key, raw in self.store.scan(prefix, after):
            if len(entries) >= limit:
                return entries, True
            child = self._get_inode(U64.unpack(raw)[0])
            child.name = key[len(prefix) :].decode("utf-8", "surrogateescape")
            entries.append(child)
        return entries, False

    def rename(self, src: str, dst: str, *, no_replace: bool = False) -> tuple[pb.Inode, Freed]:
        """Atomically move ``src`` to ``dst``, replacing a file or an empty directory there.

        Returns:
            (the moved inode, blocks of a replaced file)

        Raises:
            NotFound: src or dst's parent missing. AlreadyExists: ``no_replace`` and dst exists.
            IsADirectory / NotADirectory: file over directory or the reverse.
            DirectoryNotEmpty: dst is a non-empty directory.
            InvalidArgument: moving a directory into itself, or the root.
        """
        src_parts, dst_parts = split_path(src), split_path(dst)
        if not src_parts or not dst_parts:
            raise E.InvalidArgument("cannot rename the root", path=src)
        src_parent, src_name = self._resolve_parent(src)
        ino = self._lookup(src_parent.id, src_name)
        if ino is None:
            raise E.NotFound("no such file or directory", path=src)
        node = self._get_inode(ino)
        self._check_bound_writable(node, src)
        dst_parent, dst_name = self._resolve_parent(dst)
        if dst_parent.id == src_parent.id:
            dst_parent = src_parent  # one record for both roles: its changes are written once
        # after the lookups, as rename(2): a missing src is ENOENT and a file src is ENOTDIR
        if dst_parts[: len(src_parts)] == src_parts and len(dst_parts) > len(src_parts):
            raise E.InvalidArgument("cannot move a directory into itself", path=dst)
        if src_parts == dst_parts:
            node.name = dst_name
            return node, Freed([])
        if self._lookup(dst_parent.id, dst_name) == node.id:  # two names of one file: rename(2) does nothing
            node.name = dst_name
            return node, Freed([])
        self.binds.check_movable(src, "rename it")
        self.binds.check_movable(dst, "replace it")
        self.binds.check_writable(src)
        self.binds.check_writable(dst)
        held = self.tenants.roots_under(normalize(src)) if node.type == pb.DIRECTORY else []
        if held:  # a tenant root is found by its path: moving it, or a directory above it, loses it
            raise E.InvalidArgument(
                f"holds the root of tenant {held[0]!r}, which cannot move (pcache tenant delete removes a tenant)",
                path=src,
            )
        if node.tenant != dst_parent.tenant:
            raise E.CrossTenant(
                f"cannot move between tenants ({node.tenant or 'no tenant'!r} -> {dst_parent.tenant or 'no tenant'!r})",
                path=dst,
            )
        now = time.time()
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = [_dkey(src_parent.id, src_name)]
        freed = Freed([])
        existing = self._lookup(dst_parent.id, dst_name)
        if existing is not None:
            if no_replace:
                raise E.AlreadyExists("destination exists", path=dst)
            victim = self._get_inode(existing)
            self._check_bound_writable(victim, dst)
            roots = self.tenants.root_inodes()
            if victim.id in roots:
                raise E.InvalidArgument(
                    f"is the root of tenant {roots[victim.id]!r}, which cannot be replaced", path=dst
                )
            if victim.type == pb.DIRECTORY:
                if node.type != pb.DIRECTORY:
                    raise E.IsADirectory("destination is a directory", path=dst)
                if not self._is_empty_dir(victim.id):
                    raise E.DirectoryNotEmpty("destination directory is not empty", path=dst)
            elif node.type == pb.DIRECTORY:
                raise E.NotADirectory("destination is not a directory", path=dst)
            if victim.type != pb.DIRECTORY and links(victim) > 1:  # only this name of it goes
                victim.nlink, victim.ctime = links(victim) - 1, now
                puts.append((_ikey(victim.id), victim.SerializeToString()))
                puts += self.tenants.charge({victim.tenant: [-1, 0]})
            else:
                deletes.append(_ikey(victim.id))
                puts += self.persist.cancel(victim.id)  # its object is replaced by the moved file's, or stays
                freed = self._collect_blocks([victim], deletes)
                puts += self.tenants.charge({victim.tenant: [-1, -freed_bytes(freed.blocks)]})
            if victim.type == pb.DIRECTORY:
                dst_parent.subdirs = max(0, dst_parent.subdirs - 1)
        moves, moved = self._writeback_moves(src, dst)  # after every check; walks what is still at src
        if node.id in moved:
            node.persist, node.persist_error = moved.pop(node.id).persist, ""
        puts += moves + [self.inode_record(n) for n in moved.values()]
        node.ctime = now
        puts.append((_ikey(node.id), node.SerializeToString()))
        puts.append((_dkey(dst_parent.id, dst_name), U64.pack(node.id)))
        if node.type == pb.DIRECTORY and src_parent.id != dst_parent.id:
            src_parent.subdirs = max(0, src_parent.subdirs - 1)
            dst_parent.subdirs += 1
        if src_parent.id == dst_parent.id:
            puts.append((_ikey(src_parent.id), self._touch(src_parent, now)))
        else:
            puts.append((_ikey(src_parent.id), self._touch(src_parent, now)))
            puts.append((_ikey(dst_parent.id), self._touch(dst_parent, now)))
        self.store.write(puts, deletes)
        node.name = dst_name
        return node, freed

    def _collect_blocks(self, nodes: list[pb.Inode], deletes: list[bytes]) -> Freed:
        freed: list[pb.BlockMeta] = []
        for node in nodes:
            for block_id in node.blocks:
                if block_id == HOLE:
                    continue
                meta = self.get_block(block_id)
                if meta is not None:
                    freed.append(meta)
                    deletes.append(_bkey(block_id))
        return Freed(freed)

    def delete(self, path: str, *, recursive: bool = False, directory: bool = False, file: bool = False) -> Freed:
        """Remove a file, symlink or directory (the whole subtree with ``recursive``).

        ``directory`` gives rmdir semantics (must be a directory), ``file``
        unlink semantics (must not be one).

        Raises:
            NotFound. InvalidArgument: the root. IsADirectory / NotADirectory: wrong kind.
            DirectoryNotEmpty: a non-empty directory without ``recursive``.
        """
        parent, name = self._resolve_parent(path)
        ino = self._lookup(parent.id, name)
        if ino is None:
            raise E.NotFound("no such file or directory", path=path)
        node = self._get_inode(ino)
        if directory and node.type != pb.DIRECTORY:
            raise E.NotADirectory("not a directory", path=path)
        if file and node.type == pb.DIRECTORY:
            raise E.IsADirectory("is a directory", path=path)
        if node.type == pb.DIRECTORY and not recursive and not self._is_empty_dir(node.id):
            raise E.DirectoryNotEmpty("directory not empty", path=path)
        self.binds.check_movable(path, "delete it")
        self.binds.check_writable(path)
        self._check_bound_writable(node, path)
        if node.type != pb.DIRECTORY and links(node) > 1:  # another name keeps the file
            now = time.time()
            node.nlink, node.ctime = links(node) - 1, now
            self.store.write(
                [
                    (_ikey(node.id), node.SerializeToString()),
                    (_ikey(parent.id), self._touch(parent, now)),
                    *self.tenants.charge({node.tenant: [-1, 0]}),
                ],
                [_dkey(parent.id, name)],
            )
            return Freed([])
        gone, _ = self._writeback_moves(path, "")  # uploads canceled, persisted objects deleted in order
        return self._remove(parent, name, node, path, extra=gone)

    def _remove(
        self,
        parent: pb.Inode,
        name: str,
        node: pb.Inode,
        path: str,
        *,
        drop_tenant: str = "",
        key_ids: Iterable[str] = (),
        drop_bind: str = "",
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> Freed:
        """Delete ``node`` (the entry ``name`` of ``parent``) and everything under it, in one batch
        (with the ``extra`` entries). Uploads of files removed are canceled (an unbind leaves the
        store as it is).

        Raises:
            InvalidArgument: a tenant's root is among them (unless ``drop_tenant``: that tenant is
                deleted in the same batch, and ``node`` is its root).
        """
        deletes: list[bytes] = [_dkey(parent.id, name), _ikey(node.id)]
        victims = [node]
        roots = self.tenants.root_inodes()
        kept: list[tuple[bytes, bytes]] = []  # hard-linked files with names outside the tree
        names: dict[int, int] = {node.id: 1}  # inode -> its names in the tree (each one charged)
        found: dict[int, pb.Inode] = {}
        if node.type == pb.DIRECTORY:
            stack = [node.id]
            while stack:
                dir_id = stack.pop()
                prefix = b"d" + U64.pack(dir_id)
                for key, raw in self.store.scan(prefix):
                    child = self._get_inode(U64.unpack(raw)[0])
                    deletes.append(key)
                    names[child.id] = names.get(child.id, 0) + 1
                    found[child.id] = child
                    if child.type == pb.DIRECTORY:
                        stack.append(child.id)
            now = time.time()
            for ino, child in found.items():
                if child.type != pb.DIRECTORY and links(child) > names[ino]:
                    child.nlink, child.ctime = links(child) - names[ino], now
                    kept.append((_ikey(ino), child.SerializeToString()))
                else:
                    deletes.append(_ikey(ino))
                    victims.append(child)
        if node.type == pb.DIRECTORY:
            parent.subdirs = max(0, parent.subdirs - 1)
        for victim in victims:
            if victim.id in roots and not (drop_tenant and victim is node):
                raise E.InvalidArgument(
                    f"holds the root of tenant {roots[victim.id]!r} (pcache tenant delete removes a tenant)", path=path
                )
        freed = self._collect_blocks(victims, deletes)
        deltas: dict[str, list[int]] = {}
        tenant_of = {v.id: v.tenant for v in victims}
        for victim in victims:
            if victim.id not in roots and not victim.bind:  # a root, an entry listed from a store: not counted
                add(deltas, victim.tenant, inodes=-names[victim.id])
        for ino, child_names in names.items():
            if ino not in tenant_of:  # a linked file that keeps names outside the tree: these go
                add(deltas, found[ino].tenant, inodes=-child_names)
        for meta in freed.blocks:
            add(deltas, tenant_of.get(meta.inode, ""), nbytes=-freed_bytes([meta]))
        writing: list[int] = []
        if drop_tenant:
            deltas.pop(drop_tenant, None)  # its record goes: not charged
        puts = [
            (_ikey(parent.id), self._touch(parent, time.time())),
            *self.tenants.charge(deltas),
            *(extra or []),
            *kept,
        ]
        for victim in victims:
            if victim.id in self.persist.by_inode:
                puts += self.persist.cancel(victim.id)
        if drop_bind:
            deletes.append(self.binds.key(drop_bind))
        if drop_tenant:
            deletes.append(self.tenants.remove(drop_tenant))
            puts.append(self.tenants.tombstone(drop_tenant, key_ids))
            writing = self.allocations.of_tenant(drop_tenant)  # a new tenant of that name starts with none
            deletes += self.allocations.keys(writing)
        self.store.write(puts, deletes)
        self.allocations.committed(writing)
        if drop_bind:
            self.binds.forget(drop_bind)
        return freed

    def setattr(
        self,
        path: str,
        *,
        mode: int | None = None,
        mtime: float | None = None,
        atime: float | None = None,
        set_xattrs: dict[str, bytes] | None = None,
        remove_xattrs: Iterable[str] = (),
        uid: int | None = None,
        gid: int | None = None,
    ) -> pb.Inode:
        """Change mode, times or extended attributes.

        Raises:
            NotFound: the path, or an xattr to remove, does not exist.
        """
        self.binds.check_writable(path)
        node = self.resolve(path)
        name = node.name
        if mode is not None:
            node.mode = mode & 0o7777
        if mtime is not None:
            node.mtime = mtime
        if atime is not None:
            node.atime = atime
        if uid is not None:
            node.uid = uid
        if gid is not None:
            node.gid = gid
        for key, value in (set_xattrs or {}).items():
            node.xattrs[key] = value
        for key in remove_xattrs:
            if key not in node.xattrs:
                raise E.NotFound(f"no such attribute {key!r}", path=path)
            del node.xattrs[key]
        if set_xattrs:
            _check_xattrs(node, path)
        node.ctime = time.time()
        node.ClearField("name")
        self.store.write([(_ikey(node.id), node.SerializeToString())])
        node.name = name
        return node

    # ------------------------------------------------------------- blocks --

    def walk(self, path: str = "/") -> Iterable[tuple[str, pb.Inode]]:
        """Every regular file under ``path`` (or ``path`` itself) as (path, inode), depth first.

        Raises:
            NotFound: no such path.
        """
        node = self.resolve(path)
        if node.type == pb.REGULAR:
            yield path, node
            return
        if node.type != pb.DIRECTORY:
            return
        stack = [(path.rstrip("/"), node.id)]
        while stack:
            base, ino = stack.pop()
            prefix = b"d" + U64.pack(ino)
            for key, raw in self.store.scan(prefix, None):
                child = self._get_inode(U64.unpack(raw)[0])
                child_path = f"{base}/{key[len(prefix) :].decode('utf-8', 'surrogateescape')}"
                if child.type == pb.DIRECTORY:
                    stack.append((child_path, child.id))
                elif child.type == pb.REGULAR:
                    yield child_path, child

    def layout(self, path: str = "", inode: int = 0) -> tuple[pb.Inode, list[pb.BlockMeta]]:
        """Return a file's inode and its block records in file order.

        Raises:
            NotFound. IsADirectory: ``path`` is a directory.
        """
        node = self.resolve(path) if path else self._get_inode(inode)
        if node.type == pb.DIRECTORY:
            raise E.IsADirectory("is a directory", path=path or str(inode))
        metas = []
        for index, block_id in enumerate(node.blocks):
            if block_id == HOLE:  # never written: zeros, as long as its place in the file says
                length = min(node.block_size, node.size - index * node.block_size)
                metas.append(pb.BlockMeta(block_id=HOLE, inode=node.id, length=length))
                continue
            meta = self.get_block(block_id)
            if meta is None:
                raise E.PCacheError(f"block {block_id} of inode {node.id} has no record")
            metas.append(meta)
        return node, metas

    def allocate_block(self, inode: int, size: int = 0) -> tuple[int, pb.Inode, int]:
        """Issue a new block id for a writer of a ``size`` byte block (0: the file's block size) of
        ``inode`` and reserve it in :attr:`allocations`, holding ``size`` bytes of its tenant's
        byte quota; returns (block id, inode, size). The commit must name exactly that length.

        Raises:
            NotFound: no such inode. IsADirectory: not a regular file. InvalidArgument: a block
            larger than the file's block size. QuotaExceeded: the block does not fit in the
            tenant's byte quota.
        """
        node = self._get_inode(inode)
        if node.type != pb.REGULAR:
            raise E.IsADirectory(f"inode {inode} is not a regular file")
        self._check_bound_writable(node)
        size = size or node.block_size
        if size > node.block_size:
            raise E.InvalidArgument(f"a block of inode {inode} holds at most {node.block_size} bytes, not {size}")
        self.tenants.check_bytes(node.tenant, size, self.allocations.reserved_bytes(node.tenant))
        block_id = self._blocks.take()
        self.allocations.reserve(block_id, inode, node.tenant, size)
        return block_id, node, size

    def _check_bound_writable(self, node: pb.Inode, path: str | None = None) -> None:
        """Refuse changing a file listed from an under-store (by inode: AllocateBlock, CommitFile;
        by path: a truncating create, rename, delete). Under a ``ro`` bind nothing changes; under a
        ``writeback`` bind, files written here may, and what the store holds stays as listed until
        write-back can carry a change back to it.

        Raises:
            ReadOnly: ``node`` was listed from a store.
        """
        bind = self.binds.of_inode(node.bind) if node.bind else None
        if bind is not None:
            why = (
                f"bound read-only to {bind.uri}"
                if bind.mode == "ro"
                else f"an object listed from {bind.uri}: write-back binds upload files written through PCache"
                " and leave the store's own objects as they are"
            )
            raise E.ReadOnly(why, path=path or node.name or "a file listed from the under-store")

    def get_inode(self, inode: int) -> pb.Inode:
        """The inode numbered ``inode``.

        Raises:
            NotFound: no such inode.
        """
        return self._get_inode(inode)

    # ------------------------------------------------------------ tenants --

    def create_tenant(
        self,
        name: str,
        root: str = "",
        *,
        quota_bytes: int = 0,
        quota_inodes: int = 0,
        key_ids: Iterable[str] = (),
    ) -> pb.Tenant:
        """Make tenant ``name`` with its root directory ``root`` (default ``/NAME``), created here
        (with its missing parents) or adopted when it is an empty directory outside every tenant.
        ``key_ids``: the token keys in the ring now (a deleted tenant's name is free again only
        once none of the keys of its time is).

        Raises:
            AlreadyExists: the tenant exists, or a deleted tenant's tokens of that name would be
                valid again. InvalidArgument: a bad name, the namespace root, a root that is not
                empty, or one inside or holding another tenant's tree. InvalidPath: a malformed root.
        """
        check_name(name, "tenant")
        if name in RESERVED_TENANTS:
            raise E.InvalidArgument(
                f"{name!r} is reserved: block tokens of admin-owned files and the workers' own transfers name it"
            )
        if name in self.tenants:
            raise E.AlreadyExists(f"tenant {name!r} exists")
        reuse = self.tenants.check_reuse(name, key_ids)
        root = normalize(root or "/" + name)
        if root == "/":
            raise E.InvalidArgument("a tenant root cannot be / (it would hold every other tenant)")
        if self.binds.covering(root) is not None or self.binds.under(root):
            raise E.Busy("a tenant root cannot be, or be inside or above, a bound directory", path=root)
        parts = split_path(root)
        node = self._get_inode(ROOT)
        for part in parts[:-1]:  # refuse before making any directory
            child = self._lookup(node.id, part)
            if child is None:
                break
            node = self._get_inode(child)
            if node.tenant:
                raise E.InvalidArgument(f"{root} is inside the tree of tenant {node.tenant!r}", path=root)
        parent = self.mkdir("/" + "/".join(parts[:-1]), parents=True) if len(parts) > 1 else self._get_inode(ROOT)
        if parent.tenant:
            raise E.InvalidArgument(f"{root} is inside the tree of tenant {parent.tenant!r}", path=root)
        ino = self._lookup(parent.id, parts[-1])
        puts: list[tuple[bytes, bytes]] = []
        if ino is None:
            node = self._new_inode(parent, pb.DIRECTORY, 0o755)
            parent.subdirs += 1
            puts += [
                (_dkey(parent.id, parts[-1]), U64.pack(node.id)),
                (_ikey(parent.id), self._touch(parent, node.mtime)),
            ]
        else:
            node = self._get_inode(ino)
            if node.type != pb.DIRECTORY or not self._is_empty_dir(node.id):
                raise E.InvalidArgument("a tenant root must be a new or an empty directory", path=root)
            if node.id in self.tenants.root_inodes():
                raise E.InvalidArgument(f"is the root of tenant {self.tenants.root_inodes()[node.id]!r}", path=root)
        rec = self.tenants.new_record(name, root, node.id, quota_bytes, quota_inodes)
        node.tenant = name
        puts.append((_ikey(node.id), _record(node)))
        puts.append(self.tenants.put(rec))
        self.store.write(puts, reuse)
        return rec

    def delete_tenant(self, name: str, *, purge: bool = False, key_ids: Iterable[str] = ()) -> Freed:
        """Remove tenant ``name`` (its tokens stop working) and its root directory; with
        ``purge`` everything under the root too, and the reservations of its open writers.
        ``key_ids``: the token keys in the ring now (see :meth:`create_tenant`).

        Raises:
            NotFound: no such tenant. DirectoryNotEmpty: the root is not empty and not ``purge``.
        """
        rec = self.tenants.get(name)
        node = self._get_inode(rec.root_inode)
        if not purge and not self._is_empty_dir(node.id):
            raise E.DirectoryNotEmpty(f"tenant {name!r} still has files (purge removes them)", path=rec.root)
        self.binds.check_movable(rec.root, f"delete tenant {name!r}")
        parent, entry = self._resolve_parent(rec.root)
        return self._remove(parent, entry, node, rec.root, drop_tenant=name, key_ids=key_ids)

    # ------------------------------------------------------ under storage --

    def bind(self, path: str, uri: str, *, mode: str = "ro", meta_ttl: float = 60.0) -> pb.Bind:
        """Bind directory ``path`` to the under-store ``uri`` (:mod:`.binds`): made here (its
        parent must exist) or taken when it is an empty directory. ``meta_ttl``: seconds a listed
        entry is trusted before a HEAD re-checks it (:data:`~.binds.IMMUTABLE`: never re-checked).

        Raises:
            InvalidArgument: a bad mode, TTL or URI (one with user:password@ among them), or the
                namespace root. AlreadyExists: ``path`` is a file or a non-empty directory.
            Busy: ``path`` is, is inside or holds a bind, or is a tenant root.
            NotFound / NotADirectory: a bad parent.
        """
        if mode not in MODES:
            raise E.InvalidArgument(f"bind mode {mode!r} is not one of {', '.join(MODES)}", path=path)
        if not (meta_ttl >= 0 or meta_ttl == IMMUTABLE):
            raise E.InvalidArgument("meta_ttl is seconds >= 0, or -1 (immutable)", path=path)
        check_uri(uri)
        path = normalize(path)
        if path == "/":
            raise E.InvalidArgument("the namespace root cannot be bound", path=path)
        if self.binds.covering(path) is not None or self.binds.under(path):
            raise E.Busy("binds do not nest: a directory above or below it is bound (pcache binds)", path=path)
        for other in self.binds.all():
            if "writeback" in (mode, other.mode) and (where := overlap(uri, other.uri)):
                raise E.Busy(
                    f"its store prefix overlaps {where}, bound {other.mode}: a write-back bind owns its prefix"
                    " alone (one's uploads and deletes would overwrite or remove the other's objects)",
                    path=path,
                )
        parent, name = self._resolve_parent(path)
        ino = self._lookup(parent.id, name)
        puts: list[tuple[bytes, bytes]] = []
        if ino is None:
            node = self._new_inode(parent, pb.DIRECTORY, 0o755)
            parent.subdirs += 1
            puts += [
                (_ikey(node.id), node.SerializeToString()),
                (_dkey(parent.id, name), U64.pack(node.id)),
                (_ikey(parent.id), self._touch(parent, node.mtime)),
                *self._added(node),
            ]
        else:
            node = self._get_inode(ino)
            if node.type != pb.DIRECTORY or not self._is_empty_dir(node.id):
                raise E.AlreadyExists("a bind takes a new or an empty directory", path=path)
            if node.id in self.tenants.root_inodes():
                raise E.Busy(
                    f"is the root of tenant {self.tenants.root_inodes()[node.id]!r}: bind a directory in it", path=path
                )
        bind = pb.Bind(
            path=path, uri=uri, mode=mode, meta_ttl=meta_ttl, created=time.time(), tenant=node.tenant, inode=node.id
        )
        puts.append(self.binds.record(bind))
        self.store.write(puts)
        self.binds.remember(bind)
        return bind

    def ufs_level(self, node: pb.Inode) -> tuple[pb.Bind, str] | None:
        """The bind a directory is listed from and its key prefix there, or None (not bound)."""
        bind = self.binds.of_inode(node.id)
        if bind is not None:
            return bind, ""
        if node.bind and node.type == pb.DIRECTORY:
            owner = self.binds.of_inode(node.bind)
            if owner is not None:
                return owner, node.ufs_key
        return None

    def merge_listing(
        self,
        dir_id: int,
        objects: list[tuple[str, int, str, float]],
        prefixes: list[str],
        now: float,
    ) -> Freed:
        """Record one listed page of a bound directory (``objects``: (name, size in bytes, ETag,
        mtime); ``prefixes``: names of common prefixes) in one batch: new entries are made, an
        object whose size or ETag changed gets its new size and loses its cached blocks, so old
        and new bytes never mix. Entries written here (not from the store) are left alone.

        Returns:
            blocks dropped (their replicas must be deleted).

        Raises:
            NotFound: the directory is gone.
        """
        parent = self._get_inode(dir_id)
        level = self.ufs_level(parent)
        if level is None:
            raise E.InvalidArgument(f"inode {dir_id} is not a bound directory")
        bind, prefix = level
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = []
        freed: list[pb.BlockMeta] = []
        made = 0
        mode = 0o644 if bind.mode == "writeback" else 0o444
        entries = [(name, True, 0, "", now) for name in prefixes] + [(n, False, z, e, m) for n, z, e, m in objects]
        for name, is_dir, size, etag, mtime in entries:
            if not is_dir and self.persist.deleting(bind.inode, prefix + name):
                continue  # its file was deleted or moved here: the object goes with its DELETE step
            existing = self._lookup(dir_id, name)
            if existing is not None:
                node = self._get_inode(existing)
                if not node.bind or is_dir or node.type != pb.REGULAR or (node.size, node.etag) == (size, etag):
                    continue  # written here, a directory, or unchanged
                dropped = self._collect_blocks([node], deletes)
                freed += dropped.blocks
                puts += self.tenants.charge({node.tenant: [0, -freed_bytes(dropped.blocks)]})
                node.ClearField("blocks")
                node.size, node.etag, node.mtime, node.ctime, node.seen = size, etag, mtime or now, now, now
                node.version += 1
                puts.append((_ikey(node.id), _record(node)))
                continue
            kind = pb.DIRECTORY if is_dir else pb.REGULAR
            if is_dir:
                node = self._new_inode(parent, kind, 0o755, listed=True)
                parent.subdirs += 1
            else:
                node = self._new_inode(
                    parent,
                    kind,
                    mode,
                    listed=True,
                    block_size=self.default_block_size,
                    replication=self.default_replication,
                )
            node.bind, node.ufs_key, node.seen, node.parent = (
                bind.inode,
                prefix + name + ("/" if is_dir else ""),
                now,
                dir_id,
            )
            if not is_dir:
                node.size, node.etag, node.mtime = size, etag, mtime or now
            puts += [(_ikey(node.id), node.SerializeToString()), (_dkey(dir_id, name), U64.pack(node.id))]
            made += 1
        if made:  # listed entries are not charged (_new_inode)
            puts.append((_ikey(dir_id), self._touch(parent, now)))
        if puts or deletes:
            self.store.write(puts, deletes)
        return Freed(freed)

    def finish_listing(self, dir_id: int, names: set[str], started: float) -> Freed:
        """After a bound directory's last listed page: drop the store's entries the listing no
        longer showed (made before ``started``), and mark the directory listed at ``started``.

        Returns:
            blocks dropped.
        """
        parent = self._get_inode(dir_id)
        freed: list[pb.BlockMeta] = []
        prefix = b"d" + U64.pack(dir_id)
        gone = []
        for key, raw in self.store.scan(prefix):
            name = key[len(prefix) :].decode("utf-8", "surrogateescape")
            if name not in names:
                child = self._get_inode(U64.unpack(raw)[0])
                if child.bind and child.ctime < started:
                    gone.append((name, child))
        for name, child in gone:
            freed += self._remove(parent, name, child, name).blocks
            parent = self._get_inode(dir_id)
        parent.listed = started
        self.store.write([(_ikey(dir_id), _record(parent))])
        return Freed(freed)

    def ufs_checked(self, ino: int, found: tuple[int, str, float] | None, now: float) -> Freed:
        """Record a HEAD of a bound file: (size, ETag, mtime), or None when the object is gone
        (the entry goes). A changed object loses its cached blocks.

        Returns:
            blocks dropped.
        """
        node = self._get_inode(ino)
        if not node.bind or node.type != pb.REGULAR:
            return Freed([])
        if found is None:
            parent = self._get_inode(node.parent) if node.parent else None
            entry = node.ufs_key.rsplit("/", 1)[-1]
            if parent is None or self._lookup(parent.id, entry) != node.id:
                return Freed([])
            return self._remove(parent, entry, node, entry)
        size, etag, mtime = found
        freed: list[pb.BlockMeta] = []
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = []
        if (node.size, node.etag) != (size, etag):
            dropped = self._collect_blocks([node], deletes)
            freed = dropped.blocks
            puts += self.tenants.charge({node.tenant: [0, -freed_bytes(dropped.blocks)]})
            node.ClearField("blocks")
            node.size, node.etag, node.mtime, node.ctime = size, etag, mtime or now, now
            node.version += 1
        node.seen = now
        puts.append((_ikey(node.id), _record(node)))
        self.store.write(puts, deletes)
        return Freed(freed)

    def ufs_blocks(self, ino: int) -> list[pb.BlockMeta]:
        """The block records of a bound file, made at its first read when it has none: one per
        block-size piece of the object, flagged ``ufs`` (fetched on a miss, never charged), with
        no replica and an unknown CRC yet. Returns the records made (none when it had them).

        Raises:
            NotFound: no such inode.
        """
        node = self._get_inode(ino)
        if not node.bind or node.type != pb.REGULAR or node.blocks or not node.size:
            return []
        count = -(-node.size // node.block_size)
        metas = []
        for index in range(count):
            length = min(node.block_size, node.size - index * node.block_size)
            meta = pb.BlockMeta(
                block_id=self._blocks.take(), inode=ino, length=length, replication=node.replication, ufs=True
            )
            metas.append(meta)
            node.blocks.append(meta.block_id)
        self.store.write([(_ikey(ino), _record(node)), *((_bkey(m.block_id), m.SerializeToString()) for m in metas)])
        return metas

    def ufs_source(self, block_id: int) -> pb.UfsSource:
        """Where a bound file's block comes from: the bind's URI, the object key and version, and
        the byte range.

        Raises:
            NotFound: no such block, not a bound file's, or its bind is gone.
        """
        meta = self.get_block(block_id)
        if meta is None or not meta.ufs:
            raise E.NotFound(f"block {block_id} is not a block of a bound file")
        node = self._get_inode(meta.inode)
        bind = self.binds.of_inode(node.bind)
        if bind is None or block_id not in node.blocks:
            raise E.NotFound(f"block {block_id} no longer belongs to a bound file")
        index = list(node.blocks).index(block_id)
        return pb.UfsSource(
            uri=bind.uri, key=node.ufs_key, etag=node.etag, offset=index * node.block_size, length=meta.length
        )

    def set_block_crc(self, block_id: int, crc: int) -> None:
        """Record the CRC32C the first stored copy of a bound file's block has."""
        meta = self.get_block(block_id)
        if meta is not None and meta.ufs and not meta.crc32c:
            meta.crc32c = crc
            self.store.write([(_bkey(block_id), meta.SerializeToString())])

    def unbind(self, path: str, *, force: bool = False) -> tuple[pb.Bind, Freed]:
        """Remove the bind at ``path`` with its directory and everything cached under it (the
        under-store keeps its objects). Under a ``writeback`` bind the files not uploaded yet
        are the only copy: refused while any write-back step is not done, unless ``force``.

        Raises:
            NotFound: no bind at ``path``. Busy: write-back steps not done (and not ``force``).
        """
        path = normalize(path)
        bind = self.binds.get(path)
        if bind is None:
            raise E.NotFound("not a bound directory (pcache binds lists them)", path=path)
        waiting = sum(1 for task in self.persist.tasks() if task.bind == bind.inode and not task.canceled)
        if waiting and not force:
            raise E.Busy(
                f"{waiting} write-back steps (uploads, deletes) of this bind are not done: files not uploaded"
                f" exist nowhere else; pcache persist --wait {path}, then unbind (--force drops them)",
                path=path,
            )
        parent, name = self._resolve_parent(path)
        node = self._get_inode(bind.inode)
        return bind, self._remove(parent, name, node, path, drop_bind=path)

    def set_quota(self, name: str, *, quota_bytes: int, quota_inodes: int) -> pb.Tenant:
        """Set tenant ``name``'s quotas (0: no limit); usage above a new quota only stops growth.

        Raises:
            NotFound: no such tenant.
        """
        rec = self.tenants.get(name)
        rec.quota_bytes, rec.quota_inodes = quota_bytes, quota_inodes
        self.store.write([self.tenants.put(rec)])
        return rec

    def revoke_tokens(self, name: str) -> pb.Tenant:
        """Refuse every token of tenant ``name`` minted until now (:meth:`Tenants.revoke`).

        Raises:
            NotFound: no such tenant.
        """
        rec = self.tenants.revoke(name)
        self.store.write([self.tenants.put(rec)])
        return rec

    def commit_file(
        self,
        inode: int,
        size: int,
        blocks: list[pb.CommittedBlock],
        mtime: float = 0.0,
        *,
        base_version: int = 0,
        base_blocks: list[int] | None = None,
        replace: bool = True,
        path: str = "",
        closing: bool = True,
    ) -> tuple[pb.Inode, Freed]:
        """Make a writer's new block list the file's content (close-to-open).

        Under a ``writeback`` bind (``path``, the file's path as the writer opened it, names its
        object; the key of its last queued upload when it was renamed while open) the version a
        writer's close (``closing``) commits is queued for upload and the file shows
        ``persist: pending``; an fsync's is not (a half-written file never reaches the store), and
        the file shows ``pending`` from then until its writer's close queues it.

        Each block must be either already the file's, or allocated for this
        inode and not yet committed. A block may be shorter than its place in
        the file (``block_size``, the last one ``size`` modulo it): the rest
        reads as zeros, as a sparse file's.

        When the inode moved past ``base_version`` (the writer's view) since the
        writer read it, another writer committed in between. A ``replace``
        commit (a truncation, a file opened with 'w') then fails. Otherwise the
        two are merged at block granularity, as parallel checkpoint writers of
        disjoint ranges of one file need (3FS issue #312): a block the writer
        did not change (same id as in ``base_blocks``) keeps the current
        content; a block it changed replaces the current one only if that is
        still the base one; the size is the larger of the two.

        Returns:
            (the updated inode, blocks no longer referenced)

        Raises:
            NotFound: the inode was deleted meanwhile.
            Conflict: another writer changed a block this one changed too, or
                any block of a ``replace`` commit; or a new block is not reserved
                for this file (see :meth:`Allocations.check`: a master restart, an
                expired allocation, another file's block); nothing was committed.
            InvalidArgument: a block list that does not match the size.
            FileTooLarge: ``size`` is over :func:`~pcache.common.layout.max_file_size`.
        """
        node = self._get_inode(inode)
        if node.type != pb.REGULAR:
            raise E.IsADirectory(f"inode {inode} is not a regular file")
        check_file_size(size, node.block_size, path or f"inode {inode}")  # the client's check bounds nothing
        self._check_bound_writable(node)
        if base_version and base_version != node.version:
            if replace:
                raise E.Conflict(
                    f"inode {node.id} changed since this writer read it (version {base_version} -> {node.version})"
                    " and this writer truncated or replaced it: this version was not committed"
                )
            blocks, size = self._merge(node, blocks, size, list(base_blocks or []))
        self._check_extents(node, blocks, size)
        extra: list[tuple[bytes, bytes]] = []
        if closing and path and self._lookup_path(path) == node.id:
            extra = self._queue_upload(node, path, node.version + 1)
        elif closing and node.id in self.persist.by_inode:  # moved while open: where its move queued it
            extra = self.persist.requeue(node, node.version + 1)
        elif not closing and self._writes_back(node, path):
            # the store holds an older version (or none): pending until the writer's close queues
            # this one; the client sees it in the answer and owes that close (an fsync'ed file
            # closed with nothing left to write still tells the master)
            node.persist, node.persist_error = pb.PERSIST_PENDING, ""
        return node, self._replace_blocks(node, blocks, size, mtime or time.time(), extra)

    # --------------------------------------------------------- write-back --

    def writeback_target(self, path: str) -> tuple[pb.Bind, str] | None:
        """The ``writeback`` bind a path is inside of, and the path's key relative to it; None
        when it is in none (or is the bind point itself)."""
        bind = self.binds.covering(path)
        if bind is None or bind.mode != "writeback":
            return None
        path = normalize(path)
        if path == bind.path:
            return None
        return bind, path[len(bind.path) :].lstrip("/")

    def _queue_upload(self, node: pb.Inode, path: str, version: int) -> list[tuple[bytes, bytes]]:
        """Under a ``writeback`` bind: batch entries queueing the upload of ``version`` of the file
        at ``path`` (an older version's upload is canceled: superseded), and ``node`` marked
        pending (its record is written by the caller's batch). Nothing elsewhere."""
        target = self.writeback_target(path)
        if target is None or node.bind:
            return []
        bind, key = target
        puts = self.persist.cancel(node.id)
        node.persist, node.persist_error = pb.PERSIST_PENDING, ""
        task = pb.PersistTask(kind=pb.PersistTask.UPLOAD, inode=node.id, version=version, bind=bind.inode, key=key)
        return puts + self.persist.new(task)

    def _writes_back(self, node: pb.Inode, path: str) -> bool:
        """Whether ``node`` (opened at ``path``) is uploaded by a ``writeback`` bind when closed."""
        if node.bind:
            return False
        if node.id in self.persist.by_inode:
            return True
        return bool(path) and self.writeback_target(path) is not None and self._lookup_path(path) == node.id

    def _lookup_path(self, path: str) -> int | None:
        try:
            return self.resolve(path).id
        except E.PCacheError:
            return None

    def _writeback_moves(self, src: str, dst: str) -> tuple[list[tuple[bytes, bytes]], dict[int, pb.Inode]]:
        """Write-back steps for moving (``dst``) or deleting (``dst`` empty) what is at ``src``:
        every file's pending upload is canceled, its content uploaded under ``dst``, and its object
        under ``src`` deleted when it was (or may have been) persisted. Returns the batch entries
        and the files whose inode records change (persist state), by inode.

        The uploads keep the order the files were closed in (a pending upload's place in the
        queue, else the file's mtime), so a checkpoint directory renamed into place gets its
        ``.metadata`` after its shards, as written; the old objects are deleted after every upload,
        the last closed first (a reader of the old prefix never sees its marker over missing
        shards)."""
        old, new = self.writeback_target(src), (self.writeback_target(dst) if dst else None)
        if old is None and new is None:
            return [], {}
        puts: list[tuple[bytes, bytes]] = []
        changed: dict[int, pb.Inode] = {}
        base = normalize(src)
        files: list[tuple[tuple[int, float, int], str, pb.Inode, str | None]] = []
        for file_path, node in list(self.walk(src)):
            if node.bind:  # listed from the store: stays as the store has it
                continue
            if new is not None and node.type != pb.DIRECTORY and links(node) > 1:
                # a store holds one object per name: the other name's writes would never reach it
                raise E.NotSupported(f"{file_path} has {links(node)} hard links: not movable under a bound path",
                                     path=dst)  # fmt: skip
            queued = min(self.persist.by_inode.get(node.id, ()), default=0)
            order = (1, 0.0, queued) if queued else (0, node.mtime, node.id)  # persisted ones were closed first
            # the version the store holds: its ETag fences the DELETE (None: never persisted)
            had = node.persisted_etag if node.persist != pb.PERSIST_NONE else None
            files.append((order, file_path[len(base) :], node, had))
        files.sort(key=lambda entry: entry[0])
        deletes: list[tuple[bytes, bytes]] = []
        for _, rel, node, _had in files:
            puts += self.persist.cancel(node.id)
            if new is not None:  # the new object first, then the old one goes (S3 has no rename)
                node.persist, node.persist_error = pb.PERSIST_PENDING, ""
                puts += self.persist.new(
                    pb.PersistTask(
                        kind=pb.PersistTask.UPLOAD, inode=node.id, version=node.version, bind=new[0].inode,
                        key=new[1] + rel,
                    )
                )  # fmt: skip
            else:
                node.persist, node.persist_error = pb.PERSIST_NONE, ""
            changed[node.id] = node
        for _, rel, _node, had in reversed(files):
            if old is not None and had is not None:
                deletes += self.persist.new(
                    pb.PersistTask(kind=pb.PersistTask.DELETE, bind=old[0].inode, key=old[1] + rel, if_match=had)
                )
        return puts + deletes, changed

    def inode_record(self, node: pb.Inode) -> tuple[bytes, bytes]:
        """The batch entry storing ``node``."""
        return _ikey(node.id), _record(node)

    def _merge(
        self, node: pb.Inode, blocks: list[pb.CommittedBlock], size: int, base: list[int]
    ) -> tuple[list[pb.CommittedBlock], int]:
        """A writer's changed blocks on top of the current list (see :meth:`commit_file`)."""
        size = max(size, node.size)
        count = -(-size // node.block_size)
        out: list[pb.CommittedBlock] = []
        for index in range(count):
            mine = blocks[index] if index < len(blocks) else pb.CommittedBlock(block_id=HOLE)
            was = base[index] if index < len(base) else HOLE
            now = node.blocks[index] if index < len(node.blocks) else HOLE
            if mine.block_id == was or mine.block_id == now:
                out.append(self._committed(node, index, now, size))
            elif now == was:
                out.append(mine)
            else:
                raise E.Conflict(
                    f"inode {node.id}: block {index} was changed by another writer too (bytes"
                    f" {index * node.block_size}-{(index + 1) * node.block_size - 1}); this version was not committed"
                )
        return out, size

    def _committed(self, node: pb.Inode, index: int, block_id: int, size: int) -> pb.CommittedBlock:
        """The current block at ``index`` as a commit entry."""
        if block_id == HOLE:
            return pb.CommittedBlock(block_id=HOLE, length=min(node.block_size, size - index * node.block_size))
        meta = self.get_block(block_id)
        if meta is None:
            raise E.PCacheError(f"block {block_id} of inode {node.id} has no record")
        return pb.CommittedBlock(block_id=block_id, length=meta.length, crc32c=meta.crc32c, replicas=meta.replicas)

    @staticmethod
    def _check_extents(node: pb.Inode, blocks: list[pb.CommittedBlock], size: int) -> None:
        count = -(-size // node.block_size)
        if len(blocks) != count:
            raise E.InvalidArgument(f"size {size} needs {count} blocks of {node.block_size} bytes, got {len(blocks)}")
        ids = [blk.block_id for blk in blocks if blk.block_id != HOLE]
        if len(set(ids)) != len(ids):  # one block in two places: its bytes would be counted once, freed twice
            raise E.InvalidArgument(f"inode {node.id}: a block appears twice in the block list")
        for index, blk in enumerate(blocks):
            if blk.length > min(node.block_size, size - index * node.block_size):
                raise E.InvalidArgument(
                    f"block {index} of {blk.length} bytes is longer than its place in a {size} byte file"
                )

    def _replace_blocks(
        self,
        node: pb.Inode,
        blocks: list[pb.CommittedBlock],
        size: int,
        mtime: float,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> Freed:
        current = set(node.blocks)
        puts: list[tuple[bytes, bytes]] = list(extra or [])
        added = 0
        for blk in blocks:
            if blk.block_id == HOLE:
                continue
            if blk.block_id in current:
                continue
            self.allocations.check(blk.block_id, node.id, blk.length)
            if not blk.replicas:
                raise E.InvalidArgument(f"block {blk.block_id} has no replica")
            meta = pb.BlockMeta(
                block_id=blk.block_id,
                inode=node.id,
                length=blk.length,
                crc32c=blk.crc32c,
                replicas=list(blk.replicas),
                replication=node.replication,
            )
            added += blk.length
            puts.append((_bkey(blk.block_id), meta.SerializeToString()))
        keep = {b.block_id for b in blocks}
        deletes: list[bytes] = []
        freed: list[pb.BlockMeta] = []
        for block_id in node.blocks:
            if block_id != HOLE and block_id not in keep:
                old = self.get_block(block_id)
                if old is not None:
                    freed.append(old)
                deletes.append(_bkey(block_id))
        name = node.name
        node.ClearField("name")
        del node.blocks[:]
        node.blocks.extend(b.block_id for b in blocks)
        node.size = size
        node.mtime = node.ctime = mtime
        node.version += 1
        puts.append((_ikey(node.id), node.SerializeToString()))
        puts += self.tenants.charge({node.tenant: [0, added - freed_bytes(freed)]})
        adopted = [b.block_id for b in blocks]
        self.store.write(puts, deletes + self.allocations.keys(adopted))  # the reservations end with the commit
        self.allocations.committed(adopted)
        node.name = name
        return Freed(freed)

    def set_replicas(
        self, block_id: int, replicas: list[str], quarantined: list[str] | None = None
    ) -> pb.BlockMeta | None:
        """Record the live replica set of a block (and the workers holding quarantined copies);
        None if the block is gone."""
        meta = self.get_block(block_id)
        if meta is None:
            return None
        del meta.replicas[:]
        meta.replicas.extend(replicas)
        del meta.quarantined[:]
        meta.quarantined.extend(quarantined or [])
        self.store.write([(_bkey(block_id), meta.SerializeToString())])
        return meta


def _record(node: pb.Inode) -> bytes:
    """Serialise an inode for storage, without the response-only ``name`` and ``created``."""
    if not node.name and not node.created:
        return node.SerializeToString()
    rec = pb.Inode()
    rec.CopyFrom(node)
    rec.ClearField("name")
    rec.ClearField("created")
    return rec.SerializeToString()


XATTR_NAME_MAX = 255  # bytes of a name (Linux's limit)
XATTR_SIZE_MAX = 64 << 10  # bytes of one value (Linux's limit)
XATTR_TOTAL_MAX = 128 << 10  # bytes of every name and value of one inode (an inode record stays small)


def _check_xattrs(node: pb.Inode, path: str) -> None:
    """Extended attributes stay within Linux's limits, and all of one inode's within 128 KiB: every
    mutation of an inode rewrites (and replicates) its whole record.

    Raises:
        NameTooLong: a name past 255 bytes. TooLarge: a value past 64 KiB, or all of them.
    """
    total = 0
    for key, value in node.xattrs.items():
        size = len(key.encode("utf-8", "surrogateescape"))
        if size > XATTR_NAME_MAX:
            raise E.NameTooLong(f"an extended attribute name holds at most {XATTR_NAME_MAX} bytes", path=path)
        if len(value) > XATTR_SIZE_MAX:
            raise E.TooLarge(f"an extended attribute value holds at most {XATTR_SIZE_MAX} bytes", path=path)
        total += size + len(value)
    if total > XATTR_TOTAL_MAX:
        raise E.TooLarge(f"the extended attributes of one file hold at most {XATTR_TOTAL_MAX} bytes", path=path)
