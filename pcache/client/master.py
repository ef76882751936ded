"""Thin async client of the master's gRPC service: one method per RPC.

Every call has a deadline (``rpc_timeout``), carries the request header
(tenant, token, newest epoch seen) and raises PCache errors
(:func:`pcache.common.rpc.call`).
"""

from __future__ import annotations

import grpc

from pcache.common.config import ClientConfig, check_address
from pcache.common.rpc import call, channel_options
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc


class MasterClient:
    """Async stub wrapper bound to one master address."""

    def __init__(self, cfg: ClientConfig, client_id: str) -> None:
        """Raises InvalidArgument for a master address that is not HOST:PORT."""
        check_address(cfg.master)
        self.cfg = cfg
        self.address = cfg.master
        self.client_id = client_id
        self.epoch = 0
        self.channel = grpc.aio.insecure_channel(cfg.master, options=channel_options())
        self.stub = pb_grpc.MasterStub(self.channel)

    def header(self) -> pb.RequestHeader:
        """Request header for the next call."""
        return pb.RequestHeader(
            tenant=self.cfg.tenant, token=self.cfg.token, epoch=self.epoch, client_id=self.client_id
        )

    async def _call(self, name: str, request):
        return await call(
            getattr(self.stub, name), request, timeout=self.cfg.rpc_timeout, target=f"master {self.address}"
        )

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    async def stat(self, path: str) -> pb.Inode:
        return await self._call("Stat", pb.PathRequest(header=self.header(), path=path))

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
        return await self._call(
            "Create",
            pb.CreateRequest(
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
            ),
        )

    async def symlink(self, path: str, target: str, owner: pb.Owner | None = None) -> pb.Inode:
        return await self._call(
            "Symlink", pb.SymlinkRequest(header=self.header(), path=path, target=target, owner=owner)
        )

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

    async def layout(self, path: str = "", inode: int = 0) -> pb.FileLayout:
        return await self._call("GetLayout", pb.LayoutRequest(header=self.header(), path=path, inode=inode))

    async def allocate_block(
        self, inode: int, size_hint: int, client_node: str, exclude: list[str]
    ) -> pb.BlockLocation:
        return await self._call(
            "AllocateBlock",
            pb.AllocateBlockRequest(
                header=self.header(), inode=inode, size_hint=size_hint, client_node=client_node, exclude_workers=exclude
            ),
        )

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
    ) -> pb.Inode:
        request = pb.CommitFileRequest(
            header=self.header(),
            inode=inode,
            size=size,
            blocks=blocks,
            mtime=mtime,
            base_version=base_version,
            base_blocks=base_blocks or [],
            replace=replace,
        )
        return await self._call("CommitFile", request)

    async def report_bad_block(self, worker_id: str, block_id: int) -> None:
        await self._call("ReportBadBlock", pb.BlockReport(header=self.header(), worker_id=worker_id, block_id=block_id))

    async def fsck(self, path: str = "/") -> pb.FsckReport:
        return await self._call("Fsck", pb.FsckRequest(header=self.header(), path=path))

    async def cluster_status(self) -> pb.ClusterStatus:
        status = await self._call("GetClusterStatus", pb.ClusterStatusRequest(header=self.header()))
        self.epoch = max(self.epoch, status.epoch)
        return status
