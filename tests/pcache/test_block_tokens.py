"""The data plane from an attacker's side (real worker processes, raw frames on TCP and on the
short-circuit socket): every block operation without a valid block token for that block, that
operation and that worker is refused, and the victim's block stays as it was on every replica.
A block id is written once: even the writer's own token cannot overwrite it."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from pcache.client import Client
from pcache.common import framing, uds
from pcache.common.auth import KeyRing, mint_block_token
from pcache.common.checksum import crc32c
from pcache.common.config import ClientConfig
from pcache.common.credentials import ClusterKeys
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb

DATA = b"victim's checkpoint shard " * 4000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(str(tmp_path_factory.mktemp("btok")), workers=3) as c:
        with Client(ClientConfig(master=c.master_address, token=c.token)) as pc:
            pc.write_file("/victim", DATA, replication=2)
        yield c


def _victim(cluster: LocalCluster) -> tuple[pb.FileLayout, list[pb.WorkerAddr]]:
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        layout = pc.layout("/victim")
        workers = [w.info.addr for w in pc.status().workers]
    return layout, workers


async def _tcp(addr: pb.WorkerAddr, header: pb.DataHeader, payload: bytes = b"") -> pb.DataHeader:
    reader, writer = await framing.open_connection(addr.host, addr.port, 5)
    try:
        await framing.write_frame(writer, header, payload, timeout=5)
        reply, plen = await framing.read_header(reader, 5)
        if plen:
            await framing.read_exactly(reader, plen, 5)
        return reply
    finally:
        framing.close_writer(writer)


async def _sc(addr: pb.WorkerAddr, header: pb.DataHeader) -> tuple[pb.DataHeader, int | None]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, addr.uds_path)
        await uds.send_frame(sock, header, None, 5)
        return await uds.recv_frame(sock, 5)
    finally:
        sock.close()


def _bad_tokens(cluster: LocalCluster, block_id: int, holders: list[str], good: str) -> dict[str, str]:
    ring = ClusterKeys.load(str(cluster.keys_file)).blocks
    flipped = good[:-3] + ("A" if good[-3] != "A" else "B") + good[-2:]
    return {
        "none": "",
        "garbage": "garbage",
        "flipped": flipped,
        "expired": mint_block_token(ring, block_id, "rwd", "default", ttl=1, workers=holders, now=time.time() - 60),
        "other-block": mint_block_token(ring, block_id + 1, "rwd", "default", ttl=600, workers=holders),
        "other-worker": mint_block_token(ring, block_id, "rwd", "default", ttl=600, workers=["w-elsewhere"]),
        "other-cluster": mint_block_token(KeyRing.generate(), block_id, "rwd", "default", ttl=600, workers=holders),
        "master-token": cluster.token,
    }


def test_every_data_operation_refuses_a_bad_block_token(cluster: LocalCluster) -> None:
    layout, _ = _victim(cluster)
    block = layout.blocks[0]
    holders = [r.worker_id for r in block.replicas]
    assert len(holders) == 2
    bad = _bad_tokens(cluster, block.block_id, holders, block.token)
    # the layout's token reads, and only reads
    read_only = {"read-token-for-write": block.token, "read-token-for-delete": block.token}

    async def probe() -> dict[tuple[str, str, str], str]:
        out = {}
        for addr in block.replicas:
            for why, token in {**bad, **read_only}.items():
                if why != "read-token-for-delete":
                    write = pb.DataHeader(
                        op=pb.WRITE_BLOCK, block_id=block.block_id, crc32c=crc32c(b"evil"), token=token
                    )
                    out[(addr.worker_id, "WRITE_BLOCK", why)] = (await _tcp(addr, write, b"evil")).error
                    sc_write = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=block.block_id, length=4, token=token)
                    reply, fd = await _sc(addr, sc_write)
                    out[(addr.worker_id, "SC_WRITE_OPEN", why)] = reply.error
                    assert fd is None
                if why != "read-token-for-write":
                    delete = pb.DataHeader(op=pb.DELETE_BLOCK, block_id=block.block_id, token=token)
                    out[(addr.worker_id, "DELETE_BLOCK", why)] = (await _tcp(addr, delete)).error
                if why in read_only:
                    continue
                for op in (pb.READ_BLOCK, pb.READ_RAW):
                    read = pb.DataHeader(op=op, block_id=block.block_id, offset=0, length=100, token=token)
                    out[(addr.worker_id, pb.DataOp.Name(op), why)] = (await _tcp(addr, read)).error
                reply, fd = await _sc(addr, pb.DataHeader(op=pb.SC_READ_OPEN, block_id=block.block_id, token=token))
                out[(addr.worker_id, "SC_READ_OPEN", why)] = reply.error
                assert fd is None  # no descriptor of the block file leaves the worker
                commit = pb.DataHeader(op=pb.SC_WRITE_COMMIT, block_id=block.block_id, write_handle="x", token=token)
                out[(addr.worker_id, "SC_WRITE_COMMIT", why)] = (await _sc(addr, commit))[0].error
        return out

    errors = asyncio.run(probe())
    assert len(errors) == 2 * (len(bad) * 7 + 3)
    assert {k: v for k, v in errors.items() if v != "PermissionDenied"} == {}
    # nothing changed: both replicas still serve the victim's bytes, and the master sees no damage
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        for addr in block.replicas:
            got = pc._run(pc.aio.data.read(addr, block.block_id, 0, len(DATA), block.token))
            assert got == DATA
        status = pc.status()
        assert (status.missing_blocks, status.corrupt_blocks, status.under_replicated_blocks) == (0, 0, 0)


def test_a_read_token_works_only_at_the_replicas_it_names(cluster: LocalCluster) -> None:
    layout, workers = _victim(cluster)
    block = layout.blocks[0]
    holders = {r.worker_id for r in block.replicas}
    outsider = next(w for w in workers if w.worker_id not in holders)
    read = pb.DataHeader(op=pb.READ_BLOCK, block_id=block.block_id, offset=0, length=100, token=block.token)
    assert asyncio.run(_tcp(block.replicas[0], read)).error == ""
    assert asyncio.run(_tcp(outsider, read)).error == "PermissionDenied"  # replayed at another worker


def test_a_block_id_is_written_once_whatever_the_token(cluster: LocalCluster) -> None:
    """The writer's own allocation token (rwd at the pipeline) cannot rewrite its committed block:
    AlreadyExists on TCP and on the short circuit, and the bytes stay."""
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        f = pc.open("/once", "wb")
        data = b"first bytes" * 1000
        block_id, stored, locations, token = pc._run(pc.aio.write_block(f._f.inode, data, crc32c(data)))
        assert stored
        evil = b"other bytes" * 1000
        for addr in locations:
            header = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=block_id, crc32c=crc32c(evil), token=token)
            assert asyncio.run(_tcp(addr, header, evil)).error == "AlreadyExists"
            sc_open = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=block_id, length=len(evil), token=token)
            reply, fd = asyncio.run(_sc(addr, sc_open))
            assert reply.error == "AlreadyExists" and fd is None
            assert pc._run(pc.aio.data.read(addr, block_id, 0, len(data), token)) == data
        f.close()


def test_an_expired_layout_token_is_renewed_by_the_reader(cluster: LocalCluster) -> None:
    """A reader whose file stays open past its tokens' expiry asks the master again, without an
    error (as HDFS clients refetch on InvalidBlockTokenException)."""
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        f = pc.open("/victim", "rb")
        ring = ClusterKeys.load(str(cluster.keys_file)).blocks
        for slot in f._f.slots:  # as if the hour had passed
            slot.token = mint_block_token(ring, slot.block_id, "r", "default", ttl=1,
                                          workers=[a.worker_id for a in slot.locations], now=time.time() - 60)  # fmt: skip
        assert f.read() == DATA
        f.close()
