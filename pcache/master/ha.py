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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from typing import Any

import aetcd

from pcache.common.errors import Unavailable
from pcache.master.election import ETCD_ERRORS, Election, OutageLog, etcd_error
from pcache.master.replication import SyncFlags

logger = logging.getLogger(__name__)


PROBE_TIMEOUT = 0.5  # seconds one connection to a leader that may be gone is waited for
# connections tried at most, PROBE_GAP apart: a loaded host takes its time to close a killed
# process's sockets
PROBES = 10
REFUSALS = 2  # refusals in a row that make a leader gone
PROBE_GAP = 0.15  # seconds


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
        if held is None or held.create_revision != epoch or held.value.decode() != address or not held.lease:
            return False
        try:
            await self._etcd(self.client.revoke_lease(held.lease))
        except Unavailable as exc:
            if "not found" in str(exc).lower():
                return False  # it expired meanwhile
            raise
        return True

    # ------------------------------------------------------ eligibility --

    async def guard(self) -> tuple[list[Any], list[Any]] | None:
        """The campaign condition (see the module docstring); None when this master may not lead."""
        tx = self.client.transactions
        last_key = self._key("last")
        last = await self._etcd(self.client.get(last_key))
        win = [tx.put(last_key, self.member.encode())]
        if last is None:
            return self._may([tx.version(last_key) == 0], win)
        compare = [tx.mod(last_key) == last.mod_revision]
        if last.value.decode() == self.member:
            if time.monotonic() - self._started < 2 * self.election.ttl and await self._in_sync_peer(last.mod_revision):
                # just restarted: a follower in sync with our last term holds all we acknowledged,
                # perhaps more than our own disk kept (a power loss without sync_writes): it goes first
                self._may_not("just restarted: a follower in sync with its last term takes over first")
                return None
            return self._may(compare, win)
        flag_key = self._key("insync", self.member)
        flag = await self._etcd(self.client.get(flag_key))
        if flag is None or flag.value.decode() != str(last.mod_revision):
            self._may_not(
                f"not in sync with the last leader's term (master {last.value.decode()}, term {last.mod_revision}):"
                " only a master that holds every change it acknowledged may take over; start that master again"
                " (its data directory holds them)"
            )
            return None
        return self._may([*compare, tx.value(flag_key) == str(last.mod_revision).encode()], win)

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
        epoch = self.election.epoch
        if not self.election.is_leader():
            return False
        flag_key = self._key("insync", member)
        op = tx.put(flag_key, str(epoch).encode()) if set_it else tx.delete(flag_key)
        try:
            ok, _ = await self._etcd(
                self.client.transaction(compare=[tx.create(self.election.key) == epoch], success=[op], failure=[])
            )
        except Unavailable as exc:
            logger.warning("in-sync flag of %s not %s: %s", member, "set" if set_it else "cleared", exc)
            return False
        return bool(ok)

    async def set_in_sync(self, member: str) -> bool:
        return await self._flag(member, set_it=True)

    async def clear_in_sync(self, member: str) -> bool:
        return await self._flag(member, set_it=False)
