"""A master's part in high availability, kept in etcd: membership, eligibility, in-sync flags
(Ling report §2.3.1; ``../shared/DESIGN.md``, "Leader/follower").

Keys, under ``/pcache/<cluster>/``::

    leader              address of the leader, under its lease (:mod:`.election`); the key's
                        creation revision is the epoch
    last                member id of the newest leader, written in the same transaction that
                        won the term, so its mod revision is that term's epoch
    members/<member>    address of each running master, under the master's own lease
    insync/<member>     "<epoch>": this follower holds every mutation the leader of <epoch>
                        acknowledged; written and removed only by that leader, in transactions
                        that check it still holds the leader key
    base                the epoch base (absent: 0), added to etcd's revision of each term; set
                        by ``pcache ha recover`` only
    halted              present while the cluster's record in etcd is lost: no master may lead
    reports/<member>    what each master holds (its newest term and log index) when it found
                        the record lost; ``pcache ha recover`` chooses from them

A follower whose leader's replication stream closes, and whose leader's address then refuses
connections (the process is gone, its host is up: a crash, an OOM kill, ``kill -9``), revokes
that leader's lease at once (:meth:`HAControl.depose`) instead of waiting up to ``ttl`` seconds
for etcd to expire it: a failover of well under a second where the lease alone takes ``ttl``. A
leader that is alive accepts connections, even SIGSTOPped (its kernel completes the handshake):
only the lease decides then. As with a lease run out, the deposed term can acknowledge nothing
more: its follower refuses its entries and its lone-leader transaction needs the revoked key. (HDFS's
ZKFC likewise gives up the active lock at once when its health monitor finds the NameNode down,
rather than leaving it to the ZooKeeper session timeout.)

A master may take over only when it holds every acknowledged mutation: it was the newest leader
itself (``last`` is its id), or ``insync/<it>`` names the newest term (``last``'s mod revision),
or the cluster never had a leader. A last leader that has just restarted lets an in-sync follower
go first (for ``2 * ttl``): the follower may hold acknowledged entries its disk lost. The check
and the win are one etcd transaction, so a
follower marked out of sync a moment before can never win. The member id is kept in the
master's data directory: a master restarted from an empty directory is a new member and can
never be taken for an in-sync one.

**etcd's record lost.** Those rules stand on etcd's record of the last term. Each master also
keeps the newest term it holds entries of in its own metastore (``chaterm``, replicated). When etcd
says the cluster never had a leader while a master holds a term, or names a last term older than
one a master holds, etcd's data was emptied or restored from an older snapshot: the last leader
and the in-sync flags are unknown, and etcd's revision (the epochs' source) went back, so a new
leader's epoch would be lower than the one every worker, follower and client holds, and they would
refuse it. That master then writes ``halted`` (which every campaign's transaction checks) and its
report, and no master leads until an operator runs ``pcache ha recover`` (:func:`recover`): it
makes the master that holds the newest log the last leader and sets the epoch base above every
reported term. Choosing which master holds the acknowledged mutations is the operator's call, as
with HDFS's ``-recover`` and etcd's own ``--force-new-cluster``; the masters never guess it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aetcd
from aetcd.utils import prefix_range_end

from pcache.common.errors import InvalidArgument, Unavailable
from pcache.master.election import ETCD_ERRORS, Election, OutageLog, etcd_client, etcd_error
from pcache.master.replication import SyncFlags

logger = logging.getLogger(__name__)


PROBE_TIMEOUT = 0.5  # seconds one connection to a leader that may be gone is waited for
# connections tried at most, PROBE_GAP apart: a loaded host takes its time to close a killed
# process's sockets
PROBES = 10
REFUSALS = 2  # refusals in a row that make a leader gone
PROBE_GAP = 0.15  # seconds
# added to the newest reported term to make the epoch base at a recovery: room for a term that no
# surviving master holds (a leader that won and died before any follower took its first entry)
RECOVERY_MARGIN = 1_000_000
# epochs travel as uint64 and are packed as ">Q": reported terms stay below MAX_TERM, epoch bases
# (a term plus the margin) below MAX_BASE, and a base plus etcd's revision far below 2^64
MAX_TERM = 1 << 61
MAX_BASE = 1 << 62
REPORT_WAIT = 10.0  # seconds ``pcache ha recover`` waits for the running masters' reports after halting


async def refuses_connections(address: str, *, probes: int = PROBES, refusals: int = REFUSALS) -> bool:
    """Whether ``host:port`` refused ``refusals`` TCP connections in a row, of at most ``probes``
    tried ``PROBE_GAP`` seconds apart.

    Only refusals say that nothing listens. Anything else resets the count and the probing goes
    on: an accepted connection proves little by itself (a killed process's kernel closes its
    sockets one by one: a follower saw the stream's end, then one more accepted connection, then
    refusals), and a timeout (``PROBE_TIMEOUT`` s) or another error (an unreachable host, a name
    that does not resolve) may be this host's own load (a follower starved on a busy CI host
    timed its first probe out and gave up, and the failover waited for the lease).
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    refused = 0
    for n in range(probes):
        if n:
            await asyncio.sleep(PROBE_GAP)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except ConnectionRefusedError:
            refused += 1
            if refused >= refusals:
                return True
            continue
        except (OSError, TimeoutError):
            refused = 0
            continue
        refused = 0
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return False


def member_id(data_dir: str) -> str:
    """This master's member id, made once and kept in ``data_dir/member-id``."""
    path = os.path.join(data_dir, "member-id")
    with contextlib.suppress(FileNotFoundError):
        with open(path) as f:
            known = f.read().strip()
        if known:
            return known
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    made = uuid.uuid4().hex[:12]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(made + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return made


class HAControl(SyncFlags):
    """Membership, eligibility and in-sync flags of one master of ``cluster`` in etcd.

    ``endpoint`` is etcd's ``HOST:PORT``; ``ttl`` (seconds) is the leader lease (and the member
    lease); every etcd call has ``timeout`` seconds.
    """

    def __init__(
        self, endpoint: str, cluster: str, member: str, address: str, *, ttl: float, timeout: float = 2.0
    ) -> None:
        self.election = Election(endpoint, cluster, address, ttl=ttl, timeout=timeout)
        self.cluster = cluster
        self.member = member
        self.address = address
        self.timeout = timeout
        self.prefix = f"/pcache/{cluster}/"
        self._member_task: asyncio.Task | None = None
        self._member_outage = OutageLog(f"master {member}'s member key")
        self.may_not_lead = ""  # why this master may not take over, at its campaign's last look
        self._said_may_not = 0.0
        self.members_outage = OutageLog("the masters' list in etcd")  # the leader's looks at it
        self._started = time.monotonic()
        # (newest term, log index) this master holds: its metastore's, set by the server
        self.holds: Callable[[], tuple[int, int]] = lambda: (0, 0)
        self._reported: tuple[str, str] = ("", "")  # the halt and report this master last reported (see _report)

    @property
    def client(self) -> aetcd.Client:
        return self.election.client

    def _key(self, *parts: str) -> bytes:
        return (self.prefix + "/".join(parts)).encode()

    async def _etcd(self, coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, self.timeout)
        except ETCD_ERRORS as exc:
            raise Unavailable(f"etcd at {self.election.endpoint}: {etcd_error(exc)}") from exc

    # ------------------------------------------------------- membership --

    async def _in_sync_peer(self, epoch: int) -> bool:
        """Whether another running master is in sync with the term ``epoch``."""
        flags = await self._etcd(self.client.get_prefix(self._key("insync", "")))
        members = await self.members()
        prefix = self._key("insync", "")
        return any(
            kv.value.decode() == str(epoch) and kv.key[len(prefix) :].decode() in members
            and kv.key[len(prefix) :].decode() != self.member
            for kv in flags
        )  # fmt: skip

    def start(self) -> None:
        """Keep this master's ``members/`` key alive in the background."""
        self._started = time.monotonic()
        self._member_task = asyncio.ensure_future(self._keep_member())

    async def _keep_member(self) -> None:
        key = self._key("members", self.member)
        while True:
            try:
                lease = await self._etcd(self.client.lease(max(2, int(round(self.election.ttl)))))
                await self._etcd(self.client.put(key, self.address.encode(), lease=lease))
                self._member_outage.answered()
                while True:
                    await asyncio.sleep(self.election.ttl / 4)
                    reply = await self._etcd(lease.refresh())
                    if reply is None or reply.TTL <= 0:
                        break  # expired: register again
            except Unavailable as exc:
                self._member_outage.failed(exc)
                await asyncio.sleep(self.election.ttl / 4)

    async def members(self) -> dict[str, str]:
        """Running masters: member id -> address (this one included).

        Raises:
            Unavailable: etcd does not answer.
        """
        prefix = self._key("members", "")
        found = await self._etcd(self.client.get_prefix(prefix))
        return {kv.key[len(prefix) :].decode(): kv.value.decode() for kv in found}

    async def close(self) -> None:
        """Resign, drop the member key, close the connection."""
        if self._member_task is not None:
            self._member_task.cancel()
        with contextlib.suppress(Unavailable):
            await self._etcd(self.client.delete(self._key("members", self.member)))
        await self.election.close()

    async def depose(self, epoch: int, address: str) -> bool:
        """End the term ``epoch`` of the leader at ``address`` now: revoke the lease its leader key
        is held under (see the module docstring: only for a leader whose process is gone).

        Returns whether a lease was revoked: False when the key is gone already or names another
        term or address (a newer leader is never touched).

        Raises:
            Unavailable: etcd does not answer (the revocation may or may not have happened).
        """
        held = await self._etcd(self.client.get(self.election.key))
        base = await self._base()
        if held is None or held.create_revision + base != epoch or held.value.decode() != address or not held.lease:
            return False
        try:
            await self._etcd(self.client.revoke_lease(held.lease))
        except Unavailable as exc:
            if "not found" in str(exc).lower():
                return False  # it expired meanwhile
            raise
        return True

    # ------------------------------------------------------ eligibility --

    async def _base(self) -> int:
        """The cluster's epoch base (0 until a recovery).

        Raises:
            Unavailable: etcd does not answer. InvalidArgument: the key holds no valid base.
        """
        got = await self._etcd(self.client.get(self._key("base")))
        return parse_base(got.value if got is not None else None, self.prefix)

    async def guard(self) -> tuple[list[Any], list[Any]] | None:
        """The campaign condition (see the module docstring); None when this master may not lead."""
        tx = self.client.transactions
        last_key, base_key, halted_key = self._key("last"), self._key("base"), self._key("halted")
        # what this master holds, looked at before etcd is: a term it holds won in etcd first, so
        # the (linearizable) reads below see it, unless etcd's data went back
        term, index = self.holds()
        # one transaction: a view of the three keys at one revision (a recovery between separate
        # reads showed a master the new `halted` gone but the old `last`, and it halted again)
        _, got = await self._etcd(
            self.client.transaction(
                compare=[], success=[tx.get(last_key), tx.get(base_key), tx.get(halted_key)], failure=[]
            )
        )
        last, base_kv, halted = (found[0][1] if found else None for found in got)
        if halted is not None:
            why = halted.value.decode(errors="replace")
            await self._report(term, index, why)
            self._may_not(self._halted(why))
            return None
        try:
            base = parse_base(base_kv.value if base_kv is not None else None, self.prefix)
        except InvalidArgument as exc:
            self._may_not(f"{exc}: `pcache ha recover --yes` sets it again")
            return None
        self.election.base = base
        etcd_term = last.mod_revision + base if last is not None else 0
        if term > etcd_term:
            seen = [
                unchanged(tx, last_key, last),
                unchanged(tx, base_key, base_kv),
            ]
            await self._halt(term, index, etcd_term, seen)
            return None
        fenced = [unchanged(tx, base_key, base_kv), tx.version(halted_key) == 0]
        win = [tx.put(last_key, self.member.encode())]
        if last is None:
            return self._may([tx.version(last_key) == 0, *fenced], win)
        compare = [tx.mod(last_key) == last.mod_revision, *fenced]
        last_term = last.mod_revision + base
        if last.value.decode() == self.member:
            if time.monotonic() - self._started < 2 * self.election.ttl and await self._in_sync_peer(last_term):
                # just restarted: a follower in sync with our last term holds all we acknowledged,
                # perhaps more than our own disk kept (a power loss without sync_writes): it goes first
                self._may_not("just restarted: a follower in sync with its last term takes over first")
                return None
            return self._may(compare, win)
        flag_key = self._key("insync", self.member)
        flag = await self._etcd(self.client.get(flag_key))
        if flag is None or flag.value.decode() != str(last_term):
            self._may_not(
                f"not in sync with the last leader's term (master {last.value.decode()}, term {last_term}):"
                " only a master that holds every change it acknowledged may take over; start that master again"
                " (its data directory holds them)"
            )
            return None
        return self._may([*compare, tx.value(flag_key) == str(last_term).encode()], win)

    async def _halt(self, term: int, index: int, etcd_term: int, seen: list[Any]) -> None:
        """etcd's record is older than this master's: stop every campaign (``halted``) and report;
        ``seen``: compares that hold while etcd's record is the one this master looked at."""
        tx = self.client.transactions
        found = f"etcd's last term is {etcd_term}" if etcd_term else "etcd has no record of any leader"
        why = (
            f"master {self.member} holds term {term} (log index {index}) but {found}: etcd's data was emptied or"
            " restored from an older snapshot"
        )
        ok, _ = await self._etcd(
            self.client.transaction(
                compare=[tx.version(self._key("halted")) == 0, *seen],
                success=[tx.put(self._key("halted"), why.encode())],
                failure=[],
            )
        )
        if not ok:
            return  # another master halted it first, or a recovery changed the record: looked at again next time
        self.may_not_lead, self._said_may_not = self._halted(why), time.monotonic()
        logger.error("%s", self.may_not_lead)
        await self._report(term, index, why)

    def _halted(self, why: str) -> str:
        return (
            f"etcd lost the cluster's record ({why}): no master leads until an operator runs"
            f" `pcache ha recover --etcd {self.election.endpoint} --cluster {self.cluster}`"
        )

    async def _report(self, term: int, index: int, halt: str) -> None:
        """Record what this master holds for ``pcache ha recover``, once per halt (``halt``: its
        ``halted`` value) and change."""
        report = json.dumps({"address": self.address, "term": term, "index": index}, sort_keys=True)
        if (halt, report) != self._reported:
            await self._etcd(self.client.put(self._key("reports", self.member), report.encode()))
            self._reported = (halt, report)

    def _may(self, compare: list[Any], success: list[Any]) -> tuple[list[Any], list[Any]]:
        self.may_not_lead = ""
        return compare, success

    def _may_not(self, why: str) -> None:
        """Record (and log, when it changes or once a minute while nobody leads) why not."""
        now = time.monotonic()
        nobody = self.election.seen_leader == ""
        if why != self.may_not_lead or (nobody and now - self._said_may_not > 60.0):
            self._said_may_not = now
            log = logger.warning if nobody else logger.info
            log("master %s may not take over%s: %s", self.member, " and no master leads" if nobody else "", why)
        self.may_not_lead = why

    # --------------------------------------------------------- in sync --

    async def _flag(self, member: str, *, set_it: bool) -> bool:
        tx = self.client.transactions
        epoch, revision = self.election.epoch, self.election.revision
        if not self.election.is_leader():
            return False
        flag_key = self._key("insync", member)
        op = tx.put(flag_key, str(epoch).encode()) if set_it else tx.delete(flag_key)
        try:
            ok, _ = await self._etcd(
                self.client.transaction(compare=[tx.create(self.election.key) == revision], success=[op], failure=[])
            )
        except Unavailable as exc:
            logger.warning("in-sync flag of %s not %s: %s", member, "set" if set_it else "cleared", exc)
            return False
        return bool(ok)

    async def set_in_sync(self, member: str) -> bool:
        return await self._flag(member, set_it=True)

    async def clear_in_sync(self, member: str) -> bool:
        return await self._flag(member, set_it=False)


# ----------------------------------------------------------------- recovery --


@dataclass(frozen=True)
class Report:
    """What one master held when it found etcd's record of its cluster lost."""

    member: str
    address: str
    term: int  # the newest term it holds entries of (an epoch)
    index: int  # its last log index

    @property
    def position(self) -> tuple[int, int]:
        return self.term, self.index


@dataclass(frozen=True)
class Recovery:
    """``pcache ha recover``'s plan: the master to lead next, the new epoch base, every report."""

    chosen: Report
    base: int
    reports: list[Report]
    running: set[str]  # members whose etcd member key is alive now
    halted: str  # why the cluster halted
    applied: bool
    newest: Report  # the report with the newest log (``chosen`` unless --member --force chose less)


async def recover(
    endpoint: str, cluster: str, *, member: str | None = None, force: bool = False, apply: bool = False,
    timeout: float = 5.0, report_wait: float = REPORT_WAIT,
) -> Recovery:  # fmt: skip
    """Restore etcd's record of ``cluster`` after etcd lost it (see the module docstring).

    Makes ``member`` (default: the reporting master with the newest ``(term, index)``; on a tie
    the last leader etcd names) the last leader, sets the epoch base to the newest reported term
    plus :data:`RECOVERY_MARGIN` (so every new epoch is higher than any the workers, followers and
    clients hold), and clears the in-sync flags, ``halted`` and the reports, in one transaction
    that requires that no master leads and that ``halted`` is the one the reports answered.

    When the masters have not halted (no master leads, e.g. the master a recovery chose never came
    back), ``apply`` halts them first (every election stops), drops the reports of earlier halts
    and waits up to ``report_wait`` seconds for every running master's report. Nothing is written
    unless ``apply``.

    Raises:
        InvalidArgument: a master leads; a malformed ``endpoint``; the masters have not halted and
            ``apply`` is not given; no master reported; ``member`` did not report, or holds less
            than another report and ``force`` is not given; a key of the cluster holds what no
            master wrote.
        Unavailable: etcd does not answer, or the cluster's keys changed during the recovery.
    """
    try:
        client = etcd_client(endpoint, timeout)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc
    prefix = f"/pcache/{cluster}/"

    async def etcd(coro: Any) -> Any:
        try:
            return await asyncio.wait_for(coro, timeout)
        except ETCD_ERRORS as exc:
            raise Unavailable(f"etcd at {endpoint}: {etcd_error(exc)}") from exc

    def key(name: str) -> bytes:
        return (prefix + name).encode()

    def under(name: str) -> tuple[bytes, bytes]:
        return key(name), prefix_range_end(key(name))

    async def members() -> set[str]:
        return {
            kv.key[len(key("members/")) :].decode(errors="replace")
            for kv in await etcd(client.get_prefix(key("members/")))
        }

    async def reports() -> list[Report]:
        return [_parse_report(kv, prefix + "reports/") for kv in await etcd(client.get_prefix(key("reports/")))]

    tx = client.transactions
    try:
        leader = await etcd(client.get(key("leader")))
        if leader is not None:
            raise InvalidArgument(
                f"master {leader.value.decode(errors='replace')} leads cluster {cluster!r}: nothing to recover"
            )
        halted = await etcd(client.get(key("halted")))
        if halted is None:
            if not apply:
                raise InvalidArgument(
                    f"no master of cluster {cluster!r} leads, and none found etcd's record lost (an election may be"
                    " under way: see pcache status); --yes stops every election, has the running masters report"
                    " what they hold, and recovers from them"
                )
            if not await members():
                raise InvalidArgument(
                    f"no master of cluster {cluster!r} runs (none has a member key in etcd at {endpoint}): start its"
                    " masters, or name the cluster they were given (master.cluster)"
                )
            why = f"an operator ran pcache ha recover at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
            ok, _ = await etcd(
                client.transaction(
                    compare=[tx.version(key("leader")) == 0, tx.version(key("halted")) == 0],
                    success=[tx.put(key("halted"), why.encode()), tx.delete(*under("reports/"))],
                    failure=[],
                )
            )
            if not ok:
                raise Unavailable(f"cluster {cluster!r} changed in etcd meanwhile (a master leads?): run it again")
            halted = await etcd(client.get(key("halted")))
            deadline = time.monotonic() + report_wait
            while time.monotonic() < deadline:
                running = await members()
                if running and running <= {r.member for r in await reports()}:
                    break
                await asyncio.sleep(0.2)
        found = await reports()
        if not found:
            raise InvalidArgument(
                f"no master of cluster {cluster!r} has reported what it holds: start its masters (each one reports"
                " within a second once the cluster halted), then run this again"
            )
        last = await etcd(client.get(key("last")))
        last_member = last.value.decode(errors="replace") if last is not None else ""
        found.sort(key=lambda r: (r.term, r.index, r.member == last_member), reverse=True)
        newest = chosen = found[0]
        if member is not None:
            named = [r for r in found if r.member == member]
            if not named:
                raise InvalidArgument(
                    f"master {member} has not reported; reports: {', '.join(r.member for r in found)}"
                )
            chosen = named[0]
            if chosen.position < newest.position and not force:
                raise InvalidArgument(
                    f"master {member} holds term {chosen.term} index {chosen.index}, less than master {newest.member}"
                    f" (term {newest.term} index {newest.index}): recovering from it drops the mutations only the"
                    " other holds; pass --force to do it anyway"
                )
        base_kv = await etcd(client.get(key("base")))
        try:
            old_base = parse_base(base_kv.value if base_kv is not None else None, prefix)
        except InvalidArgument:
            old_base = 0  # overwritten: the reports name the terms the cluster used
        base = max(max(r.term for r in found), old_base) + RECOVERY_MARGIN
        running = await members()
        if apply:
            ok, _ = await etcd(
                client.transaction(
                    compare=[
                        tx.version(key("leader")) == 0,
                        tx.mod(key("halted")) == halted.mod_revision,
                        unchanged(tx, key("base"), base_kv),
                    ],
                    success=[
                        tx.put(key("base"), str(base).encode()),
                        tx.put(key("last"), chosen.member.encode()),
                        tx.delete(*under("insync/")),
                        tx.delete(*under("reports/")),
                        tx.delete(key("halted")),
                    ],
                    failure=[],
                )
            )
            if not ok:
                raise Unavailable(f"cluster {cluster!r} changed in etcd during the recovery: run it again")
        return Recovery(chosen, base, found, running, halted.value.decode(errors="replace"), apply, newest)
    finally:
        with contextlib.suppress(*ETCD_ERRORS):
            await client.close()


def unchanged(tx: Any, key: bytes, kv: Any) -> Any:
    """An etcd transaction compare: ``key`` is as ``kv`` (its value read earlier, None: absent) found it."""
    return tx.mod(key) == (kv.mod_revision if kv is not None else 0)


def parse_base(raw: bytes | None, where: str) -> int:
    """An epoch base as etcd holds it (None: 0).

    Raises:
        InvalidArgument: not a decimal integer in ``[0, MAX_BASE)``.
    """
    if raw is None:
        return 0
    text = raw.decode(errors="replace")
    if not (text.isascii() and text.isdigit()) or int(text) >= MAX_BASE:
        raise InvalidArgument(f"{where}base in etcd holds {text[:40]!r}, not an epoch base")
    return int(text)


def _parse_report(kv: Any, prefix: str) -> Report:
    """A master's report as :meth:`HAControl._report` wrote it.

    Raises:
        InvalidArgument: not one a master wrote.
    """
    name = kv.key.decode(errors="replace")
    try:
        member = kv.key.decode()[len(prefix) :]  # strict: member ids are text
        fields = json.loads(kv.value)
        address, term, index = fields["address"], fields["term"], fields["index"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"{name} in etcd is not a report a master wrote: {exc}") from exc
    numbers = all(type(n) is int and 0 <= n < MAX_TERM for n in (term, index))
    if not isinstance(address, str) or not numbers or not member.isprintable():
        raise InvalidArgument(f"{name} in etcd is not a report a master wrote: {kv.value[:200]!r}")
    return Report(member, address, term, index)
