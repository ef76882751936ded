"""The replication stream: the leader's log entries to a follower over one TCP connection.

The gRPC ``Append`` stream carries the same messages, but a round trip through gRPC's asyncio
stack costs about 300 µs on loopback against about 50 µs for a plain socket (measured on the
2-core CI box, ``bench/master_ha.py``), and every mutation a client is answered for waits for one.
So, like the workers' data plane (``../shared/DESIGN.md``: "gRPC only for control"), the log
travels on a framed binary protocol on asyncio; election, probes and checkpoints stay on gRPC.

Each frame is ``>IB`` (body length, kind) then the body:

    HELLO   the leader's master-scope token (UTF-8); first frame, due within HELLO_TIMEOUT
    APPEND  a serialized :class:`~pcache.proto.pcache_pb2.AppendRequest`
    REPLY   a serialized :class:`~pcache.proto.pcache_pb2.AppendResponse`, one per APPEND, in order
    ERROR   JSON ``{"error": class name, "message": ..., "epoch": follower's newest epoch}``;
            the follower closes the connection after it

Both ends are :class:`asyncio.Protocol` objects: a frame is handled in the callback that
completes it, with no task switch, which is where the latency goes. The follower applies an
APPEND synchronously (:meth:`ReplicationServicer.apply_append`), so nothing queues behind it but
the socket buffers. Deny by default: nothing but HELLO is read before the token is verified, and a
connection that sends no valid HELLO in time, a frame over :data:`MAX_FRAME` bytes or an unknown
kind is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from pcache.common import errors as E
from pcache.proto import pcache_pb2 as pb

if TYPE_CHECKING:
    from pcache.master.replication import ReplicationServicer

logger = logging.getLogger(__name__)

FRAME = struct.Struct(">IB")
HELLO, APPEND, REPLY, ERROR = 1, 2, 3, 4
MAX_HELLO = 16 << 10  # bytes of a HELLO body at most
MAX_FRAME = 64 << 20  # bytes of any frame body at most (the gRPC channels' message limit)
HELLO_TIMEOUT = 10.0  # seconds from accept to a verified HELLO
IDLE_TIMEOUT = 30.0  # seconds a follower keeps a stream that sends nothing (the leader beats every 0.5 s)


def frame(kind: int, body: bytes) -> bytes:
    """One frame of ``kind`` carrying ``body``."""
    return FRAME.pack(len(body), kind) + body


def error_frame(exc: BaseException, epoch: int) -> bytes:
    name = type(exc).__name__ if isinstance(exc, E.PCacheError) else "PCacheError"
    return frame(ERROR, json.dumps({"error": name, "message": str(exc), "epoch": epoch}).encode())


def parse_error(body: bytes) -> E.PCacheError:
    """The error an ERROR frame names (its ``epoch`` set to the follower's)."""
    try:
        fields = json.loads(body)
        err = E.from_name(str(fields["error"]), str(fields["message"]))
        err.epoch = int(fields.get("epoch", 0))
    except (ValueError, KeyError, TypeError) as exc:
        return E.ProtocolError(f"unreadable error frame from the follower: {exc}")
    return err


class _Framed(asyncio.Protocol):
    """Splits the byte stream into frames and hands each to :meth:`on_frame`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._limit = MAX_FRAME

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:  # one small frame each way per commit: never wait for more (Nagle)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while self.transport is not None and len(self._buf) >= FRAME.size:
            length, kind = FRAME.unpack_from(self._buf)
            if length > self._limit:
                self.fail(E.ProtocolError(f"a replication frame of {length} bytes (at most {self._limit})"))
                return
            end = FRAME.size + length
            if len(self._buf) < end:
                return
            body = bytes(self._buf[FRAME.size : end])
            del self._buf[:end]
            self.on_frame(kind, body)

    def on_frame(self, kind: int, body: bytes) -> None:
        raise NotImplementedError

    def fail(self, exc: E.PCacheError) -> None:
        raise NotImplementedError

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


# ---------------------------------------------------------------- follower --


class FollowerStream(_Framed):
    """A follower's end of one stream: verify the HELLO, then apply APPENDs and answer each."""

    def __init__(self, servicer: ReplicationServicer) -> None:
        super().__init__()
        self.servicer = servicer
        self.authorized = False
        self._limit = MAX_HELLO
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._leader: tuple[int, str] | None = None  # the epoch and address of the entries it applied

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT, self._check_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        closed_by_leader = self.transport is not None  # this end closes with close(), which clears it
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
        if closed_by_leader and self.authorized:  # no entry applied yet: the leader this follower last heard
            leader = self._leader or (self.servicer.epoch, self.servicer.leader)
            if leader[1]:
                self.servicer.on_stream_lost(*leader)

    def _check_alive(self) -> None:
        if self.transport is None:
            return
        if not self.authorized:
            self.fail(E.PermissionDenied(f"no valid HELLO within {HELLO_TIMEOUT:.0f} s"))
            return
        idle = time.monotonic() - self._last
        if idle >= IDLE_TIMEOUT:
            logger.warning("replication stream from %s silent for %.0f s; closed", self.servicer.leader, idle)
            self.close()
            return
        self._timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT - idle, self._check_alive)

    def on_frame(self, kind: int, body: bytes) -> None:
        self._last = time.monotonic()
        try:
            if not self.authorized:
                if kind != HELLO:
                    raise E.PermissionDenied("the first frame of a replication stream must be HELLO")
                self.servicer.authorize_token("Append", body.decode("utf-8", "replace"))
                self.authorized, self._limit = True, MAX_FRAME
                return
            if kind != APPEND:
                raise E.ProtocolError(f"unexpected frame kind {kind} from the leader")
            try:
                request = pb.AppendRequest.FromString(body)
            except Exception as exc:  # noqa: BLE001 - a malformed message of any kind
                raise E.ProtocolError(f"unparsable AppendRequest: {exc}") from exc
            reply = self.servicer.apply_append(request)
            self._leader = (request.epoch, request.leader)
            self.send(frame(REPLY, reply.SerializeToString()))
        except E.PCacheError as exc:
            self.fail(exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the stream half-applied and open
            logger.exception("replication stream failed")
            self.fail(E.PCacheError(f"{type(exc).__name__}: {exc}"))

    def fail(self, exc: E.PCacheError) -> None:
        if not isinstance(exc, E.StaleEpoch):
            logger.warning("replication stream refused: %s", exc)
        self.send(error_frame(exc, self.servicer.epoch))
        self.close()


async def serve(
    servicer: ReplicationServicer, host: str, port: int, tls: ssl.SSLContext | None
) -> asyncio.base_events.Server:
    """Listen for replication streams on ``host:port`` (0: a free port).

    Raises:
        OSError: the port cannot be bound.
    """
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: FollowerStream(servicer), host, port, ssl=tls)


# ------------------------------------------------------------------ leader --


class LeaderStream(_Framed):
    """A leader's end of one stream: send APPENDs, hand each REPLY to ``on_reply`` in order.

    :attr:`done` completes (with the error) when the stream ends: the follower refused something,
    the connection broke, or :meth:`finish` was called.
    """

    def __init__(self, on_reply: Callable[[pb.AppendResponse], None]) -> None:
        super().__init__()
        self.on_reply = on_reply
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._end(E.Unavailable(f"the follower closed the replication stream{f': {exc}' if exc else ''}"))

    def _end(self, exc: BaseException | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)
                self.done.exception()  # retrieved: the waiter may already be gone

    def on_frame(self, kind: int, body: bytes) -> None:
        if kind == ERROR:
            self.fail(parse_error(body))
            return
        if kind != REPLY:
            self.fail(E.ProtocolError(f"unexpected frame kind {kind} from the follower"))
            return
        try:
            reply = pb.AppendResponse.FromString(body)
        except Exception as exc:  # noqa: BLE001
            self.fail(E.ProtocolError(f"unparsable AppendResponse: {exc}"))
            return
        try:
            self.on_reply(reply)
        except E.PCacheError as exc:  # a newer epoch seen (StaleEpoch), or a refusal to act on
            self.fail(exc)

    def fail(self, exc: E.PCacheError) -> None:
        self._end(exc)
        self.close()

    def finish(self) -> None:
        """End the stream without an error (the follower must be placed anew)."""
        self._end(None)
        self.close()

    def append(self, request: pb.AppendRequest) -> None:
        self.send(frame(APPEND, request.SerializeToString()))


async def connect(
    host: str, port: int, token: str, on_reply: Callable[[pb.AppendResponse], None], *,
    timeout: float, tls: ssl.SSLContext | None,
) -> LeaderStream:  # fmt: skip
    """Open a stream to a follower and send the HELLO within ``timeout`` seconds.

    Raises:
        Unavailable: refused or unreachable. Timeout: no connection in time.
    """
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            _, stream = await loop.create_connection(
                lambda: LeaderStream(on_reply), host, port, ssl=tls, server_hostname=host if tls else None
            )
    except TimeoutError as exc:
        raise E.Timeout(f"replication stream to {host}:{port}: no connection in {timeout:.1f} s") from exc
    except OSError as exc:
        raise E.Unavailable(f"replication stream to {host}:{port}: {exc.strerror or exc}") from exc
    stream.send(frame(HELLO, token.encode()))
    return stream
