"""Thin async client of the workers' data plane, TCP and short circuit.

TCP connections are pooled per worker and used by one request at a time; a
connection that saw an error is discarded. When a worker advertises a UNIX
socket that exists on this host, block bytes move through file descriptors
instead (see :mod:`pcache.worker.shortcircuit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import socket
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pcache.common import framing, memory, uds
from pcache.common.checksum import CHUNK_SIZE, RunningCrc, verify_chunks
from pcache.common.config import ClientConfig
from pcache.common.credentials import find_tls_dir
from pcache.common.errors import (
    CorruptBlock,
    InvalidArgument,
    NoSpace,
    PCacheError,
    ProtocolError,
    Timeout,
    Unavailable,
)
from pcache.common.tls import TLSConfig, load_optional
from pcache.proto import pcache_pb2 as pb

T = TypeVar("T")

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
POOL_PER_WORKER = 8
STREAM_PIECE = 1 << 20  # a stream gathers smaller appends up to this many bytes per pwritev
RECEIVER_THREADS = 16  # plain-TCP reads received at once (each blocks a thread, not the loop)
MAX_SC_FDS = 256  # short-circuit block descriptors kept open per client
SC_VERIFIED_CHUNKS = 16  # checked chunks kept for small short-circuit reads (16 MiB per client)
SC_SOCKET_RECHECK = 1.0  # seconds a worker's UNIX socket is taken to exist after a check
FAILED_FETCH_MEMORY = 10.0  # seconds reads of a block whose store did not answer in time fail at once
SC_SWEEP_SECONDS = 1.0  # how often cached descriptors of deleted block files are closed


class WrongBlock(CorruptBlock):
    """A replica whose CRC32C of the whole block is not the one its writer committed: other bytes
    under that block id. Seen by the client (the worker's own checks pass), which reports it."""


def check_block_crc(addr: pb.WorkerAddr, block_id: int, committed: int, stored: int) -> None:
    """Compare the CRC32C a replica reports for the whole block with the committed one (0: not known).

    Raises:
        WrongBlock: they differ.
    """
    if committed and stored != committed:
        raise WrongBlock(
            f"block {block_id} on {addr.worker_id} has CRC32C {stored:#010x}, not the committed {committed:#010x}:"
            " another block is stored under this id there"
        )


class VerifiedChunks:
    """The last ``entries`` block chunks (``CHUNK_SIZE`` bytes each) this client read through the
    short circuit for small reads and found matching their CRC32C: bytes already checked, in this
    process's memory, which a later small read inside the same chunk takes instead of reading and
    checking the whole chunk again. Thread-safe (the sync bridge reads from the caller's thread).
    """

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._lru: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> bytes | None:
        with self._lock:
            data = self._lru.get(key)
            if data is not None:
                self._lru.move_to_end(key)
            return data

    def put(self, key: tuple[int, int], data: bytes) -> None:
        with self._lock:
            self._lru[key] = data
            self._lru.move_to_end(key)
            while len(self._lru) > self.entries:
                self._lru.popitem(last=False)

    def drop(self, block_id: int) -> None:
        """Forget a block's chunks (its replica was found bad, or forgotten)."""
        with self._lock:
            for key in [k for k in self._lru if k[0] == block_id]:
                del self._lru[key]


class _ScBlock:
    """An open short-circuit descriptor of one block and its CRC record."""

    def __init__(self, fd: int, info: pb.DataHeader) -> None:
        self.fd = fd
        self.info = info
        self.users = 0
        self.closed = False
        self.doomed = False  # evicted: close once the last reader releases it
        self.lock = threading.Lock()  # users/closed: the loop and sync callers share descriptors

    def acquire(self) -> bool:
        """Pin the descriptor for a read; False once it is closed."""
        with self.lock:
            if self.closed:
                return False
            self.users += 1
            return True

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            close = self.doomed and not self.users and not self.closed
            if close:
                self.closed = True
        if close:
            os.close(self.fd)

    def pread(self, offset: int, length: int, verified: VerifiedChunks | None = None) -> bytes:
        """Read ``length`` bytes at ``offset`` (blocking), checking every chunk touched.

        Every read from the file is verified, page cache or not: a block file can change under
        an open descriptor (a flipped bit, a bad disk), and CRC32C runs at ~10 GB/s. A read
        inside one chunk is served from ``verified`` (chunks this client read and checked
        already) when it holds that chunk, and leaves the chunk there: small reads at random
        places (a trainer's windows through the mount) would otherwise read and check 1 MiB each.
        """
        if length == 0:
            return b""
        info = self.info
        first, last = offset // CHUNK_SIZE, (offset + length - 1) // CHUNK_SIZE
        start = first * CHUNK_SIZE
        skip = offset - start
        small = verified is not None and first == last and length < CHUNK_SIZE
        if small:
            assert verified is not None
            held = verified.get((info.block_id, first))
            if held is not None:
                return held[skip : skip + length]
        end = min(info.block_length, (last + 1) * CHUNK_SIZE)
        raw = os.pread(self.fd, end - start, start)
        if len(raw) != end - start:
            raise CorruptBlock(f"block {info.block_id}: file shorter than its record")
        verify_chunks(info.block_id, raw, first, info.chunk_crcs)
        if small:
            assert verified is not None
            verified.put((info.block_id, first), raw)
        return raw if skip == 0 and length == len(raw) else raw[skip : skip + length]

    def pread_into(self, offset: int, view: memoryview, verified: VerifiedChunks | None = None) -> int:
        """:meth:`pread` of ``len(view)`` bytes into ``view``. A range of whole chunks (the last
        may end at the block's end) is read straight into ``view`` and checked there; any other
        is read as :meth:`pread` does and copied. Returns the bytes read (``len(view)``).

        Raises:
            CorruptBlock: a chunk failed its CRC32C check, or the file is short (``view`` then
                holds unchecked bytes: the caller must not use them).
        """
        length = len(view)
        end = offset + length
        if length and offset % CHUNK_SIZE == 0 and (end % CHUNK_SIZE == 0 or end == self.info.block_length):
            if end > self.info.block_length:
                raise CorruptBlock(f"block {self.info.block_id}: read past its {self.info.block_length} bytes")
            if os.preadv(self.fd, [view], offset) != length:
                raise CorruptBlock(f"block {self.info.block_id}: file shorter than its record")
            verify_chunks(self.info.block_id, view, offset // CHUNK_SIZE, self.info.chunk_crcs)
            return length
        data = self.pread(offset, length, verified)
        view[: len(data)] = data
        return len(data)

    def unlinked(self) -> bool:
        """Whether the worker deleted the block's file (the open descriptor alone keeps its space)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def close_when_idle(self) -> None:
        """Close now, or when the last reader releases it."""
        with self.lock:
            self.doomed = True
            if self.closed or self.users:
                return
            self.closed = True
        os.close(self.fd)


class WorkerHealth:
    """Workers this client saw stall or fail, tried last for every later block until they answer.

    A client-wide dead-node list, as HDFS's DFSClient keeps, so one hung worker costs a reader one
    stall, not one per block; plus the recent read latencies that set the hedging delay (Dean and
    Barroso, "The Tail at Scale", 2013: a backup request after the 95th percentile).
    """

    def __init__(self, suspect_seconds: float) -> None:
        self.suspect_seconds = suspect_seconds
        self._until: dict[str, float] = {}
        self._since: dict[str, float] = {}  # when each suspect was last found failing
        self._dead: set[str] = set()  # declared dead by the master: suspects until it says alive
        self._latencies: deque[float] = deque(maxlen=256)
        self.on_suspect: Callable[[], None] | None = None  # the client follows the master's verdicts

    def suspect(self, worker_id: str) -> None:
        """Try ``worker_id`` last for ``suspect_seconds`` (seconds)."""
        if worker_id:
            now = time.monotonic()
            self._until[worker_id] = now + self.suspect_seconds
            self._since[worker_id] = now
            if self.on_suspect is not None:
                self.on_suspect()

    def verdicts(self, alive: dict[str, bool]) -> None:
        """The master's view (worker id -> alive): dead ones stay suspects until it sees them
        again, and a suspect it sees alive again has rejoined."""
        for worker_id, ok in alive.items():
            if not ok:
                self._dead.add(worker_id)
            elif worker_id in self._dead:
                self._dead.discard(worker_id)
                self._until.pop(worker_id, None)

    def watching(self) -> bool:
        """Whether any worker is a suspect or dead (the master's verdicts are worth following)."""
        return bool(self._dead or self.suspects())

    def answered(self, worker_id: str, seconds: float | None = None, *, started: float | None = None) -> None:
        """A request to ``worker_id`` sent at ``started`` (``time.monotonic()``) completed (a block
        read: after ``seconds``): it is no suspect, unless a request found it failing after this
        one was sent (a worker killed while answering: its last answers are read after the
        failure of a later request, and cleared it; the retry then went to it again)."""
        if started is None or self._since.get(worker_id, -math.inf) <= started:
            self._until.pop(worker_id, None)
        if seconds is not None:
            self._latencies.append(seconds)

    def is_suspect(self, worker_id: str) -> bool:
        if worker_id in self._dead:
            return True
        until = self._until.get(worker_id)
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[worker_id]
            return False
        return True

    def suspects(self) -> list[str]:
        """Ids of the workers tried last right now."""
        return sorted(self._dead | {w for w in list(self._until) if self.is_suspect(w)})

    def hedge_delay(self, ceiling: float) -> float:
        """Seconds to wait for a replica before asking another: twice the p95 of recent reads,
        at least 20 ms, at most ``ceiling`` (half the stall timeout before there are 16 samples)."""
        if len(self._latencies) < 16:
            return ceiling / 2
        ordered = sorted(self._latencies)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        return max(0.02, min(ceiling, 2 * p95))


class DataClient:
    """Reads and writes blocks on workers."""

    def __init__(self, cfg: ClientConfig, tls_config: TLSConfig | None = None) -> None:
        """``tls_config``: the client's TLS files, shared with its master client (which reads them
        again when the masters refuse them: the workers get the renewed certificate too); read
        here from ``cfg`` when not given."""
        self.cfg = cfg
        if cfg.tune_malloc:
            memory.tune_malloc()
        self.health = WorkerHealth(cfg.suspect_seconds)
        self._detached: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._idle: dict[tuple[str, int], list[Conn]] = defaultdict(list)
        self._socks: dict[tuple[str, int], list[socket.socket]] = defaultdict(list)  # plain-TCP readers
        self._sc_dead: dict[str, float] = {}  # UNIX socket -> until when it is skipped (TCP instead)
        self._sc_open: OrderedDict[tuple[str, int], _ScBlock] = OrderedDict()
        self._sc_seen: dict[str, float] = {}  # UNIX socket -> until when it is taken to exist
        self.verified = VerifiedChunks(SC_VERIFIED_CHUNKS)
        self._socket_owners: set[socket.socket] = set()  # sockets a cancelled read's thread still uses
        self._receivers = ThreadPoolExecutor(RECEIVER_THREADS, thread_name_prefix="pcache-recv")
        self._pings: dict[tuple[str, int], asyncio.Task] = {}  # the PING under way to each worker
        # block -> (when its read failed, the error, how long that read took)
        self._failed_fetches: OrderedDict[int, tuple[float, PCacheError, float]] = OrderedDict()
        tls = tls_config or load_optional(cfg.tls_dir or find_tls_dir(cfg.master), need_cert=False)
        self.tls = tls.client_context() if tls else None

    # -------------------------------------------------------------- pool --

    async def _acquire(self, addr: pb.WorkerAddr) -> Conn:
        idle = self._idle[(addr.host, addr.port)]
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        return await framing.open_connection(addr.host, addr.port, self.cfg.connect_timeout, self.tls)

    def _release(self, addr: pb.WorkerAddr, conn: Conn) -> None:
        idle = self._idle[(addr.host, addr.port)]
        if len(idle) < POOL_PER_WORKER and not conn[1].is_closing():
            idle.append(conn)
        else:
            framing.close_writer(conn[1])

    async def close(self) -> None:
        """Close every pooled connection and cached descriptor."""
        for task in list(self._detached):
            task.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conns in self._idle.values():
            for _, writer in conns:
                framing.close_writer(writer)
        self._idle.clear()
        for socks in self._socks.values():
            for sock in socks:
                sock.close()
        self._socks.clear()
        for entry in self._sc_open.values():
            entry.close_when_idle()
        self._sc_open.clear()
        self._receivers.shutdown(wait=False)

    def can_short_circuit(self, addr: pb.WorkerAddr) -> bool:
        """Whether this worker's UNIX socket is reachable from here (its path names the worker id,
        so another node's worker never aliases the local one)."""
        if not (self.cfg.short_circuit and addr.uds_path):
            return False
        until = self._sc_dead.get(addr.uds_path)
        if until is not None:
            if until > time.monotonic():
                return False
            del self._sc_dead[addr.uds_path]
        now = time.monotonic()
        if self._sc_seen.get(addr.uds_path, 0.0) > now:
            return True
        if not os.path.exists(addr.uds_path):
            return False
        self._sc_seen[addr.uds_path] = now + SC_SOCKET_RECHECK  # one stat per second, not per read
        return True

    # ------------------------------------------------------------- reads --

    async def read(
        self,
        addr: pb.WorkerAddr,
        block_id: int,
        offset: int,
        length: int,
        token: str,
        crc: int = 0,
        *,
        first_byte: float | None = None,
    ) -> bytes | bytearray:
        """Read ``length`` bytes at ``offset`` of a block from one worker (TCP), with the block's
        ``token`` (from its location); ``crc``: the committed CRC32C of the whole block (0: unknown).
        ``first_byte``: seconds to wait for the answer to start (default ``stall_timeout``; longer
        for a block the worker fetches from an under-store first).

        Raises:
            Unavailable, Timeout: the worker is gone or stalled.
            NotFound, CorruptBlock: the replica is missing or bad. WrongBlock: it holds other bytes.
            PermissionDenied: the worker refuses the token (expired: ask the master again).
        """
        hdr = pb.DataHeader(op=pb.READ_BLOCK, block_id=block_id, offset=offset, length=length, token=token)
        wait = first_byte or self.cfg.stall_timeout
        reply, data = await self._first_answer(addr, self._request(addr, hdr, wait), wait, block_id)
        check_block_crc(addr, block_id, crc, reply.crc32c)
        if len(data) != length:
            raise CorruptBlock(f"block {block_id}: asked {length} bytes, got {len(data)}")
        return data

    async def fetch_blocks(self, addr: pb.WorkerAddr, items: list[pb.FetchItem]) -> list[pb.FetchItem]:
        """Have a worker fetch blocks of bound files from their under-store (``FETCH_BLOCKS``:
        ``pcache load``): ``items`` name at most ``MAX_FETCHES`` (64) blocks, each with its block
        token (ops ``f``, from its location). The answer comes once every block is stored (within
        ``fetch_timeout`` seconds).

        Returns one outcome per item, in order: ``length`` the bytes this request stored (0: the
        block was cached), or ``error``/``message``.

        Raises:
            Unavailable, Timeout: the worker is gone or stalled. InvalidArgument: too many items.
        """
        hdr = pb.DataHeader(op=pb.FETCH_BLOCKS, fetches=items)
        reply, _ = await self._while_alive(
            addr, self._request(addr, hdr, self.cfg.fetch_timeout), f"fetching {len(items)} blocks from under-stores"
        )
        if len(reply.fetches) != len(items):
            raise ProtocolError(f"worker {addr.worker_id} answered {len(reply.fetches)} of {len(items)} fetches")
        return list(reply.fetches)

    async def _request(
        self, addr: pb.WorkerAddr, hdr: pb.DataHeader, first_byte: float
    ) -> tuple[pb.DataHeader, bytes | bytearray]:
        """One request to a worker on a pooled connection: (answer header, payload). The worker's
        health is kept: answered, or suspected when it is gone or stalls.

        Raises:
            Unavailable, Timeout: the worker is gone or stalled. The answer's error, by name.
        """
        started = time.monotonic()
        try:
            conn = await (self._plain_socket(addr) if self.tls is None else self._acquire(addr))
        except (Unavailable, Timeout):
            self.health.suspect(addr.worker_id)
            raise
        ok = False
        try:
            if isinstance(conn, socket.socket):
                reply, data = await self._sock_exchange(addr, conn, hdr, first_byte)
            else:
                reply, data = await self._exchange(conn, hdr, first_byte)
            ok = True
            self.health.answered(addr.worker_id, time.monotonic() - started, started=started)
        except (Unavailable, Timeout):
            self.health.suspect(addr.worker_id)
            raise
        finally:
            self._give_back(addr, conn, ok)
        # an error the worker answered (its under-store timed out, a replica is missing) leaves
        # it in good health: it answered
        framing.raise_if_error(reply)
        return reply, data

    async def _plain_socket(self, addr: pb.WorkerAddr) -> socket.socket:
        """A pooled plain-TCP connection to a worker (one still open), or a new one."""
        idle = self._socks[(addr.host, addr.port)]
        while idle:
            sock = idle.pop()
            if framing.sock_alive(sock):
                return sock
            sock.close()
        return await framing.sock_connect(addr.host, addr.port, self.cfg.connect_timeout)

    async def _sock_exchange(
        self, addr: pb.WorkerAddr, sock: socket.socket, hdr: pb.DataHeader, first_byte: float
    ) -> tuple[pb.DataHeader, bytes]:
        """A read on a plain socket: the request and the wait for the answer's first bytes on the
        event loop, the rest received in a thread (:func:`framing.sock_receive`: one kernel copy
        into the returned ``bytes``, no event-loop wakeup per packet, no thread parked while a
        stopped worker says nothing). Cancelled while the thread receives, the socket goes back
        to the pool (or is closed) when the thread is done with it."""
        stall = self.cfg.stall_timeout
        await framing.sock_request(sock, hdr, stall)
        prefix = bytearray(framing.PREFIX.size)
        await framing.sock_recv_exactly(sock, memoryview(prefix), first_byte)
        receive = asyncio.get_running_loop().run_in_executor(
            self._receivers, framing.sock_receive, sock, bytes(prefix), stall
        )
        try:
            return await asyncio.shield(receive)
        except asyncio.CancelledError:
            self._socket_owners.add(sock)
            receive.add_done_callback(
                lambda f: self._give_back(addr, sock, not f.cancelled() and f.exception() is None, owner=True)
            )
            raise

    async def _exchange(self, conn: Conn, hdr: pb.DataHeader, first_byte: float) -> tuple[pb.DataHeader, bytes]:
        """Send a read request on a (TLS) stream; (reply header, payload)."""
        stall = self.cfg.stall_timeout
        await framing.write_frame(conn[1], hdr, timeout=stall)
        reply, plen = await framing.read_header(conn[0], first_byte)
        return reply, await framing.read_exactly(conn[0], plen, stall) if plen else b""

    def _give_back(self, addr: pb.WorkerAddr, conn: socket.socket | Conn, ok: bool, *, owner: bool = False) -> None:
        """Pool a connection after a clean exchange; close it after any error. A socket a receiver
        thread still owns is given back by that thread's completion (``owner``), not before."""
        if isinstance(conn, socket.socket):
            if owner:
                self._socket_owners.discard(conn)
            elif conn in self._socket_owners:
                return
            idle = self._socks[(addr.host, addr.port)]
            if ok and len(idle) < POOL_PER_WORKER:
                idle.append(conn)
            else:
                conn.close()
        elif ok:
            self._release(addr, conn)
        else:
            framing.close_writer(conn[1])

    async def read_raw(self, addr: pb.WorkerAddr, block_id: int, offset: int, length: int, token: str) -> bytes:
        """Salvage: unchecked bytes of a block's file on one worker (TCP); the caller verifies them.

        Raises:
            Unavailable, Timeout, NotFound, PermissionDenied.
        """
        conn = await self._acquire(addr)
        try:
            hdr = pb.DataHeader(op=pb.READ_RAW, block_id=block_id, offset=offset, length=length, token=token)
            await framing.write_frame(conn[1], hdr, timeout=self.cfg.stall_timeout)
            reply, plen = await framing.read_header(conn[0], self.cfg.stall_timeout)
            data = await framing.read_exactly(conn[0], plen, self.cfg.io_timeout) if plen else b""
            framing.raise_if_error(reply)
            return data
        finally:
            framing.close_writer(conn[1])

    async def sc_open_read(
        self, addr: pb.WorkerAddr, block_id: int, token: str, crc: int = 0, *, first_byte: float | None = None
    ) -> tuple[int, pb.DataHeader]:
        """Short circuit: get a read-only fd of the block file and its CRC record (``crc``: the
        committed CRC32C of the whole block, checked against the record; 0: unknown).
        ``first_byte``: seconds to wait for the answer (default ``stall_timeout``; longer for a
        block the worker fetches from an under-store first, while the worker answers PINGs).

        The caller owns (and must close) the fd.

        Raises:
            WrongBlock: the record is another block's.
        """
        started = time.monotonic()
        sock = await self._sc_connect(addr)
        try:
            timeout = self.cfg.stall_timeout
            wait = first_byte or timeout
            request = pb.DataHeader(op=pb.SC_READ_OPEN, block_id=block_id, token=token)
            await uds.send_frame(sock, request, None, timeout)
            reply, fd = await self._first_answer(addr, uds.recv_frame(sock, wait), wait, block_id)
        except (Unavailable, Timeout):
            self.health.suspect(addr.worker_id)
            raise
        finally:
            sock.close()
        self.health.answered(addr.worker_id, started=started)
        if reply.error:
            if fd is not None:
                os.close(fd)
            framing.raise_if_error(reply)
        if fd is None:
            raise Unavailable("short-circuit reply carried no descriptor")
        try:
            check_block_crc(addr, block_id, crc, reply.crc32c)
        except WrongBlock:
            os.close(fd)
            raise
        return fd, reply

    async def sc_read(
        self,
        addr: pb.WorkerAddr,
        block_id: int,
        offset: int,
        length: int,
        token: str,
        crc: int = 0,
        *,
        first_byte: float | None = None,
    ) -> bytes:
        """Short circuit: read a block range from its file on this host, CRC-checked.

        Descriptors stay open in a client-wide LRU (block ids are never reused
        for other bytes, so a cached descriptor names the right block). Every
        read checks the CRC32C of each chunk it touches, so a replica damaged
        after a first good read is never served.

        ``first_byte``: as for :meth:`sc_open_read`.

        Raises:
            CorruptBlock: a chunk does not match the worker's CRC record.
            Unavailable, Timeout, NotFound: the worker cannot hand out the block.
        """
        key = (addr.uds_path, block_id)
        entry = self._sc_open.get(key)
        if entry is None:
            fd, info = await self.sc_open_read(addr, block_id, token, crc, first_byte=first_byte)
            entry = self._sc_open.setdefault(key, _ScBlock(fd, info))
            if entry.fd != fd:
                os.close(fd)
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.ensure_future(self._sweep_unlinked())
        self._sc_open.move_to_end(key)
        if not entry.acquire():  # closed by a concurrent eviction: open afresh
            self._sc_open.pop(key, None)
            return await self.sc_read(addr, block_id, offset, length, token, crc, first_byte=first_byte)
        # the descriptor is released when the thread is done with it, even if this caller is
        # cancelled first (a hedged read that lost): never close an fd a thread still reads
        work = asyncio.ensure_future(asyncio.to_thread(entry.pread, offset, length, self.verified))
        work.add_done_callback(lambda done: self._sc_done(key, entry, done))
        try:
            return await asyncio.shield(work)
        except CorruptBlock:
            self.sc_forget(addr, block_id)
            raise

    def _sc_done(self, key: tuple[str, int], entry: _ScBlock, done: asyncio.Future) -> None:
        if not done.cancelled():
            done.exception()  # retrieved here when the caller went away
        entry.release()
        if self._sc_open.get(key) is not entry:  # forgotten or evicted while in use
            entry.close_when_idle()
        self._sc_trim()

    def detach(self, task: asyncio.Task) -> None:
        """Let ``task`` (a request whose answer nobody waits for) finish in the background; cancelled at close."""
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)

    def sc_read_open(self, uds_path: str, block_id: int, offset: int, length: int) -> bytes | None:
        """Blocking read through an already open short-circuit descriptor, from any thread.

        The sync bridge's fast path for page-cache-resident blocks: no hop to the
        event loop. Returns None when no descriptor is open for the block (the
        caller then takes the async path, which opens one).

        Raises:
            CorruptBlock: a chunk failed its CRC32C check.
        """
        with self._pinned(uds_path, block_id) as entry:
            return None if entry is None else entry.pread(offset, length, self.verified)

    def sc_read_open_into(self, uds_path: str, block_id: int, offset: int, view: memoryview) -> int | None:
        """:meth:`sc_read_open` into ``view``; the bytes read, or None (no open descriptor).

        Raises:
            CorruptBlock: a chunk failed its CRC32C check (``view`` holds unchecked bytes).
        """
        with self._pinned(uds_path, block_id) as entry:
            return None if entry is None else entry.pread_into(offset, view, self.verified)

    @contextlib.contextmanager
    def _pinned(self, uds_path: str, block_id: int) -> Iterator[_ScBlock | None]:
        """The block's open short-circuit descriptor, pinned while in use; None when none is open."""
        entry = self._sc_open.get((uds_path, block_id))
        if entry is None or not entry.acquire():
            yield None
            return
        try:
            yield entry
        finally:
            entry.release()

    def sc_forget(self, addr: pb.WorkerAddr, block_id: int) -> None:
        """Drop the cached descriptor of a block (after an error)."""
        self.verified.drop(block_id)
        entry = self._sc_open.pop((addr.uds_path, block_id), None)
        if entry is not None:
            entry.close_when_idle()

    async def _sweep_unlinked(self) -> None:
        """While descriptors are cached: every ``SC_SWEEP_SECONDS``, close those whose block file
        the worker deleted (a deleted or replaced file), so its disk space comes back while this
        client lives (an open descriptor keeps an unlinked file's blocks allocated)."""
        while self._sc_open:
            await asyncio.sleep(SC_SWEEP_SECONDS)
            for key, entry in list(self._sc_open.items()):
                if entry.unlinked():
                    self._sc_open.pop(key, None)
                    entry.close_when_idle()

    def _sc_trim(self) -> None:
        while len(self._sc_open) > MAX_SC_FDS:
            key, entry = next(iter(self._sc_open.items()))
            if entry.users:
                return
            del self._sc_open[key]
            entry.close_when_idle()  # a sync reader that pinned it meanwhile keeps it open

    async def _sc_connect(self, addr: pb.WorkerAddr) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.cfg.connect_timeout):
                await loop.sock_connect(sock, addr.uds_path)
        except (OSError, TimeoutError) as exc:
            sock.close()
            self._sc_dead[addr.uds_path] = time.monotonic() + self.cfg.suspect_seconds
            self.health.suspect(addr.worker_id)
            if isinstance(exc, TimeoutError):
                raise Timeout(f"short-circuit connect to {addr.uds_path} timed out") from exc
            raise Unavailable(f"short-circuit socket {addr.uds_path}: {exc}") from exc
        return sock

    # ------------------------------------------------------------ writes --

    async def write(
        self,
        targets: list[pb.WorkerAddr],
        block_id: int,
        data: bytes | bytearray | memoryview,
        crc: int,
        token: str,
        chunk_crcs: list[int] | None = None,
    ) -> list[str]:
        """Write a whole block to ``targets[0]``, which forwards it down the pipeline, with the
        block's write ``token`` (from its allocation). ``chunk_crcs``: the CRC of each chunk, when
        the caller has them (a worker on this host takes them instead of reading the block back).

        Returns:
            ids of the workers that stored it (at least the first).

        Raises:
            Unavailable, Timeout: the first worker is unreachable or stalled.
            NoSpace: the first worker is full.
        """
        head, rest = targets[0], list(targets[1:])
        started = time.monotonic()
        if self.can_short_circuit(head):  # into its file on this host, then down the pipeline
            with contextlib.suppress(Unavailable):
                stream = await self.open_stream(targets, block_id, len(data), token)
                try:
                    await stream.write(data, account=chunk_crcs is None)
                    return await stream.commit(None if chunk_crcs is None else (crc, chunk_crcs))
                finally:
                    stream.close()
        try:
            conn = await self._acquire(head)
        except (Unavailable, Timeout):
            self.health.suspect(head.worker_id)
            raise
        ok = False
        try:
            hdr = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=block_id, crc32c=crc, pipeline=rest, token=token)
            await framing.write_frame_paced(conn[1], hdr, data, stall=self.cfg.stall_timeout)
            reply, plen = await self._await_reply(head, conn, self.cfg.io_timeout * (1 + len(rest)))
            if plen:
                await framing.read_exactly(conn[0], plen, self.cfg.io_timeout)
            ok = not reply.error
            self.health.answered(head.worker_id, started=started)
            framing.raise_if_error(reply)
            if reply.op != pb.RESPONSE or reply.block_id != block_id or head.worker_id not in reply.replicas:
                # not that worker's answer (another service took its port and echoed the request)
                ok = False
                raise Unavailable(
                    f"{head.host}:{head.port} did not answer as worker {head.worker_id} storing block {block_id}"
                )
            return list(reply.replicas)
        except (Unavailable, Timeout):
            self.health.suspect(head.worker_id)
            raise
        finally:
            if ok:
                self._release(head, conn)
            else:
                framing.close_writer(conn[1])

    async def _await_reply(self, head: pb.WorkerAddr, conn: Conn, cap: float) -> tuple[pb.DataHeader, int]:
        """The reply to a write: the head stores (fsyncs) the block and waits for its downstream
        replicas first, which shows no progress (:meth:`_while_alive`).

        Raises:
            Timeout: the head stopped answering, or no reply within ``cap`` seconds.
        """
        return await self._while_alive(head, framing.read_header(conn[0], cap), "storing a block")

    async def _while_alive(self, addr: pb.WorkerAddr, work: Awaitable[T], what: str) -> T:
        """Await ``work``, a request to the worker at ``addr`` that shows no progress until it is
        done (a write's replicas, an under-store fetch); every ``stall_timeout`` seconds without
        it the worker is asked whether it lives (a PING on another connection, shared by the
        requests waiting on that worker): a hung worker (SIGSTOP, a wedged host) is given up on
        after about 1.5 stall timeouts, not after the request's own timeout (75 s for a fetch).

        Raises:
            Timeout: the worker stopped answering (``what`` says while doing what; it becomes a
                suspect). Whatever ``work`` raises.
        """
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.cfg.stall_timeout)
                if done:
                    return task.result()
                if not await self._alive(addr):
                    self.health.suspect(addr.worker_id)
                    raise Timeout(f"worker {addr.worker_id} stopped answering while {what}")
        finally:
            if not task.done():
                task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _first_answer(self, addr: pb.WorkerAddr, work: Awaitable[T], wait: float, block_id: int) -> T:
        """The answer to a read of ``block_id``, due within ``wait`` seconds: longer than a stall
        only for a block the worker fetches from its under-store first, which shows no progress,
        so watched by PINGs (:meth:`_while_alive`)."""
        if wait > self.cfg.stall_timeout:
            return await self._while_alive(addr, work, f"fetching block {block_id} from its under-store")
        return await work

    def remember_failed_fetch(self, block_id: int, error: PCacheError, took: float) -> None:
        """An uncached block's read failed after ``took`` seconds because its under-store did not
        answer in time: reads of it fail at once with ``error`` for as long again, at most
        ``FAILED_FETCH_MEMORY`` seconds (the kernel's read-ahead and the read behind it each waited
        ``worker.ufs_timeout``; a read that failed in a second costs no more to try again)."""
        self._failed_fetches[block_id] = (time.monotonic(), error, took)
        self._failed_fetches.move_to_end(block_id)
        while len(self._failed_fetches) > 1024:
            self._failed_fetches.popitem(last=False)

    def fetch_failed(self, block_id: int) -> PCacheError | None:
        """The error of a recent failed fetch of ``block_id`` (see :meth:`remember_failed_fetch`),
        as a new exception of its class that says so; None when there was none lately."""
        seen = self._failed_fetches.get(block_id)
        if seen is None:
            return None
        when, error, took = seen
        ago, hold = time.monotonic() - when, min(FAILED_FETCH_MEMORY, took)
        if ago > hold:
            del self._failed_fetches[block_id]
            return None
        return type(error)(f"{error.message} ({ago:.1f} s ago; tried again after {hold:.1f} s)")

    async def _alive(self, addr: pb.WorkerAddr) -> bool:
        """Whether the worker answers a PING within half the stall timeout; one ping at a time per
        worker, whose answer the requests that wait on it meanwhile share."""
        key = (addr.host, addr.port)
        running = self._pings.get(key)
        if running is None:
            running = self._pings[key] = asyncio.ensure_future(self.ping(addr, self.cfg.stall_timeout / 2))
            running.add_done_callback(lambda _: self._pings.pop(key, None))
        return await asyncio.shield(running)

    async def ping(self, addr: pb.WorkerAddr, timeout: float) -> bool:
        """Whether the worker answers a PING within ``timeout`` seconds (on a fresh connection)."""
        try:
            reader, writer = await framing.open_connection(addr.host, addr.port, timeout, self.tls)
        except PCacheError:
            return False
        try:
            await framing.write_frame(writer, pb.DataHeader(op=pb.PING), timeout=timeout)
            reply, _ = await framing.read_header(reader, timeout)
            return not reply.error
        except PCacheError:
            return False
        finally:
            framing.close_writer(writer)

    async def open_stream(self, targets: list[pb.WorkerAddr], block_id: int, length: int, token: str) -> BlockStream:
        """Open a block of ``length`` bytes for writing straight into its file on ``targets[0]``,
        a worker on this host (``SC_WRITE_OPEN``); ``targets[1:]`` get it down the pipeline at the
        commit.

        Raises:
            Unavailable, Timeout: the worker's socket does not answer. NoSpace: it has no room.
            PermissionDenied: the token does not allow this write.
        """
        head = targets[0]
        sock = await self._sc_connect(head)
        try:
            opener = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=block_id, length=length, token=token)
            await uds.send_frame(sock, opener, None, self.cfg.stall_timeout)
            try:
                reply, fd = await uds.recv_frame(sock, self.cfg.stall_timeout)
            except Timeout:
                self.health.suspect(head.worker_id)
                raise
            framing.raise_if_error(reply)
            if fd is None:
                raise Unavailable("short-circuit reply carried no descriptor")
        except BaseException:
            sock.close()
            raise
        return BlockStream(self, targets, block_id, length, token, sock, fd, reply.write_handle)


class BlockStream:
    """A block written straight into its temp file on a worker of this host (short circuit):
    ``write`` appends at the end with ``pwrite`` (in a thread: the kernel's one copy from the
    caller's buffer, no GIL), keeping the CRC32Cs as it goes; ``commit`` has the worker take
    them, fsync, publish and replicate. The descriptor is this client's: whatever happens to
    the worker, the bytes written can be read back (:meth:`read_back`) and stored another way.
    """

    def __init__(
        self,
        data: DataClient,
        targets: list[pb.WorkerAddr],
        block_id: int,
        length: int,
        token: str,
        sock: socket.socket,
        fd: int,
        handle: str,
    ) -> None:
        self.data = data
        self.targets = targets
        self.block_id = block_id
        self.length = length  # what the allocation and the token name
        self.token = token
        self.sums = RunningCrc()
        self.lock = asyncio.Lock()  # one append at a time: the CRCs run front to back
        self._tail = bytearray()  # appended, not yet written (under STREAM_PIECE bytes)
        self._sock: socket.socket | None = sock
        self._fd: int | None = fd
        self._handle = handle

    @property
    def written(self) -> int:
        """Bytes in the file so far (the block's front)."""
        return self.sums.length

    @property
    def end(self) -> int:
        """Bytes appended so far (written, and held until a ``STREAM_PIECE`` is full)."""
        return self.sums.length + len(self._tail)

    async def append(self, piece: bytes | bytearray | memoryview) -> None:
        """Append ``piece`` at :attr:`end`, keeping the CRCs: pieces under ``STREAM_PIECE`` bytes
        are gathered first (one ``pwritev`` per MiB, not per 128 KiB FUSE write).

        Raises:
            InvalidArgument: past the block's length. NoSpace: the disk is full.
        """
        view = memoryview(piece).cast("B")
        if self.end + len(view) > self.length:
            raise InvalidArgument(f"block {self.block_id}: more than its {self.length} bytes")
        if len(self._tail) + len(view) < STREAM_PIECE:
            self._tail += view
            return
        bufs = [memoryview(self._tail), view] if self._tail else [view]
        await asyncio.to_thread(self._write, bufs, True)
        self._tail = bytearray()

    async def flush(self) -> None:
        """Write what :meth:`append` gathered."""
        if self._tail:
            await asyncio.to_thread(self._write, [memoryview(self._tail)], True)
            self._tail = bytearray()

    async def write(self, data: bytes | bytearray | memoryview, *, account: bool = True) -> None:
        """Append ``data`` (after what was gathered) in one ``pwrite``; ``account``: keep its CRCs
        (off when the caller has them and hands them to :meth:`commit`).

        Raises:
            InvalidArgument: past the block's length. NoSpace: the disk is full.
        """
        await self.flush()
        view = memoryview(data).cast("B")
        if self.written + len(view) > self.length:
            raise InvalidArgument(f"block {self.block_id}: more than its {self.length} bytes")
        await asyncio.to_thread(self._write, [view], account)

    def _write(self, bufs: list[memoryview], account: bool) -> None:
        if self._fd is None:
            raise Unavailable(f"block {self.block_id}: the stream is closed")
        try:
            _pwritev_all(self._fd, bufs, self.written)
        except OSError as exc:
            raise NoSpace(f"block {self.block_id}: short-circuit write failed: {exc}") from exc
        for view in bufs:
            if account:
                self.sums.update(view)
            else:
                self.sums.length += len(view)

    async def read_back(self) -> bytes:
        """The bytes appended so far: from this client's descriptor (the page cache), then the
        gathered ones."""
        if self._fd is None:
            raise Unavailable(f"block {self.block_id}: the stream is closed")
        fd, n = self._fd, self.written
        data = await asyncio.to_thread(os.pread, fd, n, 0)
        if len(data) != n:
            raise CorruptBlock(f"block {self.block_id}: {len(data)} of the {n} bytes written could be read back")
        return data + self._tail if self._tail else data

    async def commit(self, sums: tuple[int, list[int]] | None = None) -> list[str]:
        """Store the block (``SC_WRITE_COMMIT``): the worker takes the CRCs (the running ones,
        or ``sums`` = (crc, chunk crcs) given), fsyncs, publishes it and pushes it down the
        pipeline; returns the ids of the workers that stored it.

        Raises:
            InvalidArgument: fewer bytes written than the block's length.
            Unavailable, Timeout: the worker is gone or stalled. CorruptBlock, NoSpace.
        """
        if self.written != self.length or self._tail or self._sock is None:
            raise InvalidArgument(f"block {self.block_id}: {self.written} of {self.length} bytes written")
        crc, chunks = sums or (self.sums.crc, self.sums.chunk_crcs())
        cfg = self.data.cfg
        rest = list(self.targets[1:])
        commit = pb.DataHeader(
            op=pb.SC_WRITE_COMMIT,
            block_id=self.block_id,
            write_handle=self._handle,
            crc32c=crc,
            chunk_crcs=chunks,
            pipeline=rest,
            token=self.token,
        )
        try:
            await uds.send_frame(self._sock, commit, None, cfg.io_timeout)
            done, _ = await uds.recv_frame(self._sock, cfg.io_timeout * (1 + len(rest)) + self.length / (50 << 20))
        except OSError as exc:
            if isinstance(exc, PCacheError):
                raise
            raise Unavailable(f"short-circuit commit failed: {exc}") from exc
        framing.raise_if_error(done)
        return list(done.replicas)

    def close(self) -> None:
        """Release the descriptor and the socket (a block not committed is dropped by the worker)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _pwritev_all(fd: int, bufs: list[memoryview], at: int) -> None:
    """Write ``bufs`` in order at offset ``at`` (``pwritev``, again after a short write)."""
    while bufs:
        n = os.pwritev(fd, bufs, at)
        if not n:
            raise OSError(errno.ENOSPC, "no byte written")
        at += n
        while bufs and n >= len(bufs[0]):
            n -= len(bufs[0])
            bufs = bufs[1:]
        if bufs and n:
            bufs = [bufs[0][n:], *bufs[1:]]
