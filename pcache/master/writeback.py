"""Write-back of bound directories (``pcache bind --mode writeback``): files closed there are
uploaded to the under-store in the background, in the order they were closed.

The queue (:class:`PersistQueue`) is namespace metadata (keys ``p<seq>``, replicated with every
other mutation), so persisting survives a master's restart or failover. Each step is one
:class:`~pcache.proto.pcache_pb2.PersistTask`: the upload of one version of a file, or the delete
of an object whose file was deleted or moved.

The :class:`Persister` (on the leader) runs them:

1. it starts a multipart upload of the file's object itself (so it always knows the upload id,
   and can abort it) and records it in the task;
2. it sends a ``PERSIST`` command to a worker holding the file's first block; the worker reads
   the file block by block (local blocks from disk, others from a replica), checks each block's
   CRC32C, uploads parts of at least ``PART_SIZE`` bytes, compares each part's ETag with the MD5
   of what it sent where the store's ETag is one, and reports the parts (``ReportPersist``);
3. a staged upload is completed, and a delete carried out, only once every earlier step of the
   same bind is done: the store shows a checkpoint directory's ``.metadata`` after its shards,
   and nothing partial is ever visible under a final key (a multipart upload is invisible until
   completed). The completed object's size is checked with a HEAD.

A file deleted or renamed while its upload runs has its task canceled: the upload is aborted
(even one the worker reports later), and an object that completed meanwhile is deleted. A step
that fails is retried with exponential backoff (up to ``MAX_BACKOFF`` seconds apart, forever: a
store outage heals by itself); after ``FAILED_AFTER`` attempts the file shows ``persist: failed``
with the error, and later steps of its bind wait (their order is kept). Blocks of a file not yet
persisted are never evicted (they are not clean). The design follows Alluxio's ASYNC_THROUGH
write type and JuiceFS's ``--writeback`` upload queue, with the ordering a checkpoint needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from objstore.base import PartInfo
from pcache.common import errors as E
from pcache.common import ufs
from pcache.common.layout import HOLE
from pcache.master.metastore import MetaStore
from pcache.proto import pcache_pb2 as pb

if TYPE_CHECKING:
    from pcache.master.server import MasterServer

logger = logging.getLogger(__name__)

PREFIX = b"p"
SEQ_KEY = b"cpersist"
U64 = struct.Struct(">Q")
PART_SIZE = 8 << 20  # bytes: at least S3's 5 MiB for every part but the last
WINDOW = 8  # uploads staged at once
FAILED_AFTER = 5  # attempts before a file shows persist: failed
MAX_BACKOFF = 60.0  # seconds between retries, at most
STAGE_TIMEOUT = 600.0  # seconds a worker may take to stage one file before it is asked again


def _key(seq: int) -> bytes:
    return PREFIX + U64.pack(seq)


class PersistQueue:
    """The write-back steps, in seq order (the order files were closed), in the namespace store."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        raw = store.get(SEQ_KEY)
        self._next = U64.unpack(raw)[0] if raw else 1
        # inode -> seqs of its steps not done (kept in memory: a delete or rename cancels them)
        self.by_inode: dict[int, set[int]] = {}
        for task in self.tasks():
            if task.inode:
                self.by_inode.setdefault(task.inode, set()).add(task.seq)

    def tasks(self) -> Iterator[pb.PersistTask]:
        """Every step not done, oldest first."""
        for _, raw in self.store.scan(PREFIX):
            yield pb.PersistTask.FromString(raw)

    def get(self, seq: int) -> pb.PersistTask | None:
        raw = self.store.get(_key(seq))
        return pb.PersistTask.FromString(raw) if raw is not None else None

    def new(self, task: pb.PersistTask) -> list[tuple[bytes, bytes]]:
        """Batch entries adding ``task`` at the end of the queue (its ``seq`` is set here)."""
        task.seq = self._next
        self._next += 1
        if task.inode:
            self.by_inode.setdefault(task.inode, set()).add(task.seq)
        return [(SEQ_KEY, U64.pack(self._next)), (_key(task.seq), task.SerializeToString())]

    def cancel(self, inode: int) -> list[tuple[bytes, bytes]]:
        """Batch entries canceling every step of ``inode`` (its file was deleted or moved)."""
        puts = []
        for seq in self.by_inode.pop(inode, set()):
            task = self.get(seq)
            if task is not None and not task.canceled:
                task.canceled = True
                puts.append((_key(seq), task.SerializeToString()))
        return puts

    def put(self, task: pb.PersistTask) -> None:
        self.store.write([(_key(task.seq), task.SerializeToString())])

    def done(self, task: pb.PersistTask, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """Drop a finished (or canceled) step, with other entries in the same batch."""
        seqs = self.by_inode.get(task.inode)
        if seqs is not None:
            seqs.discard(task.seq)
            if not seqs:
                self.by_inode.pop(task.inode, None)
        self.store.write(list(extra), [_key(task.seq)])

    def pending(self) -> int:
        return sum(1 for _ in self.store.scan(PREFIX))


class Persister:
    """Runs the write-back queue on the leader (see the module docstring)."""

    def __init__(self, master: MasterServer) -> None:
        self.m = master
        self.staging: dict[int, tuple[str, float]] = {}  # seq -> (worker, when its command went)
        self.retry_at: dict[int, float] = {}  # seq -> time.monotonic() of its next attempt
        self.wake = asyncio.Event()
        self.uploaded = self.deleted = 0  # objects completed and deleted since this master leads

    async def run(self) -> None:
        """Until cancelled: one pass whenever woken (a commit, a report) or every half second."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.5)
            self.wake.clear()
            if not self.m.is_leading():
                self.staging.clear()  # a new term starts every staged-but-unreported step again
                continue
            try:
                await self.step()
            except E.NotLeader:
                continue
            except Exception:  # one bad pass must not stop write-back for good
                logger.exception("write-back pass failed")

    async def step(self) -> None:
        """Start what may start (up to ``WINDOW`` staging at once), and complete or carry out the
        oldest step of each bind, then the next, while they are done: in seq order per bind."""
        ns, _ = self.m.leading()
        blocked: set[int] = set()  # binds whose oldest step is not done: later ones wait to finish
        now = time.monotonic()
        for seq in [t.seq for t in ns.persist.tasks()]:
            task = ns.persist.get(seq)  # as it is now: a report may have staged it during this pass
            if task is None:
                continue
            if task.canceled:
                await self._cancel(task)
                continue
            head = task.bind not in blocked
            ready = self.retry_at.get(task.seq, 0.0) <= now
            if task.kind == pb.PersistTask.DELETE:
                if head and ready and await self._delete(task):
                    continue
            elif task.staged:
                if head and ready and await self._complete(task):
                    continue
            elif task.seq not in self.staging:
                if ready and len(self.staging) < WINDOW and await self._start(task):
                    continue  # superseded or gone: nothing to wait for
            else:
                worker, since = self.staging[task.seq]
                if now - since > STAGE_TIMEOUT or self.m.registry.get_alive(worker) is None:
                    await self._failed(task, f"worker {worker} went away or took over {STAGE_TIMEOUT:g} s")
            blocked.add(task.bind)

    # ------------------------------------------------------------ steps --

    def _store(self, task: pb.PersistTask):
        ns, _ = self.m.leading()
        bind = ns.binds.of_inode(task.bind)
        if bind is None:
            raise E.NotFound(f"bind of inode {task.bind} is gone")
        return bind, self.m.ufs.store(bind)

    def _store_or_drop(self, task: pb.PersistTask):
        """The bind and store of ``task``; None (and the task dropped) when its bind is gone."""
        try:
            return self._store(task)
        except E.NotFound:
            self.m.leading()[0].persist.done(task)
            return None

    async def _start(self, task: pb.PersistTask) -> bool:
        """Start (or start again) the upload of ``task``'s file; True when the step is dropped
        instead (the file is gone, or a newer commit queued its own upload)."""
        ns, blocks = self.m.leading()
        try:
            node = ns.get_inode(task.inode)
            bind, store = self._store(task)
        except E.NotFound:
            node = None
        if node is None or node.version != task.version:
            if task.upload_id:
                task.canceled = True
                await self._cancel(task)
            else:
                ns.persist.done(task)
                await self.m.commit()
            return True
        timeout = self.m.cfg.ufs_timeout
        try:
            if task.upload_id:  # a previous attempt's (or term's): never completed now
                with contextlib.suppress(E.PCacheError):
                    await ufs.call(store.abort_multipart(task.key, task.upload_id), bind.uri, timeout)
                task.upload_id = ""
            if node.size == 0:  # no part to upload: the master writes it when its turn comes
                task.staged, task.size, task.crc32c = True, 0, 0
                ns.persist.put(task)
                await self.m.commit()
                return False
            upload_id = await ufs.call(store.create_multipart(task.key, node.size, PART_SIZE, {}), bind.uri, timeout)
        except E.PCacheError as exc:
            await self._failed(task, str(exc))
            return False
        ns, blocks = self.m.leading()
        now = ns.persist.get(task.seq)
        if now is None or now.canceled:  # deleted or moved while the upload was being created
            with contextlib.suppress(E.PCacheError):
                await ufs.call(store.abort_multipart(task.key, upload_id), bind.uri, timeout)
            if now is not None:
                ns.persist.done(now)
                await self.m.commit()
            return True
        _, metas = ns.layout(inode=node.id)
        locations = []
        for index, meta in enumerate(metas):
            if meta.block_id == HOLE:
                locations.append(pb.BlockLocation(block_id=HOLE, offset=index * node.block_size, length=meta.length))
                continue
            replicas = [w.info.addr for w in blocks.live_replicas(meta.block_id)]
            holders = [a.worker_id for a in replicas]
            locations.append(
                pb.BlockLocation(
                    block_id=meta.block_id,
                    offset=index * node.block_size,
                    length=meta.length,
                    crc32c=meta.crc32c,
                    replicas=replicas,
                    token=self.m.servicer.block_token(meta.block_id, "r", node.tenant, holders),
                )
            )
        first = next((loc.replicas[0].worker_id for loc in locations if loc.replicas), "")
        worker = self.m.registry.get_alive(first) if first else None
        if worker is None:
            alive = self.m.registry.alive()
            if not alive:
                await self._failed(task, "no live worker to upload it")
                return False
            worker = alive[task.seq % len(alive)]
        task.upload_id, task.uri = upload_id, bind.uri
        task.staged = False
        ns.persist.put(task)
        await self.m.commit()  # the upload id is known to the follower before any part is sent
        worker.commands.append(
            pb.WorkerCommand(
                kind=pb.WorkerCommand.PERSIST,
                task=task.seq,
                uri=bind.uri,
                key=task.key,
                upload_id=upload_id,
                part_size=max(PART_SIZE, node.block_size),
                blocks=locations,
            )
        )
        self.staging[task.seq] = (worker.worker_id, time.monotonic())
        return False

    async def _complete(self, task: pb.PersistTask) -> bool:
        """Make a staged upload the object (its turn has come); True when the step is done."""
        ns, _ = self.m.leading()
        found = self._store_or_drop(task)
        if found is None:
            return True
        bind, store = found
        timeout = self.m.cfg.ufs_timeout
        try:
            if task.upload_id:
                parts = [PartInfo(number=p.number, size=p.size, etag=p.etag) for p in task.parts]
                await ufs.call(store.complete_multipart(task.key, task.upload_id, parts), bind.uri, timeout)
            else:
                await ufs.call(store.put(task.key, b""), bind.uri, timeout)
            info = await ufs.call(store.head(task.key), bind.uri, timeout)
            if info.size != task.size:
                raise E.CorruptBlock(f"{bind.uri}/{task.key}: the store holds {info.size} bytes, not {task.size}")
        except E.PCacheError as exc:
            await self._failed(task, str(exc), restart=True)
            return False
        now = ns.persist.get(task.seq)
        if now is None or now.canceled:  # deleted or moved while completing: it must not stay
            with contextlib.suppress(E.PCacheError):
                await ufs.call(store.delete([task.key]), bind.uri, timeout)
            if now is not None:
                ns.persist.done(now)
            await self.m.commit()
            return True
        puts = []
        with contextlib.suppress(E.NotFound):
            node = ns.get_inode(task.inode)
            if node.version == task.version:
                node.persist, node.persist_error = pb.PERSIST_DONE, ""
                puts.append(ns.inode_record(node))
        ns.persist.done(task, puts)
        self.staging.pop(task.seq, None)
        self.retry_at.pop(task.seq, None)
        self.uploaded += 1
        await self.m.commit()
        logger.info("persisted %s/%s (%d bytes)", bind.uri, task.key, task.size)
        return True

    async def _delete(self, task: pb.PersistTask) -> bool:
        ns, _ = self.m.leading()
        found = self._store_or_drop(task)
        if found is None:
            return True
        bind, store = found
        try:
            await ufs.call(store.delete([task.key]), bind.uri, self.m.cfg.ufs_timeout)
        except E.PCacheError as exc:
            await self._failed(task, str(exc))
            return False
        ns.persist.done(task)
        self.deleted += 1
        await self.m.commit()
        return True

    async def _cancel(self, task: pb.PersistTask) -> None:
        ns, _ = self.m.leading()
        if task.upload_id:  # its bind may be gone (unbound): the URI it started with
            with contextlib.suppress(E.PCacheError):
                store = self.m.ufs.store(pb.Bind(uri=task.uri)) if task.uri else self._store(task)[1]
                await ufs.call(store.abort_multipart(task.key, task.upload_id), task.uri, self.m.cfg.ufs_timeout)
        self.staging.pop(task.seq, None)
        self.retry_at.pop(task.seq, None)
        ns.persist.done(task)
        await self.m.commit()

    async def _failed(self, task: pb.PersistTask, error: str, *, restart: bool = False) -> None:
        """Count a failed attempt, show it on the file, and retry later (from the start)."""
        ns, _ = self.m.leading()
        now = ns.persist.get(task.seq)
        if now is None:
            return
        task.canceled = now.canceled  # a delete or rename meanwhile stands
        task.attempts += 1
        task.error = error
        if restart:
            task.staged = False
        self.staging.pop(task.seq, None)
        delay = min(MAX_BACKOFF, 0.5 * 2 ** min(task.attempts, 10))
        self.retry_at[task.seq] = time.monotonic() + delay
        puts = [(_key(task.seq), task.SerializeToString())]
        if task.kind == pb.PersistTask.UPLOAD:
            with contextlib.suppress(E.NotFound):
                node = ns.get_inode(task.inode)
                if node.version == task.version:
                    node.persist_error = error
                    if task.attempts >= FAILED_AFTER:
                        node.persist = pb.PERSIST_FAILED
                    puts.append(ns.inode_record(node))
        ns.store.write(puts)
        logger.warning(
            "write-back of %s failed (attempt %d, again in %.0f s): %s", task.key, task.attempts, delay, error
        )
        await self.m.commit()

    def staged(self, report: pb.PersistReport) -> None:
        """A worker's report on a PERSIST command (``ReportPersist``)."""
        ns, _ = self.m.leading()
        task = ns.persist.get(report.task)
        self.staging.pop(report.task, None)
        if task is None or task.upload_id != report.upload_id:  # an old attempt's: ignored
            return
        if report.error:
            self.wake.set()
            asyncio.ensure_future(self._failed_later(task, report.error))
            return
        del task.parts[:]
        task.parts.extend(report.parts)
        task.size, task.crc32c, task.staged = report.size, report.crc32c, True
        ns.persist.put(task)
        self.wake.set()

    async def _failed_later(self, task: pb.PersistTask, error: str) -> None:
        with contextlib.suppress(E.PCacheError):
            await self._failed(task, error, restart=True)
