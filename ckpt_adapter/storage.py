"""``torch.distributed.checkpoint`` storage plug-ins that write through the PCache SDK.

The checkpoint layout is exactly torch's ``FileSystemWriter`` layout (one
``__<rank>_<n>.distcp`` file per rank plus ``.metadata``), so a checkpoint saved
here loads with stock ``FileSystemReader`` over the FUSE mount, and the other
way round. Bytes go through :mod:`pcache.client` (the same-host short circuit
when the worker is local), not through FUSE.

Commit is atomic: every rank's shard files are closed (committed in the
master) before the coordinator writes ``.metadata.tmp`` and renames it to
``.metadata``; a checkpoint directory without ``.metadata`` is incomplete and
is never loaded. A save over an existing checkpoint (``overwrite``) first
removes its ``.metadata``, before any rank rewrites a shard: torch rewrites
the shards in place and replaces ``.metadata`` only at the end, so a save
that died between the two left new shards under the old ``.metadata``, a
mix of two saves that loaded as complete.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, _FileSystemWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckpt_adapter.uri import SCHEME, client_for, join_uri, split_uri
from pcache.common.checkpoint import COMMIT_MARKER
from pcache.common.errors import AlreadyExists, NotFound

METADATA = COMMIT_MARKER  # written last: its presence commits the checkpoint
STREAM_BUFFER = 4 << 20


class PCacheFileSystem(FileSystemBase):
    """torch's checkpoint file-system interface over ``pcache://`` URIs.

    ``failures`` keeps every error a stream ended with (torch's writer threads beyond the first
    drop theirs: :meth:`PCacheStorageWriter.write_data` raises them).
    """

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[BaseException] = []  # list.append is atomic: written from torch's threads

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        master, p = split_uri(path)
        try:
            raw = client_for(master).open(p, mode)
        except BaseException as exc:
            self.failures.append(exc)
            raise
        # buffered: pickle and torch.save issue many small reads and writes
        stream = io.BufferedWriter(raw, STREAM_BUFFER) if raw.writable() else io.BufferedReader(raw, STREAM_BUFFER)
        try:
            yield stream
            stream.close()  # flush, then close the PCache file: the shard is committed
        except BaseException as exc:
            self.failures.append(exc)
            if raw.writable():
                raw.abort()  # a failed shard commits nothing
            else:
                raw.close()
            raise

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return join_uri(os.fspath(path), suffix)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        master, src = split_uri(path)
        _, dst = split_uri(new_path)
        client_for(master).rename(src, dst)

    def init_path(self, path: str | os.PathLike) -> str:
        split_uri(path)  # validate early
        return os.fspath(path).rstrip("/")

    def mkdir(self, path: str | os.PathLike) -> None:
        master, p = split_uri(path)
        try:
            client_for(master).mkdir(p, parents=True)
        except AlreadyExists:
            pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return os.fspath(checkpoint_id).startswith(f"{SCHEME}://")

    def exists(self, path: str | os.PathLike) -> bool:
        master, p = split_uri(path)
        return client_for(master).exists(p)

    def rm_file(self, path: str | os.PathLike) -> None:
        master, p = split_uri(path)
        try:
            client_for(master).unlink(p)
        except NotFound:
            pass


class PCacheStorageWriter(_FileSystemWriter):
    """DCP ``StorageWriter`` into ``pcache://MASTER/dir`` (torch's file layout).

    Args:
        path: checkpoint directory URI.
        thread_count: parallel shard writers per rank.
        overwrite: allow replacing an existing checkpoint at ``path``.
        wait_persisted: seconds the coordinator's ``finish`` waits for the checkpoint to be in
            object storage when ``path`` is under a write-back bind (``pcache bind --mode
            writeback``; the shards are uploaded in the background as they close, ``.metadata``
            last); 0 (default) returns once it is committed in PCache.

    PCache fsyncs every block before a file's close returns, so torch's own
    ``sync_files`` (an ``os.sync()`` here) is off.

    Raises (``finish``):
        pcache.common.errors.Unavailable: an upload keeps failing. Timeout: not persisted in time.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        thread_count: int = 1,
        overwrite: bool = True,
        wait_persisted: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(path, sync_files=False, thread_count=thread_count, overwrite=overwrite, **kwargs)
        self.fs = PCacheFileSystem()
        self.path = self.fs.init_path(path)
        self.wait_persisted = wait_persisted

    def prepare_local_plan(self, plan: Any) -> Any:
        plan = super().prepare_local_plan(plan)
        if self.rank is not None and not self.use_collectives:  # each rank commits its own file
            self._decommit(self._get_metadata_path(self.rank))
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        """The coordinator's step between the ranks' plans and their writes: an existing
        checkpoint here stops being complete before any of its shards is rewritten."""
        self._decommit(self._get_metadata_path())
        return super().prepare_global_plan(plans)

    def _decommit(self, metadata_path: Any) -> None:
        if self.overwrite and self.fs.exists(metadata_path):
            self.fs.rm_file(metadata_path)

    def write_data(self, plan: Any, planner: Any) -> Future[list[WriteResult]]:
        """torch's ``write_data``, failing when any planned item was not written.

        torch's writer threads beyond the first (``thread_count > 1``) end silently on an error
        (torch 2.x ``_write_files_from_queue``): their shards were missing from a checkpoint
        whose ``.metadata`` was then committed over them, and keep-last removed the good one
        before it. Here every planned item must have its result.

        Raises:
            the first error a shard's stream ended with (``QuotaExceeded``, ``NoSpace`` ...), or
            RuntimeError when items are missing with no such error.
        """
        self.fs.failures.clear()
        results = super().write_data(plan, planner).wait()
        written = {result.index for result in results}
        missing = [item.index.fqn for item in plan.items if item.index not in written]
        if missing:
            if self.fs.failures:
                raise self.fs.failures[0]
            raise RuntimeError(
                f"{len(missing)} of the {len(plan.items)} items planned for this rank were not written"
                f" (first: {missing[0]}), with no error from their writer thread"
            )
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        if self.wait_persisted:
            master, p = split_uri(self.path)
            client_for(master).wait_persisted(p, timeout=self.wait_persisted)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return PCacheFileSystem.validate_checkpoint_id(checkpoint_id)


class PCacheStorageReader(FileSystemReader):
    """DCP ``StorageReader`` of ``pcache://MASTER/dir``; refuses an uncommitted checkpoint.

    Raises (from ``read_metadata``):
        FileNotFoundError: the directory has no ``.metadata`` (missing or incomplete checkpoint);
            ``dcp.load`` hands it on inside torch's ``CheckpointException`` (a ``BaseException``),
            which :class:`~ckpt_adapter.CheckpointManager` unwraps.
    """

    def __init__(self, path: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = PCacheFileSystem()
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return PCacheFileSystem.validate_checkpoint_id(checkpoint_id)
