"""Master leader election on a real etcd: one leader at a time, epochs that only grow, a leader
that steps down before its lease can go to another (SIGSTOP, etcd stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pcache.common import errors as E
from pcache.common.errors import Unavailable
from pcache.master.election import MARGIN, Election, Leader, endpoint_text, etcd_target
from pcache.testing.etcd import Etcd, start_etcd, start_etcd_cluster
from tests.conftest import REQUIRES_ETCD

pytestmark = REQUIRES_ETCD

TTL = 3.0


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    server = start_etcd(tmp_path / "etcd")
    yield server
    server.stop()


def test_one_leader_at_a_time_and_epochs_grow(etcd: Etcd) -> None:
    async def scenario() -> None:
        a = Election(etcd.endpoint, "c1", "10.0.0.1:19600", ttl=TTL)
        b = Election(etcd.endpoint, "c1", "10.0.0.2:19600", ttl=TTL)
        other = Election(etcd.endpoint, "c2", "10.0.0.3:19600", ttl=TTL)  # another cluster: its own key
        try:
            first = await a.campaign()
            assert a.is_leader() and (await b.leader()).address == "10.0.0.1:19600"
            assert (await b.leader()).epoch == first
            waiting = asyncio.ensure_future(b.campaign(poll=0.1))
            await asyncio.sleep(TTL + 1)  # a keeps its lease alive: b must not win meanwhile
            assert not waiting.done() and a.is_leader() and not b.is_leader()
            assert await other.campaign() > first  # no interference across clusters
            await a.resign()
            assert not a.is_leader()
            second = await asyncio.wait_for(waiting, 5)
            assert second > first and b.is_leader()
            assert (await a.leader()).address == "10.0.0.2:19600"
        finally:
            for e in (a, b, other):
                await e.close()

    asyncio.run(scenario())


def test_a_leader_cut_off_from_etcd_steps_down_before_its_lease_expires(etcd: Etcd) -> None:
    async def scenario() -> None:
        a = Election(etcd.endpoint, "c1", "a:1", ttl=TTL, timeout=0.5)
        try:
            await a.campaign()
            os.kill(etcd.proc.pid, signal.SIGSTOP)  # etcd unreachable: keep-alives fail
            stopped = time.monotonic()
            while a.is_leader():
                await asyncio.sleep(0.02)
            # stepped down within one lease, at least MARGIN before etcd could hand the key on
            assert time.monotonic() - stopped <= TTL - MARGIN + 0.2
            with pytest.raises(Unavailable):
                await a.leader()
        finally:
            os.kill(etcd.proc.pid, signal.SIGCONT)
            await a.close()

    asyncio.run(scenario())


def _campaigner(etcd: Etcd, address: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pcache.master.election", etcd.endpoint, "c1", address, str(TTL)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def _event(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the campaigner exited"
    return json.loads(line)


def test_a_sigstopped_leader_is_replaced_and_knows_it_when_it_resumes(etcd: Etcd) -> None:
    a = _campaigner(etcd, "a:1")
    b = None
    try:
        first = _event(a)
        assert first["event"] == "leader"
        b = _campaigner(etcd, "b:2")
        time.sleep(0.5)
        a.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        second = _event(b)
        took = time.monotonic() - stopped
        assert second["event"] == "leader" and second["epoch"] > first["epoch"]
        assert TTL - 1 <= took <= TTL + 3, took  # only once a's lease expired, and soon after
        a.send_signal(signal.SIGCONT)
        assert _event(a) == {"event": "lost", "address": "a:1", "epoch": first["epoch"]}  # fenced
    finally:
        for p in (a, b):
            if p is not None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(10)


@pytest.mark.slow
def test_a_candidate_leads_within_seconds_of_etcd_coming_back_after_a_long_outage(
    etcd: Etcd, caplog: pytest.LogCaptureFixture
) -> None:
    """gRPC's reconnect backoff grows towards two minutes: after etcd was down 90 s the masters
    found it back 17 s later (26 s to the first mutation), and nobody could lead meanwhile."""
    port = int(etcd.endpoint.rsplit(":", 1)[1])

    async def scenario() -> float:
        a = Election(etcd.endpoint, "c1", "a:1", ttl=TTL, timeout=0.5)
        try:
            os.kill(etcd.proc.pid, signal.SIGKILL)
            etcd.proc.wait()
            waiting = asyncio.ensure_future(a.campaign(poll=0.1))
            # a default channel tries next at ~43 s (backoff 1 s × 1.6ⁿ): without the options this fails
            await asyncio.sleep(30)
            assert not waiting.done()
            server = await asyncio.to_thread(start_etcd, etcd.data_dir, client_port=port)
            etcd.proc = server.proc  # the fixture stops this one
            back = time.monotonic()
            await asyncio.wait_for(waiting, 30)
            return time.monotonic() - back
        finally:
            await a.close()

    with caplog.at_level("WARNING", logger="pcache.master.election"):
        took = asyncio.run(scenario())
    assert took < 5.0, f"led {took:.1f} s after etcd was back"
    lines = [r.getMessage() for r in caplog.records]
    assert 2 <= len(lines) <= 8, lines  # the outage: once, every 10 s, and its end; not every try
    assert "answers again" in lines[-2] or "answers again" in lines[-1]


def test_a_master_out_of_sync_with_the_last_term_says_why_it_may_not_take_over(
    etcd: Etcd, caplog: pytest.LogCaptureFixture
) -> None:
    """With the last leader gone and the other master out of sync, nobody may lead: `pcache
    status` said "an election is under way" for ever and no master logged why."""
    from pcache.master.ha import HAControl

    async def scenario() -> None:
        a = HAControl(etcd.endpoint, "c9", "ma", "a:1", ttl=TTL)
        b = HAControl(etcd.endpoint, "c9", "mb", "b:1", ttl=TTL)
        try:
            await a.election.campaign(guard=a.guard)  # a's term; b never got in sync with it
            assert a.may_not_lead == ""
            await a.election.resign()
            assert await b.election.leader() is None
            b.election.seen_leader = ""  # as its campaign saw it: nobody leads
            for _ in range(3):
                assert await b.guard() is None
            assert "not in sync with the last leader's term (master ma" in b.may_not_lead
        finally:
            await a.close()
            await b.close()

    with caplog.at_level("WARNING", logger="pcache.master.ha"):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "may not take over" in r.getMessage()]
    assert len(said) == 1 and "no master leads" in said[0], said  # once, not at every look


def test_depose_ends_only_the_named_term_and_the_deposed_leader_can_set_no_flag(etcd: Etcd) -> None:
    """A follower that found its leader's process gone revokes that term's lease: nothing else
    (another term, another address) is touched; the deposed leader's etcd transactions fail at
    once, before its keep-alive even tells it; another master wins at once."""
    from pcache.master.ha import HAControl

    async def scenario() -> None:
        a = HAControl(etcd.endpoint, "c1", "ma", "10.0.0.1:19600", ttl=TTL)
        b = HAControl(etcd.endpoint, "c1", "mb", "10.0.0.2:19600", ttl=TTL)
        try:
            first = await a.election.campaign()
            assert await a.set_in_sync("mb")  # the leader's flag transaction works while it leads
            assert not await b.depose(first + 1, "10.0.0.1:19600")  # another term
            assert not await b.depose(first, "10.0.0.9:19600")  # another address
            assert (await b.election.leader()) == (await a.election.leader()) and a.election.is_leader()
            assert await b.depose(first, "10.0.0.1:19600")
            assert await b.election.leader() is None
            assert not await a.set_in_sync("mb")  # its lone-leader and flag transactions need its key
            t0 = time.monotonic()
            second = await asyncio.wait_for(b.election.campaign(poll=0.1), 5)
            assert second > first and time.monotonic() - t0 < 2.0  # no lease to wait out
            assert not await b.depose(first, "10.0.0.1:19600")  # the key is b's now: never touched
            assert b.election.is_leader()
            deadline = time.monotonic() + TTL
            while a.election.is_leader() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not a.election.is_leader()  # its next keep-alive found the lease gone
        finally:
            for ha in (a, b):
                await ha.close()

    asyncio.run(scenario())


def test_only_refused_connections_make_an_address_gone() -> None:
    import socket

    from pcache.master.ha import refuses_connections

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        assert asyncio.run(refuses_connections(f"127.0.0.1:{closed_port}"))
        assert not asyncio.run(refuses_connections(f"127.0.0.1:{listening.getsockname()[1]}"))
        assert not asyncio.run(refuses_connections("no-such-host.invalid:19600", probes=3))  # unknown: not gone
        assert not asyncio.run(refuses_connections("not-an-address"))
    finally:
        listening.close()


def test_a_leader_keeps_its_lease_through_any_member_of_the_etcd_it_lists(tmp_path: Path) -> None:
    """``[master] etcd`` lists three members: the one the masters dialled is killed, the quorum goes
    on, and so does the leader (its keep-alives reach another member); only the first address was
    used before, and a leader lost its lease to one member's death."""
    members = start_etcd_cluster([tmp_path / f"etcd{i}" for i in range(3)])
    endpoints = ",".join(m.endpoint for m in members)
    try:

        async def scenario() -> None:
            a = Election(endpoints, "c1", "a:1", ttl=TTL, timeout=1.0)
            b = Election(endpoints, "c1", "b:1", ttl=TTL, timeout=1.0)
            try:
                epoch = await asyncio.wait_for(a.campaign(), 30)  # the cluster elects its own leader first
                assert a.endpoint == endpoints
                waiting = asyncio.ensure_future(b.campaign(poll=0.1))
                members[0].proc.kill()  # the member gRPC's pick_first dialled: the first listed
                members[0].proc.wait()
                until = time.monotonic() + 3 * TTL
                while time.monotonic() < until:  # led throughout: no gap a keep-alive missed
                    assert a.is_leader() and a.epoch == epoch and not waiting.done()
                    await asyncio.sleep(0.05)
                assert await a.leader() == Leader("a:1", epoch)
                await a.resign()
                assert await asyncio.wait_for(waiting, 10) > epoch  # b too reaches the quorum left
            finally:
                for e in (a, b):
                    await e.close()

        asyncio.run(scenario())
    finally:
        for m in members:
            m.stop()


def test_an_etcd_endpoint_list_is_checked_and_resolved_into_one_grpc_target() -> None:
    assert etcd_target("127.0.0.1:2379") == "127.0.0.1:2379"  # one name: gRPC resolves it at each reconnect
    assert etcd_target("etcd.example.invalid:2379") == "etcd.example.invalid:2379"
    assert etcd_target("http://127.0.0.1:1/, localhost:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert etcd_target("[::1]:1,[::1]:2") == "ipv6:[::1]:1,[::1]:2"
    assert (
        etcd_target("127.0.0.1:1,gone.invalid:2,127.0.0.1:3") == "ipv4:127.0.0.1:1,127.0.0.1:3"
    )  # a quorum may be left
    assert endpoint_text("http://10.0.0.1:2379, [::1]:2379") == "10.0.0.1:2379,[::1]:2379"
    for bad, why in (
        ("", "HOST:PORT"), ("10.0.0.1", "HOST:PORT"), ("10.0.0.1:2379,", "HOST:PORT"), ("a:70000", "HOST:PORT"),
        ("a:1;b:1", "HOST:PORT"), ("[zz]:1", "HOST:PORT"), ("::1:2379", "HOST:PORT"),
        ("a.invalid:1,b.invalid:2", "no etcd member resolves: a.invalid:1"), ("127.0.0.1:1,[::1]:2", "no address family in common"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            etcd_target(bad)


def test_etcd_restored_from_an_older_snapshot_halts_every_campaign_until_an_operator_recovers(etcd: Etcd) -> None:
    """etcd restored from a snapshot older than the cluster's newest term (its record names an
    older last term, its revision went back): the master holding the newer term halts every
    campaign and reports; a plan recovering from a master holding less needs --force; the
    recovery makes the master with the newest log lead with an epoch above every term, and a
    second master is not eligible (it was never in sync with the recovered term)."""
    from pcache.master.ha import RECOVERY_MARGIN, HAControl, recover

    async def scenario() -> None:
        a = HAControl(etcd.endpoint, "c7", "ma", "a:1", ttl=TTL)
        b = HAControl(etcd.endpoint, "c7", "mb", "b:1", ttl=TTL)
        try:
            old = await a.election.campaign(guard=a.guard)  # the term the snapshot recorded
            await a.election.resign()
            a.holds = lambda: (old, 40)
            b.holds = lambda: (old + 500, 90)  # terms etcd's restored data never saw
            assert await b.guard() is None
            assert f"master mb holds term {old + 500} (log index 90) but etcd's last term is {old}" in b.may_not_lead
            assert await a.guard() is None  # the last leader of etcd's record may not lead either
            assert "etcd lost the cluster's record" in a.may_not_lead
            plan = await recover(etcd.endpoint, "c7")
            assert not plan.applied and plan.chosen.member == "mb" and plan.halted
            assert [(r.member, r.term, r.index) for r in plan.reports] == [("mb", old + 500, 90), ("ma", old, 40)]
            with pytest.raises(E.InvalidArgument, match="holds term .* less than master mb"):
                await recover(etcd.endpoint, "c7", member="ma")
            with pytest.raises(E.InvalidArgument, match="master mz has not reported"):
                await recover(etcd.endpoint, "c7", member="mz")
            assert await a.guard() is None  # a plan writes nothing
            done = await recover(etcd.endpoint, "c7", apply=True)
            assert done.base == old + 500 + RECOVERY_MARGIN
            assert await a.guard() is None and "not in sync" in a.may_not_lead
            epoch = await asyncio.wait_for(b.election.campaign(guard=b.guard), 5)
            assert epoch > old + 500 + RECOVERY_MARGIN and b.may_not_lead == ""
            assert (await a.election.leader()) is not None
            with pytest.raises(E.InvalidArgument, match="leads cluster 'c7': nothing to recover"):
                await recover(etcd.endpoint, "c7", apply=True)
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_recover_refuses_what_no_master_wrote_and_halts_a_pair_whose_chosen_master_never_came_back(
    etcd: Etcd,
) -> None:
    """From the side of someone with etcd write access, and of an operator whose recovery chose a
    master that never came back: a forged report (huge term, wrong types, a key that is not
    text) is refused by name, never used; a corrupt epoch base stops every campaign with a reason
    instead of a crash loop, and a recovery sets it again; with no leader and no halt, the plan
    refuses and --yes halts the running masters, takes their fresh reports and recovers."""
    from pcache.master.ha import MAX_TERM, RECOVERY_MARGIN, HAControl, recover

    async def scenario() -> None:
        a = HAControl(etcd.endpoint, "c8", "ma", "a:1", ttl=TTL)
        b = HAControl(etcd.endpoint, "c8", "mb", "b:1", ttl=TTL)
        client = a.client
        looking = True

        async def campaigns() -> None:  # both masters look at etcd as their campaigns do
            while looking:
                for ha in (a, b):
                    with contextlib.suppress(Unavailable):
                        await ha.guard()
                await asyncio.sleep(0.1)

        try:
            a.start()
            b.start()
            a.holds, b.holds = (lambda: (0, 0)), (lambda: (0, 0))
            with pytest.raises(E.InvalidArgument, match="etcd endpoint|HOST:PORT"):
                await recover("not an endpoint", "c8")
            await client.put(b"/pcache/c8/base", b"abc")
            assert await b.guard() is None and "holds 'abc', not an epoch base" in b.may_not_lead
            await client.put(b"/pcache/c8/halted", b"forged")
            for forged in (
                json.dumps({"address": "x:1", "term": MAX_TERM * 4, "index": 1}).encode(),
                json.dumps({"address": ["x"], "term": 1, "index": 1}).encode(),
                json.dumps({"address": "x:1", "term": True, "index": 1}).encode(),
                b"\xff\xfe",
            ):
                await client.put(b"/pcache/c8/reports/zz", forged)
                with pytest.raises(E.InvalidArgument, match="not a report a master wrote"):
                    await recover(etcd.endpoint, "c8")
            await client.put(b"/pcache/c8/reports/\xff\xfe", b"{}")
            with pytest.raises(E.InvalidArgument, match="not a report a master wrote"):
                await recover(etcd.endpoint, "c8")
            await client.delete_prefix(b"/pcache/c8/reports/")
            await client.delete(b"/pcache/c8/halted")
            with pytest.raises(E.InvalidArgument, match="none found etcd's record lost"):
                await recover(etcd.endpoint, "c8")  # a plan on a pair that did not halt writes nothing
            assert await client.get(b"/pcache/c8/halted") is None
            with pytest.raises(E.InvalidArgument, match="no master of cluster 'nosuch' runs"):
                await recover(etcd.endpoint, "nosuch", apply=True)  # a misspelt cluster is never halted
            assert await client.get(b"/pcache/nosuch/halted") is None
            a.holds, b.holds = (lambda: (70, 12)), (lambda: (70, 15))
            task = asyncio.ensure_future(campaigns())
            done = await recover(etcd.endpoint, "c8", apply=True, report_wait=8)
            assert done.chosen.member == "mb" and {r.member for r in done.reports} == {"ma", "mb"}
            assert done.halted.startswith("an operator ran pcache ha recover")
            assert (await client.get(b"/pcache/c8/base")).value == str(70 + RECOVERY_MARGIN).encode()
            looking = False
            await task
            try:  # no master looking at etcd during the recovery halted the pair again
                epoch = await asyncio.wait_for(b.election.campaign(guard=b.guard), 5)
            except TimeoutError:
                raise AssertionError(f"mb did not lead after the recovery: {b.may_not_lead}") from None
            assert epoch > 70 + RECOVERY_MARGIN
        finally:
            looking = False
            await a.close()
            await b.close()

    asyncio.run(scenario())
