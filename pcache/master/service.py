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

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import grpc
from google.protobuf.message import Message

from pcache.common import errors as E
from pcache.common.metrics import RPC_SECONDS
from pcache.common.rpc import rpc_method
from pcache.master import fsck
from pcache.master.blocks import BlockManager
from pcache.master.namespace import Namespace
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from pcache.master.server import MasterServer

R = TypeVar("R", bound=Message)


_CLIENT = frozenset({"tenant", "admin"})
# who may call each method (:class:`pcache.common.auth.Guard`; a method missing here is refused)
MASTER_SCOPES: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        (
            "Stat",
            "Mkdir",
            "Create",
            "Symlink",
            "ListDir",
            "Rename",
            "Delete",
            "SetAttr",
            "GetLayout",
            "AllocateBlock",
            "CommitFile",
            "Batch",
            "GetClusterStatus",
        ),
        _CLIENT,
    ),  # fmt: skip
    "ReportBadBlock": frozenset({"tenant", "admin", "worker"}),  # a client or a worker found a bad replica
    **dict.fromkeys(("RegisterWorker", "Heartbeat", "BlockReceived", "ReportBlocks"), frozenset({"worker"})),
    "Fsck": _CLIENT,
}


class MasterServicer(pb_grpc.MasterServicer):
    """gRPC servicer of ``pcache.Master`` over one :class:`MasterServer`."""

    def __init__(self, master: MasterServer) -> None:
        self.m = master

    def authorize(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Refuse a caller whose token may not call ``method`` (:data:`MASTER_SCOPES`).

        Raises:
            PermissionDenied: no token, an invalid, expired or other cluster's one, or a scope
                the method does not accept.
        """
        self.m.guard.authorize(method, context.invocation_metadata())

    @property
    def epoch(self) -> int:
        """The epoch stamped on every answer (:func:`rpc_method`)."""
        return self.m.epoch

    def _check(self, header: pb.RequestHeader, method: str) -> None:
        """A leader refuses a caller that has seen a newer epoch: it has been deposed."""
        RPC_SECONDS.labels(method)  # create the series on first use
        if header.epoch > self.m.epoch and self.m.is_leading():
            raise E.StaleEpoch(f"master epoch {self.m.epoch} is older than the caller's {header.epoch}")

    async def _read(self, header: pb.RequestHeader, method: str, apply: Callable[[Namespace, BlockManager], R]) -> R:
        ns, blocks = self.m.leading()
        self._check(header, method)
        with RPC_SECONDS.labels(method).time():
            reply = apply(ns, blocks)
            await self.m.commit()  # what it read is on the follower too
        return reply

    async def _mutate(
        self,
        header: pb.RequestHeader,
        method: str,
        reply_type: type[R],
        apply: Callable[[Namespace, BlockManager], R],
    ) -> R:
        """Apply a mutation once per request id, then wait until it is replicated."""
        ns, blocks = self.m.leading()
        self._check(header, method)
        with RPC_SECONDS.labels(method).time():
            reply = self._apply_once(ns, blocks, header, method, reply_type, apply)
            await self.m.commit()
        return reply

    def _apply_once(
        self,
        ns: Namespace,
        blocks: BlockManager,
        header: pb.RequestHeader,
        method: str,
        reply_type: type[R],
        apply: Callable[[Namespace, BlockManager], R],
    ) -> R:
        if header.request_id:
            done = self.m.replies.get(header.request_id, method, reply_type)
            if done is not None:  # applied before (a retry, maybe on the master that took over)
                return done  # type: ignore[return-value]
        since = self.m.store.index
        reply = apply(ns, blocks)
        if header.request_id:
            self.m.replies.record(header.request_id, method, reply, since)  # same log entry
        return reply

    # ---------------------------------------------------------- namespace --

    @rpc_method
    async def Stat(self, request: pb.PathRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        return await self._read(request.header, "Stat", lambda ns, _: ns.resolve(request.path))

    @rpc_method
    async def Mkdir(self, request: pb.MkdirRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager) -> pb.Inode:
            return ns.mkdir(
                request.path, request.mode, parents=request.parents, uid=request.owner.uid, gid=request.owner.gid
            )

        return await self._mutate(request.header, "Mkdir", pb.Inode, apply)

    @rpc_method
    async def Create(self, request: pb.CreateRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        return await self._mutate(request.header, "Create", pb.Inode, _create(request))

    @rpc_method
    async def Batch(self, request: pb.BatchRequest, context: grpc.aio.ServicerContext) -> pb.BatchResponse:
        """Stats and creates of a client's concurrent callers, in order, one commit wait for all.

        An error of one op is its own result; losing the lease mid-batch fails the whole batch
        (the client sends it again to the new leader; its creates are answered once).
        """
        ns, blocks = self.m.leading()
        self._check(request.header, "Batch")
        out = pb.BatchResponse()
        with RPC_SECONDS.labels("Batch").time():
            for op in request.ops:
                result = out.results.add()
                kind = op.WhichOneof("op")
                try:
                    if kind == "stat":
                        result.inode.CopyFrom(ns.resolve(op.stat.path))
                    elif kind == "create":
                        node = self._apply_once(ns, blocks, op.create.header, "Create", pb.Inode, _create(op.create))
                        result.inode.CopyFrom(node)
                    else:
                        raise E.InvalidArgument(f"unknown batch op {kind!r}")
                except E.NotLeader:
                    raise
                except E.PCacheError as exc:
                    result.error, result.message = type(exc).__name__, str(exc)
            await self.m.commit()
        return out

    @rpc_method
    async def Symlink(self, request: pb.SymlinkRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager) -> pb.Inode:
            return ns.symlink(request.path, request.target, uid=request.owner.uid, gid=request.owner.gid)

        return await self._mutate(request.header, "Symlink", pb.Inode, apply)

    @rpc_method
    async def ListDir(self, request: pb.ListDirRequest, context: grpc.aio.ServicerContext) -> pb.ListDirResponse:
        def apply(ns: Namespace, _: BlockManager) -> pb.ListDirResponse:
            limit = min(request.limit or self.m.cfg.listdir_limit, self.m.cfg.listdir_limit)
            entries, truncated = ns.listdir(request.path, start_after=request.start_after, limit=limit)
            return pb.ListDirResponse(entries=entries, truncated=truncated)

        return await self._read(request.header, "ListDir", apply)

    @rpc_method
    async def Rename(self, request: pb.RenameRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, blocks: BlockManager) -> pb.Inode:
            node, freed = ns.rename(request.src, request.dst, no_replace=request.no_replace)
            blocks.freed(freed)
            return node

        return await self._mutate(request.header, "Rename", pb.Inode, apply)

    @rpc_method
    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(ns: Namespace, blocks: BlockManager) -> pb.Empty:
            freed = ns.delete(request.path, recursive=request.recursive, directory=request.directory, file=request.file)
            blocks.freed(freed)
            return pb.Empty()

        return await self._mutate(request.header, "Delete", pb.Empty, apply)

    @rpc_method
    async def SetAttr(self, request: pb.SetAttrRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, _: BlockManager) -> pb.Inode:
            return ns.setattr(
                request.path,
                mode=request.mode if request.HasField("mode") else None,
                mtime=request.mtime if request.HasField("mtime") else None,
                atime=request.atime if request.HasField("atime") else None,
                set_xattrs=dict(request.set_xattrs),
                remove_xattrs=list(request.remove_xattrs),
                uid=request.uid if request.HasField("uid") else None,
                gid=request.gid if request.HasField("gid") else None,
            )

        return await self._mutate(request.header, "SetAttr", pb.Inode, apply)

    # ------------------------------------------------------------- blocks --

    @rpc_method
    async def GetLayout(self, request: pb.LayoutRequest, context: grpc.aio.ServicerContext) -> pb.FileLayout:
        def apply(ns: Namespace, blocks: BlockManager) -> pb.FileLayout:
            node, metas = ns.layout(request.path, request.inode)
            out = pb.FileLayout(inode=node)
            for index, meta in enumerate(metas):
                replicas = [w.info.addr for w in blocks.live_replicas(meta.block_id)]
                out.blocks.append(
                    pb.BlockLocation(
                        block_id=meta.block_id,
                        offset=index * node.block_size,  # a block may be shorter than its place: zeros follow
                        length=meta.length,
                        crc32c=meta.crc32c,
                        replicas=replicas,
                    )
                )
            return out

        return await self._read(request.header, "GetLayout", apply)

    @rpc_method
    async def AllocateBlock(
        self, request: pb.AllocateBlockRequest, context: grpc.aio.ServicerContext
    ) -> pb.BlockLocation:
        # not answered from a stored reply: a retry gets a second block id, and the first one's
        # reservation expires unused (master.orphan_grace)
        def apply(_: Namespace, blocks: BlockManager) -> pb.BlockLocation:
            return blocks.allocate(
                request.inode, request.size_hint, client_node=request.client_node, exclude=request.exclude_workers
            )

        return await self._read(request.header, "AllocateBlock", apply)

    @rpc_method
    async def CommitFile(self, request: pb.CommitFileRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        def apply(ns: Namespace, blocks: BlockManager) -> pb.Inode:
            committed = list(request.blocks)
            node, freed = ns.commit_file(
                request.inode,
                request.size,
                committed,
                request.mtime,
                base_version=request.base_version,
                base_blocks=list(request.base_blocks),
                replace=request.replace,
            )
            blocks.committed(committed, node.replication or 1)
            blocks.freed(freed)
            return node

        return await self._mutate(request.header, "CommitFile", pb.Inode, apply)

    # ------------------------------------------------------------ workers --
    # Workers report to every master: a follower keeps their liveness and load (so it can place
    # blocks the moment it takes over) and sends no command; replicas it learns from the log.

    @rpc_method
    async def RegisterWorker(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        self._check(request.header, "RegisterWorker")
        state = self.m.registry.register(request.info)
        leading = self.m.is_leading()
        if leading:
            _, blocks = self.m.leading()
            blocks.worker_registered(state.worker_id, list(request.blocks))
            await self.m.commit()
        return pb.RegisterResponse(
            epoch=self.m.epoch, heartbeat_interval_ms=int(self.m.cfg.heartbeat_interval * 1000), leader=leading
        )

    @rpc_method
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        self._check(request.header, "Heartbeat")
        state = self.m.registry.heartbeat(request.info)
        leading = self.m.is_leading()
        if state is None:
            return pb.HeartbeatResponse(epoch=self.m.epoch, reregister=True, leader=leading)
        if not leading:
            state.commands = []
            return pb.HeartbeatResponse(epoch=self.m.epoch, leader=False)
        commands, state.commands = state.commands, []
        if commands:
            await self.m.commit()  # a DELETE goes out only once the change that freed the block is replicated
        return pb.HeartbeatResponse(epoch=self.m.epoch, commands=commands, leader=True)

    @rpc_method
    async def BlockReceived(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(_: Namespace, blocks: BlockManager) -> pb.Empty:
            blocks.block_received(request.worker_id, request.block_id)
            return pb.Empty()

        return await self._read(request.header, "BlockReceived", apply)

    @rpc_method
    async def ReportBadBlock(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(_: Namespace, blocks: BlockManager) -> pb.Empty:
            blocks.bad_block(request.worker_id, request.block_id)
            return pb.Empty()

        return await self._read(request.header, "ReportBadBlock", apply)

    @rpc_method
    async def ReportBlocks(self, request: pb.IncrementalBlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        def apply(_: Namespace, blocks: BlockManager) -> pb.Empty:
            blocks.lost(request.worker_id, list(request.lost))
            for block_id in request.corrupt:
                blocks.bad_block(request.worker_id, block_id)
            return pb.Empty()

        return await self._read(request.header, "ReportBlocks", apply)

    @rpc_method
    async def Fsck(self, request: pb.FsckRequest, context: grpc.aio.ServicerContext) -> pb.FsckReport:
        return await self._read(request.header, "Fsck", lambda ns, blocks: fsck.check(ns, blocks, request.path or "/"))

    @rpc_method
    async def GetClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatus:
        """The leader answers; with ``any_master`` a follower too (its role, workers, log position)."""
        if not request.any_master:
            self.m.leading()
        self._check(request.header, "GetClusterStatus")
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
            status.inodes, status.blocks = ns.count()
            status.under_replicated_blocks = blocks.under_replicated()
            status.missing_blocks = blocks.missing()
            status.corrupt_blocks = blocks.corrupt_blocks()
            status.damaged_files = fsck.damaged_files(ns, blocks)
        return status


def _create(request: pb.CreateRequest) -> Callable[[Namespace, BlockManager], pb.Inode]:
    """The mutation of one Create request (alone or in a Batch)."""

    def apply(ns: Namespace, blocks: BlockManager) -> pb.Inode:
        node, freed = ns.create(
            request.path,
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
