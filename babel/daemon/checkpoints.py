"""The newest committed checkpoint under a URI (``newest_checkpoint`` schedules)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from babel.backends import open_store
from pcache.common.checkpoint import COMMIT_MARKER


def natural_key(name: str) -> list[Any]:
    """Sort key ordering numbers by value: ``step-90`` < ``step-200`` < ``step-1000``."""
    parts: list[Any] = re.split(r"([0-9]+)", name)
    parts[1::2] = [int(p) for p in parts[1::2]]
    return parts


def join_uri(uri: str, name: str) -> str:
    """``uri`` with ``NAME/`` appended to its path (the query, e.g. ``endpoint_url``, kept)."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + name + "/"))


async def newest_checkpoint(uri: str) -> str | None:
    """The newest committed checkpoint directory directly under ``uri``, or None.

    Lists the common prefixes of ``uri`` (``/`` delimiter), keeps those holding
    ``.metadata`` and returns the greatest name by :func:`natural_key` (no trailing ``/``).
    Names with ``?``, ``#`` or ``%`` are skipped: they cannot go into a URI path as is.

    Raises:
        BadURI: ``uri`` is malformed.
        NoSuchBucket, AccessDenied, TransientError: the listing failed.
    """
    store = open_store(uri)
    try:
        names: set[str] = set()
        after = ""
        while True:
            page = await store.list_page("", delimiter="/", start_after=after)
            names.update(p.rstrip("/") for p in page.prefixes)
            last = max([after, *page.prefixes, *(o.key for o in page.objects)])
            if not page.truncated or last == after:
                break
            after = last  # a common prefix as start_after skips its whole subtree (S3 semantics)
        for name in sorted(names, key=natural_key, reverse=True):
            if not name or any(c in name for c in "?#%"):
                continue
            try:
                await store.head(f"{name}/{COMMIT_MARKER}")
            except FileNotFoundError:
                continue  # still being written (or abandoned)
            return name
        return None
    finally:
        await store.close()
