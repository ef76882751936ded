"""``pcache master``: build the master from its config section and serve it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time

import grpc

from pcache.common.config import MasterConfig, describe
from pcache.common.metrics import (
    MASTER_CORRUPT,
    MASTER_DAMAGED_FILES,
    MASTER_MISSING,
    MASTER_UNDER_REPLICATED,
    MASTER_WORKERS,
    serve_metrics,
)
from pcache.common.process import wait_for_stop_signal, write_ready_file
from pcache.common.rpc import channel_options
from pcache.master import fsck
from pcache.master.blocks import BlockManager
from pcache.master.metastore import MetaStore, open_metastore
from pcache.master.namespace import Namespace
from pcache.master.registry import WorkerRegistry
from pcache.master.service import MasterServicer
from pcache.proto import pcache_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

EPOCH_KEY = b"cepoch"


def next_epoch(store: MetaStore) -> int:
    """Bump and persist the leader epoch (one term per master start)."""
    raw = store.get(EPOCH_KEY)
    epoch = (struct.unpack(">Q", raw)[0] if raw else 0) + 1
    store.write([(EPOCH_KEY, struct.pack(">Q", epoch))])
    return epoch


class MasterServer:
    """A running master: metastore, domain objects, gRPC server, upkeep loop."""

    def __init__(self, cfg: MasterConfig) -> None:
        self.cfg = cfg
        uri = cfg.metastore or (f"rocksdb://{os.path.abspath(cfg.data_dir)}/meta" if cfg.data_dir else "memory://")
        self.store = open_metastore(uri, sync=cfg.sync_writes)
        self.epoch = next_epoch(self.store)
        self.ns = Namespace(
            self.store,
            default_block_size=cfg.default_block_size,
            default_replication=cfg.default_replication,
            allocation_grace=cfg.orphan_grace,
        )
        self.registry = WorkerRegistry(dead_after=cfg.dead_after)
        self.blocks = BlockManager(self.ns, self.registry, replication_timeout=cfg.replication_timeout)
        self.servicer = MasterServicer(
            self.ns,
            self.registry,
            self.blocks,
            epoch=self.epoch,
            heartbeat_interval=cfg.heartbeat_interval,
            listdir_limit=cfg.listdir_limit,
        )
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._started = time.monotonic()

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        # no SO_REUSEPORT (gRPC's default): a second master on a taken port must fail, not share it
        self.server = grpc.aio.server(options=[*channel_options(), ("grpc.so_reuseport", 0)])
        pb_grpc.add_MasterServicer_to_server(self.servicer, self.server)
        try:
            self.port = self.server.add_insecure_port(f"{self.cfg.host}:{self.cfg.port}")
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot bind the master to {self.cfg.host}:{self.cfg.port} (in use by another process?)")
        await self.server.start()
        self._started = time.monotonic()
        logger.info("master epoch %d serving on %s:%d", self.epoch, self.cfg.host, self.port)
        return self.port

    async def upkeep(self) -> None:
        """Expire silent workers and schedule re-replication, forever."""
        while True:
            await asyncio.sleep(self.cfg.replication_check_interval)
            try:
                self.upkeep_once()
            except Exception:
                logger.exception("upkeep pass failed")

    def upkeep_once(self) -> None:
        """One pass of liveness, orphan and replication upkeep."""
        for state in self.registry.expire():
            self.blocks.worker_died(state.worker_id)
        # After a restart, give workers time to report before copying anything.
        if time.monotonic() - self._started > self.cfg.dead_after:
            issued = self.blocks.schedule()
            if issued:
                logger.info("issued %d re-replications", issued)
        expired = self.ns.allocations.expire()
        if expired:
            logger.info("%d block allocations expired without a commit (master.orphan_grace)", len(expired))
        MASTER_WORKERS.set(len(self.registry.alive()))
        MASTER_UNDER_REPLICATED.set(self.blocks.under_replicated())  # the figure `pcache status` shows
        MASTER_MISSING.set(self.blocks.missing())
        MASTER_CORRUPT.set(self.blocks.corrupt_blocks())
        MASTER_DAMAGED_FILES.set(fsck.damaged_files(self.ns, self.blocks))

    async def stop(self, grace: float = 2.0) -> None:
        """Stop serving and close the metastore."""
        if self.server is not None:
            await self.server.stop(grace)
        self.store.close()


async def serve(cfg: MasterConfig, *, ready_file: str | None = None) -> None:
    """Run a master until SIGTERM or SIGINT, then stop gracefully."""
    logger.info("master config: %s", describe(cfg))
    master = MasterServer(cfg)
    port = await master.start()
    serve_metrics(cfg.metrics_port, cfg.host, role="master")
    if ready_file:
        write_ready_file(ready_file, f"{cfg.host}:{port}")
    upkeep = asyncio.create_task(master.upkeep())
    await wait_for_stop_signal()
    logger.info("master stopping")
    upkeep.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await upkeep
    await master.stop()
