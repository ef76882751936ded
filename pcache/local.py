"""A local PCache cluster of real processes: the embedded default.

``pcache up`` and the tests start one master and N workers as child
processes (``python -m pcache master|worker``) under one data directory::

    DIR/master/            RocksDB metastore
    DIR/worker-<i>/        block store of worker i (stands in for its NVMe)
    DIR/logs/*.log         one log per process
    DIR/cluster.json       addresses and pids, written once all workers registered
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pcache.common.errors import InvalidArgument, PCacheError, Timeout, Unavailable
from pcache.common.process import die_with_parent, stop_process, stop_processes


@dataclass
class Proc:
    """One child process of the cluster."""

    name: str
    args: list[str]
    log: Path
    ready_file: Path
    popen: subprocess.Popen | None = None
    address: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


@dataclass
class LocalCluster:
    """Master plus ``workers`` worker processes under ``data_dir``.

    Extra ``--section.key=value`` overrides go to every process in
    ``master_args`` / ``worker_args``; ``config`` is a TOML file passed to all.
    """

    data_dir: str
    workers: int = 3
    master_port: int = 0
    config: str | None = None
    master_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    per_worker_args: dict[int, list[str]] = field(default_factory=dict)
    start_timeout: float = 30.0
    master: Proc | None = None
    worker_procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.data_dir).resolve()
        self._wrote_manifest = False
        try:
            (self.root / "logs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"cannot use {self.root} as the cluster directory: {exc.strerror}") from exc

    # ------------------------------------------------------------ spawn --

    def _base(self, role: str) -> list[str]:
        args = [sys.executable, "-m", "pcache", role]
        if self.config:
            args += ["--config", self.config]
        return args

    def _spawn(self, proc: Proc) -> None:
        with contextlib.suppress(FileNotFoundError):
            proc.ready_file.unlink()
        with open(proc.log, "ab") as log:
            proc.popen = subprocess.Popen(
                proc.args + ["--ready-file", str(proc.ready_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches the launcher, which stops them in order
                preexec_fn=die_with_parent(signal.SIGTERM),  # and a launcher killed with -9 takes them along
            )
        deadline = time.monotonic() + self.start_timeout
        try:
            while not proc.ready_file.exists():
                if proc.popen.poll() is not None:
                    tail = proc.log.read_text(errors="replace")[-2000:]
                    raise Unavailable(f"{proc.name} exited with {proc.popen.returncode} at start:\n{tail}")
                if time.monotonic() > deadline:
                    raise Timeout(f"{proc.name} did not start within {self.start_timeout}s (log: {proc.log})")
                time.sleep(0.05)
        except BaseException:  # Ctrl-C or a failed start: leave no half-started process behind
            self.kill(proc, signal.SIGKILL)
            raise
        proc.address = proc.ready_file.read_text().strip()

    def start_master(self) -> Proc:
        """Start (or restart) the master on the same data directory."""
        port = self.master_port
        if self.master is not None and self.master.address:
            port = int(self.master.address.rsplit(":", 1)[1])  # keep the address across restarts
        args = self._base("master") + [
            f"--master.data_dir={self.root / 'master'}",
            f"--master.port={port}",
            *self.master_args,
        ]
        proc = Proc("master", args, self.root / "logs" / "master.log", self.root / "master.ready")
        self._spawn(proc)
        self.master = proc
        self.master_port = int(proc.address.rsplit(":", 1)[1])
        return proc

    def start_worker(self, index: int, extra_args: list[str] | None = None) -> Proc:
        """Start (or restart) worker ``index`` on its own data directory.

        ``extra_args`` (``--worker.key=value``) apply to this worker only, after ``worker_args``.
        """
        assert self.master is not None, "start the master first"
        extra = extra_args if extra_args is not None else self.per_worker_args.get(index, [])
        args = self._base("worker") + [
            f"--worker.data_dir={self.root / f'worker-{index}'}",
            f"--worker.master={self.master.address}",
            *self.worker_args,
            *extra,
        ]
        proc = Proc(
            f"worker-{index}", args, self.root / "logs" / f"worker-{index}.log", self.root / f"worker-{index}.ready"
        )
        self._spawn(proc)
        if index < len(self.worker_procs):
            self.worker_procs[index] = proc
        else:
            self.worker_procs.append(proc)
        return proc

    def start(self, *, manifest: bool = True) -> LocalCluster:
        """Start everything, wait until every worker has registered, write ``cluster.json``."""
        self.start_master()
        for i in range(self.workers):
            self.start_worker(i)
        self.wait_workers(self.workers)
        if manifest:
            self.write_manifest()
        return self

    @property
    def master_address(self) -> str:
        assert self.master is not None
        return self.master.address

    def wait_workers(self, count: int, timeout: float | None = None) -> None:
        """Block until ``count`` workers are alive in the master's view.

        Raises:
            Timeout: they did not all register in time.
        """
        from pcache.client import Client

        deadline = time.monotonic() + (timeout or self.start_timeout)
        with Client(master=self.master_address) as client:
            while True:
                try:
                    status = client.status()
                    if sum(1 for w in status.workers if w.alive) >= count:
                        return
                except PCacheError:
                    pass
                if time.monotonic() > deadline:
                    raise Timeout(f"fewer than {count} workers registered within the timeout")
                time.sleep(0.1)

    def write_manifest(self, **extra: object) -> Path:
        """Write ``cluster.json`` (addresses, pids, data dirs, and ``extra`` keys)."""
        assert self.master is not None
        manifest = {
            "master": self.master.address,
            "data_dir": str(self.root),
            "pids": {"master": self.master.pid, **{p.name: p.pid for p in self.worker_procs}},
            "workers": [
                {"name": p.name, "address": p.address, "data_dir": str(self.root / p.name)} for p in self.worker_procs
            ],
            **extra,
        }
        path = self.root / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, path)
        self._wrote_manifest = True
        return path

    # ------------------------------------------------------------- stop --

    @staticmethod
    def kill(proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process (SIGKILL after 10 s) and reap it."""
        if proc.popen is not None:
            stop_process(proc.popen, sig=sig)

    def stop(self) -> None:
        """SIGTERM every process (SIGKILL after 10 s) and remove the manifest."""
        procs = [p.popen for p in [*self.worker_procs, self.master] if p is not None and p.popen is not None]
        stop_processes(procs)
        if self._wrote_manifest:  # never another cluster's
            with contextlib.suppress(FileNotFoundError):
                (self.root / "cluster.json").unlink()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def read_manifest(data_dir: str) -> dict:
    """Load ``DIR/cluster.json`` written by ``pcache up``.

    Raises:
        NotFound: no cluster is running there.
    """
    from pcache.common.errors import NotFound

    path = Path(data_dir) / "cluster.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise NotFound("no cluster.json: is `pcache up` running?", path=str(path)) from exc
