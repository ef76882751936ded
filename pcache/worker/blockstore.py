"""Block store on the node's local disk: one file per block plus a CRC sidecar.

Layout under ``<data_dir>``::

    blocks/<xx>/<block_id>.blk    block bytes, then its CRC record (footer)
    tmp/                          blocks being written (removed at start-up)

``xx`` is the low byte of the id in hex, to keep directories small. The CRC
record follows the data in the same file: one CRC32C per chunk, then a fixed
footer ``"PCBM", version, length, block CRC32C, chunk count``. A block is
written to ``tmp/``, fsynced once (data and record together) and renamed into
place, so a crash leaves either no block or a whole one, at the cost of one
fsync per block. Reads verify the CRC32C of every chunk they touch (the
checksums of HDFS ``.meta`` sidecars and 3FS chunks, kept in the block file). All methods are blocking; the data server
calls them from worker threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from pcache.common.checksum import CHUNK_SIZE, RunningCrc, verify_chunks
from pcache.common.errors import AlreadyExists, CorruptBlock, InvalidArgument, NoSpace, NotFound, PermissionDenied

logger = logging.getLogger(__name__)

META_MAGIC = b"PCBM"
BURIED_REMEMBERED = 262_144  # ids of deleted blocks whose writes are refused (see ``bury``): ~30 MiB at most
FOOTER = struct.Struct(">4sHQII")  # magic, version, length, block crc, chunk count


@dataclass(frozen=True)
class BlockInfo:
    """Integrity record of a stored block."""

    block_id: int
    length: int  # bytes
    crc32c: int
    chunk_crcs: tuple[int, ...]


class BlockStore(Protocol):
    """Where a worker keeps block bytes."""

    def begin_write(self, block_id: int, length: int) -> BlockWriter:
        """Reserve room for a block of ``length`` bytes and start writing it."""
        ...

    def info(self, block_id: int) -> BlockInfo:
        """Return a stored block's integrity record."""
        ...

    def has(self, block_id: int) -> bool:
        """Whether the block is stored here (whole: a block being written is not)."""
        ...

    def read(self, block_id: int, offset: int, length: int) -> bytes:
        """Read a verified byte range of a block."""
        ...

    def delete(self, block_id: int) -> bool:
        """Remove a block; False if it was not there."""
        ...

    def block_ids(self) -> list[int]:
        """List the stored blocks (the full block report)."""
        ...


class BlockWriter:
    """A block being written into ``tmp/``; ``commit`` makes it visible."""

    def __init__(self, store: DiskBlockStore, block_id: int, length: int) -> None:
        self.store = store
        self.block_id = block_id
        self.length = length
        self.path = os.path.join(store.tmp_dir, f"{block_id}.{uuid.uuid4().hex[:8]}")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.sums = RunningCrc()
        self._adopted: tuple[int, list[int]] | None = None  # (crc, chunk crcs) a client computed
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes, updating the chunk and block CRCs.

        Raises:
            NoSpace: the disk is full. InvalidArgument: more than the announced length.
        """
        if self.written + len(data) > self.length:
            raise InvalidArgument(f"block {self.block_id}: more than the announced {self.length} bytes")
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as exc:
            raise NoSpace(f"block {self.block_id}: disk write failed: {exc}") from exc
        self.sums.update(data)

    @property
    def written(self) -> int:
        """Bytes of the block accounted so far."""
        return self.length if self._adopted else self.sums.length

    @property
    def crc(self) -> int:
        """CRC32C of the bytes accounted so far."""
        return self._adopted[0] if self._adopted else self.sums.crc

    def account_existing(self) -> None:
        """Compute CRCs over bytes a short-circuit client wrote into the fd itself."""
        size = os.fstat(self.fd).st_size
        if size != self.length:
            self.abort()
            raise InvalidArgument(f"block {self.block_id}: client wrote {size} bytes, announced {self.length}")
        self.sums = RunningCrc()
        self._adopted = None
        offset = 0
        while offset < size:
            data = os.pread(self.fd, min(8 * CHUNK_SIZE, size - offset), offset)
            if not data:
                break
            self.sums.update(data)
            offset += len(data)

    def adopt_crcs(self, crc: int, chunk_crcs: list[int]) -> None:
        """Take the CRCs a short-circuit client computed over the bytes it wrote into the fd itself
        (from the buffers it wrote, as it wrote them), instead of reading the block back: the CRC is
        computed once, end to end. The bytes are not re-read: a client that names wrong CRCs spoils
        only the block its token lets it write, which every later read then refuses (CorruptBlock)
        and every replica refuses to store (the pipeline's receivers recompute).

        Raises:
            InvalidArgument: another file size than announced, or not one CRC per chunk.
        """
        size = os.fstat(self.fd).st_size
        if size != self.length:
            self.abort()
            raise InvalidArgument(f"block {self.block_id}: client wrote {size} bytes, announced {self.length}")
        if len(chunk_crcs) != (self.length + CHUNK_SIZE - 1) // CHUNK_SIZE:
            self.abort()
            raise InvalidArgument(
                f"block {self.block_id}: {len(chunk_crcs)} chunk CRCs for {self.length} bytes"
                f" ({CHUNK_SIZE} bytes per chunk)"
            )
        self._adopted = (crc, list(chunk_crcs))

    def commit(self, expected_crc: int | None = None, *, sync: bool = True) -> BlockInfo:
        """fsync (unless ``sync`` is false or the store never does), verify, and publish the block.
        A block copied from an under-store is published unsynced: the store keeps the original.

        Raises:
            CorruptBlock: the bytes do not match ``expected_crc``.
            InvalidArgument: fewer bytes than announced.
        """
        if self.written != self.length:
            self.abort()
            raise InvalidArgument(f"block {self.block_id}: got {self.written} of {self.length} bytes")
        if expected_crc is not None and expected_crc != self.crc:
            self.abort()
            raise CorruptBlock(f"block {self.block_id}: CRC32C {self.crc:#x} != sender's {expected_crc:#x}")
        chunks = self._adopted[1] if self._adopted else self.sums.chunk_crcs()
        try:
            record = struct.pack(f">{len(chunks)}I", *chunks) + FOOTER.pack(
                META_MAGIC, 1, self.length, self.crc, len(chunks)
            )
            os.pwrite(self.fd, record, self.length)
            if self.store.fsync and sync:
                os.fsync(self.fd)
            os.close(self.fd)
            self.closed = True
            info = BlockInfo(self.block_id, self.length, self.crc, tuple(chunks))
            self.store._publish(self.path, info)
        except (AlreadyExists, PermissionDenied):  # PermissionDenied is an OSError: not a full disk
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise NoSpace(f"block {self.block_id}: cannot store: {exc}") from exc
        finally:
            self.store._release(self.block_id, self.length)
        return info

    def abort(self) -> None:
        """Drop the partial block and its reservation."""
        if not self.closed:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.closed = True
            self.store._release(self.block_id, self.length)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def block_file(data_dir: str, block_id: int) -> str:
    """Path of ``block_id``'s file under a worker's ``data_dir``: ``blocks/<low byte in hex>/<id>.blk``."""
    return os.path.join(data_dir, "blocks", f"{block_id & 0xFF:02x}", f"{block_id}.blk")


class DiskBlockStore:
    """:class:`BlockStore` on a local directory, with a byte quota."""

    def __init__(self, data_dir: str, *, capacity_bytes: int = 0, reserve_bytes: int = 0, fsync: bool = True) -> None:
        self.root = os.path.abspath(data_dir)
        self.blocks_dir = os.path.join(self.root, "blocks")
        self.tmp_dir = os.path.join(self.root, "tmp")
        os.makedirs(self.blocks_dir, exist_ok=True)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)  # half-written blocks of a crashed run
        os.makedirs(self.tmp_dir, exist_ok=True)
        self.fsync = fsync
        self.reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._writing: set[int] = set()  # block ids being written (each holds its reservation)
        self._reserved = 0
        self._infos: dict[int, BlockInfo] = {}
        self._size_queue: list[int] = []  # blocks whose file size :meth:`misfits` checks next
        self._buried: OrderedDict[int, float] = OrderedDict()  # block id -> monotonic time writes are refused until
        # bytes counted in used_bytes, by block: a block is counted once and uncounted once, whatever
        # the order of a delete, a reader's info() caching its record again, and forget() (a record
        # cached again between a delete's pop and its unlink was forgotten later and subtracted
        # twice: used_bytes went negative and the heartbeat, which sends it, failed for good)
        self._counted: dict[int, int] = {}
        self.used_bytes = 0
        for block_id in self._scan():
            with contextlib.suppress(NotFound, CorruptBlock):
                self._count(block_id, self.info(block_id).length)
        if capacity_bytes:
            self.capacity_bytes = capacity_bytes
        else:
            disk = shutil.disk_usage(self.root)
            self.capacity_bytes = max(0, disk.free + self.used_bytes - reserve_bytes)

    # ------------------------------------------------------------ paths --

    def block_path(self, block_id: int) -> str:
        """Path of the file of ``block_id`` (its first ``length`` bytes are the data)."""
        return block_file(self.root, block_id)

    def _scan(self) -> list[int]:
        ids = []
        for sub in os.listdir(self.blocks_dir):
            d = os.path.join(self.blocks_dir, sub)
            for name in os.listdir(d):
                if name.endswith(".blk"):
                    with contextlib.suppress(ValueError):
                        ids.append(int(name[:-4]))
        return ids

    # ------------------------------------------------------------ space --

    @property
    def block_count(self) -> int:
        """Blocks stored with a readable record (what heartbeats report)."""
        with self._lock:
            return len(self._infos)

    @property
    def reserved_bytes(self) -> int:
        """Bytes held for blocks being written now (each becomes stored, or is released)."""
        with self._lock:
            return self._reserved

    @property
    def free_bytes(self) -> int:
        """Bytes a new block may still take (quota and real disk both respected)."""
        with self._lock:
            quota_free = self.capacity_bytes - self.used_bytes - self._reserved
        disk_free = shutil.disk_usage(self.root).free - self.reserve_bytes - self._reserved
        return max(0, min(quota_free, disk_free))

    def _reserve(self, block_id: int, length: int) -> None:
        if length > self.free_bytes:
            raise NoSpace(f"worker has {self.free_bytes} bytes free, block needs {length}")
        with self._lock:
            if block_id in self._writing:  # one writer per id: a token cannot reserve the disk twice
                raise AlreadyExists(f"block {block_id} is being written here already; a block id is written once")
            self._writing.add(block_id)
            self._reserved += length

    def _release(self, block_id: int, length: int) -> None:
        with self._lock:
            self._writing.discard(block_id)
            self._reserved -= length

    # ------------------------------------------------------------- api --

    def begin_write(self, block_id: int, length: int) -> BlockWriter:
        """Reserve room and open a temp file for ``block_id``.

        Raises:
            AlreadyExists: the block is stored here already (a block id is written once).
            NoSpace: the quota or the disk cannot take ``length`` more bytes.
        """
        self._refuse_existing(block_id)
        self._reserve(block_id, length)
        try:
            return BlockWriter(self, block_id, length)
        except OSError as exc:
            self._release(block_id, length)
            raise NoSpace(f"cannot create block file: {exc}") from exc

    def _refuse_existing(self, block_id: int) -> None:
        if block_id in self._infos or os.path.lexists(self.block_path(block_id)):
            raise AlreadyExists(f"block {block_id} is stored here already; a block id is written once")
        self._refuse_buried(block_id)

    def bury(self, block_id: int, seconds: float) -> None:
        """Refuse writes of ``block_id`` for ``seconds``: the block left the namespace, and a write
        token of it that is still valid (a token cannot be revoked) must not store it again, where
        no tenant is charged for it until the next full block report. Remembers the newest
        :data:`BURIED_REMEMBERED` ids (not across a restart: the full block report at registration
        then deletes such a block)."""
        if seconds <= 0:
            return
        with self._lock:
            self._buried[block_id] = time.monotonic() + seconds
            self._buried.move_to_end(block_id)
            while len(self._buried) > BURIED_REMEMBERED:
                self._buried.popitem(last=False)

    def buried(self, block_id: int) -> bool:
        """Whether the master deleted ``block_id`` here lately (one of the newest
        :data:`BURIED_REMEMBERED` deletes of this run)."""
        return block_id in self._buried

    def _refuse_buried(self, block_id: int) -> None:
        until = self._buried.get(block_id)
        if until is None:
            return
        if until <= time.monotonic():
            with self._lock:
                self._buried.pop(block_id, None)
            return
        raise PermissionDenied(f"block {block_id} was deleted: its write token is spent")

    def _publish(self, tmp_path: str, info: BlockInfo) -> None:
        """Make the temp file the block, never over an existing one (``link`` fails if it exists,
        atomically: two writers of one id cannot both win).

        Raises:
            AlreadyExists: the block is stored here already.
        """
        path = self.block_path(info.block_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            self._refuse_buried(info.block_id)  # deleted while it was being written
            os.link(tmp_path, path)
        except FileExistsError as exc:
            raise AlreadyExists(f"block {info.block_id} is stored here already; a block id is written once") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_path)
        with self._lock:
            self._count(info.block_id, info.length)
            self._infos[info.block_id] = info

    def _count(self, block_id: int, length: int) -> None:
        """Count a block's bytes in ``used_bytes`` (once; the caller holds the lock, or is __init__)."""
        self.used_bytes += length - self._counted.get(block_id, 0)
        self._counted[block_id] = length

    def _uncount(self, block_id: int) -> None:
        """Stop counting a block's bytes (once; the caller holds the lock)."""
        self.used_bytes = max(0, self.used_bytes - self._counted.pop(block_id, 0))

    def has(self, block_id: int) -> bool:
        return block_id in self._infos or os.path.lexists(self.block_path(block_id))

    def info(self, block_id: int) -> BlockInfo:
        """Return the integrity record of a stored block.

        Raises:
            NotFound: no such block. CorruptBlock: the record is damaged.
        """
        cached = self._infos.get(block_id)
        if cached is not None:
            return cached
        try:
            fd = os.open(self.block_path(block_id), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NotFound(f"block {block_id} is not on this worker") from exc
        try:
            size = os.fstat(fd).st_size
            if size < FOOTER.size:
                raise CorruptBlock(f"block {block_id}: file too short for its CRC record")
            magic, _version, length, crc, count = FOOTER.unpack(os.pread(fd, FOOTER.size, size - FOOTER.size))
            if magic != META_MAGIC or length + 4 * count + FOOTER.size != size:
                raise CorruptBlock(f"block {block_id}: damaged CRC record")
            chunks = struct.unpack(f">{count}I", os.pread(fd, 4 * count, length))
        finally:
            os.close(fd)
        info = BlockInfo(block_id, length, crc, tuple(chunks))
        self._infos[block_id] = info
        return info

    def read_chunks(self, block_id: int, first: int, last: int) -> list[bytes]:
        """Read chunks ``first..last`` (inclusive) of a block, each verified.

        Raises:
            NotFound: no such block. CorruptBlock: a chunk fails its CRC32C
            or the file is shorter than recorded.
        """
        info = self.info(block_id)
        data_path = self.block_path(block_id)
        start = first * CHUNK_SIZE
        end = min(info.length, (last + 1) * CHUNK_SIZE)
        try:
            fd = os.open(data_path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NotFound(f"block {block_id} data file is missing") from exc
        try:
            raw = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        if len(raw) != end - start:
            raise CorruptBlock(f"block {block_id}: file is truncated")
        verify_chunks(block_id, raw, first, info.chunk_crcs)
        view = memoryview(raw)
        return [bytes(view[i : i + CHUNK_SIZE]) for i in range(0, len(view), CHUNK_SIZE)]

    def read(self, block_id: int, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of a block, verifying the chunks touched.

        Raises:
            NotFound, CorruptBlock. InvalidArgument: range outside the block.
        """
        info = self.info(block_id)
        if offset < 0 or length < 0 or offset + length > info.length:
            raise InvalidArgument(f"range {offset}+{length} outside block {block_id} of {info.length} bytes")
        if length == 0:
            return b""
        first, last = offset // CHUNK_SIZE, (offset + length - 1) // CHUNK_SIZE
        data = b"".join(self.read_chunks(block_id, first, last))
        skip = offset - first * CHUNK_SIZE
        return data[skip : skip + length]

    def delete(self, block_id: int) -> bool:
        """Remove a block's file; False if it was not stored."""
        with self._lock:
            self._infos.pop(block_id, None)
            self._uncount(block_id)
        try:
            os.unlink(self.block_path(block_id))
        except FileNotFoundError:
            return False
        self._infos.pop(block_id, None)  # a reader's info() may have cached the record again meanwhile
        return True

    def block_ids(self) -> list[int]:
        """Every block file present."""
        return self._scan()

    def read_raw(self, block_id: int, offset: int, length: int) -> bytes:
        """Bytes ``offset .. offset+length`` of the block's data, unchecked, at most to the end
        of its data (``length`` is bounded by the file: a request cannot make the worker allocate
        more than the block holds): for salvage, when the CRC record itself is damaged (the caller
        checks the bytes against the master's CRC).

        Raises:
            NotFound: no file for the block.
        """
        fd = self.open_read(block_id)
        try:
            info = self._infos.get(block_id)
            end = info.length if info is not None else os.fstat(fd).st_size  # a record may be what is damaged
            return os.pread(fd, max(0, min(length, end - offset)), offset) if offset < end else b""
        finally:
            os.close(fd)

    def open_read(self, block_id: int) -> int:
        """A read-only descriptor of the block's file (the caller closes it).

        Raises:
            NotFound: the file is gone.
        """
        try:
            return os.open(self.block_path(block_id), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NotFound(f"block {block_id} data file is missing") from exc

    def forget(self, block_id: int) -> bool:
        """Drop the record of a block whose file vanished behind the store's back; True if it had one."""
        with self._lock:
            info = self._infos.pop(block_id, None)
            self._uncount(block_id)
        return info is not None

    def misfits(self, limit: int = 10_000) -> list[int]:
        """Blocks whose file is not the size their record gives (truncated or extended behind the
        store's back: a bad disk, a careless hand), checking the next ``limit`` records round-robin
        so that each call costs at most ``limit`` stats (HDFS's DirectoryScanner compares block
        lengths likewise). A flipped bit keeps the size: the scrub finds that."""
        if not self._size_queue:
            with self._lock:
                self._size_queue = list(self._infos)
        batch, self._size_queue = self._size_queue[-limit:], self._size_queue[:-limit]
        bad = []
        for block_id in batch:
            info = self._infos.get(block_id)
            if info is None:
                continue  # deleted meanwhile
            try:
                size = os.stat(self.block_path(block_id)).st_size
            except FileNotFoundError:
                continue  # the presence check reports it
            if size != info.length + 4 * len(info.chunk_crcs) + FOOTER.size:
                bad.append(block_id)
        return bad

    def vanished(self) -> list[int]:
        """Blocks the store holds a record of whose file is gone (forgotten as they are found)."""
        present = set(self._scan())
        gone = [b for b in list(self._infos) if b not in present and not os.path.exists(self.block_path(b))]
        return [b for b in gone if self.forget(b)]
