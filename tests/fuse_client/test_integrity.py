"""Data integrity through real mounts: no short reads, no unwritten bytes, no lost writes, no corrupt bytes.

Each test reproduces a failure that returned wrong data with no error (issue 12; the short read is
``shared/cases/short_read_through_mount.py``), against a real cluster and two real mounts.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.local import LocalCluster
from pcache.testing.faults import flip_byte, replica_files
from tests.conftest import FAST_MASTER
from tests.fuse_client.conftest import Mount

pytestmark = pytest.mark.fuse
MiB = 1 << 20
BLOCK = MiB  # the mounts' block size: many boundaries in a few MiB
UNIT_B = 192 << 10  # mount b's read unit: its boundaries fall inside blocks


@pytest.fixture(scope="module")
def two_mounts(fuse_ready, tmp_path_factory) -> Iterator[tuple[LocalCluster, Mount, Mount]]:
    """A 3-worker cluster (no memory tier: reads come from the block files) and two mounts of it."""
    root = tmp_path_factory.mktemp("integrity")
    with LocalCluster(
        str(root / "cluster"), workers=3, master_args=FAST_MASTER, worker_args=["--worker.mem_tier_bytes=0"]
    ) as cluster:
        # no layout cache: an open sees the last commit (the interleaving model checks close-to-open)
        opts = (
            "--attr-timeout",
            "0.5",
            "--entry-timeout",
            "0.5",
            f"--client.block_size={BLOCK}",
            "--client.metadata_ttl=0",
        )
        a = Mount(cluster.master_address, root / "a", *opts).start()
        b = Mount(cluster.master_address, root / "b", *opts, f"--client.read_unit={UNIT_B}").start()
        try:
            yield cluster, a, b
        finally:
            a.stop()
            b.stop()


PERIOD = 1_000_003  # prime: a byte misplaced by any block-aligned distance shows
_BASE = bytes(((i * 7919) >> 3) % 255 + 1 for i in range(PERIOD))


def pattern(offset: int, length: int) -> bytes:
    """Bytes that depend on their offset and are never zero: a misplaced or unwritten byte shows."""
    out = bytearray()
    pos = offset
    while len(out) < length:
        start = pos % PERIOD
        piece = _BASE[start : start + length - len(out)]
        out += piece
        pos += len(piece)
    return bytes(out)


def drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_with(path: Path, bufsize: int) -> bytes:
    drop_pages(path)
    out = bytearray()
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, bufsize):
            out += chunk
    finally:
        os.close(fd)
    return bytes(out)


def block_files(cluster: LocalCluster, path: str) -> list[list[Path]]:
    """For each block of ``path``, the files of its replicas on the workers' disks."""
    with Client(master=cluster.master_address) as pc:
        return replica_files(pc.layout(path))


@pytest.mark.parametrize("bufsize", [4096, 32 << 10, 128 << 10, MiB, 100_003, 777])
def test_sequential_reads_of_every_buffer_size_return_every_byte(two_mounts, bufsize: int) -> None:
    _cluster, a, b = two_mounts
    data = os.urandom(5 * BLOCK + 4321)
    (a.path / f"seq-{bufsize}.bin").write_bytes(data)
    for mount in (a, b):
        got = read_with(mount.path / f"seq-{bufsize}.bin", bufsize)
        assert len(got) == len(data) and got == data, mount.path.name


def test_reads_at_every_offset_around_block_boundaries(two_mounts) -> None:
    _cluster, a, b = two_mounts
    data = os.urandom(4 * BLOCK + 999)
    (a.path / "edges.bin").write_bytes(data)
    for mount in (a, b):  # the writer's mount and a cold one
        path = mount.path / "edges.bin"
        drop_pages(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            boundaries = sorted({*range(BLOCK, len(data), BLOCK), *range(UNIT_B, len(data), UNIT_B)})
            for boundary in boundaries:  # blocks', and read units' on mount b
                for size in (4096, 32 << 10, 128 << 10, MiB, 100_003, 1):
                    for offset in (boundary - size - 1, boundary - size, boundary - size // 2, boundary - 1, boundary):
                        if offset < 0:
                            continue
                        got = os.pread(fd, size, offset)
                        assert got == data[offset : offset + size], (mount.path.name, offset, size)
            assert os.pread(fd, MiB, len(data) - 10) == data[-10:]  # the true EOF is short, and only it
        finally:
            os.close(fd)


def test_default_32mib_blocks_through_shell_tools(two_mounts) -> None:
    cluster, a, _b = two_mounts
    data = os.urandom(70 * MiB)
    with Client(master=cluster.master_address) as pc:  # the SDK's default block size: 32 MiB
        pc.write_file("/sdk-70m.bin", data)
    path = a.path / "sdk-70m.bin"
    want = hashlib.sha256(data).hexdigest()
    drop_pages(path)
    out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[0] == want
    drop_pages(path)
    dd = subprocess.run(
        f"dd if={path} bs=32k status=none | sha256sum", shell=True, capture_output=True, text=True, timeout=120
    )
    assert dd.stdout.split()[0] == want
    assert hashlib.sha256(read_with(path, 8192)).hexdigest() == want


APPENDER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {root!r})
    from tests.fuse_client.test_integrity import pattern
    path, total, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for off in range(0, total, step):
        os.write(fd, pattern(off, step))
        os.fsync(fd)
    os.close(fd)
    """
)


def test_readers_never_see_bytes_that_were_not_written_while_a_writer_appends(two_mounts, tmp_path: Path) -> None:
    _cluster, a, b = two_mounts
    total, step = 12 * MiB, 256 << 10
    script = tmp_path / "appender.py"
    script.write_text(APPENDER.format(root=str(Path(__file__).resolve().parents[2])))
    target = a.path / "appended.bin"
    target.write_bytes(b"")
    writer = subprocess.Popen([sys.executable, str(script), str(target), str(total), str(step)])
    bad: list[str] = []
    reads = {"reopen-same": 0, "tail-same": 0, "reopen-other": 0}

    def check(where: str, offset: int, got: bytes) -> None:
        if got != pattern(offset, len(got)):
            zeros = got.count(0)
            bad.append(f"{where}: {len(got)} bytes at {offset} differ from what was written ({zeros} zero bytes)")

    def reopen(mount: Mount, name: str) -> None:
        while writer.poll() is None and not bad:
            got = (mount.path / "appended.bin").read_bytes()
            check(name, 0, got)
            reads[name] += 1

    def tail() -> None:
        with open(target, "rb", buffering=0) as fh:
            pos = 0
            while not bad:
                done = writer.poll() is not None
                got = fh.read(1 << 20)
                check("tail-same", pos, got)
                pos += len(got)
                reads["tail-same"] += 1
                if done and not got:
                    break
                if not got:
                    time.sleep(0.01)

    threads = [
        threading.Thread(target=reopen, args=(a, "reopen-same")),
        threading.Thread(target=reopen, args=(b, "reopen-other")),
        threading.Thread(target=tail),
    ]
    for t in threads:
        t.start()
    assert writer.wait(180) == 0
    for t in threads:
        t.join(60)
    assert not bad, bad[:5]
    assert all(reads.values()), reads
    assert (b.path / "appended.bin").read_bytes() == pattern(0, total)


DISJOINT_WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    from tests.fuse_client.test_integrity import pattern
    path, offset, length, barrier, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    fd = os.open(path, os.O_WRONLY)
    open(os.path.join(barrier, str(offset)), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < count and time.monotonic() < deadline:  # every writer has opened
        time.sleep(0.01)
    try:
        for pos in range(offset, offset + length, 1 << 20):
            n = min(1 << 20, offset + length - pos)
            os.pwrite(fd, pattern(pos, n), pos)
        os.fsync(fd)
        os.close(fd)
    except OSError as exc:
        print(exc.errno)
        sys.exit(1)
    """
)


def run_disjoint_writers(script: Path, path: Path, ranges: list[tuple[int, int]]) -> list[int]:
    """One process per (offset, length) range, all holding the file open before any writes; their exit codes."""
    barrier = script.parent / f"barrier-{path.name}"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), str(off), str(n), str(barrier), str(len(ranges))],
            stdout=subprocess.PIPE,
            text=True,
        )
        for off, n in ranges
    ]
    return [p.wait(120) for p in procs]


@pytest.mark.parametrize("prefill", [False, True], ids=["sparse", "prefilled"])
def test_disjoint_writers_of_one_file_all_keep_their_bytes(two_mounts, tmp_path: Path, prefill: bool) -> None:
    _cluster, a, b = two_mounts
    script = tmp_path / "writer.py"
    script.write_text(DISJOINT_WRITER.format(root=str(Path(__file__).resolve().parents[2])))
    span = 3 * BLOCK
    target = a.path / f"disjoint-{prefill}.bin"
    if prefill:
        target.write_bytes(b"\0" * (4 * span))
    else:
        subprocess.run(["truncate", "-s", str(4 * span), str(target)], check=True)
    ranges = [(i * span, span) for i in range(4)]
    assert run_disjoint_writers(script, target, ranges) == [0, 0, 0, 0]
    got = (b.path / target.name).read_bytes()
    assert len(got) == 4 * span
    for off, n in ranges:
        assert got[off : off + n] == pattern(off, n), f"range at {off} lost"


def test_writers_sharing_a_block_keep_their_bytes_or_get_an_error(two_mounts, tmp_path: Path) -> None:
    _cluster, a, b = two_mounts
    script = tmp_path / "writer.py"
    script.write_text(DISJOINT_WRITER.format(root=str(Path(__file__).resolve().parents[2])))
    target = a.path / "shared-blocks.bin"
    subprocess.run(["truncate", "-s", str(4 * BLOCK), str(target)], check=True)
    span = BLOCK + BLOCK // 3  # every range ends inside a block the next one starts in
    ranges = [(i * span, span) for i in range(3)]
    codes = run_disjoint_writers(script, target, ranges)
    got = (b.path / target.name).read_bytes()
    for (off, n), code in zip(ranges, codes, strict=True):
        if code == 0:
            assert got[off : off + n] == pattern(off, n), f"writer at {off} was told ok and lost its range"
    assert 0 in codes  # the first commit always lands


def test_a_flipped_byte_is_never_served_after_a_warm_read(two_mounts) -> None:
    cluster, a, b = two_mounts
    data = os.urandom(2 * BLOCK)
    path = a.path / "flip.bin"
    path.write_bytes(data)
    assert read_with(path, MiB) == data  # warm: descriptors open, chunks verified once
    replicas = block_files(cluster, "/flip.bin")
    assert all(len(r) >= 2 for r in replicas)
    flip_byte(replicas[0][0], 4242)
    for blk in replicas[0][0:1]:
        drop_pages(blk)
    assert read_with(path, 128 << 10) == data  # the good replica, or the damaged one caught
    for blk in replicas[1]:  # every replica of block 1
        flip_byte(blk, 777)
    # the mount may still hold verified chunks of block 1 in memory (its client's VerifiedChunks,
    # filled by the small reads above): it serves those, or fails; never the flipped byte
    try:
        assert read_with(path, MiB) == data
    except OSError as exc:
        assert exc.errno == errno.EIO
    with (  # a client with nothing cached finds the damage
        Client(master=cluster.master_address) as fresh,
        fresh.open("/flip.bin", "rb") as f,
        pytest.raises((E.CorruptBlock, E.Unavailable)),
    ):
        f.pread(BLOCK, MiB)
    with pytest.raises(OSError) as info:  # and through a mount that has nothing of it in memory
        read_with(b.path / "flip.bin", MiB)
    assert info.value.errno == errno.EIO


class Model:
    """What the mounts promise for one file of fixed size written by several handles.

    Close-to-open with block-granularity merges: a handle's commit (fsync, close) lands the blocks
    it changed unless another handle's commit changed one of them since its view, in which case it
    fails and keeps failing; a commit adopts the merged content as the handle's view. Every byte
    ever read was written at that offset by someone (the file starts filled with value 1, so a zero
    is never right); a handle opened after the last commit, on a mount with no writer, reads the
    committed content exactly; a writer reads back what it wrote.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.committed = bytearray(b"\1" * size)
        self.gen = [0] * (size // BLOCK)  # per block: bumped by each commit that changes it
        self.history = [{1} for _ in range(size)]  # every value each offset ever held
        self.commits = 0

    def blocks(self, off: int, n: int) -> range:
        return range(off // BLOCK, (off + n - 1) // BLOCK + 1)


class Handle:
    def __init__(self, model: Model, fd: int, mount: str, writable: bool) -> None:
        self.fd, self.mount, self.writable = fd, mount, writable
        self.view = bytearray(model.committed)
        self.base = list(model.gen)
        self.dirty: set[int] = set()
        self.mine: dict[int, int] = {}  # offset -> value this handle wrote since its last commit
        self.opened_at = model.commits
        self.conflicted = False


def run_interleaving(seed: int, paths: dict[str, Path], steps: int) -> None:
    import random

    rng = random.Random(seed)
    model = Model(4 * BLOCK)
    name = f"model-{seed}.bin"
    (paths["a"] / name).write_bytes(bytes(model.committed))
    handles: list[Handle] = []
    value = 1
    log: list[str] = []

    def writer_on(mount: str) -> Handle | None:
        return next((h for h in handles if h.writable and h.mount == mount), None)

    def commit(h: Handle, op) -> None:
        conflict = h.conflicted or any(model.gen[i] != h.base[i] for i in h.dirty)
        if not h.dirty:
            op()
            return
        if conflict:
            with pytest.raises(OSError) as info:
                op()
            assert info.value.errno == errno.ESTALE, log[-20:]
            h.conflicted = True
            return
        op()
        model.commits += 1
        for i in h.dirty:
            start = i * BLOCK
            model.committed[start : start + BLOCK] = h.view[start : start + BLOCK]
            model.gen[i] = model.commits
        h.view, h.base, h.dirty, h.mine = bytearray(model.committed), list(model.gen), set(), {}

    for _ in range(steps):
        kinds = ["open"] if len(handles) < 4 else []
        if handles:
            kinds += ["write", "read", "read", "fsync", "close"]
        kind = rng.choice(kinds)
        if kind == "open":
            mount = rng.choice("ab")
            writable = writer_on(mount) is None and rng.random() < 0.6
            fd = os.open(paths[mount] / name, os.O_RDWR if writable else os.O_RDONLY)
            handles.append(Handle(model, fd, mount, writable))
            log.append(f"open {mount} {'rw' if writable else 'ro'} fd={fd}")
            continue
        h = rng.choice(handles)
        if kind == "write" and h.writable:
            value = value % 254 + 2  # 2..255: never the fill value, never zero
            n = rng.choice([1, 4096, 65536, BLOCK // 3, BLOCK + 5])
            off = rng.randrange(0, model.size - n)
            assert os.pwrite(h.fd, bytes([value]) * n, off) == n
            h.view[off : off + n] = bytes([value]) * n
            h.dirty.update(model.blocks(off, n))
            for pos in range(off, off + n):
                h.mine[pos] = value
                model.history[pos].add(value)
            log.append(f"write fd={h.fd} {off}+{n}={value}")
        elif kind == "read":
            n = rng.choice([4096, 131072, BLOCK, 100_003])
            off = rng.randrange(0, model.size)
            got = os.pread(h.fd, n, off)
            log.append(f"read fd={h.fd} {off}+{n}")
            assert len(got) == min(n, model.size - off), log[-20:]
            for i, byte in enumerate(got):
                if byte not in model.history[off + i]:
                    raise AssertionError(f"byte {off + i} = {byte}: never written there; {log[-20:]}")
            exact = not h.writable and h.opened_at == model.commits and writer_on(h.mount) is None
            if exact:
                assert got == bytes(model.committed[off : off + len(got)]), f"stale read after open; {log[-20:]}"
            for pos, val in h.mine.items() if h.writable else ():
                if off <= pos < off + len(got):
                    assert got[pos - off] == val, f"a writer lost its own byte {pos}; {log[-20:]}"
        elif kind == "fsync" and h.writable:
            log.append(f"fsync fd={h.fd}")
            commit(h, lambda fd=h.fd: os.fsync(fd))
        elif kind == "close":
            log.append(f"close fd={h.fd}")
            handles.remove(h)
            if h.writable:
                commit(h, lambda fd=h.fd: os.close(fd))
            else:
                os.close(h.fd)
    for h in list(handles):
        handles.remove(h)
        if h.writable:
            commit(h, lambda fd=h.fd: os.close(fd))
        else:
            os.close(h.fd)
    for mount in "ab":
        assert (paths[mount] / name).read_bytes() == bytes(model.committed), f"final content on {mount}; {log[-20:]}"


def test_random_interleavings_of_handles_on_two_mounts_match_the_model(two_mounts) -> None:
    _cluster, a, b = two_mounts
    deadline = time.monotonic() + 40  # bounded in CI: as many seeds as fit
    seed = 0
    while seed < 3 or (time.monotonic() < deadline and seed < 40):
        try:
            run_interleaving(seed, {"a": a.path, "b": b.path}, steps=60)
        except (AssertionError, OSError) as exc:  # name the seed and show what the mounts logged
            tails = {m.path.name: m.log.read_text(errors="replace")[-3000:] for m in (a, b)}
            raise AssertionError(f"seed {seed}: {exc!r}\nmount logs: {tails}") from exc
        seed += 1


def test_a_name_that_is_not_utf8_gets_eilseq_not_eio(two_mounts) -> None:
    _cluster, a, _b = two_mounts
    bad = os.path.join(os.fsencode(a.path), b"caf\xe9.bin")
    with pytest.raises(OSError) as info:
        os.close(os.open(bad, os.O_CREAT | os.O_WRONLY, 0o644))
    assert info.value.errno == errno.EILSEQ
    with pytest.raises(OSError) as info:
        os.mkdir(os.path.join(os.fsencode(a.path), b"dir\xff"))
    assert info.value.errno == errno.EILSEQ


def test_salvage_refuses_to_write_into_a_pcache_mount(two_mounts, tmp_path: Path) -> None:
    cluster, a, _b = two_mounts
    (a.path / "victim.bin").write_bytes(b"x" * 1000)
    with Client(master=cluster.master_address) as pc:
        with pytest.raises(E.InvalidArgument):  # it could replace the very file it salvages
            pc.salvage("/victim.bin", str(a.path / "victim.bin"))
        assert pc.salvage("/victim.bin", str(tmp_path / "ok.bin")).lost == []
    assert (a.path / "victim.bin").read_bytes() == b"x" * 1000 == (tmp_path / "ok.bin").read_bytes()


def test_two_write_handles_on_one_mount_share_their_bytes_and_appends(two_mounts) -> None:
    _cluster, a, b = two_mounts
    path = a.path / "shared.bin"
    path.write_bytes(b"")
    f1 = os.open(path, os.O_WRONLY | os.O_APPEND)
    f2 = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(f1, b"AAAAA")
    os.write(f2, b"BBB")
    assert path.read_bytes() == b"AAAAABBB"  # a reader of the mount sees both handles' bytes
    os.write(f1, b"CC")  # O_APPEND appends at the one end of the file
    os.close(f1)
    os.close(f2)  # no ESTALE: one File behind both handles
    assert (b.path / "shared.bin").read_bytes() == b"AAAAABBBCC"
    # two processes appending a line per open/write/close: every line kept, every close ok
    log = a.path / "lines.log"
    log.write_bytes(b"")
    child = (
        "import os, sys\n"
        "errors = 0\n"
        "for i in range(40):\n"
        "    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
        "    os.write(fd, f'{sys.argv[2]} {i}\\n'.encode())\n"
        "    try:\n"
        "        os.close(fd)\n"
        "    except OSError:\n"
        "        errors += 1\n"
        "print(errors)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", child, str(log), tag], stdout=subprocess.PIPE, text=True)
        for tag in "AB"
    ]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["0", "0"]
    lines = (b.path / "lines.log").read_text().splitlines()
    assert sorted(lines) == sorted(f"{t} {i}" for t in "AB" for i in range(40))


def test_readers_of_a_file_another_mount_rewrites_never_hang_and_read_each_commit_whole(two_mounts) -> None:
    """Eight readers on mount b reopen a file mount a rewrites with growing and shrinking sizes,
    while another reader streams a large file on b (reads in flight, pages locked): the opens
    that drop the kernel's pages wait for those pages, and must never stall the mount.

    Close-to-open: a read that no commit overlapped (opened after one rewrite's close, done before
    the next began) returns that version whole (or cut to a size the kernel still held from an
    older version: ``--attr-timeout``). A read that a commit overlapped may return bytes of both
    versions, as on NFS or a local disk (the kernel's page cache and size are per inode: a
    ``read()`` after the new size arrived continues in the new version), but never a byte that no
    version had at its offset (a zero-filled tail, old pages past the old size).
    """
    _cluster, a, b = two_mounts
    versions = [bytes([65 + i]) * (3000 + (i % 4) * 70_000) for i in range(12)]
    (a.path / "flip.bin").write_bytes(versions[0])
    (a.path / "stream.bin").write_bytes(os.urandom(24 * MiB))
    began, ended = [0.0], [time.monotonic()]  # per version: when its rewrite began and closed
    stop = threading.Event()
    reads: list[tuple[float, float, list[tuple[int, int, int]]]] = []  # (opened, done, runs)

    def reopen() -> None:
        while not stop.is_set():
            opened = time.monotonic()
            got = (b.path / "flip.bin").read_bytes()
            done = time.monotonic()
            if got and got == got[:1] * len(got):  # the common case, checked without a Python loop
                runs = [(got[0], 0, len(got))]
            else:  # (byte value, offset, length) of each run of one value
                runs, pos = [], 0
                for value, run in itertools.groupby(got):
                    n = sum(1 for _ in run)
                    runs.append((value, pos, n))
                    pos += n
            reads.append((opened, done, runs))

    def stream() -> None:
        while not stop.is_set():
            read_with(b.path / "stream.bin", MiB)

    threads = [threading.Thread(target=reopen) for _ in range(8)] + [threading.Thread(target=stream)]
    for t in threads:
        t.start()
    try:
        for version in versions[1:]:
            began.append(time.monotonic())
            (a.path / "flip.bin").write_bytes(version)
            ended.append(time.monotonic())
            time.sleep(0.1)
        time.sleep(0.4)  # a last window no commit overlaps
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert len(reads) > 20
    whole = mixed = 0
    for opened, done, runs in reads:
        assert runs, "an empty read: the file was never empty"
        for value, offset, n in runs:
            i = value - 65
            assert 0 <= i < len(versions) and offset + n <= len(versions[i]), (
                f"{n} bytes of {bytes([value])!r} at {offset}: no version had them there ({runs[:6]})"
            )
        last = max(v for v in range(len(versions)) if ended[v] <= opened)  # committed before the open
        if last == len(versions) - 1 or done <= began[last + 1]:
            whole += 1
            assert len(runs) == 1 and runs[0][0] == 65 + last, (
                f"a read no commit overlapped is not (a prefix of) version {last}: {runs[:6]} opened={opened:.6f} done={done:.6f} ended={ended} began={began}"
            )
        mixed += len(runs) > 1
    assert whole > 0, "no read fell between two commits"
    assert (b.path / "flip.bin").read_bytes() == versions[-1]
    print(f"{len(reads)} reads: {whole} between commits (each one version), {mixed} overlapping a commit mixed")
