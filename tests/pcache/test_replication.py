"""The replicated metastore log without a network: numbering, terms, log matching, the tail,
checkpoints, and the reply cache that answers retried mutations once."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcache.common import errors as E
from pcache.master.dedup import ReplyCache
from pcache.master.metastore import MemoryMetaStore, RocksMetaStore
from pcache.master.namespace import Namespace
from pcache.master.replication import ReplicatedStore, recover_incoming
from pcache.proto import pcache_pb2 as pb


def leader_store(**kwargs) -> ReplicatedStore:
    store = ReplicatedStore(MemoryMetaStore(), **kwargs)
    store.epoch = 7
    store.start_term(7)
    return store


def test_every_write_is_the_next_entry_of_the_term() -> None:
    store = leader_store()
    assert (store.index, store.index_epoch) == (1, 7)  # the term's first entry
    store.write([(b"k1", b"v1")])
    store.write([(b"k2", b"v2")], [b"k1"])
    assert store.index == 3 and [e.index for e in store.tail] == [1, 2, 3]
    assert store.get(b"k1") is None and store.get(b"k2") == b"v2"
    store.start_term(9)
    store.write([(b"k3", b"v3")])
    assert [store.epoch_of(i) for i in range(6)] == [0, 7, 7, 7, 9, 9]
    assert store.holds(3, 7) and store.holds(5, 9)
    assert not store.holds(3, 9) and not store.holds(6, 9)  # another term's entry; past the end


def test_a_follower_applies_only_entries_that_follow_its_log() -> None:
    leader = leader_store()
    for i in range(5):
        leader.write([(b"k%d" % i, b"v")])
    follower = ReplicatedStore(MemoryMetaStore())
    first = pb.AppendRequest(epoch=7, prev_index=0, prev_epoch=0, entries=leader.entries_after(0)[:3])
    assert follower.append(first) and follower.index == 3
    gap = pb.AppendRequest(epoch=7, prev_index=4, prev_epoch=7, entries=leader.entries_after(4))
    assert not follower.append(gap) and follower.index == 3  # refused, nothing applied
    wrong_term = pb.AppendRequest(epoch=7, prev_index=3, prev_epoch=5, entries=leader.entries_after(3))
    assert not follower.append(wrong_term)
    rest = pb.AppendRequest(epoch=7, prev_index=3, prev_epoch=7, entries=leader.entries_after(3))
    assert follower.append(rest) and (follower.index, follower.index_epoch) == (leader.index, 7)
    assert dict(follower.scan(b"k")) == dict(leader.scan(b"k"))
    assert follower.epoch_of(1) == 7  # the term record came with the log


def test_the_tail_is_bounded_and_says_when_it_cannot_serve() -> None:
    store = leader_store(tail_entries=10)
    for i in range(30):
        store.write([(b"k%d" % i, b"x" * 100)])
    assert len(store.tail) == 10 and store.tail_first() == store.index - 9
    with pytest.raises(LookupError):
        store.entries_after(5)
    assert [e.index for e in store.entries_after(store.index - 3)] == [store.index - 2, store.index - 1, store.index]


def test_a_write_that_is_not_allowed_changes_nothing() -> None:
    store = leader_store()
    store.writable = lambda: "this master is a follower"
    with pytest.raises(E.NotLeader, match="follower"):
        store.write([(b"k", b"v")])
    assert store.get(b"k") is None and store.index == 1


def test_amend_puts_the_reply_in_the_mutations_entry() -> None:
    store = leader_store()
    mark = store.index
    store.write([(b"a", b"1")])
    store.amend(mark, [(b"r-id", b"reply")])
    assert store.index == mark + 1 and {kv.key for kv in store.tail[-1].puts} == {b"a", b"r-id"}
    assert store.get(b"r-id") == b"reply"
    store.amend(store.index, [(b"r-2", b"reply2")])  # no mutation since: a new entry of its own
    assert store.index == mark + 2


def test_reply_cache_answers_a_retry_once_and_expires() -> None:
    clock = [1000.0]
    store = leader_store()
    replies = ReplyCache(store, keep=60.0, clock=lambda: clock[0])
    assert replies.get("c:1", "Create", pb.Inode) is None
    since = store.index
    store.write([(b"i", b"node")])
    replies.record("c:1", "Create", pb.Inode(id=42, name="f"), since)
    assert replies.get("c:1", "Create", pb.Inode) == pb.Inode(id=42, name="f")
    with pytest.raises(E.InvalidArgument, match="used for Create"):
        replies.get("c:1", "Rename", pb.Inode)
    with pytest.raises(E.InvalidArgument):
        replies.get("x" * 301, "Create", pb.Inode)
    clock[0] += 61
    assert replies.expire() == 1 and replies.get("c:1", "Create", pb.Inode) is None


def test_a_namespace_rebuilt_from_a_replica_continues_its_ids(tmp_path: Path) -> None:
    """What a follower does when it takes over: same tree, ids past every id handed out,
    reservations of uncommitted blocks kept."""
    leader = leader_store()
    ns = Namespace(leader, default_block_size=1 << 20, default_replication=1)
    f, _ = ns.create("/f")
    pending, *_ = ns.allocate_block(f.id, 1)
    follower = ReplicatedStore(MemoryMetaStore())
    assert follower.append(pb.AppendRequest(epoch=7, entries=leader.entries_after(0)))
    follower.epoch = 9
    follower.start_term(9)
    taken = Namespace(follower, default_block_size=1 << 20, default_replication=1)
    assert taken.resolve("/f").id == f.id and taken.allocations.owner(pending) == f.id
    assert taken.create("/g")[0].id > f.id and taken.allocate_block(f.id)[0] > pending
    node, _ = taken.commit_file(f.id, 1, [pb.CommittedBlock(block_id=pending, length=1, replicas=["w"])])
    assert list(node.blocks) == [pending]


def test_checkpoint_install_swaps_the_database(tmp_path: Path) -> None:
    path = str(tmp_path / "leader")
    leader = ReplicatedStore(RocksMetaStore(path), path=path)
    leader.epoch = 3
    leader.start_term(3)
    leader.write([(b"k", b"v")])
    fpath = str(tmp_path / "follower")
    follower = ReplicatedStore(RocksMetaStore(fpath), path=fpath, reopen=lambda: RocksMetaStore(fpath))
    follower.local.write([(b"stale", b"x")])  # what a deposed leader might hold
    assert leader.checkpoint(fpath + ".incoming") == (2, 3)
    follower.install(fpath + ".incoming")
    assert (follower.index, follower.index_epoch) == (2, 3) and follower.get(b"k") == b"v"
    assert follower.get(b"stale") is None and follower.epoch_of(2) == 3
    follower.close()
    leader.close()
    # a crash between the two renames of an install is finished at the next start
    import os

    os.rename(fpath, fpath + ".incoming")
    (Path(fpath + ".incoming") / "COMPLETE").write_text("")
    os.makedirs(fpath + ".ckpt-m-1")
    recover_incoming(fpath)
    assert os.path.isdir(fpath) and not os.path.exists(fpath + ".incoming") and not os.path.exists(fpath + ".ckpt-m-1")
    reopened = ReplicatedStore(RocksMetaStore(fpath), path=fpath)
    assert reopened.index == 2 and reopened.get(b"k") == b"v"
    reopened.close()


class _Flags:
    """In-sync flags kept in memory (the etcd-backed ones are exercised in test_master_ha)."""

    def __init__(self) -> None:
        self.in_sync: set[str] = set()

    async def set_in_sync(self, member: str) -> bool:
        self.in_sync.add(member)
        return True

    async def clear_in_sync(self, member: str) -> bool:
        self.in_sync.discard(member)
        return True


@pytest.mark.parametrize("transport", ["stream", "grpc"])
def test_the_append_stream_pipelines_bursts_and_stays_up_when_idle(tmp_path: Path, transport: str) -> None:
    """A leader's log reaches a follower process over one stream (loopback; the replication
    stream, or gRPC's Append stream for a follower without one): every commit returns once the
    follower applied it, both stores agree, and an idle stream (heartbeats only) is not mistaken
    for a silent follower: it is never re-probed."""
    import asyncio
    import signal
    import subprocess
    import sys

    from pcache.common.auth import mint_token
    from pcache.common.credentials import ClusterKeys
    from pcache.master.replication import LogShipper

    keys_file = tmp_path / "keys.json"
    keys = ClusterKeys.load_or_create(str(keys_file))
    follower_dir = tmp_path / "follower"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pcache.testing.follower", str(follower_dir), str(keys_file), f"--{transport}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        leader = leader_store()

        async def scenario() -> None:
            shipper = LogShipper(
                leader, epoch=7, address="leader", flags=_Flags(), rpc_timeout=1.0, heartbeat=0.1,
                token=mint_token(keys.tokens, "cluster", "master"),
            )  # fmt: skip
            probes = 0
            try:
                shipper.set_members({"f1": f"127.0.0.1:{port}"})
                follower = shipper.followers["f1"]
                real_rpc = shipper._rpc

                async def counting(f, name, request):
                    nonlocal probes
                    probes += name == "Probe"
                    return await real_rpc(f, name, request)

                shipper._rpc = counting  # type: ignore[method-assign]
                for _ in range(250):  # until it is in sync (required): commits wait for it from then on
                    if follower.in_sync:
                        break
                    await asyncio.sleep(0.02)
                assert follower.in_sync
                assert (follower.stream_port != 0) == (transport == "stream")
                for burst in range(5):
                    waits = []
                    for i in range(40):  # concurrent writers: their entries leave on several messages
                        leader.write([(b"k%d.%d" % (burst, i), b"v" * i)])
                        waits.append(shipper.commit(leader.index, timeout=5.0))
                        if i % 7 == 0:
                            await asyncio.sleep(0)
                    await asyncio.gather(*waits)
                    assert follower.acked == leader.index  # committed means applied there
                probes_before = probes
                await asyncio.sleep(2.5)  # idle: more than twice the answer deadline
                assert follower.state == "replicating" and probes == probes_before
                assert shipper.status()[0].last_contact_age < 0.5  # heartbeats answered
                leader.write([(b"after-idle", b"x")])
                await shipper.commit(leader.index, timeout=5.0)
            finally:
                shipper.close()

        asyncio.run(scenario())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    copy = ReplicatedStore(RocksMetaStore(str(follower_dir)))
    try:
        assert copy.index == leader.index and copy.get(b"after-idle") == b"x"
        assert dict(copy.scan(b"k")) == dict(leader.scan(b"k")) and len(dict(leader.scan(b"k"))) == 200
    finally:
        copy.close()


def test_an_answer_that_comes_while_its_message_is_written_is_counted() -> None:
    """The race a busy machine shows: the follower's answer arrives before the leader's write()
    returns. The stream must not keep waiting for an answer it already had (it would call an
    idle follower silent after rpc_timeout and probe it again)."""
    import asyncio

    from pcache.master.replication import Follower, LogShipper

    class EagerCall:
        """A stream to a follower that answers before write() returns."""

        def __init__(self, store: ReplicatedStore) -> None:
            self.store = store
            self.answers: asyncio.Queue = asyncio.Queue()

        async def write(self, request: pb.AppendRequest) -> None:
            ok = self.store.append(request)
            reply = pb.AppendResponse(
                epoch=7, ok=ok, applied_index=self.store.index, applied_epoch=self.store.index_epoch
            )
            await self.answers.put(reply)
            await asyncio.sleep(0.01)  # the reader takes the answer meanwhile

        async def read(self) -> pb.AppendResponse:
            return await self.answers.get()

        def cancel(self) -> None:
            pass

    async def scenario() -> None:
        leader = leader_store()
        replica = ReplicatedStore(MemoryMetaStore())
        call = EagerCall(replica)
        shipper = LogShipper(leader, epoch=7, address="leader", flags=_Flags(), rpc_timeout=0.5, heartbeat=0.1)
        follower = Follower("f1", "nowhere")
        follower.stub = type("Stub", (), {"Append": lambda self, metadata=None: call})()  # type: ignore[assignment]
        follower.next_index = 1
        stream = asyncio.ensure_future(shipper._stream(follower))
        try:
            for i in range(30):
                leader.write([(b"k%d" % i, b"v")])
                await asyncio.sleep(0.005)
            await asyncio.sleep(1.5)  # idle for three answer deadlines
            assert not stream.done(), stream.exception()
            assert follower.acked == leader.index == replica.index
        finally:
            stream.cancel()
            shipper.close()

    asyncio.run(scenario())


def test_a_follower_refuses_the_term_it_found_gone() -> None:
    """Once a follower has revoked the lease of a leader whose process was gone, that term's
    entries are refused: were the leader alive after all, it acknowledges nothing more."""
    from pcache.common.auth import Guard
    from pcache.master.replication import ReplicationServicer

    leader = leader_store()
    leader.write([(b"k", b"v")])
    servicer = ReplicationServicer(ReplicatedStore(MemoryMetaStore()), "f", lambda: False, Guard([], {}))
    request = pb.AppendRequest(epoch=7, leader="a:1", prev_index=0, prev_epoch=0, entries=leader.entries_after(0))
    assert servicer.apply_append(request).ok
    servicer.deposed = 7
    late = pb.AppendRequest(epoch=7, leader="a:1", prev_index=leader.index, prev_epoch=7)
    with pytest.raises(E.StaleEpoch, match="ended here"):
        servicer.apply_append(late)
    assert servicer.apply_append(pb.AppendRequest(epoch=9, leader="b:1", prev_index=leader.index, prev_epoch=7)).ok


def test_a_follower_refuses_a_leader_older_than_a_term_it_holds() -> None:
    """A leader whose epoch is below a term this master holds entries of won on an etcd whose
    data went back: its log (and a checkpoint of it) must never replace this one, even after
    this master restarted and forgot the epochs it had seen."""
    from pcache.common.auth import Guard
    from pcache.master.replication import ReplicationServicer

    store = ReplicatedStore(MemoryMetaStore())
    servicer = ReplicationServicer(store, "f", lambda: False, Guard([], {}))
    servicer.held_term = lambda: 5000
    with pytest.raises(E.StaleEpoch, match="older than term 5000, whose entries this master holds"):
        servicer.apply_append(pb.AppendRequest(epoch=12, leader="new:1", prev_index=0, prev_epoch=0))
    assert store.index == 0 and servicer.epoch == 0
    assert servicer.apply_append(pb.AppendRequest(epoch=5000, leader="a:1", prev_index=0, prev_epoch=0)).ok


class _Recorder(MemoryMetaStore):
    """A memory store that records each local write batch (a list of (puts, deletes))."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[list, list]]] = []

    def write_many(self, batches) -> None:
        batches = [(list(p), list(d)) for p, d in batches]
        self.batches.append(batches)
        for puts, deletes in batches:
            super().write(puts, deletes)

    def write(self, puts=(), deletes=()) -> None:
        self.write_many([(puts, deletes)])


def test_a_mutation_and_its_reply_record_reach_the_disk_in_one_write() -> None:
    """They were two local writes: a master killed between them kept the mutation without its
    answer, and the client's retry applied it again when that master came back."""
    local = _Recorder()
    store = ReplicatedStore(local)
    store.epoch = 7
    store.start_term(7)
    shipped: list[int] = []
    store.on_append = lambda: shipped.append(store.index)
    replies = ReplyCache(store)
    local.batches.clear()
    with store.one_batch():
        since = store.index
        store.write([(b"ns/a", b"1")], [b"ns/old"])
        store.write([(b"ns/b", b"2")])  # a mutation of two writes (an id reservation, then the change)
        assert store.get(b"ns/a") == b"1" and store.get(b"ns/old") is None  # read back before the disk has it
        assert local.get(b"ns/a") is None and store.index == since and not shipped  # nothing written or shipped yet
        replies.record("client:1", "Rename", pb.Inode(id=42), since)
    assert len(local.batches) == 1, local.batches  # one atomic batch: both entries and the record
    keys = [k for puts, _ in local.batches[0] for k, _ in puts]
    assert b"ns/a" in keys and b"ns/b" in keys and b"rclient:1" in keys
    assert store.index == since + 2 and shipped == [since + 2]
    assert [e.index for e in store.tail][-2:] == [since + 1, since + 2]
    assert any(kv.key == b"rclient:1" for kv in store.tail[-1].puts)  # the follower gets it in the same entry
    assert replies.get("client:1", "Rename", pb.Inode).id == 42
    # a scan inside the block reads the local store: what the block wrote goes there first
    with store.one_batch():
        store.write([(b"ns/c", b"3")])
        assert [k for k, _ in store.scan(b"ns/")] == [b"ns/a", b"ns/b", b"ns/c"]
        store.write([(b"ns/d", b"4")])
    assert store.get(b"ns/d") == b"4" and local.get(b"ns/d") == b"4"


def test_status_names_a_follower_not_answered_yet_without_a_made_up_lag(capsys) -> None:
    """From a helper's drill: right after ``pcache up`` restarted a killed master, status said
    "OUT OF SYNC, down, lag 5790 entries, applied 0, last answer never" of a follower whose
    metastore held thousands of entries: the leader had not heard from it yet."""
    from pcache.cli.status import _echo_masters

    role = pb.MasterRole(role="leader", member="m1", address="127.0.0.1:1", applied_index=5790)
    role.followers.add(member="m2", address="127.0.0.1:2", state="down", lag=5790, last_contact_age=-1.0)
    role.followers.add(member="m3", address="127.0.0.1:3", state="replicating", in_sync=True, applied_index=5790,
                       last_contact_age=0.2)  # fmt: skip
    _echo_masters(role)
    out = capsys.readouterr().out
    assert (
        "follower 127.0.0.1:2 (member m2): OUT OF SYNC, down, not answered yet (its log position is not known)" in out
    )
    assert "lag 5790" not in out and "applied 0" not in out
    assert (
        "follower 127.0.0.1:3 (member m3): in sync, replicating, lag 0 entries, applied 5790, last answer 0.2 s ago"
        in out
    )
