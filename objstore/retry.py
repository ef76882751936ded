"""Retries with exponential backoff and jitter, only for errors that say ``retryable``.

Throttling (503 SlowDown, 429), 5xx, connection resets and timeouts carry ``retryable = True``
(:mod:`objstore.errors`); a missing bucket, denied access or a bad request fail at once. Built on
``tenacity``; the obstore requests of :mod:`objstore.s3` and Babel's store calls
(:mod:`babel.retry`) use it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is worth another attempt (its type says ``retryable``)."""
    return bool(getattr(exc, "retryable", False))


async def with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    initial: float = 0.1,
    cap: float = 10.0,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Await ``fn()`` up to ``attempts`` times while it raises a retryable error.

    Waits ``initial`` × 2^n seconds (at most ``cap``) plus up to ``initial`` of random jitter
    between attempts; ``on_retry`` is told of each error that gets another attempt.

    Raises:
        Exception: the last error once ``attempts`` are spent (with a note, shown by :func:`describe`,
            saying how many tries over how long), or at once, unchanged, when it is not retryable.
    """
    tries = 0

    def retry(exc: BaseException) -> bool:
        if not is_retryable(exc):
            return False
        if on_retry is not None:
            on_retry(exc)
        return True

    started = time.monotonic()
    try:  # the first try outside tenacity: it costs ~0.1 ms of CPU per call, and most calls succeed
        return await fn()
    except Exception as exc:
        if attempts <= 1 or not retry(exc):
            raise
    await asyncio.sleep(initial + random.uniform(0, initial))
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts - 1),
            wait=wait_exponential(multiplier=2 * initial, max=cap) + wait_random(0, initial),
            retry=retry_if_exception(retry),
            reraise=True,
        ):
            with attempt:
                tries = attempt.retry_state.attempt_number + 1
                return await fn()
    except Exception as exc:
        if is_retryable(exc):  # the budget is spent: say so (a store down, not one bad answer)
            exc.add_note(f"gave up after {tries} tries in {time.monotonic() - started:.1f} s")
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def describe(exc: BaseException) -> str:
    """``"TypeName: message"`` of ``exc`` (the name once, where the message starts with it) with
    its notes: ``"TransientError: ...; gave up after 10 tries in 33.0 s"``."""
    name, text = type(exc).__name__, str(exc)
    notes = getattr(exc, "__notes__", None) or []
    return "; ".join([text if text.startswith(f"{name}:") else f"{name}: {text}", *notes])
