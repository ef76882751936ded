"""Babel's error tree: the object-store errors of :mod:`objstore.errors` (which every backend
raises), with their base under Babel's name. ``retryable`` decides retries, never message text."""

from __future__ import annotations

from objstore.errors import (
    AccessDenied,
    BadURI,
    Corrupt,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    Throttled,
    TransientError,
)
from objstore.errors import StoreError as BabelError

__all__ = [
    "AccessDenied",
    "BabelError",
    "BadURI",
    "Corrupt",
    "NoSuchBucket",
    "NoSuchKey",
    "NoSuchUpload",
    "Throttled",
    "TransientError",
]
