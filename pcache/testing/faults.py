"""Fault injection on a real local cluster's disks, for tests, benchmarks and the main job.

Replica files are found through the master's layout (each worker advertises its short-circuit
socket inside its data directory, so the socket's directory is the worker's ``data_dir``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pcache.proto import pcache_pb2 as pb
from pcache.worker.blockstore import block_file

T = TypeVar("T")


def replica_file(addr: pb.WorkerAddr, block_id: int) -> Path:
    """The file holding ``block_id`` on the worker at ``addr`` (a worker of this machine)."""
    return Path(block_file(str(Path(addr.uds_path).parent), block_id))


def replica_files(layout: pb.FileLayout) -> list[list[Path]]:
    """For each block of a file's layout, the files of its live replicas."""
    return [[replica_file(r, b.block_id) for r in b.replicas] for b in layout.blocks]


def flip_byte(path: Path | str, offset: int) -> None:
    """Invert the byte at ``offset`` of a file in place (an open descriptor of it sees the change)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.25) -> T:
    """Poll ``predicate`` until it returns something true (returned) or ``timeout`` seconds pass.

    Raises:
        AssertionError: it never did; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
