"""etcd on loopback for tests and local clusters (Debian package ``etcd-server``): one member, or a
cluster of several (a member killed while the others keep a quorum)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pcache.common.errors import NotFound, Timeout
from pcache.common.process import die_with_parent, free_port, stop_process


@dataclass
class Etcd:
    """A running etcd: ``endpoint`` is ``127.0.0.1:PORT`` (client URL without the scheme)."""

    proc: subprocess.Popen
    endpoint: str
    data_dir: Path
    log_path: Path

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s); idempotent."""
        stop_process(self.proc)


def start_etcd(data_dir: Path, *, client_port: int = 0, timeout: float = 30.0) -> Etcd:
    """Start ``etcd`` with its data in ``data_dir`` (log ``data_dir/../etcd.log``) and wait for it.

    ``client_port`` 0 picks a free port (give the old one to restart an etcd where it was).

    Raises:
        NotFound: no ``etcd`` on PATH (``apt-get install etcd-server``).
        Timeout: it did not accept connections within ``timeout`` seconds (it is stopped then).
    """
    return start_etcd_cluster([data_dir], client_ports=[client_port], timeout=timeout)[0]


def start_etcd_cluster(
    data_dirs: list[Path], *, client_ports: list[int] | None = None, timeout: float = 30.0
) -> list[Etcd]:
    """Start one etcd member per directory of ``data_dirs`` (logs next to them), all of one
    cluster, and wait until each accepts connections; their endpoints joined by commas are what
    a client lists (``[master] etcd``).

    Raises:
        NotFound: no ``etcd`` on PATH (``apt-get install etcd-server``).
        Timeout: a member exited or did not accept connections within ``timeout`` seconds (all are
            stopped then).
    """
    exe = shutil.which("etcd")
    if exe is None:
        raise NotFound("etcd is not on PATH: install the Debian package etcd-server (apt-get install etcd-server)")
    clients = [port or free_port() for port in (client_ports or [0] * len(data_dirs))]
    peers = [free_port() for _ in data_dirs]
    names = ["pcache-etcd"] if len(data_dirs) == 1 else [f"pcache-etcd-{i}" for i in range(len(data_dirs))]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, peer in zip(names, peers, strict=True))
    members: list[Etcd] = []
    for data_dir, name, client, peer in zip(data_dirs, names, clients, peers, strict=True):
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path = data_dir.parent / f"{data_dir.name}.log"
        cmd = [
            exe, "--name", name, "--data-dir", str(data_dir), "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster", initial,
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([*die_with_parent(), *cmd], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        members.append(Etcd(proc, f"127.0.0.1:{client}", data_dir, log_path))
    deadline = time.monotonic() + timeout
    try:
        for etcd in members:
            port = int(etcd.endpoint.rpartition(":")[2])
            while True:
                if etcd.proc.poll() is not None:
                    raise Timeout(
                        f"etcd exited with {etcd.proc.returncode}: {etcd.log_path.read_text(errors='replace')[-2000:]}"
                    )
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise Timeout(f"etcd did not answer within {timeout:.0f} s (log: {etcd.log_path})") from None
                    time.sleep(0.1)
    except Timeout:
        for etcd in members:
            etcd.stop()
        raise
    return members
