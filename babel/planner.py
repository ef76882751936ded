"""Decide, key by key, what a sync does: copy, skip or delete.

The source and destination listings are merge-joined in key order (both come
sorted out of the job's RocksDB, see :mod:`babel.journal`). The rules, as rclone's
``sync`` (``fs/operations``) but never trusting multipart ETags, which hash the
part layout and not the bytes:

* only in the source: **copy** (``new``);
* sizes differ: **copy** (``size``);
* ``size_only``: **skip**;
* ``ignore_times``: **copy**;
* the destination was copied from an object store (:data:`META_SRC_ETAG`, the source object's
  ETag then) and the source has an ETag of the same kind (:func:`comparable_etags`): **skip** when
  they are equal, else copy (a copy of a copy carries the first file's mtime, which the second
  store's LastModified never equals); ETags of two kinds (a replica in another region uploaded
  whole, this one in parts) say nothing, and the rules below decide;
* ``checksum`` and both sides carry Babel's CRC32C (:data:`META_CRC32C`): copy when they
  differ, else skip;
* otherwise the source mtime Babel stored in the destination (:data:`META_MTIME`,
  the destination's own mtime on file systems) must equal the source's mtime within
  :data:`MODIFY_WINDOW`; an object without it (not written by Babel) is copied (``mtime``);
* only in the destination: **delete** when ``delete`` is on (``extraneous``), else nothing.

S3 listings carry no user metadata, so a destination entry without
:data:`META_MTIME` is fetched with HEAD (``checkers`` of them at a time) before deciding.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from objstore.base import META_CRC32C, META_MTIME, META_SRC_ETAG, ObjectInfo

MODIFY_WINDOW = 1e-3  # seconds: mtimes closer than this are equal (S3 keeps whole seconds, file systems ns)

Action = Literal["copy", "skip", "delete"]


@dataclass(frozen=True)
class Filters:
    """``--include`` / ``--exclude`` glob patterns on keys, rclone style.

    A pattern with a ``/`` matches the whole key (``logs/**``, ``/top.txt`` anchored at the
    root); one without matches the last path element (``*.tmp``). ``*`` does not cross ``/``,
    ``**`` does. Excludes win; when includes are given, a key must match one of them.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_inc", [_compile(p) for p in self.include])
        object.__setattr__(self, "_exc", [_compile(p) for p in self.exclude])

    def admits(self, key: str) -> bool:
        """Whether ``key`` takes part in the sync."""
        if any(match(key) for match in self._exc):  # type: ignore[attr-defined]
            return False
        return not self._inc or any(match(key) for match in self._inc)  # type: ignore[attr-defined]


def _compile(pattern: str):
    if not pattern or pattern == "/":
        raise ValueError(f"empty filter pattern {pattern!r}")
    anchored = "/" in pattern
    body = pattern.lstrip("/")
    parts = re.split(r"(\*\*|\*|\?|\[[^\]]*\])", body)
    regex = ""
    for part in parts:
        if part == "**":
            regex += ".*"
        elif part == "*":
            regex += "[^/]*"
        elif part == "?":
            regex += "[^/]"
        elif part.startswith("[") and part.endswith("]") and len(part) > 2:
            regex += fnmatch.translate(part)[4:-3]  # the class itself, as fnmatch spells it
        else:
            regex += re.escape(part)
    compiled = re.compile(regex + r"\Z", re.DOTALL)
    if anchored:
        return lambda key: compiled.match(key) is not None
    return lambda key: compiled.match(key.rsplit("/", 1)[-1]) is not None


@dataclass(frozen=True)
class Decision:
    """What to do with one key and why (``new``, ``size``, ``mtime``, ``checksum``, ``same``, ...)."""

    action: Action
    reason: str


def stored_mtime(dst: ObjectInfo) -> float | None:
    """The source mtime recorded in a destination object, or None."""
    raw = dst.metadata.get(META_MTIME)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


_MULTIPART_ETAG = re.compile(r"[0-9a-fA-F]{32}-(\d+)")


def comparable_etags(a: str, b: str) -> bool:
    """Whether two ETags of one key can tell versions apart: both single-part (an MD5, or a
    store's own kind), or both multipart with the same part count. A copy recorded from region
    A's object (``…-10``, 10 parts) and the same bytes in region B (one PUT: an MD5) differ
    while the bytes do not: syncing from either replica copied 80 MiB again each time."""
    ma, mb = _MULTIPART_ETAG.fullmatch(a.strip('"')), _MULTIPART_ETAG.fullmatch(b.strip('"'))
    if ma is None or mb is None:
        return ma is None and mb is None
    return ma.group(1) == mb.group(1)


def needs_head(dst: ObjectInfo, *, size_only: bool = False) -> bool:
    """Whether a destination listing entry lacks the metadata :func:`decide` needs (S3: HEAD it)."""
    return not size_only and META_MTIME not in dst.metadata


def needs_source_head(src: ObjectInfo, dst: ObjectInfo) -> bool:
    """Whether :func:`decide` needs the source's own metadata (the mtime Babel carried into it,
    S3: HEAD it): the copy was recorded from an ETag of another kind (another replica), so the
    mtimes decide, and the source's listed LastModified is its upload's, not the file's."""
    copied_from = dst.metadata.get(META_SRC_ETAG)
    return bool(src.etag and copied_from and not comparable_etags(copied_from, src.etag)) and (
        META_MTIME not in src.metadata
    )


def decide(
    src: ObjectInfo, dst: ObjectInfo | None, *, size_only: bool = False, checksum: bool = False,
    ignore_times: bool = False,
) -> Decision:  # fmt: skip
    """Copy or skip a source object given its destination counterpart (see the module rules);
    ``ignore_times`` copies it in every case."""
    if dst is None:
        return Decision("copy", "new")
    if ignore_times:
        return Decision("copy", "--ignore-times")
    if src.size != dst.size:
        return Decision("copy", "size")
    if size_only:
        return Decision("skip", "same size")
    copied_from = dst.metadata.get(META_SRC_ETAG)
    if src.etag and copied_from and comparable_etags(copied_from, src.etag):  # did the object copied change?
        return Decision("skip", "same source ETag") if copied_from == src.etag else Decision("copy", "source ETag")
    if checksum and META_CRC32C in src.metadata and META_CRC32C in dst.metadata:
        same = src.metadata[META_CRC32C].lower() == dst.metadata[META_CRC32C].lower()
        return Decision("skip", "same checksum") if same else Decision("copy", "checksum")
    mtime = stored_mtime(dst)
    if mtime is None:
        return Decision("copy", "no source mtime at destination")
    carried = stored_mtime(src) if src.etag and dst.metadata.get(META_SRC_ETAG) else None  # a copy of a copy's
    if abs(mtime - (carried if carried is not None else src.mtime)) <= MODIFY_WINDOW:
        return Decision("skip", "same size and mtime")
    return Decision("copy", "mtime")


def merge_join(
    src: Iterator[ObjectInfo], dst: Iterator[ObjectInfo]
) -> Iterator[tuple[ObjectInfo | None, ObjectInfo | None]]:
    """Pair two key-sorted listings: (src, dst), (src, None) or (None, dst) per key, in key order."""
    s = next(src, None)
    d = next(dst, None)
    while s is not None or d is not None:
        if d is None or (s is not None and s.key < d.key):
            yield s, None
            s = next(src, None)
        elif s is None or d.key < s.key:
            yield None, d
            d = next(dst, None)
        else:
            yield s, d
            s = next(src, None)
            d = next(dst, None)
