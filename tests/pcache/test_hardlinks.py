"""Hard links in the namespace: names share one inode, its blocks and its quota charge."""

from __future__ import annotations

import errno

import pytest

from pcache.common import errors as E
from pcache.master.namespace import Namespace
from tests.pcache.test_namespace import BLOCK, freed_ids, write


def test_a_link_is_another_name_of_the_same_inode(ns: Namespace) -> None:
    ns.mkdir("/a")
    ns.mkdir("/b")
    blocks = write(ns, "/a/f", [BLOCK, 100])
    linked = ns.link("/a/f", "/b/g")
    assert linked.name == "g" and linked.nlink == 2
    a, b = ns.resolve("/a/f"), ns.resolve("/b/g")
    assert a.id == b.id and list(a.blocks) == blocks and a.nlink == b.nlink == 2
    assert [e.name for e in ns.listdir("/b")[0]] == ["g"]
    assert ns.resolve("/b").mtime >= a.ctime - 1  # the directory that got the name changed
    # unlinking one name keeps the file and its blocks
    assert freed_ids(ns.delete("/a/f", file=True)) == []
    assert ns.resolve("/b/g").nlink == 1 and list(ns.resolve("/b/g").blocks) == blocks
    with pytest.raises(E.NotFound):
        ns.resolve("/a/f")
    # the last name takes the blocks with it
    assert freed_ids(ns.delete("/b/g", file=True)) == sorted(blocks)


def test_link_errors(ns: Namespace) -> None:
    ns.mkdir("/d")
    write(ns, "/f", [10])
    with pytest.raises(E.NotPermitted) as info:
        ns.link("/d", "/d2")  # directories: EPERM, as link(2)
    assert info.value.errno == errno.EPERM
    with pytest.raises(E.AlreadyExists):
        ns.link("/f", "/d")
    with pytest.raises(E.NotFound):
        ns.link("/missing", "/x")
    with pytest.raises(E.NotFound):
        ns.link("/f", "/nope/x")
    ns.symlink("/s", "f")
    assert ns.link("/s", "/s2").symlink_target == "f"  # the symlink itself, not followed


def test_rename_over_a_linked_file_drops_one_name(ns: Namespace) -> None:
    blocks = write(ns, "/f", [BLOCK])
    ns.link("/f", "/g")
    write(ns, "/h", [5])
    _node, freed = ns.rename("/h", "/g")  # replaces one name of f: f keeps its blocks
    assert freed_ids(freed) == []
    assert ns.resolve("/f").nlink == 1 and list(ns.resolve("/f").blocks) == blocks
    assert ns.resolve("/g").size == 5
    # rename of one name onto another name of the same file: nothing happens (rename(2))
    ns.link("/f", "/f2")
    ns.rename("/f", "/f2")
    assert ns.resolve("/f").id == ns.resolve("/f2").id and ns.resolve("/f").nlink == 2


def test_a_recursive_delete_keeps_files_linked_from_outside(ns: Namespace) -> None:
    ns.mkdir("/t/sub", parents=True)
    inside = write(ns, "/t/sub/in", [BLOCK])
    kept = write(ns, "/t/out", [BLOCK])
    ns.link("/t/sub/in", "/t/sub/in2")  # both names in the tree: the file goes
    ns.link("/t/out", "/keep")  # a name outside the tree: the file stays
    freed = ns.delete("/t", recursive=True)
    assert freed_ids(freed) == sorted(inside)
    node = ns.resolve("/keep")
    assert node.nlink == 1 and list(node.blocks) == kept


def test_directory_nlink_counts_subdirectories(ns: Namespace) -> None:
    ns.mkdir("/p")
    assert ns.resolve("/p").subdirs == 0
    ns.mkdir("/p/a")
    ns.mkdir("/p/b/c", parents=True)
    write(ns, "/p/file", [1])
    assert ns.resolve("/p").subdirs == 2 and ns.resolve("/p/b").subdirs == 1
    ns.mkdir("/q")
    ns.rename("/p/a", "/q/a")
    assert ns.resolve("/p").subdirs == 1 and ns.resolve("/q").subdirs == 1
    ns.mkdir("/p/empty")
    ns.rename("/q/a", "/p/empty")  # replaces an empty directory of /p
    assert ns.resolve("/p").subdirs == 2 and ns.resolve("/q").subdirs == 0
    ns.delete("/p/b", recursive=True)
    ns.delete("/p/empty", directory=True)
    assert ns.resolve("/p").subdirs == 0


def test_links_stay_inside_a_tenant_and_bytes_are_charged_once(ns: Namespace) -> None:
    """A link shares its file's bytes (charged once) and is a name of its own in the inode quota
    (a quota of entries: links must not make names for nothing)."""
    ns.create_tenant("t1")
    ns.create_tenant("t2")
    write(ns, "/t1/f", [BLOCK])
    used = ns.tenants.get("t1")
    ns.link("/t1/f", "/t1/g")
    after = ns.tenants.get("t1")
    assert (after.used_inodes, after.used_bytes) == (used.used_inodes + 1, used.used_bytes)
    with pytest.raises(E.CrossTenant):
        ns.link("/t1/f", "/t2/f")
    ns.delete("/t1/f", file=True)
    ns.delete("/t1/g", file=True)
    gone = ns.tenants.get("t1")
    assert gone.used_bytes == used.used_bytes - BLOCK and gone.used_inodes == used.used_inodes - 1


def test_no_links_under_a_bind(ns: Namespace) -> None:
    ns.bind("/bound", "s3://bucket/prefix", mode="writeback")
    write(ns, "/outside", [1])
    with pytest.raises(E.NotSupported):
        ns.link("/outside", "/bound/x")
    ns.link("/outside", "/other")
    with pytest.raises(E.NotSupported):  # a linked file moved in would persist one name's writes only
        ns.rename("/other", "/bound/moved")
    ns.mkdir("/dir")
    ns.link("/outside", "/dir/inner")
    with pytest.raises(E.NotSupported):  # nor inside a directory moved in
        ns.rename("/dir", "/bound/dir")
    assert ns.resolve("/dir/inner").nlink == 3 and ns.resolve("/other").nlink == 3
    ns.delete("/other", file=True)
    ns.delete("/dir/inner", file=True)
    ns.rename("/outside", "/bound/moved")  # one name left: an ordinary file again


def test_the_sdk_sees_its_own_changes_through_every_name_and_in_parents(client) -> None:
    client.mkdir("/sdk-links")
    client.write_file("/sdk-links/a", b"original")
    client.link("/sdk-links/a", "/sdk-links/b")
    assert client.read_file("/sdk-links/b") == b"original" and client.stat("/sdk-links/b").nlink == 2  # cached now
    client.write_file("/sdk-links/a", b"REPLACED-LONGER")
    assert client.stat("/sdk-links/b").size == 15 and client.read_file("/sdk-links/b") == b"REPLACED-LONGER"
    client.truncate("/sdk-links/a", 1)
    assert client.read_file("/sdk-links/b") == b"R"
    client.unlink("/sdk-links/a")
    assert client.stat("/sdk-links/b").nlink == 1
    # a directory's cached stat follows this client's changes of its entries
    client.mkdir("/sdk-parent/a/b", parents=True)
    assert client.stat("/sdk-parent").nlink == 3
    client.mkdir("/sdk-parent/c")
    assert client.stat("/sdk-parent").nlink == 4
    client.remove("/sdk-parent/a", recursive=True)
    assert client.stat("/sdk-parent").nlink == 3
    client.mkdir("/sdk-parent2")
    client.rename("/sdk-parent/c", "/sdk-parent2/c")
    assert client.stat("/sdk-parent").nlink == 2 and client.stat("/sdk-parent2").nlink == 3
    before = client.stat("/sdk-parent2").mtime
    client.write_file("/sdk-parent2/f", b"x")
    assert client.stat("/sdk-parent2").mtime > before


def test_du_and_fsck_count_a_linked_file_once(client) -> None:
    client.mkdir("/du-links")
    client.write_file("/du-links/a", b"x" * 5000)
    client.link("/du-links/a", "/du-links/b")
    client.link("/du-links/a", "/du-links/c")
    client.write_file("/du-links/d", b"y" * 10)
    assert client.du("/du-links") == (5010, 2, 1)
    report = client.fsck("/du-links")
    assert report.files == 2 and report.blocks == 2
