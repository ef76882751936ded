"""Leader election of PCache masters on etcd, with a fencing epoch (Ling report §2.3.1: a leader
and a follower master; ``../shared/DESIGN.md``, "Leader/follower").

Each master *campaigns* for one key, ``/pcache/<cluster>/leader``, held under a lease of ``ttl``
seconds: a transaction creates the key only if it does not exist (``create_revision == 0``). The
winner's **epoch** is the etcd revision of that creation plus the cluster's *epoch base* (0 until
an operator recovered the cluster's etcd record: :mod:`.ha`, ``pcache ha recover``): it grows
with every new term, whoever wins it, so a deposed leader's epoch is always lower than its
successor's, which is what workers, followers and clients compare to refuse it (a fencing token,
as in Kleppmann's "How to do distributed locking" and HDFS's QJM epochs). etcd's revision only
goes back when its data does (emptied, or restored from an older snapshot); the base then lifts
new epochs above every one the cluster used.

A leader keeps its lease alive every ``ttl / 4`` seconds. It counts itself leader only until
``sent + ttl - margin``, where ``sent`` is when the last *successful* keep-alive left: etcd
measured the lease from a moment at or after ``sent``, so the leader steps down before etcd can
let the lease expire and grant the key to another master, whatever stopped its keep-alives (a
network cut, SIGSTOP, etcd down). Source of the pattern: etcd's ``concurrency.Election`` (Go
client) and its lease semantics (https://etcd.io/docs/v3.5/learning/api/#lease-api).

Uses ``aetcd`` (asyncio on grpcio). Every call has ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aetcd

from pcache.common.errors import Unavailable

logger = logging.getLogger(__name__)

DEFAULT_TTL = 5.0  # seconds a leader's lease lives without a keep-alive
MARGIN = 0.5  # seconds a leader steps down before its lease can expire (clock rate, scheduling)
ETCD_ERRORS = (aetcd.ClientError, OSError, asyncio.TimeoutError)
LOG_EVERY = 10.0  # seconds between two log lines about one etcd outage
# gRPC's reconnect backoff grows to 120 s: a client found etcd back 17 s after an outage of 90 s
# (and the masters could not lead meanwhile). etcd is a service of the cluster's own network: a
# connection is tried again every second at most. (Not grpc.min_reconnect_backoff_ms: gRPC takes
# it for the connect timeout too, and 200 ms failed handshakes on a loaded machine.)
ETCD_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
}
Guard = Callable[[], Awaitable[tuple[list[Any], list[Any]] | None]]


@dataclass(frozen=True)
class Leader:
    """Who leads a cluster: the leader's advertised address and its epoch."""

    address: str
    epoch: int


def leader_key(cluster: str) -> bytes:
    """The etcd key the masters of ``cluster`` campaign for."""
    return f"/pcache/{cluster}/leader".encode()


def etcd_error(exc: BaseException) -> str:
    """An etcd client error as text (a timeout's own text is empty)."""
    return str(exc) or f"no answer ({type(exc).__name__})"


def parse_endpoints(endpoint: str) -> list[tuple[str, int]]:
    """The ``HOST:PORT`` members of a comma-separated etcd endpoint list (``http://`` prefixes
    allowed; IPv6 hosts in brackets, ``[::1]:2379``).

    Raises:
        ValueError: an entry is not HOST:PORT, or the list is empty.
    """
    found = []
    for entry in endpoint.split(","):
        entry = entry.strip().removeprefix("http://").rstrip("/")
        host, sep, port = entry.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if bracketed:
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                host = ""
        if (
            not sep
            or not host
            or not (bracketed or re.fullmatch(r"[A-Za-z0-9._-]+", host))
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            raise ValueError(f"etcd endpoint must be HOST:PORT[,HOST:PORT...] ([IPv6]:PORT), got {endpoint!r}")
        found.append((host, int(port)))
    return found


def etcd_target(endpoint: str) -> str:
    """The gRPC target of an etcd endpoint list: ``HOST:PORT`` for one member (gRPC's DNS
    resolver looks the name up again at each reconnect: a Kubernetes Service); for several,
    ``ipv4:A:P,B:P,...`` (or ``ipv6:``) with every name resolved now, which gRPC's ``pick_first``
    policy dials in order and leaves for the next member when its connection breaks (etcd's own
    clients take the same list: ``--endpoints``). A member whose address changes needs the
    process restarted; name a Service or DNS record instead where addresses move.

    Raises:
        ValueError: a malformed list, no member whose name resolves (those that do not are left
            out, with a warning), or members reachable only by IPv4 mixed with members
            reachable only by IPv6.
    """
    members = parse_endpoints(endpoint)
    if len(members) == 1:
        host, port = members[0]
        return _host_port(host, port)
    resolved: list[tuple[int, dict[int, list[str]]]] = []  # per member: its port, its addresses by family
    unresolved: list[str] = []
    for host, port in members:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            unresolved.append(f"{host}:{port} ({exc.strerror or exc})")
            continue
        by_family: dict[int, list[str]] = {}
        for family, _, _, _, sockaddr in infos:
            if str(sockaddr[0]) not in by_family.setdefault(family, []):
                by_family[family].append(str(sockaddr[0]))
        resolved.append((port, by_family))
    if not resolved:
        raise ValueError(f"no etcd member resolves: {', '.join(unresolved)}")
    if unresolved:  # the quorum may well be among the others: their names are not all needed
        logger.warning("etcd members that do not resolve, left out until a restart: %s", ", ".join(unresolved))
    for family, scheme in ((socket.AF_INET, "ipv4"), (socket.AF_INET6, "ipv6")):
        if all(family in by_family for _, by_family in resolved):  # one family for all (gRPC's rule)
            return f"{scheme}:" + ",".join(
                _host_port(ip, port) for port, by_family in resolved for ip in by_family[family]
            )
    raise ValueError(f"etcd members {endpoint!r} have no address family in common (IPv4 and IPv6 mixed)")


class OutageLog:
    """Log lines about one kind of etcd call failing: the first failure at once, then one line
    per ``LOG_EVERY`` seconds while it goes on, and one when it answers again (a master retrying
    every quarter second logged each try)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None  # monotonic: failing since then
        self._logged = 0.0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = self._logged = now
            logger.warning("%s: %s", self.what, etcd_error(exc))
        elif now - self._logged >= LOG_EVERY:
            self._logged = now
            logger.warning("%s: still failing after %.0f s: %s", self.what, now - self.since, etcd_error(exc))

    def answered(self) -> None:
        if self.since is not None:
            logger.warning("%s: etcd answers again (after %.1f s)", self.what, time.monotonic() - self.since)
            self.since = None


def etcd_client(endpoint: str, timeout: float) -> aetcd.Client:
    """An ``aetcd`` client of the etcd members listed in ``endpoint`` (:func:`etcd_target`) whose
    calls wait ``timeout`` seconds at most and whose connection is tried again within a second of
    etcd coming back.

    Raises:
        ValueError: a malformed endpoint list (:func:`etcd_target`).
    """
    host, _, port = etcd_target(endpoint).rpartition(":")  # aetcd dials f"{host}:{port}": the target
    return aetcd.Client(host=host, port=int(port), timeout=max(1, round(timeout)), options=dict(ETCD_CHANNEL_OPTIONS))


def endpoint_text(endpoint: str) -> str:
    """The members of an etcd endpoint list as ``HOST:PORT,HOST:PORT`` (for messages)."""
    return ",".join(_host_port(host, port) for host, port in parse_endpoints(endpoint))


def _host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Election:
    """One master's candidacy in ``cluster``'s election.

    ``address`` is what the master advertises (``host:port``); ``ttl`` (seconds) is the lease.
    Use :meth:`campaign` to become leader, :meth:`is_leader` before every mutation, and
    :meth:`resign` to step down (a clean stop hands over at once instead of after ``ttl``).
    """

    def __init__(
        self, endpoint: str, cluster: str, address: str, *, ttl: float = DEFAULT_TTL, timeout: float = 2.0
    ) -> None:
        if ttl < 2 * MARGIN + 1:
            raise ValueError(f"lease ttl must be at least {2 * MARGIN + 1} s, got {ttl}")
        self.endpoint = endpoint_text(endpoint)
        self.cluster = cluster
        self.address = address
        self.ttl = ttl
        self.timeout = timeout
        self.key = leader_key(cluster)
        self.epoch = 0
        self.revision = 0  # etcd's revision of this master's term (its epoch less the base)
        # added to the revision of a won term (set by the campaign's guard, which checks it in the
        # winning transaction; see :mod:`.ha`)
        self.base = 0
        # the leader key's value at this candidate's last look ("": nobody held it; None: not known)
        self.seen_leader: str | None = None
        self._outage = OutageLog(f"election {cluster}: etcd at {self.endpoint} (no master can lead until it answers)")
        self._client = etcd_client(endpoint, timeout)
        self._lease: aetcd.Lease | None = None
        self._valid_until = 0.0  # monotonic: this master leads until then
        self._keeper: asyncio.Task | None = None

    # ----------------------------------------------------------- state --

    @property
    def etcd_down_since(self) -> float | None:
        """Monotonic time since which the campaign has not reached etcd (None: it has)."""
        return self._outage.since

    @property
    def client(self) -> aetcd.Client:
        """The etcd client (shared with the master's other etcd keys)."""
        return self._client

    def is_leader(self) -> bool:
        """Whether this master may act as leader now (its lease cannot have expired yet)."""
        return self._lease is not None and time.monotonic() < self._valid_until

    async def leader(self) -> Leader | None:
        """The current leader as etcd has it, or None when nobody leads (its epoch with the base
        this candidate last looked at).

        Raises:
            Unavailable: etcd does not answer.
        """
        try:
            got = await asyncio.wait_for(self._client.get(self.key), self.timeout)
        except ETCD_ERRORS as exc:
            raise Unavailable(f"etcd at {self.endpoint}: {etcd_error(exc)}") from exc
        if got is None:
            return None
        return Leader(got.value.decode(), got.create_revision + self.base)

    # -------------------------------------------------------- campaign --

    async def campaign(self, *, poll: float | None = None, guard: Guard | None = None) -> int:
        """Wait until this master leads; returns its epoch.

        Polls the leader key every ``poll`` seconds (default ``ttl / 4``) while another master
        holds it; an unreachable etcd is retried (logged) rather than raised: a master with no
        etcd can never lead, and must not. ``guard``, when given, is asked before each try: it
        returns the extra compares and puts of the winning transaction (so eligibility is checked
        atomically with the win), or None when this master may not lead now.
        """
        poll = poll if poll is not None else self.ttl / 4
        while True:
            try:
                extra = await guard() if guard is not None else ([], [])
                if extra is None:  # may not lead: still look who does (``pcache status``, NotLeader answers)
                    held = await asyncio.wait_for(self._client.get(self.key), self.timeout)
                    self.seen_leader = held.value.decode() if held is not None else ""
                epoch = await self._try_once(*extra) if extra is not None else None
                self._outage.answered()
            except ETCD_ERRORS as exc:
                self.seen_leader = None  # not known any more
                self._outage.failed(exc)
                epoch = None
            if epoch is not None:
                return epoch
            await asyncio.sleep(poll)

    async def _try_once(self, compare: list | None = None, success: list | None = None) -> int | None:
        held = await asyncio.wait_for(self._client.get(self.key), self.timeout)
        self.seen_leader = held.value.decode() if held is not None else ""
        if held is not None:
            return None  # someone leads: no lease to grant and revoke (a candidate polls often)
        sent = time.monotonic()
        lease = await asyncio.wait_for(self._client.lease(int(round(self.ttl))), self.timeout)
        tx = self._client.transactions
        ok, responses = await asyncio.wait_for(
            self._client.transaction(
                compare=[tx.create(self.key) == 0, *(compare or [])],
                success=[tx.put(self.key, self.address.encode(), lease=lease), *(success or [])],
                failure=[],
            ),
            self.timeout,
        )
        if not ok:
            with contextlib.suppress(*ETCD_ERRORS):
                await asyncio.wait_for(lease.revoke(), self.timeout)
            return None
        self._lease = lease
        self.seen_leader = None  # this master: once it steps down, not known until it looks again
        self.revision = responses[0].response_put.header.revision
        self.epoch = self.revision + self.base
        self._valid_until = sent + self.ttl - MARGIN
        self._keeper = asyncio.ensure_future(self._keep_alive())
        logger.info("election %s: %s leads with epoch %d", self.cluster, self.address, self.epoch)
        return self.epoch

    async def _keep_alive(self) -> None:
        """Refresh the lease every ``ttl / 4`` s while it lasts; stop leading when it cannot be kept."""
        assert self._lease is not None
        lease = self._lease
        while self.is_leader():
            await asyncio.sleep(self.ttl / 4)
            sent = time.monotonic()
            try:
                reply = await asyncio.wait_for(lease.refresh(), self.timeout)
            except ETCD_ERRORS as exc:
                logger.warning("election %s: lease keep-alive failed: %s", self.cluster, etcd_error(exc))
                continue  # still leading until _valid_until; retried at the next period
            if reply is None or reply.TTL <= 0:
                logger.warning("election %s: the lease of epoch %d expired", self.cluster, self.epoch)
                break
            self._valid_until = sent + self.ttl - MARGIN
        if not self.is_leader():
            logger.warning("election %s: %s no longer leads (epoch %d)", self.cluster, self.address, self.epoch)
        self._lease = None

    async def resign(self) -> None:
        """Step down now: stop leading and revoke the lease, so another master may win at once."""
        lease, self._lease = self._lease, None
        self._valid_until = 0.0
        if self._keeper is not None:
            self._keeper.cancel()
        if lease is not None:
            with contextlib.suppress(*ETCD_ERRORS):
                await asyncio.wait_for(lease.revoke(), self.timeout)

    async def close(self) -> None:
        """Resign and close the etcd connection."""
        await self.resign()
        with contextlib.suppress(*ETCD_ERRORS):
            await self._client.close()


async def _campaign_main(endpoint: str, cluster: str, address: str, ttl: float) -> None:
    """Campaign, then print one JSON line per change of leadership (for operators and tests)."""
    election = Election(endpoint, cluster, address, ttl=ttl)
    try:
        while True:
            epoch = await election.campaign()
            print(json.dumps({"event": "leader", "address": address, "epoch": epoch}), flush=True)
            while election.is_leader():
                await asyncio.sleep(0.05)
            print(json.dumps({"event": "lost", "address": address, "epoch": epoch}), flush=True)
    finally:
        await election.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m pcache.master.election ETCD CLUSTER ADDRESS [TTL]``: campaign and report."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        print("usage: python -m pcache.master.election ETCD_HOST:PORT CLUSTER ADDRESS [TTL_SECONDS]", file=sys.stderr)
        return 3
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_campaign_main(args[0], args[1], args[2], float(args[3]) if len(args) == 4 else DEFAULT_TTL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
