"""The master from an attacker's side: every RPC of the Master and Replication services with no
token, a garbage one, one changed character, an expired one, another cluster's, or a token of the
wrong scope is refused with PermissionDenied, and nothing changes (real processes on loopback)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc
import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common.auth import KeyRing, bearer, mint_token
from pcache.common.config import ClientConfig
from pcache.common.credentials import ClusterKeys
from pcache.common.errors import PCacheError
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb
from pcache.proto import pcache_pb2_grpc as pb_grpc
from pcache.testing.faults import wait_for


def _methods(service: str) -> list[tuple[str, str, type, type]]:
    """(name, kind, request class, response class) of every method of ``service``."""
    out = []
    for m in pb.DESCRIPTOR.services_by_name[service].methods:
        kind = ("stream" if m.client_streaming else "unary") + "_" + ("stream" if m.server_streaming else "unary")
        out.append((m.name, kind, getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)))
    return out


STREAM_REFUSAL_WAIT = 2.0  # seconds a stream call waits for a refusal before it sends its request


async def _status_of(address: str, service: str, name: str, kind: str, req, resp, token: str) -> grpc.StatusCode:
    """The status code of one call."""
    async with grpc.aio.insecure_channel(address) as channel:
        path = f"/pcache.{service}/{name}"
        make = getattr(channel, kind)(
            path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        body = req(path="/victim") if "path" in req.DESCRIPTOR.fields_by_name else req()
        try:
            if kind.startswith("stream"):
                # as MasterClient does, nothing is written before the server has had time to refuse
                # the call (one written as it refuses ends the call INTERNAL, "Internal error from
                # Core", not with the refusal: 5 tries in a row did on a loaded CI machine)
                call = make(timeout=5, metadata=bearer(token))
                try:
                    return await asyncio.wait_for(asyncio.shield(call.code()), STREAM_REFUSAL_WAIT)
                except TimeoutError:
                    pass  # let in
                await call.write(body)
                await call.done_writing()
            else:
                call = make(body, timeout=5, metadata=bearer(token))
            if kind.endswith("stream"):
                async for _ in call:
                    pass
            else:
                await call
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(str(tmp_path_factory.mktemp("auth")), workers=1) as c:
        with Client(ClientConfig(master=c.master_address, token=c.token)) as pc:
            pc.mkdir("/victim")
            pc.write_file("/victim/secret", b"s" * 1000, mode=0o600) if False else pc.write_file(
                "/victim/secret", b"s" * 1000
            )
        yield c


def _bad_tokens(cluster: LocalCluster) -> dict[str, str]:
    keys = ClusterKeys.load(str(cluster.keys_file))
    good = cluster.token
    flipped = good[:-3] + ("A" if good[-3] != "A" else "B") + good[-2:]
    return {
        "none": "",
        "garbage": "garbage",
        "flipped": flipped,
        "expired": mint_token(keys.tokens, "default", "tenant", ttl=1, now=time.time() - 10),
        "other-cluster": mint_token(KeyRing.generate(keys.tokens.current), "default", "admin"),
        "escalated": ".".join([*good.split(".")[:3], "admin", *good.split(".")[4:]]),
    }


def test_every_rpc_refuses_a_caller_without_a_valid_token(cluster: LocalCluster) -> None:
    bad = _bad_tokens(cluster)
    methods = [("Master", *m) for m in _methods("Master")] + [("Replication", *m) for m in _methods("Replication")]
    assert len(methods) >= 22

    async def probe() -> dict[tuple[str, str], grpc.StatusCode]:
        out = {}
        for service, name, kind, req, resp in methods:
            for why, token in bad.items():
                out[(f"{service}.{name}", why)] = await _status_of(
                    cluster.master_address, service, name, kind, req, resp, token
                )
        return out

    codes = asyncio.run(probe())
    allowed = {k: v for k, v in codes.items() if v != grpc.StatusCode.PERMISSION_DENIED}
    assert allowed == {}
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        assert pc.read_file("/victim/secret") == b"s" * 1000  # nothing changed
        assert [e.name for e in pc.listdir("/victim")] == ["secret"]
        assert sum(w.alive for w in pc.status().workers) == 1  # no worker was registered


def test_each_scope_reaches_only_its_own_rpcs(cluster: LocalCluster) -> None:
    """A tenant token cannot register a worker or replicate; a worker token cannot touch the
    namespace; only an admin manages tenants; only another master of the cluster may ship log
    entries."""
    worker_only = {
        "RegisterWorker",
        "Heartbeat",
        "BlockReceived",
        "ReportBlocks",
        "UfsBlockSource",
        "UfsBlockSources",
        "ReleaseSpace",
        "ReportPersist",
    }
    admin_only = {
        "CreateTenant", "DeleteTenant", "SetQuota", "ListTenants", "IssueToken", "RevokeTokens", "BindPath", "UnbindPath",
    }  # fmt: skip
    tenant = cluster.token
    worker = cluster.worker_token

    async def probe() -> dict[str, tuple[grpc.StatusCode, grpc.StatusCode]]:
        out = {}
        for name, kind, req, resp in _methods("Master"):
            out[name] = (
                await _status_of(cluster.master_address, "Master", name, kind, req, resp, tenant),
                await _status_of(cluster.master_address, "Master", name, kind, req, resp, worker),
            )
        for name, kind, req, resp in _methods("Replication"):
            out["Replication." + name] = (
                await _status_of(cluster.master_address, "Replication", name, kind, req, resp, tenant),
                await _status_of(cluster.master_address, "Replication", name, kind, req, resp, worker),
            )
        out["admin-on-replication"] = (
            await _status_of(
                cluster.master_address,
                "Replication",
                "Probe",
                "unary_unary",
                pb.MemberRequest,
                pb.AppendResponse,
                cluster.admin_token,
            ),  # fmt: skip
            grpc.StatusCode.PERMISSION_DENIED,
        )
        return out

    denied = grpc.StatusCode.PERMISSION_DENIED
    for name, (as_tenant, as_worker) in asyncio.run(probe()).items():
        if name in worker_only:
            assert as_tenant == denied and as_worker != denied, name
        elif name.startswith("Replication") or name == "admin-on-replication" or name in admin_only:
            assert as_tenant == denied and as_worker == denied, name
        elif name == "ReportBadBlock":
            assert as_tenant != denied and as_worker != denied, name
        else:
            assert as_tenant != denied and as_worker == denied, name

    async def as_admin() -> dict[str, grpc.StatusCode]:
        return {
            name: await _status_of(cluster.master_address, "Master", name, kind, req, resp, cluster.admin_token)
            for name, kind, req, resp in _methods("Master")
            if name in admin_only
        }

    assert denied not in asyncio.run(as_admin()).values()


def test_a_worker_without_the_worker_token_never_joins(cluster: LocalCluster, tmp_path) -> None:
    """A rogue worker started from outside with a tenant token is refused: it never shows in the
    cluster and never receives a block."""
    token_file = tmp_path / "stolen.token"
    token_file.write_text(cluster.token)  # a tenant's token, not a worker's
    token_file.chmod(0o600)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        before = {w.info.addr.worker_id for w in pc.status().workers}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pcache", "worker", f"--worker.data_dir={tmp_path / 'rogue'}",
         f"--worker.master={cluster.master_address}", f"--worker.token_file={token_file}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        time.sleep(3)
        with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
            assert {w.info.addr.worker_id for w in pc.status().workers} == before
            pc.write_file("/victim/new", b"n" * 5000)
            assert pc.read_file("/victim/new") == b"n" * 5000
    finally:
        proc.kill()
        out = proc.communicate(timeout=10)[0]
    assert "RegisterWorker needs a worker token" in out
    assert not (tmp_path / "rogue").exists() or not any((tmp_path / "rogue").rglob("*.blk"))


def test_a_worker_token_file_any_user_can_read_is_refused(cluster: LocalCluster, tmp_path, monkeypatch) -> None:
    """A worker token reads every tenant's blocks (it fetches the block keys): a worker started with
    one that every local user can read (written with the default umask, 0644) says so and stops,
    as a world-readable key file or TLS key does; 0600 and 0640 (a Kubernetes Secret with fsGroup) pass."""
    from pcache.common.config import WorkerConfig
    from pcache.worker.server import worker_token

    token_file = tmp_path / "worker.token"
    token_file.write_text(cluster.worker_token + "\n")
    token_file.chmod(0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "pcache", "worker", f"--worker.data_dir={tmp_path / 'w'}",
         f"--worker.master={cluster.master_address}", f"--worker.token_file={token_file}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and f"worker.token_file {token_file} is readable by any user" in proc.stderr
    assert "chmod 600" in proc.stderr and "Traceback" not in proc.stderr
    for mode in (0o600, 0o640):
        token_file.chmod(mode)
        assert worker_token(WorkerConfig(token_file=str(token_file))) == cluster.worker_token
    token_file.chmod(0o604)
    monkeypatch.delenv("PCACHE_TOKEN", raising=False)
    monkeypatch.setenv("PCACHE_TOKEN_FILE", str(token_file))
    with pytest.raises(E.InvalidArgument, match="PCACHE_TOKEN_FILE .* is readable by any user"):
        worker_token(WorkerConfig())


def test_secrets_and_block_files_are_their_owners_alone(cluster: LocalCluster) -> None:
    """Keys, tokens, the token map clients read, the metastore and a worker's blocks: no other
    local user can read them (0600 files, 0700 directories)."""
    from pcache.common.credentials import tokens_file

    def mode(path) -> int:
        return path.stat().st_mode & 0o777

    assert mode(cluster.secrets) == 0o700
    assert {p.name: mode(p) for p in cluster.secrets.iterdir()} == dict.fromkeys(
        ("keys.json", "token", "admin.token", "worker.token"), 0o600
    )
    assert mode(tokens_file()) == 0o600
    assert mode(cluster.root / "master" / "meta") == 0o700
    assert mode(cluster.root / "worker-0") == 0o700
    blocks = [p for p in (cluster.root / "worker-0" / "blocks").rglob("*") if p.is_file()]
    assert blocks and all(mode(p) == 0o600 for p in blocks)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes directories of another uid (root)")
def test_a_cluster_directory_another_user_could_swap_is_refused(tmp_path) -> None:
    """A directory another user made (in /tmp, before the operator ran `pcache up`), or one under a
    directory every user may write to, lets that user plant keys or rename the secrets and the
    workers' sockets: a master, a worker, the key file and the TLS directory refuse it, naming the
    owner or the mode. A sticky world-writable parent (/tmp itself) is fine."""
    from pcache.common.credentials import check_private_path
    from pcache.common.errors import InvalidArgument

    planted = tmp_path / "pcache-data"
    planted.mkdir()
    os.chown(planted, 12345, 12345)  # the attacker's
    for target in (planted, planted / "secrets" / "keys.json", planted / "worker-0"):
        with pytest.raises(InvalidArgument, match="belongs to uid 12345"):
            check_private_path(target, "data dir")
    with pytest.raises(InvalidArgument, match="belongs to uid 12345"):
        ClusterKeys.load_or_create(str(planted / "keys.json"))
    assert not (planted / "keys.json").exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(InvalidArgument, match="writable by every user"):
        check_private_path(shared / "c", "data dir")
    os.chmod(shared, 0o1777)  # as /tmp: nobody renames another's entries
    check_private_path(shared / "c", "data dir")
    # ... but a link another user put there, even to a directory of root's, is theirs to repoint
    (tmp_path / "roots").mkdir()
    os.symlink(tmp_path / "roots", shared / "link")
    os.lchown(shared / "link", 12345, 12345)
    with pytest.raises(InvalidArgument, match="belongs to uid 12345"):
        check_private_path(shared / "link" / "w", "data dir")
    team = tmp_path / "team"
    team.mkdir()
    os.chown(team, 0, 12345)
    os.chmod(team, 0o775)  # writable by a group this process is not in
    with pytest.raises(InvalidArgument, match="writable by group 12345"):
        check_private_path(team / "w", "data dir")
    for argv in (
        ["pcache", "worker", f"--worker.data_dir={planted / 'worker-0'}", "--worker.port=0"],
        ["pcache", "master", f"--master.data_dir={planted / 'master'}", "--master.port=0"],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "belongs to uid 12345" in proc.stderr, proc.stderr[-2000:]


def test_key_rotation_while_reads_and_writes_run(tmp_path) -> None:
    """`pcache keys rotate` under a running writer: no call fails (the previous key still
    verifies), a token of the new key works within a second or two, and after a second rotation
    the tokens of the first key are refused."""
    import threading

    from pcache.common.credentials import ClusterKeys

    with LocalCluster(str(tmp_path / "c"), workers=1, master_args=["--master.replication_check_interval=0.2"]) as c:
        old_token = c.token
        errors: list[BaseException] = []
        done = threading.Event()
        count = [0]

        def work() -> None:
            try:
                with Client(ClientConfig(master=c.master_address, token=old_token)) as pc:
                    pc.mkdir("/rot", parents=True)
                    while not done.is_set():
                        pc.write_file(f"/rot/{count[0] % 20}", b"x" * 4096)
                        assert pc.read_file(f"/rot/{count[0] % 20}") == b"x" * 4096
                        count[0] += 1
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        try:
            time.sleep(0.5)
            run = [sys.executable, "-m", "pcache", "keys"]
            subprocess.run([*run, "rotate", str(c.keys_file)], check=True, capture_output=True, timeout=30)
            new_token = subprocess.run(
                [*run, "token", "--keys-file", str(c.keys_file), "--tenant", "default"],
                check=True, capture_output=True, text=True, timeout=30,
            ).stdout.strip()  # fmt: skip
            assert new_token.split(".")[1] == ClusterKeys.load(str(c.keys_file)).tokens.current

            def new_works() -> bool:
                try:
                    with Client(ClientConfig(master=c.master_address, token=new_token, rpc_timeout=2)) as pc:
                        return pc.stat("/rot").kind == "dir"
                except PCacheError:
                    return False

            deadline = time.monotonic() + 10
            while not new_works():
                assert time.monotonic() < deadline, "the new key was not loaded"
                time.sleep(0.1)
            before = count[0]
            time.sleep(1.0)
            assert count[0] > before and not errors  # the old token kept working throughout
        finally:
            done.set()
            thread.join(30)
        assert not errors, errors
        subprocess.run([*run, "rotate", str(c.keys_file)], check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while True:
            try:
                with Client(ClientConfig(master=c.master_address, token=old_token, rpc_timeout=2)) as pc:
                    pc.stat("/rot")
            except PCacheError as exc:
                assert "invalid token" in str(exc)
                break
            assert time.monotonic() < deadline, "the dropped key's token still works"
            time.sleep(0.1)


def test_a_worker_takes_the_token_minted_into_its_file_when_a_rotation_revokes_its_old_one(
    tmp_path, monkeypatch
) -> None:
    """Replayed from an operator: revocation as the guide says it (rotate, mint the workers' and
    tenants' tokens again into their files, rotate again) left every worker refused ("invalid
    token", workers 0/3 alive, every block missing) until each was restarted by hand: a worker
    read worker.token_file only at start; and every mount, until remounted. A refused worker,
    and a client whose token came from $PCACHE_TOKEN_FILE, read the file again."""
    from pcache.common.credentials import ClusterKeys

    args = ["--master.replication_check_interval=0.2", "--master.dead_after=3", "--master.heartbeat_interval=0.5"]
    with LocalCluster(str(tmp_path / "c"), workers=1, master_args=args) as c:
        token_file = tmp_path / "tenant.token"
        token_file.write_text(c.token)
        monkeypatch.setenv("PCACHE_TOKEN_FILE", str(token_file))
        mounted = Client(ClientConfig(master=c.master_address))  # a mount's client: its token from the file
        mounted.mkdir("/before")
        run = [sys.executable, "-m", "pcache", "keys"]
        subprocess.run([*run, "rotate", str(c.keys_file)], check=True, capture_output=True, timeout=30)
        for name, scope, tenant in (("worker.token", "worker", "workers"), ("token", "tenant", "default")):
            minted = subprocess.run(
                [*run, "token", "--keys-file", str(c.keys_file), "--scope", scope, "--tenant", tenant],
                check=True, capture_output=True, text=True, timeout=30,
            ).stdout.strip()  # fmt: skip
            (c.secrets / name).write_text(minted + "\n")
        current = ClusterKeys.load(str(c.keys_file)).tokens.current
        subprocess.run([*run, "rotate", str(c.keys_file)], check=True, capture_output=True, timeout=30)
        token = (c.secrets / "token").read_text().strip()
        assert token.split(".")[1] == current
        token_file.write_text(token)

        def alive() -> bool:
            try:
                with Client(ClientConfig(master=c.master_address, token=token, rpc_timeout=2)) as pc:
                    workers = pc.status().workers
                    return len(workers) == 1 and workers[0].alive
            except PCacheError:
                return False

        time.sleep(4)  # past dead_after: a refused worker would show dead by now
        wait_for(alive, 20, "the worker to heartbeat with its new token")
        with Client(ClientConfig(master=c.master_address, token=token)) as pc:
            pc.write_file("/after-rotation", b"r" * 5000)  # a block stored: the worker takes writes
            assert pc.read_file("/after-rotation") == b"r" * 5000
        log = next(c.root.glob("**/worker-0*.log")).read_text()
        assert "holds a new token: using it" in log
        try:
            assert mounted.stat("/before").kind == "dir"  # the old token refused, the file's new one taken
            mounted.mkdir("/after")
        finally:
            mounted.close()


def test_a_standalone_master_takes_no_log_entries_even_from_a_key_holder(cluster: LocalCluster) -> None:
    """Replication is for followers: a standalone master refuses Append and InstallCheckpoint
    even with a valid master-scope token (a misconfigured peer must not wipe its namespace)."""
    keys = ClusterKeys.load(str(cluster.keys_file))
    token = mint_token(keys.tokens, "cluster", "master")

    async def probe() -> dict[str, grpc.StatusCode]:
        out = {}
        for name, kind, req, resp in _methods("Replication"):
            if name != "Probe":
                out[name] = await _status_of(cluster.master_address, "Replication", name, kind, req, resp, token)
        return out

    codes = asyncio.run(probe())
    assert set(codes) == {"Append", "InstallCheckpoint"} and grpc.StatusCode.OK not in codes.values(), codes
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        assert pc.read_file("/victim/secret") == b"s" * 1000


def test_two_authorization_entries_are_refused(cluster: LocalCluster) -> None:
    async def call(metadata) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(cluster.master_address) as channel:
            stub = pb_grpc.MasterStub(channel)
            try:
                await stub.Stat(pb.PathRequest(path="/victim"), timeout=5, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    good = ("authorization", f"Bearer {cluster.token}")
    assert asyncio.run(call((good,))) == grpc.StatusCode.OK
    assert asyncio.run(call((("authorization", "Bearer garbage"), good))) == grpc.StatusCode.PERMISSION_DENIED
    assert asyncio.run(call((good, good))) == grpc.StatusCode.PERMISSION_DENIED
