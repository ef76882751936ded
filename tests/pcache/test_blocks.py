"""BlockManager: replica tracking, re-replication, repair and deletion commands."""

from __future__ import annotations

import random
import time

import pytest

from pcache.common import errors as E
from pcache.master.blocks import BlockManager
from pcache.master.metastore import open_metastore
from pcache.master.namespace import Namespace
from pcache.master.registry import WorkerRegistry
from pcache.proto import pcache_pb2 as pb

GiB = 1 << 30
DELETE = pb.WorkerCommand.DELETE
REPLICATE = pb.WorkerCommand.REPLICATE


def info(wid: str, *, free: int = 100 * GiB, draining: bool = False) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        addr=pb.WorkerAddr(worker_id=wid, host="127.0.0.1", port=7000 + int(wid[1:]), node_id=f"node-{wid}"),
        free_bytes=free,
        draining=draining,
    )


class Cluster:
    """A Namespace, a WorkerRegistry and a BlockManager wired as the master wires them."""

    def __init__(self, workers: int = 4, seed: int = 0) -> None:
        self.ns = Namespace(open_metastore("memory://"), default_block_size=1 << 20, default_replication=2)
        self.reg = WorkerRegistry(dead_after=5.0, rng=random.Random(seed))
        for i in range(1, workers + 1):
            self.reg.register(info(f"w{i}"))
        self.bm = BlockManager(self.ns, self.reg, replication_timeout=30.0)

    def write(self, path: str, replicas: list[list[str]], replication: int = 2) -> list[int]:
        """Commit a file with one block per replica list, as CommitFile does."""
        node, _ = self.ns.create(path, replication=replication)
        blocks = [
            pb.CommittedBlock(block_id=self.ns.allocate_block(node.id, 100 + n)[0], length=100 + n, replicas=r)
            for n, r in enumerate(replicas)
        ]
        size = (len(blocks) - 1) * node.block_size + blocks[-1].length if blocks else 0
        node, freed = self.ns.commit_file(node.id, size, blocks)
        self.bm.committed(blocks, node.replication)
        self.bm.freed(freed)
        return [b.block_id for b in blocks]

    def kill(self, wid: str) -> None:
        self.reg.workers[wid].last_seen -= 10
        for state in self.reg.expire():
            self.bm.worker_died(state.worker_id)

    def register(self, wid: str, blocks: list[int]) -> None:
        state = self.reg.register(info(wid))
        self.bm.worker_registered(state.worker_id, blocks)

    def take(self, wid: str) -> list[tuple[int, int, list[str]]]:
        """Drain a worker's queued commands as a heartbeat reply does: (kind, block, target ids)."""
        state = self.reg.workers[wid]
        cmds, state.commands = state.commands, []
        return [(c.kind, c.block_id, [t.worker_id for t in c.targets]) for c in cmds]

    def take_all(self) -> dict[str, list[tuple[int, int, list[str]]]]:
        return {wid: cmds for wid in sorted(self.reg.workers) if (cmds := self.take(wid))}

    def stored_replicas(self, block_id: int) -> list[str]:
        return list(self.ns.get_block(block_id).replicas)


@pytest.fixture
def c() -> Cluster:
    return Cluster()


def test_fully_replicated_commit_needs_nothing(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]])
    assert c.bm.locations[b] == {"w1", "w2"}
    assert c.bm.by_worker == {"w1": {b}, "w2": {b}}
    assert c.bm.under == set() and c.bm.under_replicated() == 0 and c.bm.missing() == 0
    assert c.bm.schedule() == 0
    assert c.take_all() == {}
    assert sorted(w.worker_id for w in c.bm.live_replicas(b)) == ["w1", "w2"]


def test_short_commit_is_re_replicated(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1"]], replication=3)
    assert c.bm.under == {b} and c.bm.under_replicated() == 1
    assert c.bm.schedule() == 1
    cmds = c.take_all()
    assert list(cmds) == ["w1"]
    ((kind, block, targets),) = cmds["w1"]
    assert kind == REPLICATE and block == b
    assert len(targets) == 2 and "w1" not in targets and len(set(targets)) == 2
    for t in targets:
        c.bm.block_received(t, b)
    assert c.bm.under == set() and b not in c.bm.inflight
    assert c.stored_replicas(b) == sorted(["w1", *targets])


def test_commit_naming_a_worker_that_died_meanwhile(c: Cluster) -> None:
    c.kill("w2")  # dies while the client still writes; its death was handled before the commit
    (b,) = c.write("/f", [["w1", "w2"]])
    assert c.bm.under == {b} and c.bm.under_replicated() == 1
    assert c.bm.schedule() == 1
    ((kind, block, targets),) = c.take("w1")
    assert (kind, block) == (REPLICATE, b) and targets[0] in ("w3", "w4")


def test_worker_death_re_replicates_from_a_live_source(c: Cluster) -> None:
    blocks = c.write("/f", [["w1", "w2"], ["w1", "w3"], ["w2", "w3"]])
    c.kill("w1")
    assert c.bm.under == set(blocks[:2])
    assert c.bm.under_replicated() == 2 and c.bm.missing() == 0
    assert "w1" not in c.bm.by_worker or c.bm.by_worker["w1"] == set()
    # the stored replica sets forget the dead worker
    assert c.stored_replicas(blocks[0]) == ["w2"] and c.stored_replicas(blocks[1]) == ["w3"]
    assert c.bm.schedule() == 2
    cmds = c.take_all()
    assert "w1" not in cmds  # a dead worker gets nothing
    issued = {block: (src, targets) for src, lst in cmds.items() for kind, block, targets in lst if kind == REPLICATE}
    assert issued[blocks[0]][0] == "w2" and issued[blocks[1]][0] == "w3"
    for block, (_src, targets) in issued.items():
        assert len(targets) == 1
        assert targets[0] not in c.bm.locations[block] and targets[0] != "w1"
        assert c.reg.get_alive(targets[0]) is not None
    # until the copies are confirmed nothing is issued twice
    assert c.bm.schedule() == 0 and c.take_all() == {}
    for block, (_, targets) in issued.items():
        c.bm.block_received(targets[0], block)
    assert c.bm.under == set() and c.bm.inflight == {}
    assert all(len(c.stored_replicas(b)) == 2 for b in blocks)
    assert c.bm.schedule() == 0


def test_unconfirmed_replication_is_issued_again_after_the_timeout(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]])
    c.kill("w2")
    assert c.bm.schedule() == 1
    c.take_all()
    assert c.bm.schedule() == 0
    c.bm.inflight[b] -= 31
    assert c.bm.schedule() == 1
    ((kind, block, _),) = c.take("w1")
    assert (kind, block) == (REPLICATE, b)


def test_a_failed_replication_is_issued_again_at_once_to_another_target(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]])
    c.kill("w2")
    assert c.bm.schedule() == 1
    ((_, _, (first,)),) = c.take("w1")
    assert c.bm.schedule() == 0  # in flight
    c.bm.replication_failed("w1", b, [first], "Unavailable: connection refused")
    assert c.bm.schedule() == 1  # at the next pass, not after replication_timeout
    ((kind, block, (second,)),) = c.take("w1")
    assert (kind, block) == (REPLICATE, b) and second not in (first, "w1", "w2")
    # the other one fails too: no target is left but the two that failed lately; it waits for them
    c.bm.replication_failed("w1", b, [second])
    assert c.bm.schedule() == 0 and c.take_all() == {}
    assert b in c.bm.under and c.bm.under_replicated() == 1
    for until in c.bm.avoid[b].values():
        assert until > time.monotonic() + 25
    c.bm.avoid[b] = {wid: time.monotonic() - 1 for wid in c.bm.avoid[b]}  # the window is over
    assert c.bm.schedule() == 1
    ((_, _, (third,)),) = c.take("w1")
    c.bm.block_received(third, b)
    assert c.bm.under == set() and c.bm.inflight == {} and c.bm.issued == {}
    assert c.stored_replicas(b) == sorted(["w1", third])
    assert c.bm.schedule() == 0 and b not in c.bm.avoid


def test_a_failure_report_about_an_older_command_only_marks_its_targets(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]])
    c.kill("w2")
    assert c.bm.schedule() == 1
    ((_, _, (target,)),) = c.take("w1")
    other = ({"w3", "w4"} - {target}).pop()
    c.bm.replication_failed("w3" if target != "w3" else "w4", b, [other])  # not this command's source
    assert b in c.bm.inflight and c.bm.schedule() == 0  # the command in flight stands
    c.bm.replication_failed("w1", b, ["w9"])  # nor this command's targets
    assert b in c.bm.inflight and c.bm.schedule() == 0
    c.bm.replication_failed("w1", b, [target])
    assert c.bm.schedule() == 0  # both live candidates failed lately
    # a report about a block nobody has any more changes nothing
    c.bm.replication_failed("w1", 98765, ["w3"])
    assert 98765 not in c.bm.avoid


def test_a_copy_that_failed_at_its_source_blames_no_target(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]], replication=3)
    assert c.bm.schedule() == 1
    ((source, [(_, _, targets)]),) = c.take_all().items()
    c.bm.replication_failed(source, b, [], "CorruptBlock: chunk 0 failed its CRC32C check")
    assert b not in c.bm.inflight and b not in c.bm.avoid and c.bm.failing_targets() == {}
    c.bm.bad_block(source, b)  # the read that failed reported the source's copy
    assert c.bm.schedule() == 1  # at once, from the other copy; the target is not left out
    ((other, [(_, _, again)]),) = c.take_all().items()
    assert other != source and set(targets) <= set(again)  # (two now: the bad copy no longer counts)


def test_a_dead_target_ends_its_replication_at_once(c: Cluster) -> None:
    blocks = c.write("/f", [["w1", "w2"], ["w1", "w2"]], replication=3)
    assert c.bm.schedule() == 2
    issued = {blk: (src, targets) for src, lst in c.take_all().items() for _, blk, targets in lst}
    assert all(targets[0] in ("w3", "w4") for _, targets in issued.values())
    c.kill("w3")
    dropped = {blk for blk, (_, targets) in issued.items() if "w3" in targets}
    assert dropped and all(blk not in c.bm.inflight for blk in dropped)
    assert all(blk in c.bm.inflight for blk in set(blocks) - dropped)
    assert c.bm.schedule() == len(dropped)
    again = [(blk, targets) for lst in c.take_all().values() for _, blk, targets in lst]
    assert sorted(blk for blk, _ in again) == sorted(dropped) and all(t == ["w4"] for _, t in again)


def test_a_dead_source_ends_its_replication_and_its_targets_stay_candidates() -> None:
    c = Cluster(workers=3)
    (b,) = c.write("/f", [["w1", "w2"]], replication=3)
    assert c.bm.schedule() == 1
    ((source, [(_, _, targets)]),) = c.take_all().items()
    assert targets == ["w3"]
    c.kill(source)  # it died while sending: w3 gets nothing from it
    assert b not in c.bm.inflight and b not in c.bm.avoid
    assert c.bm.schedule() == 1  # at once, to the same target, from the other holder
    ((other, [(_, _, again)]),) = c.take_all().items()
    assert other != source and again == ["w3"]


def test_a_dead_worker_in_a_pipeline_leaves_out_only_the_targets_before_it() -> None:
    c = Cluster(workers=6)
    (b,) = c.write("/f", [["w1"]], replication=3)
    assert c.bm.schedule() == 1
    ((_, _, (head, tail)),) = c.take("w1")
    c.kill(tail)  # the head may still store its copy; nothing reaches past the dead one
    assert set(c.bm.avoid[b]) == {head}
    assert c.bm.schedule() == 1
    ((_, _, again),) = c.take("w1")
    assert head not in again and tail not in again and len(again) == 2
    c2 = Cluster(workers=6)
    (b2,) = c2.write("/f", [["w1"]], replication=3)
    c2.bm.schedule()
    ((_, _, (head2, _)),) = c2.take("w1")
    c2.kill(head2)  # the head is gone: the rest of its pipeline gets nothing either
    assert b2 not in c2.bm.avoid and c2.bm.schedule() == 1


def test_a_worker_copies_failed_to_is_chosen_only_when_no_other_can_take_the_block() -> None:
    c = Cluster(workers=4)
    first, second = c.write("/f", [["w1", "w2"], ["w1", "w2"]])
    c.kill("w2")
    c.bm.schedule()
    issued = {blk: targets for _, lst in c.take_all().items() for _, blk, targets in lst}
    bad = issued[first][0]  # w3 or w4
    good = ({"w3", "w4"} - {bad}).pop()
    c.bm.replication_failed("w1", first, [bad], "Timeout: peer did not accept data for 10.0s")
    assert c.bm.failing_targets() == {bad: (1, "Timeout: peer did not accept data for 10.0s")}
    if issued[second] == [bad]:  # in flight to it: reported failed too
        c.bm.replication_failed("w1", second, [bad], "Timeout: again")
    for _ in range(5):  # every other block goes to the good worker while the bad one is failing
        (b,) = c.write(f"/g{_}", [["w1"]])
        assert c.bm.schedule() >= 1
        sent = {blk: targets for _, lst in c.take_all().items() for _, blk, targets in lst}
        assert sent[b] == [good]
        c.bm.block_received(good, b)
        for blk, targets in sent.items():
            if blk != b:
                c.bm.block_received(targets[0], blk)
    # only the failing worker could take it: it is tried (the block's own failed target waits)
    c.kill(good)
    (last,) = c.write("/h", [["w1"]])
    assert c.bm.schedule() >= 1
    assert [t for _, blk, t in c.take("w1") if blk == last] == [[bad]]
    # a restarted worker starts afresh
    c.register(bad, [])
    assert c.bm.failing_targets() == {}


def test_blocks_with_no_target_are_counted() -> None:
    c = Cluster(workers=3)
    (b,) = c.write("/f", [["w1", "w2"]])
    c.reg.register(info("w3", free=10))  # full: the block is 100 bytes
    c.kill("w2")
    assert c.bm.schedule() == 0 and c.bm.without_target == {b}
    c.reg.register(info("w3", free=1000))
    assert c.bm.schedule() == 1 and c.bm.without_target == set()


def test_fsck_names_the_dead_workers_that_held_a_missing_block(c: Cluster) -> None:
    from pcache.master import fsck

    (b,) = c.write("/f", [["w1", "w2"]])
    c.kill("w1")
    c.kill("w2")
    (damaged,) = fsck.check(c.ns, c.bm).damaged
    assert damaged.state == "missing" and [a.worker_id for a in damaged.dead] == ["w1", "w2"]
    assert damaged.dead[0].node_id == "node-w1"
    c.register("w2", [b])  # back with its copy: readable, and no longer a dead holder
    (damaged,) = fsck.check(c.ns, c.bm).damaged
    assert damaged.state == "under-replicated" and [a.worker_id for a in damaged.dead] == ["w1"]
    c.bm.schedule()
    ((_, _, (target,)),) = c.take("w2")
    c.bm.block_received(target, b)
    assert fsck.check(c.ns, c.bm).damaged == [] and c.bm.died_with == {}


def test_block_received_for_unknown_block_is_deleted(c: Cluster) -> None:
    c.bm.block_received("w3", 98765)
    assert c.take_all() == {"w3": [(DELETE, 98765, [])]}


@pytest.mark.parametrize("seed", range(8))
def test_bad_block_is_quarantined_repaired_then_deleted(seed: int) -> None:
    c = Cluster(seed=seed)
    (b,) = c.write("/f", [["w1", "w2"]])
    c.bm.bad_block("w1", b)
    assert c.bm.locations[b] == {"w2"} and c.stored_replicas(b) == ["w2"]
    assert c.bm.under == {b} and list(c.ns.get_block(b).quarantined) == ["w1"]
    assert c.reg.workers["w1"].commands == []  # kept until a good replica is back
    assert c.bm.schedule() == 1
    ((kind, block, targets),) = c.take("w2")
    assert (kind, block) == (REPLICATE, b)
    assert targets[0] in ("w3", "w4")  # never onto the worker holding the bad copy
    assert c.take("w1") == []
    c.bm.block_received(targets[0], b)
    assert c.bm.under == set() and c.stored_replicas(b) == sorted(["w2", targets[0]])
    assert c.take("w1") == [(DELETE, b, [])]  # good replicas are back: now the bad copy goes
    assert list(c.ns.get_block(b).quarantined) == []


def test_bad_block_with_no_other_target_replaces_the_bad_copy() -> None:
    """With only two workers the repaired copy must go back to the bad one, after its DELETE left."""
    c = Cluster(workers=2)
    (b,) = c.write("/f", [["w1", "w2"]])
    c.bm.bad_block("w1", b)
    assert c.bm.schedule() == 0  # no target but w1: its bad copy is released (a good one exists)
    assert c.take("w1") == [(DELETE, b, [])]
    assert c.bm.schedule() == 1
    assert c.take("w2") == [(REPLICATE, b, ["w1"])]


def test_the_last_copies_of_a_block_are_never_deleted(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1", "w2"]])
    c.bm.bad_block("w1", b)
    c.bm.bad_block("w2", b)
    assert c.bm.missing() == 0 and c.bm.corrupt_blocks() == 1 and c.bm.under_replicated() == 0
    assert c.bm.schedule() == 0  # nothing good to copy from
    assert c.take_all() == {}  # and nothing deleted
    assert sorted(c.ns.get_block(b).quarantined) == ["w1", "w2"]
    # a restarted master keeps them quarantined, and a full block report does not bring them back
    bm = BlockManager(c.ns, c.reg, replication_timeout=30.0)
    assert bm.quarantined == {b: {"w1", "w2"}}
    bm.worker_registered("w1", [b])
    assert bm.locations[b] == set() and bm.corrupt_blocks() == 1
    # deleting the file deletes the evidence too
    freed = c.ns.delete("/f")
    c.bm.freed(freed)
    assert c.take_all() == {"w1": [(DELETE, b, [])], "w2": [(DELETE, b, [])]}


def test_bad_block_of_unknown_block_only_deletes(c: Cluster) -> None:
    c.bm.bad_block("w2", 5555)
    assert c.bm.under == set()
    assert c.take_all() == {"w2": [(DELETE, 5555, [])]}


def test_worker_registered_deletes_orphans_and_adopts_known_blocks(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1"]])
    node = c.ns.resolve("/f")
    pending, *_ = c.ns.allocate_block(node.id)  # being written right now: not an orphan
    c.register("w3", [b, 4242, pending, 4343])
    cmds = c.take_all()
    assert list(cmds) == ["w3"]
    assert sorted(cmds["w3"]) == [(DELETE, 4242, []), (DELETE, 4343, [])]
    assert c.bm.locations[b] == {"w1", "w3"}
    assert c.stored_replicas(b) == ["w1", "w3"]
    assert c.bm.under == set()


def test_worker_registered_without_a_replica_it_had(c: Cluster) -> None:
    b1, b2 = c.write("/f", [["w1", "w2"], ["w1", "w2"]])
    c.register("w1", [b2])  # restarted and lost b1
    assert c.bm.locations[b1] == {"w2"} and c.bm.under == {b1}
    assert c.stored_replicas(b1) == ["w2"]
    assert c.bm.schedule() == 1
    ((kind, block, targets),) = c.take("w2")
    assert (kind, block) == (REPLICATE, b1) and targets[0] != "w2"


def test_dead_worker_returns_with_its_blocks(c: Cluster) -> None:
    (b,) = c.write("/f", [["w1"]], replication=1)
    c.kill("w1")
    assert c.bm.missing() == 1
    assert c.bm.schedule() == 0 and c.take_all() == {}
    c.register("w1", [b])
    assert c.bm.missing() == 0 and c.bm.under == set()
    assert c.stored_replicas(b) == ["w1"]


def test_freed_blocks_are_deleted_everywhere(c: Cluster) -> None:
    b1, b2 = c.write("/f", [["w1", "w2"], ["w3", "w4"]])
    c.kill("w4")
    c.bm.freed(c.ns.delete("/f"))
    assert b1 not in c.bm.locations and b2 not in c.bm.locations
    assert b1 not in c.bm.under and b2 not in c.bm.under and b2 not in c.bm.target
    assert all(b1 not in s and b2 not in s for s in c.bm.by_worker.values())
    assert c.take_all() == {"w1": [(DELETE, b1, [])], "w2": [(DELETE, b1, [])], "w3": [(DELETE, b2, [])]}
    # the dead worker's copy goes when it comes back and reports it
    c.register("w4", [b2])
    assert c.take("w4") == [(DELETE, b2, [])]
    assert c.bm.schedule() == 0


def test_overwrite_frees_the_old_blocks(c: Cluster) -> None:
    (old,) = c.write("/f", [["w1", "w2"]])
    (new,) = c.write("/f", [["w3", "w4"]])
    assert old not in c.bm.locations and c.bm.locations[new] == {"w3", "w4"}
    assert c.take_all() == {"w1": [(DELETE, old, [])], "w2": [(DELETE, old, [])]}


def test_target_capped_by_live_workers() -> None:
    c = Cluster(workers=2)
    (b,) = c.write("/f", [["w1"]], replication=3)
    assert c.bm.schedule() == 1
    assert c.take("w1") == [(REPLICATE, b, ["w2"])]
    c.bm.block_received("w2", b)
    # two copies on two workers: as good as it gets (not reported), but still tracked against 3
    assert c.bm.under == {b} and c.bm.under_replicated() == 0
    assert c.bm.schedule() == 0
    c.register("w3", [])
    assert c.bm.schedule() == 1
    ((kind, block, targets),) = [cmd for cmds in c.take_all().values() for cmd in cmds]
    assert (kind, block, targets) == (REPLICATE, b, ["w3"])


def test_draining_worker_is_a_source_never_a_target() -> None:
    c = Cluster(workers=3)
    (b,) = c.write("/f", [["w1", "w2"]])
    c.reg.register(info("w3", draining=True))
    c.kill("w2")
    assert c.bm.schedule() == 0  # the only other live worker is draining
    c.reg.register(info("w1", draining=True))
    c.register("w4", [])
    assert c.bm.schedule() == 1
    assert c.take("w1") == [(REPLICATE, b, ["w4"])]


def test_full_workers_are_not_targets() -> None:
    c = Cluster(workers=3)
    (b,) = c.write("/f", [["w1", "w2"]])
    c.reg.register(info("w3", free=10))  # block length is 100 bytes
    c.kill("w2")
    assert c.bm.schedule() == 0
    c.reg.register(info("w3", free=1000))
    assert c.bm.schedule() == 1
    assert c.take("w1") == [(REPLICATE, b, ["w3"])]


def test_restart_rebuilds_from_the_namespace(c: Cluster) -> None:
    b1, b2 = c.write("/f", [["w1", "w2"], ["w2", "w3"]])
    # a new master over the same metastore knows the blocks but trusts no replica yet
    bm = BlockManager(c.ns, c.reg, replication_timeout=30.0)
    assert bm.locations == {b1: {"w1", "w2"}, b2: {"w2", "w3"}}
    assert bm.target == {b1: 2, b2: 2}
    assert bm.under == {b1, b2}
    for wid, have in (("w1", [b1]), ("w2", [b1, b2]), ("w3", [b2])):
        bm.worker_registered(wid, have)
    assert bm.under == set()
    assert bm.schedule() == 0


def test_allocate_places_a_pipeline_and_rolls_back_when_nobody_has_room() -> None:
    c = Cluster(workers=3)
    node, _ = c.ns.create("/f", replication=2)
    loc = c.bm.allocate(node.id, 0, client_node="node-w2")
    assert loc.length == node.block_size and len(loc.replicas) == 2
    assert loc.replicas[0].worker_id == "w2"  # the writer's own node first
    assert c.ns.allocations.owner(loc.block_id) == node.id
    loc2 = c.bm.allocate(node.id, 10, client_node="", exclude=["w1", "w2"])
    assert [a.worker_id for a in loc2.replicas] == ["w3"] and loc2.length == 10
    with pytest.raises(E.InvalidArgument):
        c.bm.allocate(node.id, node.block_size + 1, client_node="")  # never more than a block (placement, quota)
    for wid in list(c.reg.workers):
        c.reg.register(info(wid, free=5))
    with pytest.raises(E.NoSpace):
        c.bm.allocate(node.id, 10, client_node="")
    assert len(c.ns.allocations) == 2  # the failed placements reserved nothing
    for wid in list(c.reg.workers):
        c.kill(wid)
    with pytest.raises(E.Unavailable):
        c.bm.allocate(node.id, 0, client_node="")
    with pytest.raises(E.NotFound):
        Cluster().bm.allocate(99999, 0, client_node="")


def bound_block(c: Cluster) -> int:
    """A bound file's one block (replication 2), as its first read makes it (not cached yet)."""
    bind = c.ns.bind("/b", "file:///nonexistent/store")
    c.ns.merge_listing(bind.inode, [("f", 100, "etag", 0.0)], [], now=0.0)
    (meta,) = c.ns.ufs_blocks(c.ns.resolve("/b/f").id)
    c.bm.tracked_ufs([meta])
    return meta.block_id


def test_a_copy_landing_after_an_eviction_is_deleted(c: Cluster) -> None:
    """A REPLICATE sent before ``pcache free`` (or an eviction) that lands after it must not make
    the block cached again with one stray copy: only a fetch brings an evicted block back."""
    b = bound_block(c)
    c.bm.fetched("w1", b, 100, 0x1234)
    assert c.bm.locations[b] == {"w1"} and c.bm.evictable() == 1 and b in c.bm.under
    assert c.bm.under_replicated() == 0  # one cached copy of two: the store has it, nothing at risk
    assert c.bm.schedule() == 1
    ((kind, block, targets),) = c.take("w1")
    assert (kind, block) == (REPLICATE, b)
    assert c.bm.evict_block(b) == 100
    assert c.take("w1") == [(DELETE, b, [])] and c.bm.locations[b] == set()
    c.bm.block_received(targets[0], b)  # the copy lands late
    assert c.take(targets[0]) == [(DELETE, b, [])]
    assert c.bm.locations[b] == set() and c.bm.evictable() == 0 and b not in c.bm.inflight
    # a later read fetches it again, and it is cached (and evictable) as before
    c.bm.fetched("w2", b, 100, 0x1234)
    assert c.bm.locations[b] == {"w2"} and c.bm.evictable() == 1


def test_a_fetch_that_disagrees_with_the_first_copy_is_dropped(c: Cluster) -> None:
    b = bound_block(c)
    c.bm.fetched("w1", b, 100, 0x1234)
    c.bm.fetched("w2", b, 100, 0x9999)  # another CRC: the object changed under an open file
    assert c.take("w2") == [(DELETE, b, [])] and c.bm.locations[b] == {"w1"}
    c.bm.fetched("w3", b, 99, 0x1234)  # short
    assert c.take("w3") == [(DELETE, b, [])] and c.bm.locations[b] == {"w1"}
