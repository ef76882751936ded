"""``s3://bucket/prefix`` through aiobotocore (any S3-compatible store).

URI options as query parameters: ``endpoint_url``, ``region``, ``profile``
(``s3://b/p?endpoint_url=http://127.0.0.1:9000``); credentials come from the
usual AWS chain. Every call has connect/read timeouts, and botocore's
standard retry mode backs off on throttling and transient errors; what is
left is mapped to Babel's error tree by :data:`ERRORS_BY_CODE`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from babel.backends.base import ListPage, ObjectInfo, PartInfo, StoreLimits
from babel.errors import (
    AccessDenied,
    BabelError,
    NoSuchBucket,
    NoSuchKey,
    NoSuchUpload,
    Throttled,
    TransientError,
)

ERRORS_BY_CODE: dict[str, type[BabelError]] = {
    "NoSuchBucket": NoSuchBucket,
    "NoSuchKey": NoSuchKey,
    "NoSuchUpload": NoSuchUpload,
    "404": NoSuchKey,
    "NotFound": NoSuchKey,
    "AccessDenied": AccessDenied,
    "403": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "SlowDown": Throttled,
    "Throttling": Throttled,
    "ThrottlingException": Throttled,
    "RequestLimitExceeded": Throttled,
    "503": Throttled,
    "InternalError": TransientError,
    "500": TransientError,
}


def translate(exc: Exception, uri: str) -> BabelError:
    """Map a botocore failure to the Babel error it stands for."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        cls = ERRORS_BY_CODE.get(code) or ERRORS_BY_CODE.get(str(status))
        if cls is None:
            cls = TransientError if status >= 500 else BabelError
        return cls(f"{code or status}: {err.get('Message', '')}".rstrip(": "), uri=uri)
    if isinstance(exc, EndpointConnectionError | BotoCoreError):
        return TransientError(f"{type(exc).__name__}: {exc}", uri=uri)
    return BabelError(f"{type(exc).__name__}: {exc}", uri=uri)


class S3Store:
    """Object store on one bucket and key prefix of an S3-compatible service."""

    def __init__(self, uri: str, bucket: str, prefix: str, options: dict[str, str]) -> None:
        self.uri = uri
        self.bucket = bucket
        self.base = prefix  # keys are relative to it
        self.options = options
        self.limits = StoreLimits()
        self._client: Any = None
        self._stack = contextlib.AsyncExitStack()

    async def _c(self) -> Any:
        if self._client is None:
            session = get_session()
            if self.options.get("profile"):
                session.set_config_variable("profile", self.options["profile"])
            config = AioConfig(
                connect_timeout=float(self.options.get("connect_timeout", 10)),
                read_timeout=float(self.options.get("read_timeout", 60)),
                retries={"mode": "standard", "max_attempts": int(self.options.get("max_attempts", 5))},
                max_pool_connections=int(self.options.get("max_pool_connections", 64)),
            )
            self._client = await self._stack.enter_async_context(
                session.create_client(
                    "s3",
                    endpoint_url=self.options.get("endpoint_url"),
                    region_name=self.options.get("region", "us-east-1"),
                    config=config,
                )
            )
        return self._client

    def _key(self, key: str) -> str:
        return self.base + key

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        client = await self._c()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix), "MaxKeys": max_keys}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        try:
            resp = await client.list_objects_v2(**kwargs)
        except Exception as exc:
            raise translate(exc, self.uri) from None
        cut = len(self.base)
        objects = [
            ObjectInfo(o["Key"][cut:], o["Size"], o["LastModified"].timestamp(), o.get("ETag", "").strip('"'))
            for o in resp.get("Contents", [])
        ]
        prefixes = [p["Prefix"][cut:] for p in resp.get("CommonPrefixes", [])]
        return ListPage(objects, prefixes, bool(resp.get("IsTruncated")))

    async def head(self, key: str) -> ObjectInfo:
        client = await self._c()
        try:
            resp = await client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None
        return ObjectInfo(
            key, resp["ContentLength"], resp["LastModified"].timestamp(), resp.get("ETag", "").strip('"'),
            dict(resp.get("Metadata", {})), self._checksums(resp),
        )  # fmt: skip

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        client = await self._c()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            kwargs["Range"] = f"bytes={offset}-{end}"
        try:
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as body:
                return await body.read()
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        client = await self._c()
        try:
            resp = await client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, Metadata=metadata or {})
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None
        return ObjectInfo(
            key, len(data), 0.0, resp.get("ETag", "").strip('"'), dict(metadata or {}), self._checksums(resp)
        )

    async def create_multipart(self, key: str, size: int, part_size: int, metadata: dict[str, str]) -> str:
        client = await self._c()
        try:
            resp = await client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key), Metadata=metadata)
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None
        return resp["UploadId"]

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
        client = await self._c()
        try:
            resp = await client.upload_part(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id, PartNumber=number, Body=data
            )
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None
        return PartInfo(number, len(data), resp.get("ETag", "").strip('"'), self._checksums(resp))

    async def complete_multipart(self, key: str, upload_id: str, parts: list[PartInfo]) -> ObjectInfo:
        client = await self._c()
        ordered = sorted(parts, key=lambda p: p.number)
        try:
            resp = await client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": f'"{p.etag}"'} for p in ordered]},
            )
        except Exception as exc:
            raise translate(exc, f"{self.uri}/{key}") from None
        size = sum(p.size for p in ordered)
        return ObjectInfo(key, size, 0.0, resp.get("ETag", "").strip('"'), {}, self._checksums(resp))

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        client = await self._c()
        try:
            await client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        except Exception as exc:
            err = translate(exc, f"{self.uri}/{key}")
            if not isinstance(err, NoSuchKey | NoSuchUpload):
                raise err from None

    def _checksums(self, resp: dict[str, Any]) -> dict[str, str]:
        """The store's own checksums in a response (none on plain S3; OSS adds CRC64)."""
        return {}

    async def delete(self, keys: list[str]) -> None:
        client = await self._c()
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            try:
                resp = await client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as exc:
                raise translate(exc, self.uri) from None
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise BabelError(f"{len(errors)} deletions failed, first: {errors[0]}", uri=self.uri)

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None
