"""PCache's side of under storage: object-store errors as PCache errors, and bounded calls.

The stores themselves are :mod:`objstore`'s (the project's one implementation, shared with
Babel); this module only maps what they raise onto :mod:`pcache.common.errors`, so a client sees
ENOENT for a missing bucket, EACCES for refused credentials and EIO (retryable) for an
unreachable store, and bounds every call by a timeout (``../shared/DESIGN.md``, "under storage").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from objstore import ObjectInfo, ObjectStore, open_store
from objstore import errors as S
from objstore.base import META_MTIME
from objstore.tree import parse_mtime_ns
from pcache.common import errors as E

T = TypeVar("T")

OUTAGE_WAIT = 1.0  # seconds a call of a store that failed to answer waits for the probe of it (:class:`OutageGate`)
PROBE_TIMEOUT = 2.0  # seconds a probe of such a store may take (a HEAD: well under a second when it answers)
# the key a probe HEADs under a bind's prefix: any answer, "no such key" the likeliest, is the store
# up (not a key being read: one broken object must not keep its bucket down)
PROBE_KEY = ".pcache-probe"


def version_tag(info: ObjectInfo) -> str:
    """What identifies one version of an object: its ETag, or where the store has none
    (``file://``) the weak tag of its size and mtime in ns (:func:`objstore.local.weak_etag`,
    which ``get(..., if_match=)`` checks around the read)."""
    if info.etag:
        return info.etag
    exact = info.metadata.get(META_MTIME)
    ns = parse_mtime_ns(exact) if exact else round(info.mtime * 1e9)
    return f"W/{info.size:x}-{ns}"


def bucket_root(uri: str) -> tuple[str, str]:
    """``(root URI, key prefix)`` of a bind's URI: binds of one bucket with the same options
    share one store (one connection pool and credential cache on a worker, however many
    directories of the bucket are bound); its keys are the prefix + the bound file's key.
    ``file://`` URIs are their own root."""
    if not uri.startswith(("s3://", "oss://")):
        return uri, ""
    parsed = urlsplit(uri)
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return urlunsplit((parsed.scheme, parsed.netloc, "/", parsed.query, "")), prefix


def translate(exc: BaseException, uri: str, key: str = "") -> E.PCacheError:
    """The PCache error an under-store failure of ``uri`` stands for (raise it ``from exc``);
    ``key``: the object's key when the call was about one object (named in the message)."""
    if isinstance(exc, E.PCacheError):
        return exc
    if isinstance(exc, S.PreconditionFailed):
        what = f"object {key!r}" if key else "the object"
        return E.StaleHandle(f"{uri}: {what} changed upstream since it was listed (pcache refresh sees the new one)")
    if isinstance(exc, S.NoSuchBucket | S.NoSuchKey):
        return E.NotFound(f"under-store: {exc}")
    if isinstance(exc, S.AccessDenied):
        return E.PermissionDenied(f"under-store refused the credentials: {exc}")
    if isinstance(exc, S.BadURI):
        return E.InvalidArgument(f"under-store: {exc}")
    if isinstance(exc, TimeoutError):
        return E.StoreTimeout(f"under-store {uri} did not answer in time")
    return E.StoreUnavailable(f"under-store {uri}: {exc}")


async def call(aw: Awaitable[T], uri: str, timeout: float, key: str = "") -> T:
    """Await one under-store call within ``timeout`` seconds (``key``: the object it is about).

    Raises:
        NotFound, PermissionDenied, InvalidArgument, Timeout, Unavailable: see :func:`translate`.
    """
    try:
        async with asyncio.timeout(timeout):
            return await aw
    except (S.StoreError, OSError, TimeoutError) as exc:
        raise translate(exc, uri, key) from exc


class OutageGate:
    """Calls of a store that failed to answer wait briefly for one cheap probe of it, not each
    for its whole budget.

    A store that refuses or hangs costs each call its whole budget of retries and timeouts
    (``worker.ufs_timeout``, a minute): a data loader reading uncached files through an outage
    waited that long for every block. Once a call of a store (named by its bucket's root URI:
    every bind of the bucket shares it) failed with :class:`~pcache.common.errors.StoreUnavailable`
    or :class:`~pcache.common.errors.StoreTimeout`, the store is *down* until it answers a
    *probe*: a call of a down store starts one (the caller's ``probe``, a HEAD of
    :data:`PROBE_KEY` bounded by :data:`PROBE_TIMEOUT`; one at a time, in the background) and every call waits at
    most ``wait`` seconds for its outcome. A store that is back answers within it and the calls go
    on, each with its whole budget (a slow transfer is not taken for a dead store); one still down
    fails them in ``wait`` seconds. Any answer (NotFound, AccessDenied) is the store up; one
    failed object does not keep it down, since the probe does not read that object.
    The master answers metadata calls alike (:mod:`pcache.master.service`, ``UFS_OUTAGE_WAIT``):
    the circuit breaker of Nygard's *Release It!*, half-open with one trial request.
    """

    def __init__(self, *, wait: float = OUTAGE_WAIT) -> None:
        self.wait = wait
        self._failed: dict[str, float] = {}  # store -> when a call of it last failed (monotonic seconds)
        self._probes: dict[str, asyncio.Future] = {}  # store -> the probe of it under way

    def down(self, store: str) -> bool:
        """Whether a call of ``store`` failed to get an answer and no probe got one since."""
        return store in self._failed

    async def call(self, store: str, make: Callable[[], Awaitable[T]], probe: Callable[[], Awaitable[object]]) -> T:
        """``await make()``; while ``store`` is down, once ``probe()`` (shared with every call
        meanwhile) got an answer of the store.

        Raises:
            StoreTimeout: the store is down and the probe did not end within ``wait`` seconds.
            StoreUnavailable, StoreTimeout: the store is down and the probe failed so.
            PCacheError: ``make()``'s error.
        """
        if store in self._failed:
            running = self._probes.get(store)
            if running is None:
                running = self._probes[store] = asyncio.ensure_future(self._watched(store, probe()))
                running.add_done_callback(
                    lambda f: self._probes.pop(store, None) if self._probes.get(store) is f else None
                )
                running.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, even if no caller waits
            done, _ = await asyncio.wait([running], timeout=self.wait)
            if not done:
                age = time.monotonic() - self._failed.get(store, time.monotonic())
                raise E.StoreTimeout(
                    f"under-store {store} has not answered since a call failed {age:.0f} s ago; it is being probed,"
                    f" and this call waited {self.wait:g} s for the probe"
                )
            exc = None if running.cancelled() else running.exception()
            if isinstance(exc, E.StoreUnavailable | E.StoreTimeout):
                raise type(exc)(str(exc)) from exc  # the probe's error: a fresh one for each caller
        return await self._watched(store, make())

    async def _watched(self, store: str, call: Awaitable[T]) -> T:
        try:
            result = await call
        except (E.StoreUnavailable, E.StoreTimeout):
            self._failed[store] = time.monotonic()
            raise
        except E.PCacheError:
            self._failed.pop(store, None)  # an answer (NotFound, a changed object, refused credentials)
            raise
        self._failed.pop(store, None)
        return result


async def probe(uri: str, timeout: float) -> None:
    """List one key of ``uri``: the store answers and takes this host's credentials.

    An ``endpoint_url`` is connected to first (one TCP connection, ``timeout`` / 4 seconds at
    most): a wrong one fails at once with why (refused, unreachable, no such name), where the
    store client's own retries turned it into "did not answer in time" after the whole timeout.

    Raises:
        as :func:`call`; Unavailable: the endpoint refuses or cannot be reached.
    """
    try:
        store: ObjectStore = open_store(uri)
    except S.StoreError as exc:
        raise translate(exc, uri) from exc
    try:
        await _connect_endpoint(uri, timeout / 4)
        await call(store.list_page(max_keys=1), uri, timeout)
    finally:
        with contextlib.suppress(S.StoreError, OSError, TimeoutError):
            await asyncio.wait_for(store.close(), 5.0)


async def _connect_endpoint(uri: str, timeout: float) -> None:
    """Open and close one TCP connection to the ``endpoint_url`` of ``uri`` (none: nothing to do).

    Raises:
        Unavailable: refused, unreachable, or the name does not resolve (within ``timeout`` s).
    """
    endpoint = (parse_qs(urlsplit(uri).query).get("endpoint_url") or [""])[0]
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise E.InvalidArgument(f"under-store {uri}: endpoint_url {endpoint!r}: {exc}") from exc
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except TimeoutError:
        return  # slow, not wrong: the listing decides
    except OSError as exc:
        why = "refuses connections" if isinstance(exc, ConnectionRefusedError) else f"cannot be reached: {exc}"
        raise E.StoreUnavailable(f"under-store {uri}: endpoint {parts.hostname}:{port} {why}") from exc
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
