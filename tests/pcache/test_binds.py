"""Bound paths (the mount table of under storage): the namespace rules, and the RPCs from an
admin's and from an attacker's side against a real master and a moto S3 server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from babel.testing.servers import Server
from pcache.client import Client
from pcache.common import errors as E
from pcache.common import framing
from pcache.common.config import ClientConfig
from pcache.common.process import free_port
from pcache.local import LocalCluster
from pcache.master.binds import IMMUTABLE
from pcache.master.metastore import open_metastore
from pcache.master.namespace import Namespace
from pcache.proto import pcache_pb2 as pb
from pcache.worker.blockstore import block_file
from tests.conftest import create_bucket, log_mark, logged_requests

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
    ns.bind("/ro", f"file://{tmp_path}/ro", meta_ttl=IMMUTABLE)
    ns.bind("/wb", f"file://{tmp_path}/wb", mode="writeback")
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


def test_a_write_back_bind_with_uploads_not_done_is_unbound_only_by_force(ns: Namespace, tmp_path: Path) -> None:
    """Files of a write-back bind not uploaded yet exist nowhere else: ``unbind`` dropped 300 MiB
    of them without a word. It is refused while a step waits, and --force drops them."""
    ns.bind("/wb", f"file://{tmp_path}", mode="writeback")
    node, _ = ns.create("/wb/shard", 0o644)
    block_id, _, _ = ns.allocate_block(node.id, BLOCK)
    blk = pb.CommittedBlock(block_id=block_id, length=BLOCK, crc32c=1, replicas=["w1"])
    ns.commit_file(node.id, BLOCK, [blk], path="/wb/shard", closing=True)  # its upload is queued
    with pytest.raises(E.Busy, match=r"1 write-back steps .* persist --wait /wb") as caught:
        ns.unbind("/wb")
    assert caught.value.errno == errno.EBUSY and ns.resolve("/wb/shard").size == BLOCK
    _, freed = ns.unbind("/wb", force=True)
    assert [b.block_id for b in freed.blocks] == [block_id] and not ns.binds.all()


@pytest.mark.parametrize("persisted", [False, True])
def test_a_renamed_checkpoint_directory_uploads_in_close_order_and_its_old_marker_goes_first(
    ns: Namespace, tmp_path: Path, persisted: bool
) -> None:
    """Saved to ``step-7.tmp`` then renamed into place (torch DCP's pattern): the moved files were
    queued in name order, so ``.metadata`` reached the store before the shards and the bucket
    held a checkpoint that looked whole with shards missing. Uploads keep the close order; the
    old objects go after, the last closed first."""
    ns.bind("/wb", f"file://{tmp_path}", mode="writeback")
    ns.mkdir("/wb/step-7.tmp")
    for name in ("__1_0.distcp", "__0_0.distcp", ".metadata"):  # closed in this order
        node, _ = ns.create(f"/wb/step-7.tmp/{name}", 0o644)
        block_id, _, _ = ns.allocate_block(node.id, BLOCK)
        blk = pb.CommittedBlock(block_id=block_id, length=BLOCK, crc32c=1, replicas=["w1"])
        ns.commit_file(node.id, BLOCK, [blk], path=f"/wb/step-7.tmp/{name}", closing=True)
    if persisted:  # as the persister finishes each upload
        for task in list(ns.persist.tasks()):
            node = ns.get_inode(task.inode)
            node.persist = pb.PERSIST_DONE
            ns.persist.done(task, [ns.inode_record(node)])
    ns.rename("/wb/step-7.tmp", "/wb/step-7")
    steps = [(pb.PersistTask.Kind.Name(t.kind), t.key) for t in ns.persist.tasks() if not t.canceled]
    uploads = [
        ("UPLOAD", "step-7/__1_0.distcp"),
        ("UPLOAD", "step-7/__0_0.distcp"),
        ("UPLOAD", "step-7/.metadata"),
    ]
    deletes = [
        ("DELETE", "step-7.tmp/.metadata"),
        ("DELETE", "step-7.tmp/__0_0.distcp"),
        ("DELETE", "step-7.tmp/__1_0.distcp"),
    ]
    assert steps == uploads + deletes  # a pending upload may have been under way: its object too


@pytest.mark.parametrize(
    ("first", "second", "refused"),
    [
        ("s3://b/ov/?endpoint_url=http://h:1", "s3://b/ov/sub/?endpoint_url=http://h:1", True),  # inside
        ("s3://b/ov/sub?endpoint_url=http://h:1", "s3://b/ov?endpoint_url=http://H:1/", True),  # above, spelled apart
        ("s3://b/ov?endpoint_url=http://h:1", "s3://b/ov/?endpoint_url=http://h:1", True),  # the same prefix
        ("s3://b?endpoint_url=http://h:1", "s3://b/any/?endpoint_url=http://h:1", True),  # the whole bucket
        ("s3://b/ov/?endpoint_url=http://h:1", "s3://b/ov2/?endpoint_url=http://h:1", False),  # a sibling
        ("s3://b/ov/?endpoint_url=http://h:1", "s3://other/ov/?endpoint_url=http://h:1", False),
        ("s3://b/ov/?endpoint_url=http://h:1", "s3://b/ov/?endpoint_url=http://h:2", False),  # another store
        ("s3://b/ov/?endpoint_url=http://h:1", "oss://b/ov/?endpoint_url=http://h:1", False),
    ],
)
def test_a_write_back_bind_owns_its_store_prefix_alone(ns: Namespace, first: str, second: str, refused: bool) -> None:
    """Two binds over one prefix, one of them write-back: one's deletes removed the other's
    objects, and one's uploads replaced them, with both files saying ``persist: done``."""
    ns.mkdir("/x")
    ns.bind("/x/a", first, mode="writeback")
    if refused:
        with pytest.raises(E.Busy, match="owns its prefix alone"):
            ns.bind("/x/b", second, mode="writeback")
        with pytest.raises(E.Busy):
            ns.bind("/x/b", second, mode="ro")
    else:
        ns.bind("/x/b", second, mode="writeback")


def test_read_only_binds_may_share_a_prefix(ns: Namespace, tmp_path: Path) -> None:
    ns.bind("/r1", f"file://{tmp_path}")
    ns.bind("/r2", f"file://{tmp_path}/sub")
    with pytest.raises(E.Busy):
        ns.bind("/w", f"file://{tmp_path}/sub/deeper", mode="writeback")
    assert [b.path for b in ns.binds.all()] == ["/r1", "/r2"]


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/prefix",
        f"s3://bucket/prefix?endpoint_url=http://AKIAIOSFODNN7EXAMPLE:{SECRET}@127.0.0.1:9000",
        f"s3://AKIAIOSFODNN7EXAMPLE%3A{SECRET}%40bucket/prefix",
        f"s3://bucket/prefix?endpoint_url=http://AKIAIOSFODNN7EXAMPLE%3A{SECRET}%40127.0.0.1:9000",
        f"oss://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/prefix?region=cn-hangzhou",
        f"s3://bucket/p?aws_secret_access_key={SECRET}",  # an option no backend knows
        f"s3://bucket/p#AKIA:{SECRET}@x",
        f"s3://bucket/p?endpoint_url=http://127.0.0.1:5999/x?token={SECRET}",
        f"s3://bucket/p?endpoint_url=http://127.0.0.1:5999%2F%40{SECRET}",
        f"s3://bucket/p?profile={SECRET}@x",
        f"file://u%3A{SECRET}%40localhost/tmp/x",
        f"s3://bucket/p?checksum={SECRET}",  # a bad value of a known option
    ],
)
def test_a_uri_carrying_credentials_is_refused_without_echoing_them(ns: Namespace, uri: str) -> None:
    with pytest.raises(E.InvalidArgument) as err:
        ns.bind("/d", uri)
    assert SECRET not in str(err.value)
    assert ns.binds.all() == []


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("http://example.com/x", "file://, s3://, oss://"),
        ("pcache://127.0.0.1:1/x", "file://, s3://, oss://"),
        ("s3:///no-bucket", "need a bucket"),
        ("s3://b/p?acl=x", "unknown option 'acl'"),
        ("file://host/x", "no host"),
        ("s3://b/p?endpoint_url=127.0.0.1:5000", "endpoint_url is http://HOST[:PORT] or https://"),  # was "credentials"
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


BOUND_BLOCK = 256 << 10  # small blocks: a few of them per test object


METRICS_PORT = free_port()  # the module cluster's master's /metrics


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str):
    args = [f"--master.default_block_size={BOUND_BLOCK}", f"--master.metrics_port={METRICS_PORT}"]
    with LocalCluster(str(tmp_path_factory.mktemp("binds")), workers=2, master_args=args) as c:  # test credentials
        yield c


def master_calls(*methods: str) -> dict[str, int]:
    """How many calls of each RPC the module cluster's master has answered."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    counts = {}
    for method in methods:
        m = re.search(rf'^pcache_master_rpc_seconds_count{{method="{method}"}} (\S+)$', text, re.M)
        counts[method] = int(float(m.group(1))) if m else 0
    return counts


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
    t0 = time.monotonic()
    with pytest.raises(E.Unavailable, match="endpoint 127.0.0.1:9 refuses connections"):  # nothing listens there
        admin.bind("/bt/down", "s3://b/?endpoint_url=http://127.0.0.1:9")  # said at once, not after the store's retries
    assert time.monotonic() - t0 < 3.0
    assert admin.bind("/bt/down", "s3://b/?endpoint_url=http://127.0.0.1:9", check=False).path == "/bt/down"
    # a credentials reference is used: a profile the credentials file lacks fails the check
    creds = tmp_path / "s3.ini"
    creds.write_text("[train]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    ref = f"{uri}&credentials_file={creds}"
    assert admin.bind("/bt/byfile", f"{ref}&profile=train").uri.endswith("profile=train")
    with pytest.raises(E.PCacheError) as err:
        admin.bind("/bt/noprofile", f"{ref}&profile=absent")
    assert "absent" in str(err.value)
    with pytest.raises(E.PermissionDenied, match="is not a file on this host"):  # not the environment's keys instead
        admin.bind("/bt/nofile", f"{uri}&credentials_file={tmp_path}/missing.ini")
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
        with pytest.raises(E.Busy) as busy:
            tenant.remove("/web", recursive=True)
        assert "/bt" not in str(busy.value).replace(": /web", "")  # its own view of the path only
        tenant.mkdir("/own")
        with pytest.raises(E.PCacheError) as refused:  # a refresh's error too (it named /bt/own)
            tenant.refresh("/own")
        assert str(refused.value).endswith(": /own") and "/bt" not in str(refused.value)
        tenant.rmdir("/own")
        with pytest.raises(E.AlreadyExists):  # EEXIST before EROFS, as mkdir(2)
            tenant.mkdir("/web")
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
    # a token the caller names is the one asked with, the admin token file beside it or not
    # (the default tenant's: /cli-ds is not under its root; it listed every tenant's binds)
    as_tenant = subprocess.run([sys.executable, "-m", "pcache", "--master", cluster.master_address, "binds"],
                               env={**env, "PCACHE_TOKEN": cluster.token}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert as_tenant.returncode == 0 and "/cli-ds" not in as_tenant.stdout, as_tenant.stdout + as_tenant.stderr
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="ds/a/x.bin", Body=os.urandom(BOUND_BLOCK + 5))
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="ds/y.txt", Body=b"y")
    env["PCACHE_TOKEN"] = cluster.admin_token
    loaded = pcache("load", "--json", "/cli-ds")
    assert loaded.returncode == 0 and "warning" not in loaded.stderr, loaded.stderr
    report = json.loads(loaded.stdout)
    assert report["cache_capacity_bytes"] > report["bytes"] and report["evicted_bytes_meanwhile"] == 0
    assert report["cache_copies"] == 2  # the cluster's default replication: what a load's bytes take twice
    assert (report["files"], report["dirs"], report["blocks"], report["fetched_blocks"], report["failed"]) == (
        2,
        2,
        3,
        3,
        0,
    )
    checked = pcache("load", "--check", "/cli-ds")
    assert checked.returncode == 0 and "cached before: 3 of 3 blocks (100.0% of the bytes)" in checked.stdout
    freed = pcache("free", "/cli-ds/a")
    assert freed.returncode == 0 and "freed 2 blocks (256.0 KiB) of 1 bound files" in freed.stdout, freed.stdout
    # a load at once after the free: the blocks still on the workers (their DELETEs not sent yet)
    # are kept, not counted cached while they go (load said done; --check then found 1 of 3)
    assert pcache("load", "/cli-ds").returncode == 0
    time.sleep(2.5)  # the workers' next heartbeats: a DELETE still queued would have arrived
    again = pcache("load", "--check", "/cli-ds")
    assert "cached before: 3 of 3 blocks (100.0% of the bytes)" in again.stdout, again.stdout + again.stderr
    missing = pcache("load", "/cli-ds/nope")
    assert missing.returncode != 0 and "nope" in missing.stderr
    assert pcache("mkdir", "/cli-empty").returncode == 0
    empty = pcache("load", "/cli-empty")
    assert empty.returncode == 0 and "nothing to fetch" in empty.stdout and "of 0 blocks" not in empty.stdout
    both = pcache("load", "--check", "--metadata-only", "/cli-ds")
    assert both.returncode != 0 and "exclude each other" in both.stderr
    unbound = pcache("persist", "--wait", "/cli-ds")
    assert unbound.returncode == 0 and "nothing to wait for" in unbound.stdout, unbound.stdout + unbound.stderr
    bad = pcache("bind", "/cli-x", f"s3://AKIAX:{SECRET}@{bucket}/")
    assert bad.returncode != 0 and SECRET not in bad.stdout + bad.stderr and "by reference" in bad.stderr
    assert pcache("bind", "/cli-y", uri, "--meta-ttl", "-3").returncode != 0
    assert pcache("unbind", "/cli-ds").returncode == 0
    assert "/cli-ds" not in pcache("binds").stdout
    again = pcache("unbind", "/cli-ds")
    assert again.returncode != 0 and "not a bound directory" in again.stderr


# ---------------------------------------------------------- lazy metadata --


def _names(pc: Client, path: str) -> set[str]:
    return {e.name for e in pc.listdir(path)}


def _s3(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def test_a_bound_bucket_is_listed_lazily_one_level_at_a_time_and_never_mixes_old_and_new(
    admin: Client, moto_endpoint: str
) -> None:
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    objects = {
        "ds/a.txt": b"hello",
        "ds/dir/b.bin": b"x" * 3000,
        "ds/dir/sub/c": b"c",
        "ds/empty/": b"",  # a directory marker
        "ds/bad//x": b"?",  # no file name can hold it
        "ds/dir/..": b"?",
        "outside": b"not under the prefix",
    }
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    admin.bind("/lazy", f"s3://{bucket}/ds/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    # a deep stat lists each level on the way (and only those)
    assert admin.stat("/lazy/dir/sub/c").size == 1
    top = {e.name: e for e in admin.listdir("/lazy")}
    assert set(top) == {"a.txt", "dir", "empty", "bad"}
    assert top["a.txt"].size == 5 and top["a.txt"].kind == "file" and top["a.txt"].etag
    assert top["a.txt"].mode & 0o777 == 0o444  # read-only bind
    assert top["dir"].is_dir and top["empty"].is_dir
    assert _names(admin, "/lazy/dir") == {"b.bin", "sub"}  # "..": not a name, not shown
    assert _names(admin, "/lazy/bad") == set()  # "bad//x" has no name here
    with pytest.raises(E.NotFound):
        admin.stat("/lazy/outside")
    # immutable: an object added upstream shows only after a refresh
    s3.put_object(Bucket=bucket, Key="ds/new.txt", Body=b"new")
    assert "new.txt" not in _names(admin, "/lazy")
    admin.refresh("/lazy")
    assert admin.stat("/lazy/new.txt").size == 3
    # replaced upstream (another size and ETag): the entry changes and keeps no old blocks
    before = admin.stat("/lazy/a.txt")
    s3.put_object(Bucket=bucket, Key="ds/a.txt", Body=b"a longer text")
    after = admin.refresh("/lazy/a.txt")
    assert (after.size, after.version) == (13, before.version + 1) and after.etag != before.etag
    assert after.blocks == 0
    # deleted upstream: gone after a refresh of its directory
    s3.delete_object(Bucket=bucket, Key="ds/dir/b.bin")
    admin.refresh("/lazy/dir")
    assert _names(admin, "/lazy/dir") == {"sub"}
    with pytest.raises(E.NotFound):
        admin.stat("/lazy/dir/b.bin")
    # read through the cache: the bytes of the version listed
    assert admin.read_file("/lazy/new.txt") == b"new" and admin.read_file("/lazy/a.txt") == b"a longer text"
    assert admin.read_file("/lazy/dir/sub/c") == b"c"
    with pytest.raises(E.ReadOnly):
        admin.write_file("/lazy/new.txt", b"overwrite")
    admin.unbind("/lazy")


def test_a_short_ttl_sees_upstream_changes_by_itself_and_a_failed_listing_is_never_cached_empty(
    admin: Client, moto_endpoint: str
) -> None:
    import time

    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    s3.put_object(Bucket=bucket, Key="one", Body=b"1")
    admin.bind("/ttl", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=1)
    assert _names(admin, "/ttl") == {"one"}
    s3.put_object(Bucket=bucket, Key="two", Body=b"22")
    s3.put_object(Bucket=bucket, Key="one", Body=b"111")
    time.sleep(1.5)
    assert _names(admin, "/ttl") == {"one", "two"} and admin.stat("/ttl/one").size == 3
    s3.delete_object(Bucket=bucket, Key="two")
    time.sleep(1.5)
    with pytest.raises(E.NotFound):  # a HEAD after the TTL finds it gone
        admin.stat("/ttl/two")
    # a store nobody answers: an error within the timeout, and nothing recorded as empty
    admin.bind("/down", "s3://b/?endpoint_url=http://127.0.0.1:9&connect_timeout=1&max_attempts=1", check=False)
    for _ in range(2):  # the second fails too: the first did not leave an empty listing behind
        with pytest.raises(E.Unavailable):
            admin.listdir("/down")
    admin.unbind("/down")
    admin.unbind("/ttl")


def test_a_tenant_reads_the_listing_of_a_bind_in_its_root_and_refresh_takes_its_view(
    cluster: LocalCluster, admin: Client, moto_endpoint: str
) -> None:
    """What a store lists is cache of a store an admin bound, as its blocks are: not counted
    against the tenant's inode quota (a tenant at its quota could not list its dataset; a large
    dataset listed used up the quota its checkpoints needed)."""
    bucket = create_bucket(moto_endpoint)
    for key in ("k/f", "k/g", "h"):
        _s3(moto_endpoint).put_object(Bucket=bucket, Key=key, Body=b"ff")
    admin.create_tenant("lt", quota_inodes=2)
    admin.bind("/lt/data", f"s3://{bucket}/?endpoint_url={moto_endpoint}")  # "data": one inode
    with Client(ClientConfig(master=cluster.master_address, token=admin.issue_token("lt"))) as tenant:
        tenant.write_file("/mine", b"m")  # the second: at its quota
        assert _names(tenant, "/data") == {"k", "h"} and tenant.stat("/data/k/f").size == 2
        assert _names(tenant, "/data/k") == {"f", "g"} and tenant.read_file("/data/k/g") == b"ff"
        assert tenant.refresh("/data/k").is_dir
        with pytest.raises(E.InvalidArgument):
            tenant.refresh("/")  # its root is not listed from a store
        assert tenant.status().tenants[0].used_inodes == 2  # data and mine
        with pytest.raises(E.QuotaExceeded):
            tenant.write_file("/more", b"y")
        admin.unbind("/lt/data")  # its listed entries go uncounted, as they came
        assert tenant.status().tenants[0].used_inodes == 1


def test_refresh_of_a_file_looks_up_a_name_not_seen_yet(admin: Client, moto_endpoint: str) -> None:
    """From a user's drill: ``pcache refresh FILE`` of a name the cache had not seen (a fresh
    bind; an object put upstream within the listing's TTL) failed ENOENT while ``stat`` found it."""
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    s3.put_object(Bucket=bucket, Key="d/a", Body=b"aa")
    admin.bind("/fresh", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    assert admin.refresh("/fresh/d/a").size == 2  # neither d nor a listed yet
    assert _names(admin, "/fresh/d") == {"a"}  # listed now: trusted for ever (immutable)
    s3.put_object(Bucket=bucket, Key="d/b", Body=b"bbb")
    assert admin.refresh("/fresh/d/b").size == 3  # put since the listing
    assert _names(admin, "/fresh/d") == {"a", "b"}
    with pytest.raises(E.NotFound):
        admin.refresh("/fresh/d/none")  # in neither
    admin.unbind("/fresh")


def test_a_file_tree_bound_without_etags_tells_versions_apart_by_size_and_mtime(admin: Client, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_bytes(b"aaaa")
    os.utime(tree / "sub" / "f", (1_700_000_000, 1_700_000_000))
    admin.bind("/tree", f"file://{tree}", meta_ttl=IMMUTABLE)
    first = admin.stat("/tree/sub/f")
    assert first.size == 4 and first.etag.startswith("W/")
    (tree / "sub" / "f").write_bytes(b"bbbb")  # same size, new mtime
    again = admin.refresh("/tree/sub/f")
    assert again.size == 4 and again.etag != first.etag and again.version == first.version + 1
    admin.unbind("/tree")
    assert (tree / "sub" / "f").read_bytes() == b"bbbb"  # unbinding never touches the store


# ----------------------------------------------------------- read-through --


class _Gets:
    """Counts the object GETs under a key prefix that the moto server answered since this was made."""

    def __init__(self, moto: Server, bucket: str, key: str) -> None:
        self.moto, self.since, self.path = moto, log_mark(moto), f"GET /{bucket}/{key}"

    @property
    def count(self) -> int:
        return sum(1 for line in logged_requests(self.moto, self.since) if line.startswith(self.path))


def test_read_through_fetches_each_block_once_for_every_concurrent_reader_and_then_serves_the_cache(
    admin: Client, moto_endpoint: str, moto_server: Server
) -> None:
    bucket = create_bucket(moto_endpoint)
    body = os.urandom(3 * BOUND_BLOCK + 12345)  # 4 blocks, the last one short
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="big.bin", Body=body)
    admin.bind("/rt", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    assert admin.layout("/rt/big.bin").blocks[0].crc32c == 0  # block records made, nothing cached yet
    report = admin.fsck("/rt")
    assert (report.files, report.blocks, list(report.damaged)) == (1, 4, [])  # not cached is not missing
    gets = _Gets(moto_server, bucket, "big.bin")
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(admin.read_file("/rt/big.bin"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8 and all(r == body for r in results)
    assert gets.count == 4  # one ranged GET per block, shared by the 8 readers
    with admin.open("/rt/big.bin", "rb") as f:  # ranges across block boundaries, from the cache now
        f.seek(BOUND_BLOCK - 10)
        assert f.read(20) == body[BOUND_BLOCK - 10 : BOUND_BLOCK + 10]
    assert admin.read_file("/rt/big.bin") == body
    assert gets.count == 4
    assert admin.stat("/rt/big.bin").blocks == 4
    layout = admin.layout("/rt/big.bin")
    assert all(b.crc32c for b in layout.blocks) and all(b.replicas for b in layout.blocks)  # CRCs known now
    status = admin.status()
    assert status.missing_blocks == 0 and status.corrupt_blocks == 0
    admin.unbind("/rt")


def test_an_open_file_never_mixes_versions_when_its_object_is_replaced_upstream(
    admin: Client, moto_endpoint: str
) -> None:
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    old, new = b"o" * (2 * BOUND_BLOCK), b"n" * (2 * BOUND_BLOCK)  # same size: only the ETag tells
    s3.put_object(Bucket=bucket, Key="f", Body=old)
    admin.bind("/mix", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    with admin.open("/mix/f", "rb") as f:  # its layout names the old version; nothing is cached yet
        s3.put_object(Bucket=bucket, Key="f", Body=new)
        with pytest.raises(E.StaleHandle) as err:  # the worker asks for the old version only (If-Match)
            f.read(100)
        assert err.value.errno == errno.ESTALE and "object 'f' changed upstream" in str(err.value)  # which one
    assert admin.refresh("/mix/f").blocks == 0  # the old version's blocks are dropped
    assert admin.read_file("/mix/f") == new
    admin.unbind("/mix")


def test_with_its_store_down_a_cached_file_still_reads_and_an_uncached_one_fails_in_time(
    admin: Client, tmp_path: Path
) -> None:
    from moto.server import ThreadedMotoServer

    from pcache.common.process import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        bucket = create_bucket(endpoint)
        s3 = _s3(endpoint)
        s3.put_object(Bucket=bucket, Key="cached", Body=b"c" * 1000)
        s3.put_object(Bucket=bucket, Key="cold", Body=b"d" * 1000)
        admin.bind(
            "/down2", f"s3://{bucket}/?endpoint_url={endpoint}&connect_timeout=1&max_attempts=1", meta_ttl=IMMUTABLE
        )
        assert admin.read_file("/down2/cached") == b"c" * 1000
        assert admin.stat("/down2/cold").size == 1000  # listed, not read
    finally:
        server.stop()
    assert admin.read_file("/down2/cached") == b"c" * 1000
    t0 = time.monotonic()
    with pytest.raises((E.Unavailable, E.Timeout)):
        admin.read_file("/down2/cold")
    assert time.monotonic() - t0 < 30
    admin.unbind("/down2")


def test_through_a_store_outage_uncached_reads_fail_within_a_second_and_the_store_back_serves_at_once(
    admin: Client,
) -> None:
    """A store that stopped answering cost every uncached read its whole budget of retries (here
    6 tries, ~6 s; a hung store: its timeouts): a data loader reading through an outage spent
    hours failing. Once a worker's fetch from a store failed, its fetches wait at most a second
    for one probe (HEAD) of the store; the store back, the next read is served."""
    from moto.server import ThreadedMotoServer

    from pcache.common.process import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    names = [f"f{i}" for i in range(8)]
    try:
        bucket = create_bucket(endpoint)
        s3 = _s3(endpoint)
        for name in names:
            s3.put_object(Bucket=bucket, Key=name, Body=name.encode() * 100)
        admin.bind("/outage", f"s3://{bucket}/?endpoint_url={endpoint}&max_attempts=6", meta_ttl=IMMUTABLE)
        assert sorted(e.name for e in admin.scandir("/outage")) == names  # listed; no block fetched
    finally:
        server.stop()
    took = []
    for name in names[:6]:
        t0 = time.monotonic()
        with pytest.raises((E.Unavailable, E.Timeout)):
            admin.read_file(f"/outage/{name}")
        took.append(time.monotonic() - t0)
    slow = [t for t in took if t > 3.0]
    assert len(slow) <= 2 and max(took) < 30, took  # the first failure each of the 2 workers saw
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)  # moto keeps its buckets
    server.start()
    try:
        t0 = time.monotonic()
        assert admin.read_file("/outage/f6") == b"f6" * 100
        assert admin.read_file("/outage/f7") == b"f7" * 100
        assert time.monotonic() - t0 < 5.0
    finally:
        server.stop()
    admin.unbind("/outage")


def test_the_bound_a_listing_must_pass_for_a_page_is_in_store_key_order() -> None:
    from pcache.master.understore import _key_bound

    assert _key_bound("data.csv") == "data/"  # "data/" lists after "data.csv", "data" sorts before it
    assert _key_bound("data") == "data/" and _key_bound("a-b.c") == "a/" and _key_bound("zz") == "zz/"
    assert sorted(["data.csv", "data/"]) == ["data.csv", "data/"] and sorted(["data", "data.csv"])[0] == "data"


def test_a_directory_larger_than_a_page_is_listed_whole_and_in_order(admin: Client, moto_endpoint: str) -> None:
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    # the first store page ends at "data.csv"; the directory "data" (key "data/") comes in the
    # second, yet sorts before "data.csv" by name: a page must not be answered without it
    keys = [f"a{i:04d}" for i in range(999)] + ["data.csv", "data/x", "data-1"] + [f"k{i:05d}" for i in range(500)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=f"p/{k}", Body=b"."), keys))
    names = sorted({k.split("/")[0] for k in keys})
    admin.bind("/pages", f"s3://{bucket}/p/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    assert admin.stat("/pages/k00234").size == 1  # one name looked up alone, before any listing
    assert [e.name for e in admin.scandir("/pages")] == names
    assert [e.name for e in admin.scandir("/pages")] == names  # from the cache
    admin.unbind("/pages")


@pytest.mark.slow
def test_a_worker_killed_during_a_fetch_leaves_no_half_block_and_the_file_reads_right_afterwards(
    make_cluster, moto_endpoint: str
) -> None:
    bucket = create_bucket(moto_endpoint)
    body = os.urandom(24 << 20)  # 3 blocks of 8 MiB
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="big", Body=body)
    cluster = make_cluster(
        workers=2, master_args=["--master.default_block_size=8MiB", "--master.default_replication=1"]
    )
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token, io_timeout=5.0)) as admin:
        admin.bind("/k", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
        fetcher = admin.layout("/k/big").blocks[0].replicas[0].worker_id
        index = _worker_index(cluster, fetcher)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(_read_or_error(admin, "/k/big")))
        reader.start()
        time.sleep(0.05)  # its first block's fetch is under way
        cluster.kill(cluster.worker_procs[index], signal.SIGKILL)
        reader.join(60)
        # right bytes: the reader asks the master for another fetcher, for a block being fetched
        # as for one the killed worker had stored already
        assert got == [body], got[:1]
        deadline = time.monotonic() + 30  # the master counts the worker dead, the other one fetches
        while (data := _read_or_error(admin, "/k/big")) != body and time.monotonic() < deadline:
            time.sleep(0.5)
        assert data == body
        cluster.start_worker(index)  # its half-written block file is dropped at start, never served
        cluster.wait_workers(2)
        assert not os.listdir(cluster.root / f"worker-{index}" / "tmp")
        assert admin.read_file("/k/big") == body
        assert not list(admin.fsck("/k").damaged)


def test_a_cached_block_whose_only_copy_is_on_a_killed_worker_is_fetched_again_by_another(
    make_cluster, moto_endpoint: str
) -> None:
    """A bound file's block cached on one worker only (replication 1), and that worker killed
    while the master still counts it alive (``dead_after`` 60 s): a reader finds it gone and the
    master names another worker to fetch the block from the store again, so the read returns
    the right bytes within seconds. It failed before ("no replica could be read") until the
    master declared the worker dead."""
    cluster, body = _bound_object(make_cluster, moto_endpoint, "/cached")
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        assert admin.read_file("/cached/obj") == body  # cached now, on one worker
        holders = {r.worker_id for b in admin.layout("/cached/obj").blocks for r in b.replicas}
        assert len(holders) == 1 and not any(b.uncached for b in admin.layout("/cached/obj").blocks)
        index = _worker_index(cluster, next(iter(holders)))
        cluster.kill(cluster.worker_procs[index], signal.SIGKILL)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as reader:
        t0 = time.monotonic()
        assert reader.read_file("/cached/obj") == body
        assert time.monotonic() - t0 < 10
        after = {r.worker_id for b in reader.layout("/cached/obj").blocks for r in b.replicas}
        assert after - holders  # a second copy, on the live worker


def test_a_read_whose_fetcher_hangs_goes_to_another_worker_within_seconds(make_cluster, moto_endpoint: str) -> None:
    """The worker the master names to fetch an uncached block is SIGSTOPped (and the master,
    with a long ``dead_after``, still counts it alive): the reader's request gets no answer, a
    PING on another connection gets none either, so after about 1.5 stall timeouts the read asks
    the master for another fetcher. It waited ``fetch_timeout`` (75 s) before."""
    cluster, body = _bound_object(make_cluster, moto_endpoint, "/hang")
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        fetcher = admin.layout("/hang/obj").blocks[0].replicas[0].worker_id
        victim = cluster.worker_procs[_worker_index(cluster, fetcher)]
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            data = admin.read_file("/hang/obj")
            took = time.monotonic() - t0
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        print(f"\nread with its fetcher stopped: {took:.1f} s")
        assert data == body
        assert took < 15, took
        holders = {r.worker_id for r in admin.layout("/hang/obj").blocks[0].replicas}
        assert holders and fetcher not in holders, holders  # the other worker fetched and holds it
        admin.unbind("/hang")


def test_a_block_the_store_takes_longer_than_a_stall_to_hand_out_is_read_once_on_the_same_host(
    make_cluster, moto_endpoint: str
) -> None:
    """A reader on the fetcher's host opens the block through the short circuit, whose answer
    waits for the fetch: it gave up after ``stall_timeout`` (2 s) like any stalled worker, so a
    GET slower than two stall timeouts failed the read, and one slower than one cost a second
    try. It now waits as a TCP read does (``fetch_timeout``) while the worker answers PINGs."""
    from babel.testing.s3proxy import S3Proxy

    bucket = create_bucket(moto_endpoint)
    body = os.urandom(1 << 20)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="slow", Body=body)
    cluster = make_cluster(workers=1, master_args=["--master.default_replication=1"])
    with (
        S3Proxy(moto_endpoint) as proxy,
        Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin,
    ):
        admin.bind("/slow", f"s3://{bucket}/?endpoint_url={proxy.endpoint}", meta_ttl=IMMUTABLE)
        assert admin.stat("/slow/slow").size == len(body)
        proxy.ops, proxy.delay = {"get"}, 5.0  # each GET answers after 5 s: 2.5 stall timeouts
        gets = proxy.stats().requests.get("get", 0)
        t0 = time.monotonic()
        assert admin.read_file("/slow/slow") == body
        took = time.monotonic() - t0
        print(f"\nread of a block the store hands out in 5 s: {took:.1f} s")
        assert 5.0 <= took < 15.0, took
        assert proxy.stats().requests.get("get", 0) - gets == 1  # one fetch, waited for: no second try
        admin.unbind("/slow")


def test_a_read_whose_store_does_not_answer_fails_after_one_timeout_and_the_next_at_once(
    make_cluster, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store takes GETs and answers nothing: the fetcher gives up after ``ufs_timeout`` and
    says so. The reader asked the same fetcher again (two timeouts: 120 s with the defaults), and
    through the mount the kernel's read-ahead and the read behind it did so each (240 s). One
    timeout now, and a read of that block right after fails at once, saying when it failed."""
    import pcache.client.data as data_module
    from babel.testing.s3proxy import S3Proxy

    bucket = create_bucket(moto_endpoint)
    body = os.urandom(1 << 20)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="hung", Body=body)
    cluster = make_cluster(
        workers=1, master_args=["--master.default_replication=1"], worker_args=["--worker.ufs_timeout=2"]
    )
    with S3Proxy(moto_endpoint) as proxy, _admin(cluster) as admin:
        admin.bind("/hung", f"s3://{bucket}/?endpoint_url={proxy.endpoint}", meta_ttl=IMMUTABLE)
        assert admin.stat("/hung/hung").size == len(body)
        proxy.ops, proxy.delay = {"get"}, 30.0
        t0 = time.monotonic()
        with pytest.raises(E.Unavailable, match="did not answer in time"):
            admin.read_file("/hung/hung")
        took = time.monotonic() - t0
        assert took < 3.5, took  # one worker.ufs_timeout (2 s), not two
        t0 = time.monotonic()
        with pytest.raises(E.Unavailable, match=r"did not answer in time.* s ago"):
            admin.read_file("/hung/hung")
        assert time.monotonic() - t0 < 1.0  # at once: the same store, a moment later
        monkeypatch.setattr(data_module, "FAILED_FETCH_MEMORY", 0.2)
        time.sleep(0.3)
        proxy.delay = 0.0
        assert admin.read_file("/hung/hung") == body  # asked again once that moment passed
        admin.unbind("/hung")


def test_a_read_that_failed_fast_on_a_hung_store_is_tried_again_as_soon(make_cluster, moto_endpoint: str) -> None:
    """From a user's drill: with the store back (SIGCONT), the mount kept failing reads for 10 s,
    each answered at once from the memory of an earlier failure, although that read had failed
    within a second (the store known down). A failure is remembered as long as it took."""
    from babel.testing.s3proxy import S3Proxy

    bucket = create_bucket(moto_endpoint)
    for key in ("a", "b"):
        _s3(moto_endpoint).put_object(Bucket=bucket, Key=key, Body=key.encode() * 1000)
    cluster = make_cluster(
        workers=1, master_args=["--master.default_replication=1"], worker_args=["--worker.ufs_timeout=3"]
    )
    with S3Proxy(moto_endpoint) as proxy, _admin(cluster) as admin:
        admin.bind("/fast", f"s3://{bucket}/?endpoint_url={proxy.endpoint}", meta_ttl=IMMUTABLE)
        assert {e.name for e in admin.scandir("/fast")} == {"a", "b"}
        proxy.ops, proxy.delay = {"get", "head"}, 60.0  # hung: takes requests, answers nothing
        with pytest.raises(E.Unavailable, match="did not answer in time"):
            admin.read_file("/fast/a")  # the first: one ufs_timeout
        t0 = time.monotonic()
        with pytest.raises(E.Unavailable, match="has not answered since"):
            admin.read_file("/fast/b")  # the store known down: a second or so
        took = time.monotonic() - t0
        assert took < 2.5, took
        with pytest.raises(E.Unavailable, match=r"s ago; tried again after"):
            admin.read_file("/fast/b")  # at once, remembered
        proxy.delay = 0.0  # the store is back
        time.sleep(took + 0.2)
        deadline = time.monotonic() + 5.0  # the probe stuck on the hung store may take its 2 s
        while True:
            try:
                assert admin.read_file("/fast/b") == b"b" * 1000
                break
            except E.Unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        served = time.monotonic() - t0
        assert served < 9.0, served  # 10 s of remembered failure before
        admin.unbind("/fast")


def _admin(cluster: LocalCluster) -> Client:
    """A client of ``cluster`` with its admin token."""
    return Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token))


def _bound_object(make_cluster, moto_endpoint: str, directory: str) -> tuple[LocalCluster, bytes]:
    """A 2-worker cluster (replication 1; a silent worker counts dead after 60 s) with a 3 MiB
    object ``obj`` bound under ``directory``; and the object's bytes."""
    bucket = create_bucket(moto_endpoint)
    body = os.urandom(3 << 20)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="obj", Body=body)
    cluster = make_cluster(workers=2, master_args=["--master.dead_after=60", "--master.default_replication=1"])
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        admin.bind(directory, f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    return cluster, body


def _worker_index(cluster: LocalCluster, worker_id: str) -> int:
    """The index in ``cluster.worker_procs`` of the worker with this id."""
    from pcache.worker.server import worker_id_for

    return next(
        i for i in range(len(cluster.worker_procs)) if worker_id_for(str(cluster.root / f"worker-{i}")) == worker_id
    )


def _read_or_error(pc: Client, path: str) -> bytes | E.PCacheError:
    try:
        return pc.read_file(path)
    except E.PCacheError as exc:
        return exc


def test_a_file_its_writer_has_not_closed_is_waited_for_and_named_never_counted_in_the_store(
    cluster: LocalCluster, admin: Client, moto_endpoint: str
) -> None:
    """A rank killed during an async save left a 0-byte shard under a write-back bind: ``pcache
    persist`` counted it "not write-back" and ``persist --wait`` said "3 files ... are in their
    store" with 2 objects in the bucket."""
    bucket = create_bucket(moto_endpoint)
    admin.bind("/wb-open", f"s3://{bucket}/ck/?endpoint_url={moto_endpoint}", mode="writeback")
    admin.write_file("/wb-open/done", b"closed")
    writer = admin.open("/wb-open/shard", "wb")
    writer.write(b"half")
    env = {**os.environ, "PCACHE_TOKEN_FILE": str(cluster.secrets / "admin.token")}
    cli = [sys.executable, "-m", "pcache", "--master", cluster.master_address, "persist", "/wb-open"]
    shown = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert "not closed: 1" in shown.stdout and "/wb-open/shard: not closed by its writer" in shown.stderr, shown
    with pytest.raises(E.Timeout, match="shard \\(not closed by its writer"):
        admin.wait_persisted("/wb-open", timeout=1.5)
    writer.close()
    assert admin.wait_persisted("/wb-open", timeout=60) == 2
    assert _s3(moto_endpoint).get_object(Bucket=bucket, Key="ck/shard")["Body"].read() == b"half"


def test_under_a_writeback_bind_new_files_are_written_and_listed_objects_stay_as_the_store_has_them(
    admin: Client, moto_endpoint: str
) -> None:
    bucket = create_bucket(moto_endpoint)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="ckpt/listed", Body=b"from the store")
    admin.bind("/wb2", f"s3://{bucket}/ckpt/?endpoint_url={moto_endpoint}", mode="writeback")
    admin.write_file("/wb2/new", b"written here")
    assert admin.read_file("/wb2/new") == b"written here" and admin.read_file("/wb2/listed") == b"from the store"
    for change in (
        lambda: admin.write_file("/wb2/listed", b"over"),
        lambda: admin.rename("/wb2/listed", "/wb2/moved"),
        lambda: admin.rename("/wb2/new", "/wb2/listed"),
        lambda: admin.remove("/wb2/listed"),
    ):
        with pytest.raises(E.ReadOnly):
            change()
    admin.refresh("/wb2")  # a listing leaves what was written here alone
    assert admin.read_file("/wb2/new") == b"written here"
    admin.wait_persisted("/wb2", timeout=60)  # an unbind waits for nothing: it is refused before
    admin.unbind("/wb2")


def test_a_dataset_twice_the_cache_reads_right_twice_by_evicting_clean_blocks_and_never_unpersisted_ones(
    make_cluster, moto_endpoint: str
) -> None:
    block = 256 << 10
    cluster = make_cluster(
        workers=2,
        master_args=[f"--master.default_block_size={block}", "--master.default_replication=1"],
        worker_args=[f"--worker.capacity_bytes={2 << 20}"],  # 4 MiB of cache in all
    )
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    dataset = {f"part-{i:02d}": os.urandom(2 * block + 1000) for i in range(12)}  # ~6.1 MiB: 36 blocks
    for key, body in dataset.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    # over TCP, as a reader on another node (a same-host reader's cached descriptor of an evicted
    # block file still reads its bytes, and would hide the fetches)
    cfg = ClientConfig(master=cluster.master_address, token=cluster.admin_token, short_circuit=False)
    with Client(cfg) as admin:
        own = os.urandom(3 * block)  # written here, in no bound path: never evicted
        admin.write_file("/own.bin", own)
        admin.bind("/ds", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
        for _ in range(2):
            for key, body in dataset.items():
                assert admin.read_file(f"/ds/{key}") == body
        status = admin.status()
        size = sum(map(len, dataset.values()))
        assert status.evicted_bytes >= 2 * size - (4 << 20)  # read twice, 4 MiB held at most
        assert status.evicted_blocks >= status.evicted_bytes // block
        assert 0 < status.cached_bound_blocks < 36
        assert admin.read_file("/own.bin") == own
        assert all(b.replicas for b in admin.layout("/own.bin").blocks)
        assert all(w.info.used_bytes <= 2 << 20 for w in status.workers)
        # a load of it says that it cannot all stay (4 MiB of cache, 6.1 MiB of objects)
        env = {**os.environ, "PCACHE_TOKEN": cluster.admin_token}
        cmd = [sys.executable, "-m", "pcache", "--master", cluster.master_address, "load", "--no-progress", "/ds"]
        loaded = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert loaded.returncode == 0, loaded.stderr
        assert "6.0 MiB, more than the 4.0 MiB the live workers cache at 1 copy of each block" in loaded.stderr
        evicted = re.search(r"watermark\): ([\d.]+) (KiB|MiB) of cached bound files were evicted", loaded.stderr)
        assert evicted and float(evicted[1]) * (1 << (10 if evicted[2] == "KiB" else 20)) >= 1 << 20, loaded.stderr
        # a full cache still takes new files: clean blocks make way for them
        more = os.urandom(6 * block)
        admin.write_file("/more.bin", more)
        assert admin.read_file("/more.bin") == more and admin.read_file("/own.bin") == own
        assert not list(admin.fsck("/").damaged)


@pytest.mark.slow
def test_load_caches_ten_thousand_small_objects_and_large_ones_and_reports_them_right(
    cluster: LocalCluster, admin: Client, tmp_path: Path
) -> None:
    src = tmp_path / "bucket"  # a file:// store: moto would take minutes for 10,000 objects
    small = {f"shard-{i // 100:03d}/{i:05d}.json": b"%d" % i * (1 + i % 7) for i in range(10_000)}
    large = {f"weights/part-{i}.bin": os.urandom(4 * BOUND_BLOCK + 17 * i) for i in range(3)}
    objects = {**small, **large}
    for key, body in objects.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(body)
    admin.bind("/warm", f"file://{src}/", meta_ttl=IMMUTABLE)
    size = sum(map(len, objects.values()))
    blocks = len(small) + sum(-(-len(b) // BOUND_BLOCK) for b in large.values())

    meta = admin.load("/warm", metadata_only=True)
    assert (meta.files, meta.dirs, meta.bytes, meta.failed) == (len(objects), 102, size, 0)
    assert meta.blocks == meta.fetched_blocks == 0
    before = admin.load("/warm/weights", check=True)
    assert (before.blocks, before.cached_blocks, before.fetched_blocks) == (blocks - len(small), 0, 0)

    seen: list[int] = []
    report = admin.load("/warm", concurrency=16, on_progress=lambda r: seen.append(r.fetched_blocks))
    assert (report.files, report.bytes, report.blocks, report.failed) == (len(objects), size, blocks, 0)
    assert (report.cached_blocks, report.fetched_blocks, report.fetched_bytes) == (0, blocks, size)
    assert seen and seen == sorted(seen) and seen[-1] == blocks  # progress only grows, and ends complete

    after = admin.load("/warm/weights", check=True)  # the master agrees (one shard directory, and the large files)
    assert (after.cached_blocks, after.missing_blocks) == (blocks - len(small), 0)
    after = admin.load("/warm/shard-042", check=True)
    assert (after.files, after.cached_blocks, after.missing_blocks) == (100, 100, 0)
    holders = {
        w for key in large for b in admin.layout(f"/warm/{key}").blocks for w in (r.worker_id for r in b.replicas)
    }
    assert len(holders) == 2  # the fetches were spread over both workers
    src.rename(tmp_path / "gone")  # everything reads from the cache now
    for key in ("shard-000/00000.json", "shard-099/09999.json", *large):
        assert admin.read_file(f"/warm/{key}") == objects[key]

    ids = [b.block_id for key in large for b in admin.layout(f"/warm/{key}").blocks]
    freed = admin.free("/warm/weights")
    assert (freed.files, freed.blocks, freed.bytes) == (3, blocks - len(small), sum(map(len, large.values())))
    deadline = time.monotonic() + 10  # the workers delete them with their next heartbeat
    while any(os.path.exists(block_file(str(cluster.root / f"worker-{i}"), b)) for i in range(2) for b in ids):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    again = admin.load("/warm/weights", check=True)
    assert again.cached_blocks == 0 and again.missing_blocks == blocks - len(small)
    (tmp_path / "gone").rename(src)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as fresh:
        assert fresh.read_file("/warm/weights/part-1.bin") == large["weights/part-1.bin"]  # fetched again
    assert admin.load("/warm/weights", check=True).cached_blocks == 5  # part-1.bin: 4 blocks and 17 bytes
    admin.unbind("/warm")


def test_load_asks_the_master_and_the_workers_about_many_small_files_at_a_time(admin: Client, tmp_path: Path) -> None:
    src = tmp_path / "bucket"
    objects = {f"d{i % 4}/f-{i:04d}": b"%d," % i * (1 + i % 50) for i in range(400)}
    for key, body in objects.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(body)
    admin.bind("/small", f"file://{src}/", meta_ttl=IMMUTABLE)
    methods = ("GetLayout", "Batch", "UfsBlockSource", "UfsBlockSources", "BlockReceived", "ReportBlocks")
    before = master_calls(*methods)
    report = admin.load("/small", concurrency=16)
    calls = {m: n - before[m] for m, n in master_calls(*methods).items()}
    assert (report.files, report.fetched_blocks, report.fetched_bytes, report.failed) == (
        400, 400, sum(map(len, objects.values())), 0,
    )  # fmt: skip
    # one call per file and block each (GetLayout, UfsBlockSource, BlockReceived, and one more
    # BlockReceived for each block's second copy) was 1,600 calls
    assert calls["GetLayout"] + calls["Batch"] <= 400 // 8, calls  # layouts asked together
    assert calls["UfsBlockSource"] == calls["BlockReceived"] == 0, calls
    assert 1 <= calls["UfsBlockSources"] <= 400 // 4, calls  # where the blocks come from, asked together
    assert 1 <= calls["ReportBlocks"] <= 400 // 2, calls  # and reported stored together (the copies too)
    check = admin.load("/small", check=True)
    assert (check.cached_blocks, check.missing_blocks) == (400, 0)
    (src / "d1" / "f-0001").write_bytes(b"changed")  # read from the cache, not the store
    assert admin.read_file("/small/d1/f-0001") == objects["d1/f-0001"]
    admin.unbind("/small")


@pytest.mark.parametrize("fault", ["SIGSTOP", "SIGKILL"])
def test_a_load_moves_the_blocks_of_a_worker_that_stops_answering_to_the_others(fault: str, tmp_path: Path) -> None:
    """A worker stopped (or killed) before the master declares it dead: its first request fails
    (refused, or no answer to a PING within 1.5 stall timeouts: not the 75 s ``fetch_timeout``),
    the load sends it nothing more and asks the master for other fetchers of its blocks. Before,
    every batch of its blocks waited out the timeout in turn: 1,000 blocks on a stopped worker,
    -j 4, about 5 hours."""
    src = tmp_path / "bucket"
    objects = {f"d{i % 3}/f-{i:04d}": b"%d;" % i * (1 + i % 40) for i in range(300)}
    for key, body in objects.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(body)
    args = ["--master.default_replication=1"]
    with (
        LocalCluster(str(tmp_path / "c"), workers=2, master_args=args) as cluster,
        Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as pc,
    ):
        pc.bind("/ds", f"file://{src}/", meta_ttl=IMMUTABLE)
        pc.load("/ds", metadata_only=True)
        victim = cluster.worker_procs[1]
        cluster.kill(victim, getattr(signal, fault))
        try:
            started = time.monotonic()
            report = pc.load("/ds", concurrency=4)
            took = time.monotonic() - started
        finally:
            if fault == "SIGSTOP":
                cluster.kill(victim, signal.SIGCONT)
        assert (report.files, report.failed, report.fetched_blocks) == (300, 0, 300), report.errors[:3]
        assert took < 20, took  # one stall (about 3 s) for the stopped worker, not a fetch_timeout per batch
        survivor = cluster.worker_procs[0].name
        holders = {r.worker_id for key in list(objects)[:30] for r in pc.layout(f"/ds/{key}").blocks[0].replicas}
        assert len(holders) == 1 and holders != {victim.name}, (holders, survivor)
        for key in list(objects)[::37]:
            assert pc.read_file(f"/ds/{key}") == objects[key]


def test_two_loads_of_one_directory_at_once_count_each_block_fetched_once(
    cluster: LocalCluster, admin: Client, moto_endpoint: str
) -> None:
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    n, sizes = 300, [1000 + i for i in range(300)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"f-{i:03d}", Body=os.urandom(sizes[i])), range(n)))
    admin.bind("/twice", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    admin.load("/twice", metadata_only=True)
    start = threading.Barrier(2)

    def load(c: Client) -> object:
        start.wait()
        return c.load("/twice", concurrency=8)

    clients = [Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) for _ in range(2)]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(load, clients))
    finally:
        for c in clients:
            c.close()
    assert [(r.files, r.blocks, r.failed) for r in reports] == [(n, n, 0)] * 2
    assert all(r.fetched_blocks + r.cached_blocks == n for r in reports)
    # each block was stored once, by one of them: the other found it cached (it was 1,781 of 1,000)
    assert sum(r.fetched_blocks for r in reports) == n, [r.fetched_blocks for r in reports]
    assert sum(r.fetched_bytes for r in reports) == sum(sizes)
    admin.unbind("/twice")


async def _fetch_frame(addr: pb.WorkerAddr, items: list[pb.FetchItem]) -> pb.DataHeader:
    reader, writer = await framing.open_connection(addr.host, addr.port, 5)
    try:
        await framing.write_frame(writer, pb.DataHeader(op=pb.FETCH_BLOCKS, fetches=items), timeout=5)
        reply, plen = await framing.read_header(reader, 30)
        assert plen == 0
        return reply
    finally:
        framing.close_writer(writer)


def test_a_fetch_request_fetches_only_what_each_token_allows_and_fails_each_block_alone(
    cluster: LocalCluster, admin: Client, moto_endpoint: str
) -> None:
    """FETCH_BLOCKS from an attacker's side: every block needs its own token, allowing a fetch,
    at that worker; a refused or failing block fails alone; no request names more than 64."""
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    bodies = {f"o{i}": os.urandom(1000 + i) for i in range(4)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    admin.bind("/fr", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
    locs = {key: admin.layout(f"/fr/{key}").blocks[0] for key in bodies}
    assert all(loc.uncached for loc in locs.values())
    admin.write_file("/plain", b"not a bound file")  # its token allows reads only
    plain = admin.layout("/plain").blocks[0]
    s3.put_object(Bucket=bucket, Key="o3", Body=b"rewritten upstream")  # its listed version is gone

    by_worker: dict[str, list[tuple[str, pb.BlockLocation]]] = {}
    for key, loc in locs.items():
        by_worker.setdefault(loc.replicas[0].worker_id, []).append((key, loc))
    worker = max(by_worker, key=lambda w: len(by_worker[w]))
    mine = dict(by_worker[worker])
    addr = next(iter(mine.values())).replicas[0]
    good = [k for k in mine if k != "o3"][0]
    victim = [k for k in mine if k not in (good,)][0]
    items = [
        pb.FetchItem(block_id=mine[good].block_id, token=mine[good].token),  # fetched
        pb.FetchItem(block_id=mine[victim].block_id, token=mine[good].token),  # another block's token
        pb.FetchItem(block_id=mine[victim].block_id, token="garbage"),
        pb.FetchItem(block_id=plain.block_id, token=plain.token),  # a read token: no fetch
    ]
    if "o3" in mine:
        items.append(pb.FetchItem(block_id=mine["o3"].block_id, token=mine["o3"].token))
    reply = asyncio.run(_fetch_frame(addr, items))
    assert not reply.error and [f.block_id for f in reply.fetches] == [i.block_id for i in items]
    got = list(reply.fetches)
    assert got[0].length == len(bodies[good]) and not got[0].error
    assert [f.error for f in got[1:4]] == ["PermissionDenied"] * 3
    if "o3" in mine:
        assert got[4].error == "StaleHandle" and "changed upstream" in got[4].message
    assert not admin.layout(f"/fr/{good}").blocks[0].uncached  # reported to the master
    if victim != "o3":
        assert admin.layout(f"/fr/{victim}").blocks[0].uncached  # refused: nothing fetched
    again = asyncio.run(_fetch_frame(addr, items[:1]))
    assert again.fetches[0].length == 0 and not again.fetches[0].error  # cached: nothing stored again

    too_many = [pb.FetchItem(block_id=mine[good].block_id, token=mine[good].token)] * (framing.MAX_FETCHES + 1)
    reply = asyncio.run(_fetch_frame(addr, too_many))
    assert reply.error == "InvalidArgument" and not reply.fetches
    assert admin.read_file(f"/fr/{good}") == bodies[good]
    admin.unbind("/fr")


# ------------------------------------------------------------- write-back --


class _Completes:
    """The keys the moto server completed multipart uploads of (or PUT) since this was made, in order."""

    def __init__(self, moto: Server, bucket: str) -> None:
        self.moto, self.since, self.bucket = moto, log_mark(moto), bucket

    @property
    def keys(self) -> list[str]:
        keys = []
        for line in logged_requests(self.moto, self.since):
            for verb in ("POST", "PUT"):
                marker = f"{verb} /{self.bucket}/"
                if line.startswith(marker):
                    key, _, query = line[len(marker) :].split(" ", 1)[0].partition("?")
                    if (verb == "POST" and query.startswith("uploadId=")) or (verb == "PUT" and not query):
                        keys.append(key)
        return keys


def test_write_back_uploads_closed_files_in_close_order_and_deletes_and_renames_follow(
    admin: Client, moto_endpoint: str, moto_server: Server
) -> None:
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    admin.bind("/wbk", f"s3://{bucket}/run/?endpoint_url={moto_endpoint}", mode="writeback")
    admin.mkdir("/wbk/step-1")
    shards = {f"step-1/shard-{i}.pt": os.urandom(3 * BOUND_BLOCK + 99 * i) for i in range(3)}
    handler = _Completes(moto_server, bucket)
    for key, body in shards.items():
        admin.write_file(f"/wbk/{key}", body)
    admin.write_file("/wbk/step-1/.metadata", b"meta")
    admin.write_file("/wbk/empty", b"")
    assert admin.stat("/wbk/step-1/.metadata").persist in ("pending", "done")
    assert admin.wait_persisted("/wbk", timeout=60) == 5
    deadline = time.monotonic() + 5  # the server logs a request after answering it
    while len(handler.keys) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    expected = [f"run/{k}" for k in shards] + ["run/step-1/.metadata", "run/empty"]
    assert handler.keys == expected  # visible in the order the files were closed
    for key, body in {**shards, "step-1/.metadata": b"meta", "empty": b""}.items():
        assert s3.get_object(Bucket=bucket, Key=f"run/{key}")["Body"].read() == body
        st = admin.stat(f"/wbk/{key}")
        assert (st.persist, st.persist_error) == ("done", "")
    # a new version replaces the object; a deleted file's object goes; a renamed one moves
    admin.write_file("/wbk/step-1/.metadata", b"meta v2")
    admin.remove("/wbk/empty")
    admin.rename("/wbk/step-1/shard-2.pt", "/wbk/step-1/shard-9.pt")
    admin.wait_persisted("/wbk", timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/").get("Contents", [])}
        if "run/empty" not in keys and "run/step-1/shard-2.pt" not in keys:
            break
        time.sleep(0.2)
    assert keys == {"run/step-1/.metadata", "run/step-1/shard-0.pt", "run/step-1/shard-1.pt", "run/step-1/shard-9.pt"}
    assert s3.get_object(Bucket=bucket, Key="run/step-1/.metadata")["Body"].read() == b"meta v2"
    assert s3.get_object(Bucket=bucket, Key="run/step-1/shard-9.pt")["Body"].read() == shards["step-1/shard-2.pt"]
    # a block shorter than its place (a sparse write) uploads with its zeros; a file renamed while
    # open is uploaded under its new name when it is closed; an fsync alone uploads nothing
    admin.write_file("/wbk/sparse", b"0123456789")
    with admin.open("/wbk/sparse", "r+b") as f:
        f.seek(2 * BOUND_BLOCK + 5)
        f.write(b"x")
    sparse = b"0123456789" + bytes(2 * BOUND_BLOCK + 5 - 10) + b"x"
    assert admin.read_file("/wbk/sparse") == sparse
    f = admin.open("/wbk/moving", "wb")
    f.write(b"first half ")
    f.flush()
    f.fsync()
    admin.rename("/wbk/moving", "/wbk/moved")
    f.write(b"second half")
    f.close()
    admin.wait_persisted("/wbk", timeout=60)
    assert s3.get_object(Bucket=bucket, Key="run/sparse")["Body"].read() == sparse
    assert s3.get_object(Bucket=bucket, Key="run/moved")["Body"].read() == b"first half second half"
    # deleted while its upload is under way: never appears, and no multipart upload is left open
    big = os.urandom(20 << 20)
    admin.write_file("/wbk/doomed.bin", big)
    admin.remove("/wbk/doomed.bin")
    admin.write_file("/wbk/after", b"after")
    admin.wait_persisted("/wbk/after", timeout=60)
    time.sleep(1.0)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/").get("Contents", [])}
    assert "run/doomed.bin" not in keys and "run/after" in keys and "run/moving" not in keys
    assert not [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    admin.unbind("/wbk")


def _object(s3, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def test_a_version_an_fsync_committed_is_uploaded_at_its_writers_close_with_nothing_left_to_write(
    admin: Client, moto_endpoint: str
) -> None:
    """A file written, fsync'ed and then closed with nothing left to write (what every file
    written through the mount is: its flush commits, its release closes) was never uploaded:
    its close sent nothing, and only a close queues an upload. Its state was empty, or still
    ``done`` for the version before, while the store held the old bytes."""
    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    admin.bind("/fsy", f"s3://{bucket}/f/?endpoint_url={moto_endpoint}", mode="writeback")
    f = admin.open("/fsy/new", "wb")
    f.write(b"new file")
    f.fsync()
    assert admin.stat("/fsy/new").persist == "pending"  # not in the store yet, and not done
    time.sleep(1.2)  # the persister's passes meanwhile upload nothing half-written
    assert _object(s3, bucket, "f/new") is None
    f.close()
    admin.write_file("/fsy/old", b"version 1")
    admin.wait_persisted("/fsy", timeout=60)
    assert _object(s3, bucket, "f/new") == b"new file"
    before = admin.stat("/fsy/new").mtime
    with admin.open("/fsy/old", "r+b") as f:  # a persisted file written again: no longer done
        f.write(b"VERSION 2")
        f.fsync()
        assert admin.stat("/fsy/old").persist == "pending"
    # a writer that fsyncs and dies never closes: the next writer's bare open and close queues it
    g = admin.open("/fsy/new", "r+b")
    g.write(b"NEW")
    g.fsync()
    admin.open("/fsy/new", "ab").close()
    admin.wait_persisted("/fsy", timeout=60)
    assert _object(s3, bucket, "f/old") == b"VERSION 2" and admin.stat("/fsy/old").persist == "done"
    assert _object(s3, bucket, "f/new") == b"NEW file" and admin.stat("/fsy/new").persist == "done"
    assert admin.stat("/fsy/new").mtime > before
    g.abort()  # what its fsync committed is the file's content: the store gets it too
    admin.wait_persisted("/fsy", timeout=60)
    assert _object(s3, bucket, "f/new") == b"NEW file" == admin.read_file("/fsy/new")
    admin.unbind("/fsy")


def test_an_upload_that_cannot_be_aborted_is_kept_until_it_is_and_none_is_left_open(
    admin: Client, moto_endpoint: str
) -> None:
    """A retried upload aborts the one before it; when the store refused that abort, its id was
    dropped anyway and the multipart upload stayed open in the bucket for ever (its parts'
    bytes billed), one per retry of an outage."""
    from babel.testing.s3proxy import S3Proxy

    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    with S3Proxy(moto_endpoint) as proxy:
        admin.bind("/mpu", f"s3://{bucket}/m/?endpoint_url={proxy.endpoint}", mode="writeback")
        proxy.ops, proxy.fail_rate = {"upload_part", "abort_multipart"}, 1.0  # parts and aborts fail
        body = os.urandom(3 * BOUND_BLOCK + 7)
        admin.write_file("/mpu/f.bin", body)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a part fails, then the abort before the next attempt
            opened = len(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
            if opened > 1 or "retried" in admin.stat("/mpu/f.bin").persist_error:
                break
            time.sleep(0.2)
        time.sleep(2.5)  # the attempts after it
        assert len(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 1  # no second one
        assert "cannot be aborted yet" in admin.stat("/mpu/f.bin").persist_error
        proxy.fail_rate = 0.0
        admin.wait_persisted("/mpu", timeout=60)
    assert s3.get_object(Bucket=bucket, Key="m/f.bin")["Body"].read() == body
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    admin.unbind("/mpu")


def test_a_write_back_bind_takes_new_files_while_its_store_hangs(
    admin: Client, moto_endpoint: str, monkeypatch
) -> None:
    """A checkpoint written while the store does not answer: once the bind's listing is older
    than its TTL, every new name was first looked up in the store, so ``mkdir`` and ``create``
    failed after the client's own 10 s deadline ("deadline_exceeded (master ...)") and torch DCP
    saves died. A new name in a known directory (or under one: ``mkdir -p`` of a new run) is now
    taken as new and uploaded once the store is back; a lookup that cannot be answered fails as the store's Timeout, inside the client's
    deadline."""
    import time

    from babel.testing.s3proxy import S3Proxy

    bucket = create_bucket(moto_endpoint)
    with S3Proxy(moto_endpoint) as proxy:
        admin.bind("/hang", f"s3://{bucket}/ck/?endpoint_url={proxy.endpoint}", mode="writeback", meta_ttl=1)
        admin.mkdir("/hang/step-1")
        admin.write_file("/hang/step-1/shard", b"before")
        admin.wait_persisted("/hang", timeout=60)
        time.sleep(1.2)  # the listing is stale: names are looked up again
        proxy.delay = 30.0  # the store takes connections and answers nothing
        started = time.monotonic()
        admin.mkdir("/hang/step-2")
        first = time.monotonic() - started
        assert first < 10  # within the client's deadline
        started = time.monotonic()
        admin.write_file("/hang/step-2/shard", b"during")
        admin.write_file("/hang/step-2/.metadata", b"meta")
        admin.mkdir("/hang/run-9/step-3", parents=True)  # a new run: the levels between are new too
        admin.write_file("/hang/run-9/step-3/shard", b"new run")
        # the store known not to answer: the next new names wait a second for it, not 8 s each
        assert time.monotonic() - started < 4 * 3, f"first {first:.1f} s"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # a save's ranks at once: one batch, one wait
            started = time.monotonic()
            list(pool.map(lambda i: admin.write_file(f"/hang/step-2/rank{i}", b"r%d" % i), range(8)))
        assert time.monotonic() - started < 6
        assert admin.read_file("/hang/step-2/shard") == b"during"
        # a wait for persistence says what it waits for while it waits (`persist --wait` was silent)
        from pcache.client import core

        monkeypatch.setattr(core, "WAIT_REPORT_EVERY", 0.5)
        reports: list[list] = []
        with pytest.raises(E.Timeout):
            admin.wait_persisted("/hang/step-2", timeout=2.0, on_wait=reports.append)
        assert reports and "/hang/step-2/shard" in {st.path for st in reports[-1]}
        t0 = time.monotonic()
        with pytest.raises(E.Timeout, match="under-store did not answer"):
            admin.stat("/hang/never-seen")  # a lookup only the store can answer: its failure, not the master's
        assert time.monotonic() - t0 < 10
        proxy.delay = 0.0
        admin.wait_persisted("/hang", timeout=90)
    s3 = _s3(moto_endpoint)
    assert s3.get_object(Bucket=bucket, Key="ck/step-2/shard")["Body"].read() == b"during"
    assert s3.get_object(Bucket=bucket, Key="ck/step-2/.metadata")["Body"].read() == b"meta"
    assert s3.get_object(Bucket=bucket, Key="ck/run-9/step-3/shard")["Body"].read() == b"new run"
    assert s3.get_object(Bucket=bucket, Key="ck/step-2/rank7")["Body"].read() == b"r7"
    admin.unbind("/hang")


def test_cached_copies_of_a_bound_file_are_never_under_replicated_in_status_or_fsck(
    make_cluster, moto_endpoint: str
) -> None:
    """After a worker went, ``pcache status`` said 0 under-replicated (a bound file's cached
    blocks are at no risk: the store holds them) while ``pcache fsck`` named 23 and status's
    "wait for a target" line counted them too."""
    bucket = create_bucket(moto_endpoint)
    body = os.urandom(3 * BOUND_BLOCK + 7)
    _s3(moto_endpoint).put_object(Bucket=bucket, Key="f", Body=body)
    cluster = make_cluster(workers=3, master_args=[f"--master.default_block_size={BOUND_BLOCK}"])
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        admin.bind("/ur", f"s3://{bucket}/?endpoint_url={moto_endpoint}", meta_ttl=IMMUTABLE)
        assert admin.read_file("/ur/f") == body
        deadline = time.monotonic() + 30
        while not all(len(b.replicas) == 2 for b in admin.layout("/ur/f").blocks):  # replicated as configured
            assert time.monotonic() < deadline, [len(b.replicas) for b in admin.layout("/ur/f").blocks]
            time.sleep(0.2)
        holder = admin.layout("/ur/f").blocks[0].replicas[0]
        cluster.kill(next(p for p in cluster.worker_procs if p.address.endswith(f":{holder.port}")))
        deadline = time.monotonic() + 30
        while sum(w.alive for w in admin.status().workers) != 2:
            assert time.monotonic() < deadline, "the killed worker was never counted dead"
            time.sleep(0.2)
        status = admin.status()
        assert (status.under_replicated_blocks, status.blocks_without_target, status.missing_blocks) == (0, 0, 0)
        assert [d.state for d in admin.fsck("/ur").damaged] == []
        assert admin.read_file("/ur/f") == body
