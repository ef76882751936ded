"""Salvage: copy out every chunk of a damaged file that some copy still holds intact.

When every replica of a block failed its CRC, the master keeps the copies (quarantined). Each
1 MiB chunk has its own CRC32C in the block file, so a copy with one bad byte still has every
other chunk good: salvage reads chunk by chunk from the good replicas first, then from the
quarantined copies, and writes zeros only where no copy has a chunk that passes its check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pcache.common.checksum import CHUNK_SIZE
from pcache.common.errors import CorruptBlock, NotFound, Timeout, Unavailable
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

    Raises:
        NotFound: no such file. IsADirectory: a directory. OSError: ``dest`` cannot be written.
    """
    path = normalize(path)
    layout = await client.master.layout(path=path)
    report = await client.master.fsck(path)
    quarantined = {d.index: list(d.quarantined) for d in report.damaged if d.path == path}
    size, block_size = layout.inode.size, layout.inode.block_size
    result = SalvageResult(size=size)
    tmp = f"{dest}.salvage-{os.getpid()}"
    with open(tmp, "wb") as out:
        for index, loc in enumerate(layout.blocks):
            start = index * block_size
            extent = min(block_size, size - start)
            holders = list(loc.replicas) + quarantined.get(index, [])
            for offset in range(0, loc.length if loc.block_id else 0, CHUNK_SIZE):
                n = min(CHUNK_SIZE, loc.length - offset)
                chunk = await _chunk(client, holders, loc.block_id, offset, n)
                if chunk is None:
                    chunk = bytes(n)
                    _add_lost(result.lost, start + offset, n)
                out.write(chunk)
            stored = loc.length if loc.block_id else 0
            if extent > stored:
                out.write(bytes(extent - stored))  # a hole or a short block: zeros by definition
        out.truncate(size)
    os.replace(tmp, dest)
    return result


async def _chunk(client: PCacheClient, holders: list, block_id: int, offset: int, n: int) -> bytes | None:
    for addr in holders:
        try:
            return await client.data.read(addr, block_id, offset, n)  # the worker checks the chunk's CRC
        except SALVAGE_ERRORS:
            continue
    return None


def _add_lost(lost: list[tuple[int, int]], offset: int, n: int) -> None:
    if lost and lost[-1][0] + lost[-1][1] == offset:
        lost[-1] = (lost[-1][0], lost[-1][1] + n)
    else:
        lost.append((offset, n))
