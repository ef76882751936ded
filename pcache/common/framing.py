"""Data-plane framing: ``>IQ`` (header length, payload length), header, payload.

The header is a protobuf :class:`~pcache.proto.pcache_pb2.DataHeader`; the
payload is raw block bytes, read by the receiver in :data:`CHUNK_SIZE`
pieces so that a worker can forward a block down the replication pipeline
while it is still arriving. Every read and drain has a deadline.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct

from pcache.common.checksum import CHUNK_SIZE
from pcache.common.errors import PCacheError, ProtocolError, Timeout, Unavailable, from_name
from pcache.proto import pcache_pb2 as pb

PREFIX = struct.Struct(">IQ")
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 40
MAX_FETCHES = 64  # blocks one FETCH_BLOCKS request may name (each with its token, in a request header)

__all__ = [
    "CHUNK_SIZE",
    "read_header",
    "read_exactly",
    "write_frame",
    "error_header",
    "raise_if_error",
    "sock_connect",
    "sock_request",
    "sock_recv_exactly",
    "sock_receive",
]


async def read_exactly(reader: asyncio.StreamReader, n: int, timeout: float) -> bytes:
    """Read ``n`` bytes or raise.

    Raises:
        Unavailable: the peer closed the connection early.
        Timeout: no progress within ``timeout`` seconds.
    """
    try:
        async with asyncio.timeout(timeout):
            return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise Unavailable("connection closed by peer") from exc
    except TimeoutError as exc:  # before OSError, of which it is a subclass
        raise Timeout(f"peer sent nothing for {timeout:.1f}s") from exc
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, PCacheError):
            raise
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc


async def read_header(
    reader: asyncio.StreamReader,
    timeout: float,
    *,
    max_header: int = MAX_HEADER_BYTES,
    header_timeout: float | None = None,
) -> tuple[pb.DataHeader, int]:
    """Read one frame's header; returns (header, payload length in bytes).

    ``timeout`` seconds for the frame to start; ``header_timeout`` (default ``timeout``) for the
    rest of the header once it has: a server gives a started frame little time, so a peer that
    sends part of a header and stops holds no buffer for long. ``max_header`` bytes at most.

    Raises:
        ProtocolError: lengths out of bounds or an unparsable header.
        Unavailable, Timeout: as :func:`read_exactly`.
    """
    prefix = await read_exactly(reader, PREFIX.size, timeout)
    header_len, payload_len = PREFIX.unpack(prefix)
    if header_len > max_header or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"frame lengths out of bounds ({header_len}, {payload_len})")
    header = pb.DataHeader()
    try:
        body = await read_exactly(reader, header_len, timeout if header_timeout is None else header_timeout)
        header.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError
        if isinstance(exc, PCacheError):
            raise
        raise ProtocolError(f"bad frame header: {exc}") from exc
    return header, payload_len


async def write_frame(
    writer: asyncio.StreamWriter,
    header: pb.DataHeader,
    payload: bytes | bytearray | memoryview | list[memoryview] | None = None,
    *,
    payload_len: int | None = None,
    timeout: float,
) -> None:
    """Send a header and (all or the start of) a payload: one buffer, or several sent in order
    without joining them.

    ``payload_len`` announces a longer payload whose remainder the caller
    streams with ``writer.write`` afterwards.

    Raises:
        Unavailable: the connection broke.
        Timeout: the peer did not drain within ``timeout`` seconds.
    """
    raw = header.SerializeToString()
    parts = payload if isinstance(payload, list) else [payload] if payload else []
    length = sum(len(p) for p in parts) if payload_len is None else payload_len
    send(writer, PREFIX.pack(len(raw), length) + raw)
    for part in parts:
        send(writer, part)
    await drain(writer, timeout)


def send(writer: asyncio.StreamWriter, data: bytes | bytearray | memoryview) -> None:
    """Queue ``data`` on the connection (``drain`` waits for it to leave).

    Raises:
        Unavailable: the connection broke or is closed (the peer went away: uvloop raises
            RuntimeError on a write to a transport its ``connection_lost`` closed).
    """
    try:
        writer.write(data)
    except (ConnectionError, OSError, RuntimeError) as exc:
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc


async def write_frame_paced(
    writer: asyncio.StreamWriter,
    header: pb.DataHeader,
    payload: bytes | bytearray | memoryview,
    *,
    stall: float,
    piece: int = 1 << 20,
) -> None:
    """Send a header and payload in ``piece``-byte slices, each drained within ``stall`` seconds.

    A peer that stops reading (hung, SIGSTOPped) is found after ``stall`` seconds, not after a
    deadline sized for the whole transfer.

    Raises:
        Unavailable: the connection broke. Timeout: a slice was not taken within ``stall`` seconds.
    """
    view = memoryview(payload).cast("B")
    await write_frame(writer, header, view[:piece], payload_len=len(view), timeout=stall)
    for offset in range(piece, len(view), piece):
        send(writer, view[offset : offset + piece])
        await drain(writer, stall)


async def drain(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Wait until the write buffer is flushed, with a deadline."""
    try:
        async with asyncio.timeout(timeout):
            await writer.drain()
    except TimeoutError as exc:
        raise Timeout(f"peer did not accept data for {timeout:.1f}s") from exc
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, PCacheError):
            raise
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc


def error_header(exc: BaseException) -> pb.DataHeader:
    """The RESPONSE header that carries ``exc`` across the data plane."""
    if isinstance(exc, PCacheError):
        return pb.DataHeader(op=pb.RESPONSE, error=type(exc).__name__, message=exc.message)
    return pb.DataHeader(op=pb.RESPONSE, error="PCacheError", message=f"{type(exc).__name__}: {exc}")


def raise_if_error(header: pb.DataHeader) -> pb.DataHeader:
    """Return ``header`` unless it carries an error, which is raised instead."""
    if header.error:
        raise from_name(header.error, header.message)
    return header


async def open_connection(
    host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a TCP data-plane connection within ``timeout`` seconds.

    Raises:
        Unavailable: refused or unreachable. Timeout: no answer in time.
    """
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, limit=4 * CHUNK_SIZE, ssl=tls, server_hostname=host if tls else None
            )
    except TimeoutError as exc:
        raise Timeout(f"connect to {host}:{port} timed out after {timeout:.1f}s") from exc
    except OSError as exc:
        raise Unavailable(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    sock = writer.get_extra_info("socket")
    if sock is not None:
        import socket

        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a stream without waiting (the peer may be gone)."""
    try:
        writer.close()
    except Exception:  # noqa: BLE001 - closing a broken transport may raise anything
        pass


# ---------------------------------------------------------------- plain sockets --
# A client's block reads on plain TCP go through these, not a StreamReader: the payload is
# received straight into one preallocated buffer (``recv_into``), where a StreamReader copies
# every byte three more times (its buffer's extend, the slice, ``bytes``). TLS keeps the streams.


async def sock_connect(host: str, port: int, timeout: float) -> socket.socket:
    """A non-blocking TCP connection (``TCP_NODELAY``) within ``timeout`` seconds.

    Raises:
        Unavailable: refused or unreachable. Timeout: no answer in time.
    """
    loop = asyncio.get_running_loop()
    sock: socket.socket | None = None
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, kind, proto, _name, address = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
            return sock
    except TimeoutError as exc:
        _close(sock)
        raise Timeout(f"connect to {host}:{port} timed out after {timeout:.1f}s") from exc
    except OSError as exc:
        _close(sock)
        raise Unavailable(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc


def sock_alive(sock: socket.socket) -> bool:
    """Whether a pooled idle connection is still open (the peer has not closed or reset it)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""  # an idle connection has nothing to read
    except BlockingIOError:
        return True
    except OSError:
        return False


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


async def sock_request(sock: socket.socket, header: pb.DataHeader, timeout: float) -> None:
    """Send a header-only frame within ``timeout`` seconds.

    Raises:
        Unavailable: the connection broke. Timeout: not taken in time.
    """
    raw = header.SerializeToString()
    try:
        async with asyncio.timeout(timeout):
            await asyncio.get_running_loop().sock_sendall(sock, PREFIX.pack(len(raw), 0) + raw)
    except TimeoutError as exc:
        raise Timeout(f"peer took nothing for {timeout:.1f}s") from exc
    except OSError as exc:
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc


async def sock_recv_exactly(sock: socket.socket, view: memoryview, timeout: float) -> None:
    """Fill ``view`` from the socket; ``timeout`` seconds at most without progress.

    Raises:
        Unavailable: the peer closed or the connection broke. Timeout: no bytes in time.
    """
    loop = asyncio.get_running_loop()
    pos, n = 0, len(view)
    try:
        while pos < n:
            async with asyncio.timeout(timeout):
                got = await loop.sock_recv_into(sock, view[pos:])
            if not got:
                raise Unavailable("connection closed by peer")
            pos += got
    except TimeoutError as exc:
        raise Timeout(f"peer sent nothing for {timeout:.1f}s") from exc
    except OSError as exc:
        if isinstance(exc, PCacheError):
            raise
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc


# ------------------------------------------------- blocking exchange (a thread) --

_TIMEVAL = struct.Struct("@ll")


def _set_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(whole, int((seconds - whole) * 1e6)))


def _recv_all(sock: socket.socket, n: int, timeout: float) -> bytes:
    """``n`` bytes from a blocking socket whose ``SO_RCVTIMEO`` is set: one ``recv(MSG_WAITALL)``
    fills a new ``bytes`` object in place (the kernel's one copy); a peer slower than the timeout
    gets further calls while it makes progress."""
    parts: list[bytes] = []
    left = n
    while left:
        try:
            got = sock.recv(left, socket.MSG_WAITALL)
        except BlockingIOError as exc:  # SO_RCVTIMEO passed with nothing received
            raise Timeout(f"peer sent nothing for {timeout:.1f}s") from exc
        if not got:
            raise Unavailable("connection closed by peer")
        parts.append(got)
        left -= len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def sock_receive(sock: socket.socket, prefix: bytes, timeout: float) -> tuple[pb.DataHeader, bytes]:
    """The rest of a frame whose ``PREFIX`` was received (on the event loop, which waited for the
    answer to start): (header, payload). Blocking: it runs in a thread that owns the socket until
    it returns, so the kernel copies the payload straight into the returned ``bytes`` (one
    ``recv(MSG_WAITALL)``) while the event loop and the GIL serve other reads. ``timeout`` seconds
    at most for each wait. The socket is non-blocking again on return.

    Raises:
        Unavailable: the connection broke or the peer closed it. Timeout: no progress in time.
        ProtocolError: lengths out of bounds or an unparsable header.
    """
    header_len, payload_len = PREFIX.unpack(prefix)
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"frame lengths out of bounds ({header_len}, {payload_len})")
    try:
        sock.setblocking(True)
        _set_timeout(sock, socket.SO_RCVTIMEO, timeout)
        reply = pb.DataHeader()
        try:
            reply.ParseFromString(_recv_all(sock, header_len, timeout))
        except Exception as exc:  # protobuf raises DecodeError
            if isinstance(exc, PCacheError):
                raise
            raise ProtocolError(f"bad frame header: {exc}") from exc
        return reply, _recv_all(sock, payload_len, timeout) if payload_len else b""
    except OSError as exc:
        if isinstance(exc, PCacheError):
            raise
        raise Unavailable(f"connection lost: {str(exc) or type(exc).__name__}") from exc
    finally:
        sock.setblocking(False)
