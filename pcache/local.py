"""A local PCache cluster of real processes: the embedded default.

``pcache up`` and the tests start one master and N workers as child
processes (``python -m pcache master|worker``) under one data directory::

    DIR/master/            RocksDB metastore
    DIR/worker-<i>/        block store of worker i (stands in for its NVMe)
    DIR/logs/*.log         one log per process
    DIR/cluster.json       addresses and pids, written once all workers registered
    DIR/secrets/           0700: keys.json (the masters' signing keys), token (the default
                           tenant's), admin.token, worker.token; the default tenant's token is
                           also recorded for the master addresses in ~/.pcache/tokens.json, where
                           every client finds it (:mod:`pcache.common.credentials`)

With ``masters=2`` (or 3) it is a leader + follower pair instead: an etcd (the ``etcd`` binary of
Debian's ``etcd-server``) under ``DIR/etcd/`` and the masters under ``DIR/master-<i>/``, every
worker and client given all of their addresses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pcache.common.errors import InvalidArgument, PCacheError, Timeout, Unavailable
from pcache.common.process import die_with_parent, stop_process, stop_processes

if TYPE_CHECKING:
    from pcache.testing.etcd import Etcd


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
    masters: int = 1
    tls: bool = False
    """Make a throw-away CA and certificate (DIR/tls) and run every process with mutual TLS."""
    master: Proc | None = None
    worker_procs: list[Proc] = field(default_factory=list)
    master_procs: list[Proc] = field(default_factory=list)
    etcd: Etcd | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.data_dir).resolve()
        self._wrote_manifest = False
        self._master_ports: dict[int, int] = {}
        if not 1 <= self.masters <= 5:
            raise InvalidArgument(f"masters must be 1 to 5, got {self.masters}")
        try:
            (self.root / "logs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"cannot use {self.root} as the cluster directory: {exc.strerror}") from exc
        self.secrets = self.root / "secrets"
        self.keys_file = self.secrets / "keys.json"
        self.token = self.admin_token = self.worker_token = ""
        self._remembered: set[str] = set()
        self.tls_dir = str(self.root / "tls") if self.tls else ""

    def _credentials(self) -> None:
        """Keys and tokens of this cluster under ``DIR/secrets`` (kept across restarts)."""
        from pcache.common.auth import mint_token
        from pcache.common.credentials import ClusterKeys, write_secret

        if self.token:
            return
        if self.tls_dir:
            from pcache.common.tls import make_local_tls

            make_local_tls(self.tls_dir)
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.secrets, 0o700)
        keys = ClusterKeys.load_or_create(str(self.keys_file))
        for attr, name, tenant, scope in (
            ("token", "token", "default", "tenant"),
            ("admin_token", "admin.token", "admin", "admin"),
            ("worker_token", "worker.token", "workers", "worker"),
        ):
            path = self.secrets / name
            token = path.read_text().strip() if path.exists() else ""
            if not token:
                token = mint_token(keys.tokens, tenant, scope)
                write_secret(path, token + "\n")
            setattr(self, attr, token)

    def _remember(self, address: str) -> None:
        from pcache.common.credentials import remember_token

        remember_token(address, self.token)
        if self.tls_dir:
            from pcache.common.credentials import remember_tls

            remember_tls(address, self.tls_dir)
        self._remembered.add(address)

    # ------------------------------------------------------------ spawn --

    def _base(self, role: str) -> list[str]:
        args = [sys.executable, "-m", "pcache", role]
        if self.config:
            args += ["--config", self.config]
        return args

    def _spawn(self, *procs: Proc) -> None:
        """Start ``procs`` at once and wait until each has written its ready file (address).

        Raises:
            Unavailable: one exited at start (its log's tail is in the message).
            Timeout: one did not start within ``start_timeout`` seconds.
        """
        try:
            for proc in procs:
                with contextlib.suppress(FileNotFoundError):
                    proc.ready_file.unlink()
                with open(proc.log, "ab") as log:
                    proc.popen = subprocess.Popen(
                        # a launcher killed with -9 takes them along
                        [*die_with_parent(signal.SIGTERM), *proc.args, "--ready-file", str(proc.ready_file)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # Ctrl-C in a terminal reaches the launcher, which stops them in order
                    )
            deadline = time.monotonic() + self.start_timeout
            for proc in procs:  # they start side by side: their interpreters start and import at once
                assert proc.popen is not None
                while not proc.ready_file.exists():
                    if proc.popen.poll() is not None:
                        tail = proc.log.read_text(errors="replace")[-2000:]
                        raise Unavailable(f"{proc.name} exited with {proc.popen.returncode} at start:\n{tail}")
                    if time.monotonic() > deadline:
                        raise Timeout(f"{proc.name} did not start within {self.start_timeout}s (log: {proc.log})")
                    time.sleep(0.05)
        except BaseException:  # Ctrl-C or a failed start: leave no half-started process behind
            for proc in procs:
                if proc.popen is not None:
                    self.kill(proc, signal.SIGKILL)
            raise
        for proc in procs:
            proc.address = proc.ready_file.read_text().strip()

    def start_master(self) -> Proc:
        """Start (or restart) the master on the same data directory."""
        port = self.master_port
        if self.master is not None and self.master.address:
            port = int(self.master.address.rsplit(":", 1)[1])  # keep the address across restarts
        self._credentials()
        args = self._base("master") + [
            f"--master.data_dir={self.root / 'master'}",
            f"--master.port={port}",
            f"--master.keys_file={self.keys_file}",
            *([f"--master.tls_dir={self.tls_dir}"] if self.tls_dir else []),
            *self.master_args,
        ]
        proc = Proc("master", args, self.root / "logs" / "master.log", self.root / "master.ready")
        self._spawn(proc)
        self._remember(proc.address)
        self.master = proc
        self.master_port = int(proc.address.rsplit(":", 1)[1])
        return proc

    def start_etcd(self) -> Etcd:
        """Start (or restart) the cluster's etcd on its data directory.

        Raises:
            NotFound: no ``etcd`` on PATH (Debian package etcd-server).
        """
        from pcache.testing.etcd import start_etcd

        port = int(self.etcd.endpoint.rsplit(":", 1)[1]) if self.etcd is not None else 0
        self.etcd = start_etcd(self.root / "etcd", client_port=port)
        return self.etcd

    def start_ha_master(self, index: int, *, wipe: bool = False) -> Proc:
        """Start (or restart) master ``index`` of an HA pair; ``wipe`` empties its data directory first."""
        return self._start_ha_masters([index], wipe=wipe)[0]

    def _start_ha_masters(self, indices: list[int], *, wipe: bool = False) -> list[Proc]:
        assert self.etcd is not None, "start etcd first"
        self._credentials()
        procs = []
        for index in indices:
            data = self.root / f"master-{index}"
            if wipe:
                shutil.rmtree(data, ignore_errors=True)
            port = self._master_ports.get(index, self.master_port + index if self.master_port else 0)
            args = self._base("master") + [
                f"--master.data_dir={data}",
                f"--master.port={port}",
                f"--master.etcd={self.etcd.endpoint}",
                f"--master.keys_file={self.keys_file}",
                *([f"--master.tls_dir={self.tls_dir}"] if self.tls_dir else []),
                *self.master_args,
            ]
            name = f"master-{index}"
            procs.append(Proc(name, args, self.root / "logs" / f"{name}.log", self.root / f"{name}.ready"))
        self._spawn(*procs)
        for index, proc in zip(indices, procs, strict=True):
            self._remember(proc.address)
            self._master_ports[index] = int(proc.address.rsplit(":", 1)[1])
            if index < len(self.master_procs):
                self.master_procs[index] = proc
            else:
                self.master_procs.append(proc)
        return procs

    def leader(self, timeout: float = 30.0) -> Proc:
        """The master process that leads now (waits for one).

        Raises:
            Timeout: no master leads within ``timeout`` seconds.
        """
        from pcache.client import Client
        from pcache.common.config import ClientConfig

        deadline = time.monotonic() + timeout
        cfg = ClientConfig(
            master=self.master_address, failover_timeout=0, rpc_timeout=2.0, token=self.token, tls_dir=self.tls_dir
        )
        with Client(cfg) as client:
            while True:
                for address, status in client.master_statuses():
                    if not isinstance(status, PCacheError) and status.master.role in ("leader", "standalone"):
                        for proc in [*self.master_procs, *([self.master] if self.master else [])]:
                            if proc.address == address and proc.alive():
                                return proc
                if time.monotonic() > deadline:
                    raise Timeout(f"no master leads within {timeout:.0f} s")
                time.sleep(0.05)

    def wait_in_sync(self, count: int | None = None, timeout: float = 30.0) -> None:
        """Block until the leader has ``count`` in-sync followers (default: every other master alive).

        Raises:
            Timeout: they did not catch up in time.
        """
        from pcache.client import Client
        from pcache.common.config import ClientConfig

        want = count if count is not None else sum(1 for p in self.master_procs if p.alive()) - 1
        deadline = time.monotonic() + timeout
        with Client(
            ClientConfig(master=self.master_address, rpc_timeout=2.0, token=self.token, tls_dir=self.tls_dir)
        ) as client:
            while True:
                with contextlib.suppress(PCacheError):
                    if sum(1 for f in client.status().master.followers if f.in_sync) >= want:
                        return
                if time.monotonic() > deadline:
                    raise Timeout(f"fewer than {want} in-sync followers within {timeout:.0f} s")
                time.sleep(0.05)

    def start_worker(self, index: int, extra_args: list[str] | None = None) -> Proc:
        """Start (or restart) worker ``index`` on its own data directory.

        ``extra_args`` (``--worker.key=value``) apply to this worker only, after ``worker_args``.
        """
        return self._start_workers([index], extra_args)[0]

    def _start_workers(self, indices: list[int], extra_args: list[str] | None = None) -> list[Proc]:
        assert self.master is not None or self.master_procs, "start the master first"
        procs = []
        for index in indices:
            extra = extra_args if extra_args is not None else self.per_worker_args.get(index, [])
            args = self._base("worker") + [
                f"--worker.data_dir={self.root / f'worker-{index}'}",
                f"--worker.master={self.master_address}",
                f"--worker.token_file={self.secrets / 'worker.token'}",
                *([f"--worker.tls_dir={self.tls_dir}"] if self.tls_dir else []),
                *self.worker_args,
                *extra,
            ]
            log = self.root / "logs" / f"worker-{index}.log"
            procs.append(Proc(f"worker-{index}", args, log, self.root / f"worker-{index}.ready"))
        self._spawn(*procs)
        for index, proc in zip(indices, procs, strict=True):
            if index < len(self.worker_procs):
                self.worker_procs[index] = proc
            else:
                self.worker_procs.append(proc)
        return procs

    def start(self, *, manifest: bool = True) -> LocalCluster:
        """Start everything, wait until every worker has registered, write ``cluster.json``.

        Raises:
            Unavailable, Timeout: a process did not start; every one this call started is stopped.
        """
        try:
            if self.masters > 1:
                self.start_etcd()
                self._start_ha_masters(list(range(self.masters)))
                self.leader(self.start_timeout)
            else:
                self.start_master()
            self._start_workers(list(range(self.workers)))
            self.wait_workers(self.workers)
            if self.masters > 1:
                self.wait_in_sync()
        except BaseException:
            self.stop()
            raise
        if manifest:
            self.write_manifest()
        return self

    @property
    def master_address(self) -> str:
        """The master's HOST:PORT, or every master's, comma-separated, for an HA pair."""
        if self.master_procs:
            return ",".join(p.address for p in self.master_procs)
        assert self.master is not None
        return self.master.address

    def wait_workers(self, count: int, timeout: float | None = None) -> None:
        """Block until ``count`` workers are alive in the master's view.

        Raises:
            Timeout: they did not all register in time.
        """
        from pcache.client import Client
        from pcache.common.config import ClientConfig

        deadline = time.monotonic() + (timeout or self.start_timeout)
        with Client(ClientConfig(master=self.master_address, token=self.token, tls_dir=self.tls_dir)) as client:
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
        masters = self.master_procs or ([self.master] if self.master else [])
        assert masters
        manifest = {
            "master": self.master_address,
            "data_dir": str(self.root),
            "pids": {
                **({"master": self.master.pid} if self.master else {p.name: p.pid for p in self.master_procs}),
                **{p.name: p.pid for p in self.worker_procs},
            },
            "workers": [
                {"name": p.name, "address": p.address, "data_dir": str(self.root / p.name)} for p in self.worker_procs
            ],
            **(
                {"etcd": self.etcd.endpoint, "etcd_pid": self.etcd.proc.pid, "etcd_data_dir": str(self.etcd.data_dir)}
                if self.etcd
                else {}
            ),
            **(
                {
                    "masters": [
                        {"name": p.name, "address": p.address, "pid": p.pid, "data_dir": str(self.root / p.name)}
                        for p in self.master_procs
                    ]
                }  # fmt: skip
                if self.master_procs
                else {}
            ),
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
        procs = [
            p.popen
            for p in [*self.worker_procs, self.master, *self.master_procs]
            if p is not None and p.popen is not None
        ]
        stop_processes(procs)
        if self.etcd is not None:
            self.etcd.stop()
        if self._wrote_manifest:  # never another cluster's
            with contextlib.suppress(FileNotFoundError):
                (self.root / "cluster.json").unlink()
        if self._remembered:
            from pcache.common.credentials import forget_token

            forget_token(",".join(sorted(self._remembered)), self.token)
            if self.tls_dir:
                from pcache.common.credentials import forget_tls

                forget_tls(",".join(sorted(self._remembered)), self.tls_dir)
            self._remembered.clear()

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
