"""FUSE operations over the PCache sync client: translate, delegate, map errors.

Every method turns a kernel request into one call on :class:`pcache.client.Client`
and a PCache error into ``FuseOSError(errno)`` (each ``PCacheError`` carries its
errno), so a failure reaches the application as EIO, ENOENT, ENOSPC,
ETIMEDOUT ... never as a traceback. Modelled on mfusepy's ``loopback.py``.

Consistency is close-to-open: ``flush`` (called on every ``close(2)``) and
``fsync`` commit a handle's writes, so another mount that opens the file
afterwards sees them; ``release`` only drops the handle.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import functools
import logging
import mmap
import os
import stat as stat_mod
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import mfusepy
from mfusepy import FuseOSError

from pcache.client import Client, File
from pcache.client.core import FileStat
from pcache.common.errors import AlreadyExists, NotFound, PCacheError, Timeout, Unavailable

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
BLOCK_REPORT = 512  # st_blocks unit
KNOWN_INODES = 1 << 16  # inodes whose newest version (and cached pages' version) a mount remembers
PAGE = mmap.PAGESIZE  # the kernel reads whole pages: up to the size it holds, rounded up to one
READ_TRIES = 4  # a READ re-done when the file changed under it (bounded: the last answer stands)
IO_SIZE = 1 << 20  # st_blksize: what cp, tar and Python use as their buffer
MASTER_DOWN_HOLD = 5.0  # seconds an open file's attributes come from the mount alone after the master failed them
KNOWN_STATS = 4096  # open files whose last attributes a mount keeps (~2 MiB), for when no master answers
XATTR_PREFIX = "user."
UTIME_NOW = (1 << 30) - 1  # <sys/stat.h>
UTIME_OMIT = (1 << 30) - 2
FALLOC_FL_KEEP_SIZE = 0x01  # <linux/falloc.h>
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
ANSWER_TTL = 0.1  # seconds a mutation's reply answers the getattr libfuse follows it with (see _answer)
ZERO_CHUNK = 8 << 20  # bytes of zeros written per step of a punched or zeroed range
FUSE_READDIR_PLUS = 1  # libfuse 3: enum fuse_readdir_flags
FUSE_FILL_DIR_PLUS = 2  # libfuse 3: enum fuse_fill_dir_flags


def translate_errors(func: F) -> F:
    """Map PCache and OS errors to ``FuseOSError``; anything else to EIO (logged)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FuseOSError:
            raise
        except PCacheError as exc:
            if (exc.errno or errno.EIO) == errno.EIO:  # the application sees only "I/O error": say why here
                logger.warning("%s%r: %s: %s", func.__name__, args[1:3], type(exc).__name__, exc)
            raise FuseOSError(exc.errno or errno.EIO) from exc
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from exc
        except Exception as exc:
            logger.exception("%s failed", func.__name__)
            raise FuseOSError(errno.EIO) from exc

    return wrapper  # type: ignore[return-value]


def _caller() -> tuple[int, int]:
    uid, gid, _pid = mfusepy.fuse_get_context()
    return uid, gid


class PCacheOperations(mfusepy.Operations):
    """The mount's operations table; ``client`` is a connected sync :class:`Client`."""

    use_ns = True  # utimens gets nanoseconds

    def __init__(self, client: Client) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._handles: dict[int, File] = {}
        self._appending: set[int] = set()
        # inode -> the one writable File all of this mount's write handles of it share (and how
        # many): as in a local file system's page cache, every process's writes land in one place,
        # O_APPEND appends at the one end, and every reader of the mount sees them
        self._writers: dict[int, File] = {}
        self._writer_refs: dict[int, int] = {}
        self._next_fh = 1
        # inode -> the newest version any handle here saw. The kernel's page cache is per inode,
        # not per handle: a read-only handle with an older view would fill pages that a handle
        # opened after a commit then reads; it re-reads its layout first (see ``read``).
        self._newest: OrderedDict[int, int] = OrderedDict()
        # inode -> the version whose attributes (size) the kernel was last given (see ``read``)
        self._told: OrderedDict[int, int] = OrderedDict()
        # (inode, name) -> (version, settled): the version whose bytes the kernel's page cache
        # holds for it (0: unknown). An open keeps the page cache only when it opens that same
        # version (close-to-open without libfuse's auto_cache window, in which a second mount read
        # old pages), and only once settled: the kernel drops the pages of an open not kept in
        # that opener's open(2), after this answers it, so an open answered meanwhile would keep
        # the old pages and read them (a reader that opened a rewrite read the version before).
        self._paged: OrderedDict[tuple[int, str], tuple[int, bool]] = OrderedDict()
        # handle -> the _paged entry its open had the kernel drop pages for, until a request on
        # the handle shows that open returned (the entry is then settled)
        self._dropping: dict[int, tuple[tuple[int, str], int]] = {}
        self._cursors: dict[int, DirCursor] = {}  # directory handle -> its READDIRPLUS cursor
        # inode -> the newest attributes an open or a getattr of an open file had: answered when no master does
        self._stats: OrderedDict[int, FileStat] = OrderedDict()
        self._master_down_until = 0.0  # monotonic: open files' getattrs skip the master until then
        self.max_background = 0  # asynchronous requests the kernel may queue (0: its default, 12)
        # FUSE thread (OS id: a ctypes callback's Python thread state, and so a threading.local,
        # lasts one call) -> (path, attributes, when) (see _answer)
        self._answers: dict[int, tuple[str, FileStat, float]] = {}

    def init_with_config(self, conn, config) -> None:
        """libfuse's INIT: let the kernel queue ``max_background`` asynchronous requests
        (read-ahead, writeback), congested at three quarters of them. The kernel's default of
        12 held a read of a healthy file behind the read-ahead of readers stuck on a stopped
        worker, whatever the mount's thread count."""
        if conn is not None and self.max_background:
            conn.max_background = self.max_background
            conn.congestion_threshold = self.max_background * 3 // 4

    # ---------------------------------------------------------- handles --

    def _add(self, f: File, append: bool = False, truncate: bool = False) -> int:
        """A new kernel handle of ``f``; a writable ``f`` of an inode another handle of this mount
        writes is dropped for that handle's File (two opens that raced), truncated if asked."""
        extra = None
        # the kernel's page cache is per inode, not per handle: a handle reads the version the
        # kernel was given attributes of (see read), not the snapshot an SDK reader keeps
        f.follow_versions = True
        with self._lock:
            if f.writable():
                shared = self._writers.get(f.inode)
                if shared is not None and shared is not f and not shared.closed:
                    extra, f = f, shared
                if self._writers.get(f.inode) is f:
                    self._writer_refs[f.inode] += 1
                else:
                    self._writers[f.inode], self._writer_refs[f.inode] = f, 1
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = f
            opened, known = f.opened_stat(), self._stats.get(f.inode)
            if known is None or opened.version >= known.version:  # what getattrs fall back on with no master
                _remember(self._stats, f.inode, opened, KNOWN_STATS)
            if append:
                self._appending.add(fh)
        if extra is not None:
            extra.abort()  # nothing written through it; not the creator's (the master says who created)
            if truncate:
                f.truncate(0)
        return fh

    def _get(self, fh: int) -> File:
        if fh in self._dropping:
            self._settle(fh)
        try:
            return self._handles[fh]
        except KeyError as exc:
            raise FuseOSError(errno.EBADF) from exc

    def _settle(self, fh: int) -> None:
        """A request on ``fh`` arrived: its open(2) returned, so the pages its open had the kernel
        drop are gone (see ``_paged``)."""
        with self._lock:
            dropped = self._dropping.pop(fh, None)
            if dropped is not None and self._paged.get(dropped[0]) == (dropped[1], False):
                self._paged[dropped[0]] = (dropped[1], True)

    def _writer_of(self, path: str) -> File | None:
        """The writer of ``path`` in this mount (its size and bytes are the truth here)."""
        with self._lock:
            return next((f for f in self._writers.values() if f.name == path and not f.closed), None)

    def _writer_of_inode(self, inode: int) -> File | None:
        """The writer of ``inode`` in this mount."""
        f = self._writers.get(inode)
        return f if f is not None and not f.closed else None

    # ------------------------------------------------------------ attrs --

    @staticmethod
    def _attrs(st: FileStat, size: int | None = None) -> dict[str, Any]:
        size = st.size if size is None else size
        return {
            "st_mode": st.mode,
            "st_ino": st.inode,
            "st_nlink": st.nlink,
            "st_size": size if not st.is_dir else 4096,
            "st_uid": st.uid,
            "st_gid": st.gid,
            "st_mtime": int(st.mtime * 1e9),
            "st_ctime": int(st.ctime * 1e9),
            "st_atime": int(st.atime * 1e9),
            "st_blocks": (size + BLOCK_REPORT - 1) // BLOCK_REPORT,
            "st_blksize": IO_SIZE,
            "st_rdev": st.rdev,
        }

    def _answer(self, path: str, st: FileStat) -> FileStat:
        """Keep the attributes the master's reply to a mutation of ``path`` carried for the getattr
        that follows it. libfuse's high-level layer answers SETATTR, CREATE, MKDIR, MKNOD and LINK
        with attributes it asks for right after the operation, on the same thread: without this
        that getattr was a second master round trip (a FUSE ``chmod`` cost 2.5 ms, the SDK's
        ``setattr`` 1.0 ms; ``tar x`` makes four such operations per file). The attributes are
        this mutation's own and answer only a getattr of the same path within :data:`ANSWER_TTL`
        seconds, well inside the attribute timeout the kernel then caches them for."""
        if len(self._answers) > KNOWN_STATS:  # threads libfuse ended with an answer kept (a failed SETATTR)
            self._answers.clear()
        self._answers[threading.get_native_id()] = (path, st, time.monotonic())
        return st

    def _unanswered(self) -> None:
        """Drop what :meth:`_answer` kept on this thread. Called first by every operation that
        may keep an answer and by ``truncate``: libfuse runs one SETATTR as chmod, chown,
        truncate and utimens in turn, then one getattr, and none when a step fails; an answer
        kept by an earlier step must not answer that getattr (the truncate came after it) nor
        a later one (a step failed, and the answer stayed behind for the thread's next call)."""
        self._answers.pop(threading.get_native_id(), None)

    def _answered(self, path: str) -> FileStat | None:
        """The attributes :meth:`_answer` kept on this thread for ``path``, used once."""
        last = self._answers.pop(threading.get_native_id(), None)
        if last is None:
            return None
        kept_path, st, at = last
        return st if kept_path == path and time.monotonic() - at < ANSWER_TTL else None

    @translate_errors
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        f = self._handles.get(fh) if fh is not None else self._writer_of(path)
        if f is not None and not f.writable():
            f = self._writer_of_inode(f.inode) or f
        st = self._answered(path)
        if st is None:
            st = self.client.stat(path) if f is None or f.closed else self._open_file_stat(f)
        if f is None and not st.is_dir:
            f = self._writer_of_inode(st.inode)  # written here under another name (a hard link)
        size = f.size if f is not None and f.writable() else st.size
        if not st.is_dir:
            self._tell(st.inode, st.version)
        return self._attrs(st, size)

    def _open_file_stat(self, f: File) -> FileStat:
        """An open file's attributes: the master's, or, while no master answers (etcd without a
        quorum, both masters down), those it last gave for the file: open files keep reading
        (the kernel refreshes attributes every ``attr_timeout`` while it reads, and each refresh
        failed EIO after the client's failover timeout). The first refresh of an outage waits that
        timeout; the next ones, for :data:`MASTER_DOWN_HOLD` seconds, do not ask.

        Raises:
            Unavailable, Timeout: no master answered and the mount has no attributes of the file.
            PCacheError: the master's own answer (NotFound, ...).
        """
        known = self._stats.get(f.inode)
        if known is not None and time.monotonic() < self._master_down_until:
            return known
        try:
            st = self.client.stat(f.name)
        except (Unavailable, Timeout) as exc:
            if known is None:
                raise
            if time.monotonic() >= self._master_down_until:
                logger.warning("open %s: attributes from the mount's last look (%s)", f.name, exc)
            self._master_down_until = time.monotonic() + MASTER_DOWN_HOLD
            return known
        self._master_down_until = 0.0
        with self._lock:
            _remember(self._stats, st.inode, st, KNOWN_STATS)
        return st

    def keep_cache(self, fh: int) -> bool:
        """Whether the kernel may keep its cached pages for the file this new handle opened."""
        f = self._handles.get(fh)
        if f is None:
            return False
        with self._lock:
            key = (f.inode, f.name)  # the kernel caches pages per name: two hard links, two caches
            keep = self._paged.get(key) == (f.version, True)
            if keep:
                _remember(self._paged, key, (f.version, True))
            else:  # the kernel drops the pages when this open returns to its caller
                _remember(self._paged, key, (f.version, False))
                self._dropping[fh] = (key, f.version)
        return keep

    def kernel_behind(self, fh: int) -> bool:
        """Whether the kernel was given the attributes of another version of the file than this
        new handle opened (the mount forgets that version then: the kernel asks again)."""
        f = self._handles.get(fh)
        if f is None:
            return False
        with self._lock:
            told = self._told.get(f.inode, 0)
            if told == 0 or told == f.version:
                return False
            del self._told[f.inode]
        return True

    def _committed(self, f: File, before: int) -> None:
        """A handle of this mount committed, moving the inode from version ``before`` to ``f.version``."""
        self._saw(f.inode, f.version)
        if f.version == before:
            return  # nothing was dirty
        with self._lock:
            # the pages hold the old version plus this writer's bytes: the new version exactly
            # only when nobody else committed in between (no merge)
            key = (f.inode, f.name)
            exact = f.version == before + 1 and self._paged.get(key) == (before, True)
            self._paged[key] = (f.version, True) if exact else (0, False)
            if exact:  # the kernel's size came from these writes
                _remember(self._told, f.inode, f.version)

    def _saw(self, inode: int, version: int) -> None:
        """A handle of this mount opened or committed ``version`` of ``inode``."""
        with self._lock:
            _remember(self._newest, inode, max(self._newest.get(inode, 0), version))

    def _tell(self, inode: int, version: int) -> None:
        """The kernel was given the attributes of ``version`` of ``inode``."""
        with self._lock:
            _remember(self._told, inode, version)

    @translate_errors
    def chmod(self, path: str, mode: int) -> int:
        self._unanswered()
        self._answer(path, self.client.setattr(path, mode=stat_mod.S_IMODE(mode)))
        return 0

    @translate_errors
    def chown(self, path: str, uid: int, gid: int) -> int:
        self._unanswered()
        # -1 (as unsigned) means "leave unchanged"
        st = self.client.setattr(
            path, uid=None if uid in (-1, 0xFFFFFFFF) else uid, gid=None if gid in (-1, 0xFFFFFFFF) else gid
        )
        self._answer(path, st)
        return 0

    @translate_errors
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._unanswered()
        now = _now_ns()
        atime, mtime = times if times is not None else (now, now)
        # libfuse passes utimensat's UTIME_NOW / UTIME_OMIT as a bare tv_nsec (tv_sec 0)
        atime = now if atime == UTIME_NOW else atime
        mtime = now if mtime == UTIME_NOW else mtime
        st = self.client.setattr(
            path,
            atime=None if atime == UTIME_OMIT else atime / 1e9,
            mtime=None if mtime == UTIME_OMIT else mtime / 1e9,
        )
        self._answer(path, st)
        writer = self._writer_of(path)
        if writer is not None and mtime != UTIME_OMIT:
            # set on a file this mount writes (tar, cp -p: write, futimens, close): its close
            # commits this time, not the close's (it did, and every extracted file was "now")
            writer.keep_mtime(mtime / 1e9)
        return 0

    # ----------------------------------------------------------- xattrs --

    @translate_errors
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        attrs = self.client.getxattrs(path)
        if name not in attrs:
            raise FuseOSError(mfusepy.ENOATTR)
        return attrs[name]

    @translate_errors
    def listxattr(self, path: str) -> list[str]:
        return list(self.client.getxattrs(path))

    @translate_errors
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        if not name.startswith(XATTR_PREFIX):
            raise FuseOSError(errno.ENOTSUP)  # security.*, trusted.*, system.* are the kernel's
        attrs = self.client.getxattrs(path)
        if options & os.XATTR_CREATE and name in attrs:
            raise FuseOSError(errno.EEXIST)
        if options & os.XATTR_REPLACE and name not in attrs:
            raise FuseOSError(mfusepy.ENOATTR)
        self.client.setattr(path, set_xattrs={name: bytes(value)})
        return 0

    @translate_errors
    def removexattr(self, path: str, name: str) -> int:
        try:
            self.client.setattr(path, remove_xattrs=[name])
        except NotFound as exc:
            raise FuseOSError(mfusepy.ENOATTR) from exc
        return 0

    # ------------------------------------------------------- namespace --

    @translate_errors
    def readdir(self, path: str, fh: int) -> Iterator[str | tuple[str, dict[str, int], int]]:
        yield "."
        yield ".."
        for entry in self.client.scandir(path):  # page by page: memory flat for huge directories
            # the type in each entry (d_type) spares `find -type f` a lookup RPC per name
            yield entry.name, {"st_mode": entry.mode, "st_ino": entry.inode}, 0

    @translate_errors
    def opendir(self, path: str) -> int:
        with self._lock:  # a directory handle: the cursor of its READDIRPLUS listing
            fh = self._next_fh
            self._next_fh += 1
        return fh

    @translate_errors
    def releasedir(self, path: str, fh: int) -> int:
        with self._lock:
            cursor = self._cursors.pop(fh, None)
        if cursor is not None:
            cursor.drop()
        return 0

    def readdir_plus(self, path: str, fh: int, offset: int) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
        """READDIRPLUS from ``offset``: (offset of the next entry, name, whole attributes) per entry.

        The master's directory pages carry whole inodes, so ``ls -l`` or ``os.scandir`` + ``stat``
        of a directory costs its listing pages, not one lookup RPC per name. Entries are numbered
        ``.`` 0, ``..`` 1, then the listing; a handle keeps one page, so memory stays flat for huge
        directories and a request resumes where the kernel's buffer filled up. A file this mount
        is writing shows its writer's size, as ``getattr`` does. PCache errors propagate."""
        with self._lock:
            cursor = self._cursors.get(fh)
            if cursor is None or cursor.path != path:
                cursor = self._cursors[fh] = DirCursor(path)
        index = offset
        if index == 0:
            index = 1
            yield 1, ".", None
        if index == 1:
            index = 2
            yield 2, "..", None
        while True:
            entry = cursor.entry(index, self.client)
            if entry is None:
                return
            index += 1
            writer = None if entry.is_dir else self._writer_of_inode(entry.inode)
            size = writer.size if writer is not None else None
            if not entry.is_dir:
                self._tell(entry.inode, entry.version)
            yield index, entry.name, self._attrs(entry, size)

    @translate_errors
    def mkdir(self, path: str, mode: int) -> int:
        self._unanswered()
        self._answer(path, self.client.mkdir(path, stat_mod.S_IMODE(mode), owner=_caller()))
        return 0

    @translate_errors
    def rmdir(self, path: str) -> int:
        self.client.rmdir(path)
        return 0

    @translate_errors
    def unlink(self, path: str) -> int:
        self.client.unlink(path)
        return 0

    @translate_errors
    def rename(self, old: str, new: str) -> int:
        self.client.rename(old, new)
        with self._lock:  # open handles follow the file
            for f in self._handles.values():
                if f.name == old:
                    f.moved(new)
        return 0

    @translate_errors
    def symlink(self, target: str, source: str) -> int:
        # mfusepy: symlink(link path, what it points to)
        self.client.symlink(source, target, owner=_caller())
        return 0

    @translate_errors
    def readlink(self, path: str) -> str:
        return self.client.readlink(path)

    @translate_errors
    def link(self, target: str, source: str) -> int:
        self._unanswered()
        # mfusepy: link(the new name, the existing file)
        self._answer(target, self.client.link(source, target))
        return 0

    @translate_errors
    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._unanswered()
        if stat_mod.S_ISREG(mode):
            self.client.open(path, "xb", perm=stat_mod.S_IMODE(mode), owner=_caller()).close()
        else:  # FIFOs, sockets, device nodes: the inode is ours, their behaviour the kernel's
            self._answer(path, self.client.mknod(path, mode, dev, owner=_caller()))
        return 0

    @translate_errors
    def statfs(self, path: str) -> dict[str, int]:
        status = self.client.status()
        alive = [w.info for w in status.workers if w.alive]
        total = sum(w.capacity_bytes for w in alive)
        free = sum(w.free_bytes for w in alive)
        return {
            "f_bsize": IO_SIZE,
            "f_frsize": IO_SIZE,
            "f_blocks": total // IO_SIZE,
            "f_bfree": free // IO_SIZE,
            "f_bavail": free // IO_SIZE,
            "f_files": status.inodes + 1_000_000_000,
            "f_ffree": 1_000_000_000,
            "f_favail": 1_000_000_000,
            "f_namemax": 255,
        }

    # ----------------------------------------------------------- files --

    @translate_errors
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._unanswered()
        flags = fi if isinstance(fi, int) else os.O_RDWR
        kind = "xb" if flags & os.O_EXCL else "w+b"
        shared = None if flags & os.O_EXCL else self._writer_of(path)
        if shared is not None:
            if flags & os.O_TRUNC:
                shared.truncate(0)
            return self._add(shared, append=bool(flags & os.O_APPEND))
        try:
            f = self.client.open(path, kind, perm=stat_mod.S_IMODE(mode), owner=_caller())
        except AlreadyExists as exc:
            raise FuseOSError(errno.EEXIST) from exc
        fh = self._add(f, append=bool(flags & os.O_APPEND), truncate=True)
        kept = self._handles.get(fh)
        if kept is not None and kept is f:  # not another handle's File, shared (see _add)
            self._answer(path, kept.opened_stat())
        return fh

    @translate_errors
    def open(self, path: str, flags: int) -> int:
        access = flags & os.O_ACCMODE
        if access == os.O_RDONLY and not flags & os.O_TRUNC:
            mode = "rb"
        elif flags & os.O_TRUNC:
            mode = "w+b"
        else:
            mode = "r+b"
        shared = self._writer_of(path) if mode != "rb" else None
        if shared is not None:  # another handle of this mount writes it: share its File
            if flags & os.O_TRUNC:
                shared.truncate(0)
            return self._add(shared, append=bool(flags & os.O_APPEND))
        f = self.client.open(path, mode)
        self._saw(f.inode, f.version)
        return self._add(f, append=bool(flags & os.O_APPEND), truncate=bool(flags & os.O_TRUNC))

    @translate_errors
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """Every byte of the request up to the file's size, or an error: never a short read.

        The kernel takes a short answer for EOF: it shrinks the file to it and serves that size
        to every reader until the attributes time out (a 100 MiB file read back as one block,
        exit 0), and caches the zero-filled tail of a short answer. The page cache is per inode, not
        per handle: pages an old handle fills are read with the size the kernel holds. So a handle
        older than the version whose attributes the kernel was given (or that another handle here
        opened) re-reads its layout first; a READ during which the kernel was given other
        attributes is read again; and a short answer to a request past the view's last page (the
        kernel asks whole pages up to the size it holds, no further) re-reads the layout first.

        A read-only handle of a file that a handle of this mount is writing reads through the
        writer (what ``getattr`` reports is the writer's size). The kernel sends ``release``
        without waiting for it: a writer closed under such a read (its close committed first)
        leaves the read to the handle's own view.
        """
        return self._read(path, size, offset, fh, None)  # type: ignore[return-value]

    @translate_errors
    def read_into(self, path: str, view: memoryview, offset: int, fh: int) -> int:
        """:meth:`read` of ``len(view)`` bytes into ``view`` (libfuse's reply buffer: a block file
        read on this host lands there with no copy in between); returns how many."""
        return self._read(path, len(view), offset, fh, view)  # type: ignore[return-value]

    def _read(self, path: str, size: int, offset: int, fh: int, into: memoryview | None) -> bytes | int:
        """The bytes read (``into`` None), or how many were read into ``into``; see :meth:`read`."""
        f = self._get(fh)
        data = b""
        for attempt in range(READ_TRIES):
            src = f if f.writable() else self._writer_of_inode(f.inode) or f
            told = self._told.get(f.inode, 0)
            if src is f and not f.writable() and max(told, self._newest.get(f.inode, 0)) > f.version:
                self._refresh(f)  # the kernel, or another handle here, has a newer version
            try:
                if into is None:
                    data = src.pread(offset, size)
                    got = len(data)
                else:
                    got = src.pread_into(into, offset)
            except Exception:
                if src is f or self._writers.get(f.inode) is src:
                    raise
                continue  # the writer was released under this read (``release`` drops it, then closes it)
            last = attempt == READ_TRIES - 1
            if src is f and not f.writable() and not last:
                if self._told.get(f.inode, 0) != told:
                    continue  # the kernel was given other attributes meanwhile: read in their version
                if got < size and offset + size > -(-f.size // PAGE) * PAGE and self._refresh(f):
                    continue  # the kernel asked past this view's last page: a larger size it was given
            floor = max(0, min(size, src.size - offset))
            if not floor <= got <= size:
                logger.error("%s: read of %d bytes at %d returned %d (expected %d)", path, size, offset, got, floor)
                raise FuseOSError(errno.EIO)
            return data if into is None else got
        logger.error("%s: read of %d bytes at %d: its writer was released under every try", path, size, offset)
        raise FuseOSError(errno.EIO)

    @staticmethod
    def _refresh(f: File) -> bool:
        """Re-read a read-only handle's layout; True when the file changed (False when it is
        gone: an unlinked file stays readable through its open handles as they saw it)."""
        try:
            return f.refresh()
        except NotFound:
            return False

    @translate_errors
    def write(self, path: str, data: bytes | memoryview, offset: int, fh: int) -> int:
        """``data`` may be a view of libfuse's request buffer (:meth:`PCacheFuse.write`): it is
        consumed (copied or written) before this returns, never kept."""
        f = self._get(fh)
        if fh in self._appending:
            return f.append(data)  # at the shared end, one append at a time
        return f.pwrite(data, offset)

    @translate_errors
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._unanswered()
        f = self._handles.get(fh) if fh is not None else self._writer_of(path)
        if f is not None and f.writable():
            before = f.version
            f.truncate(length)
            f.fsync()
            self._committed(f, before)
        else:
            self.client.truncate(path, length)
        return 0

    @translate_errors
    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        """fallocate(2): mode 0 extends the file to ``offset + size`` bytes (a hole: reads as zeros);
        ``FALLOC_FL_KEEP_SIZE`` alone changes nothing; ``FALLOC_FL_PUNCH_HOLE`` and
        ``FALLOC_FL_ZERO_RANGE`` zero the range inside the file. PCache allocates blocks when
        they are written, so no space is reserved ahead: a later write can still get ENOSPC.
        Collapse and insert ranges get EOPNOTSUPP. Committed like a write (at flush/close)."""
        if offset < 0 or size <= 0:
            raise FuseOSError(errno.EINVAL)
        if mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            raise FuseOSError(errno.EOPNOTSUPP)
        f = self._get(fh)
        if not f.writable():
            raise FuseOSError(errno.EBADF)
        end = offset + size
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            pos, zero_end = offset, min(end, f.size)  # past the end there is nothing to zero
            while pos < zero_end:
                n = min(ZERO_CHUNK, zero_end - pos)
                f.pwrite(bytes(n), pos)
                pos += n
        if not mode & FALLOC_FL_KEEP_SIZE and end > f.size:
            f.truncate(end)
        return 0

    @translate_errors
    def flush(self, path: str, fh: int) -> int:
        f = self._get(fh)
        if f.writable():
            before = f.version
            f.fsync()  # close(2) returns after this: close-to-open
            self._committed(f, before)
        return 0

    @translate_errors
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        f = self._get(fh)
        if f.writable():
            before = f.version
            f.fsync()
            self._committed(f, before)
        return 0

    @translate_errors
    def release(self, path: str, fh: int) -> int:
        self._settle(fh)
        with self._lock:
            f = self._handles.pop(fh, None)
            self._appending.discard(fh)
            if f is not None and f.writable() and self._writers.get(f.inode) is f:
                self._writer_refs[f.inode] -= 1
                if self._writer_refs[f.inode] > 0:
                    return 0  # other handles still write it (flush committed this one's close)
                del self._writers[f.inode], self._writer_refs[f.inode]
        if f is not None:
            f.close()
        return 0

    @translate_errors
    def access(self, path: str, amode: int) -> int:
        self.client.stat(path)  # existence; permission bits are checked by the kernel (default_permissions)
        return 0

    def destroy(self, path: str) -> None:
        """The mount ends with files still open: its process was stopped (SIGTERM, Ctrl-C), not
        unmounted (an unmount waits for the last close). Their writers will never close here: a
        rewrite of an existing file is dropped, its last committed content kept (as after a
        SIGKILL; it was committed half-written, over a whole checkpoint); other writes (a new
        file, appends) are committed, as a close would."""
        with self._lock:
            rewriting = {id(f): f for f in self._handles.values() if f.writable() and f.rewrites()}
        for f in rewriting.values():
            logger.warning(
                "%s: still being rewritten when the mount stopped: its last committed content is kept", f.name
            )
            try:
                f.abort()
            except PCacheError as exc:
                logger.warning("%s: %s", f.name, exc)
        for fh in list(self._handles):
            try:
                self.release(path, fh)
            except FuseOSError:
                logger.warning("handle %d could not be committed at unmount", fh)


def _remember(table: OrderedDict, key: Any, value: Any, limit: int = KNOWN_INODES) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class PCacheFuse(mfusepy.FUSE):
    """mfusepy's FUSE, with the page-cache decision of each open made by the operations.

    libfuse's ``auto_cache`` keeps pages unless a fresh getattr shows a new mtime or size, and
    skips that getattr within ``ac_attr_timeout``: a file committed by another mount then read
    old pages after open. Here the operations know the version each handle opened.
    """

    def open(self, path: bytes, fip) -> int:
        """OPEN; when the kernel holds the attributes of another version of the file than this
        handle opened, they are invalidated: the kernel caps every read at the size it holds, so
        a file rewritten (or replaced in its under-store) read back cut to its old size, or past
        it, until the attribute timeout."""
        ret = super().open(path, fip)
        fh = fip.contents.fh
        fip.contents.keep_cache = int(self.operations.keep_cache(fh))
        if ret == 0 and self.operations.kernel_behind(fh):
            _invalidate_attributes(path)
        return ret

    def create(self, path: bytes, mode: int, fip) -> int:
        ret = super().create(path, mode, fip)
        fip.contents.keep_cache = int(self.operations.keep_cache(fip.contents.fh))
        return ret

    def read(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
        """READ answered in libfuse's reply buffer (mfusepy copies the operation's ``bytes`` into
        it): the operations read into a view of it."""
        if not size:
            return 0
        return self.operations.read_into(self._path(path), _view(buf, size), offset, fip.contents.fh)

    def write(self, path: bytes | None, buf, size: int, offset: int, fip) -> int:
        """WRITE with the request's bytes as a view of libfuse's buffer, not a copy
        (mfusepy copies each 1 MiB into ``bytes`` first). The operations consume the data before
        they return (copied into the block's buffer or written to its file), and libfuse reuses
        the buffer only after this returns."""
        data = _view(buf, size) if size else b""
        return self.operations.write(self._path(path), data, offset, fip.contents.fh)

    def _path(self, path: bytes | None) -> str | None:
        return None if path is None else path.decode(self.encoding, self.errors)

    def getxattr(self, path: bytes, name: bytes, value, size: int, *args) -> int:
        """``ls -l`` asks every file for ``security.selinux`` and ``system.posix_acl_access``; PCache
        stores only ``user.*`` (setxattr refuses the rest), so those are answered here, before
        decoding, exceptions and logging (a third of ``ls -l``'s time through the mount)."""
        if not name.startswith(XATTR_PREFIX.encode()):
            return -mfusepy.ENOATTR
        return super().getxattr(path, name, value, size, *args)

    def readdir_fuse_3(self, path: bytes | None, buf, filler, offset: int, fip, flags: int) -> int:
        """libfuse 3's readdir; a READDIRPLUS request gets every entry's attributes.

        mfusepy 3.1 leaves READDIRPLUS as a TODO, and libfuse before 3.17 drops the attributes
        of entries filled with offset 0 (its buffered mode): the kernel then sends a LOOKUP per
        name after listing (``ls -l`` of 100,000 files: 100,000 master round trips). So entries
        go with real offsets (``FUSE_FILL_DIR_PLUS``), one kernel buffer per call, resumed from
        the directory handle's cursor (:meth:`PCacheOperations.readdir_plus`).
        """
        if not flags & FUSE_READDIR_PLUS or path is None:
            return super().readdir_fuse_3(path, buf, filler, offset, fip, flags)
        st = mfusepy.c_stat()
        try:
            entries = self.operations.readdir_plus(path.decode(self.encoding, self.errors), fip.contents.fh, offset)
            for next_offset, name, attrs in entries:
                if attrs is not None:
                    mfusepy.set_st_attrs(st, attrs, use_ns=True)
                full = FUSE_FILL_DIR_PLUS if attrs is not None else 0
                if filler(buf, name.encode(self.encoding, self.errors), st if full else None, next_offset, full):
                    break  # the kernel's buffer is full: the next request resumes at this entry
        except PCacheError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from exc
        return 0


class DirCursor:
    """A directory listing read page by page, positioned by entry index (2 = the first name).

    While the kernel takes one page, the next is already asked of the master (a big
    directory's ``ls -l`` waited for every page in turn): at most two pages per handle.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.base = 2  # index of page[0]
        self.page: list[FileStat] = []
        self.more = True
        self._next: concurrent.futures.Future | None = None  # the page after this one, on its way

    def entry(self, index: int, client: Client) -> FileStat | None:
        """The entry at ``index`` (None past the end); reads the next page, or lists again from
        the start for a ``rewinddir``/``seekdir`` backwards."""
        if index < self.base:
            self.drop()
            self.base, self.page, self.more = 2, [], True
        while index >= self.base + len(self.page):
            if not self.more:
                return None
            after = self.page[-1].name if self.page else ""
            self.base += len(self.page)
            ahead, self._next = self._next, None
            self.page, self.more = ahead.result() if ahead is not None else client.listdir_page(self.path, after)
            if not self.page:
                self.more = False
            elif self.more:
                self._next = client.submit(client.aio.listdir_page(self.path, self.page[-1].name))
        return self.page[index - self.base]

    def drop(self) -> None:
        """Forget the page on its way (the handle is released, or the listing starts again)."""
        if self._next is not None:
            self._next.cancel()
            self._next = None


_fuse_invalidate_path = getattr(mfusepy._libfuse, "fuse_invalidate_path", None)  # libfuse >= 3.1
if _fuse_invalidate_path is not None:
    _fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    _fuse_invalidate_path.restype = ctypes.c_int


def _invalidate_attributes(path: bytes) -> None:
    """Have the kernel ask for ``path``'s attributes again, and drop its pages (libfuse's
    ``fuse_invalidate_path``: a ``notify_inval_inode``); called inside an operation, which gives
    the context naming this mount."""
    if _fuse_invalidate_path is None:
        return
    fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
    err = _fuse_invalidate_path(fuse, path)
    if err:
        logger.debug("%r: the kernel's attributes were not invalidated: %s", path, os.strerror(-err))


def _now_ns() -> int:
    import time

    return time.time_ns()


def _view(buf, size: int) -> memoryview:
    """``size`` bytes of a libfuse buffer (a ctypes ``char *``) as a writable byte view, no copy."""
    return memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents))).cast("B")
