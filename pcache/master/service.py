"""The master's gRPC edge: translate requests, delegate to the domain objects.

Nothing here decides anything: :class:`~pcache.master.namespace.Namespace`
owns the tree, :class:`~pcache.master.registry.WorkerRegistry` the workers and
placement, :class:`~pcache.master.blocks.BlockManager` the replicas.
"""

from __future__ import annotations

import time

import grpc

from pcache.common import errors as E
from pcache.common.metrics import RPC_SECONDS
from pcache.common.rpc import rpc_method
from pcache.master import fsck
from pcache.master.blocks import BlockManager
from pcache.master.namespace import Namespace
from pcache.master.registry import WorkerRegistry
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc


class MasterServicer(pb_grpc.MasterServicer):
    """gRPC servicer of ``pcache.Master``."""

    def __init__(
        self,
        ns: Namespace,
        registry: WorkerRegistry,
        blocks: BlockManager,
        *,
        epoch: int,
        heartbeat_interval: float,
        listdir_limit: int,
    ) -> None:
        self.ns = ns
        self.registry = registry
        self.blocks = blocks
        self.epoch = epoch
        self.heartbeat_interval = heartbeat_interval
        self.listdir_limit = listdir_limit

    def _check(self, header: pb.RequestHeader, method: str) -> None:
        RPC_SECONDS.labels(method)  # create the series on first use
        if header.epoch > self.epoch:
            raise E.StaleEpoch(f"master epoch {self.epoch} is older than the caller's {header.epoch}")

    # ---------------------------------------------------------- namespace --

    @rpc_method
    async def Stat(self, request: pb.PathRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "Stat")
        with RPC_SECONDS.labels("Stat").time():
            return self.ns.resolve(request.path)

    @rpc_method
    async def Mkdir(self, request: pb.MkdirRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "Mkdir")
        with RPC_SECONDS.labels("Mkdir").time():
            return self.ns.mkdir(
                request.path,
                request.mode,
                parents=request.parents,
                uid=request.owner.uid,
                gid=request.owner.gid,
            )

    @rpc_method
    async def Create(self, request: pb.CreateRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "Create")
        with RPC_SECONDS.labels("Create").time():
            node, freed = self.ns.create(
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
            self.blocks.freed(freed)
            return node

    @rpc_method
    async def Symlink(self, request: pb.SymlinkRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "Symlink")
        with RPC_SECONDS.labels("Symlink").time():
            return self.ns.symlink(request.path, request.target, uid=request.owner.uid, gid=request.owner.gid)

    @rpc_method
    async def ListDir(self, request: pb.ListDirRequest, context: grpc.aio.ServicerContext) -> pb.ListDirResponse:
        self._check(request.header, "ListDir")
        with RPC_SECONDS.labels("ListDir").time():
            limit = min(request.limit or self.listdir_limit, self.listdir_limit)
            entries, truncated = self.ns.listdir(request.path, start_after=request.start_after, limit=limit)
            return pb.ListDirResponse(entries=entries, truncated=truncated)

    @rpc_method
    async def Rename(self, request: pb.RenameRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "Rename")
        with RPC_SECONDS.labels("Rename").time():
            node, freed = self.ns.rename(request.src, request.dst, no_replace=request.no_replace)
            self.blocks.freed(freed)
            return node

    @rpc_method
    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        self._check(request.header, "Delete")
        with RPC_SECONDS.labels("Delete").time():
            freed = self.ns.delete(
                request.path, recursive=request.recursive, directory=request.directory, file=request.file
            )
            self.blocks.freed(freed)
            return pb.Empty()

    @rpc_method
    async def SetAttr(self, request: pb.SetAttrRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "SetAttr")
        with RPC_SECONDS.labels("SetAttr").time():
            return self.ns.setattr(
                request.path,
                mode=request.mode if request.HasField("mode") else None,
                mtime=request.mtime if request.HasField("mtime") else None,
                atime=request.atime if request.HasField("atime") else None,
                set_xattrs=dict(request.set_xattrs),
                remove_xattrs=list(request.remove_xattrs),
                uid=request.uid if request.HasField("uid") else None,
                gid=request.gid if request.HasField("gid") else None,
            )

    # ------------------------------------------------------------- blocks --

    @rpc_method
    async def GetLayout(self, request: pb.LayoutRequest, context: grpc.aio.ServicerContext) -> pb.FileLayout:
        self._check(request.header, "GetLayout")
        with RPC_SECONDS.labels("GetLayout").time():
            node, metas = self.ns.layout(request.path, request.inode)
            out = pb.FileLayout(inode=node)
            for index, meta in enumerate(metas):
                replicas = [w.info.addr for w in self.blocks.live_replicas(meta.block_id)]
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

    @rpc_method
    async def AllocateBlock(
        self, request: pb.AllocateBlockRequest, context: grpc.aio.ServicerContext
    ) -> pb.BlockLocation:
        self._check(request.header, "AllocateBlock")
        with RPC_SECONDS.labels("AllocateBlock").time():
            return self.blocks.allocate(
                request.inode,
                request.size_hint,
                client_node=request.client_node,
                exclude=request.exclude_workers,
            )

    @rpc_method
    async def CommitFile(self, request: pb.CommitFileRequest, context: grpc.aio.ServicerContext) -> pb.Inode:
        self._check(request.header, "CommitFile")
        with RPC_SECONDS.labels("CommitFile").time():
            blocks = list(request.blocks)
            node, freed = self.ns.commit_file(
                request.inode,
                request.size,
                blocks,
                request.mtime,
                base_version=request.base_version,
                base_blocks=list(request.base_blocks),
                replace=request.replace,
            )
            self.blocks.committed(blocks, node.replication or 1)
            self.blocks.freed(freed)
            return node

    # ------------------------------------------------------------ workers --

    @rpc_method
    async def RegisterWorker(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        self._check(request.header, "RegisterWorker")
        state = self.registry.register(request.info)
        self.blocks.worker_registered(state.worker_id, list(request.blocks))
        return pb.RegisterResponse(epoch=self.epoch, heartbeat_interval_ms=int(self.heartbeat_interval * 1000))

    @rpc_method
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        self._check(request.header, "Heartbeat")
        state = self.registry.heartbeat(request.info)
        if state is None:
            return pb.HeartbeatResponse(epoch=self.epoch, reregister=True)
        commands, state.commands = state.commands, []
        return pb.HeartbeatResponse(epoch=self.epoch, commands=commands)

    @rpc_method
    async def BlockReceived(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        self._check(request.header, "BlockReceived")
        self.blocks.block_received(request.worker_id, request.block_id)
        return pb.Empty()

    @rpc_method
    async def ReportBadBlock(self, request: pb.BlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        self._check(request.header, "ReportBadBlock")
        self.blocks.bad_block(request.worker_id, request.block_id)
        return pb.Empty()

    @rpc_method
    async def ReportBlocks(self, request: pb.IncrementalBlockReport, context: grpc.aio.ServicerContext) -> pb.Empty:
        self._check(request.header, "ReportBlocks")
        self.blocks.lost(request.worker_id, list(request.lost))
        for block_id in request.corrupt:
            self.blocks.bad_block(request.worker_id, block_id)
        return pb.Empty()

    @rpc_method
    async def Fsck(self, request: pb.FsckRequest, context: grpc.aio.ServicerContext) -> pb.FsckReport:
        self._check(request.header, "Fsck")
        with RPC_SECONDS.labels("Fsck").time():
            return fsck.check(self.ns, self.blocks, request.path or "/")

    @rpc_method
    async def GetClusterStatus(
        self, request: pb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClusterStatus:
        self._check(request.header, "GetClusterStatus")
        now = time.monotonic()
        inodes, nblocks = self.ns.count()
        return pb.ClusterStatus(
            epoch=self.epoch,
            workers=[
                pb.WorkerStatus(info=w.info, alive=w.alive, last_heartbeat_age=now - w.last_seen)
                for w in self.registry.workers.values()
            ],
            under_replicated_blocks=self.blocks.under_replicated(),
            missing_blocks=self.blocks.missing(),
            inodes=inodes,
            blocks=nblocks,
            default_replication=self.ns.default_replication,
            default_block_size=self.ns.default_block_size,
            corrupt_blocks=self.blocks.corrupt_blocks(),
            damaged_files=fsck.damaged_files(self.ns, self.blocks),
        )
