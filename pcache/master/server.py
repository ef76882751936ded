"""``pcache master``: build the master from its config section and serve it.

A master runs in one of two ways:

* **standalone** (``master.etcd`` empty, the embedded default): it leads alone; its epoch is a
  counter in its own metastore, bumped at every start.
* **HA** (``master.etcd = HOST:PORT``): it joins the cluster's members in etcd, follows the
  leader (applying its log, :mod:`.replication`) and campaigns when it may take over
  (:mod:`.ha`); as leader its epoch is the etcd revision of its term and it ships its log to the
  followers, answering a client only once the in-sync follower has the change.

The namespace, block manager and reply cache exist only while this master leads: a follower
builds them from its (replicated) metastore when it takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from typing import TYPE_CHECKING, Literal

import grpc

from pcache.common import errors as E
from pcache.common.auth import Guard, KeyRing, mint_token
from pcache.common.config import MasterConfig, describe
from pcache.common.credentials import ClusterKeys, check_private_path
from pcache.common.metrics import (
    MASTER_ALONE,
    MASTER_CORRUPT,
    MASTER_DAMAGED_FILES,
    MASTER_EPOCH,
    MASTER_IN_SYNC_FOLLOWERS,
    MASTER_IS_LEADER,
    MASTER_MISSING,
    MASTER_TLS_EXPIRY,
    MASTER_UNDER_REPLICATED,
    MASTER_WORKERS,
    TENANT_USAGE,
    serve_metrics,
)
from pcache.common.process import wait_for_stop_signal, write_ready_file
from pcache.common.rpc import channel_options
from pcache.common.tls import load_optional
from pcache.master import fsck, logstream
from pcache.master.blocks import BlockManager, Watermarks
from pcache.master.dedup import ReplyCache
from pcache.master.election import etcd_target
from pcache.master.metastore import MetaStore, open_metastore
from pcache.master.namespace import Namespace
from pcache.master.registry import WorkerRegistry
from pcache.master.replication import (
    REPLICATION_SCOPES,
    LogShipper,
    ReplicatedStore,
    ReplicationServicer,
    recover_incoming,
)
from pcache.master.service import MASTER_SCOPES, MasterServicer
from pcache.master.understore import UnderStores
from pcache.master.writeback import Persister
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from pcache.master.ha import HAControl

logger = logging.getLogger(__name__)

EPOCH_KEY = b"cepoch"
HA_TERM_KEY = b"chaterm"  # the newest term (epoch) of a pair whose entries this metastore holds (see .ha)
MEMBERS_POLL = 0.25  # seconds between a leader's looks at etcd's member list (a new follower is found that fast)
Role = Literal["standalone", "leader", "follower"]


def held_term(store: MetaStore) -> int:
    """The newest leader + follower term whose entries ``store`` holds (0: none)."""
    raw = store.get(HA_TERM_KEY)
    return struct.unpack(">Q", raw)[0] if raw else 0


def next_epoch(store: MetaStore) -> int:
    """The standalone master's epoch for this start: one more than the last one stored."""
    raw = store.get(EPOCH_KEY)
    return (struct.unpack(">Q", raw)[0] if raw else 0) + 1


class MasterServer:
    """A running master: metastore, domain objects, gRPC server, upkeep loop."""

    def __init__(self, cfg: MasterConfig) -> None:
        self.cfg = cfg
        uri = cfg.metastore or (f"rocksdb://{os.path.abspath(cfg.data_dir)}/meta" if cfg.data_dir else "memory://")
        path = uri.removeprefix("rocksdb://") if uri.startswith("rocksdb://") else None
        self.ha: HAControl | None = None
        if cfg.etcd and (cfg.advertise_host or cfg.host).strip("[]") in ("0.0.0.0", "::", ""):
            raise E.InvalidArgument(
                f"master.host {cfg.host!r} listens on every address, and a master of a pair (master.etcd) must"
                " advertise one that workers, clients and the other masters reach: set master.advertise_host"
            )
        if cfg.etcd:
            try:
                etcd_target(cfg.etcd)  # a malformed or unresolvable list: one line at start, not a traceback
            except ValueError as exc:
                raise E.InvalidArgument(f"master.etcd: {exc}") from exc
        if cfg.etcd and (path is None or not cfg.data_dir):
            raise E.InvalidArgument(
                "master.etcd (a leader + follower pair) needs master.data_dir (a RocksDB metastore)"
            )
        keys_file = cfg.keys_file or (os.path.join(os.path.abspath(cfg.data_dir), "keys.json") if cfg.data_dir else "")
        if not keys_file:
            raise E.InvalidArgument("a master needs master.keys_file or master.data_dir (where it keeps its keys)")
        if cfg.data_dir:  # the namespace, the member id and (by default) the keys: nobody else's to replace
            check_private_path(cfg.data_dir, "master.data_dir")
        self.keys = ClusterKeys.load_or_create(keys_file)
        self.tls = load_optional(cfg.tls_dir, need_cert=True)
        self.keys_file = keys_file
        self._keys_stamp = os.stat(keys_file).st_mtime_ns
        self.master_token = mint_token(self.keys.tokens, "cluster", "master")  # for this master's followers
        # block tokens are signed with a new key only once workers have had time to learn it
        self.block_signer: KeyRing = self.keys.blocks
        self._block_switch_at = 0.0
        if path is not None:
            recover_incoming(path)
        self.store = ReplicatedStore(
            open_metastore(uri, sync=cfg.sync_writes),
            path=path,
            reopen=lambda: open_metastore(uri, sync=cfg.sync_writes),
            tail_entries=cfg.log_tail_entries if cfg.etcd else 0,  # standalone: nobody to serve a tail to
        )
        self.store.writable = self._why_not_writable
        self.registry = WorkerRegistry(dead_after=cfg.dead_after)
        self.role: Role = "follower" if cfg.etcd else "standalone"
        self._epoch = 0  # of this master's own (latest) term
        self.member = ""
        self.ns: Namespace | None = None
        self.blocks: BlockManager | None = None
        self.replies = ReplyCache(self.store)
        self.ufs = UnderStores(self)
        self.persister = Persister(self)  # write-back uploads (runs while this master leads)
        self.watermarks = Watermarks(  # checked at start: a bad pair is refused before leading
            cfg.cache_high_watermark, cfg.cache_low_watermark, 3 * cfg.heartbeat_interval + 1.0
        )
        self.shipper: LogShipper | None = None
        self.guard = Guard(self.keys.tokens, MASTER_SCOPES)
        self.servicer = MasterServicer(self)
        self.replication = ReplicationServicer(
            self.store, "", is_leader=self._leads_now, guard=Guard(self.keys.tokens, REPLICATION_SCOPES)
        )
        self.replication.held_term = lambda: held_term(self.store)
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.address = ""
        self._streams: asyncio.base_events.Server | None = None  # replication streams (logstream)
        self._started = time.monotonic()
        self._led_since = time.monotonic()
        self._ha_task: asyncio.Task | None = None
        self._gone_check: asyncio.Task | None = None  # is the leader whose stream closed gone?
        self._lost: tuple[int, str] | None = None  # the latest stream loss that check has yet to look at
        self.replication.on_stream_lost = self._stream_lost
        self._tenant_series: set[tuple[str, str]] = set()
        if self.role == "standalone":
            epoch = next_epoch(self.store)
            self.store.epoch = epoch
            self.store.write([(EPOCH_KEY, struct.pack(">Q", epoch))])
            self._lead(epoch)

    # ------------------------------------------------------------ roles --

    @property
    def epoch(self) -> int:
        """The epoch stamped on answers: this master's term's, or a follower's newest seen."""
        return self.replication.epoch if self.role == "follower" else self._epoch

    def _why_not_writable(self) -> str | None:
        if self.role == "standalone":
            return None
        if self.role != "leader":
            return self._not_leader_message()
        if self.ha is not None and not self.ha.election.is_leader():
            return "this master's leader lease ran out: it takes no mutation (another master may lead now)"
        return None

    def _known_leader(self) -> str:
        """The leader as this follower knows it: the leader key at its campaign's last look (empty
        while nobody holds it or etcd does not answer), else the master that ships to it."""
        election = self.ha.election if self.ha is not None else None
        if election is None:
            return self.replication.leader
        if election.etcd_down_since is not None:
            return ""
        if election.seen_leader is None:  # not looked yet since it follows
            return self.replication.leader
        return election.seen_leader

    def _not_leader_message(self) -> str:
        election = self.ha.election if self.ha is not None else None
        if election is not None and election.etcd_down_since is not None:
            down = time.monotonic() - election.etcd_down_since
            return (
                f"this master is a follower, and no master can lead: etcd at {election.endpoint} has not answered"
                f" for {down:.0f} s (down, unreachable, or without a quorum of its members)"
            )
        leader = self._known_leader()
        if leader:
            return f"this master is a follower; the leader is {leader}"
        if election is not None and election.seen_leader == "":
            if self.ha is not None and self.ha.may_not_lead:
                return f"this master is a follower; no master leads, and this one may not: {self.ha.may_not_lead}"
            return "this master is a follower; no master leads now (an election is under way)"
        return "this master is a follower"

    def _leads_now(self) -> bool:
        """Whether this master refuses log entries: it leads (a standalone master always does)."""
        return self.role == "standalone" or (self.role == "leader" and self._why_not_writable() is None)

    def is_leading(self) -> bool:
        """Whether this master may answer namespace calls now."""
        return self.ns is not None and self._why_not_writable() is None

    def leading(self) -> tuple[Namespace, BlockManager]:
        """The namespace and block manager, for a master that leads.

        Raises:
            NotLeader: a follower (naming the leader when known), or a leader past its lease.
        """
        why = self._why_not_writable()
        if why is not None or self.ns is None or self.blocks is None:
            err = E.NotLeader(why or "this master is taking over; try again")
            err.leader = self._known_leader() if self.role == "follower" else ""
            raise err
        return self.ns, self.blocks

    async def commit(self) -> None:
        """Wait until everything written so far is on every required follower (no-op standalone).

        Raises:
            NotLeader: leadership was lost meanwhile. Unavailable: not replicated in
                ``master.commit_timeout`` seconds.
        """
        if self.shipper is not None:
            await self.shipper.commit(self.store.index, self.cfg.commit_timeout)
        elif self.role == "follower":
            raise E.NotLeader(self._not_leader_message())

    def _lead(self, epoch: int) -> None:
        """Build the domain objects from the metastore and start a term."""
        self._epoch = epoch
        self.store.start_term(epoch)
        self.ns = Namespace(
            self.store,
            default_block_size=self.cfg.default_block_size,
            default_replication=self.cfg.default_replication,
            allocation_grace=self.cfg.orphan_grace,
            default_tenant=self.cfg.default_tenant,
        )
        self.blocks = BlockManager(
            self.ns,
            self.registry,
            replication_timeout=self.cfg.replication_timeout,
            watermarks=self.watermarks,
            write_token_ttl=min(self.cfg.block_token_ttl, self.cfg.orphan_grace),  # as Service.block_token mints them
        )
        self.blocks.confirm_known()  # workers that already heartbeat here confirm their replicas now
        self._led_since = time.monotonic()
        MASTER_IS_LEADER.set(1)
        MASTER_EPOCH.set(epoch)

    async def _promote(self, epoch: int) -> None:
        assert self.ha is not None
        self.role = "leader"
        self.replication.epoch = max(self.replication.epoch, epoch)
        self.store.epoch = epoch
        self.shipper = LogShipper(
            self.store, epoch=epoch, address=self.address, flags=self.ha,
            ack_timeout=self.cfg.ack_timeout, rpc_timeout=max(2.0, self.cfg.ack_timeout), on_deposed=self._deposed,
            token=self.master_token, tls=self.tls,
        )  # fmt: skip
        self._lead(epoch)
        self.store.write([(HA_TERM_KEY, struct.pack(">Q", epoch))])  # replicated: followers hold it too
        logger.info("master %s leads the cluster with epoch %d at log index %d", self.member, epoch, self.store.index)
        await self._refresh_members()

    def _demote(self, why: str) -> None:
        if self.role != "leader":
            return
        logger.warning("master %s stops leading (epoch %d): %s", self.member, self.epoch, why)
        self.role = "follower"
        if self.shipper is not None:
            self.shipper.close(why)
            self.shipper = None
        self.ns = self.blocks = None
        for state in self.registry.workers.values():
            state.commands = []
        MASTER_IS_LEADER.set(0)

    async def _deposed(self, newer: int) -> None:
        self._demote(f"a follower has seen the newer epoch {newer}")
        if self.ha is not None:
            await self.ha.election.resign()

    async def _refresh_members(self) -> None:
        assert self.ha is not None
        if self.shipper is None:
            return
        try:
            members = await self.ha.members()
        except E.Unavailable as exc:
            self.ha.members_outage.failed(exc)
            return
        self.ha.members_outage.answered()
        members.pop(self.member, None)
        if self.shipper is not None:  # it may have stopped leading while etcd answered
            self.shipper.set_members(members)

    async def _ha_loop(self) -> None:
        """Follow; campaign whenever this master may take over; lead until the lease is lost."""
        assert self.ha is not None
        self.ha.start()
        while True:
            try:
                epoch = await self.ha.election.campaign(poll=0.1, guard=self.ha.guard)
                await self._promote(epoch)
                last_refresh = time.monotonic()
                while self.role == "leader" and self.ha.election.is_leader():
                    await asyncio.sleep(0.05)
                    if time.monotonic() - last_refresh > MEMBERS_POLL:
                        await self._refresh_members()
                        last_refresh = time.monotonic()
                self._demote("its etcd lease ran out")
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("leadership of master %s failed; campaigning again", self.member)
                self._demote("an internal error")
                await asyncio.sleep(1.0)
            await self.ha.election.resign()

    def _stream_lost(self, epoch: int, leader: str) -> None:
        """The replication stream of the leader of ``epoch`` closed from its end: find out, in the
        background, whether its process is gone (see :mod:`.ha`)."""
        if self.role != "follower" or self.ha is None or not leader:
            return
        self._lost = (epoch, leader)  # a loss during a check is looked at after it, not dropped
        if self._gone_check is None or self._gone_check.done():
            self._gone_check = asyncio.ensure_future(self._check_losses())

    async def _check_losses(self) -> None:
        while self._lost is not None:
            (epoch, leader), self._lost = self._lost, None
            try:
                await self._leader_gone(epoch, leader)
            except Exception:  # noqa: BLE001 - the lease decides then; never a silent task failure
                logger.exception("master %s: checking whether the leader %s is gone failed", self.member, leader)

    async def _leader_gone(self, epoch: int, leader: str) -> None:
        """Revoke the lease of the leader of ``epoch`` at ``leader`` if its address refuses
        connections, so that a follower takes over now rather than when the lease runs out."""
        from pcache.master.ha import refuses_connections

        assert self.ha is not None
        if not await refuses_connections(leader):
            logger.info("master %s: the replication stream from the leader %s (epoch %d) closed; its address still"
                        " takes connections (or cannot be reached): its lease decides", self.member, leader, epoch)  # fmt: skip
            return
        if self.role != "follower" or self.replication.epoch > epoch:
            logger.info("master %s: a newer term than %d started meanwhile", self.member, epoch)
            return
        try:
            revoked = await self.ha.depose(epoch, leader)
        except E.Unavailable as exc:
            logger.warning("master %s: the leader %s seems gone, but its lease could not be revoked: %s",
                           self.member, leader, exc)  # fmt: skip
            return
        if not revoked:
            logger.info("master %s: the lease of epoch %d is gone already", self.member, epoch)
        else:
            self.replication.deposed = max(self.replication.deposed, epoch)
            logger.warning(
                "master %s: the leader %s (epoch %d) is gone (its replication stream closed, its port refuses"
                " connections): its lease is revoked, so that a master takes over now, not within %g s",
                self.member, leader, epoch, self.cfg.lease_ttl,
            )  # fmt: skip

    def role_status(self) -> pb.MasterRole:
        """This master's part in the pair, for ``pcache status``."""
        role = pb.MasterRole(
            role=self.role, member=self.member, address=self.address, applied_index=self.store.index,
            leader=self.address if self.role in ("standalone", "leader") else self._known_leader(),
        )  # fmt: skip
        election = self.ha.election if self.ha is not None else None
        if election is not None and election.etcd_down_since is not None:
            role.etcd_down = time.monotonic() - election.etcd_down_since
        if self.ha is not None and self.role != "leader":
            role.may_not_lead = self.ha.may_not_lead
        if self.shipper is not None:
            role.followers.extend(self.shipper.status())
            role.alone = self.shipper.alone()
        return role

    # -------------------------------------------------------- lifecycle --

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        # no SO_REUSEPORT (gRPC's default): a second master on a taken port must fail, not share it
        self.server = grpc.aio.server(options=[*channel_options(), ("grpc.so_reuseport", 0)])
        pb_grpc.add_MasterServicer_to_server(self.servicer, self.server)
        pb_grpc.add_ReplicationServicer_to_server(self.replication, self.server)
        try:
            where = f"{self.cfg.host}:{self.cfg.port}"
            if self.tls is None:
                self.port = self.server.add_insecure_port(where)
            else:
                self.port = self.server.add_secure_port(
                    where, self.tls.grpc_server(client_auth=self.cfg.tls_client_auth)
                )
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot bind the master to {self.cfg.host}:{self.cfg.port} (in use by another process?)")
        self.address = f"{self.cfg.advertise_host or self.cfg.host}:{self.port}"
        await self.server.start()
        self._started = time.monotonic()
        if self.cfg.etcd:
            from pcache.master.ha import HAControl, member_id

            self.member = member_id(self.cfg.data_dir)
            self.replication.member = self.member
            if self.cfg.stream_port >= 0:
                tls = self.tls.server_context(client_auth=True) if self.tls else None  # masters only
                try:
                    self._streams = await logstream.serve(self.replication, self.cfg.host, self.cfg.stream_port, tls)
                except OSError as exc:
                    await self.server.stop(0)
                    raise OSError(
                        f"cannot bind the replication stream to {self.cfg.host}:{self.cfg.stream_port}: {exc}"
                    ) from exc
                self.replication.stream_port = self._streams.sockets[0].getsockname()[1]
            self.ha = HAControl(self.cfg.etcd, self.cfg.cluster, self.member, self.address, ttl=self.cfg.lease_ttl)
            self.ha.holds = lambda: (held_term(self.store), self.store.index)
            MASTER_IS_LEADER.set(0)
            self._ha_task = asyncio.ensure_future(self._ha_loop())
            self._ha_task.add_done_callback(_log_failure)
            logger.info("master %s serving on %s, following (etcd %s, cluster %s)",
                        self.member, self.address, self.cfg.etcd, self.cfg.cluster)  # fmt: skip
        else:
            logger.info("master epoch %d serving on %s", self.epoch, self.address)
        return self.port

    async def upkeep(self) -> None:
        """Expire silent workers and schedule re-replication, forever."""
        while True:
            await asyncio.sleep(self.cfg.replication_check_interval)
            try:
                self.upkeep_once()
            except E.NotLeader:
                pass  # leadership ended mid-pass
            except Exception:
                logger.exception("upkeep pass failed")

    def reload_keys(self) -> bool:
        """Load the key file again if it changed (``pcache keys rotate``): tokens of its current and
        previous keys are accepted from now on, those of a dropped key no longer. Returns whether
        it changed; a file that cannot be read keeps the keys in use (logged)."""
        try:
            stamp = os.stat(self.keys_file).st_mtime_ns
        except OSError as exc:
            logger.error("key file %s: %s; keeping the keys in use", self.keys_file, exc)
            return False
        if stamp == self._keys_stamp:
            return False
        self._keys_stamp = stamp
        try:
            keys = ClusterKeys.load(self.keys_file)
        except E.InvalidArgument as exc:
            logger.error("%s; keeping the keys in use", exc)
            return False
        if keys.tokens.keys == self.keys.tokens.keys and keys.blocks.keys == self.keys.blocks.keys:
            return False
        if keys.blocks.keys != self.keys.blocks.keys:
            self._new_block_keys(keys.blocks)
        self.keys = keys
        self.guard.set_ring(keys.tokens)
        self.replication.guard.set_ring(keys.tokens)
        if self.master_token.split(".")[1] not in keys.tokens.keys:  # its key was dropped: a new one
            # (kept otherwise: a follower that has not reloaded yet still knows the previous key)
            self.master_token = mint_token(keys.tokens, "cluster", "master")
            if self.shipper is not None:
                self.shipper.token = self.master_token
        logger.info("key file %s reloaded: signing key %s, accepted %s", self.keys_file, keys.tokens.current,
                    ", ".join(sorted(keys.tokens.keys)))  # fmt: skip
        return True

    def _new_block_keys(self, ring: KeyRing) -> None:
        """Workers get the new block key ring with their next heartbeat; until every one has had
        three heartbeats' time, block tokens stay signed with the previous key (when the ring
        still holds it), so no worker refuses a fresh token (HDFS rolls block keys likewise)."""
        previous = self.block_signer.current
        if previous in ring.keys and previous != ring.current:
            self.block_signer = KeyRing(ring.keys, previous)
            self._block_switch_at = time.monotonic() + 3 * self.cfg.heartbeat_interval + 1.0
        else:
            self.block_signer = ring

    def _switch_block_signer(self) -> None:
        if self._block_switch_at and time.monotonic() >= self._block_switch_at:
            self.block_signer = self.keys.blocks
            self._block_switch_at = 0.0
            logger.info("block tokens are signed with key %s from now on", self.block_signer.current)

    def starting_left(self) -> float:
        """Seconds until this leader repairs blocks: after a (re)start or a failover, workers get
        ``dead_after`` seconds to report their blocks before anything is copied or counted missing
        (HDFS's safe mode, by time)."""
        return max(0.0, self.cfg.dead_after - (time.monotonic() - max(self._started, self._led_since)))

    def reports_left(self) -> float:
        """Seconds until every live worker has registered with this master since it started:
        a worker registers with every master, leader or follower, within a heartbeat or two of
        its start, so one not registered ``dead_after`` seconds after it is not alive (a
        follower restarted just before the leader died may take over before its workers' first
        registrations: see :meth:`MasterServicer._reported`)."""
        return max(0.0, self.cfg.dead_after - (time.monotonic() - self._started))

    def upkeep_once(self) -> None:
        """One pass of liveness, orphan and replication upkeep (liveness only on a follower)."""
        self.reload_keys()
        if self.tls is not None:
            if self.tls.reload_logged() and self.shipper is not None:
                self.shipper.redial()  # a renewed certificate: served from the next handshake on, and dialled with
            MASTER_TLS_EXPIRY.set(self.tls.expires)
        self._switch_block_signer()
        expired_workers = self.registry.expire()
        MASTER_WORKERS.set(len(self.registry.alive()))
        if self.shipper is not None:
            MASTER_IN_SYNC_FOLLOWERS.set(sum(1 for f in self.shipper.followers.values() if f.in_sync))
            MASTER_ALONE.set(1 if self.shipper.alone() else 0)
        if not self.is_leading():
            return
        ns, blocks = self.leading()
        for state in expired_workers:
            blocks.worker_died(state.worker_id)
        if not self.starting_left():
            issued = blocks.schedule()
            if issued:
                logger.info("issued %d re-replications", issued)
            blocks.evict()
        expired = ns.allocations.expire()
        if expired:
            logger.info("%d block allocations expired without a commit (master.orphan_grace)", len(expired))
        self.replies.expire()
        MASTER_UNDER_REPLICATED.set(blocks.under_replicated())  # the figure `pcache status` shows
        MASTER_MISSING.set(blocks.missing())
        MASTER_CORRUPT.set(blocks.corrupt_blocks())
        MASTER_DAMAGED_FILES.set(fsck.damaged_files(ns, blocks))
        self._tenant_metrics(ns)

    def _tenant_metrics(self, ns: Namespace) -> None:
        """Export every tenant's usage and quotas; a deleted tenant's series go."""
        shown = set()
        for rec in ns.tenants.all():
            values = {
                "used_bytes": rec.used_bytes,
                "reserved_bytes": ns.allocations.reserved_bytes(rec.name),
                "quota_bytes": rec.quota_bytes,
                "used_inodes": rec.used_inodes,
                "quota_inodes": rec.quota_inodes,
            }
            for kind, value in values.items():
                TENANT_USAGE.labels(rec.name, kind).set(value)
                shown.add((rec.name, kind))
        for labels in list(self._tenant_series - shown):
            with contextlib.suppress(KeyError):
                TENANT_USAGE.remove(*labels)
        self._tenant_series = shown

    async def stop(self, grace: float = 2.0) -> None:
        """Hand leadership over (resign at once), stop serving, close the metastore."""
        if self._gone_check is not None:
            self._gone_check.cancel()
        if self._ha_task is not None:
            self._ha_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ha_task
        self._demote("stopping")
        if self.ha is not None:
            await self.ha.close()
        if self._streams is not None:
            self._streams.close()
        if self.server is not None:
            await self.server.stop(grace)
        await self.ufs.close()
        self.store.close()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.critical("the HA loop failed; this master can no longer lead", exc_info=task.exception())


async def serve(cfg: MasterConfig, *, ready_file: str | None = None) -> None:
    """Run a master until SIGTERM or SIGINT, then stop gracefully."""
    logger.info("master config: %s", describe(cfg))
    master = MasterServer(cfg)
    tls = master.tls.server_context(client_auth=cfg.tls_client_auth) if master.tls else None
    # bound first: the master's own ports chosen by the kernel (port 0) can then never take it
    serve_metrics(cfg.metrics_port, cfg.host, role="master", tls=tls)
    port = await master.start()
    if ready_file:
        write_ready_file(ready_file, f"{cfg.advertise_host or cfg.host}:{port}")
    upkeep = asyncio.create_task(master.upkeep())
    persist = asyncio.create_task(master.persister.run())
    await wait_for_stop_signal()
    logger.info("master stopping")
    for task in (upkeep, persist):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await master.stop()
