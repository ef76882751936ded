"""Sync options: the one definition of what ``babel sync`` accepts, for the CLI and the daemon.

:class:`SyncOptions` holds the flags; :meth:`SyncOptions.check` applies :data:`RULES` (types and
bounds, one rule per field) and :func:`options_from_dict` builds options from their JSON form
(the daemon's ``options`` object), so a value the CLI refuses is refused by the daemon too.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from babel.errors import BabelError
from babel.planner import Filters
from babel.transfer import DEFAULT_THRESHOLD
from objstore.base import MiB
from pcache.common.cli import human_bytes
from pcache.common.config import parse_size
from pcache.common.errors import InvalidArgument

VerifyMode = Literal["none", "sample", "full"]

# Inclusive bounds of the integer options; the CLI's flags show them (click.IntRange).
CONCURRENCY = (1, 1024)  # checkers, transfers, list_concurrency
SAMPLES = (2, 100_000)
MIN_PART_SIZE = MiB  # --part-size
MIN_MEMORY = MiB  # --memory
MAX_PART_SIZE = 5 << 30  # S3's largest part
MAX_SIZE = 1 << 62  # any byte count or rate (bytes/s)
SIZE_FIELDS = ("multipart_threshold", "part_size", "memory", "sample_size", "bwlimit")  # take "64M" too


class BadOption(BabelError, ValueError):
    """A sync option with a value of the wrong type or out of bounds.

    ``field`` names it ("" for the options as a whole), ``reason`` says what is wrong; the message
    is both (``checkers must be an integer >= 1 and <= 1024``).
    """

    errno_code = errno.EINVAL

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}" if field else reason)
        self.field = field
        self.reason = reason


@dataclass
class SyncOptions:
    """How a sync runs (the ``babel sync`` flags)."""

    include: tuple[str, ...] = ()
    """Glob patterns of keys to sync (default: all); see :class:`babel.planner.Filters`."""
    exclude: tuple[str, ...] = ()
    """Glob patterns of keys to leave alone (they are neither copied nor deleted)."""
    dry_run: bool = False
    """Plan and report, change nothing."""
    delete: bool = False
    """Delete destination objects that are not in the source (after all copies succeed)."""
    max_delete: int = -1
    """Refuse to delete anything when more than this many deletions are planned (-1: no limit)."""
    checkers: int = 16
    """HEAD requests in flight while planning and objects verified at once."""
    transfers: int = 16
    """Units (small objects or parts) copied at once."""
    list_concurrency: int = 32
    """ListObjectsV2 calls in flight per side."""
    bwlimit: float | None = None
    """Bytes per second over all transfers (None: unlimited)."""
    verify: VerifyMode = "sample"
    """Content check after copying: none, sample (head, tail and strided 1 MiB ranges) or full."""
    size_only: bool = False
    """Skip objects whose sizes match (no mtime or checksum comparison)."""
    checksum: bool = False
    """Compare Babel's stored CRC32C instead of mtimes where both sides have one."""
    ignore_times: bool = False
    """Copy every object, even one whose size and mtime match (``rclone --ignore-times``): how
    an object that ``babel verify`` found corrupt is repaired."""
    multipart_threshold: int = DEFAULT_THRESHOLD
    """Objects of at least this many bytes are copied as multipart uploads."""
    part_size: int | None = None
    """Fixed multipart part size in bytes (None: chosen from the object size)."""
    memory: int = 512 * MiB
    """Bytes of object data held in memory at once."""
    samples: int = 32
    """Sampled ranges per object in sample verification (head and tail included)."""
    sample_size: int = MiB
    """Bytes per sampled range."""

    def check(self) -> SyncOptions:
        """Return ``self`` once every field holds a value a sync can run with (see :data:`RULES`).

        Raises:
            BadOption: the first field that does not, named in ``field``.
        """
        for name, rule in RULES.items():
            try:
                rule(getattr(self, name))
            except ValueError as exc:
                raise BadOption(name, str(exc)) from exc
        if self.ignore_times and (self.size_only or self.checksum):
            other = "size_only" if self.size_only else "checksum"
            raise BadOption("ignore_times", f"copies every object: it cannot be combined with {other}")
        for name in ("include", "exclude"):
            try:
                Filters(**{name: tuple(getattr(self, name))})
            except ValueError as exc:
                raise BadOption(name, f"has a bad pattern: {exc}") from exc
        return self

    def filters(self) -> Filters:
        """The include/exclude filters."""
        return Filters(tuple(self.include), tuple(self.exclude))


def _int(low: int, high: int | None = None) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise ValueError(f"must be an integer >= {low}" + (f" and <= {high}" if high is not None else ""))

    return check


def _bytes(low: int, high: int = MAX_SIZE) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError('must be a whole number of bytes (67108864) or a size ("64M")')
        if not low <= value <= high:
            raise ValueError(f"must be at least {human_bytes(low)} and at most {human_bytes(high)}")

    return check


def _optional(check: Callable[[Any], None]) -> Callable[[Any], None]:
    def optional(value: Any) -> None:
        if value is not None:
            check(value)

    return optional


def _positive(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < MAX_SIZE:
        raise ValueError("must be a finite number > 0")


def _bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")


def _patterns(value: Any) -> None:
    if not isinstance(value, tuple | list) or not all(isinstance(p, str) for p in value):
        raise ValueError("must be a list of glob patterns")


def _verify_mode(value: Any) -> None:
    if value not in get_args(VerifyMode):
        raise ValueError(f"must be one of {', '.join(get_args(VerifyMode))}")


#: One rule per :class:`SyncOptions` field: raises ``ValueError`` (the reason) for a bad value.
RULES: dict[str, Callable[[Any], None]] = {
    "include": _patterns,
    "exclude": _patterns,
    "dry_run": _bool,
    "delete": _bool,
    "max_delete": _int(-1),
    "checkers": _int(*CONCURRENCY),
    "transfers": _int(*CONCURRENCY),
    "list_concurrency": _int(*CONCURRENCY),
    "bwlimit": _optional(_positive),
    "verify": _verify_mode,
    "size_only": _bool,
    "ignore_times": _bool,
    "checksum": _bool,
    "multipart_threshold": _bytes(1),
    "part_size": _optional(_bytes(MIN_PART_SIZE, MAX_PART_SIZE)),
    "memory": _bytes(MIN_MEMORY),
    "samples": _int(*SAMPLES),
    "sample_size": _bytes(1),
}


def options_from_dict(doc: Mapping[str, Any] | None) -> SyncOptions:
    """:class:`SyncOptions` from its JSON form (``dataclasses.asdict``; missing fields take defaults).

    Raises:
        BadOption: not an object (``field`` ""), an unknown name, or a value :data:`RULES` refuses.
    """
    if doc is None:
        return SyncOptions()
    if not isinstance(doc, Mapping):
        raise BadOption("", "options must be an object")
    known = {f.name for f in fields(SyncOptions)}
    for name in doc:
        if name not in known:
            raise BadOption(str(name), "is not a sync option")
    kwargs = dict(doc)
    for name, value in kwargs.items():
        if name in SIZE_FIELDS and isinstance(value, str):  # "64M", as the CLI flags take them
            try:
                kwargs[name] = value = parse_size(value)
            except InvalidArgument as exc:
                raise BadOption(name, f"is not a size: {value!r}") from exc
        elif name in SIZE_FIELDS and isinstance(value, float) and value.is_integer() and name != "bwlimit":
            kwargs[name] = value = int(value)  # 1048576.0 from a JSON encoder
        try:
            RULES[name](value)
        except ValueError as exc:
            raise BadOption(name, str(exc)) from exc
        if name in ("include", "exclude"):
            kwargs[name] = tuple(value)
    return SyncOptions(**kwargs).check()
