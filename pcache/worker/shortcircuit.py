"""Same-host short circuit: block bytes through file descriptors, not TCP.

A client on the worker's host connects to ``<data_dir>/sc-<worker id>.sock``: the path the worker
advertises names the worker, so a client on another node whose local worker uses the same
``data_dir`` path finds no such socket and reads over TCP.

* ``SC_READ_OPEN`` returns the block's CRC record with a read-only fd of its
  file; the client ``pread``s it and verifies the chunk CRCs itself.
* ``SC_WRITE_OPEN`` reserves quota and returns a writable fd of a fresh temp
  file; the client writes the block straight into it (page cache, no socket
  copy), then ``SC_WRITE_COMMIT`` makes the worker take the client's chunk CRC32Cs (computed
  as it wrote; a commit without them has the worker read the block back and compute them),
  fsync, publish, and push the block down the replica pipeline.

This is the "interception + shared memory" path of the Ling report §2.3.1,
done as HDFS short-circuit local reads do it (fd passing over a UNIX socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from pcache.common import uds
from pcache.common.errors import CorruptBlock, InvalidArgument, NotFound, PCacheError, ProtocolError
from pcache.common.metrics import DATA_BYTES, DATA_OPS
from pcache.proto import pcache_pb2 as pb
from pcache.worker.blockstore import BlockWriter
from pcache.worker.dataserver import IDLE_TIMEOUT, LISTEN_BACKLOG, OP_NEEDS, DataServer, check_pipeline

logger = logging.getLogger(__name__)


class ShortCircuitServer:
    """UNIX-socket server handing block file descriptors to local clients."""

    def __init__(self, data: DataServer, path: str) -> None:
        self.data = data
        self.path = path
        self._sock: socket.socket | None = None
        self._task: asyncio.Task | None = None
        self._conns: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) and start accepting."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        os.chmod(self.path, 0o600)
        sock.listen(LISTEN_BACKLOG)  # bursts of same-host readers (128 refused a 3,000-file fs.cat)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.create_task(self._accept_loop())

    async def stop(self) -> None:
        """Stop accepting, drop connections, remove the socket file."""
        if self._task is not None:
            self._task.cancel()
        for task in list(self._conns):
            task.cancel()
        if self._sock is not None:
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            conn.setblocking(False)
            task = asyncio.create_task(self._serve(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _serve(self, conn: socket.socket) -> None:
        writes: dict[str, BlockWriter] = {}
        try:
            while True:
                try:
                    header, stray_fd = await uds.recv_frame(conn, IDLE_TIMEOUT)
                except PCacheError:
                    return
                if stray_fd is not None:
                    os.close(stray_fd)
                fd_out: int | None = None
                try:
                    reply, fd_out = await self._dispatch(header, writes)
                except ProtocolError:
                    return
                except PCacheError as exc:
                    reply = pb.DataHeader(op=pb.RESPONSE, error=type(exc).__name__, message=exc.message)
                DATA_OPS.labels(pb.DataOp.Name(header.op)).inc()
                try:
                    await uds.send_frame(conn, reply, fd_out, self.data.io_timeout)
                finally:
                    if fd_out is not None and header.op == pb.SC_READ_OPEN:
                        os.close(fd_out)
        except Exception:
            logger.exception("short-circuit connection failed")
        finally:
            for writer in writes.values():
                writer.abort()
            conn.close()

    async def _dispatch(
        self, header: pb.DataHeader, writes: dict[str, BlockWriter]
    ) -> tuple[pb.DataHeader, int | None]:
        store = self.data.store
        need = OP_NEEDS.get(header.op)
        if not need:
            raise ProtocolError(f"unsupported short-circuit op {header.op}")
        grant = self.data.tokens.check(header.token, header.block_id, need)  # every request, as over TCP
        if header.op == pb.SC_READ_OPEN:
            await self.data.ensure(header.block_id, grant)
            info = await asyncio.to_thread(store.info, header.block_id)
            try:
                fd = store.open_read(header.block_id)
            except NotFound:
                await self.data.lost(header.block_id)
                raise
            reply = pb.DataHeader(
                op=pb.RESPONSE,
                block_id=info.block_id,
                block_length=info.length,
                crc32c=info.crc32c,
                chunk_crcs=list(info.chunk_crcs),
            )
            return reply, fd
        if header.op == pb.SC_WRITE_OPEN:
            grant.check_write_length(header.length)
            writer = await self.data.begin_write(header.block_id, header.length)
            handle = uuid.uuid4().hex
            writes[handle] = writer
            return pb.DataHeader(op=pb.RESPONSE, block_id=header.block_id, write_handle=handle), writer.fd
        if header.op == pb.SC_WRITE_COMMIT:
            if header.write_handle not in writes:
                raise InvalidArgument(f"unknown short-circuit write handle for block {header.block_id}")
            writer = writes.pop(header.write_handle)
            if writer.block_id != header.block_id:
                raise InvalidArgument(f"unknown short-circuit write handle for block {header.block_id}")
            try:
                if header.chunk_crcs:  # computed by the client as it wrote: taken, not recomputed
                    writer.adopt_crcs(header.crc32c, list(header.chunk_crcs))
                else:
                    await asyncio.to_thread(writer.account_existing)
            except BaseException:
                writer.abort()
                raise
            if writer.crc != header.crc32c:
                writer.abort()
                raise CorruptBlock(f"block {header.block_id}: CRC32C {writer.crc:#x} != client's {header.crc32c:#x}")
            replication = None
            check_pipeline(grant, header.pipeline)
            if header.pipeline:
                # push to the replicas while the local copy is fsynced (from a dup: commit closes the fd)
                replication = asyncio.ensure_future(
                    self._replicate_from(os.dup(writer.fd), writer, list(header.pipeline), header.token)
                )
            try:
                await self.data.throttle(writer.length)  # a node's write budget covers local writers too
                await asyncio.to_thread(writer.commit, header.crc32c)
            except BaseException:
                if replication is not None:
                    replication.cancel()
                raise
            DATA_BYTES.labels("write").inc(writer.length)
            replicas = [self.data.worker_id]
            if replication is not None:
                replicas += [r for r in await replication if r in grant.workers]
            return pb.DataHeader(op=pb.RESPONSE, block_id=header.block_id, replicas=replicas), None
        raise ProtocolError(f"unsupported short-circuit op {header.op}")

    async def _replicate_from(
        self, fd: int, writer: BlockWriter, targets: list[pb.WorkerAddr], token: str
    ) -> list[str]:
        async def piece(offset: int, length: int) -> bytes:
            return await asyncio.to_thread(os.pread, fd, length, offset)

        try:
            return await self.data.send_block(
                writer.block_id, writer.crc, writer.length, piece, targets, token=token, pipeline=True
            )
        except PCacheError as exc:
            logger.warning("block %d: pipeline after short-circuit write failed: %s", writer.block_id, exc)
            return []
        finally:
            os.close(fd)
