"""Fault injection on a real local cluster's disks, for tests, benchmarks and the main job.

Replica files are found through the master's layout (each worker advertises its short-circuit
socket inside its data directory, so the socket's directory is the worker's ``data_dir``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pcache.common import uds
from pcache.proto import pcache_pb2 as pb
from pcache.worker.blockstore import block_file

T = TypeVar("T")


def replica_file(addr: pb.WorkerAddr, block_id: int) -> Path:
    """The file holding ``block_id`` on the worker at ``addr`` (a worker of this machine)."""
    return Path(block_file(str(Path(addr.uds_path).parent), block_id))


def replica_files(layout: pb.FileLayout) -> list[list[Path]]:
    """For each block of a file's layout, the files of its live replicas."""
    return [[replica_file(r, b.block_id) for r in b.replicas] for b in layout.blocks]


def flip_byte(path: Path | str, offset: int) -> None:
    """Invert the byte at ``offset`` of a file in place (an open descriptor of it sees the change)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.25) -> T:
    """Poll ``predicate`` until it returns something true (returned) or ``timeout`` seconds pass.

    Raises:
        AssertionError: it never did; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def raw_sc_write(
    uds_path: str, block_id: int, length: int, token: str, data: bytes, crc: int, chunk_crcs: list[int] | None = None
) -> str:
    """A hand-made short-circuit write, as a client that does not play by the rules would make it:
    ``SC_WRITE_OPEN`` of ``length`` bytes, ``data`` written through the descriptor (whatever its
    size), ``SC_WRITE_COMMIT`` naming ``crc`` (and ``chunk_crcs``). Returns the commit's error
    name ("" when the worker took it)."""

    async def run() -> str:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, uds_path)
            opened = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=block_id, length=length, token=token)
            await uds.send_frame(sock, opened, None, 5)
            reply, fd = await uds.recv_frame(sock, 5)
            if reply.error or fd is None:
                return reply.error or "no descriptor"
            os.pwrite(fd, data, 0)
            os.close(fd)
            done = pb.DataHeader(
                op=pb.SC_WRITE_COMMIT, block_id=block_id, write_handle=reply.write_handle, crc32c=crc,
                chunk_crcs=chunk_crcs or [], token=token,
            )  # fmt: skip
            await uds.send_frame(sock, done, None, 5)
            return (await uds.recv_frame(sock, 5))[0].error
        finally:
            sock.close()

    return asyncio.run(run())


def raw_read_refusal(addr: pb.WorkerAddr, location: pb.BlockLocation, *, short_circuit: bool = False) -> str:
    """A hand-made read of ``location``'s block at worker ``addr`` with the block token it
    carries, over TCP or the short-circuit socket, as a holder of that token outside any client
    would make it. Returns the worker's refusal message ("" when it served the read)."""
    from pcache.common import framing

    header = pb.DataHeader(op=pb.READ_BLOCK, block_id=location.block_id, length=location.length, token=location.token)

    async def run() -> str:
        if short_circuit:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, addr.uds_path)
                await uds.send_frame(sock, header, None, 5)
                reply, fd = await uds.recv_frame(sock, 5)
            finally:
                sock.close()
            if fd is not None:
                os.close(fd)
            return reply.message if reply.error else ""
        reader, writer = await framing.open_connection(addr.host, addr.port, 5)
        try:
            await framing.write_frame(writer, header, b"", timeout=5)
            reply, _ = await framing.read_header(reader, 5)
        finally:
            framing.close_writer(writer)
        return reply.message if reply.error else ""

    return asyncio.run(run())
