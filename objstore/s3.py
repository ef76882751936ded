"""``s3://bucket/prefix`` (any S3-compatible store): single-object requests (HEAD, GET, PutObject)
through ``obstore`` (:mod:`objstore.s3fast`, a sixth of the CPU per request), listing,
multipart uploads and deletes through aiobotocore.

URI options as query parameters (``s3://b/p?endpoint_url=http://127.0.0.1:9000``):

* ``endpoint_url``, ``region``, ``profile``; ``credentials_file``: an AWS shared-credentials
  file to read instead of ``~/.aws/credentials`` (a mounted Secret; ``profile`` picks its
  section); ``ca_bundle``: a PEM file of CAs to trust for https (an on-premises store's own CA);
* ``addressing_style``: ``auto`` (default), ``path`` or ``virtual``;
* ``checksum``: ``crc32`` (default) or ``none``, see below;
* ``provider``: ``rclone``, see below;
* ``connect_timeout`` / ``read_timeout`` (seconds; read: the longest wait for the next bytes),
  ``request_timeout`` (seconds, the longest a whole obstore request may take; 600), ``max_attempts`` (tries in all,
  the first included; 5), ``max_pool_connections``.

Credentials come from the usual AWS chain (never from the URI itself). Every call has connect/read timeouts,
and botocore's standard retry mode backs off on throttling and transient errors;
what is left is mapped to the error tree of :mod:`objstore.errors` by :data:`ERRORS_BY_CODE`.

What follows was found running the conformance suite on a second S3
implementation, rclone ``serve s3`` v1.75, with botocore 1.43 / aiobotocore 3.10.

Integrity checksums (of the aiobotocore requests: multipart parts, and what
:mod:`objstore.s3fast` hands back; obstore's PutObject carries a SHA-256). botocore >= 1.36 defaults to
``request_checksum_calculation=when_supported``: a CRC32 of every PutObject /
UploadPart body, sent over http as an ``x-amz-checksum-crc32`` header but over
https as an ``aws-chunked`` body with a trailer, which aiohttp sends with
``Transfer-Encoding: chunked`` and no Content-Length. Servers that want a
Content-Length refuse it (rclone ``serve s3``: ``MissingContentLength``). So this backend
turns botocore's own choice off (``when_required``) and computes the CRC32
itself: the body is in memory anyway, and a precomputed checksum always travels
as a header, never as a trailer. AWS verifies it; rclone stores and echoes it
without verifying (moto too). ``checksum=none`` sends none, for servers that reject
``x-amz-checksum-*`` headers. With the CRC32 header (signed) a body goes as
``UNSIGNED-PAYLOAD`` (``payload_signing_enabled=False``): botocore's choice over https,
here over http too, where it would otherwise SHA-256 every byte for the signature
(0.18 s of CPU per 256 MiB); with ``checksum=none`` the payload stays signed.

The same botocore default validates ``x-amz-checksum-*`` response headers of
every GET. rclone returns the whole object's stored CRC32 on a *ranged* GET
too, so the 4 bytes of ``bytes=3-6`` fail validation against it
(``FlexibleChecksumError``). Validation is therefore ``when_required`` too, and
whole-object GETs ask for it (``ChecksumMode=ENABLED``): the same checks as
botocore's default on AWS, which never returns a checksum for a range. Objects
assembled from parts carry a checksum of checksums (``...-N``), which botocore
skips.

``Expect: 100-continue``. botocore asks for it on every PutObject and
UploadPart; when a server answers such a request with a final error *before*
reading the body and closes the connection (rclone's ``400 InvalidArgument``
for a key it cannot map to a path), aiohttp 3.14 waits for the ``100
Continue`` forever, past ``read_timeout``. The header is dropped before
sending: a rejected upload then costs its body's transfer, not a hung task.

Keys. rclone ``serve s3`` stores objects as files: a key ending in ``/`` silently names the same
file as the key without it (``dir/`` overwrites ``dir``), and ``a//b``, ``./``
and ``../`` segments or a leading ``/`` are refused with ``400``.
``provider=rclone`` makes this backend refuse such keys itself, as ``file://``
does (:class:`~objstore.errors.BadURI`), before they alias or reach the server.
Other rclone traits that need nothing here: user metadata is kept in the
server's memory only (lost on restart; at most ``--metadata-max-objects``);
names starting with ``.rclone_temp_`` are hidden from listings; any delimiter
is treated as ``/`` (Babel only uses ``/``); parts arriving out of order are
buffered in memory up to ``--multipart-streaming-buffer-limit`` (256 MiB per
upload by default) and later ones wait; the ETag of a multipart object is
S3's ``MD5-of-part-MD5s-N`` in the CompleteMultipartUpload answer but the MD5 of
the whole object in HEAD; DeleteObjects, StartAfter, paging and
Unicode keys behave as on AWS.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import functools
import logging
import os
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import botocore.handlers
from aiobotocore.config import AioConfig
from aiobotocore.parsers import AioResponseParserFactory, AioRestXMLParser
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    FlexibleChecksumError,
    NoCredentialsError,
    ParamValidationError,
)
from botocore.loaders import Loader, create_loader
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from objstore import s3fast
from objstore.base import ListPage, ObjectInfo, PartInfo, StoreLimits, object_uri
from objstore.errors import (
    ERRORS_BY_CODE,
    AccessDenied,
    BadURI,
    Corrupt,
    NoSuchKey,
    NoSuchUpload,
    PreconditionFailed,
    StoreError,
    TransientError,
)
from objstore.retry import with_retries
from objstore.tree import check_key

T = TypeVar("T")

logger = logging.getLogger(__name__)


def translate(exc: Exception, uri: str) -> StoreError:
    """Map a botocore failure to the store error it stands for (ours pass through).

    The store's request id (``ResponseMetadata.RequestId``) goes with it, as s3fs keeps it;
    callers raise the result ``from exc`` so the botocore error stays its cause.
    """
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        code = str(err.get("Code", ""))
        status = meta.get("HTTPStatusCode", 0)
        cls = ERRORS_BY_CODE.get(code) or ERRORS_BY_CODE.get(str(status))
        if cls is None:
            cls = TransientError if status >= 500 else StoreError
        request_id = str(meta.get("RequestId") or meta.get("HTTPHeaders", {}).get("x-oss-request-id", ""))
        return cls(f"{code or status}: {err.get('Message', '')}".rstrip(": "), uri=uri, request_id=request_id)
    if isinstance(exc, NoCredentialsError):  # no retry can help: say so at once
        return AccessDenied(f"no credentials ({exc}): set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or profile=", uri=uri)
    if isinstance(exc, ParamValidationError):  # e.g. metadata that is not ASCII: no retry can help
        return StoreError(f"{type(exc).__name__}: {exc}".strip(), uri=uri)
    if isinstance(exc, FlexibleChecksumError):
        return Corrupt(f"{type(exc).__name__}: {exc}", uri=uri)
    if isinstance(exc, EndpointConnectionError | BotoCoreError):
        return TransientError(f"{type(exc).__name__}: {exc}", uri=uri)
    return StoreError(f"{type(exc).__name__}: {exc}", uri=uri)


CHECKSUMS = ("crc32", "none")
PROVIDERS = ("rclone",)
ADDRESSING_STYLES = ("auto", "path", "virtual")


def crc32_header(data: bytes) -> str:
    """The ``x-amz-checksum-crc32`` value of ``data``: its CRC32, big-endian, base64."""
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def parse_timestamp(value: Any) -> datetime:
    """A response's timestamp (ListObjectsV2's ISO 8601 ``LastModified``, a header's RFC 822
    date) as an aware datetime: botocore's default parser (dateutil) took 0.8 ms per listed key,
    most of a listing's CPU; this takes 1 µs, falling back to botocore's for anything else."""
    parsed: datetime | None = None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            with contextlib.suppress(TypeError, ValueError):
                parsed = email.utils.parsedate_to_datetime(value)
    if parsed is None:
        return botocore_parse_timestamp(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)  # UTC, as botocore reads it


_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_LIST_INTS = frozenset({"MaxKeys", "KeyCount", "Size"})


class FastListParser(AioRestXMLParser):
    """botocore's REST-XML parser with ListObjectsV2 answers read straight from the XML.

    botocore walks its shape model for every element: ~42 µs of CPU per listed key (a 1,000-key
    page: 42 ms), most of a large listing's cost. This reads the same fields with ElementTree
    (~8 µs per key) into the same dict (``Contents``: ``Key``, ``LastModified`` as a datetime,
    ``Size`` as int, ``ETag``, ``StorageClass``, ...; ``CommonPrefixes``; ``IsTruncated``;
    ``EncodingType``, so botocore's handler still URL-decodes the keys). Anything else, an error
    answer, or XML it cannot read goes through botocore's own parsing.
    """

    def _add_modeled_parse(self, response: dict[str, Any], shape: Any, final_parsed: dict[str, Any]) -> Any:
        if shape is not None and shape.name == "ListObjectsV2Output" and response.get("body"):
            try:
                final_parsed.update(self._list_v2(response["body"]))
                return final_parsed
            except (ET.ParseError, ValueError, TypeError):
                pass  # botocore's parser reads it, or raises its own error
        return super()._add_modeled_parse(response, shape, final_parsed)

    def _list_v2(self, body: bytes) -> dict[str, Any]:
        root = ET.fromstring(body)
        if root.tag not in (_S3_NS + "ListBucketResult", "ListBucketResult"):
            raise ValueError(f"not a ListBucketResult: {root.tag}")
        out: dict[str, Any] = {}
        contents: list[dict[str, Any]] = []
        prefixes: list[dict[str, str]] = []
        for node in root:
            tag = node.tag.rpartition("}")[2]
            if tag == "Contents":
                item: dict[str, Any] = {}
                for field in node:
                    name = field.tag.rpartition("}")[2]
                    text = field.text or ""
                    if name == "LastModified":
                        item[name] = parse_timestamp(text)
                    elif name in _LIST_INTS:
                        item[name] = int(text)
                    elif name == "ChecksumAlgorithm":  # a flattened list
                        item.setdefault(name, []).append(text)
                    elif len(field) == 0:
                        item[name] = text
                contents.append(item)
            elif tag == "CommonPrefixes":
                for field in node:
                    if field.tag.rpartition("}")[2] == "Prefix":
                        prefixes.append({"Prefix": field.text or ""})
            elif tag == "IsTruncated":
                out[tag] = (node.text or "").strip().lower() == "true"
            elif tag in _LIST_INTS:
                out[tag] = int(node.text or 0)
            elif len(node) == 0:
                out[tag] = node.text or ""
        if contents:
            out["Contents"] = contents
        if prefixes:
            out["CommonPrefixes"] = prefixes
        return out


def _handle_200_error(operation_model: Any, response_dict: dict[str, Any], **kwargs: Any) -> None:
    """``before-parse`` hook in place of botocore's check for an error inside a ``200`` answer,
    which parses every body a second time (a 1,000-key listing page: ~9 ms of CPU): a
    ListObjectsV2 body that ends with its closing tag is complete and not an ``<Error>`` document.
    Everything else is checked by botocore's hook (a cut or error answer becomes a retried 500)."""
    if operation_model.name == "ListObjectsV2" and response_dict.get("status_code") == 200:
        body = response_dict.get("body")
        if isinstance(body, bytes) and body.rstrip().endswith(b"</ListBucketResult>"):
            return
    botocore.handlers._handle_200_error(operation_model, response_dict, **kwargs)


class FastParserFactory(AioResponseParserFactory):
    """Creates :class:`FastListParser` for S3's REST-XML protocol."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "rest-xml":
            return FastListParser(**self._defaults)
        return super().create_parser(protocol_name)


def _drop_expect(request: Any, **kwargs: Any) -> None:
    """``before-send`` hook: no ``Expect: 100-continue`` (see the module docstring)."""
    request.headers.pop("Expect", None)


@functools.cache
def _shared_loader() -> Loader:
    """One botocore data loader for every client of the process.

    A loader caches the service models it has read (S3's API, endpoint rules, partitions: ~1 MB
    of JSON, ~0.1 s of CPU to parse); each botocore session makes its own, so without this every
    store would parse them again (a sync opens at least two).
    """
    return create_loader()


class S3Store:
    """Object store on one bucket and key prefix of an S3-compatible service."""

    default_checksum = "crc32"
    default_addressing_style = "auto"
    #: single-object requests through obstore (:mod:`objstore.s3fast`)
    fast_path = True
    #: ranged GETs through obstore too (off once a server answers a range with 200)
    fast_ranged_gets = True
    #: a whole GET's bytes are checked against an MD5-shaped ETag (off once the store's are not MD5s)
    etags_are_md5 = True

    def __init__(self, uri: str, bucket: str, prefix: str, options: dict[str, str]) -> None:
        """Raises BadURI for an unknown ``checksum``, ``provider`` or ``addressing_style``."""
        self.uri = uri
        self.bucket = bucket
        self.base = prefix  # keys are relative to it
        self.options = options
        self.limits = StoreLimits()
        self.checksum = options.get("checksum", self.default_checksum)
        self.provider = options.get("provider", "")
        self.addressing_style = options.get("addressing_style", self.default_addressing_style)
        for name, value, allowed in (
            ("checksum", self.checksum, CHECKSUMS),
            ("provider", self.provider, ("", *PROVIDERS)),
            ("addressing_style", self.addressing_style, ADDRESSING_STYLES),
        ):
            if value not in allowed:
                raise BadURI(f"{name}={value!r} is not one of {', '.join(a for a in allowed if a)}", uri=uri)
        endpoint = options.get("endpoint_url")
        if endpoint is not None:
            parts = urlsplit(endpoint)
            try:
                parts.port  # noqa: B018 - raises ValueError for a bad port
            except ValueError as exc:
                raise BadURI(f"endpoint_url={endpoint!r}: {exc}", uri=uri) from exc
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise BadURI(f"endpoint_url={endpoint!r} is not an http:// or https:// URL", uri=uri)
        if (self.addressing_style == "virtual" and endpoint is not None) or options.get("ca_bundle"):
            # a virtual-hosted bucket on a custom endpoint (botocore's URLs), or a private CA
            # (rustls refused rclone's self-signed certificate that Python's ssl takes)
            self.fast_path = False
        self.keys_are_paths = self.provider == "rclone"  # keys are file paths on the server
        self.retries = 0  # requests sent again (throttling, 5xx, resets), by botocore or _retrying
        self._client: Any = None
        self._session: Any = None
        self._obstore: Any = None  # the obstore client (objstore.s3fast)
        self._creds: s3fast.Credentials | None = None  # what it signs with
        self._stack = contextlib.AsyncExitStack()

    async def _c(self) -> Any:
        """The aiobotocore client, made on first use.

        botocore wraps a ``bytes`` body of PutObject/UploadPart in a ``BytesIO`` (to seek it for
        hashing and retries); aiohttp then copies it whole (``getbuffer`` unshares it) and again
        in 256 KiB reads. Here the body stays ``bytes``: retries resend the same object, the CRC32
        header is computed before, and aiohttp hands it to the socket without a copy.
        """
        if self._client is None:
            session = self._session = get_session()
            session.register_component("data_loader", _shared_loader())
            session.unregister("before-parse.s3.*", botocore.handlers._handle_200_error)
            session.get_component("event_emitter").register_first("before-parse.s3.*", _handle_200_error)
            factory = FastParserFactory()
            factory.set_parser_defaults(timestamp_parser=parse_timestamp)
            session.register_component("response_parser_factory", factory)
            if self.options.get("profile"):
                session.set_config_variable("profile", self.options["profile"])
            if self.options.get("credentials_file"):
                named = self.options["credentials_file"]
                if not os.path.isfile(named):
                    raise AccessDenied(f"credentials_file {named} is not a file on this host", uri=self.uri)
                session.set_config_variable("credentials_file", named)
                # a profile set here makes botocore skip the environment's keys: the file named is
                # what signs (with the file alone, AWS_ACCESS_KEY_ID would win, silently)
                session.set_config_variable("profile", self.options.get("profile") or "default")
            plain_http = (self.endpoint_url() or "").startswith("http://")
            config = AioConfig(
                connect_timeout=float(self.options.get("connect_timeout", 10)),
                read_timeout=float(self.options.get("read_timeout", 60)),
                # total_max_attempts counts the first try; botocore's "max_attempts" key counts retries only
                retries={"mode": "standard", "total_max_attempts": int(self.options.get("max_attempts", 5))},
                max_pool_connections=int(self.options.get("max_pool_connections", 64)),
                request_checksum_calculation="when_required",  # CRC32 computed here, as a header
                response_checksum_validation="when_required",  # asked for on whole-object GETs
                # bodies we send carry a signed x-amz-checksum-crc32 header: no SHA-256 of every byte
                # of them for the signature (botocore hashes the payload of every request on http://)
                s3={"addressing_style": self.addressing_style}
                | ({"payload_signing_enabled": False} if self.checksum == "crc32" else {}),
            )
            client = await self._stack.enter_async_context(
                session.create_client(
                    "s3",
                    endpoint_url=self.endpoint_url(),
                    region_name=self.options.get("region", "us-east-1"),
                    # no TLS to a plain-http endpoint: skip loading the CA store for it
                    verify=False if plain_http else self.options.get("ca_bundle"),
                    config=config,
                )
            )
            client.meta.events.register_last("before-send.s3", _drop_expect)
            for op in ("PutObject", "UploadPart"):  # bytes go to aiohttp as they are (see _c's docstring)
                client.meta.events.unregister(
                    f"before-parameter-build.s3.{op}", botocore.handlers.convert_body_to_file_like_object
                )
            client.meta.events.register("after-call.s3", self._count_retries)
            self._client = client
        return self._client

    def _count_retries(self, parsed: dict[str, Any] | None = None, **_: Any) -> None:
        self.retries += int(((parsed or {}).get("ResponseMetadata") or {}).get("RetryAttempts", 0))

    def endpoint_url(self) -> str | None:
        """The endpoint the client talks to (None: AWS's, from the region)."""
        return self.options.get("endpoint_url")

    def _key(self, key: str) -> str:
        """The bucket key of ``key``; refuses keys a path-keyed server would alias (``provider=rclone``)."""
        if self.keys_are_paths:
            check_key(key, object_uri(self.uri, key))
        return self.base + key

    def _body_checksum(self, data: bytes) -> dict[str, str]:
        return {"ChecksumCRC32": crc32_header(data)} if self.checksum == "crc32" else {}

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        client = await self._c()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.base + prefix, "MaxKeys": max_keys}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after:
            kwargs["StartAfter"] = self.base + start_after
        try:
            resp = await client.list_objects_v2(**kwargs)
        except Exception as exc:
            raise translate(exc, self.uri) from exc
        cut = len(self.base)
        objects = [
            ObjectInfo(o["Key"][cut:], o["Size"], o["LastModified"].timestamp(), o.get("ETag", "").strip('"'))
            for o in resp.get("Contents", [])
        ]
        prefixes = [p["Prefix"][cut:] for p in resp.get("CommonPrefixes", [])]
        return ListPage(objects, prefixes, bool(resp.get("IsTruncated")))

    async def head(self, key: str) -> ObjectInfo:
        if (fast := await self._fast(key)) is not None:
            client, bucket_key = fast
            with contextlib.suppress(s3fast.NotAPath):
                return await self._retrying(lambda: s3fast.head(client, bucket_key, key, object_uri(self.uri, key)))
        client = await self._c()
        try:
            resp = await client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise translate(exc, object_uri(self.uri, key)) from exc
        return ObjectInfo(
            key, resp["ContentLength"], resp["LastModified"].timestamp(), resp.get("ETag", "").strip('"'),
            dict(resp.get("Metadata", {})), self._checksums(resp),
        )  # fmt: skip

    async def get(self, key: str, offset: int = 0, length: int | None = None, *, if_match: str = "") -> bytes:
        return (await self._get(key, offset, length, if_match))[0]

    async def get_with_metadata(self, key: str) -> tuple[bytes, dict[str, str]]:
        """A whole object and its user metadata, in one GET (a copy carries the metadata on).

        Raises:
            NoSuchKey, NoSuchBucket, AccessDenied, Throttled, TransientError, StoreError.
        """
        return await self._get(key, 0, None, "")

    async def _get(self, key: str, offset: int, length: int | None, if_match: str) -> tuple[bytes, dict[str, str]]:
        """A GET through obstore where it can name the key and the server honours ranges, else
        aiobotocore; a whole object read through obstore is checked against an MD5 ETag
        (:mod:`objstore.s3fast`, "Download check")."""
        whole = offset == 0 and length is None
        if (whole or self.fast_ranged_gets) and (fast := await self._fast(key)) is not None:
            client, bucket_key = fast
            where = object_uri(self.uri, key)
            try:
                data, metadata, etag = await self._retrying(
                    lambda: s3fast.get(client, bucket_key, offset, length, if_match, where)
                )
            except s3fast.NotAPath:
                pass  # a key the Rust client's paths cannot name: botocore's request below
            except s3fast.NotPartial:  # rclone serve s3 answers a range with 200 (and Content-Range)
                self.fast_ranged_gets = False
            else:
                if not (whole and self.etags_are_md5 and s3fast.etag_matches(data, etag) is False):
                    return data, metadata
                return await self._get_again(key, if_match or etag, data)
        return await self._get_object(key, offset, length, if_match)

    async def _get_again(self, key: str, etag: str, first: bytes) -> tuple[bytes, dict[str, str]]:
        """The whole object through aiobotocore (its stored CRC32 checked) after obstore's bytes
        did not match the ETag: the store's ETags are no MD5s when these do not match it either."""
        data, metadata = await self._get_object(key, 0, None, etag)
        if s3fast.etag_matches(data, etag) is False:
            self.etags_are_md5 = False
            logger.info("%s: ETags are not MD5s of the content; whole GETs are not checked against them", self.uri)
        elif data != first:
            logger.warning("%s: a GET returned bytes not matching the ETag; read again", object_uri(self.uri, key))
        return data, metadata

    async def _get_object(
        self, key: str, offset: int, length: int | None, if_match: str
    ) -> tuple[bytes, dict[str, str]]:
        """One GetObject through botocore: the bytes and the object's user metadata."""
        client = await self._c()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if if_match:
            kwargs["IfMatch"] = if_match if if_match.startswith('"') else f'"{if_match}"'
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            kwargs["Range"] = f"bytes={offset}-{end}"
        elif self.checksum == "crc32":
            kwargs["ChecksumMode"] = "ENABLED"  # whole objects only: a range has no checksum of its own
        try:
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as body:
                return await body.read(), dict(resp.get("Metadata", {}))
        except Exception as exc:
            raise translate(exc, object_uri(self.uri, key)) from exc

    async def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> ObjectInfo:
        metadata = dict(metadata or {})
        if s3fast.plain_metadata(metadata) and (fast := await self._fast(key)) is not None:
            client, bucket_key = fast
            with contextlib.suppress(s3fast.NotAPath):
                etag = await self._retrying(
                    lambda: s3fast.put(client, bucket_key, data, metadata, object_uri(self.uri, key))
                )
                return ObjectInfo(key, len(data), 0.0, etag, metadata)
        client = await self._c()
        try:
            resp = await client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, Metadata=metadata, **self._body_checksum(data)
            )
        except Exception as exc:
            raise translate(exc, object_uri(self.uri, key)) from exc
        return ObjectInfo(key, len(data), 0.0, resp.get("ETag", "").strip('"'), metadata, self._checksums(resp))

    async def create_multipart(self, key: str, size: int, part_size: int, metadata: dict[str, str]) -> str:
        client = await self._c()
        try:
            resp = await client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key), Metadata=metadata)
        except Exception as exc:
            raise translate(exc, object_uri(self.uri, key)) from exc
        return resp["UploadId"]

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
        client = await self._c()
        try:
            resp = await client.upload_part(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id, PartNumber=number, Body=data,
                **self._body_checksum(data),
            )  # fmt: skip
        except Exception as exc:
            raise translate(exc, object_uri(self.uri, key)) from exc
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
            raise translate(exc, object_uri(self.uri, key)) from exc
        size = sum(p.size for p in ordered)
        return ObjectInfo(key, size, 0.0, resp.get("ETag", "").strip('"'), {}, self._checksums(resp))

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        client = await self._c()
        try:
            await client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        except Exception as exc:
            err = translate(exc, object_uri(self.uri, key))
            if not isinstance(err, NoSuchKey | NoSuchUpload):
                raise err from exc

    def _checksums(self, resp: dict[str, Any]) -> dict[str, str]:
        """The store's own checksums in a response (none on plain S3; OSS adds CRC64)."""
        return {}

    async def delete_if(self, key: str, etag: str) -> bool:
        """Delete ``key`` only while its ETag is ``etag``: a HEAD, then DeleteObject with
        ``If-Match`` (S3 answers 412 to another version; servers that ignore the header, as
        ``rclone serve s3`` does, are still kept from deleting a version the HEAD saw). True when
        deleted or gone, False when the store holds another version. See
        :func:`objstore.base.delete_if`.

        Raises:
            NoSuchBucket, AccessDenied, Throttled, TransientError, StoreError.
        """
        try:
            if (await self.head(key)).etag.strip('"') != etag.strip('"'):
                return False
        except NoSuchKey:
            return True
        client = await self._c()
        try:
            await client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=f'"{etag.strip(chr(34))}"')
        except Exception as exc:
            err = translate(exc, object_uri(self.uri, key))
            if isinstance(err, NoSuchKey):
                return True
            if isinstance(err, PreconditionFailed):
                return False
            raise err from exc
        return True

    async def delete(self, keys: list[str]) -> None:
        client = await self._c()
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            try:
                resp = await client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as exc:
                raise translate(exc, self.uri) from exc
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise StoreError(f"{len(errors)} deletions failed, first: {errors[0]}", uri=self.uri)

    async def _retrying(self, fn: Callable[[], Awaitable[T]]) -> T:
        """An obstore request tried up to ``max_attempts`` times while it fails with a retryable
        error (:func:`objstore.retry.with_retries`), as botocore's standard mode does for the
        others; each retry is counted in :attr:`retries`."""

        def count(_exc: BaseException) -> None:
            self.retries += 1

        return await with_retries(fn, attempts=int(self.options.get("max_attempts", 5)), on_retry=count)

    async def _fast(self, key: str) -> tuple[Any, str] | None:
        """The ``obstore`` client (:mod:`objstore.s3fast`) and the bucket key of ``key``, or None
        where this store does not use one: OSS, virtual-hosted addressing on a custom endpoint, a
        ``ca_bundle``, no credentials (the aiobotocore call then says why), or a key the Rust
        client cannot name."""
        bucket_key = self._key(key)
        if not (self.fast_path and s3fast.plain_path(bucket_key)):
            return None
        if self._obstore is None:
            await self._c()
            creds = await self._session.get_credentials()
            if creds is None:
                self.fast_path = False
                return None
            self._creds = s3fast.Credentials(creds)
            await self._creds.refresh()
            self._obstore = s3fast.make_client(self, self._creds)
        elif self._creds is not None:
            await self._creds.refresh()
        return self._obstore, bucket_key

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None
        self._obstore = None
