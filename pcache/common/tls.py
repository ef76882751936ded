"""Optional TLS for gRPC (masters, workers, clients) and the data plane (asyncio streams).

A *TLS directory* holds ``ca.pem`` (the cluster CA that signs every certificate), and, for a
process that presents a certificate, ``cert.pem`` and ``key.pem`` (0600). Masters and workers
always present theirs; with ``client_auth`` (the default) they also require one from every
peer, so masters and workers authenticate each other (mutual TLS) and a client needs a
certificate of the cluster CA besides its token. A connection from a certificate of another
CA, or in plaintext, fails its handshake.

:func:`make_local_tls` makes a throw-away CA and one certificate for ``pcache up --tls`` with the
``cryptography`` package (ECDSA P-256, the SANs ``localhost``, ``127.0.0.1`` and this host's name).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from pcache.common.credentials import check_private_path
from pcache.common.errors import InvalidArgument

CA, CERT, KEY = "ca.pem", "cert.pem", "key.pem"


@dataclass(frozen=True)
class TLSConfig:
    """The PEM files of one process, read once (``load``)."""

    ca: bytes
    cert: bytes = b""
    key: bytes = b""
    directory: str = ""

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

        ca = read(CA)
        if not need_cert and not (root / CERT).exists():
            return cls(ca=ca, directory=directory)
        if not (root / CERT).exists():
            raise InvalidArgument(f"TLS directory {directory} has no {CERT} (and {KEY}): a server presents one")
        try:
            if os.stat(root / KEY).st_mode & 0o007:
                raise InvalidArgument(f"TLS key {root / KEY} is readable by any user: chmod 600 it")
        except FileNotFoundError as exc:
            raise InvalidArgument(f"TLS directory {directory} has {CERT} but no {KEY}") from exc
        return cls(ca=ca, cert=read(CERT), key=read(KEY), directory=directory)

    # ---------------------------------------------------------------- gRPC --

    def grpc_server(self, *, client_auth: bool) -> grpc.ServerCredentials:
        """Server credentials presenting this certificate; with ``client_auth`` a peer without a
        certificate of the CA is refused in the handshake."""
        if not self.cert:
            raise InvalidArgument(f"TLS directory {self.directory}: a server needs {CERT} and {KEY}")
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=client_auth
        )

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
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """An ``ssl`` context for ``asyncio.open_connection``: the server must show a certificate
        of the CA naming the host it was dialled at."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cadata=self.ca.decode())
        if self.cert:
            self._load_chain(ctx)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        root = Path(self.directory)
        ctx.load_cert_chain(str(root / CERT), str(root / KEY))


def channel(address: str, tls: TLSConfig | None, options: list) -> grpc.aio.Channel:
    """A gRPC channel to ``address``: TLS with ``tls``, plaintext without."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.grpc_channel(), options=options)


def load_optional(directory: str, *, need_cert: bool) -> TLSConfig | None:
    """:meth:`TLSConfig.load`, or None for an empty ``directory`` (plaintext)."""
    return TLSConfig.load(directory, need_cert=need_cert) if directory else None


def make_local_tls(directory: str | Path, *, days: int = 30, extra_hosts: tuple[str, ...] = ()) -> Path:
    """Write a throw-away CA and one certificate (server and client use) signed by it into
    ``directory`` (0700; keys 0600), for a cluster on this machine. Returns the directory.

    A second call keeps what is there (the cluster's processes keep trusting it).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    if all((root / name).exists() for name in (CA, CERT, KEY)):
        return root
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pcache local CA")])
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
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for host in (socket.gethostname(), *extra_hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pcache")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    private = serialization.PrivateFormat.PKCS8
    from pcache.common.credentials import write_secret

    (root / CA).write_bytes(ca.public_bytes(pem))
    (root / CERT).write_bytes(cert.public_bytes(pem))
    write_secret(root / KEY, key.private_bytes(pem, private, serialization.NoEncryption()).decode())
    return root
