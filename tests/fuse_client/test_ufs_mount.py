"""A bucket bound under the mount: the Python standard library's sources in moto's S3, read
through FUSE (lazy listing, read-through), every file equal to its object; a second pass is
served by the cache alone (no GET reaches the store)."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from tests.conftest import FAST_MASTER, create_bucket, stdlib_copy
from tests.fuse_client.conftest import Mount
from tests.pcache.test_binds import counting_gets


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
    fuse_ready, moto_endpoint: str, tmp_path: Path
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
            with counting_gets(bucket, "lib/") as gets:
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
