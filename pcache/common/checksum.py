"""CRC32C of blocks and of their fixed-size chunks.

A block's integrity record is its whole CRC32C plus one CRC32C per
:data:`CHUNK_SIZE` chunk, so a range read verifies only the chunks it touches
(the HDFS ``.meta`` sidecar idea, with CRC32C as in HDFS and 3FS).
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c as _crc32c

from pcache.common.errors import CorruptBlock

CHUNK_SIZE = 1024 * 1024
"""Bytes covered by one chunk checksum."""


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data``, continuing from ``value``."""
    return _crc32c.crc32c(data, value)


def chunk_crcs(data: bytes | bytearray | memoryview) -> tuple[list[int], int]:
    """Per-chunk CRC32Cs and the whole-block CRC32C of ``data``.

    Returns:
        (one CRC per CHUNK_SIZE chunk, the last one possibly short; the CRC of all bytes)
    """
    view = memoryview(data)
    crcs: list[int] = []
    whole = 0
    for start in range(0, len(view), CHUNK_SIZE):
        piece = view[start : start + CHUNK_SIZE]
        crcs.append(_crc32c.crc32c(piece))
        whole = _crc32c.crc32c(piece, whole)
    return crcs, whole


def verify_chunks(block_id: int, data: bytes | bytearray | memoryview, first: int, chunk_crcs: Sequence[int]) -> None:
    """Check ``data``, the chunks ``first, first+1, ...`` of a block, against the block's chunk CRCs.

    Raises:
        CorruptBlock: a chunk does not match (the message names the block and the chunk).
    """
    view = memoryview(data)
    for i, start in enumerate(range(0, len(view), CHUNK_SIZE)):
        if _crc32c.crc32c(view[start : start + CHUNK_SIZE]) != chunk_crcs[first + i]:
            raise CorruptBlock(f"block {block_id}: chunk {first + i} failed its CRC32C check")


class RunningCrc:
    """The whole CRC32C and the per-chunk CRC32Cs of a block written front to back in pieces of
    any size (the receiving worker's, and a short-circuit writer's as it streams)."""

    def __init__(self) -> None:
        self.length = 0
        self.crc = 0
        self.full: list[int] = []  # CRCs of the chunks completed so far
        self._partial = 0  # CRC of the current, not yet full chunk
        self._partial_len = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Account the next ``data`` bytes of the block."""
        view = memoryview(data).cast("B")
        self.length += len(view)
        self.crc = _crc32c.crc32c(view, self.crc)
        while view:
            take = min(CHUNK_SIZE - self._partial_len, len(view))
            self._partial = _crc32c.crc32c(view[:take], self._partial)
            self._partial_len += take
            view = view[take:]
            if self._partial_len == CHUNK_SIZE:
                self.full.append(self._partial)
                self._partial = self._partial_len = 0

    def chunk_crcs(self) -> list[int]:
        """One CRC per chunk so far, the last one possibly of a short chunk."""
        return self.full + [self._partial] if self._partial_len else list(self.full)
