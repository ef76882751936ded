"""Babel's one retry policy: :func:`objstore.retry.with_retries` (exponential backoff with
jitter, only for errors that say ``retryable``) with :data:`ATTEMPTS` tries; the listing, the
transfers, planning HEADs and verification all call it.
"""

from __future__ import annotations

from objstore.retry import describe, is_retryable, with_retries

__all__ = ["ATTEMPTS", "describe", "is_retryable", "with_retries"]

ATTEMPTS = 10  # tries per store call, the first included (copies, planning HEADs, verification): at 30 %
# throttling one call in 170,000 still fails; a store that stays down costs a call about 30 s of backoff
