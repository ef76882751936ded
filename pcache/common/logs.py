"""Logging set-up for every entry point of the project (``pcache``, ``pcache-mount``, ``babel``, the trainer)."""

from __future__ import annotations

import logging
import sys

DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int = "INFO", *, fmt: str = DEFAULT_FORMAT) -> None:
    """Install the process's log handler on stderr; call once, from an entry point only.

    ``level`` is a name (``"DEBUG"``, case-insensitive; an unknown name means INFO) or a
    ``logging`` level number. Libraries never call this: they only get loggers.
    """
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
