"""The mount's READ answers, driven on its operations table (no kernel): the moments a kernel
makes rare are made here on purpose.

A short answer to READ is EOF for the kernel: it shrinks the file to it and serves that size to
every reader until the attributes time out (``shared/cases/short_read_through_mount.py``: a
100 MiB file read back as one 32 MiB block, exit 0). A read that fails instead is EIO for the
application. Neither may happen while the file holds the bytes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest

import fuse_client.ops as ops_mod
from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster

MiB = 1 << 20


@pytest.fixture
def ops(shared_cluster: LocalCluster, monkeypatch) -> Iterator[ops_mod.PCacheOperations]:
    """The operations of a mount (1 MiB blocks, as ``pcache-mount`` configures its client)."""
    monkeypatch.setattr(ops_mod, "_caller", lambda: (0, 0))  # no FUSE request context here
    cfg = ClientConfig(master=shared_cluster.master_address, block_size=MiB, metadata_ttl=0.0, tune_malloc=False)
    with Client(cfg) as client:
        yield ops_mod.PCacheOperations(client)


def write_through(ops: ops_mod.PCacheOperations, path: str, data: bytes) -> int:
    """Create ``path`` and write ``data`` as the kernel does (1 MiB WRITEs, then FLUSH); the
    writer's handle, not released yet."""
    fh = ops.create(path, 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for off in range(0, len(data), MiB):
        ops.write(path, data[off : off + MiB], off, fh)
    ops.flush(path, fh)
    return fh


def test_a_read_through_a_writer_that_is_released_meanwhile_gets_every_byte(ops) -> None:
    """close(2) returns after FLUSH; the kernel sends RELEASE without waiting, and the next open's
    READs go through the writer while it closes. Its close cancelled the read units those READs
    waited for: EIO, or the bytes once the read falls back to the reader's view."""
    data = os.urandom(3 * MiB + 777)
    writer = write_through(ops, "/release-race.bin", data)
    reader = ops.open("/release-race.bin", os.O_RDONLY)
    inner = ops._handles[writer]._f  # the writer's async handle: its block reads are made slow
    fetch = inner._fetch

    async def slow_fetch(idx: int, offset: int, length: int):
        await asyncio.sleep(0.5)
        return await fetch(idx, offset, length)

    inner._fetch = slow_fetch
    got: dict[int, bytes | BaseException] = {}

    def read(offset: int) -> None:
        try:
            got[offset] = ops.read("/release-race.bin", MiB, offset, reader)
        except BaseException as exc:
            got[offset] = exc

    threads = [threading.Thread(target=read, args=(off,)) for off in range(0, len(data), MiB)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # every READ waits in the writer's slow fetch
    assert ops._writer_of_inode(ops._handles[reader].inode) is ops._handles[writer]
    ops.release("/release-race.bin", writer)
    for t in threads:
        t.join(30)
    for off in range(0, len(data), MiB):
        assert got[off] == data[off : off + MiB], (off, got[off] if isinstance(got[off], BaseException) else "bytes")
    ops.release("/release-race.bin", reader)


def test_a_read_past_the_handles_view_takes_the_newer_commit_and_true_eof_costs_nothing(
    ops, shared_cluster, monkeypatch
) -> None:
    """A handle opened at 1 MiB; another client makes the file 3 MiB; the kernel, which learned the
    new size (from getattr, or from another handle here), asks for bytes past 1 MiB. Answered from
    the handle's view that is b"" -- EOF, and the kernel would cut the file to 1 MiB."""
    first = os.urandom(MiB)
    ops.release("/grown.bin", write_through(ops, "/grown.bin", first))
    reader = ops.open("/grown.bin", os.O_RDONLY)
    more = os.urandom(2 * MiB + 5)
    with Client(master=shared_cluster.master_address) as other, other.open("/grown.bin", "ab") as f:
        f.write(more)
    assert ops.read("/grown.bin", MiB, MiB, reader) == more[:MiB]  # not b"": the newer commit
    assert ops.read("/grown.bin", MiB, 3 * MiB - 4096, reader) == (first + more)[3 * MiB - 4096 :]

    refreshes = []
    handle = ops._handles[reader]
    monkeypatch.setattr(handle, "refresh", lambda: refreshes.append(1) or False)
    # the true EOF: the kernel asks up to its size rounded up to a page, and nothing is re-read
    assert ops.read("/grown.bin", 4096, 3 * MiB, reader) == more[-5:]
    assert refreshes == []
    ops.release("/grown.bin", reader)
