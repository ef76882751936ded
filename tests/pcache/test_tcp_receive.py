"""The plain-TCP read path: answers received in a thread (``framing.sock_receive``), on real sockets.

A worker is played by a small asyncio server on loopback that answers READ_BLOCK frames as told
(whole, stalled in the middle, cut off, or with bad lengths), so that every way a peer can fail
while a receiver thread owns the socket is tried.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from pcache.client.data import DataClient
from pcache.common import framing
from pcache.common.config import ClientConfig
from pcache.common.errors import ProtocolError, Timeout, Unavailable
from pcache.proto import pcache_pb2 as pb

MiB = 1 << 20


def frame(payload: bytes, header: pb.DataHeader | None = None, *, announce: int | None = None) -> bytes:
    raw = (header or pb.DataHeader(op=pb.RESPONSE, length=len(payload))).SerializeToString()
    return framing.PREFIX.pack(len(raw), len(payload) if announce is None else announce) + raw + payload


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair on loopback: (client side, non-blocking as the client keeps it; peer)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    client.setblocking(False)
    return client, peer


def receive(client: socket.socket, timeout: float) -> tuple[pb.DataHeader, bytes]:
    prefix = b""
    deadline = time.monotonic() + 5
    while len(prefix) < framing.PREFIX.size:  # what the event loop does before the thread takes over
        try:
            prefix += client.recv(framing.PREFIX.size - len(prefix))
        except BlockingIOError:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    return framing.sock_receive(client, prefix, timeout)


def test_a_whole_answer_lands_in_one_bytes_and_the_socket_is_non_blocking_again() -> None:
    client, peer = pair()
    payload = os.urandom(8 * MiB + 5)
    sender = threading.Thread(target=peer.sendall, args=(frame(payload, pb.DataHeader(op=pb.RESPONSE, crc32c=7)),))
    sender.start()
    try:
        reply, data = receive(client, 5.0)
        assert type(data) is bytes and data == payload
        assert reply.crc32c == 7
        assert client.getblocking() is False  # the event loop's view of it is restored
    finally:
        sender.join()
        client.close()
        peer.close()


def test_a_peer_that_stops_in_the_middle_of_a_payload_times_out() -> None:
    client, peer = pair()
    whole = frame(os.urandom(4 * MiB))
    peer.sendall(whole[: len(whole) // 2])  # then nothing: a SIGSTOPped worker
    try:
        t = time.monotonic()
        with pytest.raises(Timeout, match="sent nothing"):
            receive(client, 0.5)
        assert 0.4 < time.monotonic() - t < 3.0
        assert client.getblocking() is False
    finally:
        client.close()
        peer.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_stream_peer_that_sends_nothing_is_a_timeout_that_says_so(loop: str) -> None:
    """A peer that takes a connection and never answers (a tarpit, a hung worker) is a Timeout
    naming its deadline: asyncio's TimeoutError is an OSError, and was reported as
    ``Unavailable("connection lost: ")``."""
    import uvloop

    async def main() -> None:
        held = []
        server = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(Timeout, match=r"sent nothing for 0\.3s"):
            await framing.read_header(reader, 0.3)
        writer.close()
        server.close()

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())


def test_a_peer_that_closes_in_the_middle_of_a_payload_is_unavailable() -> None:
    client, peer = pair()
    whole = frame(os.urandom(MiB))
    peer.sendall(whole[: len(whole) - 1000])
    peer.close()
    try:
        with pytest.raises(Unavailable, match="closed"):
            receive(client, 5.0)
    finally:
        client.close()


def test_lengths_out_of_bounds_are_refused_before_any_allocation() -> None:
    client, peer = pair()
    peer.sendall(framing.PREFIX.pack(framing.MAX_HEADER_BYTES + 1, 0))
    try:
        with pytest.raises(ProtocolError, match="out of bounds"):
            receive(client, 1.0)
    finally:
        client.close()
        peer.close()


class SlowWorker:
    """Answers every READ_BLOCK with ``length`` bytes of its block id, the payload after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                header, _ = await framing.read_header(reader, 10.0)
                head = frame(b"", pb.DataHeader(op=pb.RESPONSE, length=header.length), announce=header.length)
                writer.write(head)
                await writer.drain()
                await asyncio.sleep(self.delay)
                writer.write(bytes([header.block_id % 256]) * header.length)
                await writer.drain()
        except Exception:
            writer.close()

    async def __aenter__(self) -> pb.WorkerAddr:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return pb.WorkerAddr(worker_id="slow", host="127.0.0.1", port=port)

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()


def test_a_read_cancelled_while_its_thread_receives_leaves_the_socket_to_that_thread() -> None:
    """A hedged read that lost (or a dropped read-ahead) is cancelled while its thread still fills
    the buffer: the socket is neither closed under the thread nor lent to another read; once the
    thread is done it goes back to the pool, in step, and the next read on it gets its own answer."""

    async def main() -> None:
        worker = SlowWorker(delay=0.4)
        async with worker as addr:
            data = DataClient(ClientConfig(master="127.0.0.1:1", short_circuit=False, stall_timeout=5.0))
            try:
                task = asyncio.ensure_future(data.read(addr, 1, 0, 2 * MiB, "token"))
                await asyncio.sleep(0.2)  # the header is in, the payload is 0.2 s away
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                pool = data._socks[(addr.host, addr.port)]
                assert pool == [] and len(data._socket_owners) == 1
                # a read meanwhile takes a connection of its own
                assert await data.read(addr, 2, 0, MiB, "token") == b"\x02" * MiB
                await asyncio.sleep(0.5)  # the cancelled read's thread is done: its socket is pooled
                assert data._socket_owners == set()
                assert len(pool) == 2 and worker.connections == 2
                for block in (3, 4, 5):  # both pooled sockets are in step with their peer
                    assert await data.read(addr, block, 0, MiB, "token") == bytes([block]) * MiB
                assert worker.connections == 2
            finally:
                await data.close()

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_sending_to_a_peer_that_went_away_is_unavailable(loop: str) -> None:
    """A pipeline replica killed mid-block: uvloop raises RuntimeError on a write to the transport
    its ``connection_lost`` closed, which escaped the ``PCacheError`` handlers of the worker
    (a short-circuit commit failed whole instead of going on without that replica). An error
    without a message (``ConnectionResetError()``) is named by its type."""
    import uvloop

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await reader.read() == b""  # the peer closed
        with pytest.raises(Unavailable) as caught:
            for _ in range(200):  # the reset arrives after a write or two
                framing.send(writer, b"x" * 65536)
                await framing.drain(writer, 5)
                await asyncio.sleep(0.01)
        assert not str(caught.value).endswith(": ")  # the cause is named, never an empty message
        writer.close()
        server.close()

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())
