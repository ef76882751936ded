#!/usr/bin/env python
"""Master failover time and metadata throughput, single master against a leader + follower.

Starts local clusters of real processes (masters, one worker, and for HA an etcd) and measures:

1. **Failover time**: a client creates directories in a loop against a leader + follower pair;
   the leader is killed with SIGKILL; the time from the kill to the first mutation that
   succeeds afterwards (on the new leader, after the client's own retries). ``--kills``
   times (the killed master comes back as the follower and catches up in between). Median and
   max. Targets: median <= 3 s, max <= 7 s.
2. **Metadata rates**: create+close of empty files, ``stat`` (client cache off: every call a
   master RPC) and ``listdir`` of a 1,000-entry directory, by 1, 8 and 32 concurrent clients
   (asyncio tasks spread over ``--procs`` client processes, each on uvloop as ``Client`` and
   the mounts run), against a single master and
   against a leader whose every answer waits for its synchronous follower, both clusters up at
   once and measured alternately (``--rounds``, medians). The HA/single ratio is the cost of
   replication. Targets: HA >= 0.7 of single; create >= 5,000/s and
   stat >= 20,000/s aggregate at 32 clients.

The last line is ``RESULT key=value ...`` (rates in operations/s, times in seconds).

Usage::

    python bench/master_ha.py --quick      # 4 kills, 3 s per rate, 1 round; under two minutes
    python bench/master_ha.py              # 10 kills, 8 s per rate, 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib  # noqa: F401  (puts the checkout on sys.path)

from pcache.client import Client, PCacheClient
from pcache.client.sync import new_event_loop
from pcache.common.config import ClientConfig
from pcache.common.errors import PCacheError
from pcache.local import LocalCluster

FAST = ["--master.dead_after=3", "--master.heartbeat_interval=0.5"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- failover --


def failover_times(root: Path, kills: int, lease_ttl: float) -> list[float]:
    """Seconds from each leader SIGKILL to the first mutation that succeeds afterwards."""
    args = [*FAST, f"--master.lease_ttl={lease_ttl}", "--master.ack_timeout=1"]
    times: list[float] = []
    with LocalCluster(str(root / "failover"), workers=1, masters=2, master_args=args) as cluster:
        successes: list[float] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def mutate() -> None:
            try:
                with Client(ClientConfig(master=cluster.master_address, failover_timeout=60)) as pc:
                    pc.mkdir("/fo", parents=True)
                    i = 0
                    while not stop.is_set():
                        pc.mkdir(f"/fo/{i}")
                        successes.append(time.monotonic())
                        i += 1
                        time.sleep(0.002)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=mutate, daemon=True)
        thread.start()
        time.sleep(1.0)
        for k in range(kills):
            leader = cluster.leader()
            killed = time.monotonic()
            cluster.kill(leader, signal.SIGKILL)
            reaped = time.monotonic()  # a mutation answered before this may be the dying leader's
            deadline = killed + 60
            while time.monotonic() < deadline and not (successes and successes[-1] > reaped):
                time.sleep(0.01)
            after = [t for t in successes if t > reaped]
            if not after:
                raise RuntimeError(f"no mutation succeeded within 60 s of kill {k + 1}: {errors}")
            times.append(after[0] - killed)
            log(f"kill {k + 1}/{kills}: first mutation after {times[-1]:.2f} s")
            cluster.start_ha_master(cluster.master_procs.index(leader))
            cluster.wait_in_sync(timeout=60)
            time.sleep(0.5)
        stop.set()
        thread.join(30)
        if errors:
            raise RuntimeError(f"the mutating client failed: {errors[0]!r}")
    return times


# ------------------------------------------------------------ metadata rates --


async def _client_tasks(master: str, op: str, tasks: int, start_at: float, seconds: float, tag: str) -> int:
    cfg = ClientConfig(master=master, metadata_ttl=0.0)
    client = PCacheClient(cfg)
    done = 0
    try:
        stop_at = start_at + seconds

        async def one(t: int) -> int:
            n = 0
            while time.time() < start_at:
                await asyncio.sleep(0.005)
            while time.time() < stop_at:
                if op == "create":
                    f = await client.open(f"/bench/c/{tag}-{t}-{n}", "wb")
                    await f.close()
                elif op == "stat":
                    await client.stat(f"/bench/big/f{(t * 7919 + n) % 1000}")
                else:
                    await client.listdir("/bench/big")
                n += 1
            return n

        done = sum(await asyncio.gather(*(one(t) for t in range(tasks))))
    finally:
        await client.close()
    return done


def _client_proc(master: str, op: str, tasks: int, start_at: float, seconds: float, tag: str, out) -> None:
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:  # the loop Client and mounts run
            out.put(runner.run(_client_tasks(master, op, tasks, start_at, seconds, tag)))
    except BaseException as exc:  # reported by the parent
        out.put(exc)


def rate(master: str, op: str, clients: int, procs: int, seconds: float, tag: str) -> float:
    """Aggregate ops/s of ``clients`` concurrent callers spread over ``procs`` processes."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs gRPC
    out = ctx.Queue()
    nprocs = min(procs, clients)
    per = [clients // nprocs + (1 if i < clients % nprocs else 0) for i in range(nprocs)]
    start_at = time.time() + 2.0 + 0.3 * nprocs
    workers = [
        ctx.Process(target=_client_proc, args=(master, op, n, start_at, seconds, f"{tag}{i}", out))
        for i, n in enumerate(per)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(30)
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"{op} client failed: {bad[0]!r}")
    return sum(results) / seconds


def prepare(master: str) -> None:
    """The directories the rates use: ``/bench/c`` for creates, 1,000 files in ``/bench/big``."""
    with Client(ClientConfig(master=master)) as pc:
        pc.mkdir("/bench/c", parents=True)
        pc.mkdir("/bench/big", parents=True)
        for i in range(1000):
            pc.write_file(f"/bench/big/f{i}", b"")


def metadata_rates(
    masters: dict[str, str], counts: list[int], procs: int, seconds: float, rounds: int
) -> dict[str, dict[str, float]]:
    """Median rate of each (op, clients) per setup (name -> master address).

    The setups are measured back to back, ``rounds`` times each, alternating: a shared machine
    whose speed drifts over minutes moves both sides of a ratio alike.
    """
    for master in masters.values():
        prepare(master)
    out: dict[str, dict[str, float]] = {name: {} for name in masters}
    for op in ("create", "stat", "listdir"):
        for n in counts:
            runs: dict[str, list[float]] = {name: [] for name in masters}
            for r in range(rounds):
                for name, master in masters.items():
                    runs[name].append(rate(master, op, n, procs, seconds, f"{name}{op}{n}-{r}-"))
                    log(f"{name:<7} {op:<8} {n:>3} clients: {runs[name][-1]:>9.0f} ops/s")
            for name in masters:
                out[name][f"{op}_{n}"] = statistics.median(runs[name])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 kills, 3 s per rate, 1 and 32 clients")
    parser.add_argument("--kills", type=int, default=None, help="leader kills (default 10; --quick 4)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per rate (default 8; --quick 3)")
    parser.add_argument("--procs", type=int, default=4, help="client processes the callers are spread over")
    parser.add_argument(
        "--rounds", type=int, default=None, help="alternating runs per rate, median kept (default 3; --quick 1)"
    )
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="master.lease_ttl of the pair (seconds)")
    parser.add_argument("--dir", default=None, help="scratch directory (default $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and logs")
    args = parser.parse_args()
    kills = args.kills if args.kills is not None else (4 if args.quick else 10)
    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 8.0)
    counts = [1, 32] if args.quick else [1, 8, 32]
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    root = Path(tempfile.mkdtemp(prefix="pcache-master-ha-", dir=args.dir))
    try:
        times = failover_times(root, kills, args.lease_ttl)
        ha_args = [*FAST, f"--master.lease_ttl={args.lease_ttl}"]
        with (
            LocalCluster(str(root / "single"), workers=1, master_args=FAST) as single,
            LocalCluster(str(root / "ha"), workers=1, masters=2, master_args=ha_args) as pair,
        ):
            rates = metadata_rates(
                {"single": single.master_address, "ha": pair.master_address}, counts, args.procs, seconds, rounds
            )
        one, ha = rates["single"], rates["ha"]
    except (PCacheError, RuntimeError) as exc:
        print(f"master_ha: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\nfailover (leader SIGKILL -> first successful mutation), {kills} kills, lease {args.lease_ttl:g} s:")
    print(f"  median {statistics.median(times):.2f} s  max {max(times):.2f} s  (targets 3 s / 7 s)")
    print(f"\n{'operation':<10} {'clients':>7} {'single ops/s':>13} {'HA ops/s':>10} {'HA/single':>10}")
    for key in one:
        op, n = key.rsplit("_", 1)
        print(f"{op:<10} {n:>7} {one[key]:>13.0f} {ha[key]:>10.0f} {ha[key] / one[key]:>10.2f}")
    top = max(counts)
    result: dict[str, object] = {
        "failover_median_s": statistics.median(times),
        "failover_max_s": max(times),
        "kills": kills,
    }
    for key in one:
        result[f"single_{key}"] = one[key]
        result[f"ha_{key}"] = ha[key]
        result[f"ratio_{key}"] = ha[key] / one[key]
    result["ha_create_ratio"] = ha[f"create_{top}"] / one[f"create_{top}"]
    result["ha_stat_ratio"] = ha[f"stat_{top}"] / one[f"stat_{top}"]
    benchlib.print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
