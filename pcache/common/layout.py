"""Wire constants of a file's layout, shared by the master, the client and the config bounds.

A file is a list of blocks of ``block_size`` bytes each (the last one shorter); a block id of
``HOLE`` stands for a never-written, all-zero block that stores nothing.
"""

from __future__ import annotations

HOLE = 0
"""Block id of a never-written block: reads as zeros, stores nothing."""
MIN_BLOCK_SIZE = 64 << 10
"""Smallest block size in bytes (64 KiB)."""
MAX_BLOCK_SIZE = 1 << 30
"""Largest block size in bytes (1 GiB)."""
MAX_REPLICATION = 16
"""Most replicas a block may have."""
