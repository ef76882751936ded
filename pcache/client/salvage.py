"""Salvage: copy out every chunk of a damaged file that some copy still holds intact.

When every replica of a block failed its CRC, the master keeps the copies (quarantined). Each
1 MiB chunk has its own CRC32C in the block file, so a copy with one bad byte still has every
other chunk good: salvage reads chunk by chunk from the good replicas first, then from the
quarantined copies, and writes zeros only where no copy has a chunk that passes its check.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pcache.common.checksum import CHUNK_SIZE, crc32c
from pcache.common.errors import CorruptBlock, InvalidArgument, NotFound, Timeout, Unavailable
from pcache.common.paths import normalize

if TYPE_CHECKING:
    from pcache.client.core import PCacheClient

SALVAGE_ERRORS = (CorruptBlock, NotFound, Timeout, Unavailable)


@dataclass
class SalvageResult:
    """What a salvage wrote."""

    size: int
    """Bytes written (the file's size)."""
    lost: list[tuple[int, int]] = field(default_factory=list)
    """(offset, length) ranges in bytes that no copy could supply: zeros in the output."""

    @property
    def lost_bytes(self) -> int:
        return sum(n for _, n in self.lost)


async def salvage(client: PCacheClient, path: str, dest: str) -> SalvageResult:
    """Write the readable content of ``path`` to the local file ``dest``.

    Each 1 MiB chunk comes from the first copy whose worker finds it matching its CRC32C; when
    a block still lacks chunks (the copies' CRC records may be what is damaged), a copy whose
    unchecked bytes match the block's CRC32C as committed is taken whole.

    Raises:
        NotFound: no such file. IsADirectory: a directory. OSError: ``dest`` cannot be written.
        InvalidArgument: ``dest`` is inside a PCache mount.
    """
    path = normalize(path)
    layout = await client.master.layout(path=path)
    report = await client.master.fsck(path)
    quarantined = {d.index: list(d.quarantined) for d in report.damaged if d.path == path}
    size, block_size = layout.inode.size, layout.inode.block_size
    _refuse_pcache_mount(dest)
    result = SalvageResult(size=size)
    tmp = f"{dest}.salvage-{os.getpid()}"
    with open(tmp, "wb") as out:
        for index, loc in enumerate(layout.blocks):
            start = index * block_size
            extent = min(block_size, size - start)
            holders = list(loc.replicas) + quarantined.get(index, [])
            token = loc.token  # the master signs it for the good and the quarantined holders
            chunks: list[bytes | bytearray | None] = []
            for offset in range(0, loc.length if loc.block_id else 0, CHUNK_SIZE):
                chunks.append(
                    await _chunk(client, holders, loc.block_id, offset, min(CHUNK_SIZE, loc.length - offset), token)
                )
            if None in chunks:  # maybe the CRC record is what is damaged: the bytes may match the block's CRC
                whole = await _whole(client, holders, loc, token)
                if whole is not None:
                    chunks = [whole[i : i + CHUNK_SIZE] for i in range(0, loc.length, CHUNK_SIZE)]
            for i, chunk in enumerate(chunks):
                if chunk is None:
                    n = min(CHUNK_SIZE, loc.length - i * CHUNK_SIZE)
                    chunk = bytes(n)
                    _add_lost(result.lost, start + i * CHUNK_SIZE, n)
                out.write(chunk)
            stored = loc.length if loc.block_id else 0
            if extent > stored:
                out.write(bytes(extent - stored))  # a hole or a short block: zeros by definition
        out.truncate(size)
    os.replace(tmp, dest)
    return result


async def _chunk(
    client: PCacheClient, holders: list, block_id: int, offset: int, n: int, token: str
) -> bytes | bytearray | None:
    for addr in holders:
        try:
            return await client.data.read(addr, block_id, offset, n, token)  # the worker checks the chunk's CRC
        except SALVAGE_ERRORS:
            continue
    return None


async def _whole(client: PCacheClient, holders: list, loc, token: str) -> bytes | None:
    """A copy whose unchecked bytes match the block's CRC32C as committed (the master's record)."""
    for addr in holders:
        try:
            raw = await client.data.read_raw(addr, loc.block_id, 0, loc.length, token)
        except SALVAGE_ERRORS:
            continue
        if len(raw) == loc.length and crc32c(raw) == loc.crc32c:
            return raw
    return None


def _refuse_pcache_mount(dest: str) -> None:
    """Salvage goes to local disk: into a PCache mount it could replace the damaged file itself
    (and with it the quarantined copies being read)."""
    target = os.path.realpath(os.path.dirname(os.path.abspath(dest)) or ".")
    best, fstype = "", ""
    with contextlib.suppress(OSError), open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) < 3:
                continue
            point = parts[1].replace("\\040", " ")
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, fstype = point, parts[2]
    if fstype.startswith("fuse.pcache"):
        raise InvalidArgument(f"salvage writes to local disk, not into the PCache mount at {best}", path=dest)


def _add_lost(lost: list[tuple[int, int]], offset: int, n: int) -> None:
    if lost and lost[-1][0] + lost[-1][1] == offset:
        lost[-1] = (lost[-1][0], lost[-1][1] + n)
    else:
        lost.append((offset, n))
