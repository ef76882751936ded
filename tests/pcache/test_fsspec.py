"""``pcache://`` through fsspec: the entry point, fsspec's own abstract suite, and what users do with it."""

from __future__ import annotations

import asyncio
import io
import pickle
import uuid

import fsspec
import pytest
from fsspec.tests import abstract

from pcache.client.filesystem import PCacheFileSystem, split_url
from pcache.common import errors as E


@pytest.fixture(scope="module")
def pfs(shared_cluster) -> PCacheFileSystem:
    return fsspec.filesystem("pcache", master=shared_cluster.master_address, skip_instance_cache=True)


class PCacheFixtures(abstract.AbstractFixtures):
    """fsspec's fixtures bound to a real 3-worker cluster."""

    @pytest.fixture
    def fs(self, pfs):
        return pfs

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self):
        return f"/fsspec-{uuid.uuid4().hex[:8]}"


class TestPCacheCopy(abstract.AbstractCopyTests, PCacheFixtures):
    pass


class TestPCacheGet(abstract.AbstractGetTests, PCacheFixtures):
    pass


class TestPCachePut(abstract.AbstractPutTests, PCacheFixtures):
    pass


class TestPCacheOpen(abstract.AbstractOpenTests, PCacheFixtures):
    pass


class TestPCachePipe(abstract.AbstractPipeTests, PCacheFixtures):
    pass


def test_the_entry_point_names_the_class():
    assert fsspec.get_filesystem_class("pcache") is PCacheFileSystem


def test_urls_split_by_hand_keep_glob_characters():
    assert split_url("pcache://h:1,g:2/a/b?[x]#") == ("h:1,g:2", "/a/b?[x]#")
    assert split_url("pcache://h:1") == ("h:1", "/")
    assert split_url("/plain/path") == ("", "/plain/path")
    assert PCacheFileSystem._strip_protocol("pcache://h:1/a/b/") == "/a/b"
    assert PCacheFileSystem._strip_protocol("pcache:///") == "/"
    assert PCacheFileSystem._strip_protocol("//a//b c/") == "/a/b c"
    assert PCacheFileSystem._get_kwargs_from_urls("pcache://h:1/a") == {"url_master": "h:1"}
    assert PCacheFileSystem._get_kwargs_from_urls("pcache:///a") == {}


def test_options_that_name_the_master_or_a_token_wrongly_are_clear_errors(shared_cluster, tmp_path):
    """``url_to_fs(url, master=...)`` raised fsspec's TypeError (a keyword given twice); an unset
    variable passed as ``token=""`` wrote into this machine's default tenant; a token read from
    a file with its newline failed deep in gRPC ("Illegal header value")."""
    m = shared_cluster.master_address
    fs, path = fsspec.core.url_to_fs(f"pcache://{m}/fsspec-opts/x", master=m, skip_instance_cache=True)
    assert isinstance(fs, PCacheFileSystem) and path == "/fsspec-opts/x"
    with pytest.raises(E.InvalidArgument, match="give one"):
        fsspec.core.url_to_fs("pcache://10.9.9.9:1/x", master=m, skip_instance_cache=True)
    with pytest.raises(E.InvalidArgument, match="token .* is empty"):
        fsspec.filesystem("pcache", master=m, token="", skip_instance_cache=True)
    token = tmp_path / "token"
    token.write_text(shared_cluster.token + "\n")
    fs = fsspec.filesystem("pcache", master=m, token=token.read_text(), skip_instance_cache=True)
    fs.pipe_file("/fsspec-opts/y", b"y")
    assert fs.cat_file("/fsspec-opts/y") == b"y"


def test_one_filesystem_per_master_however_it_is_named(shared_cluster, caplog):
    """From a helper's drill: ``filesystem("pcache", master=M)`` and ``pcache://M/...`` were two
    instances with two metadata caches: ``fs.pipe`` then ``pd.read_parquet(url)`` read the old
    table. And a URL without a host going to another master than the process named is logged
    (Hugging Face datasets drops the host of the URLs it globs)."""
    m = shared_cluster.master_address
    fs = fsspec.filesystem("pcache", master=m, metadata_ttl=30.0)
    url = f"pcache://{m}/fsspec-one/v.txt"
    fs.pipe_file("/fsspec-one/v.txt", b"version-1")
    with fsspec.open(url, metadata_ttl=30.0) as f:
        assert f.read() == b"version-1"  # its stat is cached now, for 30 s
    fs.pipe_file("/fsspec-one/v.txt", b"version-2")
    with fsspec.open(url, metadata_ttl=30.0) as f:
        assert f.fs is fs and f.read() == b"version-2"
    assert fsspec.core.url_to_fs(url, metadata_ttl=30.0)[0] is fs
    assert PCacheFileSystem(m, metadata_ttl=30.0) is fs  # positional
    with caplog.at_level("WARNING", logger="pcache.client.filesystem"):
        fsspec.filesystem("pcache", metadata_ttl=12.5)  # no master: $PCACHE_MASTER or 127.0.0.1:19600
    assert "storage_options" in caplog.text and m in caplog.text


def test_fsspec_open_by_url_round_trips_a_torch_checkpoint(shared_cluster, client):
    torch = pytest.importorskip("torch")
    url = f"pcache://{shared_cluster.master_address}/fsspec-url/ckpt/model.pt"
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 7}
    with fsspec.open(url, "wb") as f:
        torch.save(state, f)
    with fsspec.open(url, "rb") as f:
        back = torch.load(f)
    assert back["step"] == 7 and torch.equal(back["w"], state["w"])
    # the same bytes as the SDK sees them
    buf = io.BytesIO()
    torch.save(state, buf)
    assert client.read_file("/fsspec-url/ckpt/model.pt") == buf.getvalue()


def test_ranges_info_and_listing(pfs, client):
    data = bytes(range(256)) * 40_000  # 10 MB: more than one fsspec block and one read unit
    pfs.pipe_file("/fsspec-ranges/d/data.bin", data)
    assert pfs.cat_file("/fsspec-ranges/d/data.bin", start=-10) == data[-10:]
    assert pfs.cat_file("/fsspec-ranges/d/data.bin", start=5, end=-5) == data[5:-5]
    assert pfs.cat_file("/fsspec-ranges/d/data.bin", start=len(data) + 5) == b""
    with pfs.open("/fsspec-ranges/d/data.bin", "rb", block_size=1 << 20) as f:
        f.seek(3_000_000)
        assert f.read(2_500_000) == data[3_000_000:5_500_000]
    info = pfs.info("pcache:///fsspec-ranges/d/data.bin")
    assert info["type"] == "file" and info["size"] == len(data)
    assert info["ino"] == client.stat("/fsspec-ranges/d/data.bin").inode
    assert pfs.ls("/fsspec-ranges/d/data.bin", detail=False) == ["/fsspec-ranges/d/data.bin"]
    assert pfs.ls("/fsspec-ranges", detail=False) == ["/fsspec-ranges/d"]
    assert pfs.info("/fsspec-ranges/d")["type"] == "directory"
    client.symlink("d/data.bin", "/fsspec-ranges/link")
    link = pfs.info("/fsspec-ranges/link")
    assert link["islink"] and link["type"] == "file" and link["size"] == len(data)
    assert pfs.find("/fsspec-ranges") == ["/fsspec-ranges/d/data.bin", "/fsspec-ranges/link"]
    assert pfs.cat(["/fsspec-ranges/d/data.bin", "/fsspec-ranges/link"]) == {
        "/fsspec-ranges/d/data.bin": data,
        "/fsspec-ranges/link": data,
    }


def test_errors_are_the_builtin_ones(pfs):
    with pytest.raises(FileNotFoundError):
        pfs.info("/fsspec-errors/missing")
    with pytest.raises(FileNotFoundError):
        pfs.cat_file("/fsspec-errors/missing")
    pfs.mkdir("/fsspec-errors/dir")
    with pytest.raises(FileExistsError):
        pfs.mkdir("/fsspec-errors/dir")
    with pytest.raises(IsADirectoryError):
        pfs.open("/fsspec-errors/dir", "rb")
    with pytest.raises(IsADirectoryError):
        pfs.rm("/fsspec-errors/dir")
    pfs.pipe_file("/fsspec-errors/dir/f", b"x")
    with pytest.raises(OSError, match="not empty"):
        pfs.rmdir("/fsspec-errors/dir")
    pfs.rm("/fsspec-errors", recursive=True)
    assert not pfs.exists("/fsspec-errors")
    with pytest.raises(FileNotFoundError):
        pfs.rm("/fsspec-errors/nope")


def test_a_transaction_shows_nothing_until_commit(pfs):
    with pfs.transaction:
        with pfs.open("/fsspec-tx/a.bin", "wb") as f:
            f.write(b"a" * 100)
        assert not pfs.exists("/fsspec-tx/a.bin")
    assert pfs.cat_file("/fsspec-tx/a.bin") == b"a" * 100
    pfs.start_transaction()
    with pfs.open("/fsspec-tx/b.bin", "wb") as f:
        f.write(b"b")
    pfs.transaction.complete(commit=False)
    assert pfs.ls("/fsspec-tx", detail=False) == ["/fsspec-tx/a.bin"]  # discarded: no hidden sibling left


def test_mv_is_one_rename_and_append_appends(pfs, client):
    pfs.pipe_file("/fsspec-mv/src.bin", b"12345")
    ino = client.stat("/fsspec-mv/src.bin").inode
    pfs.mv("/fsspec-mv/src.bin", "/fsspec-mv/deeper/dst.bin")
    assert client.stat("/fsspec-mv/deeper/dst.bin").inode == ino  # renamed, not copied
    assert not pfs.exists("/fsspec-mv/src.bin")
    with pfs.open("/fsspec-mv/deeper/dst.bin", "ab") as f:
        assert f.tell() == 5
        f.write(b"678")
    assert pfs.cat_file("/fsspec-mv/deeper/dst.bin") == b"12345678"
    pfs.touch("/fsspec-mv/deeper/dst.bin", truncate=False)
    assert pfs.cat_file("/fsspec-mv/deeper/dst.bin") == b"12345678"
    pfs.touch("/fsspec-mv/deeper/dst.bin")
    assert pfs.cat_file("/fsspec-mv/deeper/dst.bin") == b""


def test_mv_into_the_directory_that_holds_it_loses_nothing(pfs, client):
    """``mv(f, its own directory)`` went to fsspec's copy-then-delete, which copied the path onto
    itself and then deleted it: the file (or a whole directory) was gone, and no error."""
    pfs.pipe({"/fsspec-mvp/data.bin": b"precious", "/fsspec-mvp/run1/x": b"x", "/fsspec-mvp/top.bin": b"t"})
    for src, into in [
        ("/fsspec-mvp/data.bin", "/fsspec-mvp"),
        ("/fsspec-mvp/data.bin", "/fsspec-mvp/"),
        ("/fsspec-mvp/run1", "/fsspec-mvp"),
    ]:
        with pytest.raises(E.InvalidArgument, match="cannot move"):
            pfs.mv(src, into, recursive=True)
    pfs.mv("/fsspec-mvp/run1", "/fsspec-mvp/run1/", recursive=True)  # onto itself: nothing to do
    assert pfs.cat_file("/fsspec-mvp/data.bin") == b"precious" and pfs.cat_file("/fsspec-mvp/run1/x") == b"x"
    # into another directory: moved inside it whole, one rename (as mv(1); without recursive too)
    ino = client.stat("/fsspec-mvp/run1").inode
    pfs.mkdir("/fsspec-mvp/done")
    pfs.mv("/fsspec-mvp/run1", "/fsspec-mvp/done")
    assert client.stat("/fsspec-mvp/done/run1").inode == ino and pfs.cat_file("/fsspec-mvp/done/run1/x") == b"x"
    pfs.mv("/fsspec-mvp/top.bin", "/fsspec-mvp/done/")
    assert pfs.cat_file("/fsspec-mvp/done/top.bin") == b"t" and not pfs.exists("/fsspec-mvp/top.bin")


def test_a_pickled_filesystem_reads_in_another_instance(pfs):
    pfs.pipe_file("/fsspec-pickle/x", b"payload")
    again = pickle.loads(pickle.dumps(pfs))
    assert again.cat_file("/fsspec-pickle/x") == b"payload"


def test_open_async_on_the_callers_loop(shared_cluster):
    async def main() -> bytes:
        fs = PCacheFileSystem(master=shared_cluster.master_address, asynchronous=True, skip_instance_cache=True)
        f = await fs.open_async("/fsspec-async/x.bin", "wb")
        await f.write(b"hello ")
        await f.write(b"async")
        await f.close()
        f = await fs.open_async("/fsspec-async/x.bin", "rb")
        data = await f.read()
        await f.close()
        assert (await fs._info("/fsspec-async/x.bin"))["size"] == 11
        await (await fs.client()).close()
        return data

    assert asyncio.run(main()) == b"hello async"


def test_text_mode_globs_and_a_directory_moved_whole(pfs, shared_cluster):
    url = f"pcache://{shared_cluster.master_address}/fsspec-text/run-1/notes.txt"
    with fsspec.open(url, "w") as f:
        f.write("héllo\n")
    with fsspec.open(url, "r") as f:
        assert f.read() == "héllo\n"
    pfs.pipe({"/fsspec-text/run-1/a.bin": b"a", "/fsspec-text/run-1/b.bin": b"bb"})
    assert pfs.glob("/fsspec-text/run-1/*.bin") == ["/fsspec-text/run-1/a.bin", "/fsspec-text/run-1/b.bin"]
    assert pfs.du("/fsspec-text") == len("héllo\n".encode()) + 3
    ino = pfs.info("/fsspec-text/run-1")["ino"]
    pfs.mv("/fsspec-text/run-1", "/fsspec-text/run-1-done", recursive=True)
    assert pfs.info("/fsspec-text/run-1-done")["ino"] == ino  # the directory itself, renamed
    assert pfs.cat_file("/fsspec-text/run-1-done/b.bin") == b"bb"


def test_a_looping_symlink_lists_as_itself_and_hides_nothing(pfs, client):
    """One looping symlink made ``ls`` of its directory raise, so ``find``, ``glob`` and ``du``
    of it answered ``[]`` and 0 while files were there."""
    pfs.pipe_file("/fsspec-loop/d/f.txt", b"data")
    client.symlink("/fsspec-loop/b", "/fsspec-loop/a")
    client.symlink("/fsspec-loop/a", "/fsspec-loop/b")
    assert {e["name"]: e["type"] for e in pfs.ls("/fsspec-loop")} == {
        "/fsspec-loop/a": "other", "/fsspec-loop/b": "other", "/fsspec-loop/d": "directory",
    }  # fmt: skip
    assert pfs.find("/fsspec-loop") == ["/fsspec-loop/a", "/fsspec-loop/b", "/fsspec-loop/d/f.txt"]
    assert pfs.du("/fsspec-loop/d") == 4
    assert pfs.du("/fsspec-loop") == 4  # its info is the link itself, as ls lists it (a drill: du raised)
    assert pfs.info("/fsspec-loop/a")["type"] == "other"
    with pytest.raises(E.SymlinkLoop):
        pfs.cat_file("/fsspec-loop/a")


def test_during_a_master_outage_listings_raise_instead_of_answering_empty(make_cluster):
    """fsspec omits every OSError in ``walk``: with the master stopped, ``find``, ``glob``,
    ``walk`` and ``du`` answered ``[]`` and 0, and ``isdir``/``isfile`` False (a trainer resuming
    from its newest ``step-*`` would find no checkpoint and start again from step 0)."""
    import os
    import signal

    cluster = make_cluster(workers=1)
    fs = PCacheFileSystem(master=cluster.master_address, rpc_timeout=1.0, metadata_ttl=0.0, skip_instance_cache=True)
    fs.pipe({"/ck/step-1/a": b"a", "/ck/step-2/a": b"bb"})
    assert fs.glob("/ck/step-*") == ["/ck/step-1", "/ck/step-2"] and fs.du("/ck") == 3
    assert fs.find("/ck/never") == [] and not fs.isdir("/ck/never")  # missing stays missing
    os.kill(cluster.master.pid, signal.SIGSTOP)
    try:
        calls = {
            "find": lambda: fs.find("/ck"),
            "glob": lambda: fs.glob("/ck/step-*"),
            "du": lambda: fs.du("/ck"),
            "walk": lambda: list(fs.walk("/ck")),
            "isdir": lambda: fs.isdir("/ck"),
            "isfile": lambda: fs.isfile("/ck/step-1/a"),
        }
        for name, call in calls.items():
            # PCache's own error with its message, not fsspec's empty FSTimeoutError (a drill)
            with pytest.raises((E.Timeout, E.Unavailable), match=cluster.master_address):
                print(name, call())
    finally:
        os.kill(cluster.master.pid, signal.SIGCONT)
    assert fs.glob("/ck/step-*") == ["/ck/step-1", "/ck/step-2"]


def test_a_program_that_leaves_files_open_exits_and_its_writes_are_committed(pfs, shared_cluster):
    """Files left open at exit were closed from ``__del__`` after fsspec's loop thread had
    stopped: the interpreter hung for ever, and a writer left an empty file."""
    import subprocess
    import sys

    pfs.pipe_file("/fsspec-exit/plain.txt", b"hello")
    script = f"""
import fsspec
M = {shared_cluster.master_address!r}
r = fsspec.open(f"pcache://{{M}}/fsspec-exit/plain.txt", "rb").open()
assert r.read() == b"hello"
w = fsspec.open(f"pcache://{{M}}/fsspec-exit/unclosed.txt", "wb").open()
w.write(b"written, never closed")
print("end of script", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "end of script" in done.stdout, done.stderr
    assert pfs.cat_file("/fsspec-exit/unclosed.txt") == b"written, never closed"


def test_a_write_that_fails_inside_with_raises_its_own_error(shared_cluster):
    """A quota refusal during ``with fs.open(p, "wb")`` surfaced as ``ValueError: I/O operation
    on closed file`` (the close retried the aborted file), which ``except OSError`` misses."""
    from pcache.client import Client
    from pcache.common.config import ClientConfig

    name = f"fsq{uuid.uuid4().hex[:6]}"
    with Client(ClientConfig(master=shared_cluster.master_address, token=shared_cluster.admin_token)) as admin:
        admin.create_tenant(name, quota_bytes=8 << 20)
        token = admin.issue_token(name)
    fs = fsspec.filesystem("pcache", master=shared_cluster.master_address, token=token, skip_instance_cache=True)
    with pytest.raises(E.QuotaExceeded), fs.open("/over.bin", "wb") as f:
        for _ in range(12):  # the refusal comes from a write: the file's first block is full
            f.write(bytes(4 << 20))


def test_a_with_block_that_raises_keeps_the_previous_file(pfs):
    """From a helper's drill: an exception inside ``with fs.open(p, "wb")`` committed the partial
    bytes over yesterday's good file (fsspec's ``__exit__`` closes), and left a partial new file;
    a ParquetWriter failing on its second batch halved a table silently. As the SDK's ``with``:
    nothing of a block that raised is published."""

    class Crash(Exception):
        pass

    good = b"id,value\n1,10\n2,20\n"
    pfs.pipe_file("/fsspec-with/good.csv", good)
    for path, mode in [
        ("/fsspec-with/good.csv", "wb"),
        ("/fsspec-with/new.csv", "wb"),
        ("/fsspec-with/good.csv", "ab"),
    ]:
        with pytest.raises(Crash), pfs.open(path, mode, block_size=4) as f:
            f.write(b"id,value\n1,1")  # past block_size: some of it was streamed to the workers already
            raise Crash
    assert pfs.cat_file("/fsspec-with/good.csv") == good
    assert not pfs.exists("/fsspec-with/new.csv")

    async def streamed() -> None:
        f = await pfs.open_async("/fsspec-with/good.csv", "wb")
        with pytest.raises(Crash):
            async with f:
                await f.write(b"partial")
                raise Crash

    asyncio.run_coroutine_threadsafe(streamed(), pfs.loop).result(30)
    assert pfs.cat_file("/fsspec-with/good.csv") == good
    with pfs.open("/fsspec-with/good.csv", "wb") as f:  # no exception: committed
        f.write(b"new")
    assert pfs.cat_file("/fsspec-with/good.csv") == b"new"


def test_fsspec_cache_layers_chain_over_pcache(pfs, tmp_path):
    """``blockcache::pcache://`` raised TypeError (fsspec passes ``size`` to ``_open``)."""
    m = pfs.master
    pfs.pipe_file("/fsspec-chain/x.bin", b"hello chain")
    for layer in ("simplecache", "filecache", "blockcache"):
        opts = {layer: {"cache_storage": str(tmp_path / layer)}}
        with fsspec.open(f"{layer}::pcache://{m}/fsspec-chain/x.bin", "rb", **opts) as f:
            assert f.read() == b"hello chain", layer
    with pfs.open("/fsspec-chain/x.bin", "rb", size=99) as f:  # a caller's size is not taken for the file's
        assert f.size == 11 and f.read() == b"hello chain"


def test_a_forked_child_is_told_to_use_spawn_at_once(shared_cluster):
    """From a helper's drill: a process forked after its parent used ``pcache://`` (PyTorch's
    DataLoader workers, by default) died of SIGSEGV, or got an empty FSTimeoutError after 10 s."""
    import subprocess
    import sys

    script = f"""
import multiprocessing as mp, time
import fsspec
from pcache.client import Client
URL = "pcache://{shared_cluster.master_address}/fsspec-fork/x"

def child(q):
    t = time.monotonic()
    out = []
    for use in (lambda: fsspec.open(URL).open().read(), lambda: Client(master="{shared_cluster.master_address}")):
        try:
            use()
            out.append("worked")
        except Exception as e:
            out.append(type(e).__name__ + ": " + str(e))
    q.put((out, time.monotonic() - t))

if __name__ == "__main__":
    with fsspec.open(URL, "wb") as f:
        f.write(b"x")
    parent = Client(master="{shared_cluster.master_address}")
    assert parent.read_file("/fsspec-fork/x") == b"x"
    ctx = mp.get_context("fork")
    for _ in range(4):
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(30)
        print(p.exitcode, q.get(timeout=5) if p.exitcode == 0 else None, flush=True)
    assert parent.read_file("/fsspec-fork/x") == b"x"  # the parent's client still works
    parent.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert line.startswith("0 ") and line.count("NotSupported: this process was forked") == 2, line
        assert "spawn" in line and float(line.rsplit(", ", 1)[1].rstrip(")")) < 5, line


def test_open_takes_the_replication_of_the_file_it_creates(pfs):
    """``fs.open(p, "wb", replication=1)`` was silently ignored (only the filesystem's option counted)."""
    with pfs.open("/fsspec-rep/one.bin", "wb", replication=1) as f:
        f.write(b"1")
    with pfs.open("/fsspec-rep/default.bin", "wb") as f:
        f.write(b"2")
    assert pfs.info("/fsspec-rep/one.bin")["replication"] == 1
    assert pfs.info("/fsspec-rep/default.bin")["replication"] > 1


def test_thousands_of_files_at_once_through_one_filesystem(pfs):
    """fsspec runs up to 2,500 calls at once (``cat`` of many paths, ``pipe`` of a dict): past
    about 1,000 concurrent master calls on one channel gRPC ended some with CANCELLED, and the
    workers' listen backlog (100) dropped connections (connects timed out)."""
    files = {f"/fsspec-many/{i // 100:03d}/f{i:05d}": i.to_bytes(4, "big") * 8 for i in range(3000)}
    pfs.pipe(files)
    assert pfs.cat(list(files)) == files
