"""The object-store contract every backend implements (async), for Babel and PCache's under storage.

Keys are ``/``-separated strings relative to the URI's prefix. Listing
follows S3 ListObjectsV2: keys in byte order, ``start_after`` (exclusive),
an optional ``delimiter`` that folds deeper keys into common prefixes, and
pages of at most ``max_keys`` entries.

Large objects are written as multipart uploads (S3 CreateMultipartUpload /
UploadPart / CompleteMultipartUpload): parts of ``part_size`` bytes, numbered
from 1, the last one shorter, uploaded in any order and concurrently. Stores
without native multipart (``file://``, ``pcache://``) write parts at their
offsets into a hidden temporary file that ``complete_multipart`` publishes by
rename.

Babel keeps its own facts about an object in user metadata (S3
``x-amz-meta-*``; mtime and an extended attribute on file systems):
:data:`META_MTIME` (the source's mtime, seconds since the epoch; carried over every hop, so a
copy of a copy keeps the original file's), :data:`META_CRC32C` (the CRC32C of the whole object, 8
hex digits) and, on object stores, :data:`META_SRC_ETAG` (the ETag of the source object it was
copied from: what tells a later sync from the same store that the source did not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

META_MTIME = "babel-mtime"
META_CRC32C = "babel-crc32c"
META_SRC_ETAG = "babel-src-etag"

MiB = 1 << 20
GiB = 1 << 30


def object_uri(store_uri: str, key: str) -> str:
    """The URI naming object ``key`` of the store at ``store_uri`` (one ``/`` between them, and
    the key before the store's options: ``s3://b/p/KEY?endpoint_url=...``, not after the last
    option's value, where it read as part of it), for messages."""
    base, sep, query = store_uri.partition("?")
    return f"{base.rstrip('/')}/{key}" + (f"?{query}" if sep else "")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object: ``size`` in bytes, ``mtime`` in seconds since the epoch (slots: a listing
    holds many in flight, ~100 bytes less each).

    ``checksums`` are the store's own checksums of the whole object, by algorithm
    (``{"crc64ecma": "1234..."}`` on OSS), when the store reports them.
    """

    key: str
    size: int
    mtime: float
    etag: str = ""
    metadata: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    checksums: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ListPage:
    """One ListObjectsV2-style page; ``truncated`` means more keys follow the last one."""

    objects: list[ObjectInfo]
    prefixes: list[str]
    truncated: bool


@dataclass(frozen=True)
class PartInfo:
    """One uploaded part: its 1-based ``number``, ``size`` in bytes, ETag and store checksums."""

    number: int
    size: int
    etag: str = ""
    checksums: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreLimits:
    """What a store accepts: part sizes in bytes and the most parts per object (S3's by default)."""

    min_part_size: int = 5 * MiB
    max_part_size: int = 5 * GiB
    max_parts: int = 10_000
    resumable_uploads: bool = True  # parts of an unfinished upload survive the uploader's death


class ObjectStore(Protocol):
    """What Babel and PCache's under storage need from a storage system."""

    uri: str
    limits: StoreLimits

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        """List keys under ``prefix`` after ``start_after`` (one page)."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Return an object's size, mtime, ETag, user metadata and store checksums."""
        ...

    async def get(self, key: str, offset: int = 0, length: int | None = None, *, if_match: str = "") -> bytes:
        """Read an object's bytes (a range when ``length`` is given). ``if_match``: only from the
        version with this ETag, else :class:`~objstore.errors.PreconditionFailed` (stores without
        ETags, ``file://``, ignore it: their callers compare size and mtime)."""
        ...

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        """Store a whole object with user metadata."""
        ...

    async def create_multipart(self, key: str, size: int, part_size: int, metadata: dict[str, str]) -> str:
        """Start a multipart upload of ``size`` bytes in parts of ``part_size``; return its upload id."""
        ...

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
        """Upload part ``number`` (1-based) of an upload."""
        ...

    async def complete_multipart(self, key: str, upload_id: str, parts: list[PartInfo]) -> ObjectInfo:
        """Publish the object from its parts (in part-number order)."""
        ...

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts (an unknown upload is not an error)."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete objects (missing keys are not an error)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


async def delete_if(store: ObjectStore, key: str, etag: str) -> bool:
    """Delete ``key`` only while the store holds the version whose ETag is ``etag`` (quotes
    ignored); True when it was deleted or is gone, False when the store holds another version
    (written after it: left alone).

    A store with its own ``delete_if`` does it in one conditional request (S3's ``If-Match`` on
    DeleteObject, RFC 7232); the others HEAD the key and delete on a match, which a write landing
    between the two can still lose. Source of the need: a PCache leader deposed while its
    DELETE was in flight must not remove the object its successor wrote since (a fencing token
    the store checks; Kleppmann, "How to do distributed locking").

    Raises:
        StoreError (and subclasses) as :meth:`ObjectStore.delete` and :meth:`ObjectStore.head`.
    """
    own = getattr(store, "delete_if", None)
    if own is not None:
        return await own(key, etag)
    return await delete_after_head(store, key, etag)


async def delete_after_head(store: ObjectStore, key: str, etag: str) -> bool:
    """:func:`delete_if` for a store without conditional deletes: HEAD, then delete on a match."""
    from objstore.errors import NoSuchKey

    try:
        info = await store.head(key)
    except NoSuchKey:
        return True
    if info.etag.strip('"') != etag.strip('"'):
        return False
    await store.delete([key])
    return True
