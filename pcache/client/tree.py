"""Tree copies between the local disk and PCache (``pcache put``/``get``/``du``), on the async client.

Files are copied ``COPY_CONCURRENCY`` at a time, ``COPY_BUFFER`` bytes per read. A file being
written into PCache is committed only once whole (an interrupted copy leaves the old content);
one copied out lands under a ``.pcache-part`` name and is renamed into place when complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import stat as stat_mod
from typing import TYPE_CHECKING

from pcache.common.errors import AlreadyExists, InvalidArgument, NotFound
from pcache.common.paths import join, normalize

if TYPE_CHECKING:
    from pcache.client.core import PCacheClient

logger = logging.getLogger(__name__)

COPY_CONCURRENCY = 16
COPY_BUFFER = 8 << 20


async def put(client: PCacheClient, local: str, remote: str) -> tuple[int, int]:
    """Copy a local file or directory tree into PCache.

    Returns:
        (files copied, bytes copied)

    Raises:
        NotFound: ``local`` does not exist (a ``FileNotFoundError``).
    """
    remote = normalize(remote)
    if not os.path.lexists(local):
        raise NotFound("local path does not exist", path=local)
    if os.path.isdir(local) and not os.path.islink(local):
        try:
            if (await client.stat(remote)).is_dir:
                remote = join(remote, os.path.basename(os.path.abspath(local)))
        except NotFound:
            pass
        await client.mkdir(remote, parents=True)
        files: list[tuple[str, str]] = []
        for root, dirs, names in os.walk(local):
            rel = os.path.relpath(root, local)
            base = remote if rel == "." else join(remote, rel.replace(os.sep, "/"))
            for d in dirs:
                path = os.path.join(root, d)
                if os.path.islink(path):
                    files.append((path, join(base, d)))
                else:
                    await client.mkdir(join(base, d), parents=True)
            for n in names:
                path = os.path.join(root, n)
                mode = os.lstat(path).st_mode
                if stat_mod.S_ISREG(mode) or stat_mod.S_ISLNK(mode):
                    files.append((path, join(base, n)))
                else:  # FIFOs, sockets, devices have no bytes to copy (and a FIFO would block)
                    logger.warning("skipping %s: not a regular file", path)
        return await _copy_many([(src, dst) for src, dst in files], functools.partial(_put_file, client))
    try:
        if (await client.stat(remote)).is_dir:
            remote = join(remote, os.path.basename(local))
    except NotFound:
        pass
    return 1, await _put_file(client, local, remote)


async def _put_file(client: PCacheClient, local: str, remote: str) -> int:
    if os.path.islink(local):
        try:
            await client.symlink(os.readlink(local), remote)
        except AlreadyExists:
            await client.unlink(remote)
            await client.symlink(os.readlink(local), remote)
        return 0
    total = 0
    st = os.stat(local)
    if not stat_mod.S_ISREG(st.st_mode):
        raise InvalidArgument("not a regular file (FIFO, socket or device)", path=local)
    with open(local, "rb") as src:
        dst = await client.open(remote, "wb", perm=stat_mod.S_IMODE(st.st_mode))
        try:
            while buf := await asyncio.to_thread(src.read, COPY_BUFFER):
                await dst.write(buf)
                total += len(buf)
            await dst.close()
        except BaseException:
            await dst.abort()  # an existing file keeps its old content, a new one goes
            raise
    return total


async def get(client: PCacheClient, remote: str, local: str) -> tuple[int, int]:
    """Copy a PCache file or tree to the local disk; returns (files, bytes)."""
    remote = normalize(remote)
    st = await client.stat(remote)
    if st.is_dir:
        if os.path.isdir(local):
            local = os.path.join(local, st.name if remote != "/" else "")
        os.makedirs(local, exist_ok=True)
        pairs: list[tuple[str, str]] = []
        stack = [(remote, local)]
        while stack:
            rdir, ldir = stack.pop()
            async for entry in client.scandir(rdir):
                target = os.path.join(ldir, entry.name)
                if entry.is_dir:
                    os.makedirs(target, exist_ok=True)
                    stack.append((entry.path, target))
                else:
                    pairs.append((entry.path, target))
        return await _copy_many(pairs, functools.partial(_get_file, client))
    if os.path.isdir(local):
        local = os.path.join(local, st.name)
    return 1, await _get_file(client, remote, local)


async def _get_file(client: PCacheClient, remote: str, local: str) -> int:
    st = await client.stat(remote)
    if st.kind == "symlink":
        if os.path.lexists(local):
            os.unlink(local)
        os.symlink(st.symlink_target, local)
        return 0
    total = 0
    tmp = f"{local}.pcache-part"
    try:
        async with await client.open(remote, "rb") as src:
            with open(tmp, "wb") as dst:
                while True:
                    buf = await src.read(COPY_BUFFER)
                    if not buf:
                        break
                    await asyncio.to_thread(dst.write, buf)
                    total += len(buf)
        os.chmod(tmp, st.mode & 0o7777)
        os.replace(tmp, local)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.filename == tmp:  # the caller named `local`: the temporary name is this copy's own
            raise OSError(exc.errno, exc.strerror, local) from exc
        raise
    except BaseException:  # an error or Ctrl-C leaves no half-copied file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return total


async def _copy_many(pairs: list[tuple[str, str]], copy) -> tuple[int, int]:
    slots = asyncio.Semaphore(COPY_CONCURRENCY)

    async def one(src: str, dst: str) -> int:
        async with slots:
            return await copy(src, dst)

    sizes = await asyncio.gather(*(one(s, d) for s, d in pairs))
    return len(pairs), sum(sizes)


async def du(client: PCacheClient, path: str) -> tuple[int, int, int]:
    """(bytes, files, directories) under ``path``; a file with several names (hard links) counts
    once, as GNU du counts it."""
    st = await client.stat(path)
    if not st.is_dir:
        return st.size, 1, 0
    total, files, dirs = 0, 0, 1
    seen: set[int] = set()
    stack = [st.path]
    while stack:
        current = stack.pop()
        async for entry in client.scandir(current):
            if entry.is_dir:
                dirs += 1
                stack.append(entry.path)
            elif entry.nlink < 2 or entry.inode not in seen:
                if entry.nlink > 1:
                    seen.add(entry.inode)
                files += 1
                total += entry.size
    return total, files, dirs
