"""Group calls: concurrent callers of one kind share a round trip (group commit).

A worker fetching many blocks of a bound file at once asks the master where each comes from and
reports each one stored; one RPC per block costs the master and the worker more CPU (gRPC's, on
both sides) than the fetch itself for small files. A :class:`Coalescer` sends the calls made
while its previous batch is in flight together, as one batch, when that batch returns (Nagle's
algorithm, the group commit of a database's log). A lone caller waits one event-loop turn, no
more; many concurrent callers share round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from pcache.common.errors import Unavailable

T = TypeVar("T")
R = TypeVar("R")

# what a batch sender answers for each item: its result, or the exception its caller gets
SendBatch = Callable[[list[T]], Awaitable[Sequence["R | BaseException"]]]


class Coalescer(Generic[T, R]):
    """Calls ``send`` with the items of concurrent :meth:`call` s, at most ``max_batch`` at once
    and ``max_in_flight`` batches at a time.

    ``send(items)`` returns one result per item, in order; an exception among them is raised to
    that item's caller only. An exception raised by ``send`` itself is raised to every caller of
    the batch. Must be used from one event loop.
    """

    def __init__(self, send: SendBatch[T, R], max_batch: int = 256, max_in_flight: int = 1) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError(f"max_batch and max_in_flight must be at least 1, not {max_batch}, {max_in_flight}")
        self._send = send
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._queued: list[tuple[T, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()  # batches in flight (held: a task is weakly referenced)
        self.batches = 0  # batches sent (a figure for tests and benchmarks)

    async def call(self, item: T) -> R:
        """``item``'s result, sent with the others queued by then.

        Raises:
            whatever ``send`` answers for the item, or raises for its batch.
        """
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queued.append((item, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        """Flush on the next loop turn: the callers woken with this one join its batch."""
        if not self._scheduled and self._in_flight < self.max_in_flight and self._queued:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._in_flight < self.max_in_flight and self._queued:
            batch = [(item, f) for item, f in self._queued[: self.max_batch] if not f.done()]  # not given up
            del self._queued[: self.max_batch]
            if batch:
                self._in_flight += 1
                task = asyncio.ensure_future(self._run(batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            self.batches += 1
            results = await self._send([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} was answered with {len(results)} results")
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        except BaseException as exc:  # cancelled with its owner too: nobody may wait for ever
            error = exc if isinstance(exc, Exception) else Unavailable(f"batch abandoned: {exc!r}")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            if error is not exc:
                raise
        finally:
            self._in_flight -= 1
            self._schedule()


__all__ = ["Coalescer"]
