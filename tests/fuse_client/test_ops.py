"""The mount's operations table driven without a kernel: the moments a kernel makes rare are
made here on purpose.

WRITE hands the operations a view of libfuse's request buffer, which libfuse reuses for the next
request as soon as the call returns: the bytes must be consumed by then.

A short answer to READ is EOF for the kernel: it shrinks the file to it and serves that size to
every reader until the attributes time out (``shared/cases/short_read_through_mount.py``: a
100 MiB file read back as one 32 MiB block, exit 0). A read that fails instead is EIO for the
application. Neither may happen while the file holds the bytes.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import os
import threading
import time
from collections.abc import Iterator

import pytest

import fuse_client.ops as ops_mod
from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.testing.faults import flip_byte, replica_file

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


@pytest.mark.parametrize("size", [128 << 10, MiB], ids=["128k-writes", "1m-writes"])
def test_writes_from_the_reused_request_buffer_keep_their_bytes(shared_cluster, monkeypatch, size: int) -> None:
    """As libfuse does: one buffer for every WRITE, overwritten as soon as each call returns.
    8 MiB blocks: the first is buffered, the second streams to the local worker after its first
    4 MiB, and a streamed range is written again."""
    monkeypatch.setattr(ops_mod, "_caller", lambda: (0, 0))
    block = 8 * MiB
    cfg = ClientConfig(master=shared_cluster.master_address, block_size=block, metadata_ttl=0.0, tune_malloc=False)
    data = os.urandom(2 * block + 12345)
    buf = (ctypes.c_byte * MiB)()

    class FileInfo(ctypes.Structure):
        _fields_ = [("fh", ctypes.c_uint64)]

    with Client(cfg) as client:
        ops = ops_mod.PCacheOperations(client)
        fuse = ops_mod.PCacheFuse.__new__(ops_mod.PCacheFuse)  # the FUSE glue without mounting
        fuse.operations, fuse.encoding, fuse.errors = ops, "utf-8", "surrogateescape"
        fh = ops.create("/zero-copy.bin", 0o644, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        fip = ctypes.pointer(FileInfo(fh))

        def write(offset: int, piece: bytes) -> None:
            ctypes.memmove(buf, piece, len(piece))
            ptr = ctypes.cast(buf, ctypes.POINTER(ctypes.c_byte))
            assert fuse.write(b"/zero-copy.bin", ptr, len(piece), offset, fip) == len(piece)
            ctypes.memset(buf, 0xEE, MiB)  # the next request's bytes

        for off in range(0, len(data), size):
            write(off, data[off : off + size])
            if off == block + 6 * MiB:
                assert ops._handles[fh]._f.slots[1].stream is not None  # streamed, not buffered
        patch = os.urandom(size)
        at = block + 5 * MiB + 100  # inside the streamed range of block 1
        write(at, patch)
        data = data[:at] + patch + data[at + size :]
        ops.flush("/zero-copy.bin", fh)
        ops.release("/zero-copy.bin", fh)
        reader = ops.open("/zero-copy.bin", os.O_RDONLY)
        got = b"".join(ops.read("/zero-copy.bin", MiB, off, reader) for off in range(0, len(data), MiB))
        ops.release("/zero-copy.bin", reader)
    assert len(got) == len(data) and got == data


def test_reads_into_the_reply_buffer_match_reads_everywhere(shared_cluster, monkeypatch) -> None:
    """READ answered in libfuse's buffer (whole chunks straight from the block file on this host)
    gives what ``read`` gives: aligned and unaligned, across blocks, at the end, past it, through
    the file's writer; a chunk that fails its CRC is never answered from the block file."""
    monkeypatch.setattr(ops_mod, "_caller", lambda: (0, 0))
    block = 4 * MiB
    cfg = ClientConfig(master=shared_cluster.master_address, block_size=block, metadata_ttl=0.0, tune_malloc=False)
    data = os.urandom(3 * block + 3 * MiB + 4321)

    class FileInfo(ctypes.Structure):
        _fields_ = [("fh", ctypes.c_uint64)]

    with Client(cfg) as client:
        ops = ops_mod.PCacheOperations(client)
        fuse = ops_mod.PCacheFuse.__new__(ops_mod.PCacheFuse)
        fuse.operations, fuse.encoding, fuse.errors = ops, "utf-8", "surrogateescape"
        writer = write_through(ops, "/into.bin", data)
        buf = (ctypes.c_byte * (2 * MiB))()

        def read(fh: int, offset: int, size: int) -> bytes:
            ctypes.memset(buf, 0xAB, len(buf))
            ptr = ctypes.cast(buf, ctypes.POINTER(ctypes.c_byte))
            n = fuse.read(b"/into.bin", ptr, size, offset, ctypes.pointer(FileInfo(fh)))
            return ctypes.string_at(buf, n)

        cases = [(0, MiB), (MiB, MiB), (block - MiB, 2 * MiB), (block - 4096, MiB), (3 * block, MiB),
                 (len(data) - 4321, MiB), (len(data) - 100, 4096), (len(data) - 1, 1), (12345, 131072)]  # fmt: skip
        for offset, size in cases:  # through the writer (its buffers and streamed blocks)
            assert read(writer, offset, size) == data[offset : offset + size], (offset, size)
        ops.release("/into.bin", writer)
        reader = ops.open("/into.bin", os.O_RDONLY)
        for _ in range(2):  # the second pass: every block's short-circuit descriptor is open
            for offset, size in cases:
                assert read(reader, offset, size) == data[offset : offset + size], (offset, size)
                assert ops.read("/into.bin", size, offset, reader) == data[offset : offset + size]
        ops.release("/into.bin", reader)
    with Client(dataclasses.replace(cfg, short_circuit=False)) as client:  # over TCP: from read units
        ops = ops_mod.PCacheOperations(client)
        fuse.operations = ops
        reader = ops.open("/into.bin", os.O_RDONLY)
        for offset, size in [*cases, *cases[::-1]]:
            assert read(reader, offset, size) == data[offset : offset + size], (offset, size)
        ops.release("/into.bin", reader)
    # a flipped byte in the copy read from first, whose descriptor is open (read into the buffer
    # straight from it): not answered from it, the other copy answers
    with Client(cfg) as client:
        ops = ops_mod.PCacheOperations(client)
        fuse.operations = ops
        reader = ops.open("/into.bin", os.O_RDONLY)
        assert read(reader, block, MiB) == data[block : block + MiB]  # opens the descriptor
        ops.release("/into.bin", reader)
        reader = ops.open("/into.bin", os.O_RDONLY)  # a new handle: no bytes held
        slot = ops._handles[reader]._f.slots[1]
        flip_byte(replica_file(slot.locations[0], slot.block_id), MiB + 5)
        assert read(reader, block + MiB, MiB) == data[block + MiB : block + 2 * MiB]
        ops.release("/into.bin", reader)
