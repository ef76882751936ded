"""Tenants from an attacker's side and at their quotas (real master and worker processes).

Tenant A's token never reaches tenant B's tree: not by path (each sees its root as /, and ``..``
is refused), not by inode number, not by a rename, not by a symlink; a deleted tenant's token is
refused. Quotas: 16 writers racing past a byte quota never pass it, the one that crosses gets
EDQUOT, and every file acknowledged before is intact.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path

import grpc
import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.auth import bearer
from pcache.common.config import ClientConfig
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc
from pcache.testing.faults import raw_read_refusal, wait_for

BLOCK = 64 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(str(tmp_path_factory.mktemp("tenants")), workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster):
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as pc:
        yield pc


def _client(cluster: LocalCluster, token: str) -> Client:
    return Client(ClientConfig(master=cluster.master_address, token=token))


@pytest.fixture(scope="module")
def two(cluster: LocalCluster, admin: Client):
    """Tenants a and b, each with a secret file, and their tokens."""
    tokens = {}
    for name in ("ta", "tb"):
        admin.create_tenant(name)
        tokens[name] = admin.issue_token(name)
        with _client(cluster, tokens[name]) as pc:
            pc.mkdir("/private")
            pc.write_file("/private/secret", name.encode() * 1000)
            pc.setattr("/private/secret", mode=0o600)
    return tokens


def test_each_tenant_sees_its_root_as_slash(cluster: LocalCluster, admin: Client, two: dict[str, str]) -> None:
    with _client(cluster, two["ta"]) as a:
        assert [e.name for e in a.listdir("/")] == ["private"]
        assert a.read_file("/private/secret") == b"ta" * 1000
        assert a.stat("/").kind == "dir"
    # the admin sees every tenant's tree at its root; the default tenant's too
    names = {e.name for e in admin.listdir("/")}
    assert {"ta", "tb", "default"} <= names
    assert admin.read_file("/tb/private/secret") == b"tb" * 1000
    # the default tenant (the embedded default's token) sees neither
    with _client(cluster, cluster.token) as d:
        assert "ta" not in {e.name for e in d.listdir("/")}
        with pytest.raises(E.NotFound):
            d.stat("/ta/private/secret")


def test_paths_never_leave_the_root(cluster: LocalCluster, two: dict[str, str]) -> None:
    with _client(cluster, two["ta"]) as a:
        for path in ("/../tb/private/secret", "/private/../../tb/private/secret", "tb/private/secret"):
            with pytest.raises(E.InvalidPath):
                a.read_file(path)
        with pytest.raises(E.NotFound):
            a.read_file("/tb/private/secret")  # B's admin path means A's own /tb
        with pytest.raises(E.InvalidPath):
            a.rename("/private/secret", "/../tb/stolen")
        with pytest.raises(E.InvalidArgument):
            a.rename("/", "/elsewhere")  # its root cannot move
        with pytest.raises(E.InvalidArgument):
            a.remove("/", recursive=True)
        # a symlink may name anything; the master never follows it and the client resolves it in A's tree
        a.symlink("/tb/private/secret", "/abs-link")
        a.symlink("../../tb/private/secret", "/rel-link")
        for link in ("/abs-link", "/rel-link"):
            with pytest.raises((E.NotFound, E.InvalidPath)):
                a.read_file(link)
        assert a.read_file("/private/secret") == b"ta" * 1000


def test_inode_numbers_of_another_tenant_are_refused(cluster: LocalCluster, admin: Client, two: dict[str, str]) -> None:
    """GetLayout, AllocateBlock, CommitFile and ReportBadBlock name inodes or blocks by number:
    tenant A's token on B's gets the very answer of a number that names nothing (NotFound, the
    same message: A cannot tell B's numbers from unused ones), and nothing changes."""
    victim = admin.layout("/tb/private/secret")
    ino, block = victim.inode.id, victim.blocks[0].block_id
    directory = admin.stat("/tb/private").inode  # not told "is a directory" either

    async def probe(ino: int, block: int, directory: int) -> dict[str, tuple[grpc.StatusCode, str]]:
        out = {}
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stub = pb_grpc.MasterStub(channel)
            meta = bearer(two["ta"])
            calls = {
                "GetLayout": stub.GetLayout(pb.LayoutRequest(inode=ino), metadata=meta, timeout=5),
                "GetLayout of a directory": stub.GetLayout(pb.LayoutRequest(inode=directory), metadata=meta, timeout=5),
                "AllocateBlock": stub.AllocateBlock(pb.AllocateBlockRequest(inode=ino), metadata=meta, timeout=5),
                "CommitFile": stub.CommitFile(
                    pb.CommitFileRequest(inode=ino, size=0, replace=True), metadata=meta, timeout=5
                ),
                "ReportBadBlock": stub.ReportBadBlock(
                    pb.BlockReport(worker_id=victim.blocks[0].replicas[0].worker_id, block_id=block),
                    metadata=meta,
                    timeout=5,
                ),
            }
            for name, call in calls.items():
                try:
                    await call
                    out[name] = (grpc.StatusCode.OK, "")
                except grpc.aio.AioRpcError as exc:
                    out[name] = (exc.code(), exc.details() or "")
        return out

    theirs = asyncio.run(probe(ino, block, directory))
    unused = 10**12
    nothing = asyncio.run(probe(unused, unused, unused + 1))
    assert {code for code, _ in theirs.values()} == {grpc.StatusCode.NOT_FOUND}, theirs
    for name, (code, message) in theirs.items():  # word for word, the numbers aside
        numbers = {str(ino): str(unused), str(block): str(unused), str(directory): str(unused + 1)}
        assert nothing[name] == (code, " ".join(numbers.get(w, w) for w in message.split(" "))), (name, theirs)

    async def batch() -> list[pb.BatchResult]:  # ops in a Batch are checked one by one, as their calls'
        ops = [pb.BatchOp(layout=pb.LayoutRequest(inode=n)) for n in (ino, directory)]
        ops.append(pb.BatchOp(layout=pb.LayoutRequest(path="/private/secret")))  # its own file
        ops.append(pb.BatchOp(allocate=pb.AllocateBlockRequest(inode=ino, size_hint=1)))
        ops.append(pb.BatchOp(commit=pb.CommitFileRequest(inode=ino, size=0, replace=True)))
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            reply = await pb_grpc.MasterStub(channel).Batch(
                pb.BatchRequest(header=pb.RequestHeader(), ops=ops), metadata=bearer(two["ta"]), timeout=5
            )
        return list(reply.results)

    results = asyncio.run(batch())
    assert [r.error for r in results] == ["NotFound", "NotFound", "", "NotFound", "NotFound"]
    assert not results[0].HasField("layout") and not results[1].HasField("layout")  # nothing of B's shows
    assert not results[3].HasField("location") and not results[4].HasField("inode")
    assert [r.message for r in results[3:]] == [theirs["AllocateBlock"][1], theirs["CommitFile"][1]]
    assert results[2].layout.inode.size == 2000 and results[2].layout.blocks[0].token
    after = admin.layout("/tb/private/secret")
    assert after.inode.size == 2000 and after.inode.version == victim.inode.version
    assert len(after.blocks[0].replicas) == len(victim.blocks[0].replicas)  # not quarantined
    assert admin.read_file("/tb/private/secret") == b"tb" * 1000


def test_a_batch_stream_checks_the_token_of_every_message(
    cluster: LocalCluster, admin: Client, two: dict[str, str]
) -> None:
    """Clients send their batches on one long-lived ``BatchStream``: no token, a forged one or
    a worker's opens nothing; a tenant's stream reaches its own tree only (paths and inode
    numbers); a tenant deleted while its stream is open is refused at the stream's next
    message, not at the next connection."""
    admin.create_tenant("ts")
    token = admin.issue_token("ts")
    with _client(cluster, token) as c:
        c.write_file("/mine", b"m" * 10)
    theirs = admin.stat("/tb/private/secret").inode

    def stat(path: str) -> pb.BatchRequest:
        return pb.BatchRequest(header=pb.RequestHeader(), ops=[pb.BatchOp(stat=pb.PathRequest(path=path))])

    async def refused(metadata) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stream = pb_grpc.MasterStub(channel).BatchStream(metadata=metadata, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as caught:  # refused before any message
                await stream.read()
            return caught.value.code()

    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert asyncio.run(refused(None)) == grpc.StatusCode.PERMISSION_DENIED
    assert asyncio.run(refused(bearer(forged))) == grpc.StatusCode.PERMISSION_DENIED
    assert asyncio.run(refused(bearer(cluster.worker_token))) == grpc.StatusCode.PERMISSION_DENIED

    async def tenant_stream() -> tuple[list[pb.BatchResult], grpc.StatusCode]:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stream = pb_grpc.MasterStub(channel).BatchStream(metadata=bearer(token), timeout=20)
            request = stat("/mine")
            request.ops.append(pb.BatchOp(stat=pb.PathRequest(path="/../tb/private/secret")))
            request.ops.append(pb.BatchOp(layout=pb.LayoutRequest(inode=theirs)))
            await stream.write(request)
            first = await stream.read()
            assert first.epoch > 0  # stamped, as a unary answer's trailing metadata is
            await asyncio.to_thread(admin.delete_tenant, "ts", purge=True)
            await stream.write(stat("/mine"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
            return list(first.results), caught.value.code()

    results, after = asyncio.run(tenant_stream())
    assert results[0].inode.size == 10 and results[0].inode.tenant == "ts"
    assert results[1].error == "InvalidPath" and not results[1].HasField("inode")
    assert results[2].error == "NotFound" and not results[2].HasField("layout")  # as an unused number
    assert after == grpc.StatusCode.PERMISSION_DENIED

    async def expiring() -> tuple[int, grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stream = pb_grpc.MasterStub(channel).BatchStream(metadata=bearer(short), timeout=20)
            await stream.write(stat("/private/secret"))
            size = (await stream.read()).results[0].inode.size
            await asyncio.sleep(4.2)  # past the token's expiry (whole seconds)
            await stream.write(stat("/private/secret"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
            return size, caught.value

    async def garbage() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            raw = channel.stream_stream("/pcache.Master/BatchStream")  # bytes in, bytes out
            stream = raw(metadata=bearer(two["ta"]), timeout=10)
            await stream.write(b"\xff\xff\xff\xff not a BatchRequest")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
            return caught.value

    bad = asyncio.run(garbage())  # refused in one log line, not a traceback per message
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "unparsable batch message" in str(bad.details())
    assert "Traceback" not in (cluster.root / "logs" / "master.log").read_text(errors="replace")

    # issued just before its stream: under load the garbage check took longer than a 1 s token (CI)
    short = admin.issue_token("tb", ttl=3.0)
    size, expired = asyncio.run(expiring())
    assert size == 2000  # tb's secret, while the token held
    assert expired.code() == grpc.StatusCode.PERMISSION_DENIED and "expired" in str(expired.details())


def test_admin_cannot_mix_tenants_by_mistake(admin: Client, two: dict[str, str]) -> None:
    with pytest.raises(E.CrossTenant) as caught:
        admin.rename("/ta/private/secret", "/tb/private/moved")
    assert caught.value.errno == errno.EXDEV
    with pytest.raises(E.InvalidArgument):
        admin.create_tenant("nested", "/ta/private/inner")  # inside another tenant's tree
    with pytest.raises(E.InvalidArgument):
        admin.remove("/ta", recursive=True)  # a root goes only with its tenant
    with pytest.raises(E.AlreadyExists):
        admin.create_tenant("ta")
    with pytest.raises(E.InvalidArgument):
        admin.create_tenant("bad.name")
    assert admin.read_file("/ta/private/secret") == b"ta" * 1000


def test_a_tenant_token_cannot_manage_tenants(cluster: LocalCluster, two: dict[str, str]) -> None:
    with _client(cluster, two["ta"]) as a:
        for call in (
            lambda: a.create_tenant("evil"),
            lambda: a.tenants(),
            lambda: a.issue_token("tb"),
            lambda: a.set_quota("ta", quota_bytes=0, quota_inodes=0),
            lambda: a.delete_tenant("tb", purge=True),
        ):
            with pytest.raises(E.PermissionDenied):
                call()
        own = a.status().tenants
        assert [t.name for t in own] == ["ta"]  # its own usage only


def test_usage_is_counted_and_a_deleted_tenant_is_locked_out(cluster: LocalCluster, admin: Client) -> None:
    admin.create_tenant("tc", quota_inodes=3)
    token = admin.issue_token("tc")
    with _client(cluster, token) as c:
        c.mkdir("/d")
        c.write_file("/d/f", b"x" * 100_000)
        usage = {t.name: t for t in admin.tenants()}["tc"]
        assert (usage.used_inodes, usage.used_bytes, usage.reserved_bytes) == (2, 100_000, 0)
        c.write_file("/g", b"y")
        with pytest.raises(E.QuotaExceeded) as caught:
            c.write_file("/h", b"z")  # a fourth inode
        assert caught.value.errno == errno.EDQUOT
        c.remove("/d", recursive=True)
        usage = {t.name: t for t in admin.tenants()}["tc"]
        assert (usage.used_inodes, usage.used_bytes) == (1, 1)
        c.write_file("/h", b"z")  # room again
        with pytest.raises(E.DirectoryNotEmpty):
            admin.delete_tenant("tc")
        admin.delete_tenant("tc", purge=True)
        with pytest.raises(E.PermissionDenied):
            c.listdir("/")
    assert "tc" not in {e.name for e in admin.listdir("/")}


def test_writers_racing_past_the_byte_quota_never_pass_it(cluster: LocalCluster, admin: Client) -> None:
    """16 writers of 3-block files against a 40-block quota: the quota is never passed (a whole
    block is reserved per allocation), the writers that cross get EDQUOT, every file whose close
    returned reads back intact, and after the deletes the quota is whole again."""
    quota = 40 * BLOCK
    admin.create_tenant("tq", quota_bytes=quota)
    token = admin.issue_token("tq")
    done: dict[str, bytes] = {}
    refused: list[int] = []
    lock = threading.Lock()

    def writer(index: int) -> None:
        with _client(cluster, token) as pc:
            for n in range(10):
                path = f"/w{index}-{n}"
                data = bytes([index, n]) * (3 * BLOCK // 2)
                try:
                    with pc.open(path, "wb", block_size=BLOCK) as f:
                        f.write(data)
                except OSError as exc:
                    with lock:
                        refused.append(exc.errno)
                    return
                with lock:
                    done[path] = data

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    usage = {t.name: t for t in admin.tenants()}["tq"]
    assert usage.used_bytes <= quota
    assert usage.used_bytes == sum(len(d) for d in done.values())
    assert refused and set(refused) == {errno.EDQUOT}
    assert len(done) >= 10  # most of the quota was used: 13 whole files fit
    with _client(cluster, token) as pc:
        for path, data in done.items():
            assert pc.read_file(path) == data
        for entry in pc.listdir("/"):
            pc.remove("/" + entry.name)
        usage = pc.status().tenants[0]
        assert (usage.used_bytes, usage.used_inodes) == (0, 0)
        pc.write_file("/again", b"a" * BLOCK, block_size=BLOCK)  # the quota is free again


def test_a_write_past_the_byte_quota_gives_every_allocation_back(
    cluster: LocalCluster, admin: Client, tmp_path
) -> None:
    """Replayed from an operator: `pcache put` of 70 MiB into a 64 MiB quota failed as it
    should, but left a block's reservation behind for 10 minutes (the first block, still on its
    way to its workers when the next one was refused, was cancelled and never given back), and
    a write that fit the quota was refused meanwhile. Every allocation is given back."""
    block = 32 << 20
    admin.create_tenant("tr", quota_bytes=2 * block)
    token = admin.issue_token("tr")
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(2 * block + (6 << 20)))
    with _client(cluster, token) as pc:
        with pytest.raises(E.QuotaExceeded):
            pc.put(str(local), "/big.bin")
        usage = {t.name: t for t in admin.tenants()}["tr"]
        assert (usage.used_bytes, usage.reserved_bytes) == (0, 0)
        assert not pc.exists("/big.bin")
        data = os.urandom(block + (1 << 20))
        pc.write_file("/fits", data, block_size=block)  # the whole quota is there for it
        assert pc.read_file("/fits") == data


def test_a_file_that_fits_the_quota_is_not_refused_for_the_block_it_ends_in(
    cluster: LocalCluster, admin: Client
) -> None:
    """Replayed from an operator: a 40 MiB file (32 MiB blocks) in a 48 MiB quota failed with
    EDQUOT: its second block, streamed to the local worker, was reserved whole (64 MiB). A
    block the quota cannot take whole is buffered, and reserved at its own length."""
    block = 32 << 20
    admin.create_tenant("tfit", quota_bytes=48 << 20)
    token = admin.issue_token("tfit")
    data = os.urandom(40 << 20)
    with _client(cluster, token) as pc:
        with pc.open("/forty", "wb", block_size=block) as f:
            for off in range(0, len(data), 1 << 20):  # as a writer streams it
                f.write(data[off : off + (1 << 20)])
        assert pc.read_file("/forty") == data
    usage = {t.name: t for t in admin.tenants()}["tfit"]
    assert (usage.used_bytes, usage.reserved_bytes) == (len(data), 0)


def test_tenant_cli(cluster: LocalCluster, tmp_path) -> None:
    """`pcache tenant` as an operator uses it: the admin token from a file, the tenant's token
    written 0600, quotas in units, usage in the listing, and a refused caller exits non-zero."""
    import os
    import stat
    import subprocess
    import sys

    env = {**os.environ, "PCACHE_ADMIN_TOKEN_FILE": str(cluster.secrets / "admin.token")}
    env.pop("PCACHE_TOKEN", None)

    def pcache(*args: str, token_file: str = "") -> subprocess.CompletedProcess:
        run_env = {**env, "PCACHE_TOKEN_FILE": token_file} if token_file else env
        return subprocess.run([sys.executable, "-m", "pcache", "--master", cluster.master_address, *args],
                              env=run_env, capture_output=True, text=True, timeout=60)  # fmt: skip

    token_file = tmp_path / "cli.token"
    made = pcache("tenant", "create", "cli-t", "--bytes", "1G", "--inodes", "2k", "--token-file", str(token_file))
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert pcache("mkdir", "/inside", token_file=str(token_file)).returncode == 0
    # another token into a file, 0600 (`pcache tenant token NAME > file` leaves it 0644)
    second = tmp_path / "second.token"
    minted = pcache("tenant", "token", "cli-t", "--token-file", str(second))
    assert minted.returncode == 0 and minted.stdout == "" and stat.S_IMODE(second.stat().st_mode) == 0o600
    assert pcache("stat", "/inside", token_file=str(second)).returncode == 0
    listed = pcache("tenant", "list", "--json")
    entry = next(t for t in __import__("json").loads(listed.stdout) if t["name"] == "cli-t")
    assert (entry["quota_bytes"], entry["quota_inodes"], entry["used_inodes"]) == (str(1 << 30), "2000", "1")
    # a negative quota: one line, exit 3 (a traceback, "ValueError: Value out of range", before)
    for bad, said in ((["--bytes", "-5"], "cannot be negative"), (["--inodes", "-5"], "not an inode count")):
        negative = pcache("tenant", "quota", "cli-t", *bad)
        assert negative.returncode == 3 and said in negative.stderr and "Traceback" not in negative.stderr
    assert pcache("tenant", "quota", "cli-t", "--inodes", "1").returncode == 0
    refused = pcache("mkdir", "/second", token_file=str(token_file))
    assert refused.returncode != 0 and "inodes" in refused.stderr
    # a tenant's token is not an admin's
    as_tenant = subprocess.run([sys.executable, "-m", "pcache", "--master", cluster.master_address, "tenant", "list"],
                               env={**env, "PCACHE_ADMIN_TOKEN_FILE": str(token_file)}, capture_output=True, text=True,
                               timeout=60)  # fmt: skip
    assert as_tenant.returncode != 0 and "admin" in as_tenant.stderr
    assert pcache("tenant", "delete", "cli-t", "--purge").returncode == 0
    gone = pcache("ls", "/", token_file=str(token_file))
    assert gone.returncode != 0 and "does not exist" in gone.stderr


def test_a_deleted_tenants_name_is_not_reused_while_its_tokens_would_verify(
    cluster: LocalCluster, admin: Client
) -> None:
    """A token names its tenant and nothing more: a new tenant of a deleted one's name would let
    the old tokens into the new team's files. The name is refused while a key of that time
    verifies (after two rotations none does: see the unit test of the namespace)."""
    admin.create_tenant("reborn")
    old = admin.issue_token("reborn")
    with _client(cluster, old) as pc:
        pc.mkdir("/old-team-dir")
    admin.delete_tenant("reborn", purge=True)
    with pytest.raises(E.AlreadyExists, match="rotate the keys twice"):
        admin.create_tenant("reborn")
    assert "reborn" not in {t.name for t in admin.tenants()}
    with _client(cluster, old) as pc, pytest.raises(E.PermissionDenied):
        pc.listdir("/")


def test_a_deleted_tenants_block_tokens_are_refused_by_the_workers(cluster: LocalCluster, admin: Client) -> None:
    """A block token names its tenant and lives ``block_token_ttl`` (an hour): the workers took a
    deleted tenant's tokens until they expired, and a revocation made before the deletion was
    dropped with the tenant. Once the masters' next heartbeat answer reaches them, the workers
    refuse every block token the deleted tenant was handed."""
    admin.create_tenant("leaver")
    token = admin.issue_token("leaver")
    with _client(cluster, token) as pc:
        pc.write_file("/f", b"L" * 100_000)
        held = pc.layout("/f").blocks[0]  # what a member of the team kept
        assert held.token.startswith("b2.") and raw_read_refusal(held.replicas[0], held) == ""
    admin.delete_tenant("leaver", purge=True)
    for replica in held.replicas:
        why = wait_for(lambda: raw_read_refusal(replica, held), 10, "a refusal")  # noqa: B023
        assert "revoked" in why, why
    with _client(cluster, token) as pc, pytest.raises(E.PermissionDenied, match="does not exist"):
        pc.stat("/")


def test_a_directory_above_a_tenant_root_does_not_move(cluster: LocalCluster, admin: Client) -> None:
    """Tenant roots are found by path: an admin's rename of a directory above one would leave the
    tenant's token pointing at nothing, and a later tenant there sharing it."""
    admin.create_tenant("tx", "/teams/x")
    with pytest.raises(E.InvalidArgument, match="holds the root of tenant 'tx'"):
        admin.rename("/teams", "/teams-2025")
    with pytest.raises(E.InvalidArgument, match="holds the root of tenant 'tx'"):
        admin.rename("/teams/x", "/teams/y")
    with _client(cluster, admin.issue_token("tx")) as pc:
        pc.write_file("/f", b"tx")
        assert pc.read_file("/f") == b"tx"
    admin.mkdir("/teams/other")
    admin.rename("/teams/other", "/teams/other-2")  # a directory beside the root moves
    admin.create_tenant("empty-root")
    admin.mkdir("/impostor")
    with pytest.raises(E.InvalidArgument, match="root of tenant 'empty-root'"):
        admin.rename("/impostor", "/empty-root")  # nor is a root replaced by another directory


def test_a_request_id_is_the_callers_own(cluster: LocalCluster, two: dict[str, str]) -> None:
    """The reply cache (retries across a failover) is keyed by the caller too: tenant A sending
    tenant B's request id gets its own mutation applied, never B's stored answer."""
    rid = "nodeB-4242-abcdef:7"

    async def create(token: str, path: str, request_id: str) -> pb.Inode:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stub = pb_grpc.MasterStub(channel)
            request = pb.CreateRequest(header=pb.RequestHeader(request_id=request_id), path=path, mode=0o600)
            return await stub.Create(request, metadata=bearer(token), timeout=5)

    theirs = asyncio.run(create(two["tb"], "/private/payroll.csv", rid))
    mine = asyncio.run(create(two["ta"], "/mine.csv", rid))
    assert mine.tenant == "ta" and mine.id != theirs.id and mine.name == "mine.csv"
    assert asyncio.run(create(two["tb"], "/private/payroll.csv", rid)).id == theirs.id  # B's own retry
    with _client(cluster, two["ta"]) as a:
        assert a.stat("/mine.csv").inode == mine.id


def test_attributes_and_symlink_targets_are_bounded(cluster: LocalCluster, two: dict[str, str]) -> None:
    """Every mutation of an inode rewrites and replicates its record: a tenant cannot grow one past
    Linux's limits (a 64 KiB xattr value, 128 KiB of them per inode, a PATH_MAX symlink target)."""
    with _client(cluster, two["ta"]) as a:
        a.write_file("/xa", b"")
        a.setattr("/xa", set_xattrs={"user.ok": b"v" * (64 << 10)})  # the largest value
        with pytest.raises(E.TooLarge) as caught:
            a.setattr("/xa", set_xattrs={"user.big": b"v" * ((64 << 10) + 1)})
        assert caught.value.errno == errno.E2BIG
        with pytest.raises(E.TooLarge):
            a.setattr("/xa", set_xattrs={"user.ok2": b"v" * (64 << 10)})  # past 128 KiB in all
        with pytest.raises(E.NameTooLong):
            a.setattr("/xa", set_xattrs={"user." + "n" * 300: b"v"})
        assert set(a.getxattrs("/xa")) == {"user.ok"}
        with pytest.raises(E.NameTooLong):
            a.symlink("t" * 4096, "/long-link")
        a.symlink("t" * 4095, "/long-link")


def test_one_tenant_cannot_hold_the_master_with_one_huge_request(cluster: LocalCluster, two: dict[str, str]) -> None:
    """The master serves every tenant and the workers' heartbeats on one event loop: a request
    whose work grows without bound is refused by the master itself, not only by well-behaved
    clients. Before: a sparse file of 2 M 64 KiB holes committed through the raw RPC made every
    later open take more than the call deadline, and another tenant's ``stat`` with it; a
    ``Batch`` of 200,000 stats held the loop for 2.5 s."""
    from pcache.common.layout import MAX_FILE_BLOCKS
    from pcache.common.rpc import MAX_BATCH

    with _client(cluster, two["tb"]) as b:
        node = b._run(
            b.aio.master.create("/sparse", mode=0o600, exclusive=True, truncate=False, block_size=BLOCK, replication=1)
        )
        too_many = MAX_FILE_BLOCKS + 1
        with pytest.raises(E.FileTooLarge, match=rf"at most {MAX_FILE_BLOCKS} blocks of {BLOCK} bytes"):
            b._run(b.aio.master.commit_file(node.id, too_many * BLOCK, [pb.CommittedBlock()] * too_many, replace=True))
        most = MAX_FILE_BLOCKS  # the largest sparse file of this block size: 8 GiB of holes
        b._run(b.aio.master.commit_file(node.id, most * BLOCK, [pb.CommittedBlock()] * most, replace=True))
        layout = b._run(b.aio.master.layout("/sparse"))
        assert len(layout.blocks) == most and not layout.blocks[-1].token and not layout.blocks[-1].replicas
        assert layout.blocks[-1].offset == (most - 1) * BLOCK and layout.blocks[-1].length == BLOCK
        with b.open("/sparse", "r+b") as f:  # the client refuses it before asking
            with pytest.raises(E.FileTooLarge) as caught:
                f.truncate(too_many * BLOCK)
            assert caught.value.errno == errno.EFBIG
        assert b.stat("/sparse").size == most * BLOCK

        async def batch(n: int) -> pb.BatchResponse:
            async with grpc.aio.insecure_channel(cluster.master_address) as channel:
                ops = [pb.BatchOp(stat=pb.PathRequest(path="/private"))] * n
                return await pb_grpc.MasterStub(channel).Batch(
                    pb.BatchRequest(header=pb.RequestHeader(), ops=ops), metadata=bearer(two["tb"]), timeout=10
                )

        assert len(asyncio.run(batch(MAX_BATCH)).results) == MAX_BATCH
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            asyncio.run(batch(MAX_BATCH + 1))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"at most {MAX_BATCH} ops" in str(
            refused.value.details()
        )
        b.remove("/sparse")


def test_every_hard_link_counts_against_the_inode_quota(cluster: LocalCluster, admin: Client) -> None:
    """A tenant's inode quota bounds its names: before, ``link`` made entries for nothing (400
    links under a quota of 200, usage still 10). Each name is charged when made and given back
    when it goes, by unlink, by a rename over it, or with the directory that holds it."""
    admin.create_tenant("tl", quota_inodes=8)
    with _client(cluster, admin.issue_token("tl")) as c:

        def used() -> int:
            return {t.name: t for t in admin.tenants()}["tl"].used_inodes

        c.mkdir("/d")
        c.write_file("/d/base", b"b" * 1000)
        c.link("/d/base", "/d/l1")
        c.link("/d/base", "/l2")
        assert used() == 4  # /d, and three names of one file
        c.write_file("/other", b"o")
        c.link("/other", "/l3")
        c.write_file("/v", b"v")
        c.link("/v", "/v2")
        assert used() == 8
        with pytest.raises(E.QuotaExceeded) as caught:
            c.link("/d/base", "/l4")  # a ninth name
        assert caught.value.errno == errno.EDQUOT
        assert c.stat("/l2").nlink == 3 and not c.exists("/l4")
        c.remove("/l2")  # one name of three
        assert used() == 7
        c.rename("/other", "/v2")  # over one of v's two names: that name goes
        assert used() == 6 and c.stat("/v").nlink == 1
        c.remove("/d", recursive=True)  # /d and base's last two names
        assert used() == 3
        assert (c.read_file("/v2"), c.read_file("/l3"), c.read_file("/v")) == (b"o", b"o", b"v")
        c.link("/v", "/l5")
        assert used() == 4
    admin.delete_tenant("tl", purge=True)


def test_an_aborted_writer_gives_its_blocks_up_at_once(cluster: LocalCluster, admin: Client) -> None:
    """A writer aborted after storing blocks (a checkpoint save that failed with ENOSPC) gives
    them up (``AbandonBlocks``): its tenant's quota stops holding them at once, and the workers
    delete them within a heartbeat, not after ``master.orphan_grace`` (600 s) and the next block
    report: the next save finds the room. A late write of an abandoned id is refused."""
    from pcache.worker.blockstore import block_file

    admin.create_tenant("tw")
    with _client(cluster, admin.issue_token("tw")) as pc:
        f = pc.open("/ckpt", "wb", block_size=1 << 20, replication=2)
        f.write(os.urandom(3 << 20) + b"tail")
        wait_for(lambda: len(f._f._allocated) == 3, 20, "three full blocks stored")
        ids = sorted(f._f._allocated)
        files = [Path(block_file(str(cluster.root / f"worker-{w}"), b)) for b in ids for w in (0, 1)]
        assert all(p.exists() for p in files)
        assert {t.name: t for t in admin.tenants()}["tw"].reserved_bytes == 3 << 20
        f.abort()
        assert {t.name: t for t in admin.tenants()}["tw"].reserved_bytes == 0  # at once
        assert not pc.exists("/ckpt")
        wait_for(lambda: not any(p.exists() for p in files), 10, "the workers to delete the abandoned blocks")


def test_a_tenant_cannot_abandon_another_tenants_blocks(cluster: LocalCluster, admin: Client, two) -> None:
    """``AbandonBlocks`` names an inode and block ids: another tenant's inode is NotFound, and
    ids not reserved for the caller's own inode (another tenant's writer's, a committed file's)
    are ignored: that writer still commits, that file still reads."""
    with _client(cluster, two["tb"]) as victim, _client(cluster, two["ta"]) as attacker:
        f = victim.open("/private/inflight", "wb", block_size=1 << 20, replication=1)
        f.write(os.urandom(1 << 20) + b"x")
        wait_for(lambda: len(f._f._allocated) == 1, 20, "the victim's block stored")
        (theirs,) = f._f._allocated
        committed = admin.layout("/tb/private/secret").blocks[0].block_id
        with pytest.raises(E.NotFound):
            attacker._run(attacker.aio.abandon_blocks(f._f.inode, [theirs]))
        with attacker.open("/mine", "wb") as own:
            own.write(b"m")
        mine = attacker.stat("/mine").inode
        attacker._run(attacker.aio.abandon_blocks(mine, [theirs, committed]))  # ignored
        time.sleep(2.5)  # two heartbeats: any DELETE would have gone out
        f.close()
        assert len(victim.read_file("/private/inflight")) == (1 << 20) + 1
        assert admin.read_file("/tb/private/secret") == b"tb" * 1000


def test_a_token_file_that_cannot_be_read_is_named_in_the_error(cluster: LocalCluster, tmp_path: Path) -> None:
    """``$PCACHE_TOKEN_FILE`` naming a missing file sent no token, and the master's answer ("no
    token") hid the cause: the client now says which file it could not read, at once."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PCACHE_TOKEN"}
    env["PCACHE_TOKEN_FILE"] = str(tmp_path / "missing.token")
    out = subprocess.run(
        [sys.executable, "-m", "pcache", "--master", cluster.master_address, "ls", "/"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert f"$PCACHE_TOKEN_FILE={tmp_path / 'missing.token'}: No such file or directory" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_block_whose_write_failed_is_given_back_before_the_next_try(cluster: LocalCluster, admin: Client) -> None:
    """A block write that fails on its pipeline (a worker gone, full, stalled) is tried again
    under a new allocation; the failed one is given back at once, not charged to the tenant
    for ``master.orphan_grace``."""
    admin.create_tenant("tf")
    with _client(cluster, admin.issue_token("tf")) as pc:
        real = pc.aio.data.write
        failures: list[int] = []

        async def flaky(targets, block_id, *args, **kwargs):
            if not failures:
                failures.append(block_id)
                raise E.Unavailable(f"worker {targets[0].worker_id} reset the connection")
            return await real(targets, block_id, *args, **kwargs)

        pc.aio.data.write = flaky
        pc.write_file("/retried", b"r" * 100_000)
        assert failures and pc.read_file("/retried") == b"r" * 100_000
        assert pc.layout("/retried").blocks[0].block_id != failures[0]
        usage = {t.name: t for t in admin.tenants()}["tf"]
        assert (usage.used_bytes, usage.reserved_bytes) == (100_000, 0)


def test_a_leaked_token_is_revoked_at_once_and_no_other_tenant_is_touched(
    cluster: LocalCluster, admin: Client, two: dict[str, str], tmp_path: Path
) -> None:
    """A tenant's token leaked: only rotating the cluster's keys twice ended it, which cut off
    every tenant and the workers. ``pcache tenant revoke-tokens`` refuses the tenant's tokens
    issued until then, on an open connection too, and across a master restart; a token issued
    afterwards works at once; a tenant cannot revoke anyone's tokens."""
    import signal
    import subprocess
    import sys

    from pcache.common.auth import mint_token
    from pcache.common.credentials import ClusterKeys

    admin.create_tenant("leaky")
    leaked = admin.issue_token("leaky")
    keys = ClusterKeys.load(str(cluster.keys_file))
    offline = mint_token(keys.tokens, "leaky")  # `pcache keys token --tenant leaky`
    ahead = mint_token(keys.tokens, "leaky", now=time.time() + 200)  # a host whose clock is ahead
    future = mint_token(keys.tokens, "leaky", now=time.time() + 3600)  # it would outlive revocations
    with _client(cluster, future) as pc, pytest.raises(E.PermissionDenied, match="issued in the future"):
        pc.stat("/")
    fields = ("v1", keys.tokens.current, "leaky", "tenant", "0")  # a token of an older release: no issue time
    old = ".".join((*fields, keys.tokens.mac(keys.tokens.current, fields)))
    for token in (leaked, offline, old, ahead):
        with _client(cluster, token) as pc:
            pc.write_file("/data", b"x" * 1000)
    with _client(cluster, two["ta"]) as tenant, pytest.raises(E.PermissionDenied, match="admin"):
        tenant.revoke_tokens("leaky")  # a tenant may not lock another one out
    attacker = _client(cluster, leaked)  # connected, its stream open, before the revocation
    try:
        assert attacker.read_file("/data") == b"x" * 1000
        held = attacker.layout("/data").blocks[0]  # block tokens already handed out
        assert held.token.startswith("b2.")  # a tenant without a revocation: the format every worker reads
        env = {**os.environ, "PCACHE_ADMIN_TOKEN_FILE": str(cluster.secrets / "admin.token")}
        env.pop("PCACHE_TOKEN", None)
        fresh_file = tmp_path / "leaky.token"
        revoked_at = time.time()
        cli = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", cluster.master_address, "tenant", "revoke-tokens", "leaky",
             "--token-file", str(fresh_file)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert "tokens of tenant leaky issued before" in cli.stderr and str(fresh_file) in cli.stderr
        listed = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", cluster.master_address, "tenant", "list"],
            env=env, capture_output=True, text=True, timeout=60,
        ).stdout.splitlines()  # fmt: skip
        assert "tokens revoked before" in listed[0]
        rows = {line.split()[0]: line for line in listed[1:]}
        assert rows["leaky"].endswith(" UTC") and rows["ta"].endswith(" -"), listed
        with pytest.raises(E.PermissionDenied, match="token revoked"):
            attacker.stat("/data")
        with pytest.raises(E.PermissionDenied, match="token revoked"):
            attacker.write_file("/planted", b"y")

        # the block token it holds: refused by the workers once they hear of the revocation
        # (the masters' next heartbeat answer), on TCP and on the short-circuit socket
        for replica in held.replicas:
            for sc in (False, True) if replica.uds_path else (False,):
                why = wait_for(lambda: raw_read_refusal(replica, held, short_circuit=sc), 10, "a refusal")  # noqa: B023
                assert "revoked" in why, why
        # (what the client already holds stays with it, as an open fd survives a chmod: bytes read,
        # block files the short circuit opened)
    finally:
        attacker.close()
    for token in (offline, old, ahead, mint_token(keys.tokens, "leaky")):  # offline: the skew's 5 min later
        with _client(cluster, token) as pc, pytest.raises(E.PermissionDenied, match="token revoked"):
            pc.stat("/data")
    fresh = fresh_file.read_text().strip()
    right_after = admin.issue_token("leaky")  # in the same millisecond as a revocation, too
    instant = next(t for t in admin.tenants() if t.name == "leaky").revoked_before_ms  # now + the clock skew
    assert revoked_at + 300 < instant / 1000 < time.time() + 300  # the clock skew after the revocation
    later = mint_token(keys.tokens, "leaky", now=instant / 1000)  # offline, once that instant comes
    for token in (fresh, right_after, two["ta"], later):
        with _client(cluster, token) as pc:
            assert pc.stat("/data" if token != two["ta"] else "/private/secret").size
    with _client(cluster, two["tb"]) as other:
        assert other.read_file("/private/secret") == b"tb" * 1000  # another tenant: untouched
    # the tenant of block tokens no tenant owns (admin files, worker transfers) is no tenant's
    with pytest.raises(E.InvalidArgument, match="reserved"):
        admin.create_tenant("cluster")
    with pytest.raises(E.InvalidArgument, match="not a tenant"):
        admin.revoke_tokens("cluster")

    cluster.kill(cluster.master, signal.SIGKILL)  # the revocation is metadata: it outlives the master
    cluster.start_master()
    cluster.wait_workers(2, timeout=30)
    with _client(cluster, leaked) as pc, pytest.raises(E.PermissionDenied, match="token revoked"):
        pc.stat("/data")
    with _client(cluster, fresh) as pc:
        assert pc.read_file("/data") == b"x" * 1000  # the workers take the new block tokens (b3)
        assert pc.layout("/data").blocks[0].token.startswith("b3.")
