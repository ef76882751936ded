"""S3 on loopback: moto's ThreadedMotoServer, and local directories, as Babel backends."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.s3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on loopback (fake credentials in the environment)."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


_buckets = iter(range(1_000_000))


@pytest.fixture
def s3_uri(moto_endpoint) -> str:
    """A fresh bucket: ``s3://bucket-N/data?endpoint_url=...``."""
    import boto3

    bucket = f"bucket-{next(_buckets)}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/data?endpoint_url={moto_endpoint}"
