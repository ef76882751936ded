"""Streamed short-circuit writes: a sequential writer's blocks go straight into their files on the
worker of its host (real master and worker processes, SIGKILL, forged requests)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tracemalloc

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common import uds
from pcache.common.checksum import chunk_crcs, crc32c
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb

MiB = 1 << 20
BLOCK = 16 * MiB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(str(tmp_path_factory.mktemp("stream")), workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster):
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as pc:
        yield pc


def write_in_pieces(pc: Client, path: str, data: bytes, piece: int, **kw) -> None:
    with pc.open(path, "wb", block_size=BLOCK, **kw) as f:
        for i in range(0, len(data), piece):
            f.write(data[i : i + piece])


@pytest.mark.parametrize("size", [3 * MiB, 5 * MiB + 1, BLOCK, 3 * BLOCK + 12345])
@pytest.mark.parametrize("piece", [128 << 10, 8 * MiB])
def test_files_written_front_to_back_read_back_exactly(cluster: LocalCluster, size: int, piece: int) -> None:
    data = os.urandom(size)
    with Client(master=cluster.master_address) as pc:
        write_in_pieces(pc, f"/seq-{size}-{piece}", data, piece, replication=2)
        assert pc.read_file(f"/seq-{size}-{piece}") == data
        layout = pc.layout(f"/seq-{size}-{piece}")
        assert [b.length for b in layout.blocks] == [min(BLOCK, size - i) for i in range(0, size, BLOCK)]
        assert all(len(b.replicas) == 2 for b in layout.blocks)  # the worker pushed each down its pipeline
        assert [b.crc32c for b in layout.blocks] == [crc32c(data[i : i + BLOCK]) for i in range(0, size, BLOCK)]


def test_a_streamed_block_is_never_held_in_memory(cluster: LocalCluster) -> None:
    """64 MiB in 8 MiB writes: what the client allocates stays near the 4 MiB every block starts
    with in memory, not the 16 MiB block (buffered: up to four blocks in flight)."""
    data = os.urandom(8 * MiB)
    with Client(master=cluster.master_address) as pc:
        tracemalloc.start()
        try:
            with pc.open("/lean", "wb", block_size=BLOCK) as f:
                for _ in range(8):
                    f.write(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 12 * MiB, peak
        assert pc.stat("/lean").size == 64 * MiB
        with pc.open("/lean", "rb") as f:
            assert all(f.read(8 * MiB) == data for _ in range(8))


def test_a_write_back_into_a_streamed_block_and_a_read_of_it_see_every_byte(cluster: LocalCluster) -> None:
    data = bytearray(os.urandom(2 * BLOCK))
    with Client(master=cluster.master_address) as pc, pc.open("/back", "w+b", block_size=BLOCK) as f:
        f.write(data[: 10 * MiB])
        assert f._f.slots[0].stream is not None
        f.seek(MiB)
        f.write(b"x" * 1000)  # behind the stream's end: the block is buffered again
        data[MiB : MiB + 1000] = b"x" * 1000
        assert f._f.slots[0].stream is None
        f.seek(10 * MiB)
        f.write(data[10 * MiB : 12 * MiB])
        f.seek(0)
        assert f.read(12 * MiB) == data[: 12 * MiB]  # the writer reads its own bytes
        f.write(data[12 * MiB :])
    with Client(master=cluster.master_address) as pc:
        assert pc.read_file("/back") == data


def test_quota_held_by_a_stream_comes_back_when_the_file_ends_early(cluster: LocalCluster, admin: Client) -> None:
    """A stream allocates a whole block; a file that ends inside it has the master shrink the
    allocation, so the tenant is charged what the file holds, and nothing stays reserved."""
    admin.create_tenant("ts", quota_bytes=3 * BLOCK)
    token = admin.issue_token("ts")
    with Client(ClientConfig(master=cluster.master_address, token=token)) as pc:
        for i in range(5):  # five files of 6 MiB: each streamed into a 16 MiB allocation
            write_in_pieces(pc, f"/part{i}", os.urandom(6 * MiB), MiB)
        usage = {t.name: t for t in admin.tenants()}["ts"]
        assert (usage.used_bytes, usage.reserved_bytes) == (30 * MiB, 0)
        with pytest.raises(E.QuotaExceeded):  # 30 MiB used: a second 16 MiB block does not fit
            write_in_pieces(pc, "/over", os.urandom(BLOCK + 4 * MiB), MiB)
        usage = {t.name: t for t in admin.tenants()}["ts"]
        assert usage.used_bytes + usage.reserved_bytes <= 3 * BLOCK


def test_a_writer_whose_worker_is_killed_mid_stream_still_closes_with_its_bytes(tmp_path) -> None:
    data = os.urandom(2 * BLOCK + 5 * MiB)
    with LocalCluster(str(tmp_path / "c"), workers=2) as cluster, Client(master=cluster.master_address) as pc:
        with pc.open("/survivor", "wb", block_size=BLOCK, replication=2) as f:
            f.write(data[: BLOCK + 8 * MiB])
            stream = f._f.slots[1].stream
            assert stream is not None
            victim = next(i for i, p in enumerate(cluster.worker_procs) if f"/{p.name}/" in stream.targets[0].uds_path)
            cluster.kill(cluster.worker_procs[victim], signal.SIGKILL)
            f.write(data[BLOCK + 8 * MiB :])  # into the dead worker's file: the descriptor is ours
        layout = pc.layout("/survivor")
        assert all(b.replicas for b in layout.blocks[1:])
        assert pc.read_file("/survivor") == data  # the blocks streamed to the dead worker: stored elsewhere


def test_shrinking_is_the_writers_own_and_never_grows(cluster: LocalCluster) -> None:
    """From the attacker's side: shrinking another file's allocation, with a forged or another
    block's token, to more bytes, or committing a short block with the long token: all refused."""
    with Client(master=cluster.master_address) as pc:
        mine = pc._run(
            pc.aio.master.create("/mine", mode=0o644, exclusive=True, truncate=False, block_size=BLOCK, replication=1)
        )
        other = pc._run(
            pc.aio.master.create("/other", mode=0o644, exclusive=True, truncate=False, block_size=BLOCK, replication=1)
        )
        loc = pc._run(pc.aio.master.allocate_block(mine.id, BLOCK, "", []))
        loc2 = pc._run(pc.aio.master.allocate_block(mine.id, BLOCK, "", []))
        shrink = pc.aio.master.shrink_block
        with pytest.raises(E.Conflict):
            pc._run(shrink(other.id, loc.block_id, MiB, loc.token))  # not that file's allocation
        with pytest.raises(E.PermissionDenied):
            pc._run(shrink(mine.id, loc.block_id, MiB, loc2.token))  # another block's token
        forged = loc.token.rsplit(".", 1)[0] + ".AAAA"
        with pytest.raises(E.PermissionDenied):
            pc._run(shrink(mine.id, loc.block_id, MiB, forged))
        with pytest.raises(E.InvalidArgument):
            pc._run(shrink(mine.id, loc.block_id, BLOCK + 1, loc.token))  # more bytes
        head = loc.replicas[0]
        data = os.urandom(MiB)

        async def sc(token_for_commit: str, crcs: list[int], crc: int) -> str:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, head.uds_path)
                opened = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=loc.block_id, length=BLOCK, token=loc.token)
                await uds.send_frame(sock, opened, None, 5)
                reply, fd = await uds.recv_frame(sock, 5)
                assert reply.error == "" and fd is not None
                os.pwrite(fd, data, 0)
                os.close(fd)
                done = pb.DataHeader(
                    op=pb.SC_WRITE_COMMIT, block_id=loc.block_id, write_handle=reply.write_handle,
                    crc32c=crc, chunk_crcs=crcs, token=token_for_commit,
                )  # fmt: skip
                await uds.send_frame(sock, done, None, 5)
                return (await uds.recv_frame(sock, 5))[0].error
            finally:
                sock.close()

        crcs, crc = chunk_crcs(data)
        assert asyncio.run(sc(loc.token, crcs, crc)) == "InvalidArgument"  # 1 MiB under a 16 MiB token
        short = pc._run(shrink(mine.id, loc.block_id, MiB, loc.token))
        assert pc._run(shrink(mine.id, loc.block_id, MiB, loc.token))  # a retried shrink: the same answer
        with pytest.raises(E.InvalidArgument):
            pc._run(shrink(mine.id, loc.block_id, BLOCK, loc.token))  # and never back up
        assert asyncio.run(sc(short, [c ^ 1 for c in crcs], crc ^ 1)) == ""  # lies about its CRCs...
        blk = pb.CommittedBlock(block_id=loc.block_id, length=MiB, crc32c=crc ^ 1, replicas=[head.worker_id])
        pc._run(pc.aio.master.commit_file(mine.id, MiB, [blk], 0.0, replace=True))
        with pytest.raises((E.CorruptBlock, E.Unavailable)):  # ...and its block is never served
            pc.read_file("/mine")


def test_a_client_without_a_local_worker_spends_one_allocation_finding_out(
    cluster: LocalCluster, admin: Client
) -> None:
    """A writer on a node with no worker (here: a client that cannot reach any worker's socket)
    gets its first stream placed elsewhere: that allocation is given up (released at the commit)
    and the client buffers its writes for a while instead of asking again for every file."""
    admin.create_tenant("tr")
    token = admin.issue_token("tr")
    with Client(ClientConfig(master=cluster.master_address, token=token)) as pc:
        pc.aio.data.can_short_circuit = lambda addr: False  # as on a node without a worker
        calls: list[int] = []
        allocate = pc.aio.master.allocate_block

        async def counting(inode, size, node, exclude):
            calls.append(size)
            return await allocate(inode, size, node, exclude)

        pc.aio.master.allocate_block = counting
        files = {f"/remote{i}": os.urandom(6 * MiB) for i in range(3)}
        for path, data in files.items():
            write_in_pieces(pc, path, data, MiB)
        assert calls == [BLOCK, 6 * MiB, 6 * MiB, 6 * MiB]  # one stream tried, then buffered blocks
        assert all(pc.read_file(p) == d for p, d in files.items())
        usage = {t.name: t for t in admin.tenants()}["tr"]
        assert (usage.used_bytes, usage.reserved_bytes) == (18 * MiB, 0)
