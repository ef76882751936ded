"""Verify that a destination object holds the source's bytes, at three costs (async, any backend).

* ``metadata``: :func:`check_metadata` compares what ``head`` returns (size, Babel's stored
  CRC32C and source mtime, the stores' own checksums); no data is read.
* ``sample``: :func:`check_sample` reads the same few ranges of both objects
  (:func:`babel.checksum.sample_ranges`: head, tail and one per stripe, 32 MiB by default)
  and compares their CRC32C. It is a fast pre-check: it catches truncation, shifted or
  swapped parts and wholesale corruption, but a small corrupted region only with the
  probability :func:`babel.checksum.detection_probability` gives (about 0.6% for 1 MiB in
  10 GiB at the defaults).
* ``full``: :func:`check_full` reads the whole destination and compares its CRC32C with the
  one computed in-stream while the source was read. This is the integrity guarantee.

Only the :class:`~objstore.base.ObjectStore` contract is used (``get`` with ranges), so
every backend can be verified; ranges are read concurrently and their CRCs combined in order
(:func:`babel.checksum.crc32c_combine`), with memory bounded by ``concurrency * chunk``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from babel.checksum import crc32c, crc32c_combine, sample_ranges
from babel.errors import BabelError
from objstore.base import META_CRC32C, META_MTIME, META_SRC_ETAG, ObjectInfo, ObjectStore

logger = logging.getLogger(__name__)

MiB = 1 << 20
MTIME_TOLERANCE = 0.001  # seconds: stores keep mtimes at ms (S3) to ns (file systems) resolution
_THREAD_MIN = 256 * 1024  # CRC larger buffers in a worker thread (the crc32c package drops the GIL)

Mode = Literal["metadata", "sample", "full"]


@dataclass
class VerifyResult:
    """The outcome of one check of one object.

    Attributes:
        key: the object's key (the source's when the keys differ).
        mode: which check ran.
        ok: whether the destination matched.
        detail: empty when ``ok``; else the first difference found, e.g. ``"size 10 != 11"`` or
            ``"sample 3 at offset 1048576+1048576: crc32c 0x1a2b3c4d != 0x5e6f7a8b"``
            (source's value first).
        bytes_read: bytes read from both stores together.
        ranges: ranged reads issued (both stores together).
    """

    key: str
    mode: Mode
    ok: bool
    detail: str = ""
    bytes_read: int = 0
    ranges: int = 0


async def _crc(data: bytes) -> int:
    if len(data) >= _THREAD_MIN:
        return await asyncio.to_thread(crc32c, data)
    return crc32c(data)


async def _read_crc(store: ObjectStore, key: str, offset: int, length: int) -> tuple[int, int]:
    """Return (CRC32C, bytes returned) of one range; the bytes are dropped before returning."""
    data = await store.get(key, offset, length)
    return await _crc(data), len(data)


async def _crc_ranges(
    store: ObjectStore, key: str, ranges: list[tuple[int, int]], concurrency: int
) -> list[tuple[int, int]]:
    """(CRC32C, bytes returned) of each range, at most ``concurrency`` reads in flight."""
    results: list[tuple[int, int]] = [(0, 0)] * len(ranges)
    todo = iter(enumerate(ranges))

    async def worker() -> None:
        for i, (offset, length) in todo:  # workers share one iterator: each range is read once
            results[i] = await _read_crc(store, key, offset, length)

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(concurrency, len(ranges))):
                tg.create_task(worker())
    except ExceptionGroup as group:  # the first failure cancels the other workers: raise it as itself
        first = group.exceptions[0]
        raise first from first.__cause__  # its own cause, not the group's
    return results


def _chunks(size: int, chunk: int) -> list[tuple[int, int]]:
    return [(off, min(chunk, size - off)) for off in range(0, size, chunk)]


async def _whole_crc(store: ObjectStore, key: str, size: int, chunk: int, concurrency: int) -> tuple[int, int, int]:
    """(CRC32C, bytes returned, reads) of the first ``size`` bytes of an object."""
    if chunk < 1 or concurrency < 1:
        raise ValueError(f"need chunk >= 1 and concurrency >= 1 (got {chunk}, {concurrency})")
    ranges = _chunks(size, chunk)
    if len(ranges) == 1:  # one read: a whole GET (a range may take a slower path: rclone serve s3
        data = await store.get(key)  # answers ranges with 200), and a longer object shows as such
        return await _crc(data), len(data), 1
    crc, total = 0, 0
    for part_crc, n in await _crc_ranges(store, key, ranges, concurrency):
        crc = crc32c_combine(crc, part_crc, n)
        total += n
    return crc, total, len(ranges)


async def object_crc32c(store: ObjectStore, key: str, size: int, *, chunk: int = 8 * MiB, concurrency: int = 8) -> int:
    """Return the CRC32C of a ``size``-byte object, read as concurrent ranged ``get``s.

    The object is read in ``chunk``-byte ranges, at most ``concurrency`` at a time (so at most
    ``concurrency * chunk`` bytes are held), each checksummed as it arrives; the chunk CRCs are
    combined in order with :func:`~babel.checksum.crc32c_combine`.

    Raises:
        NoSuchKey: the object does not exist.
        BabelError: the object is shorter than ``size`` (S3 answers a range past the end with
            InvalidRange), or longer when it is read in one GET (``size <= chunk``), or another
            store error, per backend.
        ValueError: ``chunk`` or ``concurrency`` below 1.
    """
    crc, total, _ = await _whole_crc(store, key, size, chunk, concurrency)
    if total != size:
        what = "shorter" if total < size else "longer"
        raise BabelError(f"read {total} of {size} bytes: the object is {what}", uri=f"{store.uri}/{key}")
    return crc


async def _size_mismatch(size: int, src: tuple[ObjectStore, str] | None, dst: tuple[ObjectStore, str]) -> str:
    """``"size A != B"`` when ``head`` sizes disagree (source or expected size first), else ``""``.

    Ranged reads of ``size`` bytes alone would miss bytes that a longer object has past the end.
    """
    infos = await asyncio.gather(*(store.head(k) for store, k in ([src] if src else []) + [dst]))
    *src_info, dst_info = infos
    if src_info and src_info[0].size != dst_info.size:
        return f"size {src_info[0].size} != {dst_info.size}"
    if dst_info.size != size:
        return f"size {size} != {dst_info.size}"
    return ""


def _crc_hex(crc: int) -> str:
    return f"0x{crc:08x}"


async def check_metadata(src_info: ObjectInfo, dst_info: ObjectInfo) -> VerifyResult:
    """Compare two ``head`` results; no data is read. Rules, in order (the first failing one is reported):

    1. the sizes are equal;
    2. when both carry :data:`~objstore.base.META_CRC32C` in their metadata, the values
       are equal (as hex numbers);
    3. for each algorithm in both ``checksums`` (stores' own, e.g. OSS ``crc64ecma``), the
       values are equal;
    4. when the destination carries :data:`~objstore.base.META_MTIME` (the source mtime
       Babel stored), it is within 1 ms of the source's mtime, or of the source's own
       ``META_MTIME`` when the source is itself a Babel copy.

    A destination without Babel metadata (e.g. ``file://``) is checked on size (and store
    checksums) alone.
    """

    def result(detail: str = "") -> VerifyResult:
        return VerifyResult(src_info.key, "metadata", not detail, detail)

    if src_info.size != dst_info.size:
        return result(f"size {src_info.size} != {dst_info.size}")
    src_crc, dst_crc = src_info.metadata.get(META_CRC32C), dst_info.metadata.get(META_CRC32C)
    if src_crc is not None and dst_crc is not None:
        try:
            same = int(src_crc, 16) == int(dst_crc, 16)
        except ValueError:
            same = src_crc == dst_crc
        if not same:
            return result(f"{META_CRC32C} {src_crc} != {dst_crc}")
    for algo in sorted(src_info.checksums.keys() & dst_info.checksums.keys()):
        if src_info.checksums[algo] != dst_info.checksums[algo]:
            return result(f"{algo} {src_info.checksums[algo]} != {dst_info.checksums[algo]}")
    if src_info.etag and dst_info.metadata.get(META_SRC_ETAG) == src_info.etag:
        return result()  # copied from this very version of the source object
    stored = dst_info.metadata.get(META_MTIME)
    if stored is not None:
        try:
            dst_mtime = float(stored)
        except ValueError:
            return result(f"{META_MTIME} {stored!r} is not a number")
        candidates = [src_info.mtime]
        if META_MTIME in src_info.metadata:
            try:
                candidates.append(float(src_info.metadata[META_MTIME]))
            except ValueError:
                pass
        if all(abs(dst_mtime - m) > MTIME_TOLERANCE for m in candidates):
            return result(f"mtime {src_info.mtime:.6f} != {META_MTIME} {dst_mtime:.6f}")
    return result()


async def check_sample(
    src: ObjectStore,
    dst: ObjectStore,
    key: str,
    size: int,
    *,
    samples: int = 32,
    sample_size: int = MiB,
    dst_key: str | None = None,
    seed: str | None = None,
    concurrency: int = 8,
) -> VerifyResult:
    """Compare the CRC32C of the same sampled ranges of the source and destination objects.

    The ranges are :func:`~babel.checksum.sample_ranges` of ``size`` with ``seed`` (default:
    ``key``), at most ``samples * sample_size`` bytes from each side, read from both stores
    concurrently (``concurrency`` ranges in flight per store), after a ``head`` of each whose
    sizes must match ``size``. A fast pre-check, not a proof:
    a corrupted region that falls between the ranges is missed (see
    :func:`~babel.checksum.detection_probability`); :func:`check_full` is the guarantee.

    Args:
        key: the source key; ``dst_key`` the destination's when it differs.
        size: the object size in bytes (the source's, from a listing or ``head``).

    Returns:
        ``detail`` ``"size A != B"`` (sizes from ``head``, source first), or the first mismatching
        range in offset order, e.g.
        ``"sample 3 at offset 1048576+1048576: crc32c 0x... != 0x..."`` (source first), or a
        short read: ``"sample 31 at offset ...: read 10 of 1048576 bytes from dst"``.

    Raises:
        NoSuchKey: either object is missing (other store errors per backend).
    """
    mismatch = await _size_mismatch(size, (src, key), (dst, dst_key or key))
    if mismatch:
        return VerifyResult(key, "sample", False, mismatch)
    ranges = sample_ranges(size, seed=key if seed is None else seed, samples=samples, sample_size=sample_size)
    theirs, ours = await asyncio.gather(
        _crc_ranges(src, key, ranges, concurrency),
        _crc_ranges(dst, dst_key or key, ranges, concurrency),
    )
    read = sum(n for _, n in theirs) + sum(n for _, n in ours)
    detail = ""
    for i, ((offset, length), (src_crc, src_n), (dst_crc, dst_n)) in enumerate(zip(ranges, theirs, ours, strict=True)):
        where = f"sample {i} at offset {offset}+{length}"
        if src_n != length or dst_n != length:
            side, n = ("src", src_n) if src_n != length else ("dst", dst_n)
            detail = f"{where}: read {n} of {length} bytes from {side}"
        elif src_crc != dst_crc:
            detail = f"{where}: crc32c {_crc_hex(src_crc)} != {_crc_hex(dst_crc)}"
        if detail:
            break
    if detail:
        logger.debug("sample check of %s failed: %s", key, detail)
    return VerifyResult(key, "sample", not detail, detail, read, 2 * len(ranges))


async def check_full(
    dst: ObjectStore,
    key: str,
    size: int,
    expected_crc32c: int | None = None,
    *,
    src: ObjectStore | None = None,
    dst_key: str | None = None,
    chunk: int = 8 * MiB,
    concurrency: int = 8,
    dst_info: ObjectInfo | None = None,
) -> VerifyResult:
    """Compare the CRC32C of the whole destination object with the source's: the integrity guarantee.

    ``expected_crc32c`` is the CRC the transfer computed in-stream while it read the source
    (so the source is not read again); when it is None, the source object ``key`` in ``src``
    is checksummed as well, concurrently. A ``head`` of each object read comes first: its size
    must be ``size`` (bytes past ``size`` would not be read). Reads go through
    :func:`object_crc32c`'s ranged, bounded-memory path (``chunk`` bytes, ``concurrency`` in
    flight per store).

    Args:
        key: the source key; ``dst_key`` the destination's when it differs.
        size: the object size in bytes.
        dst_info: the destination's ``head`` when the caller has it (saves one request when
            ``expected_crc32c`` is given).

    Returns:
        ``detail`` ``"size A != B"`` (source or ``size`` first), ``"crc32c 0x... != 0x..."``
        (expected first), or ``"read N of M bytes from dst"`` when an object shrank between
        ``head`` and the reads.

    Raises:
        ValueError: neither ``expected_crc32c`` nor ``src`` given.
        NoSuchKey: an object is missing (other store errors per backend).
    """
    if expected_crc32c is None and src is None:
        raise ValueError("check_full needs expected_crc32c or a src store to compute it from")
    dst_side = (dst, dst_key or key)
    src_side = (src, key) if expected_crc32c is None and src is not None else None
    if dst_info is not None and src_side is None:
        mismatch = f"size {size} != {dst_info.size}" if dst_info.size != size else ""
    else:
        mismatch = await _size_mismatch(size, src_side, dst_side)
    if mismatch:
        return VerifyResult(key, "full", False, mismatch)
    sides = await asyncio.gather(
        *(_whole_crc(store, k, size, chunk, concurrency) for store, k in ([src_side] if src_side else []) + [dst_side])
    )
    *src_crc, (dst_crc, dst_n, _) = sides
    read = sum(s[1] for s in sides)
    detail = ""
    if src_crc and src_crc[0][1] != size:  # changed between head and read
        detail = f"read {src_crc[0][1]} of {size} bytes from src"
    elif dst_n != size:
        detail = f"read {dst_n} of {size} bytes from dst"
    else:
        expected = src_crc[0][0] if src_crc else expected_crc32c
        if expected != dst_crc:
            detail = f"crc32c {_crc_hex(expected or 0)} != {_crc_hex(dst_crc)}"
    if detail:
        logger.debug("full check of %s failed: %s", key, detail)
    return VerifyResult(key, "full", not detail, detail, read, sum(s[2] for s in sides))


__all__ = ["VerifyResult", "check_full", "check_metadata", "check_sample", "object_crc32c"]
