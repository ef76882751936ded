"""pcache.common: path validation, configuration, the error tree."""

from __future__ import annotations

import asyncio
import builtins
import errno
import pickle
import time
from pathlib import Path

import pytest

from pcache.common import errors as E
from pcache.common.config import (
    ClientConfig,
    MasterConfig,
    PCacheConfig,
    WorkerConfig,
    describe,
    load_config,
    parse_size,
)
from pcache.common.paths import MAX_PATH, NAME_MAX, PATH_MAX, join, normalize, parent_and_name, split_path
from pcache.common.process import write_ready_file

# --------------------------------------------------------------------- paths --


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("/", []),
        ("//", []),
        ("/a", ["a"]),
        ("/a/", ["a"]),
        ("//a/b//", ["a", "b"]),
        ("/a/b/c", ["a", "b", "c"]),
        ("/.hidden/..dots/a.b", [".hidden", "..dots", "a.b"]),
        ("/ spaced /日本", [" spaced ", "日本"]),
        ("/a\\b", ["a\\b"]),
    ],
)
def test_split_path(path: str, parts: list[str]) -> None:
    assert split_path(path) == parts
    assert normalize(path) == "/" + "/".join(parts)


@pytest.mark.parametrize(
    "path",
    ["", "a", "a/b", "./a", "/a//b", "/a/./b", "/a/../b", "/..", "/.", "/a/.", "/a\x00", "\x00", None, b"/a", 5],
)
def test_split_path_rejects(path) -> None:
    with pytest.raises(E.InvalidPath) as info:
        split_path(path)
    assert info.value.errno == errno.EINVAL
    assert isinstance(info.value, ValueError)


def test_name_and_path_limits() -> None:
    assert split_path("/" + "x" * NAME_MAX) == ["x" * NAME_MAX]
    with pytest.raises(E.NameTooLong) as info:
        split_path("/" + "x" * (NAME_MAX + 1))
    assert info.value.errno == errno.ENAMETOOLONG
    # the limit is in UTF-8 bytes, not characters: 85 x 3 bytes fits, 86 x 3 does not
    assert split_path("/" + "日" * 85) == ["日" * 85]
    with pytest.raises(E.NameTooLong):
        split_path("/" + "日" * 86)
    deep = "/" + "/".join(["d" * 15] * 256)  # 4096 bytes exactly
    assert len(deep) == PATH_MAX and len(split_path(deep)) == 256
    # a whole path may pass Linux's PATH_MAX (a mount's cwd deep in the tree), up to MAX_PATH
    deeper = "/" + "/".join(["d" * 127] * 256)  # 32,768 bytes
    assert len(deeper) == MAX_PATH and len(split_path(deeper)) == 256
    with pytest.raises(E.NameTooLong):
        split_path(deeper + "x")
    assert issubclass(E.NameTooLong, E.InvalidPath)


def test_undecodable_names() -> None:
    # FUSE hands over names that are not UTF-8 as surrogate escapes: a clear EILSEQ, not an EIO
    for bad in ("/caf\udce9", "/a\ud800b"):
        with pytest.raises(E.InvalidEncoding) as info:
            split_path(bad)
        assert info.value.errno == errno.EILSEQ and isinstance(info.value, E.InvalidPath)
    assert split_path("/café/ü") == ["café", "ü"]


def test_parent_and_name() -> None:
    assert parent_and_name("/a") == ("/", "a")
    assert parent_and_name("/a/b/c/") == ("/a/b", "c")
    with pytest.raises(E.InvalidPath):
        parent_and_name("/")
    with pytest.raises(E.InvalidPath):
        parent_and_name("rel/x")


def test_join() -> None:
    assert join("/", "a") == "/a"
    assert join("/a", "b") == "/a/b"
    assert join("/a/", "b") == "/a/b"


# -------------------------------------------------------------------- config --


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        (4096, 4096),
        ("64MiB", 64 << 20),
        ("64mib", 64 << 20),
        ("64M", 64 << 20),
        ("64 MB", 64 << 20),
        ("1g", 1 << 30),
        ("1GiB", 1 << 30),
        ("2t", 2 << 40),
        ("1.5k", 1536),
        ("10b", 10),
        ("1_000", 1000),
        ("  7KiB ", 7 << 10),
        ("0", 0),
        ("-1", -1),
    ],
)
def test_parse_size(text, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MiB", "lots", "12 parsecs", "1x", "inf", "1.2.3k", "k5"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(E.InvalidArgument):
        parse_size(text)


def test_defaults() -> None:
    cfg = load_config()
    assert cfg == PCacheConfig()
    assert cfg.master.default_block_size == 32 << 20 and cfg.master.default_replication == 2
    assert cfg.worker.eviction == "lru" and cfg.worker.fsync is True
    assert cfg.client.rpc_timeout == 10.0
    assert cfg.cluster.workers == 3


def test_every_field_has_a_docstring_default_and_is_described() -> None:
    import dataclasses

    for section in (MasterConfig(), WorkerConfig(), ClientConfig()):
        line = describe(section)
        for f in dataclasses.fields(section):
            assert f"{f.name}=" in line


def test_toml_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "pcache.toml"
    path.write_text(
        """
[master]
port = 0
default_block_size = "8MiB"
dead_after = 2
sync_writes = true
metastore = "rocksdb:///var/pcache"

[worker]
capacity_bytes = "1G"
fsync = "off"
eviction = "lfu"

[client]
metadata_ttl = 0.25
"""
    )
    cfg = load_config(path, ["--master.port=19700", "worker.reserve_bytes=1k", "--client.short_circuit=no"])
    assert cfg.master.port == 19700  # overrides win over the file
    assert cfg.master.default_block_size == 8 << 20
    assert cfg.master.dead_after == 2.0 and isinstance(cfg.master.dead_after, float)
    assert cfg.master.sync_writes is True
    assert cfg.master.metastore == "rocksdb:///var/pcache"
    assert cfg.worker.capacity_bytes == 1 << 30 and cfg.worker.fsync is False
    assert cfg.worker.eviction == "lfu" and cfg.worker.reserve_bytes == 1024
    assert cfg.client.metadata_ttl == 0.25 and cfg.client.short_circuit is False
    # untouched fields keep their defaults
    assert cfg.master.host == "127.0.0.1" and cfg.cluster == PCacheConfig().cluster


def test_override_values_are_coerced() -> None:
    cfg = load_config(
        overrides=[
            "--master.heartbeat_interval=0.5",
            "--master.default_replication=3",
            "--worker.mem_tier_bytes=0",
            "--worker.bandwidth_limit=1.5G",
            "--worker.host=10.0.0.1",
            "--client.node_id=a=b",  # only the first '=' splits
            "--master.metrics_port=-1",
        ]
        + [f"--worker.fsync={v}" for v in ("1", "true", "YES", "on")]
    )
    assert cfg.master.heartbeat_interval == 0.5
    assert cfg.master.default_replication == 3
    assert cfg.worker.mem_tier_bytes == 0 and cfg.worker.bandwidth_limit == int(1.5 * (1 << 30))
    assert cfg.worker.host == "10.0.0.1" and cfg.worker.fsync is True
    assert cfg.client.node_id == "a=b"
    assert cfg.master.metrics_port == -1


@pytest.mark.parametrize(
    "override",
    [
        "--master.nope=1",  # unknown key
        "--nosuch.port=1",  # unknown section
        "--master.port",  # no value
        "--port=1",  # no section
        "master",
        "--master.port=abc",
        "--master.port=12 parsecs",
        "--master.dead_after=soon",
        "--worker.fsync=maybe",
        "--master.a.b=1",
    ],
)
def test_bad_overrides(override: str) -> None:
    with pytest.raises(E.InvalidArgument):
        load_config(overrides=[override])


def test_a_misspelt_section_is_named_with_the_sections_there_are() -> None:
    """`--mastr.x=1` was told "expected --section.key=value", the form it had."""
    with pytest.raises(E.InvalidArgument, match="unknown config section 'mastr' in --mastr.x .*master, worker"):
        load_config(overrides=["--mastr.x=1"])


@pytest.mark.parametrize(
    "toml",
    [
        "[nosuch]\nx = 1\n",  # unknown section
        "[master]\nnope = 1\n",  # unknown key
        "master = 5\n",  # a section that is not a table
        '[master]\nport = "x"\n',
        '[master]\ndead_after = "soon"\n',
        "[master]\nsync_writes = 3\n",
        "[master]\nport = [1, 2]\n",  # wrong type: an InvalidArgument, never a TypeError
        "[master]\nport = {a = 1}\n",
        "[master]\ndead_after = [1]\n",
        "[master]\nport = 1979-05-27\n",
        "[master]\nport = true\n",  # a bool is no port number
        '[worker]\nhost = ["a"]\n',  # a list is no host name
        "[master\nport = 1\n",  # not TOML
    ],
)
def test_bad_files(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(E.InvalidArgument):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(E.InvalidArgument):
        load_config(tmp_path / "absent.toml")


def test_describe_and_ready_file(tmp_path: Path) -> None:
    line = describe(MasterConfig(port=5))
    assert "port=5" in line and "host='127.0.0.1'" in line
    target = tmp_path / "ready"
    write_ready_file(str(target), "127.0.0.1:1234")
    assert target.read_text() == "127.0.0.1:1234\n"
    write_ready_file(str(target), "127.0.0.1:99")
    assert target.read_text() == "127.0.0.1:99\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready"]


# -------------------------------------------------------------------- errors --

EXPECTED = {
    "PCacheError": (errno.EIO, (OSError,), False),
    "NotFound": (errno.ENOENT, (FileNotFoundError,), False),
    "AlreadyExists": (errno.EEXIST, (FileExistsError,), False),
    "NotADirectory": (errno.ENOTDIR, (NotADirectoryError,), False),
    "IsADirectory": (errno.EISDIR, (IsADirectoryError,), False),
    "DirectoryNotEmpty": (errno.ENOTEMPTY, (OSError,), False),
    "InvalidArgument": (errno.EINVAL, (ValueError,), False),
    "InvalidPath": (errno.EINVAL, (ValueError,), False),
    "NameTooLong": (errno.ENAMETOOLONG, (ValueError,), False),
    "InvalidEncoding": (errno.EILSEQ, (ValueError,), False),
    "NoSpace": (errno.ENOSPC, (OSError,), False),
    "QuotaExceeded": (errno.EDQUOT, (OSError,), False),
    "CrossTenant": (errno.EXDEV, (OSError,), False),
    "PermissionDenied": (errno.EACCES, (PermissionError,), False),
    "NotPermitted": (errno.EPERM, (PermissionError,), False),
    "NotSupported": (errno.EOPNOTSUPP, (OSError,), False),
    "FileTooLarge": (errno.EFBIG, (OSError,), False),
    "TooLarge": (errno.E2BIG, (ValueError,), False),
    "SymlinkLoop": (errno.ELOOP, (OSError, ValueError), False),
    "Conflict": (errno.ESTALE, (OSError,), False),
    "StaleHandle": (errno.ESTALE, (OSError,), False),
    "ReadOnly": (errno.EROFS, (OSError,), False),
    "Busy": (errno.EBUSY, (OSError,), False),
    "Unavailable": (errno.EIO, (ConnectionError,), True),
    "NotLeader": (errno.EIO, (ConnectionError,), True),
    "Timeout": (errno.ETIMEDOUT, (TimeoutError,), True),
    "StoreUnavailable": (errno.EIO, (ConnectionError,), True),
    "StoreTimeout": (errno.ETIMEDOUT, (TimeoutError,), True),
    "CorruptBlock": (errno.EIO, (OSError,), True),
    "StaleEpoch": (errno.ESTALE, (OSError,), True),
    "ProtocolError": (errno.EPROTO, (OSError,), False),
}


def test_every_error_is_listed() -> None:
    assert set(E.ERRORS_BY_NAME) == set(EXPECTED)
    defined = {name for name, obj in vars(E).items() if isinstance(obj, type) and issubclass(obj, E.PCacheError)}
    assert defined == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_error_class(name: str) -> None:
    code, builtin_bases, retryable = EXPECTED[name]
    cls = E.ERRORS_BY_NAME[name]
    err = cls("went wrong", path="/a/b")
    assert isinstance(err, E.PCacheError) and isinstance(err, OSError)
    for base in builtin_bases:
        assert isinstance(err, base) and getattr(builtins, base.__name__) is base
    assert err.errno == code and err.strerror == "went wrong"
    assert err.filename == "/a/b" and err.message == "went wrong"
    assert str(err) == "went wrong: /a/b"
    assert err.retryable is retryable
    plain = cls("no path")
    assert plain.filename is None and str(plain) == "no path"
    assert cls().errno == code
    # caught by code that knows only the built-in
    with pytest.raises(builtin_bases[0]):
        raise cls("x")


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("path", ["/p/q", None])
def test_error_pickle_round_trip(name: str, path: str | None) -> None:
    err = E.ERRORS_BY_NAME[name]("boom", path=path)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert (back.errno, back.message, back.filename, str(back)) == (err.errno, "boom", path, str(err))


def test_from_name() -> None:
    err = E.from_name("NotFound", "gone", path="/x")
    assert type(err) is E.NotFound and err.filename == "/x" and str(err) == "gone: /x"
    unknown = E.from_name("SomethingNew", "??")
    assert type(unknown) is E.PCacheError and unknown.errno == errno.EIO


def test_specific_relations() -> None:
    assert issubclass(E.InvalidPath, E.InvalidArgument)
    assert issubclass(E.NameTooLong, E.InvalidPath)
    assert not issubclass(E.DirectoryNotEmpty, FileExistsError)
    assert not issubclass(E.Unavailable, TimeoutError)
    assert not issubclass(E.Timeout, ConnectionError)


def test_worker_health_suspects_and_the_masters_verdicts() -> None:
    from pcache.client.data import WorkerHealth

    calls: list[int] = []
    health = WorkerHealth(suspect_seconds=0.2)
    health.on_suspect = lambda: calls.append(1)
    health.suspect("w1")
    assert health.is_suspect("w1") and health.suspects() == ["w1"] and calls == [1]
    health.answered("w1", 0.01)  # it answered: no suspect
    assert not health.is_suspect("w1")
    sent = time.monotonic()  # a request to w1 goes out; a later one finds w1 failing (killed)
    health.suspect("w1")
    health.answered("w1", 0.01, started=sent)  # the first one's answer, read after that failure
    assert health.is_suspect("w1")  # is older news: w1 stays a suspect
    health.answered("w1", 0.01, started=time.monotonic())  # a request sent after the failure
    assert not health.is_suspect("w1")
    health.suspect("w2")
    time.sleep(0.25)  # suspicion expires
    assert not health.is_suspect("w2") and not health.watching()
    health.verdicts({"w3": False, "w4": True})  # the master declared w3 dead
    assert health.is_suspect("w3") and health.watching()
    time.sleep(0.25)
    assert health.is_suspect("w3")  # dead stays suspect past suspect_seconds
    health.verdicts({"w3": True})  # it rejoined
    assert not health.is_suspect("w3") and not health.watching()
    assert health.hedge_delay(2.0) == 1.0  # too few samples: half the ceiling
    for _ in range(20):
        health.answered("w4", 0.1)
    assert abs(health.hedge_delay(2.0) - 0.2) < 1e-9  # twice the p95


@pytest.mark.parametrize("override", ["--client.token=s3cr3t-value", "client.token=s3cr3t-value"])
def test_a_token_is_never_taken_from_the_command_line(override: str) -> None:
    with pytest.raises(E.InvalidArgument, match="not taken on a command line") as err:
        load_config(overrides=[override])
    assert "s3cr3t" not in str(err.value)  # the error names the setting, never the value


def test_the_mount_refuses_a_token_on_its_command_line(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "fuse_client", str(tmp_path), "--client.token=s3cr3t-value"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3 and "not taken on a command line" in proc.stderr
    assert "s3cr3t" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    ("uri", "root", "prefix"),
    [
        ("s3://bkt/ds/web/?endpoint_url=http://h:9000", "s3://bkt/?endpoint_url=http://h:9000", "ds/web/"),
        ("s3://bkt/ds/web?endpoint_url=http://h:9000", "s3://bkt/?endpoint_url=http://h:9000", "ds/web/"),
        ("s3://bkt", "s3://bkt/", ""),
        ("oss://b/x/?region=oss-cn-hangzhou", "oss://b/?region=oss-cn-hangzhou", "x/"),
        ("file:///data/store", "file:///data/store", ""),
    ],
)
def test_binds_of_one_bucket_share_a_store_root(uri: str, root: str, prefix: str) -> None:
    """A worker keeps one store per bucket and options; the prefix + a file's key is the same
    object key the bind's own store would use."""
    from objstore import open_store
    from pcache.common.ufs import bucket_root

    assert bucket_root(uri) == (root, prefix)
    if not uri.startswith("file"):
        assert open_store(uri).base == open_store(root).base + prefix


# ------------------------------------------------------------ coalescer --


def test_a_coalescer_sends_the_calls_made_meanwhile_together_and_fails_each_alone() -> None:
    from pcache.common.coalesce import Coalescer

    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int | BaseException]:
        sent.append(items)
        await asyncio.sleep(0.01)
        return [E.NotFound(f"no {i}") if i % 10 == 7 else i * 2 for i in items]

    async def run() -> list[object]:
        c: Coalescer[int, int] = Coalescer(send, max_batch=16)
        first = asyncio.ensure_future(c.call(0))  # alone: nothing in flight
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(c.call(i)) for i in range(1, 40)]  # while it flies
        return await asyncio.gather(first, *rest, return_exceptions=True)

    results = asyncio.run(run())
    assert [r if isinstance(r, int) else type(r).__name__ for r in results] == [
        "NotFound" if i % 10 == 7 else i * 2 for i in range(40)
    ]
    assert sent[0] == [0] and [len(b) for b in sent[1:]] == [16, 16, 7]  # in order, max_batch each
    assert [i for b in sent for i in b] == list(range(40))


def test_a_coalescer_whose_send_fails_fails_that_batch_only_and_goes_on() -> None:
    from pcache.common.coalesce import Coalescer

    async def send(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        if 3 in items:
            raise E.Unavailable("master gone")
        if 5 in items:
            return [1]  # a wrong answer: one result for several items
        return items

    async def run() -> list[object]:
        c: Coalescer[int, int] = Coalescer(send, max_batch=2, max_in_flight=2)
        calls = [asyncio.ensure_future(c.call(i)) for i in range(8)]
        waiter = asyncio.ensure_future(c.call(100))
        await asyncio.sleep(0)
        waiter.cancel()  # a caller giving up does not disturb the others
        out = await asyncio.gather(*calls, return_exceptions=True)
        assert c.batches == 4  # the cancelled caller's item was dropped before sending
        return out

    results = asyncio.run(run())
    names = [r if isinstance(r, int) else type(r).__name__ for r in results]
    assert names == [0, 1, "Unavailable", "Unavailable", "RuntimeError", "RuntimeError", 6, 7]
    with pytest.raises(ValueError):
        Coalescer(lambda items: None, max_batch=0)  # type: ignore[arg-type, return-value]


def test_an_outage_gate_has_calls_of_a_store_that_failed_wait_briefly_for_one_probe() -> None:
    """The worker's fetches through an under-store outage (:class:`~pcache.common.ufs.OutageGate`)."""
    from pcache.common.ufs import OutageGate

    calls: list[str] = []
    state = {"up": False, "delay": 0.0, "get_delay": 0.0, "probe_timeout": 10.0}

    async def request(name: str) -> str:
        calls.append(name)
        delay = state["delay"] + (state["get_delay"] if name != "head" else 0.0)
        if name == "head" and delay > state["probe_timeout"]:  # the probe's own bound
            await asyncio.sleep(state["probe_timeout"])
            raise E.StoreTimeout("the probe timed out")
        await asyncio.sleep(delay)
        if not state["up"]:
            raise E.StoreUnavailable("refused")
        return name

    def get(name: str):
        return lambda: request(name)

    probe = get("head")

    async def run() -> None:
        gate = OutageGate(wait=0.2)
        with pytest.raises(E.StoreUnavailable):
            await gate.call("s3://b/", get("first"), probe)  # its whole budget: not known down yet
        assert gate.down("s3://b/") and not gate.down("s3://other/") and calls == ["first"]
        state["delay"] = 1.0  # the store hangs now: one probe tries it, every caller waits 0.2 s
        t0 = time.monotonic()
        outcomes = await asyncio.gather(*(gate.call("s3://b/", get(n), probe) for n in "abc"), return_exceptions=True)
        assert time.monotonic() - t0 < 0.6 and calls == ["first", "head"]
        assert all(isinstance(o, E.StoreTimeout) and "being probed" in str(o) for o in outcomes), outcomes
        assert await gate.call("s3://other/", lambda: asyncio.sleep(0, "other"), probe) == "other"  # another store
        await asyncio.sleep(1.0)  # the probe failed, after its own budget
        assert gate.down("s3://b/")  # down until a probe gets an answer, however long that takes
        state["delay"] = 0.0
        with pytest.raises(E.StoreUnavailable, match="refused"):  # the probe's own error, within the wait
            await gate.call("s3://b/", get("d"), probe)
        assert calls[-1] == "head"
        state["delay"], state["probe_timeout"] = 100.0, 0.3  # hung: a probe ends at its own timeout
        with pytest.raises(E.StoreTimeout):
            await gate.call("s3://b/", get("e"), probe)
        await asyncio.sleep(0.2)
        state["up"], state["delay"], state["get_delay"] = True, 0.0, 0.5  # back, slow to send: own budgets
        assert await asyncio.gather(gate.call("s3://b/", get("f"), probe), gate.call("s3://b/", get("g"), probe)) == [
            "f",
            "g",
        ]
        assert not gate.down("s3://b/") and calls[-3:] == ["head", "f", "g"]  # one probe for both
        state["up"], state["get_delay"] = False, 0.0
        with pytest.raises(E.StoreUnavailable):
            await gate.call("s3://b/", get("h"), probe)

        async def missing() -> str:
            raise E.NotFound("no such key")

        with pytest.raises(E.NotFound):
            await gate.call("s3://b/", missing, missing)  # the probe got an answer of the store
        assert not gate.down("s3://b/")

    asyncio.run(run())
