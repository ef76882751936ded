"""``oss://bucket/prefix``: Alibaba Cloud OSS through its S3-compatible API.

``oss://bucket/prefix?endpoint_url=https://oss-cn-hangzhou.aliyuncs.com&region=oss-cn-hangzhou``,
or only ``?region=oss-cn-hangzhou`` (the endpoint is then ``https://REGION.aliyuncs.com``);
the other options are :mod:`objstore.s3`'s. Credentials come from the AWS chain: an OSS
AccessKey pair as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``.

What differs from S3:

* **CRC-64.** OSS computes the CRC-64/XZ ("CRC64-ECMA") of everything it stores and reports
  it as the decimal header ``x-oss-hash-crc64ecma`` on PutObject, UploadPart (the part's),
  CompleteMultipartUpload (the parts' combined) and HeadObject. :meth:`OSSStore._checksums`
  returns it as ``{"crc64ecma": "<decimal>"}`` in ``ObjectInfo.checksums`` and
  ``PartInfo.checksums``, to check against :func:`babel.checksum.crc64ecma`. That covers every
  upload end to end, so no ``x-amz-checksum-crc32`` is sent by default (``checksum=none``;
  ``checksum=crc32`` turns it on where the endpoint honours it).
* **Limits.** Parts of 100 KiB to 5 GiB (the last may be smaller), at most 10,000 of them.
* **Addressing.** OSS serves buckets as virtual hosts only (a path-style request is refused
  with ``SecondLevelDomainForbidden``), so ``addressing_style`` defaults to ``virtual``.
  botocore still addresses an IP-address endpoint path-style, which is how the emulator
  (:class:`babel.testing.S3Proxy` with ``oss=True``, on ``127.0.0.1``) is reached.
"""

from __future__ import annotations

from typing import Any

from objstore.base import GiB, StoreLimits, delete_after_head
from objstore.errors import BadURI
from objstore.s3 import S3Store

KiB = 1 << 10
OSS_CRC64_HEADER = "x-oss-hash-crc64ecma"
OSS_LIMITS = StoreLimits(min_part_size=100 * KiB, max_part_size=5 * GiB, max_parts=10_000)


class OSSStore(S3Store):
    """Object store on one bucket and key prefix of Alibaba Cloud OSS."""

    default_checksum = "none"
    default_addressing_style = "virtual"
    fast_path = False  # OSS's own headers (CRC-64) and signing quirks: every request on aiobotocore

    def __init__(self, uri: str, bucket: str, prefix: str, options: dict[str, str]) -> None:
        """Raises BadURI without an ``endpoint_url`` or an OSS ``region`` (``oss-cn-hangzhou``)."""
        if not options.get("endpoint_url") and not options.get("region", "").startswith("oss-"):
            raise BadURI("oss:// URIs need ?endpoint_url=https://... or ?region=oss-<region>", uri=uri)
        super().__init__(uri, bucket, prefix, options)
        self.limits = OSS_LIMITS

    async def delete_if(self, key: str, etag: str) -> bool:
        """OSS's DeleteObject takes no ``If-Match``: HEAD first (:func:`objstore.base.delete_after_head`)."""
        return await delete_after_head(self, key, etag)

    def endpoint_url(self) -> str | None:
        return self.options.get("endpoint_url") or f"https://{self.options['region']}.aliyuncs.com"

    def _checksums(self, resp: dict[str, Any]) -> dict[str, str]:
        """``{"crc64ecma": "<decimal>"}`` from the response's ``x-oss-hash-crc64ecma`` header, if any."""
        value = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(OSS_CRC64_HEADER)
        return {"crc64ecma": value} if value else {}
