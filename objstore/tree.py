"""Directory trees as object stores: what ``file://`` and ``pcache://`` share.

A key is a file path relative to the store's root directory. Listing walks the
tree in S3 key order: a directory sorts as ``name/``, so ``dir-1.txt`` comes
before ``dir/a`` although ``dir`` < ``dir-1.txt``. The walk prunes subtrees that
lie entirely at or before ``start_after`` or before ``prefix``, folds
subdirectories into common prefixes when the ``/`` delimiter is given (without
descending into them), and stops at the first key past ``prefix``.

The walk is written once, free of I/O (as h11 or hyper-h2 are): :func:`plan_page`
is a generator that *yields requests* (:class:`ReadDir`, :class:`StatFiles`),
receives their answers and returns the :class:`ListPage`. :func:`run_plan` answers
them with blocking calls (``file://`` runs a whole page in one worker thread) and
:func:`run_plan_async` with coroutines (``pcache://`` answers each with RPCs).

Babel's own names are never listed: temporary files of uploads in progress
(``.NAME.babel-<16 hex>``, see :func:`temp_name`) and ``*.babel-part`` left by
older versions of ``put``.

Object metadata on file systems: :data:`META_MTIME` is the file's own mtime
(:func:`format_mtime_ns`, nanoseconds exact) and :data:`META_CRC32C` the extended
attribute :data:`XATTR_CRC32C`.
"""

from __future__ import annotations

import bisect
import re
import secrets
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from objstore.base import META_CRC32C, META_MTIME, META_SRC_ETAG, ListPage, ObjectInfo, PartInfo
from objstore.errors import BadURI, StoreError

XATTR_CRC32C = "user.babel-crc32c"
"""Extended attribute holding :data:`~objstore.base.META_CRC32C` (8 hex digits, ASCII)."""
XATTR_SRC_ETAG = "user.babel-src-etag"
"""Extended attribute holding :data:`~objstore.base.META_SRC_ETAG` (a copy of an object-store object)."""

STAT_BATCH = 1000  # most files one StatFiles request asks about
DIR_CACHE_ENTRIES = 4096

_TEMP = re.compile(r"\..*\.babel-[0-9a-f]{16}", re.DOTALL)
_TOKEN = re.compile(r"[0-9a-f]{16}")
_NAME_BUDGET = 255 - len(".") - len(".babel-") - 16  # NAME_MAX minus the temp decoration

Entries = Sequence[tuple[str, bool]]  # sorted (name, or name + "/" for a directory; is_dir)

# ----------------------------------------------------------------- names --


def check_key(key: str, uri: str) -> str:
    """Return ``key`` if it can be a relative file path, else raise.

    Raises:
        BadURI: empty, absolute, NUL, a trailing ``/`` (S3 folder marker), or a ``.``, ``..``
            or empty component (``a//b`` would name the same file as ``a/b``).
    """
    if not key or key.startswith("/") or "\x00" in key or any(p in ("", ".", "..") for p in key.split("/")):
        raise BadURI(f"key {key!r} cannot be a file path", uri=uri)
    return key


def new_token() -> str:
    """A fresh 16-hex-digit token naming one temporary file."""
    return secrets.token_hex(8)


def is_token(text: str) -> bool:
    """Whether ``text`` is a token :func:`new_token` makes (no path can hide in one)."""
    return _TOKEN.fullmatch(text) is not None


def file_in_the_way(where: str, root: str, uri: str) -> StoreError:
    """The error of a destination that is a file (``where == root``) or lies under one
    (``where``, its nearest existing ancestor): one fatal line, not a failure per object."""
    what = "the destination is a file" if where == root else f"{where} (above the destination) is a file"
    return StoreError(f"{what}, not a directory: nothing can be copied into it", uri=uri)


def temp_name(name: str, token: str) -> str:
    """The hidden temporary sibling ``.NAME.babel-TOKEN`` that an upload of ``name`` writes.

    ``name`` is shortened (by UTF-8 bytes) to keep the result within NAME_MAX.
    """
    short = name.encode("utf-8", "surrogateescape")[:_NAME_BUDGET].decode("utf-8", "ignore")
    return f".{short}.babel-{token}"


def is_temp_of(candidate: str, name: str) -> bool:
    """Whether ``candidate`` is a temporary file of an upload of ``name`` (:func:`temp_name`)."""
    return candidate.startswith(temp_name(name, "")) and _TEMP.fullmatch(candidate) is not None


def is_temp_name(name: str) -> bool:
    """Whether a file name is one of Babel's temporary files (never listed)."""
    return name.endswith(".babel-part") or (name.startswith(".") and _TEMP.fullmatch(name) is not None)


# ------------------------------------------------------------- multipart --


def part_range(size: int, part_size: int, number: int) -> tuple[int, int]:
    """(offset, length) in bytes of part ``number`` (1-based) of an object; length 0 past the end."""
    offset = (number - 1) * part_size
    return offset, max(0, min(part_size, size - offset))


def check_parts(size: int, part_size: int, parts: Sequence[PartInfo], uri: str) -> None:
    """Raise unless ``parts`` are exactly the parts of a ``size``-byte object, each of its size.

    Raises:
        StoreError: a part missing, repeated, extra or of the wrong size.
    """
    count = -(-size // part_size)
    numbers = sorted(p.number for p in parts)
    if numbers != list(range(1, count + 1)):
        raise StoreError(f"upload needs parts 1..{count}, got {len(numbers)} parts", uri=uri)
    for part in parts:
        want = part_range(size, part_size, part.number)[1]
        if part.size != want:
            raise StoreError(f"part {part.number} has {part.size} bytes, not {want}", uri=uri)
    if sum(p.size for p in parts) != size:
        raise StoreError(f"parts sum to {sum(p.size for p in parts)} bytes, not {size}", uri=uri)


# -------------------------------------------------------------- metadata --


def _mtime(text: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation as exc:
        raise StoreError(f"bad {META_MTIME} {text!r}: not a number") from exc
    if not value.is_finite():
        raise StoreError(f"bad {META_MTIME} {text!r}: not finite")
    return value


def parse_mtime_ns(text: str) -> int:
    """Nanoseconds since the epoch of a :data:`META_MTIME` value (decimal seconds; ``repr(float)`` too).

    Raises:
        StoreError: not a finite number.
    """
    return int(_mtime(text).scaleb(9).to_integral_value())  # round half even to whole ns


def parse_mtime(text: str) -> float:
    """Seconds since the epoch of a :data:`META_MTIME` value: the double nearest to it, so
    ``parse_mtime(repr(x)) == x``.

    Raises:
        StoreError: not a finite number.
    """
    return float(_mtime(text))


def format_mtime_ns(ns: int) -> str:
    """``SECONDS.NNNNNNNNN``: exact, so ``parse_mtime_ns(format_mtime_ns(ns)) == ns``."""
    sign = "-" if ns < 0 else ""
    sec, frac = divmod(abs(ns), 10**9)
    return f"{sign}{sec}.{frac:09d}"


def file_metadata(mtime: str, crc: bytes | str | None, src_etag: bytes | str | None = None) -> dict[str, str]:
    """The user metadata of a file: its mtime and, when their xattrs are there, the CRC32C and
    the ETag of the object it was copied from."""
    meta = {META_MTIME: mtime}
    for name, value in ((META_CRC32C, crc), (META_SRC_ETAG, src_etag)):
        if value:
            meta[name] = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return meta


# ------------------------------------------------------ directory cache --


class DirCache:
    """Sorted entries of directories, valid while the directory's ``version`` is unchanged.

    Paging through a flat directory of N files would otherwise rescan and re-sort all N
    entries for every page of 1000. ``version`` is whatever changes when an entry is added,
    removed or renamed (the directory's mtime, with its inode).
    """

    def __init__(self, max_entries: int = DIR_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self._dirs: dict[str, tuple[Any, Entries]] = {}

    def get(self, path: str, version: Any) -> Entries | None:
        """The cached entries of ``path`` if they were read at ``version``."""
        cached = self._dirs.get(path)
        return cached[1] if cached is not None and cached[0] == version else None

    def put(self, path: str, version: Any, entries: Entries) -> None:
        """Remember ``entries`` of ``path`` as read at ``version``."""
        if len(self._dirs) >= self.max_entries:
            self._dirs.clear()
        self._dirs[path] = (version, entries)


def sort_entries(entries: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """(name, is_dir) pairs in S3 key order: a directory's name gets its ``/``."""
    return sorted((name + "/", True) if is_dir else (name, False) for name, is_dir in entries)


# --------------------------------------------------------------- the walk --


@dataclass(frozen=True)
class ReadDir:
    """Request: the entries of directory ``rel`` (``""`` or ending in ``/``), sorted as
    :func:`sort_entries` does; empty when it does not exist. Answer: :data:`Entries`."""

    rel: str


@dataclass(frozen=True)
class StatFiles:
    """Request: fresh :class:`ObjectInfo` (key ``rel + name``, with metadata) of files in
    directory ``rel``, ``names`` in key order. Answer: one ``ObjectInfo | None`` per name, None
    for a file that is gone or is no regular file."""

    rel: str
    names: tuple[str, ...]


Request = ReadDir | StatFiles
Plan = Generator[Request, Any, ListPage]


@dataclass
class _Frame:
    """One directory on the walk's stack."""

    rel: str
    entries: Entries
    pos: int
    infos: dict[str, ObjectInfo | None] = field(default_factory=dict)


def _first(entries: Entries, rel: str, floor: str) -> int:
    """Index of the first entry of ``rel`` that can sort after ``floor`` (a key)."""
    if not floor.startswith(rel):
        return 0
    rest = floor[len(rel) :]
    probe = rest[: rest.find("/") + 1] if "/" in rest else rest
    return max(0, bisect.bisect_left(entries, (probe, False)) - 1)


def check_delimiter(delimiter: str | None, uri: str) -> None:
    """Raise BadURI unless ``delimiter`` is none or ``/`` (directories fold only at ``/``)."""
    if delimiter not in (None, "", "/"):
        raise BadURI(f"directory trees support only the '/' delimiter, not {delimiter!r}", uri=uri)


def plan_page(prefix: str, delimiter: str | None, start_after: str, max_keys: int) -> Plan:
    """Yield the I/O requests that list one ListObjectsV2 page of a tree; return the page.

    Semantics as S3's: keys under ``prefix`` after ``start_after`` in key order; with the
    ``/`` delimiter, subdirectories become common prefixes (a folded prefix at or before
    ``start_after`` is not repeated); at most ``max_keys`` entries. ``truncated`` is set as
    soon as a page is full (the next page may then be empty).
    """
    folding = delimiter == "/"
    floor = max(start_after, prefix)
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    base = prefix[: prefix.rfind("/") + 1]  # the directory the prefix points into
    entries = yield ReadDir(base)
    stack = [_Frame(base, entries, _first(entries, base, floor))]
    while stack:
        frame = stack[-1]
        if frame.pos >= len(frame.entries):
            stack.pop()
            continue
        name, is_dir = frame.entries[frame.pos]
        frame.pos += 1
        key = frame.rel + name
        if not key.startswith(prefix):
            if key > prefix:
                break  # key order: nothing further can match
            continue
        if is_dir:
            if key <= start_after and (folding or not start_after.startswith(key)):
                continue  # the whole subtree lies at or before start_after
            if folding:
                prefixes.append(key)
            else:
                entries = yield ReadDir(key)
                stack.append(_Frame(key, entries, _first(entries, key, floor)))
                continue
        else:
            if key <= start_after or is_temp_name(name):
                continue
            if name not in frame.infos:
                want = min(STAT_BATCH, max(1, max_keys - len(objects) - len(prefixes)))
                names = [name]
                for i in range(frame.pos, len(frame.entries)):
                    more, more_is_dir = frame.entries[i]
                    if more_is_dir or len(names) >= want or not (frame.rel + more).startswith(prefix):
                        break
                    if not is_temp_name(more):
                        names.append(more)
                infos = yield StatFiles(frame.rel, tuple(names))
                frame.infos = dict(zip(names, infos, strict=True))
            info = frame.infos.pop(name)
            if info is None:
                continue
            objects.append(info)
        if len(objects) + len(prefixes) >= max_keys:
            return ListPage(objects, prefixes, truncated=True)
    return ListPage(objects, prefixes, truncated=False)


def run_plan(
    plan: Plan,
    read_dir: Callable[[str], Entries],
    stat_files: Callable[[str, Sequence[str]], Sequence[ObjectInfo | None]],
) -> ListPage:
    """Drive ``plan`` with blocking calls; return its page."""
    try:
        request = next(plan)
        while True:
            if isinstance(request, ReadDir):
                answer: Any = read_dir(request.rel)
            else:
                answer = stat_files(request.rel, request.names)
            request = plan.send(answer)
    except StopIteration as done:
        return done.value
    finally:
        plan.close()


async def run_plan_async(
    plan: Plan,
    read_dir: Callable[[str], Awaitable[Entries]],
    stat_files: Callable[[str, Sequence[str]], Awaitable[Sequence[ObjectInfo | None]]],
) -> ListPage:
    """Drive ``plan`` with coroutines; return its page."""
    try:
        request = next(plan)
        while True:
            if isinstance(request, ReadDir):
                answer: Any = await read_dir(request.rel)
            else:
                answer = await stat_files(request.rel, request.names)
            request = plan.send(answer)
    except StopIteration as done:
        return done.value
    finally:
        plan.close()
