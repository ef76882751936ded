"""The worker's data plane: framed block I/O over TCP, pipeline replication.

A WRITE_BLOCK carries the downstream replicas in ``pipeline``; the worker
forwards each chunk to the next replica as soon as it has it (client → w1 →
w2, as in HDFS write pipelines), stores and fsyncs its own copy, then answers
with the ids of every replica that acknowledged. A downstream failure does
not fail the write: the answer lists fewer replicas and the master
re-replicates later. Reads verify chunk CRC32Cs (or hit the memory tier); a
CRC failure is reported to the master and surfaces as ``CorruptBlock`` so the
client reads another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from pcache.common import framing
from pcache.common.auth import BlockGrant, BlockTokenChecker
from pcache.common.checksum import CHUNK_SIZE
from pcache.common.errors import (
    AlreadyExists,
    CorruptBlock,
    InvalidArgument,
    NoSpace,
    NotFound,
    PCacheError,
    PermissionDenied,
    ProtocolError,
    Timeout,
    Unavailable,
)
from pcache.common.metrics import CRC_FAILURES, DATA_BYTES, DATA_OPS, DATA_SECONDS
from pcache.proto import pcache_pb2 as pb
from pcache.worker.blockstore import BlockInfo, BlockWriter, DiskBlockStore
from pcache.worker.memtier import MemoryTier

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = 300.0  # seconds a pooled client connection may sit unused
# Before a connection has made one request its block token allowed, it gets FIRST_FRAME_TIMEOUT
# seconds for it, a started header FRAME_TIMEOUT seconds to arrive whole, REQUEST_HEADER_BYTES at
# most; and a worker serves MAX_CONNECTIONS at once: a peer with no credential holds neither
# memory nor descriptors for long.
FIRST_FRAME_TIMEOUT = 10.0
FRAME_TIMEOUT = 10.0
REQUEST_HEADER_BYTES = 64 << 10
MAX_CONNECTIONS = 4096
LISTEN_BACKLOG = 4096  # connections the kernel queues before the worker accepts them (capped by somaxconn)
# under-store fetches a worker runs at once, whoever asks (readers, warm-ups): each holds its whole
# block in memory until it is stored, so this bounds that memory (32 x an 8 MiB block = 256 MiB)
# against many connections, or FETCH_BLOCKS requests of 64 blocks each
FETCHES_AT_ONCE = 32
# worker-to-worker connections (pipelines, re-replication) kept for the next block to the same
# peer, as HDFS's client keeps a PeerCache of DataNode sockets: a new one cost a connect and a PING
# round trip per block (0.7 ms of a 4 KiB block's 3-4 ms on loopback; a TLS handshake with TLS)
PEER_IDLE = 30.0  # seconds one waits unused (well inside the peer's IDLE_TIMEOUT, when it drops it)
PEER_POOL = 8  # idle connections kept per peer
PEER_SWEEP = 5.0  # seconds between closings of idle connections past PEER_IDLE or closed by their peer
ROOM_TRIES = 8  # evictions a writer out of room asks for before NoSpace
ROOM_POLL = 0.05  # seconds between looks at the writes a writer out of room waits for


STALLED_PEER_SECONDS = 10.0  # how long pipelines skip a downstream replica that stalled
REPLICATION_TOKEN_TTL = 600.0  # seconds a worker's own transfer token is valid
# the block token operation each request needs (PING needs none)
OP_NEEDS = {
    pb.WRITE_BLOCK: "w",
    pb.READ_BLOCK: "r",
    pb.READ_RAW: "r",
    pb.DELETE_BLOCK: "d",
    pb.SC_READ_OPEN: "r",
    pb.SC_WRITE_OPEN: "w",
    pb.SC_WRITE_COMMIT: "w",
}


@dataclass
class _Downstream:
    """The connection to the next replica of a pipeline write."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    addr: pb.WorkerAddr

    @property
    def worker_id(self) -> str:
        return self.addr.worker_id


class DataServer:
    """Serves data-plane frames for one worker."""

    def __init__(
        self,
        worker_id: str,
        store: DiskBlockStore,
        tier: MemoryTier,
        *,
        io_timeout: float,
        on_corrupt: Callable[[int], Awaitable[None]],
        bandwidth_limit: float = 0.0,
        peer_timeout: float = 2.0,
        on_lost: Callable[[int], Awaitable[None]] | None = None,
        tls: ssl.SSLContext | None = None,
        fetch: Callable[[int], Awaitable[bytes]] | None = None,
        on_fetched: Callable[[int, int, int], Awaitable[None]] | None = None,
        release_space: Callable[[int, int], Awaitable[list[int]]] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.tokens = BlockTokenChecker(worker_id)  # deny by default until the master's keys arrive
        self.store = store
        self.tier = tier
        self.io_timeout = io_timeout
        self.peer_timeout = peer_timeout  # a stalled downstream replica is dropped after this
        # downstream "id@host:port" -> until when pipelines skip it (by address too: a pipeline's
        # addresses are its writer's, and a wrong one must not make others skip the real worker)
        self._stalled: dict[str, float] = {}
        self.on_corrupt = on_corrupt
        self.on_lost = on_lost
        self.inflight = 0
        self.connections = 0  # open data connections (at most MAX_CONNECTIONS)
        self.accepted = 0  # data connections accepted (tests)
        # peer "id@host:port" -> idle connections to it, newest last: (reader, writer, idle since)
        self._idle_peers: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]]] = {}
        self._sweeping: asyncio.TimerHandle | None = None  # the next _sweep_peers, while any is idle
        self._throttle_until = 0.0
        self.bandwidth_limit = bandwidth_limit  # bytes/s, 0 = unlimited
        self.tls = tls  # client side of this worker's own connections (pipelines, re-replication)
        # a bound file's block missing here: fetch(block_id) -> its bytes from the under-store,
        # then on_fetched(block_id, length, crc32c) tells the master; one fetch per block at a time
        self.fetch = fetch
        self.on_fetched = on_fetched
        self._fetching: dict[int, asyncio.Future] = {}
        self._fetch_slots = asyncio.Semaphore(FETCHES_AT_ONCE)
        self.fetches_running = self.fetches_peak = 0  # fetches holding a slot now, and at most (tests)
        self.fetches = 0  # blocks fetched from an under-store (tests, metrics)
        # out of room: release_space(block_id, bytes) -> clean blocks the master evicted from here
        self.release_space = release_space
        self._making_room = asyncio.Lock()  # one eviction at a time (see begin_write)

    async def throttle(self, nbytes: int) -> None:
        """Token-bucket-free pacing: emulate a NIC of ``bandwidth_limit`` bytes/s."""
        if self.bandwidth_limit <= 0:
            return
        now = time.monotonic()
        start = max(now, self._throttle_until)
        self._throttle_until = start + nbytes / self.bandwidth_limit
        if self._throttle_until > now:
            await asyncio.sleep(self._throttle_until - now)

    # ----------------------------------------------------------- serving --

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until the peer closes it."""
        if self.connections >= MAX_CONNECTIONS:
            logger.warning("%d data connections open: refusing one more", self.connections)
            framing.close_writer(writer)
            return
        self.connections += 1
        self.accepted += 1
        proven = False  # a request its block token allowed has been served
        opened = time.monotonic()
        try:
            while True:
                # until its first authorized request, a connection's deadline runs from its opening
                # (PINGs, which need no token, do not keep it open)
                first_left = max(0.0, opened + FIRST_FRAME_TIMEOUT - time.monotonic())
                try:
                    header, payload_len = await framing.read_header(
                        reader,
                        IDLE_TIMEOUT if proven else first_left,
                        max_header=REQUEST_HEADER_BYTES,
                        header_timeout=FRAME_TIMEOUT,
                    )
                except PCacheError:
                    return  # peer closed or idled out
                self.inflight += 1
                started = time.perf_counter()
                op = pb.DataOp.Name(header.op)
                try:
                    reply, payload = await self.dispatch(header, payload_len, reader)
                except ProtocolError:
                    raise
                except PCacheError as exc:
                    reply, payload = framing.error_header(exc), b""
                    if header.op == pb.WRITE_BLOCK:
                        # the rest of the payload is still on the wire: drop the connection
                        await framing.write_frame(writer, reply, timeout=self.io_timeout)
                        return
                finally:
                    self.inflight -= 1
                DATA_OPS.labels(op).inc()
                DATA_SECONDS.labels(op).observe(time.perf_counter() - started)
                proven = (
                    proven
                    or (header.op in OP_NEEDS and reply.error != "PermissionDenied")
                    or any(item.error != "PermissionDenied" for item in reply.fetches)
                )
                await framing.write_frame(writer, reply, payload, timeout=self.io_timeout)
        except PCacheError as exc:
            logger.debug("data connection dropped: %s", exc)
        except Exception:
            logger.exception("data connection failed")
        finally:
            self.connections -= 1
            framing.close_writer(writer)

    async def dispatch(
        self, header: pb.DataHeader, payload_len: int, reader: asyncio.StreamReader
    ) -> tuple[pb.DataHeader, bytes | list[memoryview]]:
        """Run one request; returns the reply header and payload (bytes, or buffers in order).

        Raises:
            PermissionDenied: the block token does not allow the operation on this block here.
        """
        need = OP_NEEDS.get(header.op)
        grant = self.tokens.check(header.token, header.block_id, need) if need else None
        if header.op == pb.WRITE_BLOCK:
            assert grant is not None
            grant.check_write_length(payload_len)
            check_pipeline(grant, header.pipeline)
            replicas = await self.receive_block(header, payload_len, reader)
            replicas = [r for r in replicas if r in grant.workers]  # what a downstream claims, within the token
            return pb.DataHeader(op=pb.RESPONSE, block_id=header.block_id, replicas=replicas), b""
        if payload_len:
            raise ProtocolError(f"{pb.DataOp.Name(header.op)} takes no payload")
        if header.op == pb.READ_BLOCK:
            assert grant is not None
            await self.ensure(header.block_id, grant)
            parts, info = await self.read_parts(header.block_id, header.offset, header.length)
            DATA_BYTES.labels("read").inc(header.length)
            await self.throttle(header.length)
            return (
                pb.DataHeader(
                    op=pb.RESPONSE,
                    block_id=header.block_id,
                    length=header.length,
                    block_length=info.length,
                    crc32c=info.crc32c,
                ),
                parts,
            )
        if header.op == pb.FETCH_BLOCKS:
            return pb.DataHeader(op=pb.RESPONSE, fetches=await self.fetch_many(header.fetches)), b""
        if header.op == pb.READ_RAW:
            data = await asyncio.to_thread(self.store.read_raw, header.block_id, header.offset, header.length)
            return pb.DataHeader(op=pb.RESPONSE, block_id=header.block_id, length=len(data)), data
        if header.op == pb.DELETE_BLOCK:
            await self.delete(header.block_id)
            return pb.DataHeader(op=pb.RESPONSE, block_id=header.block_id), b""
        if header.op == pb.PING:
            return pb.DataHeader(op=pb.RESPONSE, replicas=[self.worker_id]), b""
        raise ProtocolError(f"unsupported data op {header.op}")

    # ------------------------------------------------------------ writes --

    async def begin_write(self, block_id: int, length: int) -> BlockWriter:
        """Reserve room for a block of ``length`` bytes and start writing it; when the disk (or the
        worker's capacity) is full, the master first evicts clean blocks of bound files held here
        (``release_space``), which this worker deletes, and the reservation is tried again, up to
        :data:`ROOM_TRIES` times. When nothing here is clean but other blocks are being written
        here (a warm-up's concurrent fetches hold room for their blocks until stored, and a
        stored fetched block is clean), it waits for one of them to end first. All of it, the
        wait for other writers making room included, within ``io_timeout`` seconds: a save
        into a worker full of blocks not yet persisted fails in seconds, not minutes.

        Writers out of room make it one at a time: 32 concurrent fetches of a warm-up each had
        room made, and another's reservation took it before their own second try
        (``NoSpace`` for a dataset larger than the cache).

        Raises:
            NoSpace: still no room (nothing here is clean). AlreadyExists: the block is here.
        """
        try:
            return await asyncio.to_thread(self.store.begin_write, block_id, length)
        except NoSpace:
            if self.release_space is None:
                raise
        deadline = time.monotonic() + self.io_timeout
        try:
            async with asyncio.timeout(self.io_timeout):
                await self._making_room.acquire()
        except TimeoutError as exc:
            raise NoSpace(
                f"block {block_id}: no room here (other writers were making room for {self.io_timeout:g} s)"
            ) from exc
        try:
            for _ in range(ROOM_TRIES):
                try:  # room another writer made meanwhile, or this one's last eviction
                    return await asyncio.to_thread(self.store.begin_write, block_id, length)
                except NoSpace:
                    pass
                if time.monotonic() >= deadline:
                    break
                try:
                    evict = await self.release_space(block_id, length)
                except PCacheError as exc:
                    logger.warning("block %d: no room, and the master could not evict: %s", block_id, exc)
                    raise NoSpace(f"block {block_id}: no room here ({exc})") from exc
                for victim in evict:
                    await self.delete(victim)
                if evict:
                    logger.info("block %d: evicted %d clean blocks to make room", block_id, len(evict))
                elif not await self._a_write_ends(deadline):
                    break
            return await asyncio.to_thread(self.store.begin_write, block_id, length)
        finally:
            self._making_room.release()

    async def _a_write_ends(self, deadline: float) -> bool:
        """Wait until a block being written here is stored or given up (its room taken or back),
        until ``deadline`` (``time.monotonic()``); False at once when none is being written."""
        held = self.store.reserved_bytes
        while held and time.monotonic() < deadline:
            await asyncio.sleep(ROOM_POLL)
            if self.store.reserved_bytes < held:
                await asyncio.sleep(ROOM_POLL)  # its report reaches the master: then it is evictable
                return True
        return False

    async def receive_block(self, header: pb.DataHeader, payload_len: int, reader: asyncio.StreamReader) -> list[str]:
        """Store a block arriving on ``reader`` and forward it down the pipeline.

        A downstream replica that stalls for ``peer_timeout`` seconds is dropped (the block is
        acknowledged without it) and skipped by later pipelines for ``STALLED_PEER_SECONDS``.
        """
        block_id = header.block_id
        writer = await self.begin_write(block_id, payload_len)
        downstream = await self._open_downstream(header, payload_len)
        staged: list[bytes] = []
        try:
            remaining = payload_len
            while remaining:
                chunk = await framing.read_exactly(reader, min(CHUNK_SIZE, remaining), self.io_timeout)
                remaining -= len(chunk)
                if downstream is not None:
                    downstream = await self._forward(downstream, chunk)
                await self.throttle(len(chunk))
                await asyncio.to_thread(writer.write, chunk)
                staged.append(chunk)
            await asyncio.to_thread(writer.commit, header.crc32c)
        except BaseException:
            writer.abort()
            if downstream is not None:
                framing.close_writer(downstream.writer)
            raise
        DATA_BYTES.labels("write").inc(payload_len)
        for index, chunk in enumerate(staged):
            self.tier.put(block_id, index, chunk)
        replicas = [self.worker_id]
        if downstream is not None:
            replicas += await self._downstream_ack(downstream, len(header.pipeline))
        return replicas

    async def _connect_worker(
        self, addr: pb.WorkerAddr, timeout: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the worker ``addr`` names, checked with a PING before any block byte or
        token goes out: a pipeline's addresses come from a client, and may point at any service.

        Raises:
            Unavailable, Timeout: unreachable, or not that worker.
        """
        reader, writer = await framing.open_connection(addr.host, addr.port, timeout, self.tls)
        try:
            await framing.write_frame(writer, pb.DataHeader(op=pb.PING), timeout=timeout)
            reply, plen = await framing.read_header(reader, timeout, max_header=1024)
            if plen or list(reply.replicas) != [addr.worker_id]:
                raise Unavailable(f"{addr.host}:{addr.port} is not worker {addr.worker_id}")
        except BaseException:
            framing.close_writer(writer)
            raise
        return reader, writer

    async def _peer(self, addr: pb.WorkerAddr, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the worker ``addr`` names: an idle one a block to it left (see
        :data:`PEER_POOL`) that the peer has not closed, else a new one.

        Raises:
            Unavailable, Timeout: unreachable, or not that worker.
        """
        idle = self._idle_peers.get(_peer_key(addr))
        while idle:
            reader, writer, since = idle.pop()
            if time.monotonic() - since < PEER_IDLE and _usable(reader, writer):
                return reader, writer
            framing.close_writer(writer)
        return await self._connect_worker(addr, timeout)

    def _keep_peer(self, addr: pb.WorkerAddr, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep a connection whose request was answered whole for the next block to ``addr``."""
        idle = self._idle_peers.setdefault(_peer_key(addr), [])
        if len(idle) < PEER_POOL and _usable(reader, writer):
            idle.append((reader, writer, time.monotonic()))
            if self._sweeping is None:
                self._sweeping = asyncio.get_running_loop().call_later(PEER_SWEEP, self._sweep_peers)
        else:
            framing.close_writer(writer)

    def _sweep_peers(self) -> None:
        """Close the idle connections of every peer that sat unused for :data:`PEER_IDLE` or that
        their peer closed, every :data:`PEER_SWEEP` seconds while any is kept: a peer restarted
        on another port is never asked again under its old address, and its connections were
        left half closed."""
        self._sweeping = None
        now = time.monotonic()
        for key, idle in list(self._idle_peers.items()):
            for entry in [e for e in idle if now - e[2] >= PEER_IDLE or not _usable(e[0], e[1])]:
                idle.remove(entry)
                framing.close_writer(entry[1])
            if not idle:
                del self._idle_peers[key]
        if self._idle_peers:
            self._sweeping = asyncio.get_running_loop().call_later(PEER_SWEEP, self._sweep_peers)

    def idle_peers(self) -> int:
        """Idle worker-to-worker connections kept now (tests)."""
        return sum(len(idle) for idle in self._idle_peers.values())

    def close_peers(self) -> None:
        """Close the idle worker-to-worker connections (the worker stops)."""
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        for idle in self._idle_peers.values():
            for _reader, writer, _since in idle:
                framing.close_writer(writer)
        self._idle_peers.clear()

    def _peer_stalled(self, addr: pb.WorkerAddr) -> None:
        self._stalled[_peer_key(addr)] = time.monotonic() + STALLED_PEER_SECONDS

    def _is_stalled(self, addr: pb.WorkerAddr) -> bool:
        return self._stalled.get(_peer_key(addr), 0.0) > time.monotonic()

    async def _open_downstream(self, header: pb.DataHeader, payload_len: int) -> _Downstream | None:
        if not header.pipeline:
            return None
        nxt = header.pipeline[0]
        if self._is_stalled(nxt):
            logger.warning(
                "block %d: downstream %s stalled lately; going on without it", header.block_id, nxt.worker_id
            )
            return None
        try:
            reader, writer = await self._peer(nxt, self.peer_timeout)
            fwd = pb.DataHeader(
                op=pb.WRITE_BLOCK,
                block_id=header.block_id,
                crc32c=header.crc32c,
                pipeline=list(header.pipeline[1:]),
                token=header.token,
                epoch=header.epoch,
            )
            await framing.write_frame(writer, fwd, payload_len=payload_len, timeout=self.peer_timeout)
            return _Downstream(reader, writer, nxt)
        except PCacheError as exc:
            self._peer_stalled(nxt)
            logger.warning(
                "block %d: downstream %s unreachable; going on without it: %s", header.block_id, nxt.worker_id, exc
            )
            return None

    async def _forward(self, down: _Downstream, chunk: bytes) -> _Downstream | None:
        try:
            framing.send(down.writer, chunk)
            await framing.drain(down.writer, self.peer_timeout)
            return down
        except PCacheError as exc:
            self._peer_stalled(down.addr)
            logger.warning("downstream replica %s failed mid-block: %s", down.worker_id, exc)
            framing.close_writer(down.writer)
            return None

    async def _downstream_ack(self, down: _Downstream, hops: int) -> list[str]:
        whole = False
        try:  # each hop stores (fsyncs) the block's tail and waits for its own downstream
            reply, plen = await framing.read_header(down.reader, self.peer_timeout * hops)
            framing.raise_if_error(reply)
            whole = plen == 0
            return list(reply.replicas)
        except PCacheError as exc:
            self._peer_stalled(down.addr)
            logger.warning("downstream replica %s did not acknowledge: %s", down.worker_id, exc)
            return []
        finally:
            if whole:
                self._keep_peer(down.addr, down.reader, down.writer)
            else:
                framing.close_writer(down.writer)

    # ------------------------------------------------------------- reads --

    async def ensure(self, block_id: int, grant: BlockGrant) -> None:
        """Make sure a block the token lets this worker fetch (``f``: a bound file's) is here:
        when it is not, fetch its bytes from the under-store and store them as an ordinary block
        (CRC32C per chunk, written whole or not at all), shared by every reader waiting for it.

        Raises:
            NotFound, PermissionDenied, Unavailable, Timeout, StaleHandle: the fetch's error.
            NoSpace: no room for it here.
        """
        if "f" not in grant.ops or self.fetch is None:
            return
        if await asyncio.to_thread(self.store.has, block_id):
            return
        running = self._fetching.get(block_id)
        if running is None:
            running = self._start_fetch(block_id, report=True)
        await asyncio.shield(running)

    async def fetch_many(self, items: Sequence[pb.FetchItem]) -> list[pb.FetchItem]:
        """Fetch the blocks ``items`` name (each with its block token, which must allow ``f``
        here) that are not stored here, all at once, and tell the master of each as it is stored
        (a warm-up's request: ``pcache load``). A block being fetched for a reader is
        waited for, not fetched twice.

        Returns one outcome per item, in order: ``length`` the bytes this request stored (0: the
        block was here, or a reader or another request fetched it meanwhile; a block named twice
        counts once), or ``error``/``message`` (PermissionDenied for a token that does not allow
        the fetch; NotFound, StaleHandle, Unavailable, Timeout, NoSpace: the fetch's).

        Raises:
            InvalidArgument: more than :data:`~pcache.common.framing.MAX_FETCHES` items.
        """
        if len(items) > framing.MAX_FETCHES:
            raise InvalidArgument(f"at most {framing.MAX_FETCHES} blocks per fetch request, not {len(items)}")
        out = [pb.FetchItem(block_id=item.block_id) for item in items]
        allowed: list[int] = []
        for index, item in enumerate(items):
            try:
                self.tokens.check(item.token, item.block_id, "f")
                allowed.append(index)
            except PermissionDenied as exc:
                out[index].error, out[index].message = type(exc).__name__, str(exc)
        if self.fetch is None:
            return out
        here = await asyncio.to_thread(lambda: [self.store.has(items[i].block_id) for i in allowed])
        waits: dict[int, asyncio.Future] = {}
        mine: set[int] = set()  # fetches this request started: it reports them (others report themselves)
        for index, present in zip(allowed, here, strict=True):
            block_id = items[index].block_id
            if present or block_id in waits:
                continue
            running = self._fetching.get(block_id)
            if running is None:  # not here a moment ago, and nobody fetches it: no second look
                # reported as each is stored (the reports of concurrent fetches travel together):
                # the master then counts it cached, and evicts it to make room for the request's
                # later blocks on a worker smaller than the request (reported all at the end,
                # none was evictable, and the rest failed with NoSpace)
                running = self._start_fetch(block_id, report=True, checked=True)
                mine.add(block_id)
            waits[block_id] = running
        already = [items[i].block_id for i, is_here in zip(allowed, here, strict=True) if is_here]
        done = await asyncio.gather(
            *(asyncio.shield(w) for w in waits.values()), self._report_present(already), return_exceptions=True
        )
        outcome = dict(zip(waits, done[: len(waits)], strict=True))
        claimed: set[int] = set()
        for index in allowed:
            block_id = items[index].block_id
            result = outcome.get(block_id)
            if isinstance(result, tuple):
                if block_id in mine and block_id not in claimed:  # stored by this request: said once
                    out[index].length = result[0]
                    claimed.add(block_id)
            elif isinstance(result, PCacheError):
                out[index].error, out[index].message = type(result).__name__, str(result)
            elif isinstance(result, BaseException):
                raise result
        return out

    def _start_fetch(self, block_id: int, *, report: bool, checked: bool = False) -> asyncio.Future:
        """Fetch ``block_id`` in a task every reader of it shares (:attr:`_fetching`)."""
        task = self._fetching[block_id] = asyncio.ensure_future(self._fetch(block_id, report=report, checked=checked))
        task.add_done_callback(lambda _: self._fetching.pop(block_id, None))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # seen, even if unread
        return task

    async def _fetch(self, block_id: int, *, report: bool = True, checked: bool = False) -> tuple[int, int] | None:
        """Fetch a block from its under-store and store it; (length, CRC32C) when this call stored
        it (None: it was here), told to the master first when ``report``. ``checked``: the
        caller saw the block missing with no fetch running, in the same event-loop turn (the
        concurrent fetches of one request then ask the master where their blocks are together)."""
        assert self.fetch is not None
        if not checked and await asyncio.to_thread(self.store.has, block_id):
            return None  # a fetch that ended between a reader's check and its look for a running one
        async with self._fetch_slots:
            self.fetches_running += 1
            self.fetches_peak = max(self.fetches_peak, self.fetches_running)
            try:
                data = await self.fetch(block_id)
                try:
                    writer = await self.begin_write(block_id, len(data))
                except AlreadyExists:
                    return None  # stored meanwhile (a replica copied here): that copy serves
                try:
                    info = await asyncio.to_thread(_write_whole, writer, data)  # a copy of the store's: no fsync
                except BaseException:
                    writer.abort()
                    raise
            finally:
                self.fetches_running -= 1
        crc = info.crc32c
        self.fetches += 1
        DATA_BYTES.labels("fetch").inc(len(data))
        for index, offset in enumerate(range(0, len(data), CHUNK_SIZE)):
            self.tier.put(block_id, index, data[offset : offset + CHUNK_SIZE])
        if report and self.on_fetched is not None:
            try:
                await self.on_fetched(block_id, len(data), crc)
            except PCacheError as exc:  # served anyway; the master learns of it from the next block report
                logger.warning("cannot report fetched block %d: %s", block_id, exc)
        return len(data), crc

    async def _report_present(self, block_ids: list[int]) -> None:
        """Tell the master of blocks a warm-up asked for that are stored here already: a block
        ``pcache free`` just evicted is still here until its DELETE arrives, and the master,
        told, keeps it (the DELETE is dropped) instead of counting it cached while it goes."""
        if self.on_fetched is None:
            return
        on_fetched = self.on_fetched

        async def one(block_id: int) -> None:
            try:
                info = await asyncio.to_thread(self.store.info, block_id)
                await on_fetched(block_id, info.length, info.crc32c)
            except PCacheError as exc:  # deleted meanwhile, or the master unreachable: as before
                logger.debug("block %d: not reported as here: %s", block_id, exc)

        await asyncio.gather(*(one(b) for b in block_ids))  # at once: their reports travel together

    async def read_range(self, block_id: int, offset: int, length: int):
        """Verified bytes ``offset .. offset+length`` of a block, via the memory tier: (bytes, info).

        Raises:
            NotFound, InvalidArgument, CorruptBlock (after reporting it).
        """
        parts, info = await self.read_parts(block_id, offset, length)
        return b"".join(parts), info

    async def read_parts(self, block_id: int, offset: int, length: int):
        """As :meth:`read_range`, but the bytes as views of the memory tier's verified 1 MiB chunks,
        in order: a read is sent without joining or slicing a copy of it. Returns (parts, info)."""
        info = await asyncio.to_thread(self.store.info, block_id)
        if offset + length > info.length:
            raise InvalidArgument(f"range {offset}+{length} outside block {block_id} of {info.length} bytes")
        if length == 0:
            return [], info
        first, last = offset // CHUNK_SIZE, (offset + length - 1) // CHUNK_SIZE
        chunks: list[bytes | None] = [self.tier.get(block_id, i) for i in range(first, last + 1)]
        missing = [i for i, c in zip(range(first, last + 1), chunks, strict=False) if c is None]
        if missing:
            lo, hi = missing[0], missing[-1]
            try:
                loaded = await asyncio.to_thread(self.store.read_chunks, block_id, lo, hi)
            except NotFound:
                await self.lost(block_id)
                raise
            except CorruptBlock:
                CRC_FAILURES.inc()
                self.tier.drop(block_id)
                logger.error("block %d failed its CRC check on read; reporting", block_id)
                with contextlib.suppress(Exception):
                    await self.on_corrupt(block_id)
                raise
            for i, data in zip(range(lo, hi + 1), loaded, strict=False):
                self.tier.put(block_id, i, data)
                chunks[i - first] = data
        parts = [memoryview(c) for c in chunks if c is not None]
        skip = offset - first * CHUNK_SIZE
        parts[0] = parts[0][skip:]
        over = sum(len(p) for p in parts) - length
        if over:
            parts[-1] = parts[-1][: len(parts[-1]) - over]
        return parts, info

    async def lost(self, block_id: int) -> None:
        """A block's file vanished under a read: tell the master (best effort)."""
        self.tier.drop(block_id)
        if self.on_lost is not None:
            try:
                await self.on_lost(block_id)
            except PCacheError as exc:
                logger.warning("cannot report lost block %d: %s", block_id, exc)

    async def delete(self, block_id: int, *, refuse_writes_s: float = 0.0) -> bool:
        """Drop a block from the tier and the disk; with ``refuse_writes_s`` (a block that left the
        namespace) its id takes no write for that long, one racing the delete included
        (:meth:`DiskBlockStore.bury`)."""
        self.store.bury(block_id, refuse_writes_s)
        self.tier.drop(block_id)
        return await asyncio.to_thread(self.store.delete, block_id)

    # --------------------------------------------------------- replicate --

    async def replicate(self, block_id: int, targets: list[pb.WorkerAddr]) -> list[str]:
        """Copy a local block to ``targets`` (one pipeline); returns the ids that stored it.

        Raises:
            NotFound: the block is not here. CorruptBlock: the local copy is bad.
            Unavailable, Timeout: the first target is unreachable.
        """
        info = await asyncio.to_thread(self.store.info, block_id)

        async def piece(offset: int, length: int) -> bytes:
            data, _ = await self.read_range(block_id, offset, length)
            return data

        token = self.tokens.mint(
            block_id, "w", [t.worker_id for t in targets], REPLICATION_TOKEN_TTL, length=info.length
        )
        return await self.send_block(block_id, info.crc32c, info.length, piece, targets, token=token)

    async def send_block(
        self,
        block_id: int,
        crc: int,
        length: int,
        piece: Callable[[int, int], Awaitable[bytes]],
        targets: list[pb.WorkerAddr],
        *,
        token: str,
        pipeline: bool = False,
    ) -> list[str]:
        """Stream ``length`` bytes from ``piece(offset, n)`` as a WRITE_BLOCK down ``targets``,
        with ``token`` (a block token allowing the write at every target).

        ``pipeline``: part of a client's write, so the first target gets ``peer_timeout`` seconds
        to make progress (and is skipped when it stalled lately), not ``io_timeout``.

        Raises:
            Unavailable, Timeout: the first target is unreachable or stalled.
        """
        head, rest = targets[0], list(targets[1:])
        stall = self.peer_timeout if pipeline else self.io_timeout
        if pipeline and self._is_stalled(head):
            raise Unavailable(f"replica {head.worker_id} stalled lately")
        try:
            reader, writer = await self._peer(head, stall)
            whole = False
            try:
                hdr = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=block_id, crc32c=crc, pipeline=rest, token=token)
                await framing.write_frame(writer, hdr, payload_len=length, timeout=stall)
                for offset in range(0, length, CHUNK_SIZE):
                    data = await piece(offset, min(CHUNK_SIZE, length - offset))
                    await self.throttle(len(data))
                    framing.send(writer, data)
                    await framing.drain(writer, stall)
                reply, plen = await framing.read_header(reader, stall * (1 + len(rest)))
                framing.raise_if_error(reply)
                whole = plen == 0
                return list(reply.replicas)
            finally:
                if whole:
                    self._keep_peer(head, reader, writer)
                else:
                    framing.close_writer(writer)
        except (Unavailable, Timeout):
            if pipeline:
                self._peer_stalled(head)
            raise


def _write_whole(writer: BlockWriter, data: bytes) -> BlockInfo:
    """Write a whole block from memory and publish it unsynced (a copy of an under-store's bytes)."""
    view = memoryview(data)
    for offset in range(0, len(data), CHUNK_SIZE):
        writer.write(view[offset : offset + CHUNK_SIZE])
    return writer.commit(sync=False)


def check_pipeline(grant: BlockGrant, pipeline: Iterable[pb.WorkerAddr]) -> None:
    """A pipeline (the replicas a block goes on to) may only name workers its block token names.

    Raises:
        PermissionDenied: another worker.
    """
    strangers = [a.worker_id for a in pipeline if a.worker_id not in grant.workers]
    if strangers:
        raise PermissionDenied(
            f"the block token of block {grant.block_id} is not for {', '.join(strangers)} of its pipeline"
        )


def _usable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether an idle connection may carry another request: the peer has not closed it (a
    killed or restarted worker's end is closed by its kernel, and the event loop reads that end
    of file as it arrives) and nothing failed on it. A stopped worker's stays open: a block
    sent on it stalls as one sent on a new connection would (its PING stalls)."""
    return not (reader.at_eof() or reader.exception() is not None or writer.is_closing())


def _peer_key(addr: pb.WorkerAddr) -> str:
    return f"{addr.worker_id}@{addr.host}:{addr.port}"
