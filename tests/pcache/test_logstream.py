"""The replication stream (``pcache.master.logstream``) from an attacker's side and a leader's:
nothing is applied without a master-scope token in the first frame, a connection that stalls or
sends oversized or unknown frames is closed, an older leader is told the newer epoch."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from pcache.common import errors as E
from pcache.common.auth import Guard, KeyRing, mint_token
from pcache.master import logstream
from pcache.master.logstream import APPEND, ERROR, FRAME, HELLO, REPLY, frame
from pcache.master.metastore import MemoryMetaStore
from pcache.master.replication import REPLICATION_SCOPES, ReplicatedStore, ReplicationServicer
from pcache.proto import pcache_pb2 as pb

RING = KeyRing.generate()


def entries(n: int, start: int = 1, epoch: int = 7) -> list[pb.LogEntry]:
    return [
        pb.LogEntry(index=i, epoch=epoch, puts=[pb.KeyValue(key=b"k%d" % i, value=b"v")])
        for i in range(start, start + n)
    ]


async def follower() -> tuple[ReplicationServicer, int, asyncio.base_events.Server]:
    servicer = ReplicationServicer(
        ReplicatedStore(MemoryMetaStore()), "f1", lambda: False, Guard(RING, REPLICATION_SCOPES)
    )
    server = await logstream.serve(servicer, "127.0.0.1", 0, None)
    return servicer, server.sockets[0].getsockname()[1], server


async def exchange(port: int, *frames: bytes, wait: float = 5.0) -> list[tuple[int, bytes]]:
    """Send raw frames; every frame the follower sends back until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(frames))
    got: list[tuple[int, bytes]] = []
    try:
        async with asyncio.timeout(wait):
            while True:
                head = await reader.readexactly(FRAME.size)
                length, kind = FRAME.unpack(head)
                got.append((kind, await reader.readexactly(length)))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # closed by the follower
    finally:
        writer.close()
    return got


def error_of(got: list[tuple[int, bytes]]) -> dict:
    assert got and got[-1][0] == ERROR, got
    return json.loads(got[-1][1])


def append(prev: int, items: list[pb.LogEntry], epoch: int = 7) -> bytes:
    request = pb.AppendRequest(epoch=epoch, leader="evil", prev_index=prev, prev_epoch=7 if prev else 0, entries=items)
    return frame(APPEND, request.SerializeToString())


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-token",
        mint_token(RING, "default", "tenant"),  # a tenant may not write the namespace log
        mint_token(RING, "default", "admin"),
        mint_token(KeyRing.generate(), "cluster", "master"),  # another cluster's master
        mint_token(RING, "cluster", "master", ttl=1, now=0.0),  # expired
    ],
    ids=["none", "garbage", "tenant", "admin", "other-cluster", "expired"],
)
def test_entries_behind_a_hello_without_a_master_token_are_never_applied(token: str) -> None:
    async def scenario() -> None:
        servicer, port, server = await follower()
        try:
            got = await exchange(port, frame(HELLO, token.encode()), append(0, entries(3)))
            assert error_of(got)["error"] == "PermissionDenied"
            assert servicer.store.index == 0 and servicer.store.get(b"k1") is None
        finally:
            server.close()

    asyncio.run(scenario())


def test_no_hello_an_oversized_hello_or_an_unknown_kind_is_refused() -> None:
    async def scenario() -> None:
        servicer, port, server = await follower()
        try:
            assert error_of(await exchange(port, append(0, entries(2))))["error"] == "PermissionDenied"
            huge = FRAME.pack(logstream.MAX_HELLO + 1, HELLO)  # refused on its length, before any body
            assert error_of(await exchange(port, huge))["error"] == "ProtocolError"
            good = frame(HELLO, mint_token(RING, "cluster", "master").encode())
            oversized = FRAME.pack(logstream.MAX_FRAME + 1, APPEND)
            assert error_of(await exchange(port, good, oversized))["error"] == "ProtocolError"
            assert error_of(await exchange(port, good, frame(99, b"x")))["error"] == "ProtocolError"
            assert error_of(await exchange(port, good, frame(APPEND, b"\xff\xff\xff")))["error"] == "ProtocolError"
            assert servicer.store.index == 0
        finally:
            server.close()

    asyncio.run(scenario())


def test_a_connection_that_sends_no_hello_in_time_is_closed(monkeypatch) -> None:
    monkeypatch.setattr(logstream, "HELLO_TIMEOUT", 0.3)

    async def scenario() -> None:
        _, port, server = await follower()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(struct.pack(">I", 5))  # part of a frame head, then nothing
            async with asyncio.timeout(5):
                data = await reader.read()  # until EOF
            writer.close()
            length, kind = FRAME.unpack_from(data)
            assert kind == ERROR and json.loads(data[FRAME.size : FRAME.size + length])["error"] == "PermissionDenied"
        finally:
            server.close()

    asyncio.run(scenario())


def test_a_leader_gets_answers_in_order_and_an_older_one_learns_the_newer_epoch() -> None:
    async def scenario() -> None:
        servicer, port, server = await follower()
        replies: list[pb.AppendResponse] = []
        try:
            token = mint_token(RING, "cluster", "master")
            stream = await logstream.connect("127.0.0.1", port, token, replies.append, timeout=5.0, tls=None)
            stream.append(pb.AppendRequest(epoch=7, leader="a", prev_index=0, prev_epoch=0, entries=entries(3)))
            stream.append(pb.AppendRequest(epoch=7, leader="a", prev_index=5, prev_epoch=7, entries=entries(1, 6)))
            for _ in range(200):
                if len(replies) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [(r.ok, r.applied_index) for r in replies] == [(True, 3), (False, 3)]  # a gap is refused
            assert servicer.store.get(b"k3") == b"v"
            stream.close()

            servicer.epoch = 9  # a newer leader has been here since
            old = await logstream.connect("127.0.0.1", port, token, replies.append, timeout=5.0, tls=None)
            old.append(pb.AppendRequest(epoch=7, leader="a", prev_index=3, prev_epoch=7, entries=entries(1, 4)))
            with pytest.raises(E.StaleEpoch) as info:
                await asyncio.wait_for(old.done, 5)
            assert info.value.epoch == 9 and servicer.store.index == 3
        finally:
            server.close()

    asyncio.run(scenario())


def test_a_follower_that_is_not_listening_is_a_clear_error() -> None:
    async def scenario() -> None:
        _, port, server = await follower()
        server.close()
        await server.wait_closed()
        with pytest.raises(E.Unavailable, match="replication stream"):
            await logstream.connect("127.0.0.1", port, "t", lambda r: None, timeout=2.0, tls=None)

    asyncio.run(scenario())


def test_reply_frames_carry_their_kind() -> None:
    assert FRAME.unpack_from(frame(REPLY, b"abc")) == (3, REPLY)
