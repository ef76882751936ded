"""Test helpers for Babel that tests and benches import: an S3 proxy that injects faults and emulates OSS, an in-memory bucket."""

from babel.testing.bucket import MemoryBucket
from babel.testing.s3proxy import OPS, ProxyStats, S3Proxy, decode_aws_chunked

__all__ = ["OPS", "MemoryBucket", "ProxyStats", "S3Proxy", "decode_aws_chunked"]
