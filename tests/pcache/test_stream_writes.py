"""Streamed short-circuit writes: a sequential writer's blocks go straight into their files on the
worker of its host (real master and worker processes, SIGKILL, forged requests)."""

from __future__ import annotations

import os
import signal
import tracemalloc

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.checksum import chunk_crcs, crc32c
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb
from pcache.testing.faults import raw_sc_write

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
    """128 MiB in 8 MiB writes: the client allocates about the first 16 MiB block (buffered) and
    then the 4 MiB each streamed block starts with; buffered, every block would be (up to four
    16 MiB blocks in flight)."""
    data = os.urandom(8 * MiB)
    with Client(master=cluster.master_address) as pc:
        tracemalloc.start()
        try:
            with pc.open("/lean", "wb", block_size=BLOCK) as f:
                for _ in range(16):
                    f.write(data)
                    assert all(s.data is None or len(s.data) <= 8 * MiB for s in f._f.slots[1:])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 2 * BLOCK, peak  # buffered: 4 x 16 MiB in flight
        assert pc.stat("/lean").size == 128 * MiB
        with pc.open("/lean", "rb") as f:
            assert all(f.read(8 * MiB) == data for _ in range(16))


def test_a_write_back_into_a_streamed_block_and_a_read_of_it_see_every_byte(cluster: LocalCluster) -> None:
    data = bytearray(os.urandom(3 * BLOCK))
    b = BLOCK  # block 1 streams (the first block of a file is always buffered)
    with Client(master=cluster.master_address) as pc, pc.open("/back", "w+b", block_size=BLOCK) as f:
        f.write(data[: b + 10 * MiB])
        assert f._f.slots[1].stream is not None
        f.seek(b + MiB)
        f.write(b"x" * 1000)  # behind the stream's end: the block is buffered again
        data[b + MiB : b + MiB + 1000] = b"x" * 1000
        assert f._f.slots[1].stream is None
        f.seek(b + 10 * MiB)
        f.write(data[b + 10 * MiB : b + 12 * MiB])
        f.seek(0)
        assert f.read(b + 12 * MiB) == data[: b + 12 * MiB]  # the writer reads its own bytes
        f.write(data[b + 12 * MiB :])
    with Client(master=cluster.master_address) as pc:
        assert pc.read_file("/back") == data


def test_a_file_that_ends_inside_a_streamed_block_gives_the_streams_allocation_back(
    cluster: LocalCluster, admin: Client
) -> None:
    """A stream allocates a whole block. A file that ends inside it stores its last block buffered
    (exact length) and gives the stream's allocation back (``AbandonBlocks``): the tenant's quota
    is free of it at once (it was held for ``master.orphan_grace``, and a second file of the
    same size was refused below the quota). Every worker then refuses the abandoned id, so its
    token cannot store bytes charged to nobody (test_block_tokens)."""
    admin.create_tenant("ts", quota_bytes=5 * BLOCK)
    token = admin.issue_token("ts")
    data = os.urandom(2 * BLOCK + 6 * MiB)
    with Client(ClientConfig(master=cluster.master_address, token=token)) as pc:
        write_in_pieces(pc, "/ends-early", data, MiB)
        assert pc.read_file("/ends-early") == data
        assert [b.length for b in pc.layout("/ends-early").blocks] == [BLOCK, BLOCK, 6 * MiB]
        usage = {t.name: t for t in admin.tenants()}["ts"]
        assert (usage.used_bytes, usage.reserved_bytes) == (len(data), 0)
        more = os.urandom(BLOCK + 4 * MiB)
        write_in_pieces(pc, "/more", more, MiB)  # 2 x 16 + 6 used: a 16 MiB block and 4 MiB fit
        assert pc.read_file("/more") == more
        usage = {t.name: t for t in admin.tenants()}["ts"]
        assert (usage.used_bytes, usage.reserved_bytes) == (len(data) + len(more), 0)
        with pytest.raises(E.QuotaExceeded):  # 58 MiB used: no two more 16 MiB blocks
            write_in_pieces(pc, "/over", os.urandom(2 * BLOCK), MiB)
        usage = {t.name: t for t in admin.tenants()}["ts"]
        assert usage.used_bytes + usage.reserved_bytes <= 5 * BLOCK


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


def test_a_client_that_lies_about_its_crcs_spoils_only_its_own_block(cluster: LocalCluster) -> None:
    """From the attacker's side: the worker takes a short-circuit writer's chunk CRCs without
    reading the block back, so a writer can name wrong ones; the block it may write is then
    refused to every reader (never served), and nothing else is touched."""
    with Client(master=cluster.master_address) as pc:
        node = pc._run(
            pc.aio.master.create("/liar", mode=0o644, exclusive=True, truncate=False, block_size=BLOCK, replication=1)
        )
        data = os.urandom(MiB)
        loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
        head = loc.replicas[0]

        crcs, crc = chunk_crcs(data)

        def sc(crcs: list[int], crc: int) -> str:
            return raw_sc_write(head.uds_path, loc.block_id, len(data), loc.token, data, crc, crcs)

        assert sc([crcs[0], 1], crc) == "InvalidArgument"  # not one CRC per chunk
        loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
        head = loc.replicas[0]
        assert sc([c ^ 1 for c in crcs], crc ^ 1) == ""  # taken as given...
        blk = pb.CommittedBlock(block_id=loc.block_id, length=len(data), crc32c=crc ^ 1, replicas=[head.worker_id])
        pc._run(pc.aio.master.commit_file(node.id, len(data), [blk], 0.0, replace=True))
        with pytest.raises((E.CorruptBlock, E.Unavailable)):  # ...and the block is never served
            pc.read_file("/liar")


def test_a_client_without_a_local_worker_spends_one_allocation_finding_out(
    cluster: LocalCluster, admin: Client
) -> None:
    """A writer on a node with no worker (here: a client that cannot reach any worker's socket)
    gets its first stream placed elsewhere: that allocation is given back at once
    (``AbandonBlocks``) and the client buffers its writes for a while instead of asking again
    for every file."""
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
        files = {f"/remote{i}": os.urandom(BLOCK + 6 * MiB) for i in range(3)}
        for path, data in files.items():
            write_in_pieces(pc, path, data, MiB)
        # every block once, plus one stream tried (block 1 of the first file), not one per file
        assert sorted(calls) == [6 * MiB] * 3 + [BLOCK] * 4
        assert all(pc.read_file(p) == d for p, d in files.items())
        usage = {t.name: t for t in admin.tenants()}["tr"]
        assert (usage.used_bytes, usage.reserved_bytes) == (3 * (BLOCK + 6 * MiB), 0)
