"""The worker's memory tier: a byte-bounded cache of verified block chunks.

Chunks (:data:`~pcache.common.checksum.CHUNK_SIZE` bytes, keyed by
``(block_id, chunk_index)``) enter on write (write staging: a just-written
block is usually read next, by a replica or a reader) and on a disk read.
Eviction is ``cachetools``' LRU, LFU or FIFO, chosen in the config; a chunk in
the tier was verified when it entered, so hits skip the CRC check.
"""

from __future__ import annotations

from cachetools import Cache, FIFOCache, LFUCache, LRUCache

from pcache.common.errors import InvalidArgument
from pcache.common.metrics import TIER_BYTES, TIER_HIT_RATIO, TIER_HITS, TIER_MISSES

POLICIES: dict[str, type[Cache]] = {"lru": LRUCache, "lfu": LFUCache, "fifo": FIFOCache}


class MemoryTier:
    """Bounded chunk cache; ``capacity`` 0 disables it."""

    def __init__(self, capacity: int, policy: str = "lru") -> None:
        if policy not in POLICIES:
            raise InvalidArgument(f"unknown eviction policy {policy!r} (one of {', '.join(POLICIES)})")
        self.capacity = capacity
        self._cache: Cache | None = POLICIES[policy](maxsize=capacity, getsizeof=len) if capacity > 0 else None
        self._chunks: dict[int, set[int]] = {}  # block -> chunk indexes possibly cached
        self.hits = 0
        self.misses = 0

    def get(self, block_id: int, index: int) -> bytes | None:
        """Return a cached chunk, counting the hit or miss."""
        data = self._cache.get((block_id, index)) if self._cache is not None else None
        if data is None:
            self.misses += 1
            TIER_MISSES.inc()
        else:
            self.hits += 1
            TIER_HITS.inc()
        total = self.hits + self.misses
        TIER_HIT_RATIO.set(self.hits / total if total else 0.0)
        return data

    def put(self, block_id: int, index: int, data: bytes) -> None:
        """Cache one verified chunk (ignored when larger than the tier)."""
        if self._cache is None or len(data) > self.capacity:
            return
        self._cache[(block_id, index)] = data
        self._chunks.setdefault(block_id, set()).add(index)
        TIER_BYTES.set(self._cache.currsize)

    def drop(self, block_id: int) -> None:
        """Forget every chunk of a block (deleted or found corrupt)."""
        if self._cache is None:
            return
        for index in self._chunks.pop(block_id, ()):
            self._cache.pop((block_id, index), None)
        TIER_BYTES.set(self._cache.currsize)

    @property
    def size(self) -> int:
        """Bytes held now."""
        return int(self._cache.currsize) if self._cache is not None else 0

    @property
    def hit_ratio(self) -> float:
        """Hits / lookups since start."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
