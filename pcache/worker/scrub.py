"""Finding lost and rotting blocks before a reader does.

Two background loops of a worker, both reporting to the master through one incremental block
report (``ReportBlocks``), so repair starts within seconds instead of at the next full report:

- a presence check every ``block_check_interval`` seconds: block files that vanished (deleted
  by hand, a replaced disk) are forgotten and reported lost (HDFS incremental block reports),
  and block files of the wrong size (truncated) are reported corrupt: the size of up to 10,000
  blocks per round, round-robin, so a store of 100,000 blocks is swept every ten rounds;
- a scrub that reads every block's chunks and checks their CRC32Cs, at most
  ``scrub_bytes_per_s`` bytes/s, one pass every ``scrub_interval`` seconds (HDFS's
  VolumeScanner, Ceph's deep scrub): a replica nobody reads cannot stay corrupt for ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pcache.common.checksum import CHUNK_SIZE
from pcache.common.errors import CorruptBlock, NotFound
from pcache.common.metrics import CRC_FAILURES, LOST_BLOCKS, MISFIT_BLOCKS, SCRUB_BYTES, SCRUB_CORRUPT
from pcache.worker.blockstore import DiskBlockStore

logger = logging.getLogger(__name__)

Report = Callable[[list[int], list[int]], Awaitable[None]]  # (lost ids, corrupt ids)


class BlockChecker:
    """The presence check and the scrub of one worker's block store."""

    def __init__(
        self,
        store: DiskBlockStore,
        report: Report,
        *,
        check_interval: float,
        scrub_bytes_per_s: int,
        scrub_interval: float,
    ) -> None:
        self.store = store
        self.report = report
        self.check_interval = check_interval
        self.scrub_bytes_per_s = scrub_bytes_per_s
        self.scrub_interval = scrub_interval
        self.passes = 0  # full scrub passes finished
        self._reported_corrupt: set[int] = set()
        self._reported_misfits: set[int] = set()

    async def check_presence(self) -> list[int]:
        """Forget and report the blocks whose files vanished, and report the blocks whose file
        has the wrong size as corrupt (once each); returns the ids of the vanished ones."""
        lost = await asyncio.to_thread(self.store.vanished)
        if lost:
            LOST_BLOCKS.inc(len(lost))
            logger.error("block files gone from %s: %s; reporting them lost", self.store.blocks_dir, lost[:20])
            await self.report(lost, [])
        misfits = [b for b in await asyncio.to_thread(self.store.misfits) if b not in self._reported_misfits]
        if misfits:
            MISFIT_BLOCKS.inc(len(misfits))
            logger.error(
                "block files of the wrong size in %s: %s; reporting them corrupt", self.store.blocks_dir, misfits[:20]
            )
            await self.report([], misfits)
            self._reported_misfits.update(misfits)
        if self._reported_misfits:  # forget the ones deleted since (the master replaced them)
            self._reported_misfits.intersection_update(await asyncio.to_thread(self.store.block_ids))
        return lost

    async def scrub_pass(self) -> list[int]:
        """Verify every chunk of every block once, paced; returns the ids of corrupt blocks found."""
        corrupt: list[int] = []
        for block_id in await asyncio.to_thread(self.store.block_ids):
            try:
                info = await asyncio.to_thread(self.store.info, block_id)
                chunks = (info.length + CHUNK_SIZE - 1) // CHUNK_SIZE
                for index in range(chunks):
                    started = time.monotonic()
                    await asyncio.to_thread(self.store.read_chunks, block_id, index, index)
                    n = min(CHUNK_SIZE, info.length - index * CHUNK_SIZE)
                    SCRUB_BYTES.inc(n)
                    await self._pace(n, started)
            except NotFound:
                continue  # deleted meanwhile, or vanished: the presence check reports that
            except CorruptBlock as exc:
                CRC_FAILURES.inc()
                SCRUB_CORRUPT.inc()
                logger.error("scrub: %s", exc)
                corrupt.append(block_id)
        fresh = [b for b in corrupt if b not in self._reported_corrupt]
        self._reported_corrupt = set(corrupt)
        if fresh:
            await self.report([], fresh)
        self.passes += 1
        return corrupt

    async def _pace(self, nbytes: int, started: float) -> None:
        if self.scrub_bytes_per_s > 0:
            spare = nbytes / self.scrub_bytes_per_s - (time.monotonic() - started)
            if spare > 0:
                await asyncio.sleep(spare)

    async def run_presence_checks(self) -> None:
        """Check presence every ``check_interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.check_interval)
            try:
                await self.check_presence()
            except Exception:  # noqa: BLE001 - a failed round is retried next round; never stop checking
                logger.exception("block presence check failed")

    async def run_scrub(self) -> None:
        """Scrub pass after pass, one start every ``scrub_interval`` seconds, until cancelled."""
        while True:
            started = time.monotonic()
            try:
                await self.scrub_pass()
            except Exception:  # noqa: BLE001 - as above
                logger.exception("scrub pass failed")
            await asyncio.sleep(max(1.0, self.scrub_interval - (time.monotonic() - started)))
