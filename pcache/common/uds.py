"""Frames with file descriptors over a UNIX socket, for the same-host short circuit.

Both sides use non-blocking sockets driven by the running event loop; a
descriptor travels as ``SCM_RIGHTS`` ancillary data with the first byte of
the frame it belongs to (the pattern HDFS short-circuit reads use).
"""

from __future__ import annotations

import asyncio
import os
import socket

from pcache.common.errors import PCacheError, ProtocolError, Timeout, Unavailable
from pcache.common.framing import MAX_HEADER_BYTES, PREFIX
from pcache.proto import pcache_pb2 as pb


async def _wait(sock: socket.socket, writable: bool, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    if writable:
        loop.add_writer(fd, wake)
    else:
        loop.add_reader(fd, wake)
    try:
        async with asyncio.timeout(timeout):
            await fut
    except TimeoutError as exc:
        raise Timeout(f"short-circuit peer silent for {timeout:.1f}s") from exc
    finally:
        if writable:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


async def send_frame(sock: socket.socket, header: pb.DataHeader, fd: int | None, timeout: float) -> None:
    """Send a header-only frame, with ``fd`` attached when given.

    Raises:
        Unavailable: the socket broke. Timeout: the peer does not read.
    """
    raw = header.SerializeToString()
    data = memoryview(PREFIX.pack(len(raw), 0) + raw)
    fds = [fd] if fd is not None else []
    while data:
        try:
            sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
        except BlockingIOError:
            await _wait(sock, True, timeout)
            continue
        except OSError as exc:
            raise Unavailable(f"short-circuit socket broke: {exc}") from exc
        data = data[sent:]
        fds = []


async def recv_frame(sock: socket.socket, timeout: float) -> tuple[pb.DataHeader, int | None]:
    """Receive a header-only frame and the descriptor sent with it, if any.

    Raises:
        Unavailable: the peer closed. Timeout. ProtocolError: bad frame.
    """
    buf = bytearray()
    received_fd: int | None = None
    need = PREFIX.size
    header_len = -1
    while True:
        while len(buf) < need:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, max(need - len(buf), 1), 4)
            except BlockingIOError:
                await _wait(sock, False, timeout)
                continue
            except OSError as exc:
                raise Unavailable(f"short-circuit socket broke: {exc}") from exc
            if fds:
                for extra in fds[1:]:
                    os.close(extra)
                received_fd = fds[0]
            if not data:
                raise Unavailable("short-circuit peer closed the socket")
            buf += data
        if header_len < 0:
            header_len, payload_len = PREFIX.unpack(bytes(buf[: PREFIX.size]))
            if header_len > MAX_HEADER_BYTES or payload_len:
                raise ProtocolError("bad short-circuit frame")
            need = PREFIX.size + header_len
            continue
        header = pb.DataHeader()
        try:
            header.ParseFromString(bytes(buf[PREFIX.size : need]))
        except Exception as exc:
            if isinstance(exc, PCacheError):
                raise
            raise ProtocolError(f"bad short-circuit header: {exc}") from exc
        return header, received_fd
