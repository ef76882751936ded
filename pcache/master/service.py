"""The master's gRPC edge: translate requests, delegate to the domain objects.

Nothing here decides anything: :class:`~pcache.master.namespace.Namespace`
owns the tree, :class:`~pcache.master.registry.WorkerRegistry` the workers and
placement, :class:`~pcache.master.blocks.BlockManager` the replicas, and
:class:`~pcache.master.server.MasterServer` whether this master leads and when
a change is replicated. Every answer that shows or follows a change waits
until the change is on the in-sync follower (``commit``), so no client ever
sees state a failover could undo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from pcache.common import errors as E
from pcache.common import ufs
from pcache.common.auth import MAX_CLOCK_SKEW, Claims, mint_block_token, mint_token
from pcache.common.layout import HOLE
from pcache.common.metrics import RPC_SECONDS
from pcache.common.paths import normalize
from pcache.common.rpc import MAX_BATCH, rpc_method, rpc_stream_method
from pcache.master import fsck
from pcache.master.binds import check_uri
from pcache.master.blocks import BlockManager
from pcache.master.namespace import Namespace
from pcache.master.tenants import ADMIN, Scope, Tenants
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from pcache.master.server import MasterServer

R = TypeVar("R", bound=Message)
logger = logging.getLogger(__name__)
# seconds a client's call waits for the under-store (below clients' 10 s rpc_timeout: the caller
# hears the store's failure, not its own deadline blaming the master)
UFS_CLIENT_WAIT = 8.0
# once a bind's store left a call unanswered, for OUTAGE_MEMORY seconds the paths the cache knows
# there are answered without it, and other names wait this long (seconds) for it: a checkpoint's
# files or a dataset's reads during an outage are not 8 s each; a store back answers well within it
UFS_OUTAGE_WAIT = 1.0
OUTAGE_MEMORY = 30.0
# right after a master (re)started, a layout naming no live copy of a block waits this long at most
# (seconds; below clients' 10 s rpc_timeout) for the workers' registrations (MasterServer.reports_left)
REPORT_WAIT = 5.0
REPORT_POLL = 0.05


_CLIENT = frozenset({"tenant", "admin"})
_LOOKUPS = frozenset({"stat", "create", "layout"})  # batch ops that name a path (checked against its bind first)
MAX_ABANDON = 4096  # block ids one AbandonBlocks may name
# who may call each method (:class:`pcache.common.auth.Guard`; a method missing here is refused)
MASTER_SCOPES: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        (
            "Stat",
            "Mkdir",
            "Create",
            "Symlink",
            "Link",
            "ListDir",
            "Rename",
            "Delete",
            "SetAttr",
            "GetLayout",
            "AllocateBlock",
            "CommitFile",
            "AbandonBlocks",
            "Batch",
            "BatchStream",
            "GetClusterStatus",
        ),
        _CLIENT,
    ),  # fmt: skip
    "ReportBadBlock": frozenset({"tenant", "admin", "worker"}),  # a client or a worker found a bad replica
    **dict.fromkeys(
        (
            "RegisterWorker",
            "Heartbeat",
            "BlockReceived",
            "ReportBlocks",
            "UfsBlockSource",
            "UfsBlockSources",
            "ReleaseSpace",
            "ReportPersist",
        ),
        frozenset({"worker"}),
    ),
    "Fsck": _CLIENT,
    **dict.fromkeys(
        ("CreateTenant", "DeleteTenant", "SetQuota", "ListTenants", "IssueToken", "RevokeTokens"), frozenset({"admin"})
    ),
    # the under-store is read with the hosts' credentials: only an admin aims them (pcache.master.binds)
    **dict.fromkeys(("BindPath", "UnbindPath"), frozenset({"admin"})),
    **dict.fromkeys(("ListBinds", "RefreshPath", "FreePath"), _CLIENT),
}

# the verified claims of the call being served (set by ``authorize``; each RPC runs in its own task)
_CALLER: ContextVar[Claims | None] = ContextVar("pcache_master_caller", default=None)
Apply = Callable[[Namespace, BlockManager, Scope], R]


class MasterServicer(pb_grpc.MasterServicer):
    """gRPC servicer of ``pcache.Master`` over one :class:`MasterServer`."""

    def __init__(self, master: MasterServer) -> None:
        self.m = master
        self._unanswered: dict[str, float] = {}  # bind path -> when its store last did not answer
        self._warned: dict[str, float] = {}  # bind path -> when its outage was last logged

    def authorize(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Refuse a caller whose token may not call ``method`` (:data:`MASTER_SCOPES`).

        Raises:
            PermissionDenied: no token, an invalid, expired or other cluster's one, or a scope
                the method does not accept.
        """
        _CALLER.set(self.m.guard.authorize(method, context.invocation_metadata()))

    @staticmethod
    def _scope(ns: Namespace) -> Scope:
        """The namespace the caller may use: its tenant's root, or all of it for an admin.

        Raises:
            PermissionDenied: a tenant that does not exist (deleted: its tokens are revoked), or
                a token without a namespace (a worker's).
        """
        claims = _CALLER.get()
        if claims is not None and claims.scope == "admin":
            return ADMIN
        if claims is not None and claims.scope == "tenant":
            return ns.tenants.scope(claims.tenant, claims.issued)
        raise E.PermissionDenied(f"a {claims.scope if claims else 'missing'} token has no namespace")

    def block_token(self, block_id: int, ops: str, tenant: str, workers: list[str], *, length: int = 0) -> str:
        """A block token for ``ops`` on ``block_id`` at ``workers`` ("" when there is no worker);
        a write must store exactly ``length`` bytes. A write token lives no longer than the
        allocation's reservation (``orphan_grace``): past it the bytes would no longer be charged."""
        if not workers:
            return ""
        ttl = self.m.cfg.block_token_ttl
        if "w" in ops:
            ttl = min(ttl, self.m.cfg.orphan_grace)
        revoked = self.m.ns.tenants.revoked.get(tenant, 0) if self.m.ns is not None and tenant else 0
        issued = max(int(time.time() * 1000), revoked) if revoked else 0  # the workers check it (b3)
        return mint_block_token(
            self.m.block_signer, block_id, ops, tenant or "cluster", ttl, workers, length=length, issued_ms=issued
        )

    def revocations(self) -> dict[str, int]:
        """The tenants' token revocations the workers enforce on block tokens (a follower reads
        them from its replica of the records: a worker that registers with it first, its leader
        away, takes them with its keys)."""
        tenants = self.m.ns.tenants if self.m.ns is not None else Tenants(self.m.store)
        return tenants.for_workers(self.m.cfg.block_token_ttl + MAX_CLOCK_SKEW)

    @property
    def epoch(self) -> int:
        """The epoch stamped on every answer (:func:`rpc_method`)."""
        return self.m.epoch

    def _check(self, header: pb.RequestHeader, method: str) -> None:
        """A leader refuses a caller that has seen a newer epoch: it has been deposed."""
        RPC_SECONDS.labels(method)  # create the series on first use
        if header.epoch > self.m.epoch and self.m.is_leading():
            raise E.StaleEpoch(f"master epoch {self.m.epoch} is older than the caller's {header.epoch}")

    async def _ready(self, *paths: str, new: tuple[str, ...] = ()) -> None:
        """Bring the bound directories and files these caller paths look at up to date with their
        under-store first (:meth:`pcache.master.understore.UnderStores.ready`); nothing when no
        directory is bound. The store is waited for at most :data:`UFS_CLIENT_WAIT` seconds, so
        the caller hears the store's failure, not its own deadline blaming the master.

        A store that does not answer (refuses, fails, times out) does not stop what the cache
        already knows (stale-if-error, as HTTP caches do): a path this master knows is answered
        as known, so cached files still open and read (their blocks are keyed by the version
        listed, never mixed with a newer one). For :data:`OUTAGE_MEMORY` seconds after such a
        failure the bind's known paths are answered without asking the store, and other names
        wait at most :data:`UFS_OUTAGE_WAIT` seconds for it.

        ``new``: the paths among them the call may create. Under a write-back bind whose store
        does not answer, a name this master does not know, in a directory it knows, is taken for
        a new one (its upload replaces whatever the store may hold under that key, as a write
        there would): checkpoints go on being written through a store outage.

        Raises:
            StoreTimeout, StoreUnavailable, NotFound, PermissionDenied: the store's answer, for
                a name only the store knows.
        """
        ns, _ = self.m.leading()
        if not ns.binds.inodes():
            return
        scope = self._scope(ns)
        for path in paths:
            if not path:
                continue
            inside = scope.inside(path)
            bind = ns.binds.covering(inside)
            wait = UFS_CLIENT_WAIT
            if bind is not None and self._store_down(bind.path):
                if self._known(inside):
                    continue
                wait = UFS_OUTAGE_WAIT
            try:
                await self._store_wait(self.m.ufs.ready(inside), wait)
            except (E.StoreUnavailable, E.StoreTimeout) as exc:
                if bind is not None:
                    self._unanswered[bind.path] = time.monotonic()
                if path in new and self._new_through_outage(inside, exc):
                    continue
                if self._known(inside):
                    self._warn_outage(bind, exc)
                    continue
                _outside(exc, scope)
                raise
            except E.PCacheError as exc:
                _outside(exc, scope)
                raise

    def _store_down(self, bind_path: str) -> bool:
        """Whether the store of the bind at ``bind_path`` failed to answer in the last :data:`OUTAGE_MEMORY` s."""
        return time.monotonic() - self._unanswered.get(bind_path, -OUTAGE_MEMORY) < OUTAGE_MEMORY

    def _known(self, path: str) -> bool:
        """Whether ``path`` names something this master knows (answered as known while its store is down)."""
        ns, _ = self.m.leading()
        try:
            node = ns.resolve(path)
        except E.NotLeader:
            raise
        except E.PCacheError:
            return False
        return node.type != pb.DIRECTORY or node.listed > 0 or ns.ufs_level(node) is None

    def _warn_outage(self, bind: pb.Bind | None, exc: E.PCacheError) -> None:
        """One log line per bind and :data:`OUTAGE_MEMORY` seconds while its store is down."""
        if bind is None:
            return
        now = time.monotonic()
        if now - self._warned.get(bind.path, -OUTAGE_MEMORY) >= OUTAGE_MEMORY:
            self._warned[bind.path] = now
            logger.warning("%s: under-store did not answer (%s); answering what the cache knows", bind.path, exc)

    @staticmethod
    async def _store_wait(aw: Awaitable[None], wait: float = UFS_CLIENT_WAIT) -> None:
        try:
            async with asyncio.timeout(wait):
                await aw
        except TimeoutError as exc:
            raise E.StoreTimeout(
                f"the under-store did not answer within {wait:g} s (the master keeps asking it)"
            ) from exc

    def _new_through_outage(self, path: str, exc: E.PCacheError) -> bool:
        """Whether a call may create ``path`` although its store did not answer (see :meth:`_ready`):
        under a write-back bind, when its nearest existing ancestor is a directory there (a
        ``mkdir -p`` of a new run's step directory makes the levels between as new names too)."""
        ns, _ = self.m.leading()
        bind = ns.binds.covering(path)
        if bind is None or bind.mode != "writeback" or normalize(path) == bind.path:
            return False
        ancestor = posixpath.dirname(normalize(path))
        while True:
            try:
                parent = ns.resolve(ancestor)
                break
            except E.NotFound:
                if ancestor == bind.path or ancestor == "/":
                    return False
                ancestor = posixpath.dirname(ancestor)
            except E.PCacheError:
                return False
        if parent.type != pb.DIRECTORY:
            return False
        logger.warning("%s: under-store did not answer (%s); created as a new name, to be uploaded", path, exc)
        return True

    async def _listing_ready(self, request: pb.ListDirRequest) -> None:
        """Before a page of a bound directory: the path up to date, and the store listed at least
        past that page (:meth:`UnderStores.page_ready`), within :data:`UFS_CLIENT_WAIT` seconds;
        a directory listed before is answered as known while its store does not answer (see :meth:`_ready`)."""
        ns, _ = self.m.leading()
        if not ns.binds.inodes():
            return
        scope = self._scope(ns)
        path = scope.inside(request.path)
        bind = ns.binds.covering(path)
        if bind is not None and self._store_down(bind.path) and self._known(path):
            return  # the store is down: the listing the cache has (see _ready)
        try:
            await self._store_wait(self.m.ufs.ready(path))
            ns, _ = self.m.leading()
            try:
                node = ns.resolve(path)
            except E.PCacheError:
                return  # the listing itself says why
            if node.type == pb.DIRECTORY:
                limit = min(request.limit or self.m.cfg.listdir_limit, self.m.cfg.listdir_limit)
                await self._store_wait(self.m.ufs.page_ready(node, request.start_after, limit))
        except (E.StoreUnavailable, E.StoreTimeout) as exc:
            if bind is not None:
                self._unanswered[bind.path] = time.monotonic()
            if not self._known(path):  # never listed: only the store can answer
                _outside(exc, scope)
                raise
            self._warn_outage(bind, exc)

    async def _read(self, header: pb.RequestHeader, method: str, apply: Apply[R]) -> R:
        ns, blocks = self.m.leading()
        self._check(header, method)
        scope = self._scope(ns)
        with RPC_SECONDS.labels(method).time():
            reply = _in_scope(apply, ns, blocks, scope)
            await self.m.commit()  # what it read is on the follower too
        return reply

    async def _mutate(
        self,
        header: pb.RequestHeader,
        method: str,
        reply_type: type[R],
        apply: Apply[R],
    ) -> R:
        """Apply a mutation once per request id, then wait until it is replicated."""
        ns, blocks = self.m.leading()
        self._check(header, method)
        scope = self._scope(ns)
        with RPC_SECONDS.labels(method).time():
            reply = self._apply_once(ns, blocks, scope, header, method, reply_type, apply)
            await self.m.commit()
        return reply

    def _apply_once(
        self,
        ns: Namespace,
        blocks: BlockManager,
        scope: Scope,
        header: pb.RequestHeader,
        method: str,
        reply_type: type[R],
        apply: Apply[R],
    ) -> R:
        # a request id is the caller's own: another tenant sending the same id is not answered
        # with this caller's reply (nor told that the id was used)
        claims = _CALLER.get()
        rid = f"{claims.scope}:{claims.tenant}/{header.request_id}" if claims is not None else header.request_id
        if header.request_id:
            done = self.m.replies.get(rid, method, reply_type)
            if done is not None:  # applied before (a retry, maybe on the master that took over)
                return done  # type: ignore[return-value]
        with self.m.store.one_batch():  # the mutation and its reply record: one local write
            since = self.m.store.last_written
            reply = _in_scope(apply, ns, blocks, scope)
            if header.request_id:
                self.m.replies.record(rid, method, reply, since)  # same log entry
        return reply

    # ---------------------------------------------------------- namespace --

    @rpc_method
    async def Stat(self, request: pb.PathRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        await self._ready(request.path)
        return await self._read(request.header, "Stat", lambda ns, _, scope: _stat(ns, scope, request.path))

    @rpc_method
    async def Mkdir(self, request: pb.MkdirRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.Inode:
            return ns.mkdir(
                scope.inside(request.path),
                request.mode,
                parents=request.parents,
                uid=request.owner.uid,
                gid=request.owner.gid,
            )

        await self._ready(request.path, new=(request.path,))
        return await self._mutate(request.header, "Mkdir", pb.Inode, apply)

    @rpc_method
    async def Create(self, request: pb.CreateRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        await self._ready(request.path, new=(request.path,))
        return await self._mutate(request.header, "Create", pb.Inode, _create(request))

    @rpc_method
    async def Batch(self, request: pb.BatchRequest, context: grpc.aio.ServicerContext) -> pb.BatchResponse:
        """Stats, creates, layouts, block allocations and file commits of a client's concurrent
        callers, in order, one commit wait for all.

        An error of one op is its own result (an under-store that fails one op's path too);
        losing the lease mid-batch fails the whole batch (the client sends it again to the new
        leader; its creates and commits are answered once, an allocation sent again gets
        another block).

        Raises:
            InvalidArgument: more than ``MAX_BATCH`` ops (one request must not hold the event loop
                that every tenant's calls and the workers' heartbeats share).
        """
        return await self._batch(request, _caller_deadline(context))

    @rpc_stream_method
    async def BatchStream(
        self, requests: AsyncIterator[pb.BatchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BatchResponse]:
        """:meth:`Batch` over one long-lived stream: each request answered in order, with this
        master's epoch in the answer. The caller's token is checked again for every request (a
        deleted tenant's stream stops at its next batch); an error of a whole batch ends the
        stream with its status, as it would end a ``Batch`` call. A stream idle for
        ``master.batch_stream_idle`` seconds is ended (status OK; the client opens another).

        gRPC's asyncio server costs a stream message about half a unary call on the same
        machine (``bench/README.md``, ``master_ha.py``): metadata-heavy clients spend half as
        much of the master's CPU on the transport.
        """
        await context.send_initial_metadata(())  # the token passed: the client may send (MasterClient._stream)
        incoming = aiter(requests)
        while True:
            try:
                async with asyncio.timeout(self.m.cfg.batch_stream_idle):
                    request = await anext(incoming)
            except (TimeoutError, StopAsyncIteration):  # idle (its next batch opens another), or closed
                return
            except DecodeError as exc:  # one line, not a traceback per message
                raise E.InvalidArgument(f"unparsable batch message: {exc}") from exc
            self.authorize("Batch", context)
            reply = await self._batch(request)
            reply.epoch = self.m.epoch
            yield reply

    async def _batch(self, request: pb.BatchRequest, caller_deadline: float | None = None) -> pb.BatchResponse:
        """The ops of one batch (``caller_deadline``: the caller's, ``time.monotonic()``; None:
        a stream's message, which has none of its own)."""
        if len(request.ops) > MAX_BATCH:
            raise E.InvalidArgument(f"a batch holds at most {MAX_BATCH} ops, not {len(request.ops)}")
        failed: dict[int, E.PCacheError] = {}

        async def ready(index: int, op: pb.BatchOp) -> None:
            kind = op.WhichOneof("op")
            if kind not in _LOOKUPS:  # a block of an inode the writer holds open: no name to look up
                return
            path = getattr(op, kind).path
            try:
                await self._ready(path, new=(path,) if kind == "create" else ())
            except E.NotLeader:
                raise
            except E.PCacheError as exc:
                failed[index] = exc

        if any(op.WhichOneof("op") in ("layout", "allocate") for op in request.ops):
            await self._workers_in(caller_deadline)
        ns, _ = self.m.leading()
        if ns.binds.inodes():  # the ops' store lookups at once: a hung store costs the batch one wait, not one each
            await asyncio.gather(*(ready(index, op) for index, op in enumerate(request.ops)))
        ns, blocks = self.m.leading()
        self._check(request.header, "Batch")
        scope = self._scope(ns)
        out = pb.BatchResponse()
        with RPC_SECONDS.labels("Batch").time():
            with self.m.store.one_batch():  # its mutations and their reply records: one local write
                for index, op in enumerate(request.ops):
                    result = out.results.add()
                    kind = op.WhichOneof("op")
                    try:
                        if index in failed:
                            raise failed[index]
                        if kind == "stat":
                            result.inode.CopyFrom(_in_scope(_stat_of(op.stat.path), ns, blocks, scope))
                        elif kind == "create":
                            node = self._apply_once(
                                ns, blocks, scope, op.create.header, "Create", pb.Inode, _create(op.create)
                            )
                            result.inode.CopyFrom(node)
                        elif kind == "layout":
                            self._ufs_blocks(op.layout)
                            result.layout.CopyFrom(_in_scope(self._layout_of(op.layout), ns, blocks, scope))
                        elif kind == "allocate":
                            result.location.CopyFrom(_in_scope(self._allocate(op.allocate), ns, blocks, scope))
                        elif kind == "commit":
                            commit = self._commit_file(op.commit)
                            node = self._apply_once(ns, blocks, scope, op.commit.header, "CommitFile", pb.Inode, commit)
                            result.inode.CopyFrom(node)
                        else:
                            raise E.InvalidArgument(f"unknown batch op {kind!r}")
                    except E.NotLeader:
                        raise
                    except E.PCacheError as exc:
                        result.error, result.message = type(exc).__name__, str(exc)
            await self.m.commit()
        for op, result in zip(request.ops, out.results, strict=True):
            if op.WhichOneof("op") == "layout" and not result.error and _unplaced(result.layout):
                result.layout.CopyFrom(await self._reported(op.layout, result.layout, caller_deadline))
        return out

    @rpc_method
    async def Symlink(self, request: pb.SymlinkRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.Inode:
            return ns.symlink(scope.inside(request.path), request.target, uid=request.owner.uid, gid=request.owner.gid)

        await self._ready(request.path, new=(request.path,))
        return await self._mutate(request.header, "Symlink", pb.Inode, apply)

    @rpc_method
    async def Link(self, request: pb.LinkRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.Inode:
            return ns.link(scope.inside(request.src), scope.inside(request.dst))

        return await self._mutate(request.header, "Link", pb.Inode, apply)

    @rpc_method
    async def ListDir(self, request: pb.ListDirRequest, context: grpc.aio.ServicerContext) -> pb.ListDirResponse:
        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.ListDirResponse:
            limit = min(request.limit or self.m.cfg.listdir_limit, self.m.cfg.listdir_limit)
            entries, truncated = ns.listdir(scope.inside(request.path), start_after=request.start_after, limit=limit)
            return pb.ListDirResponse(entries=entries, truncated=truncated)

        await self._listing_ready(request)
        return await self._read(request.header, "ListDir", apply)

    @rpc_method
    async def Rename(self, request: pb.RenameRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Inode:
            node, freed = ns.rename(scope.inside(request.src), scope.inside(request.dst), no_replace=request.no_replace)
            blocks.freed(freed)
            return node

        await self._ready(request.src, request.dst, new=(request.dst,))
        return await self._mutate(request.header, "Rename", pb.Inode, apply)

    @rpc_method
    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Empty:
            freed = ns.delete(
                scope.inside(request.path), recursive=request.recursive, directory=request.directory, file=request.file
            )
            blocks.freed(freed)
            return pb.Empty()

        await self._ready(request.path)
        return await self._mutate(request.header, "Delete", pb.Empty, apply)

    @rpc_method
    async def SetAttr(self, request: pb.SetAttrRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.Inode:
            return ns.setattr(
                scope.inside(request.path),
                mode=request.mode if request.HasField("mode") else None,
                mtime=request.mtime if request.HasField("mtime") else None,
                atime=request.atime if request.HasField("atime") else None,
                set_xattrs=dict(request.set_xattrs),
                remove_xattrs=list(request.remove_xattrs),
                uid=request.uid if request.HasField("uid") else None,
                gid=request.gid if request.HasField("gid") else None,
            )

        await self._ready(request.path)
        return await self._mutate(request.header, "SetAttr", pb.Inode, apply)

    # ------------------------------------------------------------- blocks --

    @rpc_method
    async def GetLayout(self, request: pb.LayoutRequest, context: grpc.aio.ServicerContext) -> pb.FileLayout:
        await self._ready(request.path)
        self._ufs_blocks(request)
        caller_deadline = _caller_deadline(context)
        await self._workers_in(caller_deadline)  # a bound file's uncached block names a live fetcher
        layout = await self._read(request.header, "GetLayout", self._layout_of(request))
        if _unplaced(layout):
            layout = await self._reported(request, layout, caller_deadline)
        return layout

    def _report_deadline(self, caller_deadline: float | None) -> float:
        """Until when (``time.monotonic()``) a call may wait for workers' registrations (:meth:`_reported`)."""
        now = time.monotonic()
        until = now + min(self.m.reports_left(), REPORT_WAIT)
        return until if caller_deadline is None else min(until, caller_deadline - 0.5)

    async def _workers_in(self, caller_deadline: float | None) -> None:
        """Right after this master started, while no worker has registered yet, wait for one, as
        :meth:`_reported` does: a new block (a checkpoint written just after a master restart)
        or a bound file's fetch gets a worker, not "no live worker". With none after the wait,
        the call goes on and says so."""
        self.m.leading()  # a follower says so at once
        deadline = self._report_deadline(caller_deadline)
        while time.monotonic() < deadline and not self.m.registry.alive():
            await asyncio.sleep(REPORT_POLL)

    async def _reported(
        self, request: pb.LayoutRequest, layout: pb.FileLayout, caller_deadline: float | None
    ) -> pb.FileLayout:
        """``layout``, with a block that names no live copy looked up again until one shows, while
        the workers report in: right after this master started (a restart, or a follower
        restarted just before it took over), a worker holding the block may not have registered
        with it yet, and the reader would fail with "no replica" a moment before it does. The wait
        ends when every block names a copy, after :meth:`MasterServer.reports_left` (workers
        register with every master, leader or follower, within a heartbeat or two of its start),
        after :data:`REPORT_WAIT` seconds, or half a second before ``caller_deadline``
        (``time.monotonic()``; None: none). Then the layout is answered as it is: a block with
        no copy is missing (HDFS likewise answers reads in safe mode with the replicas reported so far)."""
        deadline = self._report_deadline(caller_deadline)
        if time.monotonic() >= deadline:
            return layout
        while _unplaced(layout) and time.monotonic() < deadline:
            await asyncio.sleep(REPORT_POLL)
            ns, blocks = self.m.leading()
            layout = _in_scope(self._layout_of(request), ns, blocks, self._scope(ns))
        await self.m.commit()  # what it read is on the follower too
        return layout

    def _layout_of(self, request: pb.LayoutRequest) -> Apply[pb.FileLayout]:
        """A file's blocks, where each is and a block token for each (read; fetch too for a
        bound file's: an uncached block names the one worker that fetches it, and so does one
        whose every copy is on a worker in the request's ``exclude_fetchers``)."""

        exclude = frozenset(request.exclude_fetchers)

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.FileLayout:
            if not request.path:  # by number: another tenant's inode is refused before its kind shows
                _owned(scope, ns.get_inode(request.inode))
            node, metas = ns.layout(scope.inside(request.path) if request.path else "", request.inode)
            _owned(scope, node)
            out = pb.FileLayout(inode=node)
            for index, meta in enumerate(metas):
                if meta.block_id == HOLE:  # stores nothing: no replicas, no token
                    out.blocks.append(pb.BlockLocation(offset=index * node.block_size, length=meta.length))
                    continue
                replicas = [w.info.addr for w in blocks.live_replicas(meta.block_id)]
                holders = [a.worker_id for a in replicas] + [
                    w.worker_id for w in blocks.quarantined_live(meta.block_id)
                ]
                ops, uncached = "r", False
                if meta.block_id in blocks.ufs:  # a bound file's: a worker fetches it when none has it
                    ops = "fr"
                    blocks.touch((meta.block_id,))  # the most recently used: evicted last
                    if exclude and all(a.worker_id in exclude for a in replicas):
                        # every copy is on a worker the caller found down, which this master does
                        # not count dead yet: the store has the bytes (checked against the record)
                        replicas = []
                    if not replicas:
                        fetcher = blocks.fetcher(meta.block_id, exclude)
                        replicas, holders = [fetcher.info.addr], [fetcher.info.addr.worker_id]
                        uncached = True
                out.blocks.append(
                    pb.BlockLocation(
                        block_id=meta.block_id,
                        offset=index * node.block_size,  # a block may be shorter than its place: zeros follow
                        length=meta.length,
                        crc32c=meta.crc32c,
                        replicas=replicas,
                        token=self.block_token(meta.block_id, ops, node.tenant, holders),
                        uncached=uncached,
                    )
                )
            return out

        return apply

    def _ufs_blocks(self, request: pb.LayoutRequest) -> None:
        """Give a bound file its block records before its first layout (a mutation, replicated
        with the read's commit); any error is the layout's own to report."""
        ns, blocks = self.m.leading()
        if not ns.binds.inodes():
            return
        try:
            scope = self._scope(ns)
            node = ns.resolve(scope.inside(request.path)) if request.path else ns.get_inode(request.inode)
            if not scope.owns(node):
                return
            blocks.tracked_ufs(ns.ufs_blocks(node.id))
        except E.PCacheError:
            return

    @rpc_method
    async def AllocateBlock(
        self, request: pb.AllocateBlockRequest, context: grpc.aio.ServicerContext
    ) -> pb.BlockLocation:
        # not answered from a stored reply: a retry gets a second block id, and the first one's
        # reservation expires unused (master.orphan_grace)
        await self._workers_in(_caller_deadline(context))
        return await self._read(request.header, "AllocateBlock", self._allocate(request))

    def _allocate(self, request: pb.AllocateBlockRequest) -> Apply[pb.BlockLocation]:
        """The allocation of one AllocateBlock request (alone or in a Batch)."""

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.BlockLocation:
            node = ns.get_inode(request.inode)
            _owned(scope, node)
            loc = blocks.allocate(
                request.inode, request.size_hint, client_node=request.client_node, exclude=request.exclude_workers
            )
            # the writer may read its block back (a partial block rewritten); never delete it: a
            # block id is written once, and only the master's commands remove a replica (an
            # abandoned one is an orphan the block reports clean up)
            workers = [a.worker_id for a in loc.replicas]
            loc.token = self.block_token(loc.block_id, "rw", node.tenant, workers, length=loc.length)
            return loc

        return apply

    @rpc_method
    async def AbandonBlocks(self, request: pb.AbandonBlocksRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        """A writer gives up blocks it will not commit (an aborted or failed file; HDFS's
        ``abandonBlock``): those still reserved for its inode stop holding the tenant's quota,
        and every worker deletes them now and refuses a write of the ids while a write token of
        them may be valid (a token cannot be revoked: stored after its quota was given back,
        the block would be charged to nobody), instead of keeping them for
        ``master.orphan_grace`` and the next block report: a failed checkpoint no longer leaves
        the cache full for the next. Any other id is ignored; calling it again is harmless.

        Raises:
            NotFound: no such inode (or another tenant's). InvalidArgument: too many ids.
        """
        if len(request.block_ids) > MAX_ABANDON:
            raise E.InvalidArgument(f"at most {MAX_ABANDON} blocks per AbandonBlocks, not {len(request.block_ids)}")

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Empty:
            _owned(scope, ns.get_inode(request.inode))
            blocks.abandoned(ns.allocations.abandon(request.inode, request.block_ids))
            return pb.Empty()

        return await self._read(request.header, "AbandonBlocks", apply)

    @rpc_method
    async def CommitFile(self, request: pb.CommitFileRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        return await self._mutate(request.header, "CommitFile", pb.Inode, self._commit_file(request))

    def _commit_file(self, request: pb.CommitFileRequest) -> Apply[pb.Inode]:
        """The mutation of one CommitFile request (alone or in a Batch)."""

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Inode:
            _owned(scope, ns.get_inode(request.inode))
            committed = list(request.blocks)
            node, freed = ns.commit_file(
                request.inode,
                request.size,
                committed,
                request.mtime,
                base_version=request.base_version,
                base_blocks=list(request.base_blocks),
                replace=request.replace,
                path=scope.inside(request.path) if request.path else "",
                closing=request.closing,
            )
            if node.persist == pb.PERSIST_PENDING:
                self.m.persister.wake.set()
            blocks.committed(committed, node.replication or 1)
            blocks.freed(freed)
            return node

        return apply

    # ------------------------------------------------------------ workers --
    # Workers report to every master: a follower keeps their liveness and load (so it can place
    # blocks the moment it takes over) and sends no command; replicas it learns from the log.

    @rpc_method
    async def RegisterWorker(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        self._check(request.header, "RegisterWorker")
        known = self.m.registry.workers.get(request.info.addr.worker_id)
        restarted = known is not None and known.info.started != request.info.started
        state = self.m.registry.register(request.info)
        leading = self.m.is_leading()
        if restarted:  # what it was doing is lost: its write-back uploads start again
            self.m.persister.worker_restarted(state.worker_id)
        if leading:
            _, blocks = self.m.leading()
            blocks.worker_registered(state.worker_id, list(request.blocks))
            await self.m.commit()
        masters: list[str] = []
        if self.m.ha is not None:  # a worker given one master's address learns the others
            with contextlib.suppress(E.Unavailable):
                masters = sorted((await self.m.ha.members()).values())
        return pb.RegisterResponse(
            epoch=self.m.epoch,
            heartbeat_interval_ms=int(self.m.cfg.heartbeat_interval * 1000),
            leader=leading,
            block_keys=self.m.block_signer.format(),
            masters=masters,
            address=self.m.address,
            revoked_before_ms=self.revocations(),
        )

    @rpc_method
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        self._check(request.header, "Heartbeat")
        state = self.m.registry.heartbeat(request.info)
        leading = self.m.is_leading()
        keys = self.m.block_signer.format()
        if state is None:
            return pb.HeartbeatResponse(epoch=self.m.epoch, reregister=True, leader=leading, block_keys=keys)
        if not leading:
            state.commands = []
            return pb.HeartbeatResponse(epoch=self.m.epoch, leader=False, block_keys=keys)
        commands, state.commands = state.commands, []
        if commands:
            self.m.registry.readdress(commands)
            await self.m.commit()  # a DELETE goes out only once the change that freed the block is replicated
        return pb.HeartbeatResponse(
            epoch=self.m.epoch, commands=commands, leader=True, block_keys=keys, revoked_before_ms=self.revocations()
        )

    @rpc_method
    async def BlockReceived(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        """A worker stored a copy: made by re-replication, or (``length`` set) fetched from the
        under-store for a bound file, with its CRC32C."""

        return await self._worker_call(
            request.header, "BlockReceived", lambda blocks: _received(blocks, request.worker_id, request)
        )

    @rpc_method
    async def UfsBlockSource(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.UfsSource:
        """Where a worker fetches a bound file's missing block from (a worker's call)."""
        ns, _ = self.m.leading()
        self._check(request.header, "UfsBlockSource")
        return ns.ufs_source(request.block_id)

    @rpc_method
    async def UfsBlockSources(
        self, request: pb.UfsSourceRequest, context: grpc.aio.ServicerContext
    ) -> pb.UfsSourceList:
        """Where a worker fetches each of many missing blocks from (its concurrent fetches asked
        together); a block that is not a bound file's is its own error, in its place.

        Raises:
            InvalidArgument: more than ``MAX_BATCH`` blocks.
        """
        if len(request.block_ids) > MAX_BATCH:
            raise E.InvalidArgument(f"at most {MAX_BATCH} blocks at once, not {len(request.block_ids)}")
        ns, _ = self.m.leading()
        self._check(request.header, "UfsBlockSources")
        out = pb.UfsSourceList()
        with RPC_SECONDS.labels("UfsBlockSources").time():
            for block_id in request.block_ids:
                try:
                    source = ns.ufs_source(block_id)
                except E.PCacheError as exc:
                    source = pb.UfsSource(error=type(exc).__name__, message=str(exc))
                source.block_id = block_id
                out.sources.append(source)
        return out

    @rpc_method
    async def ReleaseSpace(self, request: pb.SpaceRequest, context: grpc.aio.ServicerContext) -> pb.SpaceResponse:
        """A worker out of room for a block it must store: evict clean blocks it holds (a worker's
        call; :meth:`BlockManager.release_space`). Answered once the eviction is replicated."""
        _, blocks = self.m.leading()
        self._check(request.header, "ReleaseSpace")
        with RPC_SECONDS.labels("ReleaseSpace").time():
            evict, freed = blocks.release_space(request.worker_id, request.bytes, request.block_id)
            await self.m.commit()
        return pb.SpaceResponse(evict=evict, bytes=freed)

    @rpc_method
    async def ReportPersist(self, request: pb.PersistReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        """A worker staged (or failed) a write-back upload it was told to make (a worker's call)."""
        return await self._worker_call(request.header, "ReportPersist", lambda _: self.m.persister.staged(request))

    @rpc_method
    async def ReportBadBlock(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        claims = _CALLER.get()
        if claims is None or claims.scope != "worker":  # a client: only a block of its own tenant's
            ns, _ = self.m.leading()
            meta = ns.get_block(request.block_id)
            if meta is None:
                raise E.NotFound(f"no block {request.block_id}")
            _owned(self._scope(ns), ns.get_inode(meta.inode), f"no block {request.block_id}")
        return await self._worker_call(request.header, "ReportBadBlock", lambda blocks: blocks.bad_block(
            request.worker_id, request.block_id))  # fmt: skip

    @rpc_method
    async def ReportBlocks(self, request: pb.IncrementalBlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(blocks: BlockManager) -> None:
            blocks.lost(request.worker_id, list(request.lost))
            for block_id in request.corrupt:
                blocks.bad_block(request.worker_id, block_id)
            for failure in request.failed:
                blocks.replication_failed(request.worker_id, failure.block_id, list(failure.targets), failure.error)
            for copy in request.received:  # a copy made by re-replication is the target's
                _received(blocks, copy.worker_id or request.worker_id, copy)

        return await self._worker_call(request.header, "ReportBlocks", apply)

    async def _worker_call(
        self, header: pb.RequestHeader, method: str, apply: Callable[[BlockManager], None]
    ) -> pb.Empty:
        """A worker's (or client's) report about replicas: applied, replicated, answered empty."""
        _, blocks = self.m.leading()
        self._check(header, method)
        with RPC_SECONDS.labels(method).time():
            apply(blocks)
            await self.m.commit()
        return pb.Empty()

    @rpc_method
    async def Fsck(self, request: pb.FsckRequest, context: grpc.aio.ServicerContext) -> pb.FsckReport:
        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.FsckReport:
            report = fsck.check(ns, blocks, scope.inside(request.path or "/"))
            for damaged in report.damaged:
                damaged.path = scope.outside(damaged.path) or damaged.path
                holders = [a.worker_id for a in (*damaged.good, *damaged.quarantined)]
                damaged.token = self.block_token(damaged.block_id, "r", scope.tenant, holders)
            return report

        return await self._read(request.header, "Fsck", apply)

    @rpc_method
    async def GetClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatus:
        """The leader answers; with ``any_master`` a follower too (its role, workers, log position)."""
        if not request.any_master:
            self.m.leading()
        self._check(request.header, "GetClusterStatus")
        claims = _CALLER.get()
        if claims is not None and claims.scope == "tenant" and not self.m.is_leading():
            Tenants(self.m.store).scope(claims.tenant, claims.issued)  # a deleted or revoked tenant: not here either
        now = time.monotonic()
        status = pb.ClusterStatus(
            epoch=self.m.epoch,
            workers=[
                pb.WorkerStatus(info=w.info, alive=w.alive, last_heartbeat_age=now - w.last_seen)
                for w in self.m.registry.workers.values()
            ],
            default_replication=self.m.cfg.default_replication,
            default_block_size=self.m.cfg.default_block_size,
            master=self.m.role_status(),
        )
        if self.m.is_leading():
            ns, blocks = self.m.leading()
            scope = self._scope(ns)
            status.tenants.extend(_usage(ns, scope))
            status.inodes, status.blocks = ns.count()
            status.under_replicated_blocks = blocks.under_replicated()
            status.missing_blocks = blocks.missing()
            status.corrupt_blocks = blocks.corrupt_blocks()
            status.damaged_files = fsck.damaged_files(ns, blocks)
            status.cached_bound_blocks = blocks.evictable()
            status.evicted_blocks, status.evicted_bytes = blocks.evicted_blocks, blocks.evicted_bytes
            status.blocks_without_target = len((blocks.without_target & blocks.under) - blocks.ufs)  # as counted above
            status.starting_left = self.m.starting_left()
            failing = blocks.failing_targets()
            for w in status.workers:
                if w.info.addr.worker_id in failing:
                    w.failed_copies, w.failed_copy_error = failing[w.info.addr.worker_id]
        return status

    # ------------------------------------------------------------ tenants --
    # admin tokens only (MASTER_SCOPES)

    @rpc_method
    async def CreateTenant(self, request: pb.TenantRequest, context: grpc.aio.ServicerContext) -> pb.TenantResponse:
        """Make a tenant and its root; no token in the answer (the reply is stored for retries): IssueToken."""
        spec = request.tenant

        def apply(ns: Namespace, _: BlockManager, __: Scope) -> pb.TenantResponse:
            rec = ns.create_tenant(
                spec.name,
                spec.root,
                quota_bytes=spec.quota_bytes,
                quota_inodes=spec.quota_inodes,
                key_ids=self.m.keys.tokens.keys,
            )
            return pb.TenantResponse(tenant=rec)

        return await self._mutate(request.header, "CreateTenant", pb.TenantResponse, apply)

    @rpc_method
    async def DeleteTenant(self, request: pb.TenantRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(ns: Namespace, blocks: BlockManager, _: Scope) -> pb.Empty:
            blocks.freed(ns.delete_tenant(request.tenant.name, purge=request.purge, key_ids=self.m.keys.tokens.keys))
            return pb.Empty()

        return await self._mutate(request.header, "DeleteTenant", pb.Empty, apply)

    @rpc_method
    async def SetQuota(self, request: pb.TenantRequest, context: grpc.aio.ServicerContext) -> pb.TenantResponse:
        spec = request.tenant

        def apply(ns: Namespace, _: BlockManager, __: Scope) -> pb.TenantResponse:
            rec = ns.set_quota(spec.name, quota_bytes=spec.quota_bytes, quota_inodes=spec.quota_inodes)
            return pb.TenantResponse(tenant=rec)

        return await self._mutate(request.header, "SetQuota", pb.TenantResponse, apply)

    @rpc_method
    async def ListTenants(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTenantsResponse:
        return await self._read(request.header, "ListTenants",
                                lambda ns, _, scope: pb.ListTenantsResponse(tenants=_usage(ns, scope)))  # fmt: skip

    # ------------------------------------------------------ under storage --

    @rpc_method
    async def BindPath(self, request: pb.BindRequest, context: grpc.aio.ServicerContext) -> pb.Bind:
        """Bind a directory to an under-store (an admin's call); with ``check`` the store is
        listed once first, from this master, so a wrong endpoint or credentials fail here."""
        spec = request.bind
        self.m.leading()
        if request.check:
            check_uri(spec.uri)  # refuse a URI with a secret before anything connects with it
            await ufs.probe(spec.uri, min(self.m.cfg.ufs_timeout, UFS_CLIENT_WAIT))

        def apply(ns: Namespace, _: BlockManager, scope: Scope) -> pb.Bind:
            return ns.bind(scope.inside(spec.path), spec.uri, mode=spec.mode or "ro", meta_ttl=spec.meta_ttl)

        return await self._mutate(request.header, "BindPath", pb.Bind, apply)

    @rpc_method
    async def UnbindPath(self, request: pb.BindRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        """Remove a bind and what is cached under it (the under-store keeps its objects); refused
        while write-back steps of it are not done, unless ``force``."""

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Empty:
            _, freed = ns.unbind(scope.inside(request.bind.path), force=request.force)
            blocks.freed(freed)
            return pb.Empty()

        return await self._mutate(request.header, "UnbindPath", pb.Empty, apply)

    @rpc_method
    async def RefreshPath(self, request: pb.PathRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        """List a bound directory from its store again now (a bound file: HEAD it)."""
        ns, _ = self.m.leading()
        self._check(request.header, "RefreshPath")
        scope = self._scope(ns)
        try:
            await self._store_wait(self.m.ufs.refresh(scope.inside(request.path)))
        except E.PCacheError as exc:
            _outside(exc, scope)
            raise
        return await self._read(request.header, "RefreshPath", lambda ns, _, scope: _stat(ns, scope, request.path))

    @rpc_method
    async def FreePath(self, request: pb.PathRequest, context: grpc.aio.ServicerContext) -> pb.FreeReport:
        """Evict every cached block of the bound files under a path (``pcache free``); the files
        stay, and are fetched again when read. Files not bound, or not yet persisted, keep theirs."""

        def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.FreeReport:
            report = pb.FreeReport()
            for _, node in ns.walk(scope.inside(request.path)):
                if not scope.owns(node) or not node.bind:
                    continue
                report.files += 1
                for block_id in node.blocks:
                    nbytes = blocks.evict_block(block_id)
                    if nbytes is not None:
                        report.blocks += 1
                        report.bytes += nbytes
            return report

        return await self._read(request.header, "FreePath", apply)

    @rpc_method
    async def ListBinds(self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext) -> pb.BindList:
        return await self._read(request.header, "ListBinds", lambda ns, _, scope: _binds(ns, scope))

    @rpc_method
    async def IssueToken(self, request: pb.TenantRequest, context: grpc.aio.ServicerContext) -> pb.TenantResponse:
        """A fresh token of an existing tenant, valid ``token_ttl`` seconds (0: no expiry)."""

        def apply(ns: Namespace, _: BlockManager, __: Scope) -> pb.TenantResponse:
            rec = ns.tenants.get(request.tenant.name)
            token = mint_token(
                self.m.keys.tokens, rec.name, "tenant", request.token_ttl, not_before_ms=rec.revoked_before_ms
            )
            return pb.TenantResponse(tenant=rec, token=token)

        return await self._read(request.header, "IssueToken", apply)

    @rpc_method
    async def RevokeTokens(self, request: pb.TenantRequest, context: grpc.aio.ServicerContext) -> pb.TenantResponse:
        """Refuse every token of a tenant issued until now (a leaked one among them); answered
        once replicated, so no master that takes over accepts them again."""

        def apply(ns: Namespace, _: BlockManager, __: Scope) -> pb.TenantResponse:
            return pb.TenantResponse(tenant=ns.revoke_tokens(request.tenant.name))

        return await self._mutate(request.header, "RevokeTokens", pb.TenantResponse, apply)


def _in_scope(apply: Apply[R], ns: Namespace, blocks: BlockManager, scope: Scope) -> R:
    """``apply`` for a caller in ``scope``: an error names the path as the caller named it."""
    try:
        return apply(ns, blocks, scope)
    except E.PCacheError as exc:
        _outside(exc, scope)
        raise


def _outside(exc: E.PCacheError, scope: Scope) -> None:
    """Make ``exc`` name its path as the caller in ``scope`` sees it (a tenant never sees the
    namespace path of its root)."""
    if isinstance(exc.filename, str):
        exc.filename = scope.outside(exc.filename)


def _received(blocks: BlockManager, worker_id: str, copy: pb.BlockReport) -> None:
    """A copy a worker stored: fetched from the under-store (``length`` set, with its CRC32C) or
    made by re-replication."""
    if copy.length:
        blocks.fetched(worker_id, copy.block_id, copy.length, copy.crc32c)
    else:
        blocks.block_received(worker_id, copy.block_id)


def _stat(ns: Namespace, scope: Scope, path: str) -> pb.Inode:
    node = ns.resolve(scope.inside(path))
    if node.id == scope.root_inode:
        node.name = "/"
    return node


def _stat_of(path: str) -> Apply[pb.Inode]:
    return lambda ns, _, scope: _stat(ns, scope, path)


def _owned(scope: Scope, node: pb.Inode, missing: str = "") -> None:
    """Refuse an inode of another tenant (named by number: GetLayout, AllocateBlock, CommitFile,
    ReportBadBlock) with the very error of a number that names nothing, so that a tenant cannot
    learn which numbers other tenants hold (deny without an existence oracle, as S3 answers a
    caller without list permission 403 for a missing key and a forbidden one alike).

    Raises:
        NotFound: the inode is outside the caller's tenant (``missing``, else the message of an
            inode that does not exist).
    """
    if not scope.owns(node):
        raise E.NotFound(missing or f"inode {node.id} does not exist")


def _binds(ns: Namespace, scope: Scope) -> pb.BindList:
    """Every bind for an admin; a tenant's own, with paths as it sees them."""
    out = pb.BindList()
    for bind in ns.binds.all():
        if scope.admin or bind.tenant == scope.tenant:
            shown = out.binds.add()
            shown.CopyFrom(bind)
            shown.path = scope.outside(bind.path) or bind.path
    return out


def _usage(ns: Namespace, scope: Scope) -> list[pb.Tenant]:
    """Tenant records with their reserved bytes: every tenant for an admin, else the caller's."""
    records = ns.tenants.all() if scope.admin else [ns.tenants.get(scope.tenant)]
    for rec in records:
        rec.reserved_bytes = ns.allocations.reserved_bytes(rec.name)
    return records


def _create(request: pb.CreateRequest) -> Apply[pb.Inode]:
    """The mutation of one Create request (alone or in a Batch)."""

    def apply(ns: Namespace, blocks: BlockManager, scope: Scope) -> pb.Inode:
        node, freed = ns.create(
            scope.inside(request.path),
            request.mode,
            exclusive=request.exclusive,
            truncate=request.truncate,
            block_size=request.block_size,
            replication=request.replication,
            uid=request.owner.uid,
            gid=request.owner.gid,
            kind=request.type or pb.REGULAR,
            rdev=request.rdev,
        )
        blocks.freed(freed)
        return node

    return apply


def _caller_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline as a ``time.monotonic()`` (None: it set none)."""
    left = context.time_remaining()
    return None if left is None else time.monotonic() + left


def _unplaced(layout: pb.FileLayout) -> bool:
    """Whether a block of ``layout`` that stores data names no live copy (and no fetcher)."""
    return any(b.block_id != HOLE and not b.replicas for b in layout.blocks)
