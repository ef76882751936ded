"""Mutual TLS from an attacker's side (real processes): a cluster started with ``tls=True`` (as
``pcache up --tls``) works end to end, while plaintext to its ports, a certificate from another
CA, or no client certificate at all is refused in the handshake, before any token is looked at."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcache.client import Client
from pcache.common import errors as E
from pcache.common import framing
from pcache.common.config import ClientConfig
from pcache.common.tls import TLSConfig, make_local_tls
from pcache.local import LocalCluster
from pcache.proto import pcache_pb2 as pb
from tests.conftest import REQUIRES_ETCD


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with LocalCluster(str(tmp_path_factory.mktemp("tls")), workers=2, tls=True) as c:
        yield c


def _cfg(cluster: LocalCluster, tls_dir: str, **kw) -> ClientConfig:
    return ClientConfig(master=cluster.master_address, token=cluster.token, tls_dir=tls_dir, rpc_timeout=3,
                        failover_timeout=0, connect_timeout=2, **kw)  # fmt: skip


def test_a_tls_cluster_serves_reads_and_writes(cluster: LocalCluster) -> None:
    root = Path(cluster.tls_dir)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE((root / "key.pem").stat().st_mode) == 0o600
    data = bytes(range(256)) * 8192
    for short_circuit in (False, True):
        with Client(_cfg(cluster, cluster.tls_dir, short_circuit=short_circuit)) as pc:
            pc.write_file(f"/tls-{short_circuit}", data, replication=2)  # the pipeline hop is TLS too
            assert pc.read_file(f"/tls-{short_circuit}") == data
            assert sum(w.alive for w in pc.status().workers) == 2
    with Client(master=cluster.master_address) as pc:  # finds the TLS directory pcache up recorded
        assert pc.read_file("/tls-False") == data


def test_plaintext_to_tls_ports_is_refused(cluster: LocalCluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PCACHE_TOKENS_FILE", str(tmp_path / "none.json"))  # no TLS directory to find
    monkeypatch.delenv("PCACHE_TLS_DIR", raising=False)
    with Client(_cfg(cluster, "")) as pc, pytest.raises(E.Unavailable):
        pc.stat("/")
    with Client(_cfg(cluster, cluster.tls_dir)) as pc:
        worker = pc.status().workers[0].info.addr

    assert asyncio.run(_ping(worker, None)) != "answered"  # the TLS server never parses a frame


async def _ping(worker: pb.WorkerAddr, tls_dir: Path | None) -> str:
    """'answered' when the worker's data port answers a PING (TLS with ``tls_dir``'s files),
    else the error class that stopped it."""
    ctx = TLSConfig.load(str(tls_dir), need_cert=False).client_context() if tls_dir else None
    try:
        reader, writer = await framing.open_connection(worker.host, worker.port, 3, ctx)
    except E.PCacheError as exc:
        return type(exc).__name__
    try:
        await framing.write_frame(writer, pb.DataHeader(op=pb.PING), timeout=3)
        reply, _ = await framing.read_header(reader, 3)
        return reply.error or "answered"
    except E.PCacheError as exc:
        return type(exc).__name__
    finally:
        framing.close_writer(writer)


def test_a_certificate_of_another_ca_or_none_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    rogue = make_local_tls(tmp_path / "rogue")  # a well-formed certificate, signed by another CA
    mixed = tmp_path / "mixed"  # trusts the cluster CA but presents the rogue certificate
    mixed.mkdir(mode=0o700)
    shutil.copy(Path(cluster.tls_dir) / "ca.pem", mixed / "ca.pem")
    shutil.copy(rogue / "cert.pem", mixed / "cert.pem")
    shutil.copy(rogue / "key.pem", mixed / "key.pem")
    ca_only = tmp_path / "ca-only"  # trusts the cluster CA, no certificate of its own
    ca_only.mkdir(mode=0o700)
    shutil.copy(Path(cluster.tls_dir) / "ca.pem", ca_only / "ca.pem")
    for directory in (rogue, mixed, ca_only):
        with Client(_cfg(cluster, str(directory))) as pc, pytest.raises(E.Unavailable):
            pc.stat("/")
    with Client(_cfg(cluster, cluster.tls_dir)) as pc:
        worker = pc.status().workers[0].info.addr

    assert asyncio.run(_ping(worker, Path(cluster.tls_dir))) == "answered"
    for directory in (rogue, mixed, ca_only):
        assert asyncio.run(_ping(worker, directory)) != "answered", directory


def test_a_world_readable_key_is_refused(tmp_path: Path) -> None:
    root = make_local_tls(tmp_path / "t")
    (root / "key.pem").chmod(0o644)
    with pytest.raises(E.InvalidArgument, match="readable by any user"):
        TLSConfig.load(str(root), need_cert=True)


@REQUIRES_ETCD
def test_a_client_of_a_pair_with_the_wrong_tls_fails_at_once_saying_why(tmp_path: Path, monkeypatch) -> None:
    """Plaintext, or another CA's certificate, against a TLS pair: the client tried the two masters
    for its whole failover timeout (30 s) and said "Socket closed". A connection refused as it is
    set up is no failover: the call fails once every master refused it twice, naming TLS."""
    rogue = make_local_tls(tmp_path / "rogue")
    with LocalCluster(str(tmp_path / "pair"), workers=1, masters=2, tls=True) as pair, monkeypatch.context() as env:
        env.setenv("PCACHE_TOKENS_FILE", str(tmp_path / "none.json"))  # no TLS directory to find; undone
        env.delenv("PCACHE_TLS_DIR", raising=False)  # before the cluster stops and forgets its own entry
        ca_only = tmp_path / "ca-only"  # no certificate of its own, to servers that require one
        ca_only.mkdir(mode=0o700)
        shutil.copy(Path(pair.tls_dir) / "ca.pem", ca_only / "ca.pem")
        cases = {
            "": "a server with TLS closes a client without TLS",
            str(rogue): "the TLS handshake failed",
            str(ca_only): "or without a certificate of its CA when it requires one",
        }
        for tls_dir, why in cases.items():
            cfg = ClientConfig(master=pair.master_address, token=pair.token, tls_dir=tls_dir, failover_timeout=30)
            started = time.monotonic()
            with Client(cfg) as pc, pytest.raises(E.Unavailable, match=why):
                pc.stat("/")
            assert time.monotonic() - started < 10, tls_dir
        cli = subprocess.run(
            [sys.executable, "-m", "pcache", "--master", pair.master_address, "ls", "/"], capture_output=True, text=True,
            env={**os.environ, "PCACHE_TLS_DIR": str(rogue), "PCACHE_TOKEN": pair.token}, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 2 and cli.stderr.count("\n") == 1, cli.stderr  # one line: gRPC's own log kept out
        assert "the TLS handshake failed" in cli.stderr
        cfg = ClientConfig(master=pair.master_address, token=pair.token, tls_dir=pair.tls_dir, failover_timeout=30)
        with Client(cfg) as pc:
            assert pc.stat("/").kind == "dir"  # the right files: served


@pytest.mark.parametrize(
    ("details", "hint"),
    [
        ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed",
         "a server with TLS closes a client without TLS"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake failed"
         " (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1a000064:ECDSA routines:OPENSSL_internal:BAD_SIGNATURE",
         "the TLS handshake failed"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake failed"
         " (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER",
         "the server answered without TLS"),
        ("failed to connect to all addresses; last error: UNAUTHENTICATED: Hostname Verification Check failed.",
         "does not name the address it was dialled at"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote"
         " host: Connection refused", ""),  # a dead master: failed over, no hint
    ],
)  # fmt: skip
def test_a_connection_refused_as_it_is_set_up_is_told_apart_and_named(details: str, hint: str) -> None:
    """The details gRPC gave in a helper's drill (a certificate for another host waited out the
    failover timeout; a CA-only client and a plaintext server were told the opposite of the fix)."""
    import grpc

    from pcache.common.rpc import translate

    err = translate(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, details), "master 127.0.0.1:1")
    assert isinstance(err, E.Unavailable) and err.setup_refused == bool(hint)
    assert (hint in str(err)) if hint else str(err).endswith("Connection refused"), str(err)


def test_a_tls_directory_without_a_certificate_says_so(tmp_path: Path) -> None:
    """A worker given a client's CA-only directory was told it had cert.pem but no key.pem."""
    root = make_local_tls(tmp_path / "t")
    (root / "cert.pem").unlink()
    (root / "key.pem").unlink()
    with pytest.raises(E.InvalidArgument, match="has no cert.pem"):
        TLSConfig.load(str(root), need_cert=True)
    assert TLSConfig.load(str(root), need_cert=False).cert == b""  # a client may go without one


def test_a_recorded_tls_directory_that_is_gone_is_not_used(tmp_path: Path, monkeypatch) -> None:
    """A TLS cluster not stopped cleanly left its entry in the tokens file; a plaintext cluster on
    the same address later: its clients failed "cannot read ca.pem" of the deleted directory."""
    from pcache.common.credentials import find_tls_dir, forget_tls, remember_tls

    monkeypatch.setenv("PCACHE_TOKENS_FILE", str(tmp_path / "tokens.json"))
    monkeypatch.delenv("PCACHE_TLS_DIR", raising=False)
    live = make_local_tls(tmp_path / "live")
    remember_tls("127.0.0.1:1,127.0.0.1:2", str(live))
    remember_tls("127.0.0.1:3", str(tmp_path / "gone"))
    assert find_tls_dir("127.0.0.1:2") == str(live)
    assert find_tls_dir("127.0.0.1:3") == ""  # plaintext, as if never recorded
    forget_tls("127.0.0.1:1,127.0.0.1:2", str(live))
    assert find_tls_dir("127.0.0.1:1") == ""
