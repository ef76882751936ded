"""Wire constants of a file's layout, shared by the master, the client and the config bounds.

A file is a list of blocks of ``block_size`` bytes each (the last one shorter); a block id of
``HOLE`` stands for a never-written, all-zero block that stores nothing.
"""

from __future__ import annotations

from pcache.common.errors import FileTooLarge

HOLE = 0
"""Block id of a never-written block: reads as zeros, stores nothing."""
MIN_BLOCK_SIZE = 64 << 10
"""Smallest block size in bytes (64 KiB)."""
MAX_BLOCK_SIZE = 1 << 30
"""Largest block size in bytes (1 GiB)."""
MAX_REPLICATION = 16
"""Most replicas a block may have."""
MAX_FILE_SIZE = 1 << 42
"""Largest file in bytes (4 TiB)."""
MAX_FILE_BLOCKS = 1 << 17
"""Most blocks (holes included) one file may have: 4 TiB at the default 32 MiB block size. Every
open lists a file's blocks, and the master builds that list on its event loop: without a bound
one tenant's sparse file of tiny blocks stalled the master for every tenant."""


def max_file_size(block_size: int) -> int:
    """The largest file in bytes with blocks of ``block_size`` bytes: :data:`MAX_FILE_SIZE`, or
    fewer bytes when :data:`MAX_FILE_BLOCKS` such blocks hold less."""
    return min(MAX_FILE_SIZE, MAX_FILE_BLOCKS * block_size)


def check_file_size(size: int, block_size: int, path: str = "") -> None:
    """Refuse a file size over :func:`max_file_size`.

    Raises:
        FileTooLarge: ``size`` bytes do not fit (EFBIG), naming the limit and why.
    """
    limit = max_file_size(block_size)
    if size > limit:
        why = (
            f"at most {MAX_FILE_BLOCKS} blocks of {block_size} bytes: use a larger block size"
            if limit < MAX_FILE_SIZE
            else "4 TiB"
        )
        raise FileTooLarge(f"{size} bytes is over the {limit} byte file size limit ({why})", path=path)
