"""Worker-to-worker connections (a pipeline's next hop, a re-replication) are kept for the next
block to the same worker, on real data servers on loopback: one connection carries many blocks,
a peer that restarted or an idle connection past its time is never used, nothing is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pcache.common.auth import KeyRing, mint_block_token
from pcache.common.checksum import crc32c
from pcache.proto import pcache_pb2 as pb
from pcache.worker import dataserver
from pcache.worker.blockstore import DiskBlockStore
from pcache.worker.dataserver import DataServer
from pcache.worker.memtier import MemoryTier


async def _noop(block_id: int) -> None:
    return None


class Served:
    """A worker's data server on a loopback port, with the connections it accepted."""

    def __init__(self, worker_id: str, root: Path, ring: KeyRing, port: int = 0) -> None:
        self.ds = DataServer(worker_id, DiskBlockStore(str(root / worker_id)), MemoryTier(0), io_timeout=5,
                             on_corrupt=_noop, peer_timeout=2.0)  # fmt: skip
        self.ds.tokens.set_keys(ring.format())
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> Served:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            await self.ds.handle(reader, writer)

        self.server = await asyncio.start_server(handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """As a killed worker: its listening socket and every connection closed."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()
        self.ds.close_peers()

    def addr(self) -> pb.WorkerAddr:
        return pb.WorkerAddr(worker_id=self.ds.worker_id, host="127.0.0.1", port=self.port)


def test_blocks_to_one_worker_share_a_connection_and_a_restarted_peer_gets_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = KeyRing.generate()

    def token(block_id: int) -> str:
        return mint_block_token(ring, block_id, "w", "t", 600, ["w1", "w2"], length=len(data(block_id)))

    def data(block_id: int) -> bytes:
        return bytes([block_id % 251]) * (4096 + block_id)

    async def send(src: DataServer, block_id: int, targets: list[pb.WorkerAddr]) -> list[str]:
        body = data(block_id)

        async def piece(offset: int, n: int) -> bytes:
            return body[offset : offset + n]

        return await src.send_block(block_id, crc32c(body), len(body), piece, targets, token=token(block_id),
                                    pipeline=True)  # fmt: skip

    monkeypatch.setattr(dataserver, "PEER_SWEEP", 0.1)

    async def scenario() -> None:
        w0 = await Served("w0", tmp_path, ring).start()  # the sender (a short-circuit writer's worker)
        w1 = await Served("w1", tmp_path, ring).start()
        w2 = await Served("w2", tmp_path, ring).start()
        try:
            for block_id in range(1, 11):  # w0 -> w1 -> w2: a pipeline of two hops, ten blocks
                assert await send(w0.ds, block_id, [w1.addr(), w2.addr()]) == ["w1", "w2"]
            assert (w1.ds.accepted, w2.ds.accepted) == (1, 1)  # was one connection (and a PING) per block
            for block_id in range(1, 11):
                assert w2.ds.store.read(block_id, 0, 4096 + block_id) == data(block_id)

            await w2.stop()  # restarted: the connection w1 kept is closed by its end
            w2 = await Served("w2", tmp_path / "again", ring, port=w2.port).start()
            await asyncio.sleep(0.1)  # the end of file reaches w1's event loop
            assert await send(w0.ds, 11, [w1.addr(), w2.addr()]) == ["w1", "w2"]
            assert not w1.ds._is_stalled(w2.addr())  # the dead connection was never written to
            assert w2.ds.accepted == 1 and w2.ds.store.read(11, 0, 4107) == data(11)

            monkeypatch.setattr(dataserver, "PEER_IDLE", 0.2)
            await asyncio.sleep(0.3)  # both kept connections idle past their time: closed, not used
            assert await send(w0.ds, 12, [w1.addr(), w2.addr()]) == ["w1", "w2"]
            assert await send(w0.ds, 13, [w1.addr(), w2.addr()]) == ["w1", "w2"]
            assert (w1.ds.accepted, w2.ds.accepted) == (2, 2)

            # restarted on another port: never asked again under the old address, its kept
            # connection (closed at the far end) is closed by the sweep (it was left half closed)
            monkeypatch.setattr(dataserver, "PEER_IDLE", 30.0)
            old = w2.addr()
            await w2.stop()
            w2 = await Served("w2", tmp_path / "moved", ring).start()
            assert w2.addr().port != old.port and w1.ds.idle_peers() == 1
            assert await send(w0.ds, 14, [w1.addr(), w2.addr()]) == ["w1", "w2"]
            for _ in range(50):
                if w1.ds.idle_peers() == 1:
                    break
                await asyncio.sleep(0.05)
            assert w1.ds.idle_peers() == 1 and w1.ds._idle_peers.keys() == {dataserver._peer_key(w2.addr())}
        finally:
            for served in (w0, w1, w2):
                await served.stop()

    asyncio.run(scenario())
