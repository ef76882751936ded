"""Namespace on every metastore engine: tree operations, POSIX rename, block commits, persistence."""

from __future__ import annotations

import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pcache.common import errors as E
from pcache.master.allocations import Allocations
from pcache.master.metastore import MetaStore, open_metastore
from pcache.master.namespace import ID_BATCH, ROOT, Namespace
from pcache.proto import pcache_pb2 as pb

BLOCK = 4096
KIND = {pb.DIRECTORY: "d", pb.REGULAR: "f", pb.SYMLINK: "l"}


def tree(ns: Namespace, path: str = "/") -> dict[str, str]:
    """{path: 'd' | 'f' | 'l'} of everything under ``path``, walked with listdir pages."""
    out: dict[str, str] = {}
    after = ""
    while True:
        entries, more = ns.listdir(path, start_after=after, limit=7)
        for node in entries:
            child = path.rstrip("/") + "/" + node.name
            out[child] = KIND[node.type]
            if node.type == pb.DIRECTORY:
                out.update(tree(ns, child))
        if not more:
            return out
        after = entries[-1].name


def write(ns: Namespace, path: str, lengths: list[int], replicas: tuple[str, ...] = ("w1", "w2")) -> list[int]:
    """Create ``path`` and commit fresh blocks of ``lengths`` bytes; returns the block ids."""
    node, _ = ns.create(path)
    blocks = []
    for n, length in enumerate(lengths):
        block_id, *_ = ns.allocate_block(node.id, length)
        blocks.append(pb.CommittedBlock(block_id=block_id, length=length, crc32c=n + 7, replicas=list(replicas)))
    ns.commit_file(node.id, extent(lengths, node.block_size), blocks)
    return [b.block_id for b in blocks]


def extent(lengths: list[int], block_size: int) -> int:
    """Size of a file whose blocks hold ``lengths`` bytes (each block but the last may be shorter than
    its place: zeros follow, as in a sparse file)."""
    return (len(lengths) - 1) * block_size + lengths[-1] if lengths else 0


def freed_ids(freed) -> list[int]:
    return sorted(meta.block_id for meta in freed.blocks)


# ------------------------------------------------------------------ root & lookups --


def test_fresh_namespace_has_only_the_root(ns: Namespace) -> None:
    root = ns.resolve("/")
    assert root.id == ROOT and root.type == pb.DIRECTORY and root.name == "/"
    assert root.mode == 0o755
    assert ns.listdir("/") == ([], False)
    assert ns.count() == (1, 0)
    assert list(ns.iter_blocks()) == []


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("relative", E.InvalidPath),
        ("", E.InvalidPath),
        ("/a/../b", E.InvalidPath),
        ("/a/./b", E.InvalidPath),
        ("/a//b", E.InvalidPath),
        ("/a\x00b", E.InvalidPath),
        ("/" + "x" * 256, E.NameTooLong),
    ],
)
def test_bad_paths_are_refused_everywhere(ns: Namespace, path: str, error: type) -> None:
    for op in (ns.resolve, ns.mkdir, ns.create, ns.delete, ns.listdir, ns.setattr):
        with pytest.raises(error):
            op(path)
    with pytest.raises(error):
        ns.rename(path, "/ok")
    with pytest.raises(error):
        ns.symlink(path, "/t")
    assert ns.count() == (1, 0)


def test_resolve_missing_and_through_a_file(ns: Namespace) -> None:
    ns.create("/f")
    with pytest.raises(E.NotFound):
        ns.resolve("/nope")
    with pytest.raises(E.NotFound):
        ns.resolve("/nope/deeper")
    with pytest.raises(E.NotADirectory):
        ns.resolve("/f/x")
    # trailing slashes name the same entry
    assert ns.resolve("/f/").id == ns.resolve("/f").id


# ------------------------------------------------------------------------- mkdir --


def test_mkdir(ns: Namespace) -> None:
    before = ns.resolve("/").mtime
    time.sleep(0.001)
    node = ns.mkdir("/a", 0o40750)
    assert node.type == pb.DIRECTORY and node.name == "a" and node.mode == 0o750
    assert node.id > ROOT and node.version == 1
    got = ns.resolve("/a")
    assert (got.id, got.type, got.mode, got.name) == (node.id, pb.DIRECTORY, 0o750, "a")
    assert ns.resolve("/").mtime > before
    sub = ns.mkdir("/a/b")
    assert sub.mode == 0o755 and sub.id != node.id
    assert tree(ns) == {"/a": "d", "/a/b": "d"}


def test_mkdir_errors(ns: Namespace) -> None:
    ns.mkdir("/d")
    ns.create("/f")
    with pytest.raises(E.AlreadyExists):
        ns.mkdir("/d")
    with pytest.raises(E.AlreadyExists):
        ns.mkdir("/f")
    with pytest.raises(E.AlreadyExists):
        ns.mkdir("/")
    with pytest.raises(E.NotFound):
        ns.mkdir("/missing/x")
    with pytest.raises(E.NotADirectory):
        ns.mkdir("/f/x")
    assert tree(ns) == {"/d": "d", "/f": "f"}


def test_mkdir_parents(ns: Namespace) -> None:
    leaf = ns.mkdir("/a/b/c", parents=True)
    assert leaf.name == "c" and leaf.type == pb.DIRECTORY
    assert tree(ns) == {"/a": "d", "/a/b": "d", "/a/b/c": "d"}
    ids = {ns.resolve(p).id for p in ("/", "/a", "/a/b", "/a/b/c")}
    assert len(ids) == 4
    # existing directories are fine, and their ids are kept
    again = ns.mkdir("/a/b/c", parents=True)
    assert again.id == leaf.id and again.name == "c"
    assert ns.mkdir("/a/b/c/d", parents=True).id not in ids
    assert ns.mkdir("/", parents=True).id == ROOT
    assert ns.count() == (5, 0)


def test_mkdir_parents_with_a_file_in_the_way(ns: Namespace) -> None:
    ns.mkdir("/a")
    ns.create("/a/f")
    with pytest.raises(E.NotADirectory) as info:
        ns.mkdir("/a/f/x/y", parents=True)
    assert info.value.filename == "/a/f"
    # the path itself is a file: EEXIST, as `mkdir -p` and os.makedirs(exist_ok=True)
    with pytest.raises(E.AlreadyExists):
        ns.mkdir("/a/f", parents=True)
    assert tree(ns) == {"/a": "d", "/a/f": "f"}


# ------------------------------------------------------------------------ create --


def test_create_new_file(ns: Namespace) -> None:
    node, freed = ns.create("/f", 0o100640)
    assert freed.blocks == []
    assert node.type == pb.REGULAR and node.name == "f" and node.mode == 0o640
    assert (node.size, node.block_size, node.replication, node.version) == (0, BLOCK, 2, 1)
    other, _ = ns.create("/g", block_size=1 << 20, replication=3)
    assert (other.block_size, other.replication) == (1 << 20, 3)
    assert other.id != node.id
    assert ns.resolve("/g").block_size == 1 << 20


def test_create_existing_opens_it(ns: Namespace) -> None:
    node, _ = ns.create("/f")
    write(ns, "/f", [100])
    again, freed = ns.create("/f", 0o600, block_size=1)
    assert again.id == node.id and again.name == "f"
    assert freed.blocks == []
    assert again.size == 100 and len(again.blocks) == 1
    assert again.block_size == BLOCK and again.mode == 0o644  # an open changes nothing


def test_create_exclusive(ns: Namespace) -> None:
    ns.create("/f", exclusive=True)
    ns.mkdir("/d")
    with pytest.raises(E.AlreadyExists):
        ns.create("/f", exclusive=True)
    with pytest.raises(E.AlreadyExists):
        ns.create("/d", exclusive=True)
    assert ns.count() == (3, 0)


def test_create_over_a_directory(ns: Namespace) -> None:
    ns.mkdir("/d")
    with pytest.raises(E.IsADirectory):
        ns.create("/d")
    with pytest.raises(E.IsADirectory):
        ns.create("/d", truncate=True)
    with pytest.raises(E.InvalidArgument):  # the root has no parent to create it in
        ns.create("/")


def test_create_bad_parent_and_arguments(ns: Namespace) -> None:
    ns.create("/f")
    with pytest.raises(E.NotFound):
        ns.create("/missing/f")
    with pytest.raises(E.NotADirectory):
        ns.create("/f/g")
    with pytest.raises(E.InvalidArgument):
        ns.create("/g", block_size=-1)
    with pytest.raises(E.InvalidArgument):
        ns.create("/g", replication=-2)
    assert tree(ns) == {"/f": "f"}


def test_create_truncate_frees_blocks(ns: Namespace) -> None:
    blocks = write(ns, "/f", [BLOCK, 10])
    before = ns.resolve("/f")
    assert before.size == BLOCK + 10 and list(before.blocks) == blocks
    node, freed = ns.create("/f", truncate=True)
    assert freed_ids(freed) == sorted(blocks)
    assert {m.length for m in freed.blocks} == {BLOCK, 10}
    assert all(list(m.replicas) == ["w1", "w2"] for m in freed.blocks)
    assert node.id == before.id and node.size == 0 and list(node.blocks) == []
    assert node.version == before.version + 1 and node.name == "f"
    stored = ns.resolve("/f")
    assert stored.size == 0 and list(stored.blocks) == [] and stored.version == node.version
    assert all(ns.get_block(b) is None for b in blocks)
    assert ns.count() == (2, 0)
    # truncating an empty file frees nothing and does not bump the version
    again, freed = ns.create("/f", truncate=True)
    assert freed.blocks == [] and again.version == node.version


def test_create_truncate_leaves_a_symlink_alone(ns: Namespace) -> None:
    ns.symlink("/l", "/target/file")
    node, freed = ns.create("/l", truncate=True)
    assert freed.blocks == []
    stored = ns.resolve("/l")
    assert stored.type == pb.SYMLINK and stored.size == len("/target/file") and stored.version == 1
    assert node.symlink_target == "/target/file"


# ----------------------------------------------------------------------- symlink --


def test_symlink(ns: Namespace) -> None:
    ns.mkdir("/d")
    node = ns.symlink("/d/l", "../naïve")
    assert node.type == pb.SYMLINK and node.name == "l" and node.mode == 0o777
    assert node.symlink_target == "../naïve" and node.size == len("../naïve".encode())
    got = ns.resolve("/d/l")
    assert got.symlink_target == "../naïve" and got.id == node.id
    # lookups do not follow symlinks
    ns.symlink("/dl", "/d")
    with pytest.raises(E.NotADirectory):
        ns.resolve("/dl/l")
    with pytest.raises(E.NotADirectory):
        ns.create("/dl/x")
    with pytest.raises(E.AlreadyExists):
        ns.symlink("/d/l", "x")
    with pytest.raises(E.AlreadyExists):
        ns.symlink("/d", "x")
    with pytest.raises(E.InvalidArgument):
        ns.symlink("/e", "")
    with pytest.raises(E.InvalidArgument):
        ns.symlink("/e", "a\x00b")
    with pytest.raises(E.NotFound):
        ns.symlink("/missing/e", "x")
    assert tree(ns) == {"/d": "d", "/d/l": "l", "/dl": "l"}


# ----------------------------------------------------------------------- listdir --


def test_listdir_pages_through_2500_entries(ns: Namespace) -> None:
    ns.mkdir("/big")
    names = [f"f{i:05d}" for i in range(2500)]
    for i, name in enumerate(reversed(names)):
        if i % 2:
            ns.mkdir(f"/big/{name}")
        else:
            ns.create(f"/big/{name}")
    pages = []
    after = ""
    while True:
        entries, more = ns.listdir("/big", start_after=after, limit=1000)
        pages.append((len(entries), more))
        if not entries:
            break
        after = entries[-1].name
        if not more:
            break
    assert pages == [(1000, True), (1000, True), (500, False)]
    listed, _ = ns.listdir("/big", limit=5000)
    assert [e.name for e in listed] == names
    assert {e.type for e in listed} == {pb.REGULAR, pb.DIRECTORY}
    assert all(e.id == ns.resolve(f"/big/{e.name}").id for e in listed[:50])


def test_listdir_truncated_flag_is_exact(ns: Namespace) -> None:
    for i in range(20):
        ns.create(f"/f{i:02d}")
    assert ns.listdir("/", limit=20)[1] is False
    assert ns.listdir("/", limit=19)[1] is True
    entries, more = ns.listdir("/", start_after="f09", limit=10)
    assert [e.name for e in entries] == [f"f{i:02d}" for i in range(10, 20)] and more is False
    entries, more = ns.listdir("/", start_after="f09", limit=9)
    assert len(entries) == 9 and more is True
    # start_after need not exist; it is exclusive
    entries, _ = ns.listdir("/", start_after="f05x")
    assert entries[0].name == "f06"
    assert ns.listdir("/", start_after="f19") == ([], False)
    assert ns.listdir("/", start_after="zzz") == ([], False)


def test_listdir_orders_by_utf8_bytes_and_keeps_to_its_directory(ns: Namespace) -> None:
    ns.mkdir("/a")
    ns.mkdir("/b")
    for name in ["é", "Z", "a", "ab", "a b", "日本", "~"]:
        ns.create(f"/a/{name}")
    ns.create("/b/zz")
    ns.mkdir("/a/sub")
    ns.create("/a/sub/inner")
    entries, more = ns.listdir("/a")
    assert [e.name for e in entries] == sorted(["é", "Z", "a", "ab", "a b", "日本", "~", "sub"], key=str.encode)
    assert not more
    assert [e.name for e in ns.listdir("/b")[0]] == ["zz"]
    assert [e.name for e in ns.listdir("/a/sub")[0]] == ["inner"]


def test_listdir_errors(ns: Namespace) -> None:
    ns.create("/f")
    with pytest.raises(E.NotADirectory):
        ns.listdir("/f")
    with pytest.raises(E.NotFound):
        ns.listdir("/missing")
    ns.symlink("/l", "/")
    with pytest.raises(E.NotADirectory):
        ns.listdir("/l")


# ------------------------------------------------------------------------ rename --


def test_rename_file_within_a_directory(ns: Namespace) -> None:
    node, _ = ns.create("/a")
    time.sleep(0.001)
    moved, freed = ns.rename("/a", "/b")
    assert freed.blocks == []
    assert moved.id == node.id and moved.name == "b" and moved.ctime > node.ctime
    assert tree(ns) == {"/b": "f"}
    assert ns.resolve("/b").id == node.id


def test_rename_across_directories_moves_the_subtree(ns: Namespace) -> None:
    ns.mkdir("/src/d/e", parents=True)
    blocks = write(ns, "/src/d/e/f", [5, 6])
    ns.mkdir("/dst")
    d_id = ns.resolve("/src/d").id
    src_mtime, dst_mtime = ns.resolve("/src").mtime, ns.resolve("/dst").mtime
    time.sleep(0.001)
    moved, freed = ns.rename("/src/d", "/dst/d2")
    assert moved.id == d_id and moved.name == "d2" and freed.blocks == []
    assert tree(ns) == {"/src": "d", "/dst": "d", "/dst/d2": "d", "/dst/d2/e": "d", "/dst/d2/e/f": "f"}
    assert ns.resolve("/src").mtime > src_mtime and ns.resolve("/dst").mtime > dst_mtime
    _, metas = ns.layout("/dst/d2/e/f")
    assert [m.block_id for m in metas] == blocks
    assert ns.count() == (6, 2)


def test_rename_replaces_a_file_and_frees_its_blocks(ns: Namespace) -> None:
    write(ns, "/a", [1])
    old = write(ns, "/b", [2, 3])
    a_id = ns.resolve("/a").id
    moved, freed = ns.rename("/a", "/b")
    assert moved.id == a_id
    assert freed_ids(freed) == sorted(old)
    assert tree(ns) == {"/b": "f"}
    assert ns.resolve("/b").size == 1
    assert all(ns.get_block(b) is None for b in old)
    assert ns.count() == (2, 1)


def test_rename_replaces_an_empty_directory(ns: Namespace) -> None:
    ns.mkdir("/a/x", parents=True)
    ns.mkdir("/b")
    a_id = ns.resolve("/a").id
    moved, freed = ns.rename("/a", "/b")
    assert moved.id == a_id and freed.blocks == []
    assert tree(ns) == {"/b": "d", "/b/x": "d"}
    assert ns.count() == (3, 0)  # the replaced directory's inode is gone


def test_rename_over_a_non_empty_directory(ns: Namespace) -> None:
    ns.mkdir("/a")
    ns.mkdir("/b")
    ns.create("/b/keep")
    with pytest.raises(E.DirectoryNotEmpty) as info:
        ns.rename("/a", "/b")
    assert info.value.errno == 39  # ENOTEMPTY
    assert tree(ns) == {"/a": "d", "/b": "d", "/b/keep": "f"}


def test_rename_kind_mismatches(ns: Namespace) -> None:
    ns.create("/f")
    ns.mkdir("/d")
    with pytest.raises(E.IsADirectory):
        ns.rename("/f", "/d")
    with pytest.raises(E.NotADirectory):
        ns.rename("/d", "/f")
    assert tree(ns) == {"/d": "d", "/f": "f"}


def test_rename_into_own_subtree(ns: Namespace) -> None:
    ns.mkdir("/a/b", parents=True)
    with pytest.raises(E.InvalidArgument):
        ns.rename("/a", "/a/b/c")
    with pytest.raises(E.InvalidArgument):
        ns.rename("/a", "/a/c")
    # the reverse: onto an ancestor that is not empty
    with pytest.raises(E.DirectoryNotEmpty):
        ns.rename("/a/b", "/a")
    # as rename(2), the lookups come first: a missing source is ENOENT, a file source ENOTDIR
    with pytest.raises(E.NotFound):
        ns.rename("/nope", "/nope/x")
    ns.create("/f")
    with pytest.raises(E.NotADirectory):
        ns.rename("/f", "/f/x")
    with pytest.raises(E.NotFound):
        ns.rename("/a", "/a/missing/x")
    # a sibling whose name starts with the source's is not inside it
    ns.rename("/a", "/ab")
    assert tree(ns) == {"/ab": "d", "/ab/b": "d", "/f": "f"}


def test_rename_no_replace(ns: Namespace) -> None:
    ns.create("/a")
    ns.create("/b")
    with pytest.raises(E.AlreadyExists):
        ns.rename("/a", "/b", no_replace=True)
    ns.mkdir("/empty")
    with pytest.raises(E.AlreadyExists):
        ns.rename("/a", "/empty", no_replace=True)
    ns.rename("/a", "/c", no_replace=True)
    assert tree(ns) == {"/b": "f", "/c": "f", "/empty": "d"}


def test_rename_same_path_is_a_no_op(ns: Namespace) -> None:
    blocks = write(ns, "/a", [3])
    before = ns.resolve("/a")
    node, freed = ns.rename("/a", "/a/")
    assert node.id == before.id and node.name == "a" and freed.blocks == []
    after = ns.resolve("/a")
    assert after == before
    assert list(after.blocks) == blocks
    ns.mkdir("/d")
    assert ns.rename("/d", "/d")[0].name == "d"


def test_rename_errors(ns: Namespace) -> None:
    ns.create("/f")
    with pytest.raises(E.NotFound):
        ns.rename("/missing", "/x")
    with pytest.raises(E.NotFound):
        ns.rename("/f", "/missing/x")
    with pytest.raises(E.NotADirectory):
        ns.rename("/f/x", "/y")
    with pytest.raises(E.InvalidArgument):
        ns.rename("/", "/x")
    with pytest.raises(E.InvalidArgument):
        ns.rename("/f", "/")
    assert tree(ns) == {"/f": "f"}


# ------------------------------------------------------------------------ delete --


def test_delete_file_frees_blocks(ns: Namespace) -> None:
    blocks = write(ns, "/f", [7, 8, 9])
    before = ns.resolve("/").mtime
    time.sleep(0.001)
    freed = ns.delete("/f")
    assert freed_ids(freed) == sorted(blocks)
    assert ns.count() == (1, 0)
    assert ns.resolve("/").mtime > before
    with pytest.raises(E.NotFound):
        ns.resolve("/f")
    with pytest.raises(E.NotFound):
        ns.delete("/f")


def test_delete_directory(ns: Namespace) -> None:
    ns.mkdir("/d")
    ns.create("/d/f")
    with pytest.raises(E.DirectoryNotEmpty):
        ns.delete("/d")
    with pytest.raises(E.DirectoryNotEmpty):
        ns.delete("/d", directory=True)
    ns.delete("/d/f", file=True)
    assert ns.delete("/d", directory=True).blocks == []
    assert tree(ns) == {}
    assert ns.count() == (1, 0)


def test_delete_recursive(ns: Namespace) -> None:
    ns.mkdir("/keep")
    ns.mkdir("/t/a/b/c", parents=True)
    blocks = write(ns, "/t/a/f", [1, 2]) + write(ns, "/t/a/b/c/g", [3])
    kept = write(ns, "/keep/h", [4])
    ns.symlink("/t/l", "/keep")
    for i in range(30):
        ns.create(f"/t/a/b/n{i}")
    freed = ns.delete("/t", recursive=True)
    assert freed_ids(freed) == sorted(blocks)
    assert tree(ns) == {"/keep": "d", "/keep/h": "f"}
    assert ns.count() == (3, 1)
    assert [m.block_id for m in ns.iter_blocks()] == kept


def test_delete_kind_checks(ns: Namespace) -> None:
    ns.create("/f")
    ns.mkdir("/d")
    ns.symlink("/l", "/d")
    with pytest.raises(E.NotADirectory):
        ns.delete("/f", directory=True)
    with pytest.raises(E.NotADirectory):
        ns.delete("/l", directory=True)
    with pytest.raises(E.IsADirectory):
        ns.delete("/d", file=True)
    ns.delete("/l", file=True)
    assert tree(ns) == {"/d": "d", "/f": "f"}
    assert ns.resolve("/d").type == pb.DIRECTORY  # deleting the link left its target alone


def test_delete_root_and_bad_parents(ns: Namespace) -> None:
    ns.create("/f")
    with pytest.raises(E.InvalidArgument):
        ns.delete("/")
    with pytest.raises(E.InvalidArgument):
        ns.delete("/", recursive=True)
    with pytest.raises(E.NotFound):
        ns.delete("/missing/x")
    with pytest.raises(E.NotADirectory):
        ns.delete("/f/x")
    assert tree(ns) == {"/f": "f"}


# ----------------------------------------------------------------------- setattr --


def test_setattr(ns: Namespace) -> None:
    node, _ = ns.create("/f")
    got = ns.setattr("/f", mode=0o100600, mtime=1000.5, atime=2000.25)
    assert got.name == "f" and got.mode == 0o600 and got.mtime == 1000.5 and got.atime == 2000.25
    assert got.ctime >= node.ctime
    stored = ns.resolve("/f")
    assert (stored.mode, stored.mtime, stored.atime) == (0o600, 1000.5, 2000.25)
    assert stat.S_IMODE(stored.mode) == 0o600
    # unspecified fields are kept
    ns.setattr("/f", mtime=5.0)
    stored = ns.resolve("/f")
    assert (stored.mode, stored.mtime, stored.atime) == (0o600, 5.0, 2000.25)


def test_setattr_xattrs(ns: Namespace) -> None:
    ns.mkdir("/d")
    ns.setattr("/d", set_xattrs={"user.a": b"1", "user.b": b"\x00\xff"})
    assert dict(ns.resolve("/d").xattrs) == {"user.a": b"1", "user.b": b"\x00\xff"}
    ns.setattr("/d", set_xattrs={"user.a": b"2"}, remove_xattrs=["user.b"])
    assert dict(ns.resolve("/d").xattrs) == {"user.a": b"2"}
    with pytest.raises(E.NotFound):
        ns.setattr("/d", set_xattrs={"user.c": b"3"}, remove_xattrs=["user.zzz"])
    # a failed setattr changes nothing
    assert dict(ns.resolve("/d").xattrs) == {"user.a": b"2"}
    with pytest.raises(E.NotFound):
        ns.setattr("/missing", mode=0o600)
    # the stored record never carries the response-only name
    raw = ns.store.get(b"i" + ns.resolve("/d").id.to_bytes(8, "big"))
    rec = pb.Inode()
    rec.ParseFromString(raw)
    assert rec.name == ""


# ------------------------------------------------------------------------ blocks --


def test_allocate_block(ns: Namespace) -> None:
    node, _ = ns.create("/f")
    ids = [ns.allocate_block(node.id)[0] for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert all(ns.allocations.owner(b) == node.id for b in ids) and len(ns.allocations) == 5
    assert ns.allocate_block(node.id)[1].id == node.id
    ns.mkdir("/d")
    with pytest.raises(E.IsADirectory):
        ns.allocate_block(ns.resolve("/d").id)
    with pytest.raises(E.NotFound):
        ns.allocate_block(99999)
    # allocation alone stores no block record
    assert ns.count()[1] == 0


def test_commit_file(ns: Namespace) -> None:
    node, _ = ns.create("/f", replication=3)
    b1, *_ = ns.allocate_block(node.id)
    b2, *_ = ns.allocate_block(node.id, 5)
    blocks = [
        pb.CommittedBlock(block_id=b1, length=BLOCK, crc32c=11, replicas=["w1", "w2", "w3"]),
        pb.CommittedBlock(block_id=b2, length=5, crc32c=22, replicas=["w2"]),
    ]
    updated, freed = ns.commit_file(node.id, BLOCK + 5, blocks, mtime=1234.0)
    assert freed.blocks == []
    assert updated.size == BLOCK + 5 and list(updated.blocks) == [b1, b2]
    assert updated.version == node.version + 1 and updated.mtime == 1234.0
    assert b1 not in ns.allocations and b2 not in ns.allocations
    inode, metas = ns.layout("/f")
    assert inode.id == node.id and inode.size == BLOCK + 5
    assert [(m.block_id, m.inode, m.length, m.crc32c, list(m.replicas), m.replication) for m in metas] == [
        (b1, node.id, BLOCK, 11, ["w1", "w2", "w3"], 3),
        (b2, node.id, 5, 22, ["w2"], 3),
    ]
    assert ns.layout(inode=node.id)[0].size == BLOCK + 5
    assert ns.count() == (2, 2)


def test_commit_rejects_foreign_and_unknown_blocks(ns: Namespace) -> None:
    f, _ = ns.create("/f")
    g, _ = ns.create("/g")
    mine, *_ = ns.allocate_block(f.id, 1)
    theirs, *_ = ns.allocate_block(g.id, 1)
    good = pb.CommittedBlock(block_id=mine, length=1, replicas=["w1"])
    with pytest.raises(E.Conflict):
        ns.commit_file(f.id, BLOCK + 1, [good, pb.CommittedBlock(block_id=theirs, length=1, replicas=["w1"])])
    with pytest.raises(E.Conflict):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=777777, length=1, replicas=["w1"])])
    with pytest.raises(E.InvalidArgument):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=mine, length=1)])  # no replica
    # nothing was committed by the failed calls, and the allocations are still usable
    assert ns.resolve("/f").size == 0 and ns.count() == (3, 0)
    assert mine in ns.allocations and theirs in ns.allocations
    ns.commit_file(f.id, 1, [good])
    # a block committed once cannot be committed again by another file
    with pytest.raises(E.Conflict):
        ns.commit_file(g.id, 1, [good])
    assert ns.layout("/g")[1] == []


def test_commit_of_an_expired_or_foreign_allocation_says_why(ns: Namespace) -> None:
    clock = [100.0]
    ns.allocations = Allocations(ns.store, ns.allocations.issued, grace=60.0, clock=lambda: clock[0])
    f, _ = ns.create("/f")
    g, _ = ns.create("/g")
    old, *_ = ns.allocate_block(f.id, 1)
    clock[0] += 30
    young, *_ = ns.allocate_block(f.id, 1)
    theirs, *_ = ns.allocate_block(g.id, 1)
    clock[0] += 31  # `old` is 61 s old, the others 31 s
    assert ns.allocations.expire() == [old]
    assert old not in ns.allocations and young in ns.allocations
    with pytest.raises(E.Conflict, match=r"allocation of block \d+ expired \(60 s without a commit"):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=old, length=1, replicas=["w1"])])
    with pytest.raises(E.Conflict, match=f"block {theirs} was allocated for inode {g.id}, not for this file"):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=theirs, length=1, replicas=["w1"])])
    with pytest.raises(E.Conflict, match=f"block {young + 1000} was never allocated by this master"):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=young + 1000, length=1, replicas=["w1"])])
    # a block that was committed and then replaced by another writer's commit
    ns.commit_file(g.id, 1, [pb.CommittedBlock(block_id=theirs, length=1, replicas=["w1"])])
    newer, *_ = ns.allocate_block(g.id, 1)
    ns.commit_file(g.id, 1, [pb.CommittedBlock(block_id=newer, length=1, replicas=["w1"])], replace=True)
    with pytest.raises(E.Conflict, match="another writer committed first"):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=theirs, length=1, replicas=["w1"])])
    assert ns.resolve("/f").size == 0
    ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=young, length=1, replicas=["w1"])])
    assert list(ns.resolve("/f").blocks) == [young] and young not in ns.allocations
    assert len(ns.allocations) == 0


def test_commit_size_mismatch(ns: Namespace) -> None:
    f, _ = ns.create("/f")
    b, *_ = ns.allocate_block(f.id, 100)
    blk = pb.CommittedBlock(block_id=b, length=100, replicas=["w1"])
    for size in (99, 0, BLOCK + 1):  # longer than its place; one block too many; one too few
        with pytest.raises(E.InvalidArgument):
            ns.commit_file(f.id, size, [blk])
    assert ns.resolve("/f").size == 0 and b in ns.allocations
    ns.commit_file(f.id, 101, [blk])  # shorter than its place: the last byte reads as zero
    assert ns.resolve("/f").size == 101


def test_commit_overwrite_returns_freed_blocks(ns: Namespace) -> None:
    first = write(ns, "/f", [10, 20, 30])
    node = ns.resolve("/f")
    new, *_ = ns.allocate_block(node.id, 5)
    keep = [pb.CommittedBlock(block_id=first[0], length=10, replicas=["w1"])]
    updated, freed = ns.commit_file(
        node.id, BLOCK + 5, keep + [pb.CommittedBlock(block_id=new, length=5, replicas=["w3"])]
    )
    assert freed_ids(freed) == sorted(first[1:])
    assert {m.length for m in freed.blocks} == {20, 30}
    assert list(updated.blocks) == [first[0], new] and updated.size == BLOCK + 5
    assert ns.get_block(first[0]).replicas == ["w1", "w2"]  # a kept block's record is untouched
    assert ns.get_block(first[1]) is None and ns.get_block(new).replicas == ["w3"]
    assert ns.count() == (2, 2)
    # an empty commit frees everything
    _, freed = ns.commit_file(node.id, 0, [])
    assert freed_ids(freed) == sorted([first[0], new])
    assert ns.count() == (2, 0)


def test_commit_after_delete_and_on_a_directory(ns: Namespace) -> None:
    f, _ = ns.create("/f")
    b, *_ = ns.allocate_block(f.id, 1)
    ns.delete("/f")
    with pytest.raises(E.NotFound):
        ns.commit_file(f.id, 1, [pb.CommittedBlock(block_id=b, length=1, replicas=["w1"])])
    assert ns.count() == (1, 0)
    with pytest.raises(E.IsADirectory):
        ns.commit_file(ROOT, 0, [])
    with pytest.raises(E.IsADirectory):
        ns.layout("/")


def test_set_replicas(ns: Namespace) -> None:
    (b,) = write(ns, "/f", [3])
    meta = ns.set_replicas(b, ["w9", "w1"])
    assert meta is not None and list(meta.replicas) == ["w9", "w1"]
    assert list(ns.get_block(b).replicas) == ["w9", "w1"]
    assert ns.set_replicas(424242, ["w1"]) is None
    assert ns.get_block(424242) is None


# ------------------------------------------------------------------- persistence --


def test_namespace_survives_reopen(tmp_path: Path) -> None:
    uri = f"rocksdb://{tmp_path / 'meta'}"

    def open_ns() -> Namespace:
        return Namespace(open_metastore(uri), default_block_size=BLOCK, default_replication=2)

    ns = open_ns()
    ns.mkdir("/a/b", parents=True)
    blocks = write(ns, "/a/b/f", [BLOCK, 1])
    ns.symlink("/a/l", "b/f")
    ns.setattr("/a", mode=0o700, set_xattrs={"user.k": b"v"})
    ns.rename("/a/b/f", "/a/g")
    pending, *_ = ns.allocate_block(ns.resolve("/a/g").id)
    shape = tree(ns)
    ids = {p: ns.resolve(p).id for p in shape}
    ns.store.close()

    ns = open_ns()
    assert tree(ns) == shape == {"/a": "d", "/a/b": "d", "/a/g": "f", "/a/l": "l"}
    assert {p: ns.resolve(p).id for p in shape} == ids
    a = ns.resolve("/a")
    assert a.mode == 0o700 and dict(a.xattrs) == {"user.k": b"v"}
    assert ns.resolve("/a/l").symlink_target == "b/f"
    node, metas = ns.layout("/a/g")
    assert node.size == BLOCK + 1 and [m.block_id for m in metas] == blocks
    assert ns.count() == (5, 2)
    # allocations are durable: a writer that allocated before the restart commits its block
    assert ns.allocations.owner(pending) == node.id and len(ns.allocations) == 1
    reopened_pending = pending
    # counters continue past everything handed out before, including the uncommitted block
    new_dir = ns.mkdir("/c")
    assert new_dir.id > max(ids.values())
    new_block, *_ = ns.allocate_block(node.id)
    assert new_block > max(blocks + [pending])
    committed = ns.commit_file(
        node.id,
        BLOCK + 1,
        [
            pb.CommittedBlock(block_id=reopened_pending, length=BLOCK, replicas=["w1"]),
            pb.CommittedBlock(block_id=blocks[1], length=1, replicas=["w2"]),
        ],
    )[0]
    assert list(committed.blocks) == [pending, blocks[1]] and pending not in ns.allocations
    ns.store.close()

    # reopening many times without using ids still never goes backwards
    seen = {new_dir.id}
    for _ in range(3):
        ns = open_ns()
        ino = ns.mkdir(f"/x{len(seen)}").id
        assert ino > max(seen)
        seen.add(ino)
        ns.store.close()
    ns = open_ns()
    assert sorted(p for p in tree(ns) if p.startswith("/x")) == ["/x1", "/x2", "/x3"]
    ns.store.close()


def test_ids_are_reserved_in_batches(store: MetaStore) -> None:
    ns = Namespace(store, default_block_size=BLOCK, default_replication=1)
    first = ns.mkdir("/d0").id
    for i in range(1, ID_BATCH + 5):
        ns.mkdir(f"/d{i}")
    last = ns.resolve(f"/d{ID_BATCH + 4}").id
    assert last - first == ID_BATCH + 4  # consecutive within and across batches
    # a second Namespace on the same store starts past the reserved range
    again = Namespace(store, default_block_size=BLOCK, default_replication=1)
    assert again.mkdir("/next").id >= first + 2 * ID_BATCH


# ------------------------------------------------------------ stateful, vs a model --

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))


class TreeModel:
    """The POSIX semantics the Namespace promises, on a plain dict {path: 'd' | 'f' | 'l'}."""

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}
        self.blocks: dict[str, int] = {}  # file path -> committed blocks

    def kind(self, path: str) -> str | None:
        return "d" if path == "/" else self.nodes.get(path)

    def check_parent(self, path: str) -> None:
        cur = "/"
        for part in path[1:].split("/")[:-1]:
            if self.kind(cur) != "d":
                raise E.NotADirectory
            cur = cur.rstrip("/") + "/" + part
            if cur not in self.nodes:
                raise E.NotFound
        if self.kind(cur) != "d":
            raise E.NotADirectory

    def subtree(self, path: str) -> list[str]:
        return [p for p in self.nodes if p == path or p.startswith(path + "/")]

    def mkdir(self, path: str, parents: bool) -> int:
        if parents:
            parts = path[1:].split("/")
            cur = ""
            for i, part in enumerate(parts):
                cur += "/" + part
                kind = self.nodes.get(cur)
                if kind is None:
                    self.nodes[cur] = "d"
                elif kind != "d":
                    raise E.AlreadyExists if i == len(parts) - 1 else E.NotADirectory
            return 0
        self.check_parent(path)
        if path in self.nodes:
            raise E.AlreadyExists
        self.nodes[path] = "d"
        return 0

    def create(self, path: str, exclusive: bool, truncate: bool) -> int:
        self.check_parent(path)
        kind = self.nodes.get(path)
        if kind is None:
            self.nodes[path] = "f"
            self.blocks[path] = 0
            return 0
        if exclusive:
            raise E.AlreadyExists
        if kind == "d":
            raise E.IsADirectory
        if truncate and kind == "f":
            freed, self.blocks[path] = self.blocks[path], 0
            return freed
        return 0

    def symlink(self, path: str) -> int:
        self.check_parent(path)
        if path in self.nodes:
            raise E.AlreadyExists
        self.nodes[path] = "l"
        return 0

    def write(self, path: str, count: int) -> int:
        freed, self.blocks[path] = self.blocks[path], count
        return freed

    def rename(self, src: str, dst: str, no_replace: bool) -> int:
        self.check_parent(src)
        if src not in self.nodes:
            raise E.NotFound
        self.check_parent(dst)
        if dst.startswith(src + "/"):
            raise E.InvalidArgument
        if src == dst:
            return 0
        freed = 0
        victim = self.nodes.get(dst)
        if victim is not None:
            if no_replace:
                raise E.AlreadyExists
            if victim == "d":
                if self.nodes[src] != "d":
                    raise E.IsADirectory
                if len(self.subtree(dst)) > 1:
                    raise E.DirectoryNotEmpty
            elif self.nodes[src] == "d":
                raise E.NotADirectory
            del self.nodes[dst]
            freed = self.blocks.pop(dst, 0)
        for old in self.subtree(src):
            new = dst + old[len(src) :]
            self.nodes[new] = self.nodes.pop(old)
            if old in self.blocks:
                self.blocks[new] = self.blocks.pop(old)
        return freed

    def delete(self, path: str, recursive: bool) -> int:
        self.check_parent(path)
        if path not in self.nodes:
            raise E.NotFound
        doomed = self.subtree(path)
        if len(doomed) > 1 and not recursive:
            raise E.DirectoryNotEmpty
        freed = 0
        for p in doomed:
            del self.nodes[p]
            freed += self.blocks.pop(p, 0)
        return freed


def outcome(fn: Callable[[], object]) -> object:
    """The value, or the class of the PCacheError raised."""
    try:
        return fn()
    except E.PCacheError as exc:
        return type(exc)


class NamespaceMachine(RuleBasedStateMachine):
    """Random mkdir/create/symlink/write/rename/delete/reopen on a Namespace and on the model."""

    rocks = False

    def __init__(self) -> None:
        super().__init__()
        self.model = TreeModel()
        self.dir = tempfile.mkdtemp(prefix="ns-machine-") if self.rocks else ""
        self.mem_store = open_metastore("memory://")
        self.ns = self._open()

    def _open(self) -> Namespace:
        store = open_metastore(f"rocksdb://{self.dir}/meta") if self.rocks else self.mem_store
        return Namespace(store, default_block_size=BLOCK, default_replication=2)

    def teardown(self) -> None:
        if self.rocks:
            self.ns.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def both(self, real: Callable[[], object], model: Callable[[], object]) -> None:
        got, want = outcome(real), outcome(model)
        assert got == want, (got, want)

    @rule(path=PATHS, parents=st.booleans())
    def mkdir(self, path: str, parents: bool) -> None:
        self.both(lambda: ns_ok(self.ns.mkdir(path, parents=parents)), lambda: self.model.mkdir(path, parents))

    @rule(path=PATHS, exclusive=st.booleans(), truncate=st.booleans())
    def create(self, path: str, exclusive: bool, truncate: bool) -> None:
        self.both(
            lambda: len(self.ns.create(path, exclusive=exclusive, truncate=truncate)[1].blocks),
            lambda: self.model.create(path, exclusive, truncate),
        )

    @rule(path=PATHS)
    def symlink(self, path: str) -> None:
        self.both(lambda: ns_ok(self.ns.symlink(path, "target")), lambda: self.model.symlink(path))

    @rule(path=PATHS, count=st.integers(0, 3))
    def write(self, path: str, count: int) -> None:
        if self.model.kind(path) != "f":
            return
        node = self.ns.resolve(path)
        blocks = [
            pb.CommittedBlock(block_id=self.ns.allocate_block(node.id, 10)[0], length=10, replicas=["w1"])
            for _ in range(count)
        ]
        self.both(
            lambda: len(self.ns.commit_file(node.id, extent([10] * count, node.block_size), blocks)[1].blocks),
            lambda: self.model.write(path, count),
        )

    @rule(src=PATHS, dst=PATHS, no_replace=st.booleans())
    def rename(self, src: str, dst: str, no_replace: bool) -> None:
        self.both(
            lambda: len(self.ns.rename(src, dst, no_replace=no_replace)[1].blocks),
            lambda: self.model.rename(src, dst, no_replace),
        )

    @rule(path=PATHS, recursive=st.booleans())
    def delete(self, path: str, recursive: bool) -> None:
        self.both(
            lambda: len(self.ns.delete(path, recursive=recursive).blocks),
            lambda: self.model.delete(path, recursive),
        )

    @rule()
    def reopen(self) -> None:
        if self.rocks:
            self.ns.store.close()
        self.ns = self._open()

    @invariant()
    def same_tree(self) -> None:
        assert tree(self.ns) == self.model.nodes
        # no inode or block record outlives its path
        assert self.ns.count() == (len(self.model.nodes) + 1, sum(self.model.blocks.values()))


def ns_ok(_node: pb.Inode) -> int:
    return 0


class RocksNamespaceMachine(NamespaceMachine):
    rocks = True


TestNamespaceMachineMemory = NamespaceMachine.TestCase
TestNamespaceMachineMemory.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestNamespaceMachineRocks = RocksNamespaceMachine.TestCase
# creating a RocksDB costs ~0.2 s: fewer examples here, the memory run covers the logic
TestNamespaceMachineRocks.settings = settings(
    max_examples=15, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_commit_merges_disjoint_writers_at_block_granularity(ns: Namespace) -> None:
    first = write(ns, "/m", [BLOCK, BLOCK, BLOCK, 10])
    node = ns.resolve("/m")
    view = (node.version, list(node.blocks))

    def change(index: int, length: int) -> pb.CommittedBlock:
        return pb.CommittedBlock(block_id=ns.allocate_block(node.id, length)[0], length=length, replicas=["w3"])

    def keep(block_id: int, length: int) -> pb.CommittedBlock:
        return pb.CommittedBlock(block_id=block_id, length=length, replicas=["w1"])

    a0 = change(0, BLOCK)
    ns.commit_file(node.id, 3 * BLOCK + 10, [a0, keep(first[1], BLOCK), keep(first[2], BLOCK), keep(first[3], 10)],
                   base_version=view[0], base_blocks=view[1], replace=False)  # fmt: skip
    # a second writer from the same view changed block 2 and appended a block: merged with the first
    b2, b4 = change(2, BLOCK), change(4, 7)
    merged, freed = ns.commit_file(
        node.id,
        4 * BLOCK + 7,
        [keep(first[0], BLOCK), keep(first[1], BLOCK), b2, keep(first[3], 10), b4],
        base_version=view[0],
        base_blocks=view[1],
        replace=False,
    )
    assert list(merged.blocks) == [a0.block_id, first[1], b2.block_id, first[3], b4.block_id]
    assert merged.size == 4 * BLOCK + 7 and freed_ids(freed) == [first[2]]
    # block 3 stays 10 bytes long: the rest of its place reads as zeros
    assert [m.length for m in ns.layout("/m")[1]] == [BLOCK, BLOCK, BLOCK, 10, 7]
    # a third writer from the old view that changed block 0 too: conflict, nothing committed
    c0 = change(0, BLOCK)
    with pytest.raises(E.Conflict):
        ns.commit_file(node.id, 3 * BLOCK + 10, [c0, keep(first[1], BLOCK), keep(first[2], BLOCK), keep(first[3], 10)],
                       base_version=view[0], base_blocks=view[1], replace=False)  # fmt: skip
    # a truncating writer from an old view: conflict even on blocks nobody else changed
    with pytest.raises(E.Conflict):
        ns.commit_file(node.id, BLOCK, [keep(first[0], BLOCK)], base_version=view[0], base_blocks=view[1], replace=True)
    assert list(ns.resolve("/m").blocks) == list(merged.blocks) and c0.block_id in ns.allocations


def test_a_deleted_tenants_name_is_free_once_no_key_of_its_time_verifies(ns: Namespace) -> None:
    """Deleting a tenant leaves a tombstone with the token keys of that time: the name is refused
    while one of them is in the ring (its old tokens would be valid again), and free after the
    keys rotated past them. A purge also ends the reservations of the tenant's open writers."""
    ns.create_tenant("t", quota_bytes=10 * BLOCK, key_ids=["k1"])
    node, _ = ns.create("/t/f")
    ns.allocate_block(node.id)
    assert ns.allocations.reserved_bytes("t") == BLOCK
    ns.delete_tenant("t", purge=True, key_ids=["k1", "k0"])
    assert ns.allocations.reserved_bytes("t") == 0 and len(ns.allocations) == 0
    with pytest.raises(E.AlreadyExists, match=r"\(k1\)"):
        ns.create_tenant("t", key_ids=["k2", "k1"])  # one rotation: k1 still verifies
    rec = ns.create_tenant("t", key_ids=["k3", "k2"])  # two rotations: every old token is dead
    assert rec.name == "t" and rec.used_bytes == 0 and ns.allocations.reserved_bytes("t") == 0
    ns.delete_tenant("t", key_ids=["k3", "k2"])
    with pytest.raises(E.AlreadyExists):
        ns.create_tenant("t", key_ids=["k3"])


def test_a_deleted_tenants_block_tokens_stay_revoked_at_the_workers(store: MetaStore) -> None:
    """A tenant's block tokens live ``block_token_ttl`` and name the tenant only: deleting it
    dropped its revocation (the workers' map lost it) and never revoked anything. Its deletion
    revokes them until the last one has expired, across a restart; a new tenant of that name
    starts with the revocation (its block tokens carry their issue time), and a revocation made
    before the deletion is kept."""
    from pcache.common.auth import MAX_CLOCK_SKEW
    from pcache.master.tenants import GONE

    ns = Namespace(store, default_block_size=BLOCK, default_replication=1)
    ns.create_tenant("t", key_ids=["k1"])
    ns.create_tenant("other", key_ids=["k1"])
    later = ns.tenants.revoke("t", now=time.time() + 1000)  # revoked first, with a later instant
    ns.store.write([ns.tenants.put(later)])
    before = time.time()
    ns.delete_tenant("t", key_ids=["k1"])
    ns.delete_tenant("other", key_ids=["k1"])
    instant = ns.tenants.for_workers(3600.0)["other"]
    assert (before + MAX_CLOCK_SKEW) * 1000 < instant <= (time.time() + MAX_CLOCK_SKEW) * 1000 + 1
    assert ns.tenants.for_workers(3600.0)["t"] == later.revoked_before_ms  # never moves back
    reopened = Namespace(store, default_block_size=BLOCK, default_replication=1)  # a restart, or a follower
    assert reopened.tenants.for_workers(3600.0) == {"t": later.revoked_before_ms, "other": instant}
    past = time.time() + MAX_CLOCK_SKEW + 3600.0 + 1  # every block token of theirs has expired
    assert reopened.tenants.for_workers(3600.0, now=past) == {"t": later.revoked_before_ms}
    assert reopened.tenants.for_workers(3600.0, now=past + 1000) == {}
    store.write([(GONE + b"old", b"k0,k1")])  # a tombstone stored before they carried the instant
    assert "old" not in Namespace(store, default_block_size=BLOCK, default_replication=1).tenants.revoked
    with pytest.raises(E.AlreadyExists, match="k0, k1"):
        reopened.create_tenant("old", key_ids=["k1", "k0"])
    rec = reopened.create_tenant("other", key_ids=["k3", "k2"])  # the keys rotated twice: the name is free
    assert rec.revoked_before_ms == instant
    assert reopened.tenants.for_workers(3600.0, now=past + 1000) == {"other": instant}  # a live tenant's


def test_a_deleted_default_tenant_is_not_made_again_at_the_next_start(store: MetaStore) -> None:
    """The embedded default's tenant is made at a master's first start; once an admin deleted it,
    a restart must not bring it (and its old tokens) back."""
    ns = Namespace(store, default_block_size=BLOCK, default_replication=1, default_tenant="default")
    assert "default" in ns.tenants
    ns.delete_tenant("default", key_ids=["k1"])
    again = Namespace(store, default_block_size=BLOCK, default_replication=1, default_tenant="default")
    assert "default" not in again.tenants and again.tenants.deleted("default")
