"""The master's metastore as an ordered, replicated log (Ling report §2.3.1: a leader and a
follower master; ``../shared/DESIGN.md``, "Leader/follower").

Every mutation of the namespace is one :meth:`MetaStore.write` batch. :class:`ReplicatedStore`
numbers those batches: batch ``n`` is log entry ``n``, written in the leader's **epoch**, and the
``zidx`` key in the same batch records ``(n, epoch)``, so a master's RocksDB always knows, after
any crash, exactly which prefix of the log it holds. The first entry of each term records where
the term starts (``zt<index>`` -> epoch), so any master can tell the epoch of any index it holds.

Two logs agree up to ``(index, epoch)`` when both hold that entry: one leader writes each epoch's
entries once, in order, so equal ``(index, epoch)`` means equal prefixes (Raft's Log Matching
property; Ongaro and Ousterhout, "In Search of an Understandable Consensus Algorithm", §5.3).
The leader (:class:`LogShipper`) sends a follower the entries after the last one they agree on,
many client mutations per round trip (group commit), and answers a client only once every
*required* follower applied them. A follower too far behind for the in-memory tail, or whose log
went past the leader's (a deposed leader with entries nobody acknowledged), receives a RocksDB
checkpoint instead and then the tail after it. Election, epochs and the in-sync flags live in
etcd (:mod:`pcache.master.ha`); this module never decides who leads.

Key layout added to the namespace's (:mod:`pcache.master.namespace`)::

    zidx                    -> <index:8><epoch:8>  (last applied entry)
    zt<start index:8>       -> <epoch:8>           (a term starts)
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import glob
import logging
import os
import shutil
import ssl
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import grpc

from pcache.common import errors as E
from pcache.common.auth import Guard, bearer
from pcache.common.metrics import MASTER_APPLIED_INDEX, MASTER_FOLLOWER_LAG, MASTER_REPL_BATCH
from pcache.common.rpc import call_stamped, channel_options, rpc_method, rpc_stream_method, translate_stamped
from pcache.common.tls import TLSConfig, close_later
from pcache.common.tls import channel as tls_channel
from pcache.master import logstream
from pcache.master.logstream import LeaderStream
from pcache.master.metastore import MetaStore
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

ZIDX = b"zidx"
ZTERM = b"zt"
POSITION = struct.Struct(">QQ")
U64 = struct.Struct(">Q")
BATCH_ENTRIES = 4096  # entries per Append at most
BATCH_BYTES = 4 << 20  # bytes of entries per Append at most
WINDOW = 4  # Append messages on a follower's stream awaiting their answer at most
REPLICATION_SCOPES = dict.fromkeys(("Append", "Probe", "InstallCheckpoint"), frozenset({"master"}))
CHUNK_BYTES = 1 << 20  # bytes per checkpoint chunk
INCOMING = ".incoming"  # suffix of the directory a checkpoint is received into


def _entry_bytes(entry: pb.LogEntry) -> int:
    return entry.ByteSize()


class ReplicatedStore:
    """A :class:`MetaStore` whose every write is a numbered log entry; also keeps a tail of them.

    ``local`` is the master's own engine; ``reopen`` opens it again (a follower swaps its RocksDB
    for a received checkpoint); ``path`` is its RocksDB directory (None for ``memory://``: no
    checkpoints). ``tail_entries``/``tail_bytes`` bound the in-memory tail served to followers.

    :attr:`writable` (set by the master) says whether this master may write now; a write when it
    may not raises :class:`NotLeader` and changes nothing.
    """

    def __init__(
        self,
        local: MetaStore,
        *,
        path: str | None = None,
        reopen: Callable[[], MetaStore] | None = None,
        tail_entries: int = 200_000,
        tail_bytes: int = 256 << 20,
    ) -> None:
        self.local = local
        self.path = path
        self._reopen = reopen
        self.tail_entries = tail_entries
        self.tail_bytes = tail_bytes
        self.epoch = 0  # epoch stamped on new entries (the current term's)
        self.writable: Callable[[], str | None] = lambda: None  # None: may write; else why not
        self.on_append: Callable[[], None] = lambda: None
        self.tail: deque[pb.LogEntry] = deque()
        self._tail_size = 0
        # inside one_batch(): entries written but not yet in the local store, and their writes by key
        self._deferred: list[pb.LogEntry] | None = None
        self._overlay: dict[bytes, bytes | None] = {}
        self._load_position()

    def _load_position(self) -> None:
        raw = self.local.get(ZIDX)
        self.index, self.index_epoch = POSITION.unpack(raw) if raw else (0, 0)
        self._term_starts: list[int] = []
        self._term_epochs: list[int] = []
        for key, value in self.local.scan(ZTERM):
            self._term_starts.append(U64.unpack(key[len(ZTERM) :])[0])
            self._term_epochs.append(U64.unpack(value)[0])
        MASTER_APPLIED_INDEX.set(self.index)

    # ------------------------------------------------------- MetaStore --

    def get(self, key: bytes) -> bytes | None:
        if self._overlay and key in self._overlay:
            return self._overlay[key]
        return self.local.get(key)

    def scan(self, prefix: bytes, start_after: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        if self._deferred:
            self._flush()  # a scan reads the local store: what this batch wrote goes there first
        return self.local.scan(prefix, start_after)

    @contextlib.contextmanager
    def one_batch(self) -> Iterator[None]:
        """Entries written inside the block, with what :meth:`amend` adds to them, reach the local
        store together when it ends, as one write batch, and only then go to the followers.

        A mutation and its reply record (:mod:`.dedup`) were two local writes: a master killed
        between them kept the mutation without its answer, and when it came back (a leader
        alone, or the last leader) a client's retry applied it a second time (a rename answered
        ``NotFound``, a write ``Conflict``). Reads inside the block see what it wrote (``get``
        looks at those writes first; a ``scan`` writes them out first). Nested blocks are one.
        """
        if self._deferred is not None:
            yield
            return
        self._deferred = []
        try:
            yield
        finally:
            try:
                self._flush()
            finally:
                self._deferred, self._overlay = None, {}

    @property
    def last_written(self) -> int:
        """The index of the last entry written, counting those :meth:`one_batch` still holds."""
        return self.index + len(self._deferred or ())

    def _flush(self) -> None:
        """Write the deferred entries locally as one batch, then take them into the log."""
        entries = self._deferred or []
        self._deferred, self._overlay = [], {}
        if entries:
            self._commit(entries)

    def _commit(self, entries: list[pb.LogEntry]) -> None:
        """Write ``entries`` locally as one batch (with the position after the last), remember
        them in the tail, and let the shipper know."""
        batches = [([(kv.key, kv.value) for kv in entry.puts], list(entry.deletes)) for entry in entries]
        batches[-1][0].append((ZIDX, POSITION.pack(entries[-1].index, entries[-1].epoch)))
        self.local.write_many(batches)
        for entry in entries:
            self._remember(entry)
        self.on_append()

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (), deletes: Iterable[bytes] = ()) -> None:
        """Apply one batch as the next log entry of the current term.

        Raises:
            NotLeader: this master may not write now (a follower, or a leader past its lease).
        """
        why = self.writable()
        if why is not None:
            raise E.NotLeader(why)
        deferred = self._deferred
        entry = pb.LogEntry(index=self.index + 1 + len(deferred or ()), epoch=self.epoch)
        for key in deletes:
            entry.deletes.append(bytes(memoryview(key)))
        for key, value in puts:
            entry.puts.add(key=bytes(memoryview(key)), value=bytes(memoryview(value)))
        if deferred is not None:  # one_batch(): written locally when the block ends
            deferred.append(entry)
            self._overlay.update((key, None) for key in entry.deletes)
            self._overlay.update((kv.key, kv.value) for kv in entry.puts)
            return
        self._commit([entry])

    def write_many(self, batches: Iterable[tuple[Iterable[tuple[bytes, bytes]], Iterable[bytes]]]) -> None:
        """Write each batch as its own log entry, in order."""
        for puts, deletes in batches:
            self.write(puts, deletes)

    def amend(self, since: int, puts: list[tuple[bytes, bytes]]) -> None:
        """Add ``puts`` to the last entry if it was written after index ``since``, else write them.

        A request's reply record then travels in the same entry as its mutation: a follower
        applies both or neither. Call it with no ``await`` between the mutation and here (the
        entry must not have been shipped yet).
        """
        deferred = self._deferred or []
        if self.last_written <= since:
            self.write(puts)
            return
        if deferred:  # not written locally yet: the puts join the entry's own batch
            for key, value in puts:
                deferred[-1].puts.add(key=key, value=value)
                self._overlay[key] = value
            return
        if self.tail and self.tail[-1].index == self.index:
            entry = self.tail[-1]
            for key, value in puts:
                entry.puts.add(key=key, value=value)
            self._tail_size += sum(len(k) + len(v) for k, v in puts)
        self.local.write(puts)

    def close(self) -> None:
        self.local.close()

    # ---------------------------------------------------------- the log --

    def start_term(self, epoch: int) -> None:
        """Begin a term: later entries carry ``epoch``; its first entry records where it starts."""
        self.epoch = epoch
        start = self.index + 1
        self.write([(ZTERM + U64.pack(start), U64.pack(epoch))])

    def epoch_of(self, index: int) -> int:
        """The epoch entry ``index`` was written in (0 for index 0 or before the first term)."""
        i = bisect.bisect_right(self._term_starts, index) - 1
        return self._term_epochs[i] if i >= 0 and index > 0 else 0

    def _remember(self, entry: pb.LogEntry) -> None:
        """Advance the position past an applied ``entry``, note a term start, keep it in the tail."""
        self.index, self.index_epoch = entry.index, entry.epoch
        for kv in entry.puts:
            if kv.key.startswith(ZTERM) and len(kv.key) == len(ZTERM) + 8:
                self._term_starts.append(U64.unpack(kv.key[len(ZTERM) :])[0])
                self._term_epochs.append(U64.unpack(kv.value)[0])
        if self.tail_entries:
            self.tail.append(entry)
            self._tail_size += _entry_bytes(entry)
            while self.tail and (len(self.tail) > self.tail_entries or self._tail_size > self.tail_bytes):
                self._tail_size -= _entry_bytes(self.tail.popleft())
        MASTER_APPLIED_INDEX.set(self.index)

    def tail_first(self) -> int:
        """The oldest index the tail still holds (``index + 1`` when empty)."""
        return self.tail[0].index if self.tail else self.index + 1

    def entries_after(self, index: int) -> list[pb.LogEntry]:
        """Entries after ``index`` from the tail, up to one batch (BATCH_ENTRIES, BATCH_BYTES)."""
        first = self.tail_first()
        if index + 1 < first:
            raise LookupError(f"entries after {index} left the tail (it starts at {first})")
        out: list[pb.LogEntry] = []
        size = 0
        for i in range(index + 1 - first, len(self.tail)):
            entry = self.tail[i]
            size += _entry_bytes(entry)
            if out and (len(out) >= BATCH_ENTRIES or size > BATCH_BYTES):
                break
            out.append(entry)
        return out

    def holds(self, index: int, epoch: int) -> bool:
        """Whether this log holds entry ``index`` written in ``epoch`` (so both logs agree up to it)."""
        return index <= self.index and self.epoch_of(index) == epoch

    # ------------------------------------------------------ follower side --

    def append(self, request: pb.AppendRequest) -> bool:
        """Apply a leader's entries if they follow this log's last one; returns whether they did.

        The whole group goes to RocksDB as one write batch (the leader's group commit, once more).
        """
        if request.prev_index != self.index or request.prev_epoch != self.index_epoch:
            return False
        for offset, entry in enumerate(request.entries):
            if entry.index != self.index + 1 + offset:
                raise E.ProtocolError(f"log entry {entry.index} does not follow {self.index + offset}")
        if request.entries:
            batches = [([(kv.key, kv.value) for kv in entry.puts], entry.deletes) for entry in request.entries]
            last = request.entries[-1]
            batches[-1][0].append((ZIDX, POSITION.pack(last.index, last.epoch)))
            self.local.write_many(batches)
            for entry in request.entries:
                self._remember(entry)
        return True

    def checkpoint(self, dest: str) -> tuple[int, int]:
        """Write a RocksDB checkpoint (hard-linked SST files) to ``dest``; returns its (index, epoch).

        Raises:
            NotSupported: the engine is not RocksDB.
        """
        make = getattr(self.local, "checkpoint", None)
        if make is None:
            raise E.NotSupported("only a rocksdb:// metastore can be checkpointed")
        make(dest)  # synchronous on the event loop: no write can slip in between
        return self.index, self.index_epoch

    def install(self, incoming: str) -> None:
        """Replace the local store with the checkpoint received into ``incoming`` (fully written)."""
        if self.path is None or self._reopen is None:
            raise E.NotSupported("only a rocksdb:// metastore can install a checkpoint")
        self.local.close()
        old = self.path + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(self.path, old)
        os.rename(incoming, self.path)
        _fsync_dir(os.path.dirname(self.path))
        shutil.rmtree(old, ignore_errors=True)
        self.local = self._reopen()
        self.tail.clear()
        self._tail_size = 0
        self._load_position()


def recover_incoming(path: str) -> None:
    """At start: finish or discard a checkpoint install a crash interrupted, and remove checkpoints
    a crashed leader was sending (``path`` = RocksDB dir)."""
    incoming = path + INCOMING
    if not os.path.isdir(path) and os.path.exists(os.path.join(incoming, "COMPLETE")):
        os.rename(incoming, path)  # crashed between the two renames of install()
    shutil.rmtree(incoming, ignore_errors=True)
    shutil.rmtree(path + ".old", ignore_errors=True)
    for leftover in glob.glob(glob.escape(path) + ".ckpt-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------- follower --


class ReplicationServicer(pb_grpc.ReplicationServicer):
    """A follower's end of replication: apply entries, install checkpoints, say where its log ends.

    ``member`` is this master's member id; ``is_leader()`` says whether it leads now (a leader
    takes no entries). The newest epoch seen is kept: an older leader is refused (fencing).
    """

    def __init__(self, store: ReplicatedStore, member: str, is_leader: Callable[[], bool], guard: Guard) -> None:
        self.store = store
        self.guard = guard
        self.member = member
        self.is_leader = is_leader
        self.epoch = 0  # newest leader epoch seen
        self.leader = ""  # that leader's address
        self.last_contact = 0.0
        self.on_contact: Callable[[], None] = lambda: None
        self.deposed = 0  # newest epoch whose leader this follower found gone and deposed (refused from then on)
        # a leader's replication stream closed from its end: (its epoch, its address)
        self.on_stream_lost: Callable[[int, str], None] = lambda epoch, leader: None
        self.stream_port = 0  # where this master takes replication streams (0: none, Append only)
        # the newest term whose entries this master holds (set by the server): a leader with a
        # lower epoch won on an etcd whose data went back, and its log must not replace this one
        self.held_term: Callable[[], int] = lambda: 0

    def authorize(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Only another master of this cluster (a master-scope token) may replicate to this one.

        Raises:
            PermissionDenied: any other caller.
        """
        self.guard.authorize(method, context.invocation_metadata())

    def authorize_token(self, method: str, token: str) -> None:
        """As :meth:`authorize`, for the token of a replication stream's HELLO (:mod:`logstream`)."""
        self.guard.authorize(method, bearer(token))

    def _reply(self, ok: bool) -> pb.AppendResponse:
        return pb.AppendResponse(
            epoch=self.epoch, ok=ok, applied_index=self.store.index,
            applied_epoch=self.store.index_epoch, member=self.member, stream_port=self.stream_port,
        )  # fmt: skip

    def apply_append(self, request: pb.AppendRequest) -> pb.AppendResponse:
        """Apply one group of the leader's entries (if they follow this log); the answer to send.

        Raises:
            StaleEpoch: the leader's epoch is older than one seen, or this master leads.
        """
        self._accept(request.epoch, request.leader)
        return self._reply(self.store.append(request))

    def _accept(self, epoch: int, leader: str) -> None:
        if epoch < self.epoch:
            raise E.StaleEpoch(f"leader epoch {epoch} is older than {self.epoch}, already seen here")
        if epoch <= self.deposed:
            raise E.StaleEpoch(f"the term of epoch {epoch} was ended here (its leader was found gone)")
        held = self.held_term()
        if epoch < held:
            raise E.StaleEpoch(
                f"leader epoch {epoch} is older than term {held}, whose entries this master holds: etcd's record"
                " went back (emptied, or restored from an older snapshot); see pcache ha recover"
            )
        if self.is_leader():
            raise E.StaleEpoch(f"this master leads (epoch {self.store.epoch}); it takes no log entries")
        self.epoch, self.leader = epoch, leader
        self.last_contact = time.monotonic()
        self.on_contact()

    @rpc_method
    async def Probe(self, request: pb.MemberRequest, context: grpc.aio.ServicerContext) -> pb.AppendResponse:
        return self._reply(True)

    @rpc_stream_method
    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AppendResponse]:
        """Apply the leader's stream of entry groups in order, answering each one in turn."""
        async for request in request_iterator:
            yield self.apply_append(request)

    @rpc_method
    async def InstallCheckpoint(
        self, request_iterator: AsyncIterator[pb.CheckpointChunk], context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        if self.store.path is None:
            raise E.NotSupported("this master's metastore is not RocksDB; it cannot take a checkpoint")
        incoming = self.store.path + INCOMING
        shutil.rmtree(incoming, ignore_errors=True)
        os.makedirs(incoming, mode=0o700)
        files: dict[str, int] = {}
        done = False
        try:
            async for chunk in request_iterator:
                self._accept(chunk.epoch, chunk.leader)
                if chunk.name:
                    name = os.path.basename(chunk.name)
                    if name != chunk.name or name in ("", ".", ".."):
                        raise E.ProtocolError(f"checkpoint file name {chunk.name!r} is not a plain name")
                    if name not in files:
                        files[name] = os.open(os.path.join(incoming, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    os.write(files[name], chunk.data)
                if chunk.done:
                    done = True
            if not done:
                raise E.ProtocolError("the checkpoint stream ended before its last chunk")
            for fd in files.values():
                os.fsync(fd)
        except BaseException:
            for fd in files.values():
                os.close(fd)
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        for fd in files.values():
            os.close(fd)
        with open(os.path.join(incoming, "COMPLETE"), "w") as marker:
            marker.flush()
            os.fsync(marker.fileno())
        _fsync_dir(incoming)
        self.store.install(incoming)
        logger.info("installed the leader's checkpoint at log index %d", self.store.index)
        return self._reply(True)


# ----------------------------------------------------------------- leader --

FollowerState = Literal["probing", "replicating", "checkpoint", "down"]


@dataclass
class Follower:
    """The leader's view of one follower."""

    member: str
    address: str
    acked: int = 0  # highest index it applied, as it told us
    next_index: int | None = None  # None: unknown, probe first
    required: bool = False  # client answers wait for its acknowledgement
    in_sync: bool = False  # its in-sync flag is set in etcd under our epoch
    state: FollowerState = "probing"
    last_contact: float = 0.0
    channel: grpc.aio.Channel | None = None
    stub: pb_grpc.ReplicationStub | None = None
    task: asyncio.Task | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    flag_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one etcd flag change at a time
    forgetting: asyncio.Task | None = None  # it left the members: released, then removed
    stream_port: int = 0  # its replication stream port, from its last Probe answer (0: Append)
    stream: LeaderStream | None = None  # the open replication stream
    sent: deque[float] = field(default_factory=deque)  # send times of its unanswered messages
    last_index: int = 0  # the last index sent on the stream
    last_sent: float = 0.0  # when the last message left
    push_soon: bool = False  # a push is scheduled for the next loop turn


class SyncFlags:
    """Where the in-sync flags of followers are kept (etcd, written under the leader's epoch)."""

    async def set_in_sync(self, member: str) -> bool:
        """Mark ``member`` in sync; False when it could not be written (no longer leader, etcd down)."""
        raise NotImplementedError

    async def clear_in_sync(self, member: str) -> bool:
        """Mark ``member`` out of sync; False when it could not be written."""
        raise NotImplementedError


class LogShipper:
    """The leader's replication: ship the log to followers, wait for acknowledgements.

    ``ack_timeout`` (seconds): a required follower that leaves a mutation unacknowledged that
    long is marked out of sync in etcd, and the leader goes on without it ("alone" when none is
    left); it becomes required again once it has caught up. ``rpc_timeout`` bounds each Append.
    """

    def __init__(
        self,
        store: ReplicatedStore,
        *,
        epoch: int,
        address: str,
        flags: SyncFlags,
        ack_timeout: float = 2.0,
        rpc_timeout: float = 5.0,
        heartbeat: float = 0.5,
        on_deposed: Callable[[int], Awaitable[None]] | None = None,
        token: str = "",
        tls: TLSConfig | None = None,
    ) -> None:
        self.store = store
        self.token = token  # a master-scope token: followers take entries only from this cluster's masters
        self.tls = tls
        self.epoch = epoch
        self.address = address
        self.flags = flags
        self.ack_timeout = ack_timeout
        self.rpc_timeout = rpc_timeout
        self.heartbeat = heartbeat
        self.on_deposed = on_deposed
        self.followers: dict[str, Follower] = {}
        # followers whose etcd member key expired (dead, stopped, cut off): shown by `pcache status` until
        # they come back, so that a lost master does not simply vanish: member -> (address, when, last answer)
        self.gone: dict[str, tuple[str, float, float]] = {}
        self._client_tls: ssl.SSLContext | None = None
        self._waiters: list[tuple[int, float, asyncio.Future]] = []  # (index, since, future), index order
        self._closed = False
        self._watchdog = asyncio.ensure_future(self._watch())
        store.on_append = self._on_append

    # ----------------------------------------------------------- status --

    def alone(self) -> bool:
        """Whether no follower is required: acknowledged mutations live on this master only."""
        return not any(f.required for f in self.followers.values())

    def committed(self) -> int:
        """Highest index every required follower applied (this master's own index when none is)."""
        acks = [f.acked for f in self.followers.values() if f.required]
        return min([self.store.index, *acks])

    def status(self) -> list[pb.FollowerStatus]:
        """One line per follower for ``pcache status``, then one per follower that left (state
        ``gone``, ``gone_age`` seconds ago)."""
        now = time.monotonic()
        live = [
            pb.FollowerStatus(
                member=f.member, address=f.address, in_sync=f.in_sync, applied_index=f.acked,
                lag=max(0, self.store.index - f.acked), state=f.state,
                last_contact_age=now - f.last_contact if f.last_contact else -1.0,
            )
            for f in self.followers.values()
        ]  # fmt: skip
        gone = [
            pb.FollowerStatus(
                member=member, address=address, in_sync=False, state="gone", gone_age=now - left,
                last_contact_age=now - contact if contact else -1.0,
            )
            for member, (address, left, contact) in self.gone.items() if member not in self.followers
        ]  # fmt: skip
        return live + gone

    # ---------------------------------------------------------- members --

    def set_members(self, members: dict[str, str]) -> None:
        """Follow exactly these masters (member id -> address), this one left out."""
        for member, address in members.items():
            follower = self.followers.get(member)
            if follower is not None and follower.address == address and follower.task is not None:
                continue
            self.gone.pop(member, None)
            if follower is None:
                follower = self.followers[member] = Follower(member, address)
            else:  # back, or at a new address: it keeps its duties (answers may be waiting for it)
                self._stop(follower)
                if follower.forgetting is not None:
                    follower.forgetting.cancel()
                    follower.forgetting = None
                    follower.in_sync = False  # the flag may be gone: set again once it has caught up
                follower.address, follower.next_index, follower.state = address, None, "probing"
            follower.channel = tls_channel(address, self.tls, channel_options())
            follower.stub = pb_grpc.ReplicationStub(follower.channel)
            follower.task = asyncio.ensure_future(self._ship(follower))
            logger.info("replicating to follower %s at %s", member, address)
        for member in [m for m in self.followers if m not in members]:
            if self.followers[member].task is not None:
                self._drop(self.followers[member])

    def redial(self) -> None:
        """Give each follower a new channel, made with the TLS files read last (a renewed
        certificate or CA bundle: gRPC channel credentials are fixed). Calls under way end on
        the old one, closed :data:`OLD_CHANNEL_GRACE` seconds later (a checkpoint's transfer)."""
        for follower in self.followers.values():
            if follower.channel is None:
                continue
            old = follower.channel
            follower.channel = tls_channel(follower.address, self.tls, channel_options())
            follower.stub = pb_grpc.ReplicationStub(follower.channel)
            asyncio.ensure_future(close_later(old))

    def _stop(self, follower: Follower) -> None:
        if follower.task is not None:
            follower.task.cancel()
            follower.task = None
        if follower.channel is not None:
            asyncio.ensure_future(follower.channel.close())
            follower.channel = None

    def _drop(self, follower: Follower) -> None:
        """Stop shipping to a follower that left etcd's member list (its lease expired).

        A required follower stays counted (answers wait for it) until its in-sync flag is gone
        from etcd: only then may the leader answer without it.
        """
        self._stop(follower)
        if follower.required:
            follower.forgetting = asyncio.ensure_future(self._forget(follower))
        else:
            self._remove(follower)

    async def _forget(self, follower: Follower) -> None:
        await self._release(follower)
        if not follower.required:
            self._remove(follower)

    def _remove(self, follower: Follower) -> None:
        if self.followers.get(follower.member) is follower:
            del self.followers[follower.member]
            self.gone[follower.member] = (follower.address, time.monotonic(), follower.last_contact)
            logger.warning(
                "follower %s at %s left (its etcd member key expired): not replicated to until it is back",
                follower.member, follower.address,
            )  # fmt: skip
            with contextlib.suppress(KeyError):
                MASTER_FOLLOWER_LAG.remove(follower.member)

    # ----------------------------------------------------------- commit --

    async def commit(self, index: int, timeout: float) -> None:
        """Wait until entry ``index`` is applied by every required follower.

        Raises:
            NotLeader: this master stopped leading meanwhile (the entry may or may not survive).
            Unavailable: not acknowledged within ``timeout`` seconds (etcd unreachable, so a
                silent follower could not be marked out of sync).
        """
        if self._closed:
            raise E.NotLeader("this master stopped leading")
        if index <= self.committed():
            self._check_lease()
            return
        for follower in self.followers.values():
            if follower.push_soon:  # the caller's entries are complete: they leave now, not a loop turn later
                self._push(follower)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        bisect.insort(self._waiters, (index, time.monotonic(), future), key=lambda w: w[0])
        try:
            async with asyncio.timeout(timeout):
                await future  # resolved by _advance (or failed by close); one loop turn to wake
        except TimeoutError as exc:
            raise E.Unavailable(
                f"mutation at log index {index} was not acknowledged by the follower within {timeout:.1f} s"
                " (and etcd could not be told to go on without it)"
            ) from exc
        finally:
            if not future.done():
                future.cancel()
        self._check_lease()

    def _check_lease(self) -> None:
        why = self.store.writable()
        if why is not None:
            raise E.NotLeader(why)

    def _advance(self) -> None:
        upto = self.committed()
        while self._waiters and self._waiters[0][0] <= upto:
            _, _, future = self._waiters.pop(0)
            if not future.done():
                future.set_result(None)

    def close(self, why: str = "this master stopped leading") -> None:
        """Stop shipping; every waiting answer fails with NotLeader."""
        self._closed = True
        self._watchdog.cancel()
        for follower in list(self.followers.values()):
            if follower.task is not None:
                follower.task.cancel()
            if follower.channel is not None:
                asyncio.ensure_future(follower.channel.close())
        self.followers.clear()
        for _, _, future in self._waiters:
            if not future.done():
                future.set_exception(E.NotLeader(why))
        self._waiters.clear()
        self.store.on_append = lambda: None

    def _on_append(self) -> None:
        for follower in self.followers.values():
            follower.wake.set()
            if follower.stream is not None and not follower.push_soon:
                # every entry written in this loop turn leaves in one message
                follower.push_soon = True
                asyncio.get_running_loop().call_soon(self._push, follower)

    # ---------------------------------------------------------- in sync --

    async def _watch(self) -> None:
        """Mark out of sync a required follower that holds up answers past ``ack_timeout``."""
        while True:
            await asyncio.sleep(min(0.2, self.ack_timeout / 4))
            now = time.monotonic()
            for follower in list(self.followers.values()):
                if not follower.required:
                    continue
                stuck = [
                    w for w in self._waiters
                    if not w[2].done() and w[0] > follower.acked and now - w[1] > self.ack_timeout
                ]  # fmt: skip
                if stuck:
                    await self._release(follower)
            for follower in list(self.followers.values()):
                if follower.task is None and not follower.required:  # left the members, released
                    self._remove(follower)

    # Invariant: a follower's flag is set in etcd only while it is required (answers wait for it),
    # so a follower that may take over holds every acknowledged mutation. ``required`` is set
    # before the flag is written and cleared only after the flag is gone; the lock keeps the two
    # etcd writes of one follower from crossing.

    async def _release(self, follower: Follower) -> None:
        async with follower.flag_lock:
            if not follower.required:
                return
            if not await self.flags.clear_in_sync(follower.member):
                return  # answers keep waiting (and time out) rather than outrun the flag
            follower.required = follower.in_sync = False
        logger.warning(
            "follower %s marked out of sync (no acknowledgement for %.1f s); %s",
            follower.member, self.ack_timeout, "going on alone" if self.alone() else "others remain",
        )  # fmt: skip
        self._advance()

    async def _maybe_rejoin(self, follower: Follower) -> None:
        """A follower that caught up becomes required again, then in sync in etcd."""
        if follower.in_sync or follower.state != "replicating" or follower.acked < self.store.index:
            return
        async with follower.flag_lock:
            if follower.in_sync or follower.acked < self.store.index or follower.task is None:
                return
            follower.required = True  # from now on answers wait for it; then it may take over
            if await self.flags.set_in_sync(follower.member):
                follower.in_sync = True
                logger.info("follower %s is in sync at index %d", follower.member, follower.acked)

    # --------------------------------------------------------- shipping --

    async def _ship(self, follower: Follower) -> None:
        backoff = 0.1
        while not self._closed:
            try:
                await self._ship_once(follower)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except E.StaleEpoch as exc:
                logger.warning("follower %s refused epoch %d: %s", follower.member, self.epoch, exc)
                if self.on_deposed is not None and getattr(exc, "epoch", 0) > self.epoch:
                    await self.on_deposed(exc.epoch)
                follower.state, follower.next_index = "down", None
                await asyncio.sleep(1.0)
            except (E.PCacheError, OSError) as exc:
                if follower.state != "down":
                    logger.warning("follower %s at %s: %s", follower.member, follower.address, exc)
                follower.state, follower.next_index = "down", None
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
            except Exception:
                logger.exception("replication to %s failed", follower.member)
                follower.state, follower.next_index = "down", None
                await asyncio.sleep(1.0)

    async def _ship_once(self, follower: Follower) -> None:
        assert follower.stub is not None
        if follower.next_index is None:
            reply = await self._rpc(follower, "Probe", pb.MemberRequest(epoch=self.epoch))
            self._place(follower, reply)
            follower.stream_port = reply.stream_port
            return
        if follower.next_index < self.store.tail_first():
            await self._send_checkpoint(follower)
            return
        if follower.stream_port:
            await self._stream_direct(follower)
        else:
            await self._stream(follower)

    async def _stream_direct(self, follower: Follower) -> None:
        """Ship entries on a replication stream (:mod:`pcache.master.logstream`) until the
        follower refuses one or the stream fails.

        Entries leave from the loop turn that wrote them (:meth:`_push`), up to :data:`WINDOW`
        messages unanswered; an idle stream carries an empty message every ``heartbeat``
        seconds. A message unanswered for ``rpc_timeout`` seconds fails the stream (the follower
        is then probed again).

        Raises:
            StaleEpoch: the follower has seen a newer epoch. Unavailable, Timeout: the stream broke.
        """
        assert follower.next_index is not None
        host = follower.address.rsplit(":", 1)[0].strip("[]")
        if self.tls is not None and self._client_tls is None:
            self._client_tls = self.tls.client_context()
        stream = await logstream.connect(
            host, follower.stream_port, self.token, lambda reply: self._on_reply(follower, reply),
            timeout=self.rpc_timeout, tls=self._client_tls,
        )  # fmt: skip
        logger.info("replication stream to follower %s at %s:%d", follower.member, host, follower.stream_port)
        follower.stream, follower.sent = stream, deque()
        follower.last_index, follower.last_sent = follower.next_index - 1, time.monotonic()
        try:
            self._push(follower)
            while not stream.done.done():
                now = time.monotonic()
                if follower.sent:
                    wait = self.rpc_timeout - (now - follower.sent[0])
                    if wait <= 0:
                        raise E.Timeout(f"follower {follower.address} answered no entries for {self.rpc_timeout:.1f} s")
                else:
                    wait = self.heartbeat - (now - follower.last_sent)
                    if wait <= 0:
                        self._push(follower, beat=True)
                        continue
                # an answer needs no wake-up: the next beat is due at most a heartbeat from now
                await asyncio.wait([stream.done], timeout=min(wait, self.heartbeat))
            stream.done.result()  # its error, if it failed
        finally:
            follower.stream = None
            stream.close()

    def _push(self, follower: Follower, *, beat: bool = False) -> None:
        """Send a follower's stream the entries it has not been sent, up to the window."""
        follower.push_soon = False
        stream = follower.stream
        if stream is None or stream.done.done():
            return
        while len(follower.sent) < WINDOW:
            if follower.last_index + 1 < self.store.tail_first():
                stream.finish()  # it fell out of the tail: a checkpoint next
                return
            entries = self.store.entries_after(follower.last_index)
            if not entries and not beat:
                return
            request = pb.AppendRequest(
                epoch=self.epoch, leader=self.address, prev_index=follower.last_index,
                prev_epoch=self.store.epoch_of(follower.last_index), entries=entries,
            )  # fmt: skip
            follower.last_sent = time.monotonic()
            follower.sent.append(follower.last_sent)
            stream.append(request)
            beat = False
            if entries:
                follower.last_index = entries[-1].index
                MASTER_REPL_BATCH.observe(len(entries))

    def _on_reply(self, follower: Follower, reply: pb.AppendResponse) -> None:
        """Take one answer of a follower's stream (called from the stream, in order).

        Raises:
            StaleEpoch: the follower has seen a newer epoch (the stream fails with it).
        """
        if follower.sent:
            follower.sent.popleft()
        self._heard(follower, reply)
        if not reply.ok:
            self._place(follower, reply)
            if follower.stream is not None:
                follower.stream.finish()
            return
        self._applied(follower, reply)
        if not follower.in_sync and follower.acked >= self.store.index:
            asyncio.ensure_future(self._maybe_rejoin(follower))
        self._push(follower)

    async def _stream(self, follower: Follower) -> None:
        """Ship entries on one Append stream until the follower refuses one or the stream fails.

        Up to :data:`WINDOW` messages are in flight, so the entries of the next client batches
        leave before the previous ones are answered (pipelined, as etcd's raft streams do); an
        idle stream carries an empty message every ``heartbeat`` seconds. A message unanswered
        for ``rpc_timeout`` seconds fails the stream (the follower is then probed again).

        Raises:
            StaleEpoch: the follower has seen a newer epoch. Unavailable, Timeout: the stream broke.
        """
        assert follower.stub is not None and follower.next_index is not None
        target = f"follower {follower.address}"
        call = follower.stub.Append(metadata=bearer(self.token))  # long-lived: each message's answer has the deadline
        sent: deque[float] = deque()  # send times of the messages not yet answered
        last = follower.next_index - 1  # the last index sent
        last_sent = time.monotonic()
        reader = asyncio.ensure_future(self._answers(follower, call, sent, target))
        reader.add_done_callback(lambda task: task.cancelled() or task.exception())  # seen, even if unread
        try:
            while not reader.done():
                now = time.monotonic()
                if len(sent) < WINDOW:
                    if last + 1 < self.store.tail_first():
                        return  # it fell out of the tail: a checkpoint next
                    entries = self.store.entries_after(last)
                    if entries or (not sent and now - last_sent >= self.heartbeat):
                        request = pb.AppendRequest(
                            epoch=self.epoch, leader=self.address, prev_index=last,
                            prev_epoch=self.store.epoch_of(last), entries=entries,
                        )  # fmt: skip
                        sent.append(now)  # before the write: its answer may come while it is written
                        try:
                            async with asyncio.timeout(self.rpc_timeout):
                                await call.write(request)
                        except grpc.aio.AioRpcError as exc:
                            raise translate_stamped(exc, target) from exc
                        except TimeoutError as exc:
                            raise E.Timeout(f"{target} took no entries for {self.rpc_timeout:.1f} s") from exc
                        last_sent = now
                        if entries:
                            last = entries[-1].index
                            MASTER_REPL_BATCH.observe(len(entries))
                        continue
                # wait for an append, an answer, the end of the stream or the next heartbeat
                if sent:
                    wait = self.rpc_timeout - (now - sent[0])
                    if wait <= 0:
                        raise E.Timeout(f"{target} answered no entries for {self.rpc_timeout:.1f} s")
                else:
                    wait = self.heartbeat - (now - last_sent)
                follower.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(follower.wake.wait(), max(wait, 0.0))
            reader.result()  # its error, if it failed
        finally:
            reader.cancel()
            call.cancel()

    async def _answers(self, follower: Follower, call, sent: deque[float], target: str) -> None:
        """Take a stream's answers in order; returns when the follower refused one (placed anew)."""
        while True:
            try:
                reply = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise translate_stamped(exc, target) from exc
            if reply is grpc.aio.EOF:
                raise E.Unavailable(f"{target} closed the replication stream")
            sent.popleft()
            self._heard(follower, reply)
            follower.wake.set()
            if not reply.ok:
                self._place(follower, reply)
                return
            self._applied(follower, reply)
            await self._maybe_rejoin(follower)

    def _applied(self, follower: Follower, reply: pb.AppendResponse) -> None:
        """A follower applied everything up to ``reply.applied_index``: answers waiting for it go."""
        follower.acked = reply.applied_index
        follower.next_index = reply.applied_index + 1
        follower.state = "replicating"
        MASTER_FOLLOWER_LAG.labels(follower.member).set(self.store.index - follower.acked)
        self._advance()

    def _place(self, follower: Follower, reply: pb.AppendResponse) -> None:
        """Find where a follower's log agrees with ours: after its last entry, or a checkpoint."""
        if self.store.holds(reply.applied_index, reply.applied_epoch):
            follower.acked = reply.applied_index
            follower.next_index = reply.applied_index + 1
            follower.state = "replicating" if follower.next_index >= self.store.tail_first() else "checkpoint"
        else:
            # its log went another way (entries of a deposed leader nobody acknowledged) or is
            # ahead of ours: only a checkpoint brings it back
            follower.acked = 0
            follower.next_index = 0
            follower.state = "checkpoint"
            if follower.required:
                asyncio.ensure_future(self._release(follower))

    async def _rpc(self, follower: Follower, name: str, request) -> pb.AppendResponse:
        assert follower.stub is not None
        reply, _ = await call_stamped(
            getattr(follower.stub, name), request, timeout=self.rpc_timeout, target=f"follower {follower.address}",
            token=self.token,
        )  # fmt: skip
        self._heard(follower, reply)
        return reply

    def _heard(self, follower: Follower, reply: pb.AppendResponse) -> None:
        """Note a follower's answer; one that has seen a newer epoch means this leader is deposed.

        Raises:
            StaleEpoch: with the newer epoch as its ``epoch``.
        """
        follower.last_contact = time.monotonic()
        if reply.epoch > self.epoch:
            err = E.StaleEpoch(f"follower {follower.member} has seen epoch {reply.epoch} > {self.epoch}")
            err.epoch = reply.epoch
            raise err

    async def _send_checkpoint(self, follower: Follower) -> None:
        """Stream a fresh RocksDB checkpoint to a follower too far behind, then go on from it."""
        assert follower.stub is not None and self.store.path is not None
        follower.state = "checkpoint"
        if follower.required:
            await self._release(follower)
        dest = f"{self.store.path}.ckpt-{follower.member}-{os.getpid()}"
        shutil.rmtree(dest, ignore_errors=True)
        index, index_epoch = self.store.checkpoint(dest)
        try:
            size = sum(os.path.getsize(os.path.join(dest, n)) for n in os.listdir(dest))
            logger.info("sending follower %s a checkpoint at index %d (%d bytes)", follower.member, index, size)

            async def chunks() -> AsyncIterator[pb.CheckpointChunk]:
                def chunk(name: str = "", data: bytes = b"", done: bool = False) -> pb.CheckpointChunk:
                    return pb.CheckpointChunk(
                        epoch=self.epoch, leader=self.address, index=index, index_epoch=index_epoch,
                        name=name, data=data, done=done,
                    )  # fmt: skip

                for name in sorted(os.listdir(dest)):
                    if name == "LOCK":
                        continue
                    with open(os.path.join(dest, name), "rb") as src:
                        while True:
                            data = await asyncio.to_thread(src.read, CHUNK_BYTES)
                            yield chunk(name, data)
                            if len(data) < CHUNK_BYTES:
                                break
                yield chunk(done=True)

            timeout = self.rpc_timeout + size / (20 << 20)  # at least 20 MB/s
            reply, _ = await call_stamped(
                follower.stub.InstallCheckpoint, chunks(), timeout=timeout, target=f"follower {follower.address}",
                token=self.token,
            )  # fmt: skip
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        self._heard(follower, reply)
        self._place(follower, reply)
