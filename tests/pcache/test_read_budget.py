"""The client's read budget: every open file's cached read units under one byte bound."""

from __future__ import annotations

import asyncio
import os

from pcache.client import PCacheClient
from pcache.client.budget import ReadBudget
from pcache.common.config import ClientConfig

MiB = 1 << 20


class Owner:
    def __init__(self, budget: ReadBudget, busy: set | None = None) -> None:
        self.budget = budget
        self.busy = busy or set()
        self.held: set = set()

    def take(self, key, n: int, demand: bool) -> bool:
        ok = self.budget.admit(self, key, n, demand=demand)
        if ok:
            self.held.add(key)
        return ok

    def drop_unit(self, key) -> bool:
        if key in self.busy:
            return False
        self.held.discard(key)
        self.budget.release(self, key)
        return True


def test_prefetch_never_pushes_out_unread_read_ahead_but_a_demand_read_does():
    budget = ReadBudget(3 * MiB)
    a, b = Owner(budget), Owner(budget, busy={(1, 0)})  # b's first unit is still being fetched
    assert a.take((1, 0), MiB, demand=False) and a.take((1, 1), MiB, demand=False)  # a's read-ahead
    assert b.take((1, 0), MiB, demand=True)
    assert not b.take((1, 2), MiB, demand=False)  # full, and a's read-ahead is unread: skipped
    assert budget.refused == 1 and budget.used == 3 * MiB
    budget.touch(a, (1, 0))  # a read its first unit: now a prefetch may push it out
    assert b.take((1, 3), MiB, demand=False) and (1, 0) not in a.held
    assert b.take((1, 4), MiB, demand=True)  # a demand read pushes out the least recent unit
    assert (1, 1) not in a.held and budget.used == 3 * MiB and budget.evicted == 2
    b.busy = set(b.held)
    assert not a.take((1, 9), MiB, demand=True)  # everything left is being fetched: no room
    assert budget.used == 3 * MiB


def test_many_open_files_stay_within_the_budget_and_read_correctly(shared_cluster):
    files, size = 24, 3 * MiB + 12345

    async def run() -> tuple[int, int, int]:
        cfg = ClientConfig(master=shared_cluster.master_address, read_unit=MiB, readahead_units=2,
                           read_budget=4 * MiB, short_circuit=False)  # fmt: skip
        async with PCacheClient(cfg) as pc:
            await pc.mkdir("/budget", parents=True)
            blobs = [os.urandom(size) for _ in range(files)]
            for i, blob in enumerate(blobs):
                await pc.write_file(f"/budget/f{i}", blob)
            handles = [await pc.open(f"/budget/f{i}", "rb") for i in range(files)]
            got = [bytearray() for _ in range(files)]
            peak = 0
            while any(len(g) < size for g in got):  # round robin: every file open and half read
                for i, f in enumerate(handles):
                    got[i] += await f.read(300_000)
                    peak = max(peak, pc.read_budget.used)
            for f in handles:
                await f.close()
            assert [bytes(g) for g in got] == blobs
            assert pc.read_budget.used == 0  # closing gave every unit back
            return peak, pc.read_budget.evicted, pc.read_budget.refused

    peak, evicted, refused = asyncio.run(run())
    assert 0 < peak <= 4 * MiB
    assert evicted > 0 and refused > 0  # 24 files x 3 units do not fit in 4


def test_a_lone_sequential_reader_keeps_its_read_ahead(shared_cluster):
    async def run() -> tuple[int, int]:
        cfg = ClientConfig(master=shared_cluster.master_address, read_unit=MiB, readahead_units=3,
                           read_budget=8 * MiB, short_circuit=False)  # fmt: skip
        async with PCacheClient(cfg) as pc:
            blob = os.urandom(20 * MiB)
            await pc.write_file("/budget-seq.bin", blob)
            async with await pc.open("/budget-seq.bin", "rb") as f:
                assert await f.read() == blob
            return pc.read_budget.refused, pc.read_budget.used

    refused, used = asyncio.run(run())
    assert refused == 0 and used == 0


def test_write_budget_waits_for_room_and_wakes_on_release():
    from pcache.client.budget import WriteBudget

    async def run() -> None:
        budget = WriteBudget(3 * MiB)
        assert await budget.acquire(2 * MiB) == 2 * MiB
        big = asyncio.create_task(budget.acquire(5 * MiB))  # over the limit: takes the whole limit
        await asyncio.sleep(0.01)
        assert not big.done() and budget.waits == 1
        budget.release(2 * MiB)
        assert await asyncio.wait_for(big, 1) == 3 * MiB and budget.used == 3 * MiB
        a = asyncio.create_task(budget.acquire(2 * MiB))
        b = asyncio.create_task(budget.acquire(2 * MiB))
        await asyncio.sleep(0.01)
        assert not a.done() and not b.done()
        budget.release(3 * MiB)
        done, pending = await asyncio.wait({a, b}, timeout=1, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1 and budget.used == 2 * MiB  # one fits, the other waits
        budget.release(2 * MiB)
        await asyncio.wait_for(pending.pop(), 1)
        assert budget.used == 2 * MiB and budget.waits == 3

    asyncio.run(run())


def test_many_writers_stay_within_the_write_budget(shared_cluster):
    async def run() -> tuple[int, int]:
        cfg = ClientConfig(master=shared_cluster.master_address, write_budget=2 * MiB, max_inflight_blocks=4)
        async with PCacheClient(cfg) as pc:
            blobs = [os.urandom(4 * MiB + 1000) for _ in range(6)]
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, pc.write_budget.used)
                    await asyncio.sleep(0)

            watcher = asyncio.create_task(watch())

            async def write(i: int) -> None:
                async with await pc.open(f"/wbudget/f{i}", "wb", block_size=MiB) as f:
                    for off in range(0, len(blobs[i]), 256 * 1024):
                        await f.write(blobs[i][off : off + 256 * 1024])

            await pc.mkdir("/wbudget", parents=True)
            await asyncio.gather(*(write(i) for i in range(6)))
            watcher.cancel()
            for i, blob in enumerate(blobs):
                assert await pc.read_file(f"/wbudget/f{i}") == blob
            assert pc.write_budget.used == 0
            return peak, pc.write_budget.waits

    peak, waits = asyncio.run(run())
    assert 0 < peak <= 2 * MiB and waits > 0


def test_small_short_circuit_reads_check_a_chunk_once(shared_cluster, monkeypatch):
    import random

    import pcache.client.data as data_mod
    from pcache.client import Client

    blob = os.urandom(3 * MiB)
    reads: list[int] = []
    real_pread = data_mod.os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, offset)

    with Client(ClientConfig(master=shared_cluster.master_address, metadata_ttl=0)) as pc:
        pc.write_file("/sc-windows.bin", blob)
        rng = random.Random(3)
        windows = [rng.randrange(2 * MiB, 3 * MiB - 68) for _ in range(200)]  # all in the third chunk
        with pc.open("/sc-windows.bin", "rb") as f:
            assert f.pread(0, 10) == blob[:10]  # opens the short-circuit descriptor
            monkeypatch.setattr(data_mod.os, "pread", counting_pread)
            for off in windows:
                assert f.pread(off, 68) == blob[off : off + 68]
    # the cluster is on this host: through the short circuit, the chunk was read and checked once
    # (1 MiB), then the 200 windows in it were served from memory
    assert reads == [MiB], reads
