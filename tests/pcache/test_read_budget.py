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
