"""The gRPC boundary: PCache errors to status codes and back, by one table.

The server side wraps each servicer method with :func:`rpc_method`, which turns
a :class:`PCacheError` into a status code plus the error's class name in the
``pcache-error`` trailing metadata; the client side calls :func:`call`, which
turns an ``AioRpcError`` back into the same class (or, for transport failures
that never reached our code, into the class the status code implies). The
pattern is s3fs's ``translate_boto_error``.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from pcache.common import errors as E
from pcache.common.auth import bearer

logger = logging.getLogger(__name__)

ERROR_KEY = "pcache-error"
EPOCH_KEY = "pcache-epoch"  # every master answer carries the master's epoch (fencing, DESIGN.md)
LEADER_KEY = "pcache-leader"  # a NotLeader answer names the leader when the master knows it
MAX_BATCH = 256  # ops per Batch RPC: clients send at most this many, the master refuses more

STATUS_BY_ERROR: dict[type[E.PCacheError], grpc.StatusCode] = {
    E.NotFound: grpc.StatusCode.NOT_FOUND,
    E.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    E.NotADirectory: grpc.StatusCode.FAILED_PRECONDITION,
    E.IsADirectory: grpc.StatusCode.FAILED_PRECONDITION,
    E.DirectoryNotEmpty: grpc.StatusCode.FAILED_PRECONDITION,
    E.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidPath: grpc.StatusCode.INVALID_ARGUMENT,
    E.NameTooLong: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidEncoding: grpc.StatusCode.INVALID_ARGUMENT,
    E.NoSpace: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    E.CrossTenant: grpc.StatusCode.FAILED_PRECONDITION,
    E.SymlinkLoop: grpc.StatusCode.INVALID_ARGUMENT,
    E.Conflict: grpc.StatusCode.ABORTED,
    E.FileTooLarge: grpc.StatusCode.OUT_OF_RANGE,
    E.TooLarge: grpc.StatusCode.INVALID_ARGUMENT,
    E.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    E.NotPermitted: grpc.StatusCode.FAILED_PRECONDITION,
    E.NotSupported: grpc.StatusCode.UNIMPLEMENTED,
    E.Unavailable: grpc.StatusCode.UNAVAILABLE,
    E.NotLeader: grpc.StatusCode.FAILED_PRECONDITION,  # not UNAVAILABLE: gRPC would retry the same master
    E.Timeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    # the store's failure, said by a live master: not statuses gRPC retries or clients fail over on
    E.StoreUnavailable: grpc.StatusCode.FAILED_PRECONDITION,
    E.StoreTimeout: grpc.StatusCode.FAILED_PRECONDITION,
    E.CorruptBlock: grpc.StatusCode.DATA_LOSS,
    E.StaleEpoch: grpc.StatusCode.ABORTED,
    E.ProtocolError: grpc.StatusCode.INTERNAL,
    E.PCacheError: grpc.StatusCode.INTERNAL,
}

# Status codes that arrive without our metadata (the call never reached a servicer).
ERROR_BY_STATUS: dict[grpc.StatusCode, type[E.PCacheError]] = {
    grpc.StatusCode.UNAVAILABLE: E.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: E.Timeout,
    grpc.StatusCode.CANCELLED: E.Unavailable,
    grpc.StatusCode.UNIMPLEMENTED: E.NotSupported,
    grpc.StatusCode.RESOURCE_EXHAUSTED: E.NoSpace,
    grpc.StatusCode.PERMISSION_DENIED: E.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: E.PermissionDenied,
    grpc.StatusCode.NOT_FOUND: E.NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: E.InvalidArgument,
}

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def rpc_method(func: F) -> F:
    """Decorate an async servicer method so PCache errors become gRPC statuses.

    The servicer's ``authorize(method_name, context)`` runs first and raises PermissionDenied
    for a caller that may not call it; a servicer without one fails every call (deny by default).
    """

    @functools.wraps(func)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # a servicer with an ``epoch`` stamps it on every answer, failed or not
        stamp = _stamp(self)
        try:
            self.authorize(func.__name__, context)  # every servicer must say who may call it
            reply = await func(self, request, context)
            if stamp:
                context.set_trailing_metadata(stamp)
            return reply
        except Exception as exc:
            await _abort(context, exc, stamp, func.__name__)

    return wrapper  # type: ignore[return-value]


def rpc_stream_method(func: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """As :func:`rpc_method`, for a servicer method that is an async generator (a response stream):
    an error ends the stream with the status, the error name and the epoch stamp."""

    @functools.wraps(func)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            self.authorize(func.__name__, context)
            async for reply in func(self, request, context):
                yield reply
        except Exception as exc:
            await _abort(context, exc, _stamp(self), func.__name__)

    return wrapper


def _stamp(servicer: Any) -> tuple[tuple[str, str], ...]:
    epoch = getattr(servicer, "epoch", None)
    return ((EPOCH_KEY, str(epoch)),) if isinstance(epoch, int) else ()


async def _abort(
    context: grpc.aio.ServicerContext, exc: Exception, stamp: tuple[tuple[str, str], ...], method: str
) -> None:
    """End a call with the status of ``exc`` (a PCache error keeps its name; anything else is INTERNAL)."""
    if isinstance(exc, E.PCacheError):
        code = STATUS_BY_ERROR.get(type(exc), grpc.StatusCode.INTERNAL)
        leader = ((LEADER_KEY, exc.leader),) if getattr(exc, "leader", "") else ()
        context.set_trailing_metadata(((ERROR_KEY, type(exc).__name__), *stamp, *leader))
        await context.abort(code, str(exc))  # raises
    else:
        logger.exception("%s failed", method)
        context.set_trailing_metadata(((ERROR_KEY, "PCacheError"), *stamp))
        await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def translate(exc: grpc.aio.AioRpcError, target: str = "") -> E.PCacheError:
    """Turn a failed gRPC call into the PCache error it stands for."""
    name = ""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            name = value
    details = exc.details() or exc.code().name
    if name:
        return E.from_name(name, details)
    cls = ERROR_BY_STATUS.get(exc.code(), E.PCacheError)
    where = f" ({target})" if target else ""
    hint = _setup_refused(exc.code(), details)
    err = cls(f"{exc.code().name.lower()}{where}: {details}{hint}")
    err.setup_refused = bool(hint)
    return err


# What gRPC says when a connection is refused while it is set up, not by a dead server: a TLS
# handshake that failed (another CA, no certificate), a certificate that does not name the address
# dialled, a server without TLS answering a TLS client, or a TLS server closing a plaintext client.
_SETUP_HINTS = (
    (re.compile(r"WRONG_VERSION_NUMBER"), " (the server answered without TLS: give it tls_dir as well)"),
    (
        re.compile(r"Hostname Verification Check failed|Custom verification check failed", re.IGNORECASE),
        " (the server's certificate does not name the address it was dialled at: a SAN with that IP or DNS name)",
    ),
    (
        re.compile(r"handshake failed|TSI_PROTOCOL_FAILURE|SSL_ERROR", re.IGNORECASE),
        " (the TLS handshake failed: the client's tls_dir must hold the CA that signed the servers'"
        " certificates, and a certificate that CA signed)",
    ),
)
_CLOSED_AT_SETUP = "failed to connect to all addresses; last error: UNAVAILABLE"


def _setup_refused(code: grpc.StatusCode, details: str) -> str:
    """A hint for a connection the server refused while it was set up ("" for any other failure):
    a TLS mismatch, which no retry and no other master of the same cluster can mend."""
    if code != grpc.StatusCode.UNAVAILABLE:
        return ""
    for pattern, hint in _SETUP_HINTS:
        if pattern.search(details):
            return hint
    if _CLOSED_AT_SETUP in details and details.rstrip().endswith("Socket closed"):
        return (
            " (closed as it connected: a server with TLS closes a client without TLS, or without a certificate"
            " of its CA when it requires one: set tls_dir, with cert.pem and key.pem)"
        )
    return ""


async def call(method: Callable[..., Any], request: Any, *, timeout: float, target: str = "", token: str = "") -> Any:
    """Invoke a unary stub ``method`` with a deadline and ``token`` as its bearer credential,
    raising PCache errors.

    Raises:
        PCacheError: the subclass the server raised, ``Unavailable`` when the
            server cannot be reached, ``Timeout`` past ``timeout`` seconds.
    """
    try:
        return await method(request, timeout=timeout, metadata=bearer(token))
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, target) from exc


async def call_stamped(
    method: Callable[..., Any], request: Any, *, timeout: float, target: str = "", token: str = ""
) -> tuple[Any, int]:
    """As :func:`call`, and also return the epoch the master stamped on its answer (0: none).

    A failed call's error carries the stamp as its ``epoch`` attribute, and the leader's address
    a NotLeader answer named as its ``leader`` attribute.
    """
    pending = method(request, timeout=timeout, metadata=bearer(token))
    try:
        reply = await pending
    except grpc.aio.AioRpcError as exc:
        raise translate_stamped(exc, target) from exc
    return reply, _epoch_of(await pending.trailing_metadata())


def translate_stamped(exc: grpc.aio.AioRpcError, target: str = "") -> E.PCacheError:
    """As :func:`translate`, with the answer's epoch stamp as ``epoch`` and a NotLeader's
    leader address as ``leader``."""
    err = translate(exc, target)
    err.epoch = _epoch_of(exc.trailing_metadata())
    err.leader = dict(exc.trailing_metadata() or ()).get(LEADER_KEY, "")
    return err


def _epoch_of(metadata: Any) -> int:
    for key, value in metadata or ():
        if key == EPOCH_KEY:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


# gRPC's own retry of calls that failed before reaching the server (service config,
# https://github.com/grpc/proposal/blob/master/A6-client-retries.md).
def channel_options(max_message_bytes: int = 64 << 20, *, retries: bool = True) -> list[tuple[str, Any]]:
    """Channel options: message size limits, keepalive and (``retries``) gRPC's own retries.

    With ``retries``, a master call answered UNAVAILABLE is tried up to 4 times on the same
    channel (backoffs up to 0.1, 0.2, 0.4 s): a single master's blip is ridden out. A client of
    several masters passes ``retries=False``: it goes to the next master itself, and gRPC's
    retries against a killed leader cost it 0.7 s of a failover that takes 0.3 s without them.
    """
    import json

    service_config = {
        "methodConfig": [
            {
                "name": [{"service": "pcache.Master"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            },
            # the client's batch stream: it sends a failed batch again itself, when that applies
            # nothing twice (pcache.client.master.MasterClient._on_stream)
            {"name": [{"service": "pcache.Master", "method": "BatchStream"}]},
        ]
    }
    retrying: list[tuple[str, Any]] = (
        [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(service_config))]
        if retries
        else [("grpc.enable_retries", 0)]
    )
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        *retrying,
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1_000),
        # a channel of its own connections: gRPC shares connections (subchannels) between the
        # channels of a process, and a new client to a master that had just been restarted
        # inherited an older client's reconnect backoff, failing fast with its "Connection refused"
        ("grpc.use_local_subchannel_pool", 1),
    ]
