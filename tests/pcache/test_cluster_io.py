"""End-to-end I/O against a real cluster of processes on loopback."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.config import ClientConfig
from tests.conftest import stdlib_copy, tree_digest

MiB = 1 << 20


@contextlib.contextmanager
def counted_rpcs(client: Client):
    """Record the name of every master RPC the client makes inside the block."""
    calls: list[str] = []
    master = client.aio.master
    original = master._call

    async def counting(name, request):
        calls.append(name)
        return await original(name, request)

    master._call = counting
    try:
        yield calls
    finally:
        master._call = original


def run_cli(master: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pcache", "--master", master, *args], capture_output=True, text=True, timeout=300
    )


def test_put_get_stdlib_tree_is_byte_identical(shared_cluster, tmp_path: Path) -> None:
    src = stdlib_copy(tmp_path / "src")
    put = run_cli(shared_cluster.master_address, "put", str(src), "/stdlib")
    assert put.returncode == 0, put.stderr
    got = run_cli(shared_cluster.master_address, "get", "/stdlib", str(tmp_path / "dst"))
    assert got.returncode == 0, got.stderr
    want, have = tree_digest(src), tree_digest(tmp_path / "dst")
    assert len(want) > 1000
    assert have == want
    du = run_cli(shared_cluster.master_address, "du", "/stdlib")
    total = sum(size for size, _ in want.values() if size >= 0)
    assert du.stdout.split()[0] == str(total)


def test_file_semantics_overwrite_append_truncate_holes(client: Client) -> None:
    client.mkdir("/sem", parents=True)
    bs = 4 * MiB
    base = os.urandom(10 * MiB + 123)
    with client.open("/sem/f", "wb", block_size=bs) as f:
        f.write(base)
    model = bytearray(base)
    with client.open("/sem/f", "r+b") as f:  # overwrite across a block boundary
        f.seek(bs - 10)
        f.write(b"X" * 20)
    model[bs - 10 : bs + 10] = b"X" * 20
    with client.open("/sem/f", "ab") as f:
        f.write(b"tail")
    model += b"tail"
    assert client.read_file("/sem/f") == bytes(model)
    client.truncate("/sem/f", 5 * MiB + 1)
    del model[5 * MiB + 1 :]
    assert client.read_file("/sem/f") == bytes(model)
    client.truncate("/sem/f", 9 * MiB)  # grow: zeros
    model += bytes(9 * MiB - len(model))
    assert client.read_file("/sem/f") == bytes(model)
    with client.open("/sem/hole", "wb", block_size=bs) as f:  # write past the end leaves zeros
        f.seek(2 * bs + 5)
        f.write(b"end")
    assert client.read_file("/sem/hole") == bytes(2 * bs + 5) + b"end"
    assert client.stat("/sem/hole").size == 2 * bs + 8
    with client.open("/sem/empty", "wb"):
        pass
    assert client.read_file("/sem/empty") == b""


def test_close_to_open_visibility(shared_cluster, client: Client) -> None:
    client.write_file("/c2o", b"old" * 1000)
    with Client(ClientConfig(master=shared_cluster.master_address, metadata_ttl=0)) as other:
        w = client.open("/c2o", "r+b")
        w.write(b"new")
        assert other.read_file("/c2o")[:3] == b"old"  # not visible before close
        w.close()
        assert other.read_file("/c2o")[:3] == b"new"  # visible after close
        reader = other.open("/c2o", "rb")  # a reader opened before a rewrite keeps its snapshot
        client.write_file("/c2o", b"z" * 10)
        assert reader.read() == b"new" + b"old" * 999
        reader.close()


def test_blocks_striped_and_replicated(client: Client) -> None:
    # 24 blocks at RF=2: placement is by reported load (power of two choices), so a few blocks
    # may all miss one worker when its last heartbeat found it busy; 48 placements never do
    with client.open("/striped", "wb", block_size=2 * MiB) as f:
        f.write(os.urandom(48 * MiB))
    layout = client._run(client.aio.master.layout(path="/striped"))
    assert len(layout.blocks) == 24
    holders = set()
    for blk in layout.blocks:
        ids = [r.worker_id for r in blk.replicas]
        assert len(ids) == 2 and len(set(ids)) == 2  # RF=2 on distinct workers
        holders.update(ids)
    assert len(holders) == 3  # striped over every worker


def test_bad_paths_give_clear_errors(shared_cluster, client: Client) -> None:
    cases = {
        "/a/../b": E.InvalidPath,
        "/a/\x00b": E.InvalidPath,
        "relative/path": E.InvalidPath,
        "/a//b": E.InvalidPath,
        "/" + "n" * 256: E.NameTooLong,
        "/no/such/parent/file": E.NotFound,
    }
    for path, cls in cases.items():
        with pytest.raises(cls) as info:
            client.write_file(path, b"x")
        assert isinstance(info.value, OSError) and info.value.errno in (errno.EINVAL, errno.ENAMETOOLONG, errno.ENOENT)
    with pytest.raises(FileNotFoundError):
        client.stat("/definitely/missing")
    client.write_file("/plainfile", b"x")
    with pytest.raises(NotADirectoryError):
        client.mkdir("/plainfile/sub")
    with pytest.raises(IsADirectoryError):
        client.open("/", "rb")
    res = run_cli(shared_cluster.master_address, "stat", "/definitely/missing")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no such file" in res.stderr
    res = run_cli(shared_cluster.master_address, "mkdir", "/x/../y")
    assert res.returncode == 3 and "'..' is not allowed" in res.stderr


def test_ls_l_shows_where_a_symlink_points(shared_cluster, client: Client) -> None:
    client.mkdir("/links", parents=True)
    client.symlink("../some/target", "/links/l")
    listed = run_cli(shared_cluster.master_address, "ls", "-l", "/links")
    assert listed.returncode == 0 and listed.stdout.rstrip().endswith(" l -> ../some/target"), listed.stdout  # as ls -l


def test_concurrent_writers_and_readers(client: Client) -> None:
    client.mkdir("/conc", parents=True)
    payloads = {i: os.urandom(3 * MiB + i) for i in range(12)}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            with client.open(f"/conc/w{i}", "wb", block_size=1 * MiB) as f:
                f.write(payloads[i])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for i, data in payloads.items():
        assert client.read_file(f"/conc/w{i}") == data

    shared = payloads[0]
    results: list[bool] = []

    def reader() -> None:
        with client.open("/conc/w0", "rb") as f:
            out = bytearray()
            while chunk := f.read(300_000):
                out += chunk
            results.append(bytes(out) == shared)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [True] * 8


def test_cached_stat_makes_no_rpc(client: Client) -> None:
    client.write_file("/statme", b"abc")
    with counted_rpcs(client) as calls:
        client.stat("/statme")
        client.stat("/statme")
        client.stat("/statme")
    assert calls.count("Stat") <= 1
    client.write_file("/statme", b"abcdef")  # own write invalidates
    assert client.stat("/statme").size == 6


def test_rename_listdir_paging_and_rm(client: Client) -> None:
    client.mkdir("/many", parents=True)
    names = [f"f{i:05d}" for i in range(2500)]

    async def create_all():
        for name in names:
            f = await client.aio.open(f"/many/{name}", "wb")
            await f.close()

    client._run(create_all())
    listed = [e.name for e in client.listdir("/many")]
    assert listed == names  # 3 pages of 1000, in order
    client.rename("/many", "/many2")
    assert not client.exists("/many") and client.stat("/many2/f00042").is_file
    with pytest.raises(E.DirectoryNotEmpty):
        client.rmdir("/many2")
    client.remove("/many2", recursive=True)
    assert not client.exists("/many2")


def test_short_circuit_used_by_local_client_and_metrics(shared_cluster, client: Client) -> None:
    client.write_file("/sc", os.urandom(5 * MiB))
    assert client.read_file("/sc")
    status = client.status()
    scraped = ""
    for w in status.workers:
        assert w.info.metrics_addr
        scraped += urllib.request.urlopen(f"http://{w.info.metrics_addr}/metrics", timeout=5).read().decode()
    assert 'pcache_worker_ops_total{op="SC_WRITE_COMMIT"}' in scraped
    assert 'pcache_worker_ops_total{op="SC_READ_OPEN"}' in scraped
    assert "pcache_worker_mem_tier_hit_ratio" in scraped
    log = (shared_cluster.root / "logs" / "master.log").read_text()
    assert log.count("master config:") == 1


def test_layout_cache_saves_rpcs_and_own_writes_invalidate(client: Client) -> None:
    client.write_file("/lay", b"v1")
    with counted_rpcs(client) as calls:
        for _ in range(5):
            assert client.read_file("/lay") == b"v1"
        assert calls.count("GetLayout") <= 1
        client.write_file("/lay", b"v2")
        assert client.read_file("/lay") == b"v2"  # own write: no stale layout


def test_sparse_files_store_no_zeros(client: Client) -> None:
    GiB = 1 << 30
    used_before = sum(w.info.used_bytes for w in client.status().workers)
    client.write_file("/sparse", b"head")
    client.truncate("/sparse", 100 * GiB)  # instant: holes, no bytes
    with client.open("/sparse", "r+b") as f:
        f.seek(50 * GiB + 3)
        f.write(b"middle")
    assert client.stat("/sparse").size == 100 * GiB
    with client.open("/sparse", "rb") as f:
        assert f.pread(0, 8) == b"head" + bytes(4)
        assert f.pread(50 * GiB, 12) == bytes(3) + b"middle" + bytes(3)
        assert f.pread(100 * GiB - 5, 100) == bytes(5)
    layout = client._run(client.aio.master.layout(path="/sparse"))
    stored = [b for b in layout.blocks if b.block_id]
    assert len(stored) == 2 and len(layout.blocks) == 100 * GiB // (32 << 20)
    with pytest.raises(E.FileTooLarge) as info:
        client.truncate("/sparse", 1 << 50)
    assert info.value.errno == errno.EFBIG
    time.sleep(1.2)  # heartbeats carry the new usage
    used_after = sum(w.info.used_bytes for w in client.status().workers)
    assert used_after - used_before < 200 << 20  # two blocks x RF 2, not 100 GiB
    client.unlink("/sparse")


def test_a_worker_on_another_node_with_the_same_data_dir_path_is_read_over_tcp(make_cluster, tmp_path) -> None:
    """Every node of a real cluster may use the same data_dir path. Emulated with a mount namespace in
    which worker-1's directory shows worker-0's (as a client on worker-0's node sees the path worker-1
    advertises): the client must not take worker-0's socket for worker-1's, and reads every block."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a mount namespace here (needs root)")
    cluster = make_cluster(workers=2, master_args=["--master.default_replication=1"])
    files = {f"/spread/f{i}": os.urandom(300_000 + i) for i in range(12)}
    with Client(ClientConfig(master=cluster.master_address, block_size=128 * 1024)) as pc:
        pc.mkdir("/spread")
        for path, data in files.items():
            pc.write_file(path, data)
    (tmp_path / "want.bin").write_bytes(b"".join(files[p] for p in sorted(files)))
    w0, w1 = (cluster.root / p.name for p in cluster.worker_procs)
    reader = (
        "import sys; from pcache.client import Client; from pcache.common.config import ClientConfig\n"
        f"with Client(ClientConfig(master={cluster.master_address!r})) as pc:\n"
        f"    got = b''.join(pc.read_file(p) for p in {sorted(files)!r})\n"
        f"sys.exit(0 if got == open({str(tmp_path / 'want.bin')!r}, 'rb').read() else 1)\n"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount --bind "{w0}" "{w1}" && exec "$0" -c "$1"', sys.executable, reader],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workers_bind_every_interface_and_advertise_one_address(make_cluster, tmp_path) -> None:
    cluster = make_cluster(workers=2, worker_args=["--worker.host=0.0.0.0", "--worker.advertise_host=127.0.0.1"])
    with Client(ClientConfig(master=cluster.master_address, short_circuit=False)) as pc:
        pc.write_file("/adv", b"x" * 100_000)
        assert pc.read_file("/adv") == b"x" * 100_000
        assert {w.info.addr.host for w in pc.status().workers} == {"127.0.0.1"}
    from pcache.local import LocalCluster

    bad = LocalCluster(str(tmp_path / "bad"), workers=1, worker_args=["--worker.host=0.0.0.0"], start_timeout=20)
    with pytest.raises(E.Unavailable, match="advertise_host"):
        bad.start()
    bad.stop()


def test_a_second_master_on_a_taken_port_fails_instead_of_sharing_it(make_cluster, tmp_path) -> None:
    """gRPC sets SO_REUSEPORT by default: two masters would split one port's connections between them."""
    from pcache.local import LocalCluster

    first = make_cluster(workers=0)
    port = int(first.master_address.rsplit(":", 1)[1])
    second = LocalCluster(str(tmp_path / "second"), workers=0, master_port=port, start_timeout=20)
    with pytest.raises(E.Unavailable, match="cannot bind the master"):
        second.start()
    second.stop()


def test_a_taken_metrics_port_is_named_at_start_and_bound_before_the_kernel_chooses_ports(tmp_path) -> None:
    """A master said only "pcache: Address already in use" when its ``metrics_port`` was taken. And
    it bound its gRPC port (port 0, chosen by the kernel) before the metrics port, so the kernel
    could hand it the very port just picked as free for the metrics: a CI run's master failed so."""
    import socket

    from pcache.local import LocalCluster

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [f"--master.metrics_port={port}"]
        bad = LocalCluster(str(tmp_path / "bad"), workers=0, master_args=args, start_timeout=20)
        with pytest.raises(E.Unavailable, match=rf"cannot bind the metrics endpoint to 127.0.0.1:{port}: Address"):
            bad.start()
        bad.stop()
        log = (tmp_path / "bad" / "logs" / "master.log").read_text()
        assert "serving on" not in log  # the metrics endpoint is bound before the master's own ports
