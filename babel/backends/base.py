"""The object-store contract every Babel backend implements (async).

Keys are ``/``-separated strings relative to the URI's prefix. Listing
follows S3 ListObjectsV2: keys in byte order, ``start_after`` (exclusive),
an optional ``delimiter`` that folds deeper keys into common prefixes, and
pages of at most ``max_keys`` entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ObjectInfo:
    """One object: ``size`` in bytes, ``mtime`` in seconds since the epoch."""

    key: str
    size: int
    mtime: float
    etag: str = ""
    metadata: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ListPage:
    """One ListObjectsV2-style page; ``truncated`` means more keys follow the last one."""

    objects: list[ObjectInfo]
    prefixes: list[str]
    truncated: bool


class ObjectStore(Protocol):
    """What Babel needs from a storage system."""

    uri: str

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        """List keys under ``prefix`` after ``start_after`` (one page)."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Return an object's size, mtime, ETag and user metadata."""
        ...

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Read an object's bytes (a range when ``length`` is given)."""
        ...

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        """Store a whole object."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete objects (missing keys are not an error)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
