"""Edge cases a first user hit: write counts, failed writers, symlinks, conflicts, special files, text mode."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.config import ClientConfig, load_config

MiB = 1 << 20


def count_block_writes(client: Client) -> list[int]:
    calls: list[int] = []
    original = client.aio.write_block

    async def counting(inode, data, crc, chunk_crcs=None, on_allocated=None):
        calls.append(len(data))
        return await original(inode, data, crc, chunk_crcs, on_allocated)

    client.aio.write_block = counting
    return calls


def test_each_block_is_written_once(client: Client) -> None:
    calls = count_block_writes(client)
    try:
        with client.open("/once", "wb", block_size=MiB) as f:
            for _ in range(4):
                f.write(os.urandom(MiB))
            f.write(b"tail")
    finally:
        del client.aio.write_block
    assert calls == [MiB] * 4 + [4]


def test_shrink_then_grow_in_one_handle(client: Client) -> None:
    bs = 65536
    with client.open("/v2", "wb", block_size=bs) as f:
        f.write(b"p" * (2 * bs + 3))
    with client.open("/v2", "r+b") as f:
        assert f.read(10) == b"p" * 10
        f.seek(2 * bs + 3)
        f.write(b"1")
        f.truncate(0)
        f.truncate(10)
        f.seek(10)
        f.write(b"y" * (bs + 1))
    assert client.read_file("/v2") == bytes(10) + b"y" * (bs + 1)


def test_a_failed_writer_leaves_the_old_content(client: Client) -> None:
    client.write_file("/keep", b"precious")
    with pytest.raises(RuntimeError), client.open("/keep", "wb") as f:
        f.write(b"half-written")
        raise RuntimeError("the writer dies")
    assert client.read_file("/keep") == b"precious"
    f = client.open("/keep", "wb")  # opening with 'w' empties nothing until close
    assert client.read_file("/keep") == b"precious"
    f.close()
    assert client.read_file("/keep") == b""


def test_symlinks_are_followed_by_open(client: Client) -> None:
    client.mkdir("/ln/dir", parents=True)
    client.write_file("/ln/dir/target", b"data")
    client.symlink("dir/target", "/ln/rel")
    client.symlink("/ln/rel", "/ln/abs-to-rel")
    assert client.read_file("/ln/rel") == b"data"
    assert client.read_file("/ln/abs-to-rel") == b"data"
    with client.open("/ln/rel", "ab") as f:
        f.write(b"+more")
    assert client.read_file("/ln/dir/target") == b"data+more"
    assert client.stat("/ln/rel").kind == "symlink"  # stat does not follow
    client.symlink("/ln/loop2", "/ln/loop1")
    client.symlink("/ln/loop1", "/ln/loop2")
    with pytest.raises(E.SymlinkLoop) as info:
        client.read_file("/ln/loop1")
    assert info.value.errno == errno.ELOOP


def test_two_writers_of_disjoint_blocks_both_keep_their_bytes(client: Client) -> None:
    with client.open("/two", "wb", block_size=MiB) as f:
        f.write(b"a" * (2 * MiB))
    w1, w2 = client.open("/two", "r+b"), client.open("/two", "r+b")
    w1.write(b"1")
    w2.seek(MiB)
    w2.write(b"2")
    w1.close()
    w2.close()  # merged at block granularity: w1 changed block 0 only, w2 block 1 only
    data = client.read_file("/two")
    assert data[:2] == b"1a" and data[MiB : MiB + 2] == b"2a" and len(data) == 2 * MiB


def test_two_writers_of_one_block_last_close_conflicts_instead_of_losing(client: Client) -> None:
    with client.open("/two1", "wb", block_size=MiB) as f:
        f.write(b"a" * (2 * MiB))
    w1, w2 = client.open("/two1", "r+b"), client.open("/two1", "r+b")
    w1.write(b"1")
    w2.seek(10)
    w2.write(b"2")
    w1.close()
    with pytest.raises(E.Conflict) as info:
        w2.close()
    assert info.value.errno == errno.ESTALE
    data = client.read_file("/two1")
    assert data[:1] == b"1" and data[10:11] == b"a"  # the first close won, whole
    # a writer that truncates is never merged: the second commit conflicts even on other blocks
    w1, w2 = client.open("/two1", "r+b"), client.open("/two1", "r+b")
    w1.write(b"x")
    w2.truncate(MiB + 5)
    w1.close()
    with pytest.raises(E.Conflict):
        w2.close()
    assert client.stat("/two1").size == 2 * MiB


def test_put_skips_fifos_and_refuses_devices(shared_cluster, client: Client, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    os.mkfifo(src / "fifo")
    files, _ = client.put(str(src), "/special")
    assert files == 1 and client.read_file("/special/a.txt") == b"a"
    assert not client.exists("/special/fifo")
    with pytest.raises(E.InvalidArgument):
        client.put("/dev/zero", "/zero")
    assert not client.exists("/zero")


def test_text_mode(client: Client) -> None:
    with client.open("/text.txt", "w") as f:
        f.write("héllo\nwörld\n")
    with client.open("/text.txt", "r") as f:
        assert f.readlines() == ["héllo\n", "wörld\n"]
    with pytest.raises(E.InvalidArgument):
        client.open("/text.txt", "rbb")


def test_config_values_are_range_checked() -> None:
    for bad in ("--master.default_replication=-1", "--master.default_block_size=0", "--client.read_unit=1"):
        with pytest.raises(E.InvalidArgument):
            load_config(None, [bad])
    with pytest.raises(E.InvalidArgument):
        load_config(None, ["--foo.bar=1"])


def test_cli_local_errors_are_one_line(shared_cluster, client: Client, tmp_path: Path) -> None:
    client.write_file("/one.txt", b"1")
    res = subprocess.run(
        [sys.executable, "-m", "pcache", "--master", shared_cluster.master_address, "get", "/one.txt",
         str(tmp_path / "missing-dir" / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "No such file or directory" in res.stderr


def test_cli_bad_master_address_is_a_usage_error() -> None:
    for bad in ("127.0.0.1:99999", "127.0.0.1", "bogus", ":0"):
        res = subprocess.run([sys.executable, "-m", "pcache", "--master", bad, "ls", "/"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 3 and "HOST:PORT" in res.stderr and res.stderr.count("\n") == 1, (bad, res.stderr)


def test_cli_cat_into_head_succeeds_and_an_interrupted_get_leaves_nothing(
    shared_cluster, client: Client, tmp_path: Path
) -> None:
    import signal
    import time

    data = os.urandom(96 << 20)
    client.write_file("/big-cli.bin", data)
    cmd = [sys.executable, "-m", "pcache", "--master", shared_cluster.master_address]
    cat = subprocess.run(f"{' '.join(cmd)} cat /big-cli.bin | head -c 10 > /dev/null; exit ${{PIPESTATUS[0]}}",
                         shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cat.returncode == 0 and cat.stderr == ""  # the reader had all it wanted: not an error
    out = tmp_path / "out.bin"
    part = tmp_path / "out.bin.pcache-part"
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([*cmd, "get", "/big-cli.bin", str(out)], stderr=subprocess.PIPE, text=True)
        while not part.exists() and proc.poll() is None:
            time.sleep(0.002)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        if proc.returncode == 0:  # finished before the signal landed: the copy is whole
            assert out.read_bytes() == data
            out.unlink()
            continue
        assert proc.returncode == 2 and "pcache: interrupted" in err, err
        assert not part.exists()  # no half-copied file left behind
        if out.exists():  # the signal landed after the rename: then the copy is whole
            assert out.read_bytes() == data
            out.unlink()
    # a destination it cannot write names the destination, not the copy's temporary file
    nowhere = tmp_path / "no-such-dir" / "x.bin"
    refused = subprocess.run([*cmd, "get", "/big-cli.bin", str(nowhere)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and str(nowhere) in refused.stderr, refused.stderr
    assert ".pcache-part" not in refused.stderr


def test_replication_above_the_worker_count_is_not_reported_forever(make_cluster) -> None:
    cluster = make_cluster(workers=1)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/rf", b"x" * 1000, replication=2)
        status = pc.status()
        assert status.under_replicated_blocks == 0 and status.missing_blocks == 0


@pytest.mark.parametrize("existing", [False, True])
def test_concurrent_pwrites_on_one_handle(client: Client, existing: bool) -> None:
    """Parts written at once, out of order, into one handle (Babel's multipart into pcache://)."""
    import asyncio
    import random

    size = 9 * MiB + 12345
    want = bytearray(os.urandom(size))
    path = f"/pwrite-{existing}"
    if existing:
        client.write_file(path, os.urandom(size))
    pieces = [(off, bytes(want[off : off + 700_000])) for off in range(0, size, 700_000)]  # straddle blocks
    random.Random(3).shuffle(pieces)

    async def go() -> None:
        f = await client.aio.open(path, "r+b" if existing else "wb", block_size=MiB)
        await asyncio.gather(*(f.pwrite(data, off) for off, data in pieces))
        assert f.tell() == 0  # pwrite never moves the position
        await f.close()

    client._run(go())
    assert client.read_file(path) == bytes(want)


@pytest.mark.parametrize("short_circuit", [True, False], ids=["short-circuit", "tcp"])
def test_positional_reads_across_unit_and_block_boundaries_are_never_short(shared_cluster, short_circuit: bool) -> None:
    unit = 192 << 10  # read units whose boundaries fall inside blocks
    data = os.urandom(3 * MiB + 777)
    cfg = ClientConfig(master=shared_cluster.master_address, read_unit=unit, short_circuit=short_circuit)
    with Client(cfg) as pc:
        pc.write_file(f"/edges-{short_circuit}", data, block_size=MiB)
        f = pc.open(f"/edges-{short_circuit}", "rb")
        boundaries = sorted({*range(MiB, len(data), MiB), *range(unit, len(data), unit)})
        for boundary in boundaries:
            for size in (4096, 100_003, 128 << 10, unit, MiB):
                for offset in (boundary - size // 2, boundary - 1, boundary - size - 1, boundary):
                    if offset >= 0:
                        assert f.pread(offset, size) == data[offset : offset + size], (offset, size)
        got, pos = bytearray(), 0
        while chunk := f.pread(pos, 100_003):  # a read() loop stops at the first short answer
            got += chunk
            pos += len(chunk)
        assert bytes(got) == data
        f.close()


def test_a_new_file_whose_writer_fails_or_aborts_is_not_left_behind(client: Client) -> None:
    with pytest.raises(RuntimeError), client.open("/aborted-new", "wb") as f:
        f.write(b"half")
        raise RuntimeError("the job died")
    assert not client.exists("/aborted-new")
    client.write_file("/aborted-old", b"old")
    with pytest.raises(RuntimeError), client.open("/aborted-old", "wb") as f:
        f.write(b"new")
        raise RuntimeError("the job died")
    assert client.read_file("/aborted-old") == b"old"  # an existing file keeps its content
    # text modes too (a helper's drill found ckpt_adapter.save's buffered writer committing
    # half a checkpoint when torch.save raised; a text file's buffers did the same)
    client.write_file("/aborted-text", b"old\n")
    for path in ("/aborted-text", "/aborted-text-new"):
        with pytest.raises(RuntimeError), client.open(path, "w") as text:
            text.write("new line\n" * 10_000)
            raise RuntimeError("the job died")
    assert client.read_file("/aborted-text") == b"old\n" and not client.exists("/aborted-text-new")
    with client.open("/aborted-text", "a") as text:  # and a text file that ends well is committed
        text.write("appended\n")
    assert client.read_file("/aborted-text") == b"old\nappended\n"


def test_fsyncs_racing_writes_on_one_handle_lose_nothing(client: Client) -> None:
    import threading

    f = client.open("/racing.log", "wb")
    stop = threading.Event()

    def appender(tag: str) -> None:
        for i in range(150):
            f.append(f"{tag} {i}\n".encode())

    def syncer() -> None:
        while not stop.is_set():
            f.fsync()  # commits while appends go on: none may be left out, nor zeros let in

    threads = [threading.Thread(target=appender, args=(t,)) for t in "ABCD"]
    sync_thread = threading.Thread(target=syncer)
    sync_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    sync_thread.join()
    f.close()
    lines = client.read_file("/racing.log").decode().splitlines()
    assert sorted(lines) == sorted(f"{t} {i}" for t in "ABCD" for i in range(150))


def test_an_open_from_the_metadata_cache_reads_the_new_version_once_the_old_blocks_are_gone(make_cluster) -> None:
    """A reader's cached layout (metadata_ttl) names blocks a writer's replace has since freed
    and the workers deleted: the read takes the current layout instead of failing."""
    from pcache.testing.faults import replica_files, wait_for

    cluster = make_cluster(workers=2)
    old, new = os.urandom(3 * (1 << 20)), os.urandom(2 * (1 << 20) + 7)
    # over TCP: a short-circuit descriptor would still read the deleted file for up to a second
    cfg = ClientConfig(master=cluster.master_address, metadata_ttl=30.0, short_circuit=False)
    with Client(cfg) as reader, Client(master=cluster.master_address) as writer:
        writer.write_file("/ckpt", old, block_size=1 << 20, replication=1)
        assert reader.read_file("/ckpt") == old  # the layout is cached now
        files = [p for replicas in replica_files(writer.layout("/ckpt")) for p in replicas]
        writer.write_file("/ckpt", new, block_size=1 << 20, replication=1)
        wait_for(lambda: not any(p.exists() for p in files), 30, "the old version's block files deleted")
        assert reader.read_file("/ckpt") == new
        assert reader.read_file("/ckpt") == new  # the stale entry is gone from the cache too


def test_a_handle_opened_before_a_commit_reads_what_replaced_its_deleted_blocks(make_cluster) -> None:
    """Copy-on-write frees a replaced block at once. A reader opened before the commit takes the
    new version, never EIO; a writer's clean block reads the block that replaced it, and the writer
    still conflicts if it changes that block; a writer's position the commit cut off is ESTALE."""
    from pcache.testing.faults import replica_files, wait_for

    cluster = make_cluster(workers=2)
    bs = 1 << 20
    cfg = ClientConfig(master=cluster.master_address, short_circuit=False, readahead_units=0)
    with Client(cfg) as mine, Client(master=cluster.master_address) as other:
        other.write_file("/shared", b"o" * (3 * bs), block_size=bs, replication=1)
        reader, writer, clean = (mine.open("/shared", mode) for mode in ("rb", "r+b", "r+b"))
        files = [p for replicas in replica_files(other.layout("/shared")) for p in replicas]
        with other.open("/shared", "r+b") as f:  # replaces blocks 1 and 2
            f.seek(bs)
            f.write(b"n" * (2 * bs) + b"tail")
        wait_for(lambda: not any(p.exists() for p in files[1:]), 30, "the replaced blocks' files deleted")
        assert reader.pread(bs - 2, 4) == b"oonn"
        assert reader.pread(3 * bs, 10) == b"tail"  # the new version, whole
        assert writer.pread(2 * bs, 3) == b"nnn"  # a clean block of a writer: the successor's bytes
        writer.seek(bs + 5)
        writer.write(b"w")  # its block 1 was replaced since its view: the commit must not land
        with pytest.raises(E.Conflict):
            writer.close()
        reader.close()
        assert mine.read_file("/shared") == b"o" * bs + b"n" * (2 * bs) + b"tail"

        cut = [p for replicas in replica_files(mine.layout("/shared"))[1:] for p in replicas]
        with other.open("/shared", "r+b") as f:
            f.truncate(bs)
        wait_for(lambda: not any(p.exists() for p in cut), 30, "the cut blocks' files deleted")
        with pytest.raises(E.StaleHandle) as info:
            clean.pread(2 * bs, 10)
        assert info.value.errno == errno.ESTALE
        clean.close()  # nothing written: nothing to commit
        with mine.open("/shared", "rb") as late:
            assert late.pread(0, 4 * bs) == b"o" * bs


def test_a_reader_that_returned_bytes_keeps_its_snapshot_or_fails_estale_never_mixing(make_cluster) -> None:
    """From a helper's drill: a handle that had read the start of a 100 MiB file went on with the
    bytes of a 70 MiB rewrite committed meanwhile (old and new in one read, a Parquet footer of
    the wrong file). After its first byte a handle's view stays its version: a block that version
    lost fails ESTALE; ``refresh()`` (or a new open) takes the new version."""
    from pcache.testing.faults import replica_files, wait_for

    cluster = make_cluster(workers=2)
    bs = 1 << 20
    old, new = os.urandom(4 * bs), os.urandom(3 * bs)
    cfg = ClientConfig(master=cluster.master_address, short_circuit=False, readahead_units=0)
    with Client(cfg) as mine, Client(master=cluster.master_address) as other:
        other.mkdir("/ds")
        other.write_file("/ds/part", old, block_size=bs, replication=1)
        reader = mine.open("/ds/part", "rb")
        assert reader.read(bs) == old[:bs]
        files = [p for replicas in replica_files(other.layout("/ds/part")) for p in replicas]
        other.write_file("/ds/part", new, block_size=bs, replication=1)
        wait_for(lambda: not any(p.exists() for p in files), 30, "the old version's block files deleted")
        with pytest.raises(E.StaleHandle) as info:
            reader.read()
        assert info.value.errno == errno.ESTALE and "reopen" in str(info.value)
        assert reader.refresh() is True  # asked for: the new version, whole
        reader.seek(0)
        assert reader.read() == new
        reader.close()


def test_concurrent_stats_and_creates_share_batches(shared_cluster) -> None:
    """Calls made while one is in flight leave together in one Batch RPC; each gets its own
    answer or error, in order."""
    import asyncio

    from pcache.client import PCacheClient

    async def scenario() -> None:
        pc = PCacheClient(ClientConfig(master=shared_cluster.master_address, metadata_ttl=0.0))
        sent: list[str] = []  # round trips: a lone call's name, or "Batch" for several ops in one
        real, real_stream = pc.master._call, pc.master._on_stream

        async def counting(name, request):
            sent.append(name)
            return await real(name, request)

        async def streamed(request):  # a message on the client's BatchStream
            ops = request.ops
            sent.append("Batch" if len(ops) > 1 else ops[0].WhichOneof("op").capitalize())
            return await real_stream(request)

        pc.master._call, pc.master._on_stream = counting, streamed  # type: ignore[method-assign]
        try:
            await pc.mkdir("/batched", parents=True)
            sent.clear()
            files = [await pc.open(f"/batched/f{i}", "wb") for i in range(3)]
            for f in files:
                await f.close()
            assert sent == ["Create", "Create", "Create"]  # one at a time: no batching, no delay
            sent.clear()
            writers = [pc.open(f"/batched/g{i}", "xb") for i in range(40)]
            handles = await asyncio.gather(*writers)
            for f in handles:
                await f.close()
            assert sent.count("Batch") >= 1 and len(sent) < 40  # 40 creates in far fewer round trips
            sent.clear()
            paths = [f"/batched/g{i}" for i in range(40)] + ["/batched/missing", "/batched/f1"]
            results = await asyncio.gather(*(pc.stat(p) for p in paths), return_exceptions=True)
            assert len(sent) < len(paths)
            assert [r.path for r in results[:40]] == paths[:40]
            assert isinstance(results[40], E.NotFound) and results[41].path == "/batched/f1"
            again = await asyncio.gather(*(pc.open(f"/batched/g{i}", "xb") for i in range(5)), return_exceptions=True)
            assert all(isinstance(r, E.AlreadyExists) for r in again)  # per-call errors from a batch
        finally:
            await pc.close()

    asyncio.run(scenario())


def test_a_batch_is_one_write_that_reads_its_own_creates_and_answers_a_request_id_once(shared_cluster) -> None:
    """The master writes a batch's creates and their reply records as one local write: a stat
    later in the batch sees a create before it, a create sent twice with one request id (a
    retry that caught up with its first) is applied once, and an op that fails is its own
    error. The same on the stream and on a ``Batch`` call."""
    import asyncio

    import grpc

    from pcache.common.auth import bearer
    from pcache.proto import pcache_pb2 as pb
    from pcache.proto import pcache_pb2_grpc as pb_grpc

    def create(path: str, rid: str) -> pb.BatchOp:
        header = pb.RequestHeader(request_id=rid)
        return pb.BatchOp(create=pb.CreateRequest(header=header, path=path, mode=0o644, exclusive=True))

    def ops(d: str) -> list[pb.BatchOp]:
        return [
            create(f"{d}/a", f"{d}:1"),
            pb.BatchOp(stat=pb.PathRequest(path=f"{d}/a")),
            create(f"{d}/a", f"{d}:1"),  # the same request again: its answer, not AlreadyExists
            create(f"{d}/a", f"{d}:2"),  # another request: a second exclusive create of it fails
            create(f"{d}/missing/x", f"{d}:3"),
            create(f"{d}/b", f"{d}:4"),
        ]

    async def run() -> tuple[list[pb.BatchResult], list[pb.BatchResult]]:
        meta = bearer(shared_cluster.admin_token)
        async with grpc.aio.insecure_channel(shared_cluster.master_address) as channel:
            stub = pb_grpc.MasterStub(channel)
            await stub.Mkdir(pb.MkdirRequest(path="/onewrite/u", mode=0o755, parents=True), metadata=meta, timeout=5)
            await stub.Mkdir(pb.MkdirRequest(path="/onewrite/s", mode=0o755, parents=True), metadata=meta, timeout=5)
            unary = await stub.Batch(pb.BatchRequest(ops=ops("/onewrite/u")), metadata=meta, timeout=5)
            stream = stub.BatchStream(metadata=meta, timeout=10)
            await stream.write(pb.BatchRequest(ops=ops("/onewrite/s")))
            streamed = await stream.read()
            await stream.done_writing()
            return list(unary.results), list(streamed.results)

    for results in asyncio.run(run()):
        first = results[0].inode
        assert first.created and first.id
        assert results[1].inode.id == first.id and not results[1].error
        assert results[2].inode.id == first.id and not results[2].error
        assert results[3].error == "AlreadyExists"
        assert results[4].error == "NotFound"
        assert results[5].inode.created and results[5].inode.id not in (0, first.id)


def test_statahead_lists_a_page_for_a_rising_run_of_stats(shared_cluster) -> None:
    import asyncio

    from pcache.client import PCacheClient

    async def run() -> tuple[int, int, list]:
        async with PCacheClient(ClientConfig(master=shared_cluster.master_address, metadata_ttl=30)) as pc:
            await pc.mkdir("/statahead", parents=True)
            for i in range(250):
                async with await pc.open(f"/statahead/f{i:04d}", "wb") as f:
                    await f.write(b"x" * i)
            pc._stat_cache.clear()
            calls = {"stat": 0, "listdir": 0}
            real_stat, real_list = pc.master.stat, pc.master.listdir

            async def stat(path: str):
                calls["stat"] += 1
                return await real_stat(path)

            async def listdir(path: str, start_after: str = "", limit: int = 0):
                calls["listdir"] += 1
                return await real_list(path, start_after, limit)

            pc.master.stat, pc.master.listdir = stat, listdir  # count the RPCs the loop makes
            sizes = [(await pc.stat(f"/statahead/f{i:04d}")).size for i in range(250)]
            with pytest.raises(FileNotFoundError):
                await pc.stat("/statahead/f9999")  # past the end: still a clear error
            return calls["stat"], calls["listdir"], sizes

    stats, listings, sizes = asyncio.run(run())
    assert sizes == list(range(250))
    assert stats <= 4 and listings == 1, (stats, listings)  # was 250 stats


def test_a_client_asks_a_master_that_takes_no_layouts_in_a_batch_for_them_one_by_one() -> None:
    """A client newer than its master (a rolling upgrade, clients first): the master's Batch
    refuses the layout ops it does not know, each alone; the client asks those again by
    GetLayout, and from then on sends layouts by GetLayout only. Opens never fail for it."""
    import asyncio
    import collections

    from pcache.proto import pcache_pb2 as pb
    from pcache.proto import pcache_pb2_grpc as pb_grpc

    calls: collections.Counter[str] = collections.Counter()

    class OldMaster(pb_grpc.MasterServicer):
        async def Batch(self, request: pb.BatchRequest, context) -> pb.BatchResponse:
            calls["Batch"] += 1
            out = pb.BatchResponse()
            for op in request.ops:
                result = out.results.add()
                if op.HasField("stat"):
                    result.inode.name = op.stat.path.rsplit("/", 1)[-1]
                else:  # what the release before answers an op its oneof does not hold
                    result.error, result.message = "InvalidArgument", "unknown batch op None"
            return out

        async def Stat(self, request: pb.PathRequest, context) -> pb.Inode:
            calls["Stat"] += 1
            return pb.Inode(name=request.path.rsplit("/", 1)[-1])

        async def GetLayout(self, request: pb.LayoutRequest, context) -> pb.FileLayout:
            calls["GetLayout"] += 1
            return pb.FileLayout(inode=pb.Inode(name=request.path.rsplit("/", 1)[-1]))

    async def run() -> None:
        async with _client_of(OldMaster()) as client:
            first = await asyncio.gather(*(client.layout(path=f"/f{i}") for i in range(10)))
            assert [x.inode.name for x in first] == [f"f{i}" for i in range(10)]
            assert calls == {"GetLayout": 10, "Batch": 1}  # one alone, nine refused in a Batch and asked again
            second = await asyncio.gather(*(client.layout(path=f"/g{i}") for i in range(10)))
            assert [x.inode.name for x in second] == [f"g{i}" for i in range(10)]
            assert calls == {"GetLayout": 20, "Batch": 1}
            stats = await asyncio.gather(*(client.stat(f"/s{i}") for i in range(5)))  # stats still batch
            assert [x.name for x in stats] == [f"s{i}" for i in range(5)]
            assert (calls["Stat"], calls["Batch"]) == (1, 2)  # one alone, four in a Batch

    asyncio.run(run())


def test_a_mutation_retried_by_grpc_carries_its_first_request_id_to_one_master() -> None:
    """One master: gRPC sends a call answered UNAVAILABLE again by itself (a master restarted
    within its retry window may have applied the first). Every try carries the same request id,
    so the master answers the retry from its record instead of applying it twice: a mkdir, and
    the creates of a batch a master without ``BatchStream`` takes as a ``Batch`` call."""
    import asyncio
    import collections

    import grpc

    from pcache.proto import pcache_pb2 as pb
    from pcache.proto import pcache_pb2_grpc as pb_grpc

    seen: collections.defaultdict[str, list[list[str]]] = collections.defaultdict(list)

    class FlakyMaster(pb_grpc.MasterServicer):  # applies, then the answer is lost, once per call kind
        async def Mkdir(self, request: pb.MkdirRequest, context) -> pb.Inode:
            seen["Mkdir"].append([request.header.request_id])
            if len(seen["Mkdir"]) == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost after applying")
            return pb.Inode(id=7, name=request.path.rsplit("/", 1)[-1])

        async def Batch(self, request: pb.BatchRequest, context) -> pb.BatchResponse:
            seen["Batch"].append([op.create.header.request_id for op in request.ops])
            if len(seen["Batch"]) == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost after applying")
            return pb.BatchResponse(
                results=[pb.BatchResult(inode=pb.Inode(id=i + 10)) for i in range(len(request.ops))]
            )

        async def Create(self, request: pb.CreateRequest, context) -> pb.Inode:
            return pb.Inode(id=1)

    async def run() -> None:
        async with _client_of(FlakyMaster()) as client:
            assert (await client.mkdir("/d", 0o755, False)).id == 7
            await client.create("/first", mode=0o644, exclusive=True, truncate=False, block_size=0, replication=0)
            made = await asyncio.gather(
                *(
                    client.create(f"/f{i}", mode=0o644, exclusive=True, truncate=False, block_size=0, replication=0)
                    for i in range(4)
                )
            )
            assert sorted(m.id for m in made) == [1, 10, 11, 12]  # one alone (Create), three in a Batch

    asyncio.run(run())
    (first, again) = seen["Mkdir"]
    assert first == again and first[0]  # one id, on both tries
    assert len(seen["Batch"]) == 2 and seen["Batch"][0] == seen["Batch"][1] and all(seen["Batch"][0])


def test_a_create_whose_stream_broke_after_the_master_applied_it_is_answered_once() -> None:
    """One master: a create on the batch stream whose connection breaks with no answer (the
    master may have applied it) is sent again the ordinary way with its request id, so the
    master answers it from its record: the caller gets its inode, not an error for a file that
    was made."""
    import asyncio

    import grpc

    from pcache.proto import pcache_pb2 as pb
    from pcache.proto import pcache_pb2_grpc as pb_grpc

    streamed: list[str] = []
    unary: list[str] = []

    class BreakingMaster(pb_grpc.MasterServicer):  # applies the stream's create, then the stream dies
        async def BatchStream(self, requests, context):
            await context.send_initial_metadata(())
            async for request in requests:
                streamed.extend(op.create.header.request_id for op in request.ops)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")  # no PCache error
                yield pb.BatchResponse()  # pragma: no cover

        async def Create(self, request: pb.CreateRequest, context) -> pb.Inode:
            unary.append(request.header.request_id)
            return pb.Inode(id=5, name="f")

    async def run() -> None:
        async with _client_of(BreakingMaster()) as client:
            made = await client.create("/f", mode=0o644, exclusive=True, truncate=False, block_size=0, replication=0)
            assert made.id == 5

    asyncio.run(run())
    assert len(streamed) == 1 and streamed[0] and unary == streamed  # the same id, applied once


@contextlib.asynccontextmanager
async def _client_of(servicer) -> AsyncIterator:
    """A MasterClient of ``servicer`` served on a loopback port (a fake master's test)."""
    import grpc

    from pcache.client.master import MasterClient
    from pcache.proto import pcache_pb2_grpc as pb_grpc

    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = MasterClient(ClientConfig(master=f"127.0.0.1:{port}", token="t"), "c1")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(None)


def test_a_new_client_reaches_a_restarted_master_at_once(make_cluster) -> None:
    """gRPC shares connections between the channels of a process: a client made right after a
    master came back inherited another client's reconnect backoff to it and failed with that
    client's "Connection refused" (an HA test saw it on `master_statuses` after a restart)."""
    import signal
    import time

    cluster = make_cluster(workers=1)
    address = cluster.master_address
    with Client(ClientConfig(master=address, token=cluster.token, rpc_timeout=2.0)) as old:
        old.status()
        cluster.kill(cluster.master, signal.SIGKILL)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # its connection fails and backs off, to 1 s between tries
            ((_, answer),) = old.master_statuses()
            assert isinstance(answer, E.Unavailable)
            time.sleep(0.05)
        cluster.start_master()
        assert cluster.master_address == address
        started = time.monotonic()
        with Client(ClientConfig(master=address, token=cluster.token, rpc_timeout=2.0)) as new:
            ((_, answer),) = new.master_statuses()
        assert not isinstance(answer, E.PCacheError), answer
        assert time.monotonic() - started < 1.0


def test_a_call_cancelled_on_the_batch_stream_leaves_the_client_closable_and_answering(
    shared_cluster, client: Client
) -> None:
    """From a helper's drill: a lone call cancelled while its batch was on the stream (an
    ``asyncio.timeout`` around a ``stat``) left the cancelled stream in the client, and
    ``close()`` raised ``CancelledError``: its channels were never closed. The stream is dropped
    now; later calls get their own answers on a new one."""
    import asyncio

    from pcache.client import PCacheClient

    client.mkdir("/cancel", parents=True)
    client.write_file("/cancel/a", b"a" * 11)
    client.write_file("/cancel/b", b"b" * 22)

    async def run(turns: int, go_on: bool) -> None:
        pc = PCacheClient(ClientConfig(master=shared_cluster.master_address))
        assert (await pc.stat("/cancel/a")).size == 11  # opens the stream
        call = asyncio.ensure_future(pc.stat("/cancel/b"))  # alone: straight onto the stream
        for _ in range(turns):
            await asyncio.sleep(0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        if go_on:
            sizes = await asyncio.gather(*(pc.stat(p) for p in ("/cancel/a", "/cancel/b", "/cancel/a")))
            assert [s.size for s in sizes] == [11, 22, 11]  # no answer meant for the cancelled call
        await pc.close()  # raised CancelledError

    for turns in (1, 2, 4, 8):
        for go_on in (False, True):
            asyncio.run(run(turns, go_on))
