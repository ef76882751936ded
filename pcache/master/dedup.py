"""Answers of applied mutations, by request id, so a retried mutation is answered, not re-applied.

A client gives each mutation one request id and keeps it across retries (a timeout, a failover
to the follower). The master stores the answer in the same log entry as the mutation
(:meth:`ReplicatedStore.amend`), so a follower that takes over has the answer exactly when it
has the mutation. Records are dropped after ``keep`` seconds (far longer than any client retries).
The scheme is the "duplicate request cache" of NFS servers and Raft's client sessions (Ongaro's
thesis, §6.3).

Keys::

    r<request id>               -> DedupRecord (method, serialized answer, time)
    q<time ms:8><request id>    -> ""   (expiry order)
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from google.protobuf.message import Message

from pcache.common import errors as E
from pcache.master.replication import ReplicatedStore
from pcache.proto import pcache_pb2 as pb

MAX_REQUEST_ID = 300  # bytes, with the caller prefix (scope:tenant/)
_MS = struct.Struct(">Q")


class ReplyCache:
    """Stored answers of mutations, by request id (see the module docstring)."""

    def __init__(self, store: ReplicatedStore, *, keep: float = 900.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.keep = keep
        self._clock = clock

    @staticmethod
    def _rid(request_id: str) -> bytes:
        raw = request_id.encode("utf-8", "surrogateescape")
        if len(raw) > MAX_REQUEST_ID:
            raise E.InvalidArgument(f"request id longer than {MAX_REQUEST_ID} bytes")
        return raw

    def get(self, request_id: str, method: str, reply_type: type[Message]) -> Message | None:
        """The stored answer of ``request_id``, or None when it was not applied here.

        Raises:
            InvalidArgument: the id was used for another method (a client bug), or is too long.
        """
        raw = self.store.get(b"r" + self._rid(request_id))
        if raw is None:
            return None
        record = pb.DedupRecord.FromString(raw)
        if record.method != method:
            raise E.InvalidArgument(f"request id {request_id!r} was used for {record.method}, not {method}")
        return reply_type.FromString(record.reply)

    def record(self, request_id: str, method: str, reply: Message, since: int) -> None:
        """Store ``reply`` with the mutation written after log index ``since`` (same entry)."""
        rid = self._rid(request_id)
        now = self._clock()
        record = pb.DedupRecord(method=method, reply=reply.SerializeToString(), time=now)
        self.store.amend(
            since, [(b"r" + rid, record.SerializeToString()), (b"q" + _MS.pack(int(now * 1000)) + rid, b"")]
        )

    def expire(self, limit: int = 10_000) -> int:
        """Drop up to ``limit`` records older than ``keep`` seconds; returns how many."""
        horizon = _MS.pack(int((self._clock() - self.keep) * 1000))
        deletes: list[bytes] = []
        for key, _ in self.store.scan(b"q"):
            if key[1:9] >= horizon or len(deletes) >= 2 * limit:
                break
            deletes += [key, b"r" + key[9:]]
        if deletes:
            self.store.write(deletes=deletes)
        return len(deletes) // 2
