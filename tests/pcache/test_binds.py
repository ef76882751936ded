"""Bound paths (the mount table of under storage): the namespace rules, and the RPCs from an
admin's and from an attacker's side against a real master and a moto S3 server."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.master.binds import IMMUTABLE
from pcache.master.metastore import open_metastore
from pcache.master.namespace import Namespace
from pcache.proto import pcache_pb2 as pb
from tests.conftest import create_bucket

BLOCK = 4096
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"


def _ns(store) -> Namespace:
    return Namespace(store, default_block_size=BLOCK, default_replication=1)


@pytest.fixture
def ns(tmp_path: Path):
    store = open_metastore(f"rocksdb://{tmp_path / 'meta'}")
    yield _ns(store)
    store.close()


def test_a_read_only_bind_makes_its_directory_and_refuses_every_change_under_it(ns: Namespace, tmp_path: Path) -> None:
    ns.mkdir("/datasets")
    bind = ns.bind("/datasets/web", f"file://{tmp_path}", meta_ttl=30)
    assert (bind.path, bind.mode, bind.meta_ttl, bind.uri) == ("/datasets/web", "ro", 30, f"file://{tmp_path}")
    node = ns.resolve("/datasets/web")
    assert node.type == pb.DIRECTORY and bind.inode == node.id
    refused = [
        lambda: ns.create("/datasets/web/f", 0o644),
        lambda: ns.mkdir("/datasets/web/d"),
        lambda: ns.mkdir("/datasets/web/a/b", parents=True),
        lambda: ns.symlink("/datasets/web/l", "/x"),
        lambda: ns.setattr("/datasets/web", mode=0o700),
    ]
    for change in refused:
        with pytest.raises(E.ReadOnly) as err:
            change()
        assert err.value.errno == errno.EROFS and "pcache bind --mode writeback" in str(err.value)
    ns.create("/outside", 0o644)
    with pytest.raises(E.ReadOnly):
        ns.rename("/outside", "/datasets/web/outside")  # nothing moves in
    assert ns.listdir("/datasets/web") == ([], False)
    ns.create("/datasets/next-to-it", 0o644)  # its parent is not bound


def test_binds_do_not_nest_and_a_bind_point_or_a_directory_above_one_never_moves(ns: Namespace, tmp_path: Path) -> None:
    uri = f"file://{tmp_path}"
    ns.mkdir("/a/b", parents=True)
    ns.bind("/a/b/c", uri)
    for path in ("/a/b/c", "/a/b/c/d", "/a", "/a/b"):
        with pytest.raises(E.Busy):
            ns.bind(path, uri)
    for src in ("/a/b/c", "/a/b", "/a"):
        with pytest.raises(E.Busy) as err:
            ns.rename(src, "/elsewhere")
        assert err.value.errno == errno.EBUSY and "pcache unbind" in str(err.value)
        with pytest.raises(E.Busy):
            ns.delete(src, recursive=True)
    ns.mkdir("/empty")
    with pytest.raises(E.Busy):
        ns.rename("/empty", "/a/b/c")  # nor is it replaced
    with pytest.raises(E.InvalidArgument):
        ns.bind("/", uri)
    ns.create("/file", 0o644)
    with pytest.raises(E.AlreadyExists):
        ns.bind("/file", uri)
    ns.mkdir("/full")
    ns.create("/full/f", 0o644)
    with pytest.raises(E.AlreadyExists):
        ns.bind("/full", uri)
    ns.mkdir("/taken")
    assert ns.bind("/taken", uri).inode == ns.resolve("/taken").id  # an empty directory is taken


def test_a_tenant_root_is_never_bound_and_a_bind_inside_it_counts_against_the_tenant(
    ns: Namespace, tmp_path: Path
) -> None:
    uri = f"file://{tmp_path}"
    ns.create_tenant("team", quota_inodes=10)
    with pytest.raises(E.Busy):
        ns.bind("/team", uri)
    bind = ns.bind("/team/data", uri)
    assert bind.tenant == "team" and ns.tenants.get("team").used_inodes == 1
    with pytest.raises(E.Busy):
        ns.delete_tenant("team", purge=True)
    with pytest.raises(E.Busy):
        ns.create_tenant("inner", "/team/data/inner")
    ns.unbind("/team/data")
    assert ns.tenants.get("team").used_inodes == 0
    ns.delete_tenant("team", purge=True)


def test_unbind_removes_the_directory_with_what_was_cached_and_binds_survive_a_restart(tmp_path: Path) -> None:
    store = open_metastore(f"rocksdb://{tmp_path / 'meta'}")
    ns = _ns(store)
    ns.bind("/ro", f"file://{tmp_path}", meta_ttl=IMMUTABLE)
    ns.bind("/wb", f"file://{tmp_path}", mode="writeback")
    node, _ = ns.create("/wb/ckpt", 0o644)  # writes are taken under a write-back bind
    block_id, _, _ = ns.allocate_block(node.id, BLOCK)
    ns.commit_file(node.id, BLOCK, [pb.CommittedBlock(block_id=block_id, length=BLOCK, crc32c=1, replicas=["w1"])])
    store.close()
    store = open_metastore(f"rocksdb://{tmp_path / 'meta'}")
    ns = _ns(store)  # a new term (or the follower taking over) reads the table back
    assert [(b.path, b.mode, b.meta_ttl) for b in ns.binds.all()] == [("/ro", "ro", -1), ("/wb", "writeback", 60)]
    with pytest.raises(E.ReadOnly):
        ns.create("/ro/x", 0o644)
    _, freed = ns.unbind("/wb")
    assert [b.block_id for b in freed.blocks] == [block_id]
    assert [b.path for b in ns.binds.all()] == ["/ro"] and ns.get_block(block_id) is None
    with pytest.raises(E.NotFound):
        ns.resolve("/wb")
    with pytest.raises(E.NotFound) as err:
        ns.unbind("/wb")
    assert "pcache binds" in str(err.value)
    ns.mkdir("/wb")  # the name is free again, and writable
    store.close()


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/prefix",
        f"s3://bucket/prefix?endpoint_url=http://AKIAIOSFODNN7EXAMPLE:{SECRET}@127.0.0.1:9000",
        f"s3://AKIAIOSFODNN7EXAMPLE%3A{SECRET}%40bucket/prefix",
        f"s3://bucket/prefix?endpoint_url=http://AKIAIOSFODNN7EXAMPLE%3A{SECRET}%40127.0.0.1:9000",
        f"oss://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/prefix?region=cn-hangzhou",
    ],
)
def test_a_uri_carrying_credentials_is_refused_without_echoing_them(ns: Namespace, uri: str) -> None:
    with pytest.raises(E.InvalidArgument) as err:
        ns.bind("/d", uri)
    assert SECRET not in str(err.value) and "by reference" in str(err.value)
    assert ns.binds.all() == []


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("http://example.com/x", "file://, s3://, oss://"),
        ("pcache://127.0.0.1:1/x", "file://, s3://, oss://"),
        ("s3:///no-bucket", "need a bucket"),
        ("s3://b/p?aws_secret_access_key=x", "unknown option"),
        ("file://host/x", "no host"),
    ],
)
def test_a_uri_no_backend_takes_is_refused(ns: Namespace, uri: str, words: str) -> None:
    with pytest.raises(E.InvalidArgument) as err:
        ns.bind("/d", uri)
    assert words in str(err.value)


def test_bad_modes_and_ttls_are_refused(ns: Namespace, tmp_path: Path) -> None:
    for kwargs in ({"mode": "rw"}, {"meta_ttl": -5.0}, {"meta_ttl": float("nan")}):
        with pytest.raises(E.InvalidArgument):
            ns.bind("/d", f"file://{tmp_path}", **kwargs)


# ---------------------------------------------------------------- cluster --


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str):
    with LocalCluster(str(tmp_path_factory.mktemp("binds")), workers=1) as c:  # inherits the test credentials
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster):
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as pc:
        yield pc


def test_an_admin_binds_a_bucket_the_master_checks_and_a_tenant_may_not_bind_at_all(
    cluster: LocalCluster, admin: Client, moto_endpoint: str, tmp_path: Path
) -> None:
    bucket = create_bucket(moto_endpoint)
    uri = f"s3://{bucket}/train/?endpoint_url={moto_endpoint}"
    admin.create_tenant("bt")
    bind = admin.bind("/bt/web", uri, meta_ttl=120)
    assert (bind.path, bind.uri, bind.mode, bind.tenant) == ("/bt/web", uri, "ro", "bt")
    with pytest.raises(E.NotFound):  # checked from the master: no such bucket
        admin.bind("/bt/missing", f"s3://no-such-bucket-x/?endpoint_url={moto_endpoint}")
    with pytest.raises(E.Unavailable):  # nothing listens there
        admin.bind("/bt/down", "s3://b/?endpoint_url=http://127.0.0.1:9&connect_timeout=1&max_attempts=1")
    assert admin.bind("/bt/down", "s3://b/?endpoint_url=http://127.0.0.1:9", check=False).path == "/bt/down"
    # a credentials reference is used: a profile the credentials file lacks fails the check
    creds = tmp_path / "s3.ini"
    creds.write_text("[train]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    ref = f"{uri}&credentials_file={creds}"
    assert admin.bind("/bt/byfile", f"{ref}&profile=train").uri.endswith("profile=train")
    with pytest.raises(E.PCacheError) as err:
        admin.bind("/bt/noprofile", f"{ref}&profile=absent")
    assert "absent" in str(err.value)
    # the tenant's own view: its binds only, paths inside its root
    token = admin.issue_token("bt")
    with Client(ClientConfig(master=cluster.master_address, token=token)) as tenant:
        assert sorted(b.path for b in tenant.binds()) == ["/byfile", "/down", "/web"]
        with pytest.raises(E.ReadOnly):
            tenant.write_file("/web/mine", b"x")
        for attempt in (
            lambda: tenant.bind("/mine", f"file://{tmp_path}", check=False),  # the hosts' files, or their credentials
            lambda: tenant.bind("/mine", uri),
            lambda: tenant.unbind("/web"),
        ):
            with pytest.raises(E.PermissionDenied):
                attempt()
        with pytest.raises(E.Busy):
            tenant.remove("/web", recursive=True)
    assert {b.path for b in admin.binds()} >= {"/bt/web", "/bt/down", "/bt/byfile"}
    admin.unbind("/bt/down")
    assert "/bt/down" not in {b.path for b in admin.binds()}


def test_the_cli_binds_lists_and_unbinds_and_never_prints_a_secret(cluster: LocalCluster, moto_endpoint: str) -> None:
    bucket = create_bucket(moto_endpoint)
    uri = f"s3://{bucket}/ds/?endpoint_url={moto_endpoint}"
    env = {**os.environ, "PCACHE_ADMIN_TOKEN_FILE": str(cluster.secrets / "admin.token")}

    def pcache(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pcache", "--master", cluster.master_address, *args],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    made = pcache("bind", "/cli-ds", uri, "--meta-ttl", "immutable")
    assert made.returncode == 0 and f"/cli-ds -> {uri} (ro, immutable)" in made.stdout, made.stderr
    listed = json.loads(pcache("binds", "--json").stdout)
    entry = next(b for b in listed if b["path"] == "/cli-ds")
    assert (entry["uri"], entry["mode"], entry["meta_ttl"]) == (uri, "ro", -1.0)
    assert "/cli-ds" in pcache("binds").stdout
    bad = pcache("bind", "/cli-x", f"s3://AKIAX:{SECRET}@{bucket}/")
    assert bad.returncode != 0 and SECRET not in bad.stdout + bad.stderr and "by reference" in bad.stderr
    assert pcache("bind", "/cli-y", uri, "--meta-ttl", "-3").returncode != 0
    assert pcache("unbind", "/cli-ds").returncode == 0
    assert "/cli-ds" not in pcache("binds").stdout
    again = pcache("unbind", "/cli-ds")
    assert again.returncode != 0 and "not a bound directory" in again.stderr
