"""Mutual TLS from an attacker's side (real processes): a cluster started with ``tls=True`` (as
``pcache up --tls``) works end to end, while plaintext to its ports, a certificate from another
CA, or no client certificate at all is refused in the handshake, before any token is looked at."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
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
from pcache.testing.faults import wait_for
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


def _served_serial(host: str, port: int, client_dir: Path, alpn: list[str] | None = None) -> int:
    """The serial number of the certificate a TLS server presents now (a new handshake)."""
    import socket
    import ssl

    from cryptography import x509

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(client_dir / "ca.pem"))
    ctx.load_cert_chain(str(client_dir / "cert.pem"), str(client_dir / "key.pem"))
    if alpn:
        ctx.set_alpn_protocols(alpn)
    with socket.create_connection((host, port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    """Certificates are renewed in place (cert-manager, a Secret volume, an operator's copy): a
    master and its workers kept serving the old one until restarted, so when it expired every new
    connection failed. They read the directory again and serve the new one from the next
    handshake; the workers' links to the master dial again with it; a key that does not match
    its certificate (a half-done copy) keeps the old pair in use."""
    from cryptography import x509

    from pcache.common.tls import RECHECK, issue_certificate, make_ca, write_tls_dir

    ca = make_ca()
    hosts = ("localhost", "127.0.0.1")
    first = issue_certificate(ca, hosts)
    root = tmp_path / "renew"
    write_tls_dir(root / "tls", ca.cert_pem, *first)  # the cluster's TLS directory, made before it starts
    client_dir = tmp_path / "client"  # a client's copy: the same CA, a certificate of its own
    write_tls_dir(client_dir, ca.cert_pem, *issue_certificate(ca, hosts))
    metrics = (["--master.metrics_port=0"], ["--worker.metrics_port=0"])
    with LocalCluster(str(root), workers=2, tls=True, master_args=metrics[0], worker_args=metrics[1]) as cluster:
        with Client(_cfg(cluster, str(client_dir))) as pc:
            pc.write_file("/before", b"b" * 300_000, replication=2)
            workers = [w.info.addr for w in pc.status().workers]
            scrapes = [w.info.metrics_addr for w in pc.status().workers]
        logged = (root / "logs" / "master.log").read_text()
        scrapes.append(logged.split("metrics on https://", 1)[1].split("/metrics", 1)[0])

        def expiries() -> set[float]:
            """The certificate expiry each process's /metrics reports (over HTTPS, with a client certificate)."""
            import ssl
            import urllib.request

            ctx = ssl.create_default_context(cafile=str(client_dir / "ca.pem"))
            ctx.load_cert_chain(str(client_dir / "cert.pem"), str(client_dir / "key.pem"))
            out = set()
            for where in scrapes:
                text = urllib.request.urlopen(f"https://{where}/metrics", context=ctx, timeout=5).read().decode()
                line = next(x for x in text.splitlines() if x.startswith("pcache_") and "tls_certificate_expiry" in x)
                out.add(float(line.split()[-1]))
            return out

        def not_after(pem: bytes) -> float:
            return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()

        wait_for(lambda: expiries() == {not_after(first[0])}, RECHECK * 2, "the served certificate's expiry")
        master_host, master_port = cluster.master_address.rsplit(":", 1)
        servers = [(master_host, int(master_port), ["h2"]), *((w.host, w.port, None) for w in workers)]
        serial = x509.load_pem_x509_certificate(first[0]).serial_number
        assert {_served_serial(h, p, client_dir, a) for h, p, a in servers} == {serial}

        half = issue_certificate(ca, hosts)  # a copy caught halfway: the new certificate, the old key
        (root / "tls" / "cert.pem").write_bytes(half[0])
        time.sleep(RECHECK + 1.5)
        assert {_served_serial(h, p, client_dir, a) for h, p, a in servers} == {serial}
        assert "the new files do not load" in (root / "logs" / "master.log").read_text()

        other_ca = make_ca(common_name="another CA")  # a wrong Secret, a stale copy: never taken
        for wrong, why in ((issue_certificate(other_ca, hosts), "not signed by a CA"),
                           (issue_certificate(ca, hosts, days=0), "not valid now")):  # fmt: skip
            write_tls_dir(root / "tls", ca.cert_pem, *wrong)
            time.sleep(RECHECK + 1.5)
            assert {_served_serial(h, p, client_dir, a) for h, p, a in servers} == {serial}
            for log in ("master", "worker-0", "worker-1"):
                assert why in (root / "logs" / f"{log}.log").read_text(), (log, why)

        renewed = issue_certificate(ca, hosts)
        write_tls_dir(root / "tls", ca.cert_pem, *renewed)
        new_serial = x509.load_pem_x509_certificate(renewed[0]).serial_number
        for host, port, alpn in servers:
            wait_for(lambda: _served_serial(host, port, client_dir, alpn) == new_serial, RECHECK * 3,  # noqa: B023
                     f"the renewed certificate at {host}:{port}")  # fmt: skip
        wait_for(lambda: expiries() == {not_after(renewed[0])}, RECHECK * 2, "the renewed certificate's expiry")
        time.sleep(4)  # heartbeats on the workers' new links, past master.dead_after
        with Client(_cfg(cluster, str(client_dir), short_circuit=False)) as pc:
            assert pc.read_file("/before") == b"b" * 300_000
            pc.write_file("/after", b"a" * 300_000, replication=2)  # the pipeline's hop: a new handshake too
            assert pc.read_file("/after") == b"a" * 300_000
            assert sum(w.alive for w in pc.status().workers) == 2
        for n in range(2):
            assert "its certificate is served from now on" in (root / "logs" / f"worker-{n}.log").read_text()


def _running(cluster: LocalCluster, tls_dir: Path) -> ClientConfig:
    """A long-running client's config (its usual failover, not :func:`_cfg`'s fail-fast one)."""
    return ClientConfig(master=cluster.master_address, token=cluster.token, tls_dir=str(tls_dir), short_circuit=False)


def test_a_ca_rotation_reaches_servers_and_a_running_client_without_restarts(tmp_path: Path) -> None:
    """A CA rotation as it is done: every trust bundle gets the new CA, then the servers switch to
    certificates of the new CA. A client that was running kept the CA it had read at start and
    was refused by every master at its next connection, until restarted; it now reads its TLS
    directory again when the masters refuse it, and dials again."""
    from cryptography import x509

    from pcache.common.tls import RECHECK, issue_certificate, make_ca, write_tls_dir

    hosts = ("localhost", "127.0.0.1")
    old_ca, new_ca = make_ca(common_name="old CA"), make_ca(common_name="new CA")
    root = tmp_path / "rotate"
    write_tls_dir(root / "tls", old_ca.cert_pem, *issue_certificate(old_ca, hosts))
    client_dir = tmp_path / "client"
    client_pair = issue_certificate(old_ca, hosts)
    write_tls_dir(client_dir, old_ca.cert_pem, *client_pair)
    with LocalCluster(str(root), workers=2, tls=True) as cluster, Client(_running(cluster, client_dir)) as pc:
        pc.write_file("/before", b"b" * 300_000, replication=2)
        workers = [w.info.addr for w in pc.status().workers]
        bundle = old_ca.cert_pem + new_ca.cert_pem
        served = issue_certificate(new_ca, hosts)
        write_tls_dir(client_dir, bundle, *client_pair)  # the client's bundle first ...
        write_tls_dir(root / "tls", bundle, *served)  # ... then the servers' new certificate
        serial = x509.load_pem_x509_certificate(served[0]).serial_number
        master_host, master_port = cluster.master_address.rsplit(":", 1)
        for host, port, alpn in [
            (master_host, int(master_port), ["h2"]),
            *((w.host, w.port, None) for w in workers),
        ]:
            wait_for(lambda: _served_serial(host, port, client_dir, alpn) == serial, RECHECK * 3,  # noqa: B023
                     f"the new CA's certificate at {host}:{port}")  # fmt: skip
        cluster.kill(cluster.master, signal.SIGKILL)  # the client's connection goes: a new handshake
        cluster.start_master()
        cluster.wait_workers(2, timeout=30)
        assert pc.read_file("/before") == b"b" * 300_000
        pc.write_file("/after", b"a" * 300_000, replication=2)
        assert pc.read_file("/after") == b"a" * 300_000
