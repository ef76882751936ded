"""A bucket bound under the mount: the Python standard library's sources in moto's S3, read
through FUSE (lazy listing, read-through), every file equal to its object; a second pass is
served by the cache alone (no GET reaches the store)."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from babel.testing.servers import Server
from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from tests.conftest import FAST_MASTER, create_bucket, stdlib_copy
from tests.fuse_client.conftest import Mount
from tests.pcache.test_binds import _Gets


def _files(root: Path) -> dict[str, Path]:
    """Regular files under ``root`` by relative path (symlinks left out: S3 keeps none)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(root))] = path
    return out


@pytest.mark.slow
def test_the_stdlib_in_a_bucket_reads_through_the_mount_and_a_second_pass_makes_no_get(
    fuse_ready, moto_endpoint: str, moto_server: Server, tmp_path: Path
) -> None:
    import boto3

    src = stdlib_copy(tmp_path / "stdlib")
    files = _files(src)
    bucket = create_bucket(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=bucket, Key=f"lib/{item[0]}", Body=item[1].read_bytes()),
                      files.items()))  # fmt: skip
    with LocalCluster(str(tmp_path / "cluster"), workers=2, master_args=FAST_MASTER) as cluster:
        with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
            admin.bind("/default/stdlib", f"s3://{bucket}/lib/?endpoint_url={moto_endpoint}", meta_ttl=-1)
        mount = Mount(cluster.master_address, tmp_path / "mnt").start()  # the default tenant's view
        try:
            root = mount.path / "stdlib"
            gets = _Gets(moto_server, bucket, "lib/")
            seen = _files(root)
            assert set(seen) == set(files)
            for rel, path in files.items():
                assert (root / rel).read_bytes() == path.read_bytes(), rel
            first = gets.count
            assert first >= sum(1 for p in files.values() if p.stat().st_size)  # one GET a non-empty file
            print(f"\n{len(files)} files, {sum(p.stat().st_size for p in files.values()) / 1e6:.1f} MB; "
                  f"first pass {first} GETs")  # fmt: skip
            for rel, path in files.items():
                assert (root / rel).read_bytes() == path.read_bytes(), rel
            assert gets.count == first  # the second pass never reached the store
        finally:
            mount.stop()


def test_files_written_through_the_mount_into_a_write_back_bind_reach_the_store(
    fuse_ready, moto_endpoint: str, tmp_path: Path
) -> None:
    """Every file written through the mount is committed by its flush and closed by its release
    with nothing left to write; the release queued nothing, so no file written through a mount
    ever reached the store (``persist`` empty; a rewritten file stayed ``done`` with the old
    object)."""
    import shutil

    import boto3

    bucket = create_bucket(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    with LocalCluster(
        str(tmp_path / "cluster"), workers=1, master_args=["--master.default_block_size=1MiB"]
    ) as cluster:
        with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
            admin.bind("/default/ck", f"s3://{bucket}/ck/?endpoint_url={moto_endpoint}", mode="writeback")
        mount = Mount(cluster.master_address, tmp_path / "mnt").start()
        try:
            root = mount.path / "ck"
            (root / "step-1").mkdir()
            shutil.copyfile(src, root / "step-1" / "shard.bin")  # cp
            with open(root / "step-1" / "synced", "wb") as f:
                f.write(b"synced")
                os.fsync(f.fileno())
            (root / "step-1" / ".metadata").write_bytes(b"meta v1")
            with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
                assert pc.wait_persisted("/ck", timeout=60) == 3
                (root / "step-1" / ".metadata").write_bytes(b"meta v2")  # a persisted file rewritten
                assert pc.stat("/ck/step-1/.metadata").persist in ("pending", "done")
                pc.wait_persisted("/ck", timeout=60)
                assert {st.persist for st in pc.walk_files("/ck")} == {"done"}
        finally:
            mount.stop()
    got = {
        k: s3.get_object(Bucket=bucket, Key=f"ck/step-1/{k}")["Body"].read()
        for k in ("shard.bin", "synced", ".metadata")
    }
    assert got == {"shard.bin": src.read_bytes(), "synced": b"synced", ".metadata": b"meta v2"}


def test_a_file_replaced_upstream_or_rewritten_is_never_mixed_nor_read_cut_to_its_old_size(
    fuse_ready, moto_endpoint: str, tmp_path: Path
) -> None:
    """From a user's drill of a bound dataset re-uploaded while a data loader read it: a file
    open through the mount went on with the new object's bytes after the old one's (the mount's
    handles follow PCache's own commits), and a file opened after the replacement (or a rewrite
    in PCache) read the new bytes cut to the old size until the attribute timeout (the kernel caps
    reads at the size it holds). A handle open across the replacement fails ESTALE now, as the
    SDK's does, whether it had read or not (the kernel's pages may be the old object's); a new
    open reads the new bytes whole."""
    import errno

    import boto3

    bucket = create_bucket(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    old, new, newer = os.urandom(8 << 20), os.urandom(8 << 20), os.urandom(8 << 20)  # one size: the ETag tells
    s3.put_object(Bucket=bucket, Key="mid.bin", Body=old)
    s3.put_object(Bucket=bucket, Key="grow.txt", Body=b"E" * 1000)
    with (
        LocalCluster(str(tmp_path / "cluster"), workers=2, master_args=FAST_MASTER) as cluster,
        Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin,
    ):
        admin.bind("/default/ds", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=-1)
        long_caches = ("--attr-timeout", "30", "--entry-timeout", "30")
        mount = Mount(cluster.master_address, tmp_path / "mnt", *long_caches).start()
        try:
            root = mount.path / "ds"
            with open(root / "mid.bin", "rb", buffering=0) as f:
                assert f.read(4096) == old[:4096]
                s3.put_object(Bucket=bucket, Key="mid.bin", Body=new)
                admin.refresh("/default/ds/mid.bin")
                with pytest.raises(OSError) as err:
                    f.read()
                assert err.value.errno == errno.ESTALE
            with open(root / "mid.bin", "rb", buffering=0) as g:  # opened, nothing read yet
                s3.put_object(Bucket=bucket, Key="mid.bin", Body=newer)
                admin.refresh("/default/ds/mid.bin")
                with pytest.raises(OSError) as err:
                    g.read()
                assert err.value.errno == errno.ESTALE
            assert (root / "mid.bin").read_bytes() == newer

            assert (root / "grow.txt").read_bytes() == b"E" * 1000  # the kernel holds size 1000 for 30 s
            s3.put_object(Bucket=bucket, Key="grow.txt", Body=b"F" * 3000)
            admin.refresh("/default/ds/grow.txt")
            assert (root / "grow.txt").read_bytes() == b"F" * 3000

            admin.write_file("/default/plain.txt", b"G" * 1000)  # not bound: rewritten in PCache
            assert (mount.path / "plain.txt").read_bytes() == b"G" * 1000
            assert (mount.path / "plain.txt").stat().st_size == 1000
            admin.write_file("/default/plain.txt", b"H" * 3000)
            assert (mount.path / "plain.txt").read_bytes() == b"H" * 3000  # was 1000 bytes of H
        finally:
            mount.stop()
