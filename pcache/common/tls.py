"""Optional TLS for gRPC (masters, workers, clients) and the data plane (asyncio streams).

A *TLS directory* holds ``ca.pem`` (the cluster CA that signs every certificate), and, for a
process that presents a certificate, ``cert.pem`` and ``key.pem`` (0600). Masters and workers
always present theirs; with ``client_auth`` (the default) they also require one from every
peer, so masters and workers authenticate each other (mutual TLS) and a client needs a
certificate of the cluster CA besides its token. A connection from a certificate of another
CA, or in plaintext, fails its handshake.

:func:`make_local_tls` makes a throw-away CA and one certificate for ``pcache up --tls`` with the
``cryptography`` package (ECDSA P-256, the SANs ``localhost``, ``127.0.0.1`` and this host's name).

Rotation without a restart: a server's :meth:`TLSConfig.reload` (masters and workers call it
every :data:`RECHECK` seconds; cert-manager and Kubernetes Secret volumes replace the files in
place) reads a changed directory again, checks that the new key matches the new certificate,
and then serves it: gRPC servers through ``grpc.dynamic_ssl_server_credentials`` (asked at each
handshake), ``ssl`` contexts it made by loading the new chain into them. Connections already up
keep their session. A pair that does not load (half copied, a key of another certificate) keeps
the one in use, logged. A CA is added to the trusted ones, never dropped (a CA rotation trusts
both until the processes restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from pcache.common.credentials import check_private_path
from pcache.common.errors import InvalidArgument

logger = logging.getLogger(__name__)

CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"
RECHECK = 5.0  # seconds between a server's looks at its TLS directory
OLD_CHANNEL_GRACE = 300.0  # seconds a channel replaced after a reload lives on for the calls under way


def _stamp(directory: str) -> tuple:
    """What changes when a file of ``directory`` is replaced (a Secret volume swaps a symlink)."""
    out: list[tuple[int, int, int] | None] = []
    for name in (CA, CERT, KEY):
        try:
            st = os.stat(Path(directory) / name)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


@dataclass(eq=False)
class TLSConfig:
    """The PEM files of one process (``load``), read again by :meth:`reload` when they change."""

    ca: bytes
    cert: bytes = b""
    key: bytes = b""
    directory: str = ""
    generation: int = 0  # bumped at every reload that took new files
    stamp: tuple = ()
    _contexts: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)
    _failed: tuple = field(default=(), repr=False)  # the files whose reload failed last (logged once)
    _expires: float = field(default=0.0, repr=False)  # of the certificate ``_expires_of``
    _expires_of: bytes = field(default=b"", repr=False)

    @property
    def expires(self) -> float:
        """When the certificate expires, seconds since the epoch (0: no certificate or unreadable)."""
        if not self.cert:
            return 0.0
        if self._expires_of != self.cert:
            from cryptography import x509

            try:
                self._expires = x509.load_pem_x509_certificates(self.cert)[0].not_valid_after_utc.timestamp()
            except ValueError:
                self._expires = 0.0
            self._expires_of = self.cert
        return self._expires

    @classmethod
    def load(cls, directory: str, *, need_cert: bool) -> TLSConfig:
        """Read ``directory``'s ``ca.pem`` and, when present (or ``need_cert``), ``cert.pem`` and
        ``key.pem``.

        Raises:
            InvalidArgument: a file missing or unreadable, or a key readable by any user.
        """
        root = Path(directory)
        check_private_path(directory, "TLS directory")

        def read(name: str) -> bytes:
            try:
                return (root / name).read_bytes()
            except OSError as exc:
                raise InvalidArgument(f"TLS directory {directory}: cannot read {name}: {exc.strerror}") from exc

        stamp = _stamp(directory)
        ca = read(CA)
        if not need_cert and not (root / CERT).exists():
            return cls(ca=ca, directory=directory, stamp=stamp)
        if not (root / CERT).exists():
            raise InvalidArgument(f"TLS directory {directory} has no {CERT} (and {KEY}): a server presents one")
        try:
            if os.stat(root / KEY).st_mode & 0o007:
                raise InvalidArgument(f"TLS key {root / KEY} is readable by any user: chmod 600 it")
        except FileNotFoundError as exc:
            raise InvalidArgument(f"TLS directory {directory} has {CERT} but no {KEY}") from exc
        return cls(ca=ca, cert=read(CERT), key=read(KEY), directory=directory, stamp=stamp)

    def reload(self) -> bool:
        """Read the directory again if a file changed since it was read, and serve the new files
        from now on (see the module docstring). Returns whether it took new files.

        Raises:
            InvalidArgument: the new files cannot be read or do not load (a key that does not
                match the certificate), or the certificate is not valid now or not signed by a
                CA of the new ``ca.pem`` (a wrong or stale copy would cut every peer off); the
                ones in use stay.
        """
        stamp = _stamp(self.directory)
        if stamp == self.stamp:
            return False
        new = TLSConfig.load(self.directory, need_cert=bool(self.cert))
        if new.cert:
            _check_chain(self.directory, new.ca, new.cert)
        with _pem_files(new) as (cert, key):  # one copy: the probe loads what the contexts then load
            try:
                probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if new.cert else ssl.PROTOCOL_TLS_CLIENT)
                probe.load_verify_locations(cadata=new.ca.decode())
                if new.cert:
                    probe.load_cert_chain(cert, key)
            except (ssl.SSLError, ValueError) as exc:
                raise InvalidArgument(f"TLS directory {self.directory}: the new files do not load: {exc}") from exc
            self.ca, self.cert, self.key, self.stamp = new.ca, new.cert, new.key, new.stamp
            for ctx in list(self._contexts):
                ctx.load_verify_locations(cadata=self.ca.decode())
                if self.cert:
                    ctx.load_cert_chain(cert, key)
        self.generation += 1
        return True

    def reload_logged(self) -> bool:
        """:meth:`reload`, an error logged (once per change of the files) instead of raised."""
        try:
            changed = self.reload()
        except InvalidArgument as exc:
            stamp = _stamp(self.directory)
            if stamp != self._failed:
                self._failed = stamp
                logger.error("%s; keeping the certificate in use", exc)
            return False
        if changed:
            logger.info("TLS directory %s changed: its certificate is served from now on", self.directory)
        return changed

    # ---------------------------------------------------------------- gRPC --

    def grpc_server(self, *, client_auth: bool) -> grpc.ServerCredentials:
        """Server credentials presenting this certificate, the one :meth:`reload` took last at
        each new handshake; with ``client_auth`` a peer without a certificate of the CA is refused
        in the handshake."""
        if not self.cert:
            raise InvalidArgument(f"TLS directory {self.directory}: a server needs {CERT} and {KEY}")

        def config() -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.ca)

        served = [self.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:  # called by gRPC at each handshake
            if served[0] == self.generation:
                return None
            served[0] = self.generation
            return config()

        return grpc.dynamic_ssl_server_credentials(config(), fetch, require_client_authentication=client_auth)

    def grpc_channel(self) -> grpc.ChannelCredentials:
        """Channel credentials trusting only the CA (and presenting this certificate if any)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key or None, certificate_chain=self.cert or None
        )

    # --------------------------------------------------------- data plane --

    def server_context(self, *, client_auth: bool) -> ssl.SSLContext:
        """An ``ssl`` context for ``asyncio.start_server`` (TLS 1.2 at least)."""
        if not self.cert:
            raise InvalidArgument(f"TLS directory {self.directory}: a server needs {CERT} and {KEY}")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(ctx)
        ctx.load_verify_locations(cadata=self.ca.decode())
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth else ssl.CERT_NONE
        self._contexts.add(ctx)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """An ``ssl`` context for ``asyncio.open_connection``: the server must show a certificate
        of the CA naming the host it was dialled at."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cadata=self.ca.decode())
        if self.cert:
            self._load_chain(ctx)
        self._contexts.add(ctx)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        with _pem_files(self) as (cert, key):
            ctx.load_cert_chain(cert, key)


def _check_chain(directory: str, ca_pem: bytes, cert_pem: bytes) -> None:
    """Check that the first certificate of ``cert_pem`` is valid now and chains (through the
    others there) to a CA of ``ca_pem``.

    Raises:
        InvalidArgument: it does not, or a file does not parse.
    """
    from cryptography import x509

    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as exc:
        raise InvalidArgument(f"TLS directory {directory}: the new files do not parse: {exc}") from exc
    leaf, now = chain[0], datetime.datetime.now(datetime.UTC)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise InvalidArgument(
            f"TLS directory {directory}: the new {CERT} is not valid now"
            f" (from {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} to {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)"
        )

    def signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
        try:
            cert.verify_directly_issued_by(issuer)
        except Exception:  # noqa: BLE001 (another issuer, a bad signature, another key type: not this one)
            return False
        return True

    current, intermediates = leaf, chain[1:]
    for _ in range(len(chain)):
        if any(signed_by(current, ca) for ca in cas):
            return
        step = next((c for c in intermediates if signed_by(current, c)), None)
        if step is None:
            break
        current = step
    raise InvalidArgument(f"TLS directory {directory}: the new {CERT} is not signed by a CA of its {CA}")


@contextlib.contextmanager
def _pem_files(tls: TLSConfig) -> Iterator[tuple[str, str]]:
    """The certificate and key ``tls`` holds, as files in a private temporary directory (``ssl``
    loads a chain only from files: the ones read, not what the directory holds a moment later)."""
    with tempfile.TemporaryDirectory(prefix="pcache-tls-") as tmp:  # 0700
        root = Path(tmp)
        fd = os.open(root / KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(tls.key)
        (root / CERT).write_bytes(tls.cert)
        yield str(root / CERT), str(root / KEY)


def channel(address: str, tls: TLSConfig | None, options: list) -> grpc.aio.Channel:
    """A gRPC channel to ``address``: TLS with ``tls``, plaintext without."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.grpc_channel(), options=options)


async def close_later(channel: grpc.aio.Channel, delay: float = OLD_CHANNEL_GRACE) -> None:
    """Close a channel replaced after a reload once the calls under way on it had ``delay`` seconds."""
    await asyncio.sleep(delay)
    await channel.close()


def load_optional(directory: str, *, need_cert: bool) -> TLSConfig | None:
    """:meth:`TLSConfig.load`, or None for an empty ``directory`` (plaintext)."""
    return TLSConfig.load(directory, need_cert=need_cert) if directory else None


def make_local_tls(directory: str | Path, *, days: int = 30, extra_hosts: tuple[str, ...] = ()) -> Path:
    """Write a throw-away CA and one certificate (server and client use) signed by it into
    ``directory`` (0700; keys 0600), for a cluster on this machine. Returns the directory.

    A second call keeps what is there (the cluster's processes keep trusting it).
    """
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    if all((root / name).exists() for name in (CA, CERT, KEY)):
        return root
    ca = make_ca(days=days)
    write_tls_dir(root, ca.cert_pem, *issue_certificate(ca, ("localhost", "127.0.0.1", socket.gethostname(),
                                                             *extra_hosts), days=days))  # fmt: skip
    return root


@dataclass(frozen=True)
class LocalCA:
    """A CA made by :func:`make_ca`: its PEM certificate and its key (an ``ec`` private key)."""

    cert_pem: bytes
    key: Any  # cryptography's EllipticCurvePrivateKey
    name: Any  # its x509.Name


def make_ca(*, days: int = 30, common_name: str = "pcache local CA") -> LocalCA:
    """A new self-signed CA (ECDSA P-256) valid ``days`` days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    return LocalCA(ca.public_bytes(serialization.Encoding.PEM), ca_key, ca_name)


def issue_certificate(ca: LocalCA, hosts: tuple[str, ...], *, days: int = 30) -> tuple[bytes, bytes]:
    """A certificate for server and client use naming ``hosts`` (DNS names or IP addresses) in its
    SANs, signed by ``ca``: (certificate PEM, key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pcache")]))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(pem), key_pem


def write_tls_dir(directory: str | Path, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
    """Write a TLS directory's three files, each replaced whole (a rename: a process reading it
    meanwhile sees the old file or the new one), the key 0600."""
    from pcache.common.credentials import write_secret

    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, data in ((CA, ca_pem), (CERT, cert_pem)):
        tmp = root / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, root / name)
    write_secret(root / KEY, key_pem.decode())
