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
from pcache.common.errors import PCacheError
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb
from pcache.testing.faults import raw_sc_write

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
        "expired": mint_block_token(
            ring, block_id, "rwd", "default", ttl=1, workers=holders, now=time.time() - 60, length=4
        ),
        "other-block": mint_block_token(ring, block_id + 1, "rwd", "default", ttl=600, workers=holders, length=4),
        "other-worker": mint_block_token(ring, block_id, "rwd", "default", ttl=600, workers=["w-elsewhere"], length=4),
        "other-cluster": mint_block_token(
            KeyRing.generate(), block_id, "rwd", "default", ttl=600, workers=holders, length=4
        ),
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
    """The writer's own allocation token (rw at the pipeline) cannot rewrite its block (AlreadyExists
    on TCP and on the short circuit) nor delete it to write it again (PermissionDenied): the bytes stay."""
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
            delete = pb.DataHeader(op=pb.DELETE_BLOCK, block_id=block_id, token=token)
            assert asyncio.run(_tcp(addr, delete)).error == "PermissionDenied"
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


def test_a_writer_stores_exactly_what_it_was_allocated_and_commits_that(cluster: LocalCluster) -> None:
    """The quota is charged for the block's allocated length, so neither a worker nor the master
    takes another one: a larger payload on TCP or through the short-circuit descriptor, a commit
    naming a shorter length, or a block listed twice (freed twice, charged once) are refused."""

    from pcache.common import errors as E

    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        node = pc._run(
            pc.aio.master.create(
                "/sized", mode=0o644, exclusive=True, truncate=False, block_size=1 << 20, replication=2
            )
        )
        with pytest.raises(E.InvalidArgument, match="at most"):
            pc._run(pc.aio.master.allocate_block(node.id, (1 << 20) + 1, "", []))
        data = b"x" * 4096
        loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
        # a write token dies with the reservation (master.orphan_grace, 600 s), not after the hour
        # of a read token: past it the bytes it lets a writer store are no longer charged
        assert int(loc.token.split(".")[7]) <= time.time() + 601
        big = data * 16
        head = loc.replicas[0]
        over_tcp = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(big), token=loc.token)
        assert asyncio.run(_tcp(head, over_tcp, big)).error == "PermissionDenied"
        sc_big = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=loc.block_id, length=len(big), token=loc.token)
        assert asyncio.run(_sc(head, sc_big))[0].error == "PermissionDenied"

        # opened for the right length, then more written through the fd
        more = raw_sc_write(head.uds_path, loc.block_id, len(data), loc.token, big, crc32c(big))
        assert more == "InvalidArgument"  # the file holds more than was announced
        # the right length is stored; the commit must name it, once
        right = pb.DataHeader(
            op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), pipeline=list(loc.replicas[1:]),
            token=loc.token,
        )  # fmt: skip
        stored = asyncio.run(_tcp(head, right, data))
        assert stored.error == "" and stored.replicas
        blk = pb.CommittedBlock(block_id=loc.block_id, length=1, crc32c=crc32c(data), replicas=list(stored.replicas))
        with pytest.raises(E.InvalidArgument, match="allocated for 4096 bytes, not 1"):
            pc._run(pc.aio.master.commit_file(node.id, 1, [blk], 0.0, replace=True))
        blk.length = len(data)
        pc._run(pc.aio.master.commit_file(node.id, len(data), [blk], 0.0, replace=True))
        assert pc.read_file("/sized") == data
        twice = pb.CommittedBlock(block_id=loc.block_id, length=len(data), replicas=list(stored.replicas))
        with pytest.raises(E.InvalidArgument, match="appears twice"):
            pc._run(pc.aio.master.commit_file(node.id, (1 << 20) + len(data), [twice, twice], 0.0))
        assert pc.stat("/sized").size == len(data)


def _allocated_pair(pc: Client, path: str, data: bytes) -> tuple[pb.Inode, pb.BlockLocation, pb.DataHeader]:
    """A new file of 1 MiB blocks on two workers, one block allocated for ``data``, and the
    write frame (its token, its pipeline) that stores it."""
    node = pc._run(
        pc.aio.master.create(path, mode=0o644, exclusive=True, truncate=False, block_size=1 << 20, replication=2)
    )
    loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
    frame = pb.DataHeader(
        op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), pipeline=list(loc.replicas[1:]),
        token=loc.token,
    )  # fmt: skip
    return node, loc, frame


def _present(pc: Client, addr: pb.WorkerAddr, loc: pb.BlockLocation, length: int) -> bool:
    """Whether the worker at ``addr`` holds the block of ``loc`` (read with its token)."""
    from pcache.common import errors as E

    try:
        pc._run(pc.aio.data.read(addr, loc.block_id, 0, length, loc.token))
    except E.NotFound:
        return False
    return True


def _refuses_the_token(addr: pb.WorkerAddr, loc: pb.BlockLocation, frame: pb.DataHeader, data: bytes) -> bool:
    """Whether the worker refuses every write of the block with its token: the pipeline's frame,
    a write to it alone, a short-circuit open."""
    alone = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), token=loc.token)
    sc_open = pb.DataHeader(op=pb.SC_WRITE_OPEN, block_id=loc.block_id, length=len(data), token=loc.token)
    return (
        asyncio.run(_tcp(addr, frame, data)).error == "PermissionDenied"
        and asyncio.run(_tcp(addr, alone, data)).error == "PermissionDenied"
        and asyncio.run(_sc(addr, sc_open))[0].error == "PermissionDenied"
    )


def test_a_write_token_replayed_after_its_file_is_deleted_stores_nothing(cluster: LocalCluster) -> None:
    """A block token cannot be revoked: a tenant that committed a block, deleted the file (its
    bytes no longer charged) and sent the same write frame again stored the block again on every
    holder, charged to nobody until the next full block report (30 blocks over a 8 MiB quota in
    five cycles). The master's DELETE now makes each holder refuse writes of that id while a
    write token of it may still be valid."""
    from pcache.testing.faults import wait_for

    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        data = b"r" * 8192
        node, loc, frame = _allocated_pair(pc, "/replayed", data)
        stored = asyncio.run(_tcp(loc.replicas[0], frame, data))
        assert stored.error == "" and len(stored.replicas) == 2
        blk = pb.CommittedBlock(
            block_id=loc.block_id, length=len(data), crc32c=crc32c(data), replicas=list(stored.replicas)
        )
        pc._run(pc.aio.master.commit_file(node.id, len(data), [blk], 0.0, replace=True))
        holders = [a for a in loc.replicas if a.worker_id in stored.replicas]
        pc.unlink("/replayed")
        wait_for(lambda: not any(_present(pc, a, loc, len(data)) for a in holders), 15, "the holders to delete it")
        assert all(_refuses_the_token(a, loc, frame, data) for a in holders)  # the whole pipeline, each alone
        assert not any(_present(pc, a, loc, len(data)) for a in holders)


def test_a_write_token_of_an_abandoned_block_stores_nothing_for_long(cluster: LocalCluster) -> None:
    """``AbandonBlocks`` gives a writer's quota back before its write token expires: the token
    replayed afterwards must not store bytes charged to nobody. Every worker deletes the id
    (a write that raced the command goes with it) and refuses it from then on; the block can
    never be committed."""
    from pcache.common import errors as E
    from pcache.testing.faults import wait_for

    with Client(ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=False)) as pc:
        data = b"g" * 8192
        node, loc, frame = _allocated_pair(pc, "/given-up", data)
        before = pc.status().tenants[0].reserved_bytes
        pc._run(pc.aio.abandon_blocks(node.id, [loc.block_id]))
        assert pc.status().tenants[0].reserved_bytes == before - len(data)  # given back at once
        asyncio.run(_tcp(loc.replicas[0], frame, data))  # may land before the DELETE reaches the workers
        wait_for(lambda: not any(_present(pc, a, loc, len(data)) for a in loc.replicas), 15, "the workers to delete it")
        assert all(_refuses_the_token(a, loc, frame, data) for a in loc.replicas)
        assert not any(_present(pc, a, loc, len(data)) for a in loc.replicas)
        blk = pb.CommittedBlock(block_id=loc.block_id, length=len(data), crc32c=crc32c(data))
        with pytest.raises(E.Conflict):  # not reserved any more: never part of a file
            pc._run(pc.aio.master.commit_file(node.id, len(data), [blk], 0.0, replace=True))


@pytest.mark.parametrize("short_circuit", [False, True])
def test_a_replica_holding_another_blocks_bytes_is_never_served(cluster: LocalCluster, short_circuit: bool) -> None:
    """Other bytes stored under a block id on one replica (deleted and written again through the
    worker's own door, as a holder of the block keys could: the worker's own checks pass) are
    caught by the reader, which compares the whole-block CRC32C the replica reports with the
    committed one: it reads the good replica and reports the bad one."""
    ring = ClusterKeys.load(str(cluster.keys_file)).blocks
    cfg = ClientConfig(master=cluster.master_address, token=cluster.token, short_circuit=short_circuit)
    with Client(cfg) as pc:
        name = f"/wrong-{short_circuit}"
        mine, other = b"m" * 5000, b"o" * 5000
        pc.write_file(name, mine, replication=2)
        block = pc.layout(name).blocks[0]
        victim = block.replicas[0]
        ids = [victim.worker_id]
        delete = pb.DataHeader(
            op=pb.DELETE_BLOCK, block_id=block.block_id,
            token=mint_block_token(ring, block.block_id, "d", "default", ttl=60, workers=ids),
        )  # fmt: skip
        assert asyncio.run(_tcp(victim, delete)).error == ""
        write = pb.DataHeader(
            op=pb.WRITE_BLOCK, block_id=block.block_id, crc32c=crc32c(other),
            token=mint_block_token(ring, block.block_id, "w", "default", ttl=60, workers=ids, length=len(other)),
        )  # fmt: skip
        assert asyncio.run(_tcp(victim, write, other)).error == ""
        with pytest.raises(Exception, match="another block is stored under this id"):
            pc._run(pc.aio.data.read(victim, block.block_id, 0, len(mine), block.token, block.crc32c))
        for _ in range(3):  # whichever replica a reader tries first: the right bytes
            assert pc.read_file(name) == mine


def test_a_pipeline_goes_only_to_the_workers_of_the_token(cluster: LocalCluster) -> None:
    """A writer names the next replicas itself: a worker forwards only to the worker ids its
    block token names, and checks with a PING that the address is that worker before any block
    byte or the token leaves (a client-supplied address could point at any service)."""
    import socket as socket_mod
    import threading

    listener = socket_mod.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(15)
    got: list[bytes] = []

    def accept() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                conn.settimeout(5)
                try:
                    while chunk := conn.recv(1 << 16):
                        got.append(chunk)
                        if sum(map(len, got)) > 64:
                            break  # a PING frame is shorter: close on it like a foreign service would
                except OSError:
                    pass
                conn.close()
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
            node = pc._run(
                pc.aio.master.create(
                    "/piped", mode=0o644, exclusive=True, truncate=False, block_size=1 << 20, replication=2
                )
            )
            data = b"p" * 4096
            loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
            head, second = loc.replicas[0], loc.replicas[1]
            stranger = pb.WorkerAddr(worker_id="w-not-in-token", host="127.0.0.1", port=port)
            header = pb.DataHeader(
                op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), pipeline=[stranger], token=loc.token
            )
            assert asyncio.run(_tcp(head, header, data)).error == "PermissionDenied"
            impostor = pb.WorkerAddr(worker_id=second.worker_id, host="127.0.0.1", port=port)
            header = pb.DataHeader(
                op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), pipeline=[impostor], token=loc.token
            )
            reply = asyncio.run(_tcp(head, header, data))
            assert reply.error == "" and list(reply.replicas) == [head.worker_id]  # went on without it
    finally:
        listener.close()
    sent = b"".join(got)
    assert sent and loc.token.encode() not in sent and data not in sent  # only the PING reached it


def test_a_connection_that_makes_no_request_is_closed_soon(cluster: LocalCluster) -> None:
    """No credential, no buffer: an oversized header is refused at once; a connection that sends
    nothing, or half a header, is closed after about 10 s (not the 300 s a pooled one may idle);
    the worker serves others meanwhile."""
    layout, _ = _victim(cluster)
    addr = layout.blocks[0].replicas[0]

    async def probe() -> dict[str, float]:
        async def closed_after(first: bytes) -> float:
            reader, writer = await asyncio.open_connection(addr.host, addr.port)
            started = time.monotonic()
            writer.write(first)
            await writer.drain()
            try:
                async with asyncio.timeout(30):
                    while await reader.read(1 << 16):
                        pass
            finally:
                writer.close()
            return time.monotonic() - started

        async def pinging() -> float:  # PING needs no token: it does not keep a connection open
            reader, writer = await asyncio.open_connection(addr.host, addr.port)
            started = time.monotonic()
            try:
                async with asyncio.timeout(30):
                    while True:
                        await framing.write_frame(writer, pb.DataHeader(op=pb.PING), timeout=5)
                        await framing.read_header(reader, 5)
                        await asyncio.sleep(2)
            except (OSError, PCacheError):
                return time.monotonic() - started
            finally:
                writer.close()

        pings = asyncio.ensure_future(pinging())
        silent = asyncio.ensure_future(closed_after(b""))
        half = asyncio.ensure_future(closed_after(framing.PREFIX.pack(1000, 0) + b"\0" * 10))
        big = await closed_after(framing.PREFIX.pack(1 << 20, 0))
        read = pb.DataHeader(
            op=pb.READ_BLOCK, block_id=layout.blocks[0].block_id, length=10, token=layout.blocks[0].token
        )
        assert (await _tcp(addr, read)).error == ""
        return {"big": big, "silent": await silent, "half": await half, "pings": await pings}

    took = asyncio.run(probe())
    assert took["big"] < 2 and all(8 < took[k] < 20 for k in ("silent", "half", "pings")), took


def test_one_block_id_has_one_writer_at_a_time(cluster: LocalCluster) -> None:
    """A second WRITE_BLOCK of a block id being written is refused (each would reserve the block's
    length of the worker's disk)."""
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        node = pc._run(
            pc.aio.master.create("/one-writer", mode=0o644, exclusive=True, truncate=False, block_size=1 << 20,
                                 replication=1)
        )  # fmt: skip
        data = b"q" * 8192
        loc = pc._run(pc.aio.master.allocate_block(node.id, len(data), "", []))
        head = loc.replicas[0]
        header = pb.DataHeader(op=pb.WRITE_BLOCK, block_id=loc.block_id, crc32c=crc32c(data), token=loc.token)

        async def race() -> tuple[str, str]:
            reader, writer = await framing.open_connection(head.host, head.port, 5)
            try:
                await framing.write_frame(writer, header, data[:100], payload_len=len(data), timeout=5)
                await asyncio.sleep(0.5)  # the first write is under way
                second = (await _tcp(head, header, data)).error
                writer.write(data[100:])
                reply, _ = await framing.read_header(reader, 5)
                return second, reply.error
            finally:
                framing.close_writer(writer)

        assert asyncio.run(race()) == ("AlreadyExists", "")
