"""Master high availability on a real etcd with real processes: a leader and a follower,
SIGKILL and SIGSTOP of the leader, a follower killed or wiped, etcd stopped (issue #14)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster, Proc
from pcache.proto import pcache_pb2 as pb
from pcache.testing.faults import replica_files, wait_for
from tests.conftest import FAST_MASTER, REQUIRES_ETCD

pytestmark = REQUIRES_ETCD

HA_MASTER = [*FAST_MASTER, "--master.lease_ttl=2", "--master.ack_timeout=1"]


@pytest.fixture
def make_ha(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    clusters: list[LocalCluster] = []

    def make(
        workers: int = 2, masters: int = 2, master_args: list[str] | None = None, tls: bool = False
    ) -> LocalCluster:
        cluster = LocalCluster(
            str(tmp_path / f"ha{len(clusters)}"), workers=workers, masters=masters,
            master_args=[*HA_MASTER, *(master_args or [])], tls=tls,
        )  # fmt: skip
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.stop()


def client_of(cluster: LocalCluster, **kwargs) -> Client:
    return Client(ClientConfig(master=cluster.master_address, **kwargs))


def index_of(cluster: LocalCluster, proc: Proc) -> int:
    return cluster.master_procs.index(proc)


def follower_of(cluster: LocalCluster, leader: Proc) -> Proc:
    return next(p for p in cluster.master_procs if p is not leader)


def role_of(cluster: LocalCluster, proc: Proc) -> pb.MasterRole:
    with Client(ClientConfig(master=proc.address, rpc_timeout=2.0)) as pc:
        ((_, status),) = pc.master_statuses()
        assert isinstance(status, pb.ClusterStatus), status
        return status.master


# ------------------------------------------------------------------ writers --


class Writer(threading.Thread):
    """Creates, writes, renames and deletes files under its own directory, and keeps a model of
    what must be there: only acknowledged operations change the model."""

    def __init__(self, cluster: LocalCluster, wid: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.wid, self.stop = cluster, wid, stop
        self.model: dict[str, bytes] = {}
        self.gone: set[str] = set()
        self.errors: list[BaseException] = []
        self.ops = 0
        self.worst = 0.0

    def run(self) -> None:
        rng = random.Random(self.wid)
        base = f"/w{self.wid}"
        try:
            with client_of(self.cluster) as pc:
                pc.mkdir(base, parents=True)
                n = 0
                while not self.stop.is_set():
                    start = time.monotonic()
                    choice = rng.random()
                    if choice < 0.55 or len(self.model) < 3:
                        path = f"{base}/f{n}"
                        n += 1
                        data = rng.randbytes(rng.choice([0, 1, 4096, 70_000]))
                        pc.write_file(path, data)
                        self.model[path] = data
                        self.gone.discard(path)
                    elif choice < 0.8:
                        src = rng.choice(sorted(self.model))
                        dst = f"{base}/r{n}"
                        n += 1
                        pc.rename(src, dst)
                        self.model[dst] = self.model.pop(src)
                        self.gone.add(src)
                    else:
                        victim = rng.choice(sorted(self.model))
                        pc.unlink(victim)
                        del self.model[victim]
                        self.gone.add(victim)
                    self.ops += 1
                    self.worst = max(self.worst, time.monotonic() - start)
        except BaseException as exc:
            self.errors.append(exc)


def check_models(cluster: LocalCluster, writers: list[Writer]) -> None:
    with client_of(cluster) as pc:
        for w in writers:
            listed = {f"/w{w.wid}/{e.name}" for e in pc.listdir(f"/w{w.wid}")}
            assert listed == set(w.model), f"writer {w.wid}: listing differs from the acknowledged operations"
            for path, data in w.model.items():
                assert pc.read_file(path) == data, path
            for path in w.gone:
                assert not pc.exists(path), f"{path} was renamed or deleted, and is back"


@pytest.mark.slow
def test_eight_writers_survive_five_leader_kills(make_ha) -> None:
    cluster = make_ha(workers=2)
    stop = threading.Event()
    writers = [Writer(cluster, i, stop) for i in range(8)]
    for w in writers:
        w.start()
    rng = random.Random(14)
    stalls = []
    try:
        for _ in range(5):
            time.sleep(rng.uniform(0.5, 2.5))
            leader = cluster.leader()
            before = sum(w.ops for w in writers)
            killed_at = time.monotonic()
            cluster.kill(leader, signal.SIGKILL)
            new = cluster.leader(timeout=20)
            assert new is not leader
            wait_for(lambda b=before: sum(w.ops for w in writers) > b + 8, 30, "writers go on after the failover")
            stalls.append(time.monotonic() - killed_at)
            cluster.start_ha_master(index_of(cluster, leader))  # back as the follower
            cluster.wait_in_sync(timeout=30)
            assert not any(w.errors for w in writers), [w.errors for w in writers]
    finally:
        stop.set()
        for w in writers:
            w.join(60)
    assert not any(w.errors for w in writers), [repr(e) for w in writers for e in w.errors]
    total = sum(w.ops for w in writers)
    worst = max(w.worst for w in writers)
    print(f"\n{total} acknowledged operations; longest client stall {worst:.2f} s;"
          f" kill -> writers going again: {', '.join(f'{s:.2f}' for s in stalls)} s")  # fmt: skip
    assert total > 100
    check_models(cluster, writers)
    # and the follower that took over last has the same namespace as the one it replaced
    leader = cluster.leader()
    cluster.kill(leader, signal.SIGKILL)
    cluster.leader(timeout=20)
    check_models(cluster, writers)


def test_sigstopped_leader_is_fenced_after_its_lease(make_ha) -> None:
    cluster = make_ha(workers=2)
    with client_of(cluster) as pc:
        pc.write_file("/before", b"1")
        old = cluster.leader()
        old_epoch = role_of(cluster, old)
        os.kill(old.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            pc.write_file("/during", b"2")  # waits out the lease, then goes to the new leader
            print(f"\nfirst mutation {time.monotonic() - t0:.2f} s after SIGSTOP")
            new = cluster.leader()
            assert new is not old
            new_epoch = pc.status().epoch
        finally:
            os.kill(old.pid, signal.SIGCONT)
        assert old_epoch.role == "leader" and new_epoch > pc.status().epoch - 1
        # the old leader, resumed, takes no mutation and no read: it knows its lease ran out
        with Client(ClientConfig(master=old.address, failover_timeout=0, rpc_timeout=3.0)) as direct:
            with pytest.raises(E.NotLeader):
                direct.write_file("/from-old", b"x")
            with pytest.raises(E.NotLeader):
                direct.stat("/before")
            wait_for(lambda: role_of(cluster, old).leader == new.address, 10, "the old leader to see the new one")
            with pytest.raises(E.NotLeader, match=r"the leader is .*give the client every master") as caught:
                direct.mkdir("/from-old-dir")  # one master given: the error says how to follow failovers
            assert caught.value.leader == new.address
        log = cluster.worker_procs[0].log  # each worker says which master it obeys from now on
        wait_for(lambda: f"master {new.address} leads (epoch" in log.read_text(), 10, "the worker to follow")
        assert role_of(cluster, old).role == "follower"
        assert "is gone" not in new.log.read_text()  # a stopped leader's port accepts: only the lease decided
        assert pc.read_file("/before") == b"1" and pc.read_file("/during") == b"2"
        assert not pc.exists("/from-old")
        # it catches up as a follower and may take over again
        cluster.wait_in_sync(timeout=30)
        pc.write_file("/after", b"3")
        cluster.kill(new, signal.SIGKILL)
        assert pc.read_file("/after") == b"3" and cluster.leader() is old


def test_a_killed_leader_is_replaced_long_before_its_lease_would_run_out(make_ha) -> None:
    """``kill -9`` of the leader: its follower sees the replication stream end and the leader's
    port refuse connections, revokes the dead leader's lease and takes over at once. With a lease
    of 20 s the cluster took no mutation for about 20 s."""
    cluster = make_ha(workers=1, master_args=["--master.lease_ttl=20"])
    with client_of(cluster) as pc:
        pc.write_file("/before", b"1")
        cluster.wait_in_sync()
        leader = cluster.leader()
        follower = follower_of(cluster, leader)
        cluster.kill(leader, signal.SIGKILL)
        t0 = time.monotonic()
        pc.mkdir("/after")
        took = time.monotonic() - t0
        print(f"\nfirst mutation {took:.2f} s after the leader's SIGKILL (lease 20 s)")
        assert took < 10.0, took
        assert cluster.leader() is follower
        assert f"the leader {leader.address} (epoch" in follower.log.read_text()
        assert pc.read_file("/before") == b"1" and pc.stat("/after").is_dir


KILL_HOOK = """
import os, signal, sys
if "master" in sys.argv and os.environ.get("PCACHE_TEST_KILL_FLAG"):
    import pcache.master.metastore as metastore

    write_many = metastore.RocksMetaStore.write_many

    def killing_write_many(self, batches):
        batches = [(list(puts), list(deletes)) for puts, deletes in batches]
        flag = os.environ["PCACHE_TEST_KILL_FLAG"]
        records = [k for puts, _ in batches for k, _ in puts if k.startswith(b"r") and b"/" in k]
        if records and os.path.exists(flag):  # the write that carries a reply record: die before it
            os.unlink(flag)
            os.kill(os.getpid(), signal.SIGKILL)
        return write_many(self, batches)

    metastore.RocksMetaStore.write_many = killing_write_many
"""


def test_a_master_killed_as_it_records_an_answer_never_applies_the_retry_twice(
    make_ha, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader alone (its follower down) is killed as it writes a rename's reply record, then
    comes back and takes the client's retry. The rename and its record were two local writes:
    the rename was kept, its answer lost, and the retry renamed again: ``NotFound`` for a rename
    that had happened. They are now one write, so the retry finds both or neither."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(KILL_HOOK)
    flag = tmp_path / "kill-at-the-next-record"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PCACHE_TEST_KILL_FLAG", str(flag))
    cluster = make_ha(workers=1)
    with client_of(cluster) as pc:
        pc.write_file("/src", b"x")
        leader = cluster.leader()
        follower = follower_of(cluster, leader)
        cluster.kill(follower, signal.SIGKILL)
        pc.mkdir("/alone")  # answered once the leader goes on alone (ack_timeout)
        flag.touch()
        outcome: list[object] = []
        renamer = threading.Thread(target=lambda: outcome.append(_call(lambda: pc.rename("/src", "/dst"))))
        renamer.start()
        wait_for(lambda: not leader.alive(), 20, "the leader to die as it records the rename's answer")
        assert not flag.exists()  # the hook fired (the leader did not die of something else)
        cluster.start_ha_master(index_of(cluster, leader))  # the last leader: it leads again
        cluster.start_ha_master(index_of(cluster, follower))
        renamer.join(60)
        assert outcome and not isinstance(outcome[0], BaseException), outcome
        assert not pc.exists("/src") and pc.read_file("/dst") == b"x"


def test_a_stream_lost_while_the_last_loss_is_checked_is_checked_too() -> None:
    """A stream cut, reconnected, and its leader killed 0.2 s later: the second loss came while
    the first one's check (which found the live leader) still ran, was dropped, and the failover
    waited out the lease."""
    import asyncio

    from pcache.master.server import MasterServer

    async def scenario() -> list[tuple[int, str]]:
        server = MasterServer.__new__(MasterServer)
        server.role, server.ha, server.member = "follower", object(), "m"  # type: ignore[assignment]
        server._gone_check, server._lost = None, None
        checked: list[tuple[int, str]] = []
        first_running = asyncio.Event()
        release = asyncio.Event()

        async def leader_gone(epoch: int, leader: str) -> None:
            checked.append((epoch, leader))
            if len(checked) == 1:
                first_running.set()
                await release.wait()

        server._leader_gone = leader_gone  # type: ignore[method-assign]
        server._stream_lost(7, "a:1")
        await first_running.wait()
        server._stream_lost(7, "a:1")  # the leader's second stream ended during the first check
        release.set()
        assert server._gone_check is not None
        await asyncio.wait_for(server._gone_check, 5)
        return checked

    assert asyncio.run(scenario()) == [(7, "a:1"), (7, "a:1")]


def test_a_master_of_a_pair_listening_on_every_address_must_say_which_it_advertises(tmp_path: Path) -> None:
    """It advertised ``0.0.0.0:PORT``: the other master probed its own host at that port, and
    workers and clients of other hosts were handed an address that leads nowhere."""
    from pcache.common.config import MasterConfig
    from pcache.master.server import MasterServer

    for host in ("0.0.0.0", "::", "[::]"):
        cfg = MasterConfig(host=host, etcd="127.0.0.1:2379", data_dir=str(tmp_path / "m"))
        with pytest.raises(E.InvalidArgument, match="advertise_host"):
            MasterServer(cfg)
    cfg = MasterConfig(host="0.0.0.0", advertise_host="10.0.0.1", etcd="127.0.0.1:2379", data_dir=str(tmp_path / "m"))
    MasterServer(cfg).store.close()  # told what to advertise: accepted
    MasterServer(MasterConfig(host="0.0.0.0", data_dir=str(tmp_path / "single"))).store.close()  # no pair: as before
    for etcd, why in (("etcd-a:2379;etcd-b:2379", "HOST:PORT"), ("etcd-a.invalid:2379,etcd-b.invalid:2379", "resolve")):
        with pytest.raises(E.InvalidArgument, match=f"master.etcd: .*{why}"):  # one line at start, not a traceback
            MasterServer(MasterConfig(advertise_host="10.0.0.1", etcd=etcd, data_dir=str(tmp_path / "m")))


def _call(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - the test reports it
        return exc


def test_worker_runs_commands_only_from_the_newest_leader() -> None:
    """Worker-side fencing: commands from a follower or an older epoch are dropped."""
    from pcache.worker.server import MasterLink, WorkerServer

    worker = WorkerServer.__new__(WorkerServer)  # no I/O needed: accept_commands is pure
    worker.epoch = 0
    delete = pb.WorkerCommand(kind=pb.WorkerCommand.DELETE, block_id=7)
    old = MasterLink("a:1", None, None, epoch=5, leader=True)  # type: ignore[arg-type]
    new = MasterLink("b:1", None, None, epoch=9, leader=True)  # type: ignore[arg-type]
    assert worker.accept_commands(old, pb.HeartbeatResponse(epoch=5, leader=True, commands=[delete])) == [delete]
    assert worker.accept_commands(new, pb.HeartbeatResponse(epoch=9, leader=True)) == []
    assert worker.epoch == 9
    # the deposed leader still thinks it leads: its DELETE is ignored
    assert worker.accept_commands(old, pb.HeartbeatResponse(epoch=5, leader=True, commands=[delete])) == []
    follower = MasterLink("c:1", None, None, epoch=9, leader=False)  # type: ignore[arg-type]
    assert worker.accept_commands(follower, pb.HeartbeatResponse(epoch=9, leader=False, commands=[delete])) == []
    assert worker.accept_commands(new, pb.HeartbeatResponse(epoch=9, leader=True, commands=[delete])) == [delete]


def test_follower_killed_restarted_and_wiped_catches_up(make_ha) -> None:
    cluster = make_ha(workers=2, master_args=["--master.log_tail_entries=50"])
    leader = cluster.leader()
    follower = follower_of(cluster, leader)
    with client_of(cluster) as pc:
        pc.mkdir("/alone")
        cluster.kill(follower, signal.SIGKILL)
        t0 = time.monotonic()
        for i in range(10):
            pc.write_file(f"/alone/{i}", bytes([i]) * 100)
        print(f"\n10 writes with the follower dead: {time.monotonic() - t0:.2f} s")
        status = pc.status().master
        assert status.role == "leader" and status.alone
        assert not any(f.in_sync for f in status.followers)
        # once its etcd member key expires it is shown gone, not dropped from the status
        (gone,) = wait_for(
            lambda: [f for f in pc.status().master.followers if f.state == "gone"], 20, "the follower shown gone"
        )
        assert gone.address == follower.address and not gone.in_sync and gone.gone_age >= 0
        cli = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", cluster.master_address, "status"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert f"follower {follower.address}" in cli.stdout and "GONE" in cli.stdout, cli.stdout
        # back: it catches up from the log tail (10 files are more than 50 entries: a checkpoint)
        cluster.start_ha_master(index_of(cluster, follower))
        cluster.wait_in_sync(timeout=30)
        status = pc.status().master
        assert not status.alone and status.followers[0].lag == 0
        assert [f.state for f in status.followers].count("gone") == 0
        # a short absence is caught up from the tail
        follower = follower_of(cluster, leader)
        cluster.kill(follower, signal.SIGKILL)
        pc.write_file("/short", b"s")
        cluster.start_ha_master(index_of(cluster, follower))
        cluster.wait_in_sync(timeout=30)
        # wiped: a new member with an empty metastore gets a checkpoint
        follower = follower_of(cluster, leader)
        cluster.kill(follower, signal.SIGKILL)
        for i in range(60):
            pc.mkdir(f"/more/{i}", parents=True)
        cluster.start_ha_master(index_of(cluster, follower), wipe=True)
        cluster.wait_in_sync(timeout=60)
        assert "installed the leader's checkpoint" in follower_of(cluster, leader).log.read_text()
        # the wiped-and-refilled follower takes over with everything
        cluster.kill(leader, signal.SIGKILL)
        assert cluster.leader(timeout=20) is not leader
        assert [pc.read_file(f"/alone/{i}") for i in range(10)] == [bytes([i]) * 100 for i in range(10)]
        assert pc.read_file("/short") == b"s" and len(pc.listdir("/more")) == 60


def test_etcd_stopped_no_split_brain_reads_go_on(make_ha) -> None:
    cluster = make_ha(workers=2)
    assert cluster.etcd is not None
    with client_of(cluster, failover_timeout=3.0) as pc:
        payload = random.Random(3).randbytes(3 << 20)
        pc.write_file("/open-me", payload)
        with pc.open("/open-me", "rb") as f:
            first = f.read(1 << 20)
            os.kill(cluster.etcd.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(4)  # longer than the lease: the leader must have stepped down
                roles = [role_of(cluster, p).role for p in cluster.master_procs]
                assert roles.count("leader") == 0, roles
                with pytest.raises((E.Unavailable, E.Timeout)):
                    pc.write_file("/no-leader", b"x")
                assert f.read() == payload[1 << 20 :] and first == payload[: 1 << 20]  # the open file reads on

                def stat(i: int) -> tuple[float, BaseException | None]:
                    started = time.monotonic()
                    try:
                        pc.stat(f"/nowhere-{i}")
                    except E.PCacheError as exc:
                        return time.monotonic() - started, exc
                    return time.monotonic() - started, None

                # concurrent calls: those queued behind the first (batched) fail within their own
                # failover budget too, not after the first's and then their own
                with ThreadPoolExecutor(8) as pool:
                    stats = list(pool.map(stat, range(8)))
                assert all(exc is not None for _, exc in stats), stats
                assert max(took for took, _ in stats) < 5.5, stats
                cli = subprocess.run(
                    [sys.executable, "-m", "pcache", "--master", cluster.master_address, "status"],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert cli.returncode == 2, cli.stdout + cli.stderr
                assert cli.stdout.count(": follower, epoch") == 2, cli.stdout  # each master says what it is
                assert cli.stdout.count("leader none: etcd not answering for") == 2, cli.stdout  # and why nobody leads
                assert "no master can lead: etcd at" in cli.stderr, cli.stderr
            finally:
                os.kill(cluster.etcd.proc.pid, signal.SIGCONT)
    with client_of(cluster) as pc:
        pc.write_file("/resumed", b"ok")  # etcd back: a leader again
        assert pc.read_file("/resumed") == b"ok" and not pc.exists("/no-leader")
        roles = [role_of(cluster, p).role for p in cluster.master_procs]
        assert sorted(roles) == ["follower", "leader"]


def test_file_open_for_writing_across_a_failover(make_ha) -> None:
    cluster = make_ha(workers=2)
    block = 1 << 20
    chunks = [random.Random(i).randbytes(block) for i in range(6)]
    with client_of(cluster) as pc:
        with pc.open("/across", "wb", block_size=block) as f:
            for chunk in chunks[:3]:
                f.write(chunk)
            f.flush()
            cluster.kill(cluster.leader(), signal.SIGKILL)
            for chunk in chunks[3:]:
                f.write(chunk)
        assert pc.read_file("/across") == b"".join(chunks)
        assert pc.stat("/across").size == 6 * block


def test_a_worker_given_one_master_learns_the_other_and_the_new_leader_knows_it(make_ha) -> None:
    """A worker told only the leader's address heartbeat that address alone: after a failover the
    new leader never knew the worker (status showed the others alive, its blocks missing)."""
    cluster = make_ha(workers=1)
    leader = cluster.leader()
    lone = cluster.start_worker(1, [f"--worker.master={leader.address}"])
    cluster.wait_workers(2)
    with client_of(cluster) as pc:
        pc.write_file("/on-both", os.urandom(1 << 20), replication=2)
    cluster.wait_in_sync()
    deadline = time.monotonic() + 15  # it heartbeats the follower too, which knows it alive
    while time.monotonic() < deadline:
        workers = role_status_workers(follower_of(cluster, leader))
        if len(workers) == 2:
            break
        time.sleep(0.2)
    assert len(workers) == 2, workers
    cluster.kill(leader, signal.SIGKILL)
    with client_of(cluster) as pc:
        st = pc.status()
        assert sum(1 for w in st.workers if w.alive) == 2 and st.missing_blocks == 0, st
    assert "which worker.master leaves out" in lone.log.read_text()
    # a client (a mount) given the follower's address alone follows the leader it names
    back = cluster.start_ha_master(index_of(cluster, leader))  # the old leader, back as the follower
    cluster.wait_in_sync(timeout=30)
    with Client(ClientConfig(master=back.address)) as lone_client:
        lone_client.mkdir("/through-the-follower")
        assert lone_client.stat("/through-the-follower").is_dir


def role_status_workers(proc: Proc) -> list[str]:
    """The workers master ``proc`` (leader or follower) knows alive."""
    with Client(ClientConfig(master=proc.address, rpc_timeout=2.0)) as pc:
        ((_, status),) = pc.master_statuses()
        assert isinstance(status, pb.ClusterStatus), status
        return [w.info.addr.worker_id for w in status.workers if w.alive]


def test_babel_and_checkpoints_take_the_master_list(make_ha, tmp_path: Path) -> None:
    """``pcache://a,b/...`` in Babel and ckpt_adapter: a leader killed between two saves and two
    syncs costs a stall, not an error."""
    import asyncio

    import torch

    from babel.sync import run_sync
    from ckpt_adapter import CheckpointManager

    cluster = make_ha(workers=2)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"part-{i}").write_bytes(random.Random(i).randbytes(10_000 + i))
    uri = f"pcache://{cluster.master_address}"
    first = asyncio.run(run_sync(f"file://{src}", f"{uri}/data", state_dir=str(tmp_path / "state")))
    weights = {"w": torch.arange(16.0).reshape(4, 4)}
    mgr = CheckpointManager(f"{uri}/ckpt", {"model": weights}, keep_last=0)
    assert mgr.save(1)
    cluster.kill(cluster.leader(), signal.SIGKILL)
    (src / "part-new").write_bytes(b"after the failover")
    second = asyncio.run(run_sync(f"file://{src}", f"{uri}/data", state_dir=str(tmp_path / "state")))
    weights["w"] += 1
    assert mgr.save(2)
    assert first.copied == 20 and second.copied == 1 and not second.failed
    restored = {"w": torch.zeros(4, 4)}
    assert CheckpointManager(f"{uri}/ckpt", {"model": restored}).load(2)
    assert torch.equal(restored["w"], torch.arange(16.0).reshape(4, 4) + 1)
    with client_of(cluster) as pc:
        assert pc.read_file("/data/part-new") == b"after the failover"
        assert len(pc.listdir("/data")) == 21


@pytest.mark.parametrize("transport", ["stream-tls", "grpc"])
def test_the_log_reaches_the_follower_on_its_stream_over_tls_or_on_grpc_when_told(make_ha, transport: str) -> None:
    """Masters of a TLS cluster ship the log on the replication stream (mutual TLS, their own
    certificates); ``master.stream_port = -1`` ships it on gRPC. Either way the follower that
    takes over has every acknowledged mutation."""
    stream = transport == "stream-tls"
    cluster = make_ha(workers=1, tls=stream, master_args=[] if stream else ["--master.stream_port=-1"])
    leader = cluster.leader()
    with client_of(cluster, token=cluster.token, tls_dir=cluster.tls_dir) as pc:
        pc.mkdir("/log")
        for i in range(20):
            pc.write_file(f"/log/{i}", b"%d" % i)
        assert pc.status().master.followers[0].lag == 0
        shipped_on_stream = "replication stream to follower" in leader.log.read_text()
        assert shipped_on_stream == stream
        cluster.kill(leader, signal.SIGKILL)
        assert cluster.leader(timeout=20) is not leader
        assert [pc.read_file(f"/log/{i}") for i in range(20)] == [b"%d" % i for i in range(20)]


def test_binds_and_what_was_listed_under_them_survive_the_leaders_sigkill(make_ha, tmp_path: Path) -> None:
    """The mount table and lazily listed entries are namespace mutations: the follower that takes
    over has them, and answers without listing the store again (an immutable bind)."""
    tree = tmp_path / "store"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_bytes(b"12345")
    cluster = make_ha(workers=1)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        admin.bind("/ds", f"file://{tree}", meta_ttl=-1)
        assert admin.stat("/ds/d/f").size == 5 and {e.name for e in admin.listdir("/ds/d")} == {"f"}
        (tree / "d" / "late").write_bytes(b"x")  # not listed: the bind trusts its listing for ever
        cluster.kill(cluster.leader(), signal.SIGKILL)
        cluster.leader(timeout=20)
        assert [(b.path, b.meta_ttl) for b in admin.binds()] == [("/ds", -1)]
        assert {e.name for e in admin.listdir("/ds/d")} == {"f"}
        with pytest.raises(E.ReadOnly):
            admin.write_file("/ds/d/new", b"x")
        admin.refresh("/ds/d")
        assert {e.name for e in admin.listdir("/ds/d")} == {"f", "late"}


def test_a_deposed_leaders_late_delete_leaves_the_object_its_successor_wrote(make_ha, moto_endpoint: str) -> None:
    """A leader sends the DELETE of a deleted file's object and dies; the request reaches the
    store late (held by a proxy here; a slow store or network elsewhere). Its successor deleted
    it again and uploaded the file written under the same name since; the late DELETE then
    removed that object, while PCache said ``persist: done``. Write-back's DELETE now names the
    version it removes (If-Match)."""
    from babel.testing.s3proxy import S3Proxy
    from tests.conftest import create_bucket
    from tests.pcache.test_binds import _object, _s3

    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    cluster = make_ha(workers=1)
    with S3Proxy(moto_endpoint) as proxy, client_of(cluster, token=cluster.admin_token) as pc:
        pc.bind("/default/wb", f"s3://{bucket}/k/?endpoint_url={proxy.endpoint}", mode="writeback")
        pc.write_file("/default/wb/x.bin", b"version 1")
        pc.wait_persisted("/default/wb", timeout=60)
        cluster.wait_in_sync()
        proxy.ops, proxy.delay = {"delete", "delete_objects"}, 10.0  # the leader's DELETE is held
        pc.remove("/default/wb/x.bin")
        deadline = time.monotonic() + 20
        while not proxy.stats().delayed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.stats().delayed == 1
        held_since = time.monotonic()
        proxy.delay = 0.0  # what comes later goes through at once
        cluster.kill(cluster.leader(), signal.SIGKILL)
        pc.write_file("/default/wb/x.bin", b"version 2, written after")  # on the new leader
        pc.wait_persisted("/default/wb", timeout=60)
        assert _object(s3, bucket, "k/x.bin") == b"version 2, written after"
        time.sleep(max(0.0, 10.0 - (time.monotonic() - held_since)) + 1.0)  # the held DELETE lands
        assert pc.stat("/default/wb/x.bin").persist == "done"
    assert _object(s3, bucket, "k/x.bin") == b"version 2, written after"


def test_the_stores_failure_is_the_leaders_answer_and_cached_files_read_through_it(make_ha, moto_endpoint: str) -> None:
    """Replayed from an operator (a pair, the client given both masters): a bind to an endpoint
    that refuses connections took 30 s and ended "this master is a follower" (the client took
    the store's Unavailable for the leader's own and went round the masters until its failover
    deadline), and with the store hanging, `ls`, `refresh` and `persist` took 31-37 s. And files
    read into the cache before the store went down did not read any more. The store's failure is
    now the leader's answer (no failover), and what the cache knows is answered while the store
    does not answer."""
    from babel.testing.s3proxy import S3Proxy
    from babel.testing.servers import free_port
    from tests.conftest import create_bucket
    from tests.pcache.test_binds import _s3

    bucket = create_bucket(moto_endpoint)
    body = os.urandom(3 << 20)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="ds/a.bin", Body=body)
    cluster = make_ha(workers=1)
    with S3Proxy(moto_endpoint) as proxy, client_of(cluster, token=cluster.admin_token) as pc:
        started = time.monotonic()
        with pytest.raises(E.StoreUnavailable, match="refuses connections"):
            pc.bind("/default/bad", f"s3://{bucket}/x/?endpoint_url=http://127.0.0.1:{free_port()}")
        assert time.monotonic() - started < 5
        pc.bind("/default/ds", f"s3://{bucket}/ds/?endpoint_url={proxy.endpoint}", meta_ttl=1)
        assert pc.read_file("/default/ds/a.bin") == body  # cached now
        assert [e.name for e in pc.listdir("/default/ds")] == ["a.bin"]  # listed
        time.sleep(1.2)  # past the TTL: the next open checks the object with the store
        proxy.delay = 30.0  # the store takes connections and answers nothing
        started = time.monotonic()
        with pytest.raises(E.StoreTimeout, match="under-store did not answer"):
            pc.stat("/default/ds/never-listed")  # only the store knows: its failure, said once
        assert time.monotonic() - started < 10
        started = time.monotonic()
        assert pc.read_file("/default/ds/a.bin") == body  # the cached version, while the store is down
        assert [e.name for e in pc.listdir("/default/ds")] == ["a.bin"]
        with pytest.raises(E.StoreTimeout):
            pc.refresh("/default/ds")  # asks the store itself: its failure, at once, not a failover
        assert time.monotonic() - started < 12
        assert pc.aio.master.failovers == 0
        proxy.delay = 0.0
    cluster.wait_in_sync()


def test_a_client_follows_the_leader_its_master_list_leaves_out(make_ha) -> None:
    """Replayed from an operator: a pair restarted on other ports; a client given the follower
    and an address nobody answers any more failed every call after 30 s, although the follower
    named the leader in each refusal. It follows the named leader, as a client given one
    address does."""
    from pcache.common.process import free_port

    cluster = make_ha(workers=1)
    leader = cluster.leader()
    follower = follower_of(cluster, leader)
    with client_of(cluster, token=cluster.token) as pc:
        pc.mkdir("/default/known", parents=True)
    stale = f"127.0.0.1:{free_port()}"
    with Client(ClientConfig(master=f"{follower.address},{stale}", token=cluster.token)) as pc:
        started = time.monotonic()
        pc.mkdir("/default/followed")
        assert time.monotonic() - started < 5
        assert pc.stat("/default/known").kind == "dir"
        assert leader.address in pc.aio.master.addresses
    # `pcache status` pointed at the follower alone answers with the leader's view (it exited 2,
    # "master unreachable", whenever a health check's one address was the follower)
    status = subprocess.run(
        [sys.executable, "-m", "pcache", "--master", follower.address, "status"],
        env={**os.environ, "PCACHE_TOKEN": cluster.admin_token}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0 and f"leader {leader.address}" in status.stdout, status.stdout + status.stderr


def test_a_tenants_revocation_outlives_the_leader(make_ha) -> None:
    """``pcache tenant revoke-tokens`` is replicated: after the leader's SIGKILL the new leader
    refuses the revoked token, and the workers, told by the new leader, refuse the block tokens
    minted before it; a token issued afterwards works."""
    from pcache.testing.faults import raw_read_refusal

    cluster = make_ha(workers=2)
    with client_of(cluster, token=cluster.admin_token) as admin:
        admin.create_tenant("leaky")
        leaked = admin.issue_token("leaky")
        with client_of(cluster, token=leaked) as pc:
            pc.write_file("/data", b"d" * 5000)
            held = pc.layout("/data").blocks[0]
        admin.revoke_tokens("leaky")
        fresh = admin.issue_token("leaky")
        cluster.wait_in_sync()
        leader = cluster.leader()
        cluster.kill(leader, signal.SIGKILL)
        assert cluster.leader() is not leader
        with client_of(cluster, token=leaked) as pc, pytest.raises(E.PermissionDenied, match="token revoked"):
            pc.stat("/data")
        cluster.start_ha_master(index_of(cluster, leader))  # back, as the follower
        cluster.wait_in_sync()
        with client_of(cluster, token=leaked) as pc:
            answers = dict(pc.master_statuses())  # a follower's own status: not for it either
            assert len(answers) == 2 and all(isinstance(a, E.PermissionDenied) for a in answers.values()), answers
        with client_of(cluster, token=fresh) as pc:
            assert pc.read_file("/data") == b"d" * 5000
            assert all(isinstance(a, pb.ClusterStatus) for a in dict(pc.master_statuses()).values())
    for replica in held.replicas:  # within a heartbeat or two of the new leader's
        why = wait_for(lambda: raw_read_refusal(replica, held), 10, f"a refusal at {replica.worker_id}")  # noqa: B023
        assert "revoked" in why, why


def test_a_running_client_follows_a_failover_after_a_ca_rotation(make_ha, tmp_path: Path) -> None:
    """The CA of an HA pair rotated (the guide's order: bundles first, then the servers'
    certificates); then the leader died. The running client's connection to it had never needed a
    new handshake, and at the follower it was refused in one (it still trusted only the old CA),
    and it never read its TLS directory again: every call failed until its failover timeout. It
    reads it again as soon as a master refuses its TLS, and goes on."""
    from cryptography import x509

    from pcache.common.tls import RECHECK, issue_certificate, make_ca, write_tls_dir
    from tests.pcache.test_tls import _served_serial

    hosts = ("localhost", "127.0.0.1")
    old_ca, new_ca = make_ca(common_name="old CA"), make_ca(common_name="new CA")
    write_tls_dir(tmp_path / "ha0" / "tls", old_ca.cert_pem, *issue_certificate(old_ca, hosts))  # make_ha's first
    client_dir = tmp_path / "client"
    client_pair = issue_certificate(old_ca, hosts)
    write_tls_dir(client_dir, old_ca.cert_pem, *client_pair)
    cluster = make_ha(workers=1, tls=True)
    assert cluster.tls_dir == str(tmp_path / "ha0" / "tls")
    with client_of(cluster, token=cluster.token, tls_dir=str(client_dir), short_circuit=False) as pc:
        pc.write_file("/before", b"b" * 100_000)
        bundle = old_ca.cert_pem + new_ca.cert_pem
        served = issue_certificate(new_ca, hosts)
        write_tls_dir(client_dir, bundle, *client_pair)
        write_tls_dir(cluster.tls_dir, bundle, *served)
        serial = x509.load_pem_x509_certificate(served[0]).serial_number
        for proc in cluster.master_procs:
            host, port = proc.address.rsplit(":", 1)
            wait_for(lambda: _served_serial(host, int(port), client_dir, ["h2"]) == serial, RECHECK * 3,  # noqa: B023
                     f"the new CA's certificate at {proc.address}")  # fmt: skip
        cluster.wait_in_sync()
        cluster.kill(cluster.leader(), signal.SIGKILL)
        t0 = time.monotonic()
        pc.mkdir("/after")
        assert time.monotonic() - t0 < 15
        assert pc.read_file("/before") == b"b" * 100_000


@pytest.mark.slow
def test_etcd_that_lost_its_data_halts_the_pair_until_recover_and_epochs_only_grow(make_ha) -> None:
    """etcd emptied under a running pair (its data directory lost): its revision, the epochs'
    source, starts again from 1, and its record of the last leader is gone. No master may lead
    then (a new epoch would be lower than the one workers and clients hold, and an out-of-sync
    master could win); ``pcache ha recover`` makes the master with the newest log lead again
    with higher epochs: the client that saw the old epoch goes on, the worker runs the new
    leader's deletes, nothing acknowledged is lost."""
    cluster = make_ha(workers=1)
    assert cluster.etcd is not None
    etcd_dir = cluster.etcd.data_dir
    with client_of(cluster, failover_timeout=3.0) as pc:
        payload = random.Random(5).randbytes(3 << 20)
        pc.write_file("/before", payload)
        pc.write_file("/doomed", b"d" * 70_000)
        old_epoch = pc.status().epoch
        doomed = [f for copies in replica_files(pc.layout("/doomed")) for f in copies]
        assert doomed and all(f.exists() for f in doomed)
        cluster.etcd.stop()
        shutil.rmtree(etcd_dir)
        cluster.start_etcd()  # same port, empty: revision 1

        def halted() -> list[str]:
            why = [role_of(cluster, p).may_not_lead for p in cluster.master_procs]
            return why if all("etcd lost the cluster's record" in w for w in why) else []

        why = wait_for(halted, 30, "both masters to find etcd's record lost")
        assert "restored from an older snapshot" in why[0] and "pcache ha recover" in why[0], why
        assert [role_of(cluster, p).role for p in cluster.master_procs] == ["follower", "follower"]
        wait_for(lambda: all(role_of(cluster, p).leader == "" for p in cluster.master_procs), 10, "no leader named")
        with pytest.raises((E.Unavailable, E.Timeout)) as info:
            pc.write_file("/while-halted", b"x")
        assert "etcd lost the cluster's record" in str(info.value), info.value  # the client says why
        status = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", cluster.master_address, "status"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 2 and status.stdout.count("may not take over: etcd lost") == 2, status.stdout
        shown = subprocess.run(
            [sys.executable, "-m", "pcache", "ha", "recover", "--etcd", cluster.etcd.endpoint],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "would lead next" in shown.stdout and "nothing written" in shown.stderr, shown.stdout
        time.sleep(1.0)
        assert all(role_of(cluster, p).role == "follower" for p in cluster.master_procs)  # a plan writes nothing
        applied = subprocess.run(
            [sys.executable, "-m", "pcache", "ha", "recover", "--etcd", cluster.etcd.endpoint, "--yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert " leads next; epochs start above " in applied.stdout, applied.stdout
        leader = cluster.leader(timeout=30)
        assert leader.address in applied.stdout  # the master the plan named
        pc.write_file("/after", b"a")  # the same client, holding the old epoch, follows the new leader
        new_epoch = pc.status().epoch
        assert new_epoch > old_epoch, (old_epoch, new_epoch)
        assert pc.read_file("/before") == payload and not pc.exists("/while-halted")
        pc.unlink("/doomed")  # the worker runs the new leader's delete: its epoch is the newest
        wait_for(lambda: not any(f.exists() for f in doomed), 30, "the worker to delete the blocks")
        roles = sorted(role_of(cluster, p).role for p in cluster.master_procs)
        assert roles == ["follower", "leader"]
    again = subprocess.run(
        [sys.executable, "-m", "pcache", "ha", "recover", "--etcd", cluster.etcd.endpoint, "--yes"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 3 and "leads cluster 'pcache': nothing to recover" in again.stderr, again.stderr
