"""Supervisor: run N training ranks, and restart them all from the latest complete checkpoint
when one dies or hangs (automated recovery, Ling report §6.1).

    python -m trainer_ref.launch --nproc 2 --max-restarts 3 --run-dir ./run -- \\
        --data.root=/mnt/pcache/shards --ckpt.uri=pcache://127.0.0.1:19600/ckpt/run-1

Each attempt starts ``nproc`` processes of ``python -m trainer_ref.train`` with the
torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, a fresh
``MASTER_PORT``) and ``TRAINER_RUN_DIR``. It fails when a rank exits non-zero (a crash,
``kill -9``, :data:`~trainer_ref.train.EXIT_HANG` from a rank's own watchdog) or when a
rank's heartbeat file is older than ``--hang-timeout`` seconds (a rank stuck where its
watchdog cannot act, e.g. inside a collective whose peer died). Then every rank is
stopped (SIGTERM, SIGKILL after a grace period) and, up to ``--max-restarts`` times, the
job starts again; the trainer resumes from the newest complete checkpoint by itself.

``events.jsonl`` in the run directory records every start, failure and recovery; the
recovery time is from the failure's detection to the first step finished after it.
Exit status: 0 when the job finished, 1 when restarts were exhausted, 3 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from pcache.common.logs import setup_logging
from pcache.common.process import die_with_parent, free_port, stop_processes

logger = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One start of all ranks."""

    number: int
    procs: list[subprocess.Popen]
    started: float


class Supervisor:
    """Starts, watches and restarts the ranks of one training job."""

    def __init__(
        self,
        train_args: list[str],
        *,
        nproc: int,
        max_restarts: int,
        run_dir: str,
        hang_timeout: float = 600.0,
        start_timeout: float = 600.0,
        grace: float = 10.0,
        poll: float = 0.2,
    ) -> None:
        self.train_args = train_args
        self.nproc = nproc
        self.max_restarts = max_restarts
        self.run_dir = os.path.abspath(run_dir)
        self.hang_timeout = hang_timeout
        self.start_timeout = start_timeout
        self.grace = grace
        self.poll = poll
        os.makedirs(self.run_dir, exist_ok=True)
        self.events_path = os.path.join(self.run_dir, "events.jsonl")
        self.restarts = 0
        self.current: Attempt | None = None

    def event(self, kind: str, **fields) -> dict:
        """Append one event to ``events.jsonl`` and log it."""
        rec = {"event": kind, "time": time.time(), **fields}
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        logger.info("%s %s", kind, json.dumps(fields))
        return rec

    def _heartbeats(self) -> dict[int, dict]:
        beats = {}
        for rank in range(self.nproc):
            try:
                with open(os.path.join(self.run_dir, f"heartbeat-rank{rank}.json")) as fh:
                    beats[rank] = json.load(fh)
            except (FileNotFoundError, json.JSONDecodeError):
                continue
        return beats

    def _start(self, number: int) -> Attempt:
        port = free_port()
        for rank in range(self.nproc):  # stale heartbeats of the previous attempt must not count
            try:
                os.unlink(os.path.join(self.run_dir, f"heartbeat-rank{rank}.json"))
            except FileNotFoundError:
                pass
        procs = []
        for rank in range(self.nproc):
            env = {
                **os.environ,
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(self.nproc),
                "LOCAL_WORLD_SIZE": str(self.nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "TRAINER_RUN_DIR": self.run_dir, "TRAINER_ATTEMPT": str(number),
            }  # fmt: skip
            log = open(os.path.join(self.run_dir, f"rank{rank}.log"), "a")  # noqa: SIM115 - the child owns it
            procs.append(
                subprocess.Popen(
                    # no rank outlives its supervisor
                    [*die_with_parent(signal.SIGKILL), sys.executable, "-m", "trainer_ref.train", *self.train_args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            )
            log.close()
        self.event("start", attempt=number, pids=[p.pid for p in procs], master_port=port)
        self.current = Attempt(number, procs, time.time())
        return self.current

    def _stop(self, attempt: Attempt) -> None:
        stop_processes(attempt.procs, grace=self.grace)

    def _failure(self, attempt: Attempt) -> str | None:
        """Why this attempt failed, or None while it is healthy or done."""
        for rank, p in enumerate(attempt.procs):
            rc = p.poll()
            if rc is not None and rc != 0:
                how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
                return f"rank {rank} died ({how})"
        now = time.time()
        for rank, beat in self._heartbeats().items():
            if beat.get("state") != "finished" and now - beat["time"] > self.hang_timeout:
                return f"rank {rank} hung (no heartbeat for {now - beat['time']:.0f}s at step {beat['step']})"
        if now - attempt.started > self.start_timeout and len(self._heartbeats()) < self.nproc:
            return f"ranks did not start within {self.start_timeout:.0f}s"
        return None

    def run(self) -> int:
        """Run the job to completion or until restarts are exhausted; returns the exit status."""
        attempt = self._start(0)
        recovering: dict | None = None
        while True:
            time.sleep(self.poll)
            if recovering is not None:
                beats = self._heartbeats()
                if beats and min(b["step"] for b in beats.values()) > recovering["resumed_from"] \
                        and all(b.get("state") != "started" for b in beats.values()):  # fmt: skip
                    self.event("recovered", attempt=attempt.number, step=min(b["step"] for b in beats.values()),
                               recovery_seconds=time.time() - recovering["detected"])  # fmt: skip
                    recovering = None
            if all(p.poll() == 0 for p in attempt.procs):
                self.event("finished", attempt=attempt.number, restarts=self.restarts)
                return 0
            why = self._failure(attempt)
            if why is None:
                continue
            detected = time.time()
            last_step = max((b["step"] for b in self._heartbeats().values()), default=0)
            self.event("failure", attempt=attempt.number, reason=why, last_step=last_step)
            self._stop(attempt)
            if self.restarts >= self.max_restarts:
                self.event("gave_up", restarts=self.restarts)
                return 1
            self.restarts += 1
            attempt = self._start(attempt.number + 1)
            recovering = {"detected": detected, "resumed_from": 0}
            # the ranks report the checkpoint they resumed from in their first heartbeat ("started")
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                beats = self._heartbeats()
                if len(beats) == self.nproc or any(p.poll() not in (None, 0) for p in attempt.procs):
                    if beats:
                        recovering["resumed_from"] = min(b["step"] for b in beats.values())
                    break
                time.sleep(self.poll)

    def shutdown(self, *_: object) -> None:
        """SIGTERM: leave :meth:`run` (the caller stops the ranks)."""
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer_ref.launch --nproc N --max-restarts K [--run-dir D] -- <train args>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(prog="python -m trainer_ref.launch", description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=1, help="ranks (processes) on this host")
    ap.add_argument("--max-restarts", type=int, default=3, help="restarts after failures before giving up")
    ap.add_argument("--run-dir", default=os.environ.get("TRAINER_RUN_DIR", "./run"), help="heartbeats, logs, events")
    ap.add_argument("--hang-timeout", type=float, default=600.0, help="seconds without a heartbeat = hung")
    ap.add_argument("--start-timeout", type=float, default=600.0,
                    help="seconds all ranks may take to load and report their first heartbeat")  # fmt: skip
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 3 if exc.code else 0
    if args.nproc < 1 or args.max_restarts < 0:
        print("launch: --nproc must be >= 1 and --max-restarts >= 0", file=sys.stderr)
        return 3
    setup_logging("INFO", fmt="%(asctime)s launch %(levelname)s: %(message)s")
    sup = Supervisor(train_args, nproc=args.nproc, max_restarts=args.max_restarts, run_dir=args.run_dir,
                     hang_timeout=args.hang_timeout, start_timeout=args.start_timeout, grace=args.grace)  # fmt: skip
    signal.signal(signal.SIGTERM, sup.shutdown)
    try:
        return sup.run()
    except KeyboardInterrupt:
        logger.info("stopping")
        if sup.current is not None:
            sup._stop(sup.current)
        return 1


if __name__ == "__main__":
    sys.exit(main())
