"""Path validation for the PCache namespace.

Paths are absolute, ``/``-separated, and may not contain ``..``, ``.``, NUL,
or empty components (``//`` is tolerated as a separator run only at the
edges, as POSIX allows a trailing slash). Limits: 255 bytes per component
(``NAME_MAX``, as Linux); a whole path up to ``MAX_PATH`` (32 KiB), more than Linux's
``PATH_MAX`` (4096 bytes, a limit on one system call's argument): a FUSE mount hands over paths
from its root, a process whose working directory is deep in the tree names files beyond
``PATH_MAX`` from there, and a tenant's paths gain its root's prefix in the master.
"""

from __future__ import annotations

from pcache.common.errors import InvalidEncoding, InvalidPath, NameTooLong

NAME_MAX = 255
PATH_MAX = 4096  # Linux's: a symlink target, one argument of a system call
MAX_PATH = 32 * 1024  # bytes of a whole path in the namespace


def split_path(path: str) -> list[str]:
    """Validate ``path`` and return its components (``[]`` for ``/``).

    Raises:
        InvalidPath: not a string, not absolute, NUL, ``.``/``..``, or an
            empty component in the middle (``/a//b``).
        NameTooLong: a component over 255 bytes or the path over ``MAX_PATH``.
    """
    if not isinstance(path, str) or not path:
        raise InvalidPath("path must be a non-empty string", path=repr(path))
    if "\x00" in path:
        raise InvalidPath("path contains a NUL byte", path=repr(path))
    if not path.startswith("/"):
        raise InvalidPath("path must be absolute", path=path)
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError as exc:  # bytes that are not UTF-8 (FUSE hands them over as surrogate escapes)
        raise InvalidEncoding("name is not valid UTF-8 (PCache names are UTF-8)", path=repr(path)) from exc
    if size > MAX_PATH:
        raise NameTooLong(f"path longer than {MAX_PATH} bytes", path=path[:64] + "...")
    trimmed = path.strip("/")
    if not trimmed:
        return []
    parts = trimmed.split("/")
    for part in parts:
        if part == "":
            raise InvalidPath("empty path component", path=path)
        if part in (".", ".."):
            raise InvalidPath(f"'{part}' is not allowed in a path", path=path)
        if len(part.encode("utf-8")) > NAME_MAX:
            raise NameTooLong(f"component longer than {NAME_MAX} bytes", path=path[:64] + "...")
    return parts


def normalize(path: str) -> str:
    """Return the canonical form of a valid ``path`` (no trailing slash)."""
    return "/" + "/".join(split_path(path))


def parent_and_name(path: str) -> tuple[str, str]:
    """Split a valid non-root ``path`` into (parent path, last component).

    Raises:
        InvalidPath: ``path`` is ``/`` or invalid.
    """
    parts = split_path(path)
    if not parts:
        raise InvalidPath("the root has no parent", path=path)
    return "/" + "/".join(parts[:-1]), parts[-1]


def join(parent: str, name: str) -> str:
    """Join a directory path and one component."""
    return parent.rstrip("/") + "/" + name
