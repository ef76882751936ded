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

from objstore.base import PartInfo, delete_if
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
MAX_PARTS = 10_000  # S3's most parts of one upload
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
        # (bind, key) -> DELETE steps not done: a listing meanwhile must not bring the object back
        self._deletes: dict[tuple[int, str], int] = {}
        for task in self.tasks():
            self._index(task)

    def _index(self, task: pb.PersistTask) -> None:
        if task.inode:
            self.by_inode.setdefault(task.inode, set()).add(task.seq)
        if task.kind == pb.PersistTask.DELETE:
            where = (task.bind, task.key)
            self._deletes[where] = self._deletes.get(where, 0) + 1

    def deleting(self, bind: int, key: str) -> bool:
        """Whether an object of ``bind`` is waiting for its DELETE step."""
        return (bind, key) in self._deletes

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
        self._index(task)
        return [(SEQ_KEY, U64.pack(self._next)), (_key(task.seq), task.SerializeToString())]

    def cancel(self, inode: int) -> list[tuple[bytes, bytes]]:
        """Batch entries canceling every step of ``inode`` (its file was deleted, moved or
        written again). The index keeps them until they are done: a caller that fails after
        this writes nothing, and the steps stay as they were."""
        puts = []
        for seq in self.by_inode.get(inode, set()):
            task = self.get(seq)
            if task is not None and not task.canceled:
                task.canceled = True
                puts.append((_key(seq), task.SerializeToString()))
        return puts

    def requeue(self, node: pb.Inode, version: int) -> list[tuple[bytes, bytes]]:
        """Batch entries queueing ``version`` of a file renamed while it was open, under the key
        its newest upload step has (the rename's); none when it has none."""
        latest = None
        for seq in sorted(self.by_inode.get(node.id, set())):
            task = self.get(seq)
            if task is not None and task.kind == pb.PersistTask.UPLOAD:
                latest = task
        if latest is None:
            return []
        puts = self.cancel(node.id)
        node.persist, node.persist_error = pb.PERSIST_PENDING, ""
        return puts + self.new(
            pb.PersistTask(kind=pb.PersistTask.UPLOAD, inode=node.id, version=version, bind=latest.bind, key=latest.key)
        )

    def put(self, task: pb.PersistTask) -> None:
        self.store.write([(_key(task.seq), task.SerializeToString())])

    def done(self, task: pb.PersistTask, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """Drop a finished (or canceled) step, with other entries in the same batch."""
        seqs = self.by_inode.get(task.inode)
        if seqs is not None:
            seqs.discard(task.seq)
            if not seqs:
                self.by_inode.pop(task.inode, None)
        where = (task.bind, task.key)
        if task.kind == pb.PersistTask.DELETE and where in self._deletes:
            self._deletes[where] -= 1
            if not self._deletes[where]:
                del self._deletes[where]
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
        self._tasks: set[asyncio.Future] = set()  # aborts of stray uploads under way

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
            ready = self.retry_at.get(task.seq, 0.0) <= now
            if task.canceled:
                if ready:
                    await self._cancel(task)
                continue
            head = task.bind not in blocked
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
        if task.upload_id:  # a previous attempt's (or term's): never completed now
            # its id is forgotten only once the store has let it go: an upload left open costs
            # its parts' bytes in the bucket for ever (S3 keeps it until a lifecycle rule acts)
            if not await self._abort(task.uri or bind.uri, task.key, task.upload_id):
                await self._failed(task, "its previous upload cannot be aborted yet (the master log says why): retried")
                return False
            task.upload_id = ""
        try:
            if node.size == 0:  # no part to upload: the master writes it when its turn comes
                task.staged, task.size, task.crc32c = True, 0, 0
                ns.persist.put(task)
                await self.m.commit()
                return False
            # one part size for the store and the worker: at least S3's minimum, a block, and few
            # enough parts for S3's 10,000
            part_size = max(PART_SIZE, node.block_size, -(-node.size // MAX_PARTS))
            upload_id = await ufs.call(store.create_multipart(task.key, node.size, part_size, {}), bind.uri, timeout)
        except E.PCacheError as exc:
            await self._failed(task, str(exc))
            return False
        ns, blocks = self.m.leading()
        now = ns.persist.get(task.seq)
        if now is None or now.canceled:  # deleted or moved while the upload was being created
            if now is None:
                await self._abort(bind.uri, task.key, upload_id)
                return True
            now.upload_id, now.uri = upload_id, bind.uri  # kept until its abort goes through
            ns.persist.put(now)
            await self._cancel(now)
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
        task.staged, task.size = False, node.size  # the size the upload must have
        ns.persist.put(task)
        await self.m.commit()  # the upload id is known to the follower before any part is sent
        worker.commands.append(
            pb.WorkerCommand(
                kind=pb.WorkerCommand.PERSIST,
                task=task.seq,
                uri=bind.uri,
                key=task.key,
                upload_id=upload_id,
                part_size=part_size,
                blocks=locations,
                file_size=node.size,
                block_size=node.block_size,
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
        if now is None or now.canceled:  # superseded, deleted or moved while completing: what
            if now is not None:  # canceled it queued what comes next (a newer upload, a DELETE)
                ns.persist.done(now, self._fence_deletes(task, info.etag))
            await self.m.commit()
            return True
        puts = []
        with contextlib.suppress(E.NotFound):
            node = ns.get_inode(task.inode)
            node.persisted_etag = info.etag  # what a DELETE of this name must find to remove it
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

    def _fence_deletes(self, task: pb.PersistTask, etag: str) -> list[tuple[bytes, bytes]]:
        """Batch entries making the DELETE steps queued after ``task`` for its object remove the
        version ``task`` has just made (``etag``) and no other."""
        ns, _ = self.m.leading()
        puts = []
        for later in ns.persist.tasks():
            if later.seq > task.seq and later.kind == pb.PersistTask.DELETE and (later.bind, later.key) == (
                task.bind, task.key,
            ):  # fmt: skip
                later.if_match = etag
                puts.append((_key(later.seq), later.SerializeToString()))
        return puts

    async def _delete(self, task: pb.PersistTask) -> bool:
        """Delete the object a deleted or moved file left; with ``if_match`` only that version
        (a leader deposed while its DELETE was in flight removed the object its successor wrote
        after it; found by an HA drill: the request held in a proxy and delivered 7 s late)."""
        ns, _ = self.m.leading()
        found = self._store_or_drop(task)
        if found is None:
            return True
        bind, store = found
        try:
            if task.if_match:
                removed = await ufs.call(delete_if(store, task.key, task.if_match), bind.uri, self.m.cfg.ufs_timeout)
                if not removed:
                    logger.info("left %s/%s alone: the store holds a version written after it", bind.uri, task.key)
            else:
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
        # its bind may be gone (unbound): aborted at the URI it started with, and kept until it is
        if task.upload_id and task.uri and not await self._abort(task.uri, task.key, task.upload_id):
            self.retry_at[task.seq] = time.monotonic() + MAX_BACKOFF / 4
            return
        self.staging.pop(task.seq, None)
        self.retry_at.pop(task.seq, None)
        ns.persist.done(task)
        await self.m.commit()

    async def _abort(self, uri: str, key: str, upload_id: str) -> bool:
        """Abort a multipart upload; True when it is gone (aborted, or never there)."""
        try:
            store = self.m.ufs.store(pb.Bind(uri=uri))
            await ufs.call(store.abort_multipart(key, upload_id), uri, self.m.cfg.ufs_timeout)
        except E.NotFound:
            return True
        except E.PCacheError as exc:
            logger.warning("cannot abort the upload of %s/%s yet: %s", uri, key, exc)
            return False
        return True

    def worker_restarted(self, worker_id: str) -> None:
        """A worker registered again (restarted): the uploads it was staging are started anew."""
        for seq, (wid, _) in list(self.staging.items()):
            if wid == worker_id:
                del self.staging[seq]
                self.wake.set()

    async def _failed(self, task: pb.PersistTask, error: str, *, restart: bool = False) -> None:
        """Count a failed attempt, show it on the file, and retry later (from the start)."""
        self._record_failure(task, error, restart=restart)
        await self.m.commit()

    def _record_failure(self, task: pb.PersistTask, error: str, *, restart: bool = False) -> None:
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

    def staged(self, report: pb.PersistReport) -> None:
        """A worker's report on a PERSIST command (``ReportPersist``; the caller commits)."""
        ns, _ = self.m.leading()
        task = ns.persist.get(report.task)
        if task is None or task.canceled or task.upload_id != report.upload_id:
            if report.upload_id and report.uri:  # an upload no step owns any more: never left open
                self._spawn(self._abort(report.uri, report.key, report.upload_id))
            if task is not None and task.upload_id == report.upload_id:
                self.staging.pop(report.task, None)
            return
        self.staging.pop(report.task, None)
        self.wake.set()
        error = report.error
        if not error and (report.size != task.size or sum(p.size for p in report.parts) != task.size):
            error = f"the worker uploaded {report.size} bytes, the file has {task.size}"
        if error:
            self._record_failure(task, error, restart=True)
            return
        del task.parts[:]
        task.parts.extend(report.parts)
        task.crc32c, task.staged = report.crc32c, True
        ns.persist.put(task)

    def _spawn(self, aw) -> None:
        fut = asyncio.ensure_future(aw)
        self._tasks.add(fut)
        fut.add_done_callback(self._tasks.discard)
