"""The one sync bridge over the async client (the s3fs ``sync_wrapper`` pattern).

:class:`Client` runs a private event loop (uvloop when installed) in a
daemon thread and forwards every call to :class:`PCacheClient` there. FUSE
operations, the checkpoint SDK and the CLI use it; async code should use
:class:`PCacheClient` directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from pcache.client.core import FileStat, PCacheClient, check_not_forked
from pcache.client.file import PCacheFile
from pcache.client.load import LoadReport
from pcache.common.config import ClientConfig
from pcache.common.errors import CorruptBlock, NotSupported, PCacheError, Unavailable
from pcache.proto import pcache_pb2 as pb

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default one."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()


async def _cancel_the_rest(timeout: float = 2.0) -> None:
    """Cancel every other task of this loop and let them finish (``asyncio.run``'s teardown)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


CANCEL_GRACE = 10.0  # seconds an interrupted call gets to clean up (abort a write, remove a temp file)


class _LoopThread:
    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pcache-client-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("sync PCache call from inside its own event loop")
        self._usable(coro)
        finished = threading.Event()

        async def guarded() -> T:
            try:
                return await coro
            finally:
                finished.set()

        fut = asyncio.run_coroutine_threadsafe(guarded(), self.loop)
        try:
            return fut.result()
        except BaseException:  # Ctrl-C in the caller's thread: cancel the call and let it clean up
            if not fut.done():
                fut.cancel()
                finished.wait(CANCEL_GRACE)  # an aborted write removes what it created, a copy its temp file
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop and return at once."""
        self._usable(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _usable(self, coro: Coroutine) -> None:
        """Raise (closing ``coro``) unless this loop can run it."""
        try:
            check_not_forked()  # a parent's client, copied by fork: its loop thread is not here
        except NotSupported:
            coro.close()
            raise
        if not self.thread.is_alive() or self.loop.is_closed():
            coro.close()  # a closed client: fail instead of waiting on a dead loop
            raise Unavailable("the PCache client is closed")

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class Client:
    """Blocking PCache client; the same methods as :class:`PCacheClient`.

    Example::

        with Client(master="127.0.0.1:19600") as pc:
            pc.mkdir("/data", parents=True)
            with pc.open("/data/x.bin", "wb") as f:
                f.write(b"hello")
    """

    def __init__(self, cfg: ClientConfig | None = None, *, master: str | None = None) -> None:
        self._loop = _LoopThread()
        self.aio: PCacheClient = self._loop.run(self._make(cfg, master))

    @staticmethod
    async def _make(cfg: ClientConfig | None, master: str | None) -> PCacheClient:
        return PCacheClient(cfg, master=master)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine of :attr:`aio` (this client's asyncio side) on the client's loop
        and return at once, for work that overlaps the caller's (the mount lists a big
        directory's next page while the kernel takes this one).

        Returns:
            a :class:`concurrent.futures.Future` with the coroutine's result or error;
            cancelling it cancels the coroutine.

        Raises:
            Unavailable: the client is closed. NotSupported: a client inherited through fork.
        """
        return self._loop.submit(coro)

    def close(self) -> None:
        """Close connections and stop the loop thread."""
        if self._loop.thread.is_alive():
            try:
                self._run(self.aio.close())
            finally:
                self._run(_cancel_the_rest())  # read-ahead of files left open, hedges that lost
                self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # namespace
    def stat(self, path: str) -> FileStat:
        return self._run(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        return self._run(self.aio.exists(path))

    def mkdir(self, path: str, mode: int = 0o755, **kwargs: Any) -> FileStat:
        return self._run(self.aio.mkdir(path, mode, **kwargs))

    def listdir(self, path: str) -> list[FileStat]:
        return self._run(self.aio.listdir(path))

    def listdir_page(self, path: str, start_after: str = "") -> tuple[list[FileStat], bool]:
        """One page of a directory after ``start_after``: (entries in name order, whether more follow)."""
        return self._run(self.aio.listdir_page(path, start_after))

    def scandir(self, path: str) -> Iterator[FileStat]:
        """Stream a directory one page (``master.listdir_limit`` entries) at a time."""
        after = ""
        while True:
            entries, more = self.listdir_page(path, after)
            yield from entries
            if not more or not entries:
                return
            after = entries[-1].name

    def link(self, src: str, dst: str) -> FileStat:
        return self._run(self.aio.link(src, dst))

    def rename(self, src: str, dst: str, *, no_replace: bool = False) -> None:
        self._run(self.aio.rename(src, dst, no_replace=no_replace))

    def unlink(self, path: str) -> None:
        self._run(self.aio.unlink(path))

    def rmdir(self, path: str) -> None:
        self._run(self.aio.rmdir(path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._run(self.aio.remove(path, recursive=recursive))

    def symlink(self, target: str, path: str, **kwargs: Any) -> None:
        self._run(self.aio.symlink(target, path, **kwargs))

    def mknod(self, path: str, mode: int, rdev: int = 0, **kwargs: Any) -> FileStat:
        return self._run(self.aio.mknod(path, mode, rdev, **kwargs))

    def readlink(self, path: str) -> str:
        return self._run(self.aio.readlink(path))

    def setattr(self, path: str, **kwargs: Any) -> FileStat:
        return self._run(self.aio.setattr(path, **kwargs))

    def getxattrs(self, path: str) -> dict[str, bytes]:
        return self._run(self.aio.getxattrs(path))

    def truncate(self, path: str, size: int) -> None:
        self._run(self.aio.truncate(path, size))

    def status(self) -> pb.ClusterStatus:
        return self._run(self.aio.status())

    def master_statuses(self) -> list[tuple[str, pb.ClusterStatus | PCacheError]]:
        return self._run(self.aio.master_statuses())

    def create_tenant(self, name: str, root: str = "", *, quota_bytes: int = 0, quota_inodes: int = 0) -> pb.Tenant:
        return self._run(self.aio.create_tenant(name, root, quota_bytes=quota_bytes, quota_inodes=quota_inodes))

    def delete_tenant(self, name: str, *, purge: bool = False) -> None:
        self._run(self.aio.delete_tenant(name, purge=purge))

    def set_quota(self, name: str, *, quota_bytes: int, quota_inodes: int) -> pb.Tenant:
        return self._run(self.aio.set_quota(name, quota_bytes=quota_bytes, quota_inodes=quota_inodes))

    def tenants(self) -> list[pb.Tenant]:
        return self._run(self.aio.tenants())

    def bind(self, path: str, uri: str, *, mode: str = "ro", meta_ttl: float = 60.0, check: bool = True) -> pb.Bind:
        return self._run(self.aio.bind(path, uri, mode=mode, meta_ttl=meta_ttl, check=check))

    def unbind(self, path: str, *, force: bool = False) -> None:
        self._run(self.aio.unbind(path, force=force))

    def refresh(self, path: str) -> FileStat:
        return self._run(self.aio.refresh(path))

    def binds(self) -> list[pb.Bind]:
        return self._run(self.aio.binds())

    def load(self, path: str, **kwargs) -> LoadReport:
        """See :meth:`PCacheClient.load` (``on_progress`` runs on the client's loop thread)."""
        return self._run(self.aio.load(path, **kwargs))

    def free(self, path: str) -> pb.FreeReport:
        return self._run(self.aio.free(path))

    def unclosed_check(self) -> Callable[[FileStat], bool]:
        """Whether a file is under a write-back bind and not closed by its writer yet
        (:meth:`PCacheClient.unclosed_check`)."""
        return self._run(self.aio.unclosed_check())

    def walk_files(self, path: str) -> list[FileStat]:
        """Every regular file at or under ``path`` (with its write-back state)."""

        async def collect() -> list[FileStat]:
            return [st async for st in self.aio.files_under(path)]

        return self._run(collect())

    def wait_persisted(
        self, path: str, *, timeout: float = 600.0, on_wait: Callable[[list[FileStat]], None] | None = None
    ) -> int:
        """See :meth:`PCacheClient.wait_persisted`."""
        return self._run(self.aio.wait_persisted(path, timeout=timeout, on_wait=on_wait))

    def issue_token(self, name: str, ttl: float = 0.0) -> str:
        return self._run(self.aio.issue_token(name, ttl))

    def revoke_tokens(self, name: str) -> pb.Tenant:
        return self._run(self.aio.revoke_tokens(name))

    def layout(self, path: str) -> pb.FileLayout:
        return self._run(self.aio.layout(path))

    def fsck(self, path: str = "/") -> pb.FsckReport:
        return self._run(self.aio.fsck(path))

    def salvage(self, path: str, dest: str):
        return self._run(self.aio.salvage(path, dest))

    def du(self, path: str) -> tuple[int, int, int]:
        return self._run(self.aio.du(path))

    def put(self, local: str, remote: str) -> tuple[int, int]:
        return self._run(self.aio.put(local, remote))

    def get(self, remote: str, local: str) -> tuple[int, int]:
        return self._run(self.aio.get(remote, local))

    def read_file(self, path: str) -> bytes:
        return self._run(self.aio.read_file(path))

    def write_file(self, path: str, data: bytes, **kwargs: Any) -> None:
        self._run(self.aio.write_file(path, data, **kwargs))

    # files
    def open(self, path: str, mode: str = "rb", *, encoding: str | None = None, **kwargs: Any) -> Any:
        """Open a file with Python's modes (r, w, a, x, +; b for bytes, else text). See :meth:`PCacheClient.open`.

        Binary modes return a :class:`File` (unbuffered, like ``buffering=0``); text
        modes wrap it in ``io.TextIOWrapper`` over the matching buffered class.
        """
        raw = File(self, self._run(self.aio.open(path, mode.replace("t", ""), **kwargs)))
        if "b" in mode:
            return raw
        if raw.readable() and raw.writable():
            buffered: io.BufferedRandom | io.BufferedWriter | io.BufferedReader = io.BufferedRandom(raw, 1 << 20)
        elif raw.writable():
            buffered = io.BufferedWriter(raw, 1 << 20)
        else:
            buffered = io.BufferedReader(raw, 1 << 20)
        text = _TextFile(buffered, encoding=encoding or "utf-8")
        text.raw_file = raw
        return text


class _TextFile(io.TextIOWrapper):
    """A text-mode file: as with a binary :class:`File`, an exception inside ``with`` publishes
    nothing (the buffer's close would commit the text written so far over the old content)."""

    raw_file: File

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if exc_type is not None and self.raw_file.writable():
            self.raw_file.abort()  # closed: the wrapper's and the buffer's close then do nothing
        super().__exit__(exc_type, exc, tb)


class File(io.RawIOBase):
    """Blocking file object over :class:`PCacheFile`; usable wherever Python wants a binary file."""

    def __init__(self, client: Client, afile: PCacheFile) -> None:
        super().__init__()
        self._client = client
        self._f = afile
        self.name = afile.path
        self.mode = afile.mode

    def readable(self) -> bool:
        return self._f.readable

    def writable(self) -> bool:
        return self._f.writable

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        f = self._f
        if not f.writable and size is not None and size > 0 and not f.closed:
            direct = self._direct(f.pos, min(size, max(0, f.size - f.pos)))
            if direct is not None:
                f.pos += len(direct)
                return direct
        return self._client._run(self._f.read(size))

    def _direct(self, offset: int, length: int) -> bytes | None:
        """Serve a read inside one stored block through an open short-circuit descriptor, in
        this thread (no event-loop hop); None when that is not possible right now."""
        found = self._direct_source(offset, length)
        if found is None:
            return None
        uds_path, block_id, off = found
        try:
            data = self._client.aio.data.sc_read_open(uds_path, block_id, off, length)  # opened with its token
        except PCacheError:
            return None  # the async path fails over and reports it
        self._f.served.add(offset // self._f.block_size)
        return data

    def _direct_into(self, offset: int, view: memoryview) -> int | None:
        """:meth:`_direct` into ``view`` (whole chunks straight from the block file, no copy);
        the number of bytes, or None."""
        found = self._direct_source(offset, len(view))
        if found is None:
            return None
        uds_path, block_id, off = found
        try:
            n = self._client.aio.data.sc_read_open_into(uds_path, block_id, off, view)
        except PCacheError:
            return None
        self._f.served.add(offset // self._f.block_size)
        return n

    def _direct_source(self, offset: int, length: int) -> tuple[str, int, int] | None:
        """(short-circuit socket, block id, offset in the block) of a read inside one stored block
        of this host's workers, or None."""
        f = self._f
        if length <= 0 or offset >= f.size:
            return None
        idx, off = divmod(offset, f.block_size)
        if idx >= len(f.slots):
            return None
        slot = f.slots[idx]
        if not slot.block_id or slot.data is not None or slot.pending is not None or off + length > slot.length:
            return None
        data = self._client.aio.data
        for addr in slot.locations:
            if data.can_short_circuit(addr):
                return addr.uds_path, slot.block_id, off
        return None

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def pread(self, offset: int, length: int) -> bytes:
        """Read ``min(length, size - offset)`` bytes at ``offset``: never fewer unless at EOF.

        A read-only handle's last read unit (``read_unit`` bytes, aligned; cached under the
        client's ``read_budget``) serves small positional reads inside it (FUSE sends
        128 KiB - 1 MiB) in the caller's thread without a hop to the event loop. A request that crosses
        a unit or block boundary is assembled from every piece it covers (a short
        answer would be taken for EOF by the kernel and by ``read()`` loops).

        Raises:
            Unavailable, CorruptBlock, Timeout: a piece could not be read.
        """
        if self._f.writable:
            return self._client._run(self._f.pread(offset, length))
        end = min(self._f.size, offset + max(0, length))
        parts: list[bytes] = []
        pos = offset
        while pos < min(end, self._f.size):  # a read that took a newer version may find the file shorter
            piece = self._pread_piece(pos, end - pos)
            if not piece and pos < self._f.size:  # cannot happen below the handle's size; never answer short
                raise CorruptBlock(f"{self.name}: no bytes at offset {pos} below its size {self._f.size}")
            parts.append(piece)
            pos += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pread_into(self, view: memoryview, offset: int) -> int:
        """:meth:`pread` into ``view`` (``len(view)`` bytes at most); returns how many. A read of a
        read-only handle inside one block of this host's workers goes from the block file into
        ``view`` with no copy in between, and one inside the handle's last read unit is copied
        from it (the mount answers READ this way, into libfuse's buffer).

        Raises:
            as :meth:`pread`.
        """
        f = self._f
        if not f.writable:
            length = min(len(view), max(0, f.size - offset))
            block_end = (offset // f.block_size + 1) * f.block_size
            if length > 0 and offset + length <= block_end:
                n = self._direct_into(offset, view[:length])
                if n is not None:
                    return n
                hot = f.hot  # the handle's last read unit (a remote block's): one copy, no allocation
                if hot is not None and hot[0] <= offset and offset + length <= hot[0] + len(hot[1]):
                    start = offset - hot[0]
                    view[:length] = memoryview(hot[1])[start : start + length]
                    return length
        data = self.pread(offset, len(view))
        view[: len(data)] = data
        return len(data)

    def _pread_piece(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``, at least one, at most to the end of a unit or block."""
        f = self._f
        block_end = (offset // f.block_size + 1) * f.block_size
        direct = self._direct(offset, min(length, block_end - offset))
        if direct is not None:
            return direct
        hot = f.hot  # one atomic read of the (offset, bytes, key) triple: safe across threads
        if hot is not None and hot[0] <= offset < hot[0] + len(hot[1]):
            start = offset - hot[0]
            return bytes(memoryview(hot[1])[start : start + length])
        unit = f.cfg.read_unit
        if length < unit:  # up to the unit's end: the next small read finds it hot
            length = min(length, block_end - offset, (offset // unit + 1) * unit - offset)
        return self._client._run(f.pread(offset, length))

    @property
    def follow_versions(self) -> bool:
        """Whether reads take a later commit's layout when this handle's blocks are gone, even
        after it returned bytes (see :meth:`PCacheFile.pread`; default False: ``StaleHandle``)."""
        return self._f.follow_versions

    @follow_versions.setter
    def follow_versions(self, value: bool) -> None:
        self._f.follow_versions = value

    def refresh(self) -> bool:
        """Re-read a read-only handle's layout (see :meth:`PCacheFile.refresh`); True if it changed."""
        return self._client._run(self._f.refresh())  # drops the handle's hot unit when it changed

    def write(self, data) -> int:
        return self._client._run(self._f.write(data))

    def pwrite(self, data, offset: int) -> int:
        return self._client._run(self._f.pwrite(data, offset))

    def append(self, data) -> int:
        """Write ``data`` at the end of the file, whatever the position (O_APPEND); returns its length."""
        return self._client._run(self._f.append_write(data))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        return self._client._run(self._f.truncate(size))

    def flush(self) -> None:
        if not self._f.closed:
            self._client._run(self._f.flush())

    def fsync(self) -> None:
        """Write everything and commit: visible to other clients afterwards."""
        self._client._run(self._f.fsync())

    @property
    def size(self) -> int:
        return self._f.size

    @property
    def inode(self) -> int:
        return self._f.inode

    def opened_stat(self) -> FileStat:
        """The file's metadata as its open found it (sizes in bytes, times in seconds)."""
        return FileStat.from_inode(self.name, self._f.node)

    @property
    def version(self) -> int:
        """The inode version this handle's view starts from (its open, last commit or refresh)."""
        return self._f.version

    def rewrites(self) -> bool:
        """Whether this writer replaces a file's committed content with bytes not yet committed
        (it truncated an existing file: ``open(..., "wb")``, ``O_TRUNC``, ``truncate``)."""
        f = self._f
        return f.writable and not f.closed and f.dirty and f.replace and not f.created

    def keep_mtime(self, mtime: float) -> None:
        """Commit ``mtime`` (seconds since the epoch) as the modification time at this writer's
        next commit, unless it writes again first (``futimens`` on an open file, as ``tar`` and
        ``cp -p`` do before their close)."""
        self._f.mtime_set = mtime

    def moved(self, path: str) -> None:
        """The file was renamed to ``path`` while open (its handle keeps working)."""
        self.name = self._f.path = path

    def close(self) -> None:
        if not self.closed:
            try:
                self._client._run(self._f.close())
            finally:
                super().close()

    def abort(self) -> None:
        """Close without committing: the file keeps its last committed content."""
        if not self.closed:
            try:
                self._client._run(self._f.abort())
            finally:
                super().close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.writable():
            self.abort()  # an exception inside ``with``: publish nothing (the old content stays)
        else:
            self.close()
