"""CRC32C of blocks and of their fixed-size chunks.

A block's integrity record is its whole CRC32C plus one CRC32C per
:data:`CHUNK_SIZE` chunk, so a range read verifies only the chunks it touches
(the HDFS ``.meta`` sidecar idea, with CRC32C as in HDFS and 3FS).
"""

from __future__ import annotations

import crc32c as _crc32c

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
