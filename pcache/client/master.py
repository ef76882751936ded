"""Thin async client of the master's gRPC service: one method per RPC.

Every call has a deadline (``rpc_timeout``), carries the request header
(tenant, token, newest epoch seen) and raises PCache errors
(:func:`pcache.common.rpc.call`).

With several masters (``a:port,b:port``: a leader and its follower) a call goes to the one that
led last; when it does not answer, or answers that it does not lead (:class:`NotLeader`), or
stamps an epoch older than one already seen (a deposed leader: :class:`StaleEpoch`), the call
goes to the next, until one leads or ``failover_timeout`` seconds have passed. A mutation keeps
one request id across these retries, so a master that applied it before the failover answers
from its record instead of applying it twice.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Iterable
from typing import Any

import grpc

from pcache.common import errors as E
from pcache.common.auth import bearer
from pcache.common.config import ClientConfig, check_addresses
from pcache.common.credentials import clean_token, find_tls_dir, find_token
from pcache.common.rpc import ERROR_KEY, MAX_BATCH, call_stamped, channel_options, translate_stamped
from pcache.common.tls import channel as tls_channel
from pcache.common.tls import load_optional
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc

# calls that change the namespace: they carry a request id and are answered once
MUTATIONS = frozenset(
    {
        "Mkdir",
        "Create",
        "Symlink",
        "Link",
        "Rename",
        "Delete",
        "SetAttr",
        "CommitFile",
        "CreateTenant",
        "DeleteTenant",
        "SetQuota",
        "BindPath",
        "UnbindPath",
    }
)
# errors after which another master may answer (a Timeout only for calls safe to repeat)
FAILOVER_ERRORS = (E.Unavailable, E.StaleEpoch)
SETUP_REFUSALS = 2  # times every master must refuse a connection as it is set up (TLS) before a call fails
logger = logging.getLogger(__name__)

# calls one client has on the wire at once: past about 1,000 concurrent unary calls on one
# channel gRPC ended some with CANCELLED (fsspec's cat of 3,000 files opens 2,500 at once)
MAX_CALLS_IN_FLIGHT = 256
STREAM_CLOSE_WAIT = 1.0  # seconds a closing client waits for a master to end its batch stream
PROBE_AFTER = 1.0  # seconds a call may hang before the other masters are asked who leads


class MasterClient:
    """Async stub wrapper bound to the master, or to every master of an HA pair."""

    def __init__(self, cfg: ClientConfig, client_id: str) -> None:
        """Raises InvalidArgument for a master address that is not HOST:PORT[,HOST:PORT...]."""
        self.addresses = check_addresses(cfg.master)
        self.cfg = cfg
        # pcache.common.credentials: where it is found
        self.token = clean_token(cfg.token, "the client's token") if cfg.token else find_token(cfg.master)
        self.client_id = client_id
        self.epoch = 0
        self.current = 0  # index of the master that answered last
        tls = self.tls = load_optional(cfg.tls_dir or find_tls_dir(cfg.master), need_cert=False)
        # several masters: this client fails over itself, without gRPC's retries on a dead one
        options = channel_options(retries=len(self.addresses) == 1)
        self.channels = [tls_channel(a, tls, options) for a in self.addresses]
        self.stubs = [pb_grpc.MasterStub(c) for c in self.channels]
        self._closing: list[asyncio.Task] = []  # channels replaced by a redial, closing
        self._request_ids = itertools.count(1)
        self._inflight = 0  # Stat/Create/Batch calls on the wire
        self._slots: asyncio.Semaphore | None = None  # MAX_CALLS_IN_FLIGHT (made on the client's loop)
        self._queued: list[tuple[pb.BatchOp, asyncio.Future]] = []
        # (deadline on the loop's clock, future, method, budget) of the queued callers, oldest first:
        # one timer for all of them (:meth:`_expire`), not one per call
        self._deadlines: collections.deque[tuple[float, asyncio.Future, str, float]] = collections.deque()
        self._watchdog: asyncio.TimerHandle | None = None
        self._batching = True
        self._batch_layouts = True  # a master of the release before takes no layouts in a Batch
        self._batch_writes = True  # ... nor block allocations and file commits
        self._flush_soon = False  # a flush is scheduled for the next loop turn
        self._streaming = True  # batches go on a BatchStream (a master of the release before has none)
        self._streams: dict[int, Any] = {}  # master index -> its open BatchStream call
        self._stream_busy = False  # a batch is on a stream (one at a time: answers come in order)
        self.failovers = 0  # calls that had to go to another master (a metric for tests and benchmarks)
        self._last_error: E.PCacheError | None = None  # why the last call that failed over failed

    def _learn(self, leader: str) -> None:
        """Add the leader a master named to the masters this client calls (it was given one
        address: a mount given the first master of a pair failed every call for good once the
        other led)."""
        try:
            check_addresses(leader)
        except E.InvalidArgument:
            return
        logger.warning(
            "master %s named the leader %s, which the client's master list leaves out: following it"
            " (give every master: --master A,B)", self.addresses[0], leader,
        )  # fmt: skip
        channel = tls_channel(leader, self.tls, channel_options(retries=False))
        self.addresses.append(leader)
        self.channels.append(channel)
        self.stubs.append(pb_grpc.MasterStub(channel))

    @property
    def address(self) -> str:
        """The master calls go to now."""
        return self.addresses[self.current]

    @property
    def stub(self) -> pb_grpc.MasterStub:
        return self.stubs[self.current]

    def _next_request_id(self) -> str:
        """A request id of this client's that no other call of it has."""
        return f"{self.client_id}:{next(self._request_ids)}"

    def header(self) -> pb.RequestHeader:
        """Request header for the next call."""
        return pb.RequestHeader(epoch=self.epoch, client_id=self.client_id)

    async def _call(self, name: str, request):
        try:
            return await self._routed(name, request)
        except E.PermissionDenied:
            if not self._reload_token():
                raise
            return await self._routed(name, request)  # refused, so not applied: once more, with the new one
        except E.PCacheError as exc:
            if not (exc.setup_refused and self._redial()):
                raise
            return await self._routed(name, request)  # no connection was set up: nothing reached a master

    def _redial(self) -> bool:
        """After the masters refused this client's TLS as the connection was set up: read its
        TLS directory again and, when it changed (a renewed certificate, a new CA bundle), dial
        every master again with it (the data plane's context takes it too). True when it did:
        a mount outlived its certificate and stayed refused until remounted."""
        if self.tls is None:
            return False
        try:
            if not self.tls.reload():
                return False
        except E.InvalidArgument as exc:
            logger.warning("%s", exc)
            return False
        logger.info(
            "the masters refused the client's TLS, and %s holds other files now: dialling again", self.tls.directory
        )
        old = self.channels
        options = channel_options(retries=len(self.addresses) == 1)
        self.channels = [tls_channel(a, self.tls, options) for a in self.addresses]
        self.stubs = [pb_grpc.MasterStub(c) for c in self.channels]
        for index in list(self._streams):  # opened on the old channels
            self._drop_stream(index)
        self._closing.extend(asyncio.ensure_future(c.close(grace=STREAM_CLOSE_WAIT)) for c in old)
        return True

    def _reload_token(self) -> bool:
        """Find the token again after a refusal, when the config named none (it came from
        ``$PCACHE_TOKEN_FILE`` or the tokens file): True when it is another one now. A key
        rotation's revocation (the guide: mint again into the files, rotate again) left every
        mount refused until remounted."""
        if self.cfg.token:
            return False
        try:
            token = find_token(self.cfg.master)
        except E.InvalidArgument:
            return False
        if not token or token == self.token:
            return False
        logger.info("the client's token was refused, and its file holds another one now: using it")
        self.token = token
        for index in list(self._streams):  # opened with the old one
            self._drop_stream(index)
        return True

    async def _routed(self, name: str, request):
        if name in MUTATIONS and not request.header.request_id:
            # one id for every try: gRPC's own retry of a call answered UNAVAILABLE (one master),
            # the next master's (several), each gets the stored answer of a mutation applied before
            request.header.request_id = self._next_request_id()
        if len(self.addresses) == 1:  # one master: no failover (gRPC retries a call it lost)
            try:
                return await self._call_one(0, name, request)
            except E.NotLeader as exc:  # one master of a pair given: follow the leader it names
                if not exc.leader or exc.leader in self.addresses:
                    raise
                if self.cfg.failover_timeout <= 0:  # told not to fail over: say how it would
                    err = E.NotLeader(f"{exc.message}; give the client every master (--master A,B) to follow failovers")
                    err.leader = exc.leader
                    raise err from exc
                self._learn(exc.leader)  # refused, so not applied: sent again below
        deadline = time.monotonic() + self.cfg.failover_timeout
        delay = 0.05
        tried = 0
        refused: collections.Counter[int] = collections.Counter()  # masters that refused the connection's set-up
        while True:
            index = self.current
            try:
                reply = await self._attempt(index, name, request)
                if tried:
                    self.failovers += 1
                return reply
            except _Moved as moved:
                tried += 1
                self.current = moved.index
            except (E.StoreUnavailable, E.StoreTimeout):
                raise  # the under-store's failure, said by a live leader: every master would say the same
            except FAILOVER_ERRORS + (E.Timeout,) as exc:
                self._last_error = exc
                if isinstance(exc, E.Timeout) and name not in MUTATIONS and name not in _IDEMPOTENT:
                    raise
                if time.monotonic() + delay > deadline:
                    raise
                if exc.setup_refused:  # a TLS mismatch: every master refusing twice is no failover
                    if self._redial():  # ... unless its TLS files changed: a renewal, a CA rotation
                        refused.clear()
                        continue
                    refused[index] += 1
                    if len(refused) == len(self.addresses) and min(refused.values()) >= SETUP_REFUSALS:
                        raise
                else:
                    refused.clear()
                tried += 1
                self.current = self._next_master(index, exc)
                if tried % len(self.addresses) == 0:  # every master refused: wait for an election
                    await asyncio.sleep(delay)
                    delay = min(0.2, delay * 2)

    async def _attempt(self, index: int, name: str, request):
        """One call to master ``index``; while it hangs (a SIGSTOPped or cut-off leader keeps the
        connection open), ask the others whether one leads with a newer epoch, and go there."""
        task = asyncio.ensure_future(self._call_one(index, name, request))
        try:
            done, _ = await asyncio.wait({task}, timeout=PROBE_AFTER)
            while not done:
                newer = await self._newer_leader(index)
                if newer is not None:
                    raise _Moved(newer)
                done, _ = await asyncio.wait({task}, timeout=PROBE_AFTER)
            return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _newer_leader(self, stuck: int) -> int | None:
        """Index of a master other than ``stuck`` that leads with an epoch newer than seen, or None."""
        for index in range(len(self.addresses)):
            if index == stuck:
                continue
            try:
                reply = await self._own_status(index, PROBE_AFTER)
            except E.PCacheError:
                continue
            if reply.master.role == "leader" and reply.epoch > self.epoch:
                return index
        return None

    async def _own_status(self, index: int, timeout: float) -> pb.ClusterStatus:
        """Master ``index``'s own status, follower or not (no failover to another)."""
        request = pb.ClusterStatusRequest(header=self.header(), any_master=True)
        reply, _ = await call_stamped(
            self.stubs[index].GetClusterStatus, request, timeout=timeout, target=f"master {self.addresses[index]}",
            token=self.token,
        )  # fmt: skip
        return reply

    def _next_master(self, index: int, exc: E.PCacheError) -> int:
        """The master to try after ``index`` failed with ``exc``: the leader it named (learned
        when the client's list leaves it out: a pair restarted on other ports), else the next."""
        hint = getattr(exc, "leader", "")
        if hint and hint not in self.addresses and isinstance(exc, E.NotLeader):
            self._learn(hint)
        if hint in self.addresses and hint != self.addresses[index]:
            return self.addresses.index(hint)
        return (index + 1) % len(self.addresses)

    async def _call_one(self, index: int, name: str, request):
        request.header.epoch = self.epoch
        address = self.addresses[index]
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)
        async with self._slots:
            reply, epoch = await call_stamped(
                getattr(self.stubs[index], name), request, timeout=self.cfg.rpc_timeout, target=f"master {address}",
                token=self.token,
            )  # fmt: skip
        if epoch and epoch < self.epoch:
            raise E.StaleEpoch(f"master {address} answered with epoch {epoch}, older than {self.epoch} (deposed)")
        self.epoch = max(self.epoch, epoch)
        self.current = index
        return reply

    async def close(self) -> None:
        """Close the batch streams (each ended by both sides: a cancelled one leaves gRPC callbacks
        behind on a loop about to close) and the channels."""
        for index, stream in list(self._streams.items()):
            if stream.done():  # ended already (cancelled, failed): nothing to wait for
                self._drop_stream(index)
                continue
            try:
                async with asyncio.timeout(STREAM_CLOSE_WAIT):
                    await stream.done_writing()
                    await stream.read()  # the master's end of it
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
                pass
            self._drop_stream(index)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for channel in self.channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def stat(self, path: str) -> pb.Inode:
        request = pb.PathRequest(header=self.header(), path=path)
        return await self._coalesced("Stat", request, pb.BatchOp(stat=request))

    async def mkdir(self, path: str, mode: int, parents: bool, owner: pb.Owner | None = None) -> pb.Inode:
        return await self._call(
            "Mkdir", pb.MkdirRequest(header=self.header(), path=path, mode=mode, parents=parents, owner=owner)
        )

    async def create(
        self,
        path: str,
        *,
        mode: int,
        exclusive: bool,
        truncate: bool,
        block_size: int,
        replication: int,
        owner: pb.Owner | None = None,
        kind: pb.FileType = pb.REGULAR,
        rdev: int = 0,
    ) -> pb.Inode:
        request = pb.CreateRequest(
            header=self.header(),
            path=path,
            mode=mode,
            exclusive=exclusive,
            truncate=truncate,
            block_size=block_size,
            replication=replication,
            owner=owner,
            type=kind,
            rdev=rdev,
        )
        # answered once even if its batch is sent again (a stream that broke after the master
        # applied it; a failover): the master keeps the answer under the id
        request.header.request_id = self._next_request_id()
        return await self._coalesced("Create", request, pb.BatchOp(create=request))

    # ------------------------------------------------------------ batching --
    # Nagle's algorithm for metadata: a call with nothing in flight goes out alone at once; calls
    # made while one is in flight wait for it and then leave together in one Batch RPC, joined by
    # the next calls of the callers its answer woke (the flush waits one event-loop turn for
    # them, or every batch would carry only half the callers). A lone caller sees no added
    # latency; many concurrent callers (data loader workers, FUSE threads, checkpoint ranks of
    # one process) share round trips, and the master's commit wait.

    async def _coalesced(self, name: str, request, op: pb.BatchOp) -> Any:
        if not self._batching:
            return await self._call(name, request)
        if self._inflight == 0 and not self._flush_soon:
            self._inflight += 1
            if self._streaming:  # alone: a batch of one on the stream (its answer ends _inflight)
                alone: asyncio.Future = asyncio.get_running_loop().create_future()
                alone.add_done_callback(_retrieved)  # set, and unread when this caller is cancelled
                await self._send_batch([(op, alone)])
                return alone.result()
            try:
                return await self._call(name, request)
            finally:
                self._inflight -= 1
                if self._queued:  # callers waited for this one: its caller's next call joins them
                    self._flush_later()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queued.append((op, future))
        # A caller queued behind a call that fails over waits for it, then for its own batch: each
        # may take the whole failover budget. Its own deadline counts from its call. The caller
        # awaits the future itself, not ``wait_for``: it resumes in the very turn its batch is
        # answered (``wait_for`` woke it two turns later, after the next flush had gone: its next
        # call then went out alone, and every other round trip carried one op).
        budget = self.cfg.failover_timeout if len(self.addresses) > 1 else self.cfg.rpc_timeout
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()
        deadlines.append((loop.time() + budget + 1.0, future, name, budget))
        if self._watchdog is None:
            self._watchdog = loop.call_at(deadlines[0][0], self._expire)
        return await future

    def _expire(self) -> None:
        """Fail the queued callers whose deadline passed (Unavailable, naming the last failure),
        and set the timer for the next one."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, future, name, budget = deadlines.popleft()
            if not future.done():
                last = self._last_error
                future.set_exception(
                    E.Unavailable(
                        f"no master answered {name} within {budget + 1.0:.0f} s" + (f" (last: {last})" if last else "")
                    )
                )
        if deadlines:
            self._watchdog = loop.call_at(deadlines[0][0], self._expire)

    def _flush(self) -> None:
        if self._inflight or not self._queued:
            return
        batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
        batch = [(op, f) for op, f in batch if not f.done()]  # callers that gave up
        if not batch:
            self._flush()
            return
        self._inflight += 1
        asyncio.ensure_future(self._send_batch(batch))

    async def _send_batch(self, batch: list[tuple[pb.BatchOp, asyncio.Future]]) -> None:
        try:
            try:
                request = pb.BatchRequest(header=self.header(), ops=[op for op, _ in batch])
                try:
                    results = list((await self._on_stream(request)).results)
                except _NoStream:  # sent the ordinary way: a batch of one is its plain call
                    for op in request.ops:  # which gRPC may retry: each create answered once
                        if op.HasField("create") and not op.create.header.request_id:
                            op.create.header.request_id = self._next_request_id()
                    if len(batch) == 1:
                        results = [await self._one_of(batch[0][0])]
                    else:
                        results = list((await self._call("Batch", request)).results)
            except E.NotSupported:  # a master without Batch: one call each from now on
                self._batching = False
                results = [await self._one_of(op) for op, _ in batch]
            for i, ((op, _), result) in enumerate(zip(batch, results, strict=True)):
                if _unknown_op(result):  # a master older than layouts (allocations, commits) in Batch
                    if op.HasField("layout"):
                        self._batch_layouts = False
                    else:
                        self._batch_writes = False
                    results[i] = await self._one_of(op)
            for (op, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                elif result.error:
                    future.set_exception(E.from_name(result.error, result.message))
                else:
                    future.set_result(_answer(op, result))
        except E.PCacheError as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        except BaseException as exc:  # cancelled with the client: nobody may wait forever
            for _, future in batch:
                if not future.done():
                    future.set_exception(E.Unavailable(f"batch abandoned: {exc!r}"))
            raise
        finally:
            self._inflight -= 1
            self._flush_later()

    async def _on_stream(self, request: pb.BatchRequest) -> pb.BatchResponse:
        """Send one batch as a message on this client's ``BatchStream`` to the master that
        answered last, and return its answer.

        A stream that fails is dropped (the next batch opens another). Its batch is then sent
        the ordinary way (``Batch``, or a batch of one's plain call, which fail over) when that
        applies nothing twice: the master answered with an error, or each op is a read or a
        create with a request id (every create has one: a master that applied it before the
        stream broke answers it from its record). Otherwise (a create without one, no answer)
        the batch fails with the connection's error, as a lone call would. With several masters a stream waits at most ``PROBE_AFTER`` seconds for its
        answer before the ordinary call's failover takes over (a SIGSTOPped leader keeps its
        connections open).

        Raises:
            _NoStream: send it the ordinary way (no stream: a master of a release without
                ``BatchStream``, or one batch already on it; or a failure that allows it).
            Unavailable, Timeout: the stream broke or did not answer, and the batch may not be
                sent again.
        """
        if not self._streaming or self._stream_busy:
            raise _NoStream
        index = self.current
        request.header.epoch = self.epoch
        address = self.addresses[index]
        wait = self.cfg.rpc_timeout if len(self.addresses) == 1 else min(self.cfg.rpc_timeout, PROBE_AFTER)
        self._stream_busy = True
        try:
            async with asyncio.timeout(wait):
                stream = await self._stream(index)
                try:
                    await stream.write(request)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:  # ended before it went
                    self._drop_stream(index)
                    raise _NoStream from exc
                reply = await stream.read()
        except asyncio.CancelledError:  # the caller gave up: its answer may still come on this stream
            self._drop_stream(index)
            raise
        except grpc.aio.AioRpcError as exc:
            self._drop_stream(index)
            err = translate_stamped(exc, f"master {address}")
            if isinstance(err, E.NotSupported):  # a master of a release without the stream
                self._streaming = False
                raise _NoStream from exc
            if _answered(exc) or _resendable(request):
                raise _NoStream from exc
            raise err from exc
        except TimeoutError as exc:
            self._drop_stream(index)
            if _resendable(request) and len(self.addresses) > 1:  # the others are asked who leads
                raise _NoStream from exc
            # one master that did not answer within the whole deadline: sent again, the same
            # wait again (`--timeout 3` failed after 6 s)
            raise E.Timeout(f"master {address} did not answer a batch within {wait:g} s") from exc
        finally:
            self._stream_busy = False
        if reply is grpc.aio.EOF or (reply.epoch and reply.epoch < self.epoch):
            # ended without an error: the master ended it before reading this batch (an idle
            # stream: ``master.batch_stream_idle``); or a deposed leader's answer: the ordinary
            # call hears StaleEpoch, and fails over
            self._drop_stream(index)
            raise _NoStream
        self.epoch = max(self.epoch, reply.epoch)
        self.current = index
        return reply

    async def _stream(self, index: int) -> Any:
        """This client's open ``BatchStream`` to master ``index``, opened when there is none.

        A new stream waits for the master's initial metadata, which it sends once the caller's
        token passed: a refusal (or a master without the method) then ends the stream before a
        message races it (gRPC reports a write that loses that race as INTERNAL, not with the
        master's status).

        Raises:
            grpc.aio.AioRpcError: the master refused the stream.
        """
        stream = self._streams.get(index)
        if stream is None:
            stream = self.stubs[index].BatchStream(metadata=bearer(self.token))
            self._streams[index] = stream
            await stream.initial_metadata()
            if stream.done():
                await stream.read()  # raises the master's status
        return stream

    def _drop_stream(self, index: int) -> None:
        stream = self._streams.pop(index, None)
        if stream is not None:
            stream.cancel()

    def _flush_later(self) -> None:
        """Flush once the callers this batch woke have run: their next calls join the next batch."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = False
        self._flush()

    async def _one_of(self, op: pb.BatchOp) -> pb.BatchResult | E.PCacheError:
        try:
            kind = op.WhichOneof("op")
            if kind == "layout":
                return pb.BatchResult(layout=await self._call("GetLayout", op.layout))
            if kind == "stat":
                return pb.BatchResult(inode=await self._call("Stat", op.stat))
            if kind == "allocate":
                return pb.BatchResult(location=await self._call("AllocateBlock", op.allocate))
            if kind == "commit":
                return pb.BatchResult(inode=await self._call("CommitFile", op.commit))
            return pb.BatchResult(inode=await self._call("Create", op.create))
        except E.PCacheError as exc:
            return exc

    async def symlink(self, path: str, target: str, owner: pb.Owner | None = None) -> pb.Inode:
        return await self._call(
            "Symlink", pb.SymlinkRequest(header=self.header(), path=path, target=target, owner=owner)
        )

    async def link(self, src: str, dst: str) -> pb.Inode:
        return await self._call("Link", pb.LinkRequest(header=self.header(), src=src, dst=dst))

    async def listdir(self, path: str, start_after: str = "", limit: int = 0) -> pb.ListDirResponse:
        return await self._call(
            "ListDir", pb.ListDirRequest(header=self.header(), path=path, start_after=start_after, limit=limit)
        )

    async def rename(self, src: str, dst: str, no_replace: bool = False) -> pb.Inode:
        return await self._call(
            "Rename", pb.RenameRequest(header=self.header(), src=src, dst=dst, no_replace=no_replace)
        )

    async def delete(self, path: str, *, recursive: bool = False, directory: bool = False, file: bool = False) -> None:
        await self._call(
            "Delete",
            pb.DeleteRequest(header=self.header(), path=path, recursive=recursive, directory=directory, file=file),
        )

    async def setattr(self, request: pb.SetAttrRequest) -> pb.Inode:
        request.header.CopyFrom(self.header())
        return await self._call("SetAttr", request)

    async def layout(self, path: str = "", inode: int = 0, exclude_fetchers: Iterable[str] = ()) -> pb.FileLayout:
        request = pb.LayoutRequest(header=self.header(), path=path, inode=inode, exclude_fetchers=exclude_fetchers)
        if not self._batch_layouts:
            return await self._call("GetLayout", request)
        return await self._coalesced("GetLayout", request, pb.BatchOp(layout=request))

    async def allocate_block(
        self, inode: int, size_hint: int, client_node: str, exclude: list[str]
    ) -> pb.BlockLocation:
        request = pb.AllocateBlockRequest(
            header=self.header(), inode=inode, size_hint=size_hint, client_node=client_node, exclude_workers=exclude
        )
        if not self._batch_writes:
            return await self._call("AllocateBlock", request)
        return await self._coalesced("AllocateBlock", request, pb.BatchOp(allocate=request))

    async def commit_file(
        self,
        inode: int,
        size: int,
        blocks: list[pb.CommittedBlock],
        mtime: float = 0.0,
        *,
        base_version: int = 0,
        base_blocks: list[int] | None = None,
        replace: bool = False,
        path: str = "",
        closing: bool = False,
    ) -> pb.Inode:
        request = pb.CommitFileRequest(
            header=self.header(),
            path=path,
            closing=closing,
            inode=inode,
            size=size,
            blocks=blocks,
            mtime=mtime,
            base_version=base_version,
            base_blocks=base_blocks or [],
            replace=replace,
        )
        if not self._batch_writes:
            return await self._call("CommitFile", request)
        request.header.request_id = self._next_request_id()  # answered once, as a create
        return await self._coalesced("CommitFile", request, pb.BatchOp(commit=request))

    async def abandon_blocks(self, inode: int, block_ids: list[int]) -> None:
        request = pb.AbandonBlocksRequest(header=self.header(), inode=inode, block_ids=block_ids)
        await self._call("AbandonBlocks", request)

    async def report_bad_block(self, worker_id: str, block_id: int) -> None:
        await self._call("ReportBadBlock", pb.BlockReport(header=self.header(), worker_id=worker_id, block_id=block_id))

    async def fsck(self, path: str = "/") -> pb.FsckReport:
        return await self._call("Fsck", pb.FsckRequest(header=self.header(), path=path))

    async def cluster_status(self) -> pb.ClusterStatus:
        status = await self._call("GetClusterStatus", pb.ClusterStatusRequest(header=self.header()))
        self.epoch = max(self.epoch, status.epoch)
        return status

    # tenants (an admin token's calls)

    async def create_tenant(
        self, name: str, root: str = "", *, quota_bytes: int = 0, quota_inodes: int = 0
    ) -> pb.Tenant:
        spec = pb.Tenant(name=name, root=root, quota_bytes=quota_bytes, quota_inodes=quota_inodes)
        return (await self._call("CreateTenant", pb.TenantRequest(header=self.header(), tenant=spec))).tenant

    async def delete_tenant(self, name: str, *, purge: bool = False) -> None:
        await self._call(
            "DeleteTenant", pb.TenantRequest(header=self.header(), tenant=pb.Tenant(name=name), purge=purge)
        )

    async def set_quota(self, name: str, *, quota_bytes: int, quota_inodes: int) -> pb.Tenant:
        spec = pb.Tenant(name=name, quota_bytes=quota_bytes, quota_inodes=quota_inodes)
        return (await self._call("SetQuota", pb.TenantRequest(header=self.header(), tenant=spec))).tenant

    async def list_tenants(self) -> list[pb.Tenant]:
        return list((await self._call("ListTenants", pb.ClusterStatusRequest(header=self.header()))).tenants)

    async def bind(self, path: str, uri: str, *, mode: str, meta_ttl: float, check: bool) -> pb.Bind:
        spec = pb.Bind(path=path, uri=uri, mode=mode, meta_ttl=meta_ttl)
        return await self._call("BindPath", pb.BindRequest(header=self.header(), bind=spec, check=check))

    async def unbind(self, path: str, *, force: bool = False) -> None:
        await self._call("UnbindPath", pb.BindRequest(header=self.header(), bind=pb.Bind(path=path), force=force))

    async def refresh(self, path: str) -> pb.Inode:
        return await self._call("RefreshPath", pb.PathRequest(header=self.header(), path=path))

    async def free(self, path: str) -> pb.FreeReport:
        return await self._call("FreePath", pb.PathRequest(header=self.header(), path=path))

    async def list_binds(self) -> list[pb.Bind]:
        return list((await self._call("ListBinds", pb.ClusterStatusRequest(header=self.header()))).binds)

    async def issue_token(self, name: str, ttl: float = 0.0) -> str:
        request = pb.TenantRequest(header=self.header(), tenant=pb.Tenant(name=name), token_ttl=ttl)
        return (await self._call("IssueToken", request)).token

    async def revoke_tokens(self, name: str) -> pb.Tenant:
        request = pb.TenantRequest(header=self.header(), tenant=pb.Tenant(name=name))
        return (await self._call("RevokeTokens", request)).tenant

    async def master_statuses(self) -> list[tuple[str, pb.ClusterStatus | E.PCacheError]]:
        """Ask every master (not only the leader) for its status: (address, status or error)."""
        out: list[tuple[str, pb.ClusterStatus | E.PCacheError]] = []
        for index, address in enumerate(self.addresses):
            try:
                out.append((address, await self._own_status(index, self.cfg.rpc_timeout)))
            except E.PCacheError as exc:
                out.append((address, exc))
        return out


class _Moved(Exception):
    """Another master leads now: send the call there."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


# reads: safe to send again to another master after a timeout
_IDEMPOTENT = frozenset(
    {
        "Stat",
        "ListDir",
        "GetLayout",
        "GetClusterStatus",
        "Fsck",
        "Batch",
        "ListTenants",
        "IssueToken",
        "ListBinds",
        "RefreshPath",
        "AbandonBlocks",
    }
)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class _NoStream(Exception):
    """A batch to send the ordinary way, not on the stream (:meth:`MasterClient._on_stream`)."""


def _answered(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call's status came from the master (a PCache error it raised)."""
    return any(key == ERROR_KEY for key, _ in exc.trailing_metadata() or ())


def _resendable(request: pb.BatchRequest) -> bool:
    """Whether sending ``request`` again applies nothing twice: reads, allocations (one sent
    again gets another block; the first one's reservation expires unused, as after a retried
    ``AllocateBlock``), and creates and commits whose request id the master answers once."""
    for op in request.ops:
        kind = op.WhichOneof("op")
        if kind in ("create", "commit") and not getattr(op, kind).header.request_id:
            return False
    return True


def _answer(op: pb.BatchOp, result: pb.BatchResult) -> Any:
    """What a batched call returns: its op's part of the result."""
    kind = op.WhichOneof("op")
    if kind == "layout":
        return result.layout
    if kind == "allocate":
        return result.location
    return result.inode


def _unknown_op(result: pb.BatchResult | E.PCacheError) -> bool:
    """Whether a Batch result is a master's refusal of an op it does not know."""
    return (
        isinstance(result, pb.BatchResult)
        and result.error == "InvalidArgument"
        and (result.message.startswith("unknown batch op"))
    )
