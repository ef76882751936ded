"""Fault tests: processes killed with SIGKILL, corrupted blocks, full disks."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.checksum import crc32c
from pcache.common.config import ClientConfig
from pcache.proto import pcache_pb2 as pb
from pcache.testing.faults import replica_file, wait_for
from pcache.worker.blockstore import block_file

MiB = 1 << 20
GiB = 1 << 30


def replica_counts(pc: Client, path: str) -> list[int]:
    layout = pc.layout(path)
    return [len(b.replicas) for b in layout.blocks]


@pytest.mark.slow
def test_kill_worker_during_1gib_read(make_cluster) -> None:
    cluster = make_cluster(workers=3)
    pattern = random.Random(7).randbytes(64 * MiB)
    digest = hashlib.sha256()
    with Client(master=cluster.master_address) as pc:
        with pc.open("/big", "wb", block_size=64 * MiB, replication=2) as f:
            for i in range(16):  # 1 GiB, every block different
                piece = pattern[i * 4099 :] + pattern[: i * 4099]
                digest.update(piece)
                f.write(piece)
        assert pc.stat("/big").size == GiB
        assert replica_counts(pc, "/big") == [2] * 16

    # read with TCP only, so the dead worker is really on the read path
    cfg = ClientConfig(
        master=cluster.master_address, short_circuit=False, io_timeout=4.0, connect_timeout=2.0, read_budget=48 * MiB
    )
    got = hashlib.sha256()
    worst = 0.0
    killed = False
    held = 0  # bytes of read units the reader cached at most (its read-ahead included)
    with Client(cfg) as pc, pc.open("/big", "rb") as f:
        done = 0
        while True:
            start = time.monotonic()
            chunk = f.read(8 * MiB)
            worst = max(worst, time.monotonic() - start)
            held = max(held, pc.aio.read_budget.used)
            if not chunk:
                break
            got.update(chunk)
            done += len(chunk)
            if not killed and done >= GiB // 4:
                cluster.kill(cluster.worker_procs[1], signal.SIGKILL)
                killed = True
    assert killed and done == GiB
    assert got.digest() == digest.digest()
    assert worst < 5.0, f"a read stalled {worst:.1f}s"
    assert 0 < held <= 48 * MiB

    with Client(master=cluster.master_address) as pc:
        wait_for(lambda: replica_counts(pc, "/big") == [2] * 16, 90, "RF=2 restored")
        status = pc.status()
        assert status.under_replicated_blocks == 0
        dead = [w.info.addr.worker_id for w in status.workers if not w.alive]
        layout = pc.layout("/big")
        assert all(r.worker_id not in dead for b in layout.blocks for r in b.replicas)
        assert hashlib.sha256(pc.read_file("/big")).digest() == digest.digest()
    from pcache.worker.server import worker_id_for

    def dead_rows() -> list[list[str]]:
        out = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", cluster.master_address, "status"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return [line.split() for line in out.stdout.splitlines() if " DEAD " in line]

    wait_for(lambda: bool(dead_rows()), 30, "the killed worker shown DEAD")  # after master.dead_after
    (row,) = dead_rows()
    assert row[0] == worker_id_for(str(cluster.root / "worker-1"))
    assert row[-2:] == ["-", "-"]  # no in-flight count or hit ratio from its last beat


def test_kill_master_during_creates_keeps_acknowledged_files(make_cluster) -> None:
    cluster = make_cluster(workers=2)
    acked: dict[str, bytes] = {}
    stop = threading.Event()
    cfg = ClientConfig(master=cluster.master_address, rpc_timeout=3.0)

    def creator() -> None:
        with Client(cfg) as pc:
            i = 0
            while not stop.is_set():
                path, data = f"/m/f{i}", f"payload {i}".encode() * (i % 50 + 1)
                try:
                    if i == 0:
                        pc.mkdir("/m", parents=True)
                    pc.write_file(path, data)
                    acked[path] = data
                except E.PCacheError:
                    pass  # the master is gone: not acknowledged
                i += 1

    thread = threading.Thread(target=creator)
    thread.start()
    wait_for(lambda: len(acked) >= 50, 30, "50 acknowledged creates")
    cluster.kill(cluster.master, signal.SIGKILL)
    time.sleep(0.5)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    cluster.start_master()
    cluster.wait_workers(2, timeout=30)
    with Client(master=cluster.master_address) as pc:
        for path, data in acked.items():
            assert pc.read_file(path) == data, path
    assert len(acked) >= 50


def test_a_new_file_whose_close_failed_in_a_master_outage_is_removed_once_it_is_back(make_cluster) -> None:
    """From a helper's drill: a new file's writer failed at close (the master was killed, then
    restarted as ``pcache up`` does): the empty file its open created stayed for good, and a later
    job checking ``exists()`` took it for a finished output. The client removes it once the
    master answers again, and gives up the blocks it had been allocated (they held the tenant's
    quota for ``orphan_grace``, 600 s: another drill's tenant got EDQUOT meanwhile)."""
    from pcache.client import core

    cluster = make_cluster(workers=2)
    cfg = ClientConfig(master=cluster.master_address, rpc_timeout=3.0)
    with Client(cfg) as pc:
        pc.mkdir("/out")
        pc.write_file("/out/kept.bin", b"kept")  # created before the outage: never touched
        f = pc.open("/out/model.bin", "wb", block_size=MiB)
        f.write(os.urandom(3 * MiB))
        f.flush()  # its full blocks allocated and stored: reserved, not committed
        cluster.kill(cluster.master, signal.SIGKILL)
        with pytest.raises((E.Unavailable, E.Timeout)):
            f.close()
        cluster.start_master()
        cluster.wait_workers(2, timeout=60)
        with Client(master=cluster.master_address) as other:
            wait_for(
                lambda: not other.exists("/out/model.bin"),
                core.DISCARD_RETRY_SECONDS * 2 + 20,
                "the failed writer's empty file removed",
            )
            assert other.read_file("/out/kept.bin") == b"kept"
            wait_for(
                lambda: other.status().tenants[0].reserved_bytes == 0,
                core.DISCARD_RETRY_SECONDS * 2 + 20,
                "the failed writer's blocks given up",
            )


@contextlib.contextmanager
def workers_stopped_across_a_master_restart(cluster) -> Iterator[Callable[[float], None]]:
    """Kill the master, SIGSTOP every worker, start the master again; yields ``resume(after)``,
    which lets the workers go on ``after`` seconds from now (they register then). On exit every
    worker runs again, whatever happened."""
    cluster.kill(cluster.master, signal.SIGKILL)
    stopped = [proc.pid for proc in cluster.worker_procs]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)

    def go_on() -> None:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def resume(after: float) -> None:
        timer = threading.Timer(after, go_on)
        timer.daemon = True
        timer.start()

    try:
        cluster.start_master()
        yield resume
    finally:
        go_on()


def test_a_read_right_after_a_master_restart_waits_for_its_workers_registrations(make_cluster) -> None:
    """Seen on CI: a follower restarted just before the leader died took over before its workers
    had registered with it (their reconnects to its port were in backoff), and a read answered
    at once "no replica of block 1 could be read". A layout naming no live copy of a block waits,
    for ``dead_after`` seconds after the master's start at most, for the workers to report.
    Here: the workers are stopped while the master restarts, and go on 1 s after it serves."""
    cluster = make_cluster(workers=2)
    data = os.urandom(3 * MiB)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/kept.bin", data, replication=2)
        pc.write_file("/small.bin", b"s" * 100, replication=2)
    with workers_stopped_across_a_master_restart(cluster) as resume:
        resume(1.0)
        with Client(master=cluster.master_address) as pc:
            master = pc.aio.master

            async def at_once() -> tuple[pb.FileLayout, bytes, bytes]:
                # a GetLayout of its own, and two reads whose layouts go in one batch
                request = pb.LayoutRequest(header=master.header(), path="/kept.bin")
                return await asyncio.gather(
                    master._call("GetLayout", request), pc.aio.read_file("/small.bin"), pc.aio.read_file("/kept.bin")
                )

            start = time.monotonic()
            layout, small, kept = pc._run(at_once())
            waited = time.monotonic() - start
        assert small == b"s" * 100 and kept == data
        # answered once a copy shows: the first of the two workers to register (both, mostly)
        assert [len(b.replicas) >= 1 for b in layout.blocks] == [True]
        assert 0.8 < waited < 3.0, waited  # until the workers registered, within dead_after (3 s)


def test_a_write_right_after_a_master_restart_waits_for_a_worker_to_register(make_cluster) -> None:
    """The same window for a new file: its first block found "no live worker to place a block
    on" 0.8 s after the restart (a checkpoint saved just after a supervisor restarted the master
    failed). AllocateBlock waits for a worker's registration likewise."""
    cluster = make_cluster(workers=2)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/before.bin", b"b" * 100)
    with workers_stopped_across_a_master_restart(cluster) as resume:
        resume(1.0)
        data = os.urandom(3 * MiB)
        with Client(master=cluster.master_address) as pc:
            start = time.monotonic()
            pc.write_file("/after.bin", data)
            waited = time.monotonic() - start
            assert pc.read_file("/after.bin") == data and pc.read_file("/before.bin") == b"b" * 100
        assert 0.8 < waited < 3.0, waited


def test_status_and_fsck_right_after_a_master_restart_wait_for_the_block_reports(make_cluster) -> None:
    """No false alarm while the workers re-register: for ``dead_after`` seconds the restarted
    master says it is starting, `pcache status` does not exit 1 for blocks not reported yet nor
    count the workers it has not heard from, and `pcache fsck` waits for the reports (from a
    helper's drill: fsck named every block of the stopped workers MISSING and exited 1, and
    status said "workers 1/1 alive" with 3 deployed and pointed at fsck)."""
    cluster = make_cluster(workers=2, master_args=["--master.dead_after=5"])
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/reported.bin", os.urandom(3 * MiB), replication=2)
    with workers_stopped_across_a_master_restart(cluster) as resume:
        cmd = [sys.executable, "-m", "pcache", "--master", cluster.master_address]
        out = subprocess.run([*cmd, "status"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "STARTING: the master waits" in out.stdout, out.stdout + out.stderr
        assert "workers 0 registered so far" in out.stdout and "not reported yet 1" in out.stdout, out.stdout
        assert "fsck names" not in out.stdout and "missing 1" not in out.stdout, out.stdout
        resume(1.0)
        out = subprocess.run([*cmd, "fsck", "/"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "waiting" in out.stderr and "0 damaged blocks in 0 files, 0 under-replicated" in out.stdout, out
    with Client(master=cluster.master_address) as pc:
        wait_for(lambda: pc.status().starting_left == 0, 15, "the start-up wait to end")
        st = pc.status()
        assert st.missing_blocks == 0 and st.under_replicated_blocks == 0
    out = subprocess.run([*cmd, "status"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "STARTING" not in out.stdout and "workers 2/2 alive" in out.stdout, out.stdout


def test_fsck_names_the_dead_workers_to_bring_back_for_a_missing_block(make_cluster) -> None:
    cluster = make_cluster(workers=2)
    data = os.urandom(2 * MiB)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        admin.write_file("/outside.bin", data, replication=2)  # not under the default tenant's root
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/both-died.bin", data, replication=2)
        ids = sorted(w.info.addr.worker_id for w in pc.status().workers)
        for proc in cluster.worker_procs:
            cluster.kill(proc, signal.SIGKILL)
        wait_for(lambda: pc.status().missing_blocks == 2, 20, "the blocks to be missing")
    cmd = [sys.executable, "-m", "pcache", "--master", cluster.master_address, "fsck", "/"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("MISSING"))
    assert all(f"held by {wid} (127.0.0.1:" in line for wid in ids), line
    # the default tenant's fsck names its own file, and says the status's other one is not its to see
    # (status said "damaged files 2 (pcache fsck names them)", fsck / named one and stopped there)
    assert "1 more damaged files in the cluster are not under what this token sees" in out.stdout, out.stdout
    admin_out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PCACHE_TOKEN": cluster.admin_token})  # fmt: skip
    assert admin_out.stdout.count("MISSING") == 2 and "note:" not in admin_out.stdout, admin_out.stdout
    cluster.start_worker(1)  # bring one back: the file reads again
    cluster.wait_workers(1, timeout=30)
    with Client(master=cluster.master_address) as pc:
        assert pc.read_file("/both-died.bin") == data


def test_flipped_byte_is_detected_and_repaired(make_cluster) -> None:
    cluster = make_cluster(workers=3, worker_args=["--worker.mem_tier_bytes=0"])
    data = os.urandom(3 * MiB)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/victim", data, replication=2)
        layout = pc.layout("/victim")
        block = layout.blocks[0]
        holder = block.replicas[0]
        blk_file = replica_file(holder, block.block_id)
        raw = bytearray(blk_file.read_bytes())
        raw[1234] ^= 0xFF
        blk_file.write_bytes(bytes(raw))
    # both paths detect it: the short circuit (client checks CRCs) and TCP (worker checks)
    for short_circuit in (True, False):
        with Client(ClientConfig(master=cluster.master_address, short_circuit=short_circuit)) as pc:
            assert pc.read_file("/victim") == data

    def repaired() -> bool:
        if blk_file.exists() and blk_file.read_bytes()[: len(data)] != data:  # data, then the CRC record
            return False
        with Client(master=cluster.master_address) as pc:
            return replica_counts(pc, "/victim") == [2]

    wait_for(repaired, 30, "the corrupt replica to be replaced")
    with Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc:
        layout = pc.layout("/victim")
        for addr in layout.blocks[0].replicas:  # every replica now serves the right bytes
            got = pc._run(pc.aio.data.read(addr, block.block_id, 0, len(data), layout.blocks[0].token))
            assert got == data


def test_full_workers_spill_then_enospc_without_losing_data(make_cluster) -> None:
    cap = 24 * MiB
    cluster = make_cluster(
        workers=2,
        worker_args=["--worker.reserve_bytes=0"],
        per_worker_args={0: [f"--worker.capacity_bytes={cap}"], 1: [f"--worker.capacity_bytes={3 * cap}"]},
    )
    written: dict[str, bytes] = {}
    with Client(ClientConfig(master=cluster.master_address, nospace_wait=1.0)) as pc:
        # worker 0 fills up first; writes keep landing on worker 1
        for i in range(12):
            data = os.urandom(4 * MiB)
            pc.write_file(f"/fill{i}", data, replication=1, block_size=4 * MiB)
            written[f"/fill{i}"] = data
        time.sleep(1.5)  # heartbeats report the new free space
        failed = ""
        with pytest.raises(E.NoSpace) as info:
            for i in range(12, 40):
                data = os.urandom(4 * MiB)
                failed = f"/fill{i}"
                pc.write_file(failed, data, replication=1, block_size=4 * MiB)
                written[failed] = data
        assert info.value.errno == 28  # ENOSPC
        assert not pc.exists(failed)  # the failed create left no empty file behind
        status = pc.status()
        for w in status.workers:
            assert w.info.used_bytes <= w.info.capacity_bytes
        for path, data in written.items():
            assert pc.read_file(path) == data


def test_blocks_of_a_writer_that_never_committed_are_collected(make_cluster) -> None:
    cluster = make_cluster(
        workers=1,
        master_args=["--master.orphan_grace=1", "--master.default_replication=1"],
        worker_args=["--worker.block_report_interval=1"],
    )
    data = os.urandom(2 * MiB)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/kept", b"committed")
        f = pc.open("/abandoned", "wb")
        # the writer stores a block, then "dies" before close: nothing commits it
        block_id, stored, _, _ = pc._run(pc.aio.write_block(f._f.inode, data, crc32c(data)))
        assert stored
        orphan = Path(block_file(str(cluster.root / "worker-0"), block_id))
        assert orphan.exists()
        wait_for(lambda: not orphan.exists(), 20, "the orphan block to be deleted")
        assert pc.read_file("/kept") == b"committed"
        assert pc.stat("/abandoned").size == 0


def test_the_batch_stream_rides_a_master_restart_and_never_hangs_on_a_stopped_one(make_cluster) -> None:
    """A client's stats and creates go on one long-lived ``BatchStream``. The stream of a master
    killed and restarted is dead: the client's next create still succeeds (a message that never
    left goes the ordinary way); a SIGSTOPped master gives a Timeout within the call deadline,
    never a hang, and calls queued behind the one on the wire fail at their own deadline; once it
    runs again, so does the client, on a new stream."""
    cluster = make_cluster(workers=1)
    with Client(ClientConfig(master=cluster.master_address, rpc_timeout=2.0, metadata_ttl=0.0)) as pc:
        pc.write_file("/before", b"b" * 10)
        assert pc.stat("/before").size == 10 and pc.aio.master._streams  # on the stream
        cluster.kill(cluster.master, signal.SIGKILL)
        cluster.start_master()
        cluster.wait_workers(1, timeout=30)
        pc.write_file("/after", b"a" * 20)  # its create: first call after the restart
        assert pc.stat("/after").size == 20 and pc.stat("/before").size == 10

        async def many() -> list[int]:
            stats = await asyncio.gather(*(pc.aio.stat(p) for p in ["/before", "/after"] * 8))
            return [s.size for s in stats]

        assert pc._run(many()) == [10, 20] * 8  # a batch on the new stream

        os.kill(cluster.master.pid, signal.SIGSTOP)
        try:
            for call in (lambda: pc.stat("/before"), lambda: pc.write_file("/during", b"d")):
                start = time.monotonic()
                with pytest.raises((E.Timeout, E.Unavailable)):
                    call()
                # the deadline (2 s) once: a batch the one master left unanswered was sent
                # again with the same wait (`pcache-mount --timeout 3` failed after 6 s)
                assert time.monotonic() - start < 3.5

            async def stopped() -> list[BaseException | int]:
                return await asyncio.gather(*(pc.aio.stat("/before") for _ in range(16)), return_exceptions=True)

            start = time.monotonic()
            errors = pc._run(stopped())
            assert time.monotonic() - start < 12
            assert all(isinstance(e, (E.Timeout, E.Unavailable)) for e in errors), errors
            # the 15 queued behind the first call, each failed at its own deadline (rpc_timeout + 1 s)
            assert sum("no master answered Stat within 3 s" in str(e) for e in errors) == 15, errors
        finally:
            os.kill(cluster.master.pid, signal.SIGCONT)
        wait_for(lambda: pc.exists("/before"), 20, "the master to answer again")
        assert pc.stat("/after").size == 20
        assert pc._run(many()) == [10, 20] * 8


def test_the_master_ends_an_idle_batch_stream_and_the_client_opens_another(make_cluster) -> None:
    """A batch stream that carries nothing for ``master.batch_stream_idle`` seconds is ended by
    the master (thousands of idle streams, or one whose token expired, hold nothing for long);
    the client's next batch goes out at once all the same, on a new stream."""
    cluster = make_cluster(workers=1, master_args=["--master.batch_stream_idle=0.5"])
    with Client(ClientConfig(master=cluster.master_address, metadata_ttl=0.0)) as pc:
        pc.write_file("/idle", b"i" * 7)
        first = pc.aio.master._streams[0]
        wait_for(first.done, 10, "the master to end the idle stream")
        start = time.monotonic()
        assert pc.stat("/idle").size == 7
        assert time.monotonic() - start < 2
        assert pc.stat("/idle").size == 7
        assert pc.aio.master._streams[0] is not first and not pc.aio.master._streams[0].done()


def test_a_dead_workers_port_answered_by_another_service_costs_no_write(make_cluster, caplog) -> None:
    """A dead worker's data port taken by another service before the master declares the worker
    dead (here one that echoes every byte): a block written there goes to another worker. The
    echoed request was taken for the answer, a block stored on no replica, and the file's close
    failed EINVAL ("block N has no replica")."""
    import socket

    cluster = make_cluster(workers=2, master_args=["--master.default_replication=1", "--master.dead_after=60"])
    dead = cluster.worker_procs[1]
    port = int(dead.address.rsplit(":", 1)[1])
    cluster.kill(dead)
    stop = threading.Event()

    def echo(server: socket.socket) -> None:
        def serve(conn: socket.socket) -> None:
            with conn, contextlib.suppress(OSError):
                while data := conn.recv(65536):
                    conn.sendall(data)

        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()

    server = socket.create_server(("127.0.0.1", port))
    server.settimeout(0.2)
    squatter = threading.Thread(target=echo, args=(server,))
    squatter.start()
    written: dict[str, bytes] = {}
    try:
        with (
            caplog.at_level("INFO", logger="pcache.client"),
            Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc,
        ):
            for i in range(60):
                written[f"/f{i}"] = os.urandom(1000 + i)
                pc.write_file(f"/f{i}", written[f"/f{i}"])
                if "did not answer as worker" in caplog.text and i >= 10:
                    break
            assert "did not answer as worker" in caplog.text  # blocks were placed on the dead worker
            for path, data in written.items():
                assert pc.read_file(path) == data
    finally:
        stop.set()
        squatter.join()
        server.close()
