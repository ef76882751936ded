"""``pcache worker``: block store, memory tier, data plane, heartbeats.

The worker registers with the master (with a full block report), then
heartbeats every ``heartbeat_interval`` seconds with its capacity, free bytes
and in-flight I/O; the reply carries DELETE and REPLICATE commands, which run
in the background. A master that is down or restarted is retried forever:
the data plane keeps serving meanwhile.

With a leader + follower pair (``worker.master = a:port,b:port``) the worker
registers with and heartbeats every master, so the follower knows every worker
the moment it takes over; it runs commands only from a master that says it
leads with the newest epoch seen (fencing), and sends its block reports to the
leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from objstore import ObjectStore, open_store
from objstore.errors import StoreError
from pcache.client.data import DataClient
from pcache.common import ufs
from pcache.common.checksum import crc32c
from pcache.common.coalesce import Coalescer
from pcache.common.config import ClientConfig, WorkerConfig, check_addresses, default_node_id, describe
from pcache.common.credentials import check_private_path, clean_token, find_token
from pcache.common.errors import (
    CorruptBlock,
    InvalidArgument,
    NotFound,
    PCacheError,
    PermissionDenied,
    StaleHandle,
    Unavailable,
    from_name,
)
from pcache.common.layout import HOLE
from pcache.common.metrics import LOST_BLOCKS, WORKER_TLS_EXPIRY, serve_metrics
from pcache.common.process import lock_data_dir, wait_for_stop_signal, write_ready_file
from pcache.common.rpc import MAX_BATCH, call, call_stamped, channel_options
from pcache.common.tls import RECHECK as TLS_RECHECK
from pcache.common.tls import channel as tls_channel
from pcache.common.tls import close_later, load_optional
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc
from pcache.worker.blockstore import DiskBlockStore
from pcache.worker.dataserver import LISTEN_BACKLOG, DataServer
from pcache.worker.memtier import MemoryTier
from pcache.worker.scrub import BlockChecker
from pcache.worker.shortcircuit import ShortCircuitServer

logger = logging.getLogger(__name__)

RPC_TIMEOUT = 5.0
MAX_PARALLEL_REPLICATIONS = 4
MAX_PARALLEL_PERSISTS = 4  # write-back uploads at once (each holds up to one part in memory)


def worker_id_for(data_dir: str) -> str:
    """The worker's stable id, created on first start in ``<data_dir>/worker_id``."""
    path = os.path.join(data_dir, "worker_id")
    try:
        with open(path) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        wid = "w-" + uuid.uuid4().hex[:10]
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(wid + "\n")
        os.replace(tmp, path)
        return wid


class WorkerServer:
    """A running worker."""

    def __init__(self, cfg: WorkerConfig) -> None:
        if not cfg.data_dir:
            raise InvalidArgument("worker.data_dir is required")
        self.advertised_host = cfg.advertise_host or cfg.host
        if self.advertised_host in ("0.0.0.0", "::", ""):
            raise InvalidArgument(f"worker.host={cfg.host!r} binds every interface: set worker.advertise_host "
                                  "to the address clients and other workers should use")  # fmt: skip
        check_private_path(cfg.data_dir, "worker.data_dir")  # nobody else may plant a socket or blocks
        os.makedirs(cfg.data_dir, mode=0o700, exist_ok=True)
        try:  # block files, block ids and the short-circuit socket: this worker's user's alone
            os.chmod(cfg.data_dir, 0o700)
        except PermissionError:
            logger.warning("cannot make %s 0700 (not its owner): other users may list its block files", cfg.data_dir)
        self.cfg = cfg
        self.started = time.time()
        self.worker_id = worker_id_for(cfg.data_dir)
        self.node_id = cfg.node_id or default_node_id()
        self._dir_lock = lock_data_dir(cfg.data_dir, "worker")  # before the store clears its tmp/
        self.store = DiskBlockStore(
            cfg.data_dir, capacity_bytes=cfg.capacity_bytes, reserve_bytes=cfg.reserve_bytes, fsync=cfg.fsync
        )
        self.tier = MemoryTier(cfg.mem_tier_bytes, cfg.eviction)
        self.tls = load_optional(cfg.tls_dir, need_cert=True)
        self.data = DataServer(
            self.worker_id,
            self.store,
            self.tier,
            io_timeout=cfg.io_timeout,
            peer_timeout=cfg.peer_timeout,
            on_corrupt=self.report_bad_block,
            on_lost=self.report_lost,
            bandwidth_limit=cfg.bandwidth_limit,
            tls=self.tls.client_context() if self.tls else None,
            fetch=self.fetch_ufs_block,
            on_fetched=self.report_fetched,
            release_space=self.release_space,
        )
        self._ufs_stores: dict[str, ObjectStore] = {}  # bound stores, by URI (credentials of this host)
        self._outages = ufs.OutageGate()  # a store that stopped answering: fetches wait 1 s for one probe of it
        # concurrent fetches ask where their blocks come from, and report them stored, together
        self._sources: Coalescer[int, pb.UfsSource] = Coalescer(self._ask_sources, MAX_BATCH)
        self._received: Coalescer[pb.BlockReport, None] = Coalescer(self._report_received, MAX_BATCH)
        self.checker = BlockChecker(
            self.store,
            self.report_blocks,
            check_interval=cfg.block_check_interval,
            scrub_bytes_per_s=cfg.scrub_bytes_per_s,
            scrub_interval=cfg.scrub_interval,
        )
        # the socket's name carries the worker id: clients treat a worker as local when its advertised
        # socket exists, so two nodes with the same data_dir path must not advertise the same path
        self.uds_path = (
            os.path.join(os.path.abspath(cfg.data_dir), f"sc-{self.worker_id}.sock") if cfg.short_circuit else ""
        )
        self.sc: ShortCircuitServer | None = None
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.epoch = 0
        self.heartbeat_interval = 1.0
        self.metrics_addr = ""
        self.masters = check_addresses(cfg.master, "worker.master")
        self.token = worker_token(cfg)
        self.links: list[MasterLink] = []
        self._tasks: set[asyncio.Task] = set()
        self._repl_slots = asyncio.Semaphore(MAX_PARALLEL_REPLICATIONS)
        self._persist_slots = asyncio.Semaphore(MAX_PARALLEL_PERSISTS)
        self._peers: DataClient | None = None  # reads other workers' blocks for write-back

    # --------------------------------------------------------- lifecycle --

    async def start(self) -> int:
        """Start the data plane, short circuit and master link; returns the TCP port."""
        tls = self.tls.server_context(client_auth=self.cfg.tls_client_auth) if self.tls else None
        # a listen backlog for bursts of clients (asyncio's default of 100 dropped the connections
        # of 1,000 files written at once by one fsspec call: connects timed out, reads failed)
        if tls is None:
            self.server = await asyncio.start_server(
                self.data.handle, self.cfg.host, self.cfg.port, limit=4 << 20, backlog=LISTEN_BACKLOG
            )
        else:
            self.server = await asyncio.start_server(
                self.data.handle, self.cfg.host, self.cfg.port, limit=4 << 20, ssl=tls, ssl_handshake_timeout=10,
                backlog=LISTEN_BACKLOG,
            )  # fmt: skip
        self.port = self.server.sockets[0].getsockname()[1]
        if self.uds_path:
            self.sc = ShortCircuitServer(self.data, self.uds_path)
            await self.sc.start()
        for address in self.masters:
            self._link(address)
        self._spawn(self.heartbeat_loop())
        if self.tls is not None:
            self._spawn(self._watch_tls())
        self._spawn(self.checker.run_presence_checks())
        if self.cfg.scrub_bytes_per_s > 0:
            self._spawn(self.checker.run_scrub())
        logger.info(
            "worker %s on %s:%d node=%s capacity=%d blocks=%d",
            self.worker_id, self.advertised_host, self.port, self.node_id, self.store.capacity_bytes, len(self.store.block_ids()),
        )  # fmt: skip
        return self.port

    async def stop(self) -> None:
        """Stop serving and background work."""
        for task in list(self._tasks):
            task.cancel()
        if self.sc is not None:
            await self.sc.stop()
        if self.server is not None:
            self.server.close()
        self.data.close_peers()
        for link in self.links:
            await link.channel.close()
        for store in self._ufs_stores.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.close(), 5.0)
        if self._dir_lock >= 0:
            os.close(self._dir_lock)
            self._dir_lock = -1

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------- master link --

    def info(self) -> pb.WorkerInfo:
        """What the worker tells the master about itself."""
        return pb.WorkerInfo(
            addr=pb.WorkerAddr(
                worker_id=self.worker_id,
                host=self.advertised_host,
                port=self.port,
                uds_path=self.uds_path,
                node_id=self.node_id,
            ),
            started=self.started,
            capacity_bytes=self.store.capacity_bytes,
            used_bytes=self.store.used_bytes,
            free_bytes=self.store.free_bytes,
            inflight=self.data.inflight,
            block_count=self.store.block_count,
            mem_tier_bytes=self.tier.size,
            mem_tier_hit_ratio=self.tier.hit_ratio,
            metrics_addr=self.metrics_addr,
        )

    async def _watch_tls(self) -> None:
        """Take a renewed certificate (or CA bundle) from the TLS directory: served from the next
        handshake on, and the links to the masters dial again with it (gRPC channel credentials
        are fixed; the old channels close once their calls had time to end)."""
        assert self.tls is not None
        while True:
            WORKER_TLS_EXPIRY.set(self.tls.expires)
            await asyncio.sleep(TLS_RECHECK)
            if not self.tls.reload_logged():
                continue
            for link in self.links:
                old, link.channel = link.channel, tls_channel(link.address, self.tls, channel_options())
                link.stub = pb_grpc.MasterStub(link.channel)
                self._spawn(close_later(old))

    def _link(self, address: str) -> MasterLink:
        channel = tls_channel(address, self.tls, channel_options())
        link = MasterLink(address, channel, pb_grpc.MasterStub(channel))
        self.links.append(link)
        return link

    def _learn_masters(self, link: MasterLink, reply: pb.RegisterResponse) -> None:
        """Heartbeat the masters ``link``'s master names that this worker was not told of: a
        worker given only the leader's address went on with it alone after a failover, and the
        new leader never knew the worker or its blocks."""
        link.advertised = reply.address or link.advertised
        if len(reply.masters) <= len(self.links):
            return  # told every master already, perhaps by other names (DNS names, advertised IPs)
        known = {a for other in self.links for a in (other.address, other.advertised) if a}
        for address in reply.masters:
            if address not in known:
                logger.warning(
                    "master %s named master %s, which worker.master leaves out: heartbeating it too"
                    " (give the worker every master)", link.address, address,
                )  # fmt: skip
                self._spawn(self._heartbeat_one(self._link(address)))
                known.add(address)

    def _header(self) -> pb.RequestHeader:
        return pb.RequestHeader(epoch=self.epoch, client_id=self.worker_id)

    async def register(self, link: MasterLink) -> None:
        """Register with one master, with a full block report."""
        blocks = await asyncio.to_thread(self.store.block_ids)
        reply, stamped = await call_stamped(
            link.stub.RegisterWorker,
            pb.RegisterRequest(header=self._header(), info=self.info(), blocks=blocks),
            timeout=RPC_TIMEOUT,
            target=f"master {link.address}",
            token=self.token,
        )
        link.epoch, link.leader = max(reply.epoch, stamped), reply.leader
        self.epoch = max(self.epoch, link.epoch)
        self._take_block_keys(link, reply.block_keys, reply.revoked_before_ms)
        self.heartbeat_interval = (reply.heartbeat_interval_ms or 1000) / 1000
        self._learn_masters(link, reply)
        logger.info(
            "registered with %s master %s (epoch %d, %d blocks reported)",
            "leader" if reply.leader else "follower", link.address, reply.epoch, len(blocks),
        )  # fmt: skip

    def _take_block_keys(self, link: MasterLink, spec: str, revoked: Mapping[str, int] | None) -> None:
        """Check block tokens with the leader's key ring (any master's until one leads: the masters
        of a cluster share one key file) and its tenants' token revocations (None: not sent)."""
        if revoked is not None and (link.leader or self.data.tokens.ring is None):
            self.data.tokens.set_revoked(dict(revoked))
        if not spec or not (link.leader or self.data.tokens.ring is None):
            return
        try:
            self.data.tokens.set_keys(spec)
        except InvalidArgument as exc:
            logger.error("master %s sent block keys this worker cannot read: %s", link.address, exc)

    async def heartbeat_loop(self) -> None:
        """Heartbeat every master (a leader and its followers) until cancelled."""
        await asyncio.gather(*(self._heartbeat_one(link) for link in self.links))

    async def _heartbeat_one(self, link: MasterLink) -> None:
        """Register, then heartbeat one master and run the commands it may give, until cancelled."""
        registered = False
        last_report = 0.0
        while True:
            try:
                if not registered or time.monotonic() - last_report > self.cfg.block_report_interval:
                    await self.register(link)  # registration carries the full block report
                    registered = True
                    last_report = time.monotonic()
                reply, stamped = await call_stamped(
                    link.stub.Heartbeat,
                    pb.HeartbeatRequest(header=self._header(), info=self.info()),
                    timeout=RPC_TIMEOUT,
                    target=f"master {link.address}",
                    token=self.token,
                )
                was_leader = link.leader
                link.epoch, link.leader = max(reply.epoch, stamped), reply.leader
                if link.leader and not was_leader and len(self.links) > 1:
                    logger.info("master %s leads (epoch %d): its commands are run", link.address, link.epoch)
                # a master that does not know this worker sends no revocations: keep the last ones
                self._take_block_keys(link, reply.block_keys, None if reply.reregister else reply.revoked_before_ms)
                if reply.reregister:
                    registered = False
                    continue
                for cmd in self.accept_commands(link, reply):
                    self._spawn(self.run_command(cmd))
            except PermissionDenied as exc:  # wrong credential: say so at every try, it will not heal alone
                if self._reload_token():
                    continue  # a token minted again (a key rotation): tried at once
                logger.error("master %s refuses this worker: %s (worker.token_file)", link.address, exc)
                link.reachable = link.leader = False
                registered = False
            except PCacheError as exc:
                if link.reachable:
                    logger.warning("master %s unreachable: %s", link.address, exc)
                link.reachable = link.leader = False
                registered = False
            except Exception:  # a bug here must not end the heartbeats: the master would count a live worker dead
                logger.exception("heartbeat to master %s failed; trying again", link.address)
                registered = False
            else:
                link.reachable = True
            await asyncio.sleep(self.heartbeat_interval)

    def _reload_token(self) -> bool:
        """Read ``worker.token_file`` again after a master refused the token: True when it holds
        another one now (``pcache keys rotate`` twice revokes the old one; the operator mints a
        new token into the file in between, and the running worker takes it, as the masters
        take a changed key file)."""
        if not self.cfg.token_file:
            return False
        try:
            token = worker_token(self.cfg)
        except InvalidArgument as exc:
            logger.error("%s", exc)
            return False
        if token == self.token:
            return False
        self.token = token
        logger.info("worker.token_file %s holds a new token: using it", self.cfg.token_file)
        return True

    def accept_commands(self, link: MasterLink, reply: pb.HeartbeatResponse) -> list[pb.WorkerCommand]:
        """The commands of a heartbeat reply this worker may run: only a leader's, and only when its
        epoch is the newest this worker has seen from any master (a deposed leader is fenced)."""
        epoch = link.epoch
        if epoch > self.epoch:
            self.epoch = epoch
        if not reply.commands:
            return []
        if not reply.leader or epoch < self.epoch:
            logger.warning(
                "ignored %d commands from master %s (epoch %d%s; newest seen %d)",
                len(reply.commands), link.address, epoch, "" if reply.leader else ", not leading", self.epoch,
            )  # fmt: skip
            return []
        return list(reply.commands)

    async def _to_leader(self, method: str, request):
        """Send a report to the leader: the master that led last first, then the others; returns
        its answer.

        Raises:
            PCacheError: no master took it (the last one's error).
        """
        order = sorted(self.links, key=lambda link: (not link.leader, -link.epoch))
        last: PCacheError | None = None
        for link in order:
            request.header.CopyFrom(self._header())
            try:
                return await call(
                    getattr(link.stub, method), request, timeout=RPC_TIMEOUT, target=f"master {link.address}",
                    token=self.token,
                )  # fmt: skip
            except PCacheError as exc:
                last = exc
        assert last is not None
        raise last

    async def run_command(self, cmd: pb.WorkerCommand) -> None:
        """Carry out one DELETE or REPLICATE command from the master."""
        try:
            if cmd.kind == pb.WorkerCommand.DELETE:
                await self.data.delete(cmd.block_id, refuse_writes_s=cmd.refuse_writes_s)
            elif cmd.kind == pb.WorkerCommand.PERSIST:
                async with self._persist_slots:
                    await self.persist(cmd)
            elif cmd.kind == pb.WorkerCommand.REPLICATE:
                await self.replicate(cmd)
        except NotFound:
            logger.info("command %s for block %d: block not here", cmd.kind, cmd.block_id)
        except PCacheError as exc:
            logger.warning("command %s for block %d failed: %s", cmd.kind, cmd.block_id, exc)

    async def replicate(self, cmd: pb.WorkerCommand) -> None:
        """Copy a block down the command's targets and report each copy stored; report the
        targets that did not get theirs at once (the master chooses again without waiting for its
        replication timeout), and a block the master thinks is here but is not as lost (as an
        HDFS DataNode reports a transfer of a replica it does not have).

        Raises:
            PCacheError: the master could not be told (it then re-issues after its timeout).
        """
        wanted = [t.worker_id for t in cmd.targets]
        blame = True  # whether the targets failed (not this worker's copy)
        try:
            async with self._repl_slots:
                stored = await self.data.replicate(cmd.block_id, list(cmd.targets))
            error = ""
        except NotFound as exc:
            if self.store.buried(cmd.block_id):  # its file is gone (the REPLICATE was sent before the delete)
                logger.info("asked to replicate block %d, which the master deleted since", cmd.block_id)
                return
            if not await asyncio.to_thread(self.store.has, cmd.block_id):
                logger.warning("asked to replicate block %d, which is not here: reporting it lost", cmd.block_id)
                self.store.forget(cmd.block_id)
                await self._to_leader(
                    "ReportBlocks", pb.IncrementalBlockReport(worker_id=self.worker_id, lost=[cmd.block_id])
                )
                return
            stored, error, blame = [], f"{type(exc).__name__}: {exc}", False
        except CorruptBlock as exc:  # this copy is bad (reported by the read): another source is chosen
            stored, error, blame = [], f"{type(exc).__name__}: {exc}", False
        except PCacheError as exc:
            stored, error = [], f"{type(exc).__name__}: {exc}"
        # with the copies of the other REPLICATE commands running: one report for all
        await asyncio.gather(
            *(self._received.call(pb.BlockReport(worker_id=wid, block_id=cmd.block_id)) for wid in stored)
        )
        missed = [wid for wid in wanted if wid not in stored]
        if missed:
            logger.warning("replicating block %d to %s failed: %s", cmd.block_id, ",".join(missed), error or "no copy")
            failure = pb.ReplicationFailure(
                block_id=cmd.block_id, targets=missed if blame else [], error=error or "no copy stored"
            )
            await self._to_leader("ReportBlocks", pb.IncrementalBlockReport(worker_id=self.worker_id, failed=[failure]))
        else:
            logger.info("replicated block %d to %s", cmd.block_id, ",".join(stored))

    async def report_blocks(self, lost: list[int], corrupt: list[int]) -> None:
        """Incremental block report: block files gone and blocks failing their CRCs."""
        await self._to_leader(
            "ReportBlocks", pb.IncrementalBlockReport(worker_id=self.worker_id, lost=lost, corrupt=corrupt)
        )

    async def report_lost(self, block_id: int) -> None:
        """A read found a block's file gone: forget it and tell the master (it re-replicates)."""
        if self.store.forget(block_id):
            LOST_BLOCKS.inc()
            logger.error("block %d: its file is gone; reporting it lost", block_id)
            await self.report_blocks([block_id], [])

    # ----------------------------------------------------- under storage --

    async def fetch_ufs_block(self, block_id: int) -> bytes:
        """The bytes of a bound file's block, from its under-store: the master says where (object,
        version, range); the version read must be the one listed (S3 ``If-Match``; size and mtime
        for a store without ETags), so old and new bytes never mix.

        Raises:
            NotFound: no such block or object. StaleHandle: the object changed upstream.
            PermissionDenied, Unavailable, Timeout: the store's answer (``worker.ufs_timeout``);
                StoreTimeout within a second while the store does not answer
                (:class:`~pcache.common.ufs.OutageGate`).
        """
        src = await self._sources.call(block_id)
        store, prefix = self._ufs_store(src.uri)
        # only the version listed: S3 If-Match on its ETag; file:// checks size and mtime around the read
        key = prefix + src.key
        data = await self._outages.call(
            ufs.bucket_root(src.uri)[0],
            lambda: ufs.call(
                store.get(key, src.offset, src.length, if_match=src.etag), src.uri, self.cfg.ufs_timeout, key=key
            ),
            probe=lambda: ufs.call(
                store.head(prefix + ufs.PROBE_KEY), src.uri, min(ufs.PROBE_TIMEOUT, self.cfg.ufs_timeout)
            ),
        )
        if len(data) != src.length:
            raise StaleHandle(
                f"{src.uri}/{src.key}: {len(data)} bytes at {src.offset}, not {src.length}: changed upstream"
            )
        return data

    async def _ask_sources(self, block_ids: list[int]) -> list[pb.UfsSource | PCacheError]:
        """Where each block comes from, asked in one call (:attr:`_sources`)."""
        reply: pb.UfsSourceList = await self._to_leader(
            "UfsBlockSources", pb.UfsSourceRequest(worker_id=self.worker_id, block_ids=block_ids)
        )
        return [from_name(src.error, src.message) if src.error else src for src in reply.sources]

    async def report_fetched(self, block_id: int, length: int, crc: int) -> None:
        """Tell the master a fetched block is stored here, with its CRC32C (with the other
        fetches' reports made meanwhile: :attr:`_received`)."""
        await self._received.call(
            pb.BlockReport(worker_id=self.worker_id, block_id=block_id, length=length, crc32c=crc)
        )

    async def _report_received(self, copies: list[pb.BlockReport]) -> list[None]:
        await self._to_leader("ReportBlocks", pb.IncrementalBlockReport(worker_id=self.worker_id, received=copies))
        return [None] * len(copies)

    async def release_space(self, block_id: int, nbytes: int) -> list[int]:
        """Ask the master to evict ``nbytes`` of clean blocks held here, for ``block_id``; returns
        the blocks to delete (the master forgot these copies already)."""
        reply: pb.SpaceResponse = await self._to_leader(
            "ReleaseSpace", pb.SpaceRequest(worker_id=self.worker_id, bytes=nbytes, block_id=block_id)
        )
        return list(reply.evict)

    # ------------------------------------------------------- write-back --

    async def persist(self, cmd: pb.WorkerCommand) -> None:
        """Upload a file for write-back (``PERSIST``): its blocks, in order, as the parts of the
        multipart upload the master started (parts of ``part_size`` bytes, the last one shorter);
        each block's CRC32C checked as it is read, each part's ETag compared with its MD5 where
        the store's ETag is one; then report the parts (or the error) to the master, which
        completes the upload when the file's turn comes. Never raises."""
        report = pb.PersistReport(
            worker_id=self.worker_id, task=cmd.task, upload_id=cmd.upload_id, uri=cmd.uri, key=cmd.key
        )
        try:
            store, prefix = self._ufs_store(cmd.uri)
            buf = bytearray()
            crc = size = 0
            for loc in cmd.blocks:
                data = await self._block_bytes(loc)
                place = min(cmd.block_size, cmd.file_size - loc.offset) if cmd.block_size else len(data)
                if len(data) < place:  # a block shorter than its place in the file: zeros follow
                    data += bytes(place - len(data))
                crc = crc32c(data, crc)
                size += len(data)
                buf += data
                while len(buf) >= cmd.part_size:
                    await self._upload_part(store, prefix + cmd.key, cmd, report, bytes(buf[: cmd.part_size]))
                    del buf[: cmd.part_size]
            if buf or not report.parts:
                await self._upload_part(store, prefix + cmd.key, cmd, report, bytes(buf))
            report.size, report.crc32c = size, crc
        except PCacheError as exc:
            logger.warning("write-back of %s/%s failed: %s", cmd.uri, cmd.key, exc)
            report.error = str(exc) or type(exc).__name__
        try:
            await self._to_leader("ReportPersist", report)
        except PCacheError as exc:  # the master asks again after its stage timeout
            logger.warning("cannot report write-back of %s: %s", cmd.key, exc)

    async def _block_bytes(self, loc: pb.BlockLocation) -> bytes:
        """A file's block for write-back: zeros for a hole, else from this worker's disk or a replica."""
        if loc.block_id == HOLE:
            return bytes(loc.length)
        data: bytes | None = None
        if await asyncio.to_thread(self.store.has, loc.block_id):
            with contextlib.suppress(NotFound, CorruptBlock):
                data, _ = await self.data.read_range(loc.block_id, 0, loc.length)
        if data is None:
            if self._peers is None:  # with the worker's own TLS files: renewed with them
                self._peers = DataClient(
                    ClientConfig(
                        master=self.masters[0],
                        tls_dir=self.cfg.tls_dir,
                        io_timeout=self.cfg.io_timeout,
                        short_circuit=False,
                    ),
                    self.tls,
                )
            errors = []
            for addr in loc.replicas:
                if addr.worker_id == self.worker_id:
                    continue
                try:
                    data = bytes(await self._peers.read(addr, loc.block_id, 0, loc.length, loc.token, loc.crc32c))
                    break
                except PCacheError as exc:
                    errors.append(f"{addr.worker_id}: {exc}")
            if data is None:
                raise Unavailable(f"block {loc.block_id}: no replica readable ({'; '.join(errors) or 'none live'})")
        if loc.crc32c and crc32c(data) != loc.crc32c:
            raise CorruptBlock(f"block {loc.block_id}: CRC32C differs from the committed one")
        return data

    async def _upload_part(
        self, store: ObjectStore, key: str, cmd: pb.WorkerCommand, report: pb.PersistReport, data: bytes
    ) -> None:
        number = len(report.parts) + 1
        part = await ufs.call(store.upload_part(key, cmd.upload_id, number, data), cmd.uri, self.cfg.ufs_timeout)
        etag = part.etag.strip('"')
        # the store's checksum: a plain S3 part's ETag is its MD5 (an SSE-KMS bucket's is not:
        # bind it with checksum=crc32 and S3 checks a CRC32 of each part itself instead)
        md5_etag = len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())
        if getattr(store, "checksum", "") == "crc32":
            md5_etag = False
        if md5_etag and hashlib.md5(data, usedforsecurity=False).hexdigest() != etag.lower():
            raise CorruptBlock(
                f"{cmd.uri}/{cmd.key}: part {number}'s ETag {etag} is not the MD5 of what was sent (damaged in"
                " transit; an SSE-KMS bucket needs checksum=crc32 in the bind's URI)"
            )
        report.parts.append(pb.PartDone(number=number, etag=etag, size=len(data)))

    def _ufs_store(self, uri: str) -> tuple[ObjectStore, str]:
        """The store of a bind's bucket (shared by the binds of one bucket:
        :func:`~pcache.common.ufs.bucket_root`) and the key prefix of ``uri`` in it."""
        root, prefix = ufs.bucket_root(uri)
        store = self._ufs_stores.get(root)
        if store is None:
            try:
                store = self._ufs_stores[root] = open_store(root)
            except StoreError as exc:
                raise ufs.translate(exc, uri) from exc
        return store, prefix

    async def report_bad_block(self, block_id: int) -> None:
        """Tell the master a local replica failed its CRC (it deletes and re-replicates)."""
        await self._to_leader("ReportBadBlock", pb.BlockReport(worker_id=self.worker_id, block_id=block_id))


@dataclass
class MasterLink:
    """The worker's connection to one master of the cluster."""

    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.MasterStub
    epoch: int = 0  # newest epoch this master stamped
    leader: bool = False  # it said it leads, in its last answer
    reachable: bool = True
    advertised: str = ""  # the address the master advertises (another spelling of ``address``)


async def serve(cfg: WorkerConfig, *, ready_file: str | None = None) -> None:
    """Run a worker until SIGTERM or SIGINT."""
    logger.info("worker config: %s", describe(cfg))
    worker = WorkerServer(cfg)
    tls = worker.tls.server_context(client_auth=cfg.tls_client_auth) if worker.tls else None
    # bound first: the worker's own kernel-chosen ports cannot take it, and its registration names it
    bound = serve_metrics(cfg.metrics_port, cfg.host, role="worker", tls=tls)
    if bound:
        worker.metrics_addr = f"{worker.advertised_host}:{bound}"
    port = await worker.start()
    if ready_file:
        write_ready_file(ready_file, f"{worker.advertised_host}:{port}")
    await wait_for_stop_signal()
    logger.info("worker stopping")
    with contextlib.suppress(Exception):
        await worker.stop()


def worker_token(cfg: WorkerConfig) -> str:
    """The worker's token: ``worker.token_file``, else ``$PCACHE_TOKEN``, else ``$PCACHE_TOKEN_FILE``.

    Raises:
        InvalidArgument: the token file cannot be read, is empty, or is readable by any user (a
            worker token reads every tenant's blocks: group-readable passes, as a Kubernetes Secret
            with ``fsGroup`` is 0440), or there is no token at all.
    """
    # the file the token comes from, if any (find_token reads $PCACHE_TOKEN_FILE when $PCACHE_TOKEN is unset)
    path = cfg.token_file or ("" if os.environ.get("PCACHE_TOKEN") else os.environ.get("PCACHE_TOKEN_FILE", ""))
    name = "worker.token_file" if cfg.token_file else "$PCACHE_TOKEN_FILE"
    try:
        mode = os.stat(path).st_mode if path else 0
    except OSError:  # a file that cannot be read is named below
        mode = 0
    if mode & 0o004:
        raise InvalidArgument(
            f"{name} {path} is readable by any user, and a worker token reads every tenant's blocks: chmod 600 it"
        )
    if cfg.token_file:
        try:
            text = Path(cfg.token_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(
                f"cannot read worker.token_file {cfg.token_file}: {getattr(exc, 'strerror', None) or exc}"
            ) from exc
        return clean_token(text, f"worker.token_file {cfg.token_file}")
    token = find_token("")
    if not token:
        raise InvalidArgument("a worker needs a worker token: worker.token_file, $PCACHE_TOKEN or $PCACHE_TOKEN_FILE")
    return token
