"""Damaged, lost and rotting replicas: found, repaired from good copies, and the last copies never destroyed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.checksum import CHUNK_SIZE
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.testing.faults import flip_byte, replica_files, wait_for

MiB = 1 << 20
BLOCK = 4 * MiB
CHECKS = ["--worker.mem_tier_bytes=0", "--worker.block_check_interval=1"]


def block_files(pc: Client, path: str) -> list[list[Path]]:
    """For each block of ``path``, its replicas' files on the workers' disks."""
    return replica_files(pc.layout(path))


def pcache_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pcache", "--master", cluster.master_address, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def healthy(pc: Client) -> bool:
    st = pc.status()
    return not (st.under_replicated_blocks or st.missing_blocks or st.corrupt_blocks)


@pytest.mark.parametrize("short_circuit", [True, False], ids=["short-circuit", "tcp"])
def test_every_replica_corrupt_fails_cleanly_keeps_the_copies_and_salvages(
    make_cluster, tmp_path: Path, short_circuit: bool
) -> None:
    cluster = make_cluster(workers=3, worker_args=CHECKS)
    data = bytearray(os.urandom(3 * BLOCK))
    cfg = ClientConfig(master=cluster.master_address, short_circuit=short_circuit)
    with Client(cfg) as pc:
        pc.write_file("/damaged.bin", bytes(data), block_size=BLOCK, replication=2)
        files = block_files(pc, "/damaged.bin")
        bad_chunks = (0, 2)  # block 1's chunk 0 is bad on one copy, chunk 2 on the other
        for blk, chunk in zip(files[1], bad_chunks, strict=True):
            flip_byte(blk, chunk * CHUNK_SIZE + 17)
        with pytest.raises((E.Unavailable, E.CorruptBlock)):
            pc.read_file("/damaged.bin")
        # the master quarantined both copies: nothing was deleted, status and fsck say so
        wait_for(lambda: pc.status().corrupt_blocks == 1, 10, "the block to be marked corrupt")
        time.sleep(2)  # several replication rounds: still nothing deleted
        assert all(blk.exists() for blk in files[1])
        st = pc.status()
        assert st.corrupt_blocks == 1 and st.damaged_files == 1 and st.missing_blocks == 0
        report = pc.fsck("/")
        (d,) = report.damaged
        assert (d.path, d.index, d.state) == ("/damaged.bin", 1, "corrupt") and len(d.quarantined) == 2
    out = pcache_cli(cluster, "fsck", "/", "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["damaged"][0]["path"] == "/damaged.bin"
    assert pcache_cli(cluster, "status").returncode == 1
    # salvage: every chunk is good on one copy or the other, so every byte comes back
    dest = tmp_path / "salvaged.bin"
    out = pcache_cli(cluster, "fsck", "/damaged.bin", "--salvage", str(dest))
    assert "lost (zeros): none" in out.stdout, out.stdout + out.stderr
    assert dest.read_bytes() == bytes(data)
    # the same chunk bad on both copies: that MiB is zeros and reported lost, the rest is right
    flip_byte(files[1][1], 0 * CHUNK_SIZE + 5)
    with Client(cfg) as pc:
        result = pc.salvage("/damaged.bin", str(dest))
    lost_at = BLOCK  # block 1, chunk 0
    assert result.lost == [(lost_at, CHUNK_SIZE)]
    got = dest.read_bytes()
    assert got[lost_at : lost_at + CHUNK_SIZE] == bytes(CHUNK_SIZE)
    assert got[:lost_at] == data[:lost_at] and got[lost_at + CHUNK_SIZE :] == data[lost_at + CHUNK_SIZE :]


def test_a_good_replica_back_releases_the_quarantined_copy(make_cluster) -> None:
    cluster = make_cluster(workers=3, worker_args=CHECKS)
    data = os.urandom(2 * BLOCK)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/one-bad.bin", data, block_size=BLOCK, replication=2)
        bad = block_files(pc, "/one-bad.bin")[0][0]
        flip_byte(bad, 99)
    with Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc:
        layout = pc.layout("/one-bad.bin")
        block = layout.blocks[0]
        with pytest.raises(E.CorruptBlock):  # the worker holding the bad copy finds it and reports it
            pc._run(pc.aio.data.read(block.replicas[0], block.block_id, 0, block.length, block.token))
        assert pc.read_file("/one-bad.bin") == data  # the good replica serves it
        wait_for(lambda: healthy(pc), 30, "the block to be re-replicated")
        # the corrupt copy goes only now that two good replicas exist
        wait_for(lambda: not bad.exists() or bad.read_bytes()[:BLOCK] == data[:BLOCK], 15, "the bad copy to go")
        assert pc.read_file("/one-bad.bin") == data


def test_a_block_file_deleted_behind_the_worker_is_found_and_repaired(make_cluster) -> None:
    cluster = make_cluster(workers=3, worker_args=CHECKS)
    data = os.urandom(2 * BLOCK)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/lost.bin", data, block_size=BLOCK, replication=2)
        wait_for(lambda: healthy(pc), 10, "a healthy start")
        victim = block_files(pc, "/lost.bin")[0][0]
        victim.unlink()
        started = time.monotonic()
        wait_for(lambda: victim not in block_files(pc, "/lost.bin")[0], 10, "the lost replica to be noticed")
        noticed = time.monotonic() - started

        def repaired() -> bool:
            files = block_files(pc, "/lost.bin")[0]
            return healthy(pc) and len(files) == 2 and all(f.exists() for f in files)

        wait_for(repaired, 20, "the repair")
        print(f"lost block file noticed in {noticed:.1f} s, repaired in {time.monotonic() - started:.1f} s")
        assert len(block_files(pc, "/lost.bin")[0]) == 2
        assert pc.read_file("/lost.bin") == data


def test_a_truncated_replica_nobody_reads_is_found_and_repaired(make_cluster) -> None:
    cluster = make_cluster(workers=3, worker_args=CHECKS)  # no scrub pass in this test's time
    data = os.urandom(3 * BLOCK)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/short.bin", data, block_size=BLOCK, replication=2)
        wait_for(lambda: healthy(pc), 10, "a healthy start")
        victim = block_files(pc, "/short.bin")[1][0]
        os.truncate(victim, 4096)
        started = time.monotonic()

        def repaired() -> bool:
            files = block_files(pc, "/short.bin")[1]
            return healthy(pc) and victim not in files and len(files) == 2

        wait_for(repaired, 20, "the truncated copy to be replaced")
        print(f"truncated replica found and replaced in {time.monotonic() - started:.1f} s")
        wait_for(lambda: not victim.exists() or victim.stat().st_size > 4096, 15, "the bad copy to go")
        # the good copy is the only one read now, and the new copy is whole
        for f in block_files(pc, "/short.bin")[1]:
            assert f.read_bytes()[:BLOCK] == data[BLOCK : 2 * BLOCK]
        assert pc.read_file("/short.bin") == data


def test_a_copy_to_a_target_that_cannot_be_reached_is_made_elsewhere_at_once(make_cluster) -> None:
    # Worker 2 heartbeats but advertises an address nobody can connect to (a firewall, a wrong
    # advertise_host): every copy sent to it fails. The master waits 120 s for an unanswered
    # REPLICATE, so the blocks are repaired within seconds only because their source reports the
    # failed copies and the master chooses other targets.
    cluster = make_cluster(workers=2, master_args=["--master.replication_timeout=120"], worker_args=CHECKS)
    data = os.urandom(16 * MiB)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/repl.bin", data, block_size=MiB, replication=2)  # every block on workers 0 and 1
        wait_for(lambda: healthy(pc), 10, "a healthy start")
        cluster.start_worker(2, ["--worker.advertise_host=127.0.0.2"])  # binds 127.0.0.1: refused
        cluster.wait_workers(3)
        started = time.monotonic()
        for replicas in block_files(pc, "/repl.bin"):
            (lost,) = [f for f in replicas if f.is_relative_to(cluster.root / "worker-0")]
            lost.unlink()  # each block's other candidate target is the unreachable worker 2

        def repaired() -> bool:
            files = block_files(pc, "/repl.bin")
            return healthy(pc) and all(len(r) == 2 and all(f.exists() for f in r) for r in files)

        wait_for(repaired, 30, "every block to be copied again")
        print(f"16 lost copies repaired in {time.monotonic() - started:.1f} s")
        assert pc.read_file("/repl.bin") == data
        assert not any(f.is_relative_to(cluster.root / "worker-2") for r in block_files(pc, "/repl.bin") for f in r)
    # with 16 blocks some copies went to worker 2 first (each a coin toss), and were reported failed
    log = (cluster.root / "logs" / "master.log").read_text()
    assert log.count("failed (Unavailable") >= 1, log[-3000:]
    out = pcache_cli(cluster, "status")  # the operator sees which worker copies fail to, and why
    assert out.returncode == 0, out.stdout + out.stderr
    assert "copies to w-" in out.stdout and "failed lately" in out.stdout and "Connection refused" in out.stdout


def test_scrub_finds_and_repairs_a_replica_nobody_reads(make_cluster) -> None:
    cluster = make_cluster(
        workers=3, worker_args=[*CHECKS, "--worker.scrub_bytes_per_s=1073741824", "--worker.scrub_interval=1"]
    )
    data = os.urandom(2 * BLOCK)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/cold.bin", data, block_size=BLOCK, replication=2)
        wait_for(lambda: healthy(pc), 10, "a healthy start")
        bad = block_files(pc, "/cold.bin")[1][1]
        flip_byte(bad, BLOCK - 3)
        # nobody reads it: only the scrub can find it
        wait_for(lambda: bad not in block_files(pc, "/cold.bin")[1], 20, "the scrub to find it")
        wait_for(lambda: healthy(pc), 20, "the repair")
        assert len(block_files(pc, "/cold.bin")[1]) == 2
        logs = [p for p in (Path(cluster.root) / "logs").glob("worker-*.log") if "scrub: block" in p.read_text()]
        assert logs, "no worker logged the scrub's find"
    with Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc:
        assert pc.read_file("/cold.bin") == data


@pytest.fixture
def small_disks(tmp_path: Path):
    """Three worker directories, each its own 48 MiB tmpfs: the disk, not a quota, runs out."""
    root = tmp_path / "small"
    mounted = []
    for i in range(3):
        d = root / f"worker-{i}"
        d.mkdir(parents=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(d)], capture_output=True)
        if res.returncode:
            pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
        mounted.append(d)
    yield root
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_deleted_files_free_their_space_while_a_reader_lives(small_disks: Path) -> None:
    args = ["--worker.mem_tier_bytes=0", "--worker.reserve_bytes=0"]
    with LocalCluster(
        str(small_disks), workers=3, master_args=["--master.heartbeat_interval=0.5"], worker_args=args
    ) as cl:
        data = os.urandom(8 * MiB)
        with Client(master=cl.master_address) as writer, Client(master=cl.master_address) as reader:
            # nearly full: 12 x 8 MiB at RF 1 on 3 x 48 MiB, each file read (its descriptors cached)
            for i in range(12):
                writer.write_file(f"/fill-{i}", data, block_size=8 * MiB, replication=1)
                assert reader.read_file(f"/fill-{i}") == data
            held = [reader.open(f"/fill-{i}", "rb") for i in range(12)]  # and held open
            for i in range(12):
                writer.unlink(f"/fill-{i}")
            # checkpoint rotation: the same path replaced 20 times, each version read by the reader
            failures = 0
            for i in range(20):
                try:
                    writer.write_file("/ckpt", data, block_size=8 * MiB, replication=1)
                except E.NoSpace:
                    failures += 1
                    continue
                assert reader.read_file("/ckpt") == data, i
            assert failures == 0
            for f in held:
                f.close()


def test_salvage_takes_a_whole_copy_whose_crc_record_is_damaged(make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(workers=3, worker_args=CHECKS)
    data = os.urandom(3 * BLOCK)
    with Client(master=cluster.master_address) as pc:
        pc.write_file("/record.bin", data, block_size=BLOCK, replication=2)
        files = block_files(pc, "/record.bin")[1]
    for blk in files:  # the data bytes stay intact; the footer no longer sits at the end
        with open(blk, "ab") as fh:
            fh.write(b"\0" * 4096)
    holders = {p.parents[2].name for p in files}  # worker-<i> directories
    for i, proc in enumerate(cluster.worker_procs):
        if proc.name in holders:  # restarted: they read the damaged records afresh
            cluster.kill(proc, signal.SIGTERM)
            cluster.start_worker(i)
    cluster.wait_workers(3)
    with Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc:
        with pytest.raises((E.Unavailable, E.CorruptBlock)):
            pc.read_file("/record.bin")
        wait_for(lambda: pc.status().corrupt_blocks == 1, 15, "the block to be marked corrupt")
        result = pc.salvage("/record.bin", str(tmp_path / "out.bin"))
    assert result.lost == [] and (tmp_path / "out.bin").read_bytes() == data  # matched the committed CRC
