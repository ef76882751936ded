"""A single-member etcd on loopback for tests and local clusters (Debian package ``etcd-server``)."""

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
    exe = shutil.which("etcd")
    if exe is None:
        raise NotFound("etcd is not on PATH: install the Debian package etcd-server (apt-get install etcd-server)")
    data_dir.mkdir(parents=True, exist_ok=True)
    client, peer = client_port or free_port(), free_port()
    log_path = data_dir.parent / f"{data_dir.name}.log"
    cmd = [
        exe, "--name", "pcache-etcd", "--data-dir", str(data_dir),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"pcache-etcd=http://127.0.0.1:{peer}",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([*die_with_parent(), *cmd], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    etcd = Etcd(proc, f"127.0.0.1:{client}", data_dir, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Timeout(f"etcd exited with {proc.returncode}: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", client), timeout=1).close()
            return etcd
        except OSError:
            time.sleep(0.1)
    etcd.stop()
    raise Timeout(f"etcd did not answer within {timeout:.0f} s (log: {log_path})")
