"""A reverse proxy on loopback in front of an S3 endpoint: fault injection and Alibaba OSS emulation.

::

    with S3Proxy("http://127.0.0.1:5000", oss=True) as proxy:
        uri = f"oss://bucket/prefix?endpoint_url={proxy.endpoint}"
        proxy.throttle_rate = 0.3  # 30 % of requests: 503 SlowDown
        ...
        assert proxy.stats().throttled > 0

Requests are forwarded unchanged: method, path, query, headers (``Host`` included) and
body. A SigV4 client signs the host it talks to, the proxy's ``127.0.0.1:PORT``; since
that ``Host`` header reaches the upstream as sent, signatures still verify there (rclone
``serve s3`` checks them, moto by default does not). Only hop-by-hop headers are not
forwarded, and ``Expect`` (never signed): the proxy answers ``100 Continue`` itself. A
request body sent with ``Transfer-Encoding: chunked`` is forwarded with a Content-Length.

Knobs, settable at any time from any thread (each request reads them once):

* ``throttle_rate``: the fraction of matching requests answered ``503 SlowDown`` (S3's XML
  error body) without reaching the upstream;
* ``fail_rate``: the fraction answered ``500 InternalError``;
* ``delay``: seconds slept before each matching request is handled;
* ``ops``: which requests the three above apply to: None (all), or a set of operation
  names from :data:`OPS` and HTTP methods (``{"list"}``, ``{"GET"}``, ``{"PUT", "head"}``).

:meth:`S3Proxy.stats` counts requests by operation and the faults injected.

``oss=True`` emulates what Alibaba OSS adds to the S3 protocol: ``x-oss-hash-crc64ecma``,
the CRC-64/XZ ("CRC64-ECMA") of the whole object as a decimal string, on the responses to
PutObject, UploadPart (the part's CRC), CompleteMultipartUpload (the parts' CRCs combined
in GF(2), as OSS does), HeadObject and whole-object GETs; a ranged GET (``206``) gets
none. The proxy computes the CRCs of the bodies it forwards (decoding ``aws-chunked``
bodies, with or without trailers, first) and remembers them per bucket and key, so
objects written upstream by another path have no header. Addressing must be path-style
(``/bucket/key``), which botocore always uses for an IP-address endpoint.

Limits: plain http upstreams and clients; bodies are held in memory (fine for tests);
the OSS bookkeeping lives in the proxy and dies with it.
"""

from __future__ import annotations

import http.client
import logging
import random
import socket
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from babel.checksum import crc64ecma, crc64ecma_combine

logger = logging.getLogger(__name__)

OSS_CRC64_HEADER = "x-oss-hash-crc64ecma"

OPS = frozenset(
    {
        "list",  # ListObjects(V2), GET on a bucket
        "head",  # HeadObject
        "get",  # GetObject
        "put",  # PutObject
        "copy",  # CopyObject, UploadPartCopy
        "create_multipart",
        "upload_part",
        "complete_multipart",
        "abort_multipart",
        "delete",  # DeleteObject
        "delete_objects",
        "bucket",  # anything else on a bucket (create, delete, head, location, ...)
        "service",  # ListBuckets and anything else on /
    }
)
METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE"})

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "proxy-connection", "expect"}
)  # fmt: skip
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True)
class ProxyStats:
    """What the proxy has seen since it started or since :meth:`S3Proxy.reset_stats`.

    ``requests`` counts every request by operation (:data:`OPS`); ``throttled`` and
    ``failed`` the 503s and 500s injected; ``delayed`` the requests that slept ``delay``;
    ``last_answer`` is when the last answer of each operation was sent (``time.monotonic()``).
    """

    requests: dict[str, int]
    throttled: int
    failed: int
    delayed: int
    last_answer: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """All requests."""
        return sum(self.requests.values())


def classify(method: str, path: str, query: dict[str, list[str]], headers: Any) -> str:
    """The S3 operation a path-style request stands for, one of :data:`OPS`."""
    bucket, _, key = path.lstrip("/").partition("/")
    if not bucket:
        return "service"
    if not key:
        if method == "GET" and not ({"location", "acl", "policy", "versioning", "uploads", "tagging"} & query.keys()):
            return "list"
        if method == "POST" and "delete" in query:
            return "delete_objects"
        return "bucket"
    copy = headers.get("x-amz-copy-source") is not None
    if method == "HEAD":
        return "head"
    if method == "GET":
        return "get"
    if method == "PUT":
        if copy:
            return "copy"
        return "upload_part" if "uploadId" in query else "put"
    if method == "POST":
        if "uploads" in query:
            return "create_multipart"
        if "uploadId" in query:
            return "complete_multipart"
        return "put"  # browser-form POST upload
    if method == "DELETE":
        return "abort_multipart" if "uploadId" in query else "delete"
    return "bucket"


def decode_aws_chunked(body: bytes) -> bytes:
    """The payload of an ``aws-chunked`` body (SigV4 streaming, signed or not, trailers ignored).

    Chunks are ``HEX-SIZE[;chunk-signature=...]\\r\\nDATA\\r\\n``, ending with a zero-size
    chunk and optional ``name:value`` trailer lines.

    Raises:
        ValueError: not aws-chunked.
    """
    out = bytearray()
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            raise ValueError("aws-chunked: chunk header without CRLF")
        size = int(body[pos:eol].split(b";", 1)[0].strip() or b"x", 16)
        pos = eol + 2
        if size == 0:
            return bytes(out)
        if body[pos + size : pos + size + 2] != b"\r\n":
            raise ValueError("aws-chunked: chunk data not followed by CRLF")
        out += body[pos : pos + size]
        pos += size + 2


def _is_aws_chunked(headers: Any) -> bool:
    encoding = (headers.get("Content-Encoding") or "").lower()
    return "aws-chunked" in encoding or (headers.get("x-amz-content-sha256") or "").startswith("STREAMING-")


def _payload_crc(op: str, headers: Any, body: bytes) -> tuple[int, int] | None:
    """(CRC-64, size in bytes) of the payload of a PutObject or UploadPart, aws-chunked decoded."""
    if op not in ("put", "upload_part"):
        return None
    payload = decode_aws_chunked(body) if _is_aws_chunked(headers) else body
    return crc64ecma(payload), len(payload)


class _Knob:
    """A setting read and written under the proxy's lock, checked on assignment."""

    def __init__(self, check: Any) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        with obj._lock:
            return getattr(obj, self.attr)

    def __set__(self, obj: Any, value: Any) -> None:
        value = self.check(value)
        with obj._lock:
            setattr(obj, self.attr, value)


def _rate(value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"a rate is a fraction in [0, 1], not {value!r}")
    return float(value)


def _seconds(value: float) -> float:
    if float(value) < 0:
        raise ValueError(f"delay must be >= 0 seconds, not {value!r}")
    return float(value)


def _ops(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    ops = frozenset([value] if isinstance(value, str) else value)
    unknown = ops - OPS - METHODS
    if unknown:
        raise ValueError(f"unknown ops {sorted(unknown)}: use {sorted(OPS)} or HTTP methods {sorted(METHODS)}")
    return ops


class S3Proxy:
    """A threaded HTTP reverse proxy on ``127.0.0.1`` in front of ``upstream`` (``http://host:port``).

    Start and stop it with ``with`` (or :meth:`start` / :meth:`close`); :attr:`endpoint` is its URL.

    Args:
        upstream: the S3 endpoint requests are forwarded to.
        oss: add Alibaba OSS's ``x-oss-hash-crc64ecma`` headers (see the module docstring).
        throttle_rate: fraction of matching requests answered 503 SlowDown.
        throttle_status: 503 (S3's ``SlowDown``) or 429 (``TooManyRequests``, as some S3-compatible
            stores and gateways throttle).
        fail_rate: fraction answered 500 InternalError.
        delay: seconds added to every matching request.
        ops: operations and HTTP methods the knobs apply to (None: all).
        seed: seed of the random draws, for reproducible faults.
        upstream_timeout: seconds to wait for the upstream's answer.

    :attr:`corrupt_gets` (an int, 0 at first) is the number of the next successful GetObject
    answers whose body gets one byte flipped (a fault of the wire or of a store's disk).
    """

    throttle_rate = _Knob(_rate)
    fail_rate = _Knob(_rate)
    delay = _Knob(_seconds)
    ops = _Knob(_ops)

    def __init__(
        self,
        upstream: str,
        *,
        oss: bool = False,
        throttle_rate: float = 0.0,
        throttle_status: int = 503,
        fail_rate: float = 0.0,
        delay: float = 0.0,
        ops: Any = None,
        seed: int | None = None,
        upstream_timeout: float = 60.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.upstream_timeout = upstream_timeout
        self.oss = oss
        if throttle_status not in (503, 429):
            raise ValueError(f"throttle_status is 503 or 429, not {throttle_status!r}")
        self.throttle_status = throttle_status
        self._lock = threading.Lock()
        # what the _Knob descriptors of the class read and write
        self._throttle_rate = self._fail_rate = self._delay = 0.0
        self._ops: frozenset[str] | None = None
        self.throttle_rate = throttle_rate
        self.fail_rate = fail_rate
        self.delay = delay
        self.ops = ops
        self._rng = random.Random(seed)
        self._requests: Counter[str] = Counter()
        self._last: dict[str, float] = {}
        self._throttled = self._failed = self._delayed = 0
        # OSS emulation: CRC-64 by (bucket, key), and by upload id then part number: (crc, size)
        self._crcs: dict[tuple[str, str], int] = {}
        self._parts: dict[str, dict[int, tuple[int, int]]] = {}
        self.corrupt_gets = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- control --

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (only while running)."""
        if self._server is None:
            raise RuntimeError("the proxy is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> S3Proxy:
        """Listen on a free loopback port and serve in a background thread."""
        if self._server is None:
            self._server = _Server(("127.0.0.1", 0), _Handler, self)
            self._thread = threading.Thread(target=self._server.serve_forever, name="s3proxy", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.drop_connections()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def stats(self) -> ProxyStats:
        """A snapshot of the counters."""
        with self._lock:
            return ProxyStats(dict(self._requests), self._throttled, self._failed, self._delayed, dict(self._last))

    def reset_stats(self) -> None:
        """Zero the counters."""
        with self._lock:
            self._requests.clear()
            self._last.clear()
            self._throttled = self._failed = self._delayed = 0

    def object_crc64(self, bucket: str, key: str) -> int | None:
        """The CRC-64 the OSS emulation holds for an object (None: unknown)."""
        with self._lock:
            return self._crcs.get((bucket, key))

    # ------------------------------------------------------- per request --

    def _take_corruption(self) -> bool:
        with self._lock:
            if self.corrupt_gets <= 0:
                return False
            self.corrupt_gets -= 1
            return True

    def _decide(self, op: str, method: str) -> tuple[float, int]:
        """Count a request; return (seconds to sleep, HTTP status to inject or 0)."""
        with self._lock:
            self._requests[op] += 1
            ops = self._ops
            if ops is not None and op not in ops and method not in ops:
                return 0.0, 0
            delay = self._delay
            if delay:
                self._delayed += 1
            draw = self._rng.random()
            if draw < self._throttle_rate:
                self._throttled += 1
                return delay, self.throttle_status
            if draw < self._throttle_rate + self._fail_rate:
                self._failed += 1
                return delay, 500
            return delay, 0

    def _oss_after(
        self, op: str, bucket: str, key: str, query: dict[str, list[str]], headers: Any, body: bytes,
        upload: tuple[int, int] | None, status: int, resp_body: bytes | None,
    ) -> int | None:  # fmt: skip
        """Record what a successful request did; return the CRC-64 header value for its response.

        ``upload`` is what :func:`_payload_crc` made of the request.
        """
        ok = 200 <= status < 300
        upload_id = query.get("uploadId", [""])[0]
        with self._lock:
            if op == "put" and ok and upload is not None:
                self._crcs[(bucket, key)] = upload[0]
                return upload[0]
            if op == "upload_part" and ok and upload is not None:
                self._parts.setdefault(upload_id, {})[int(query["partNumber"][0])] = upload
                return upload[0]
            if op == "copy" and ok and "uploadId" not in query:
                source = unquote(headers.get("x-amz-copy-source", "").split("?", 1)[0]).lstrip("/")
                src_bucket, _, src_key = source.partition("/")
                copied = self._crcs.get((src_bucket, src_key))
                if copied is not None:
                    self._crcs[(bucket, key)] = copied
                return copied
            if op == "complete_multipart" and ok and resp_body is not None and b"<Error>" not in resp_body:
                combined = self._combine(self._parts.pop(upload_id, {}), body)
                if combined is not None:
                    self._crcs[(bucket, key)] = combined
                else:
                    self._crcs.pop((bucket, key), None)
                return combined
            if op == "abort_multipart" and (ok or status == 404):
                self._parts.pop(upload_id, None)
            elif op == "delete" and ok:
                self._crcs.pop((bucket, key), None)
            elif op == "delete_objects" and ok:
                for gone in _xml_texts(body, "Key"):
                    self._crcs.pop((bucket, gone), None)
            elif op in ("head", "get") and status == 200:  # 206 (a range): no CRC, as OSS
                return self._crcs.get((bucket, key))
        return None

    @staticmethod
    def _combine(parts: dict[int, tuple[int, int]], request_body: bytes) -> int | None:
        """CRC-64 of the parts a CompleteMultipartUpload lists, in its order (None: a part unknown)."""
        crc = 0  # the CRC of no bytes
        for text in _xml_texts(request_body, "PartNumber"):
            part = parts.get(int(text))
            if part is None:
                return None
            crc = crc64ecma_combine(crc, part[0], part[1])
        return crc


def _xml_texts(body: bytes, tag: str) -> list[str]:
    """Texts of every ``tag`` element of an S3 XML body, with or without the S3 namespace."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    return [e.text or "" for e in root.iter() if e.tag in (tag, _S3_NS + tag)]


def _error_xml(code: str, message: str, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{request_id}</RequestId></Error>"
    ).encode()


_FAULTS = {
    503: ("SlowDown", "Please reduce your request rate."),
    429: ("TooManyRequests", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    502: ("InternalError", "The proxy could not reach the upstream S3 endpoint."),
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, proxy: S3Proxy) -> None:
        self.proxy = proxy
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops its connection (aiohttp resets idle ones) is routine; log the rest."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            logger.debug("s3proxy: %s dropped the connection", client_address)
        else:
            logger.exception("s3proxy: request from %s failed", client_address)

    def drop_connections(self) -> None:
        """Shut down client connections still open (idle keep-alives), so their threads end."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    server: _Server
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.client_address[0], *args)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy(self) -> None:
        proxy = self.server.proxy
        method = self.command
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        op = classify(method, parts.path, query, self.headers)
        body = self._read_body()
        delay, fault = proxy._decide(op, method)
        if delay:
            time.sleep(delay)
        if fault:
            self._send_error(fault, op)
            return
        upload = _payload_crc(op, self.headers, body) if proxy.oss else None
        try:
            resp = self._forward(method, body)
        except OSError as exc:
            logger.warning("s3proxy: upstream %s failed: %s", proxy.upstream, exc)
            self._drop_upstream()
            self._send_error(502, op)
            return
        # a CompleteMultipartUpload can fail with a 200 and an <Error> body: read it before deciding;
        # a body of unknown length is read whole and sent with one
        corrupt = op == "get" and resp.status in (200, 206) and proxy._take_corruption()
        whole = method == "HEAD" or op == "complete_multipart" or resp.getheader("Content-Length") is None or corrupt
        resp_body = resp.read() if whole else None
        if corrupt and resp_body:
            resp_body = bytes([resp_body[0] ^ 0xFF]) + resp_body[1:]
        oss_crc = None
        if proxy.oss:
            oss_crc = proxy._oss_after(op, bucket, key, query, self.headers, body, upload, resp.status, resp_body)
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            lower = name.lower()
            if lower in _HOP_BY_HOP or lower == OSS_CRC64_HEADER:
                continue
            if lower == "content-length" and method != "HEAD" and resp_body is not None:
                continue
            self.send_header(name, value)
        if oss_crc is not None:
            self.send_header(OSS_CRC64_HEADER, str(oss_crc))
        if method != "HEAD" and resp_body is not None:
            self.send_header("Content-Length", str(len(resp_body)))
        self.end_headers()
        if method == "HEAD":
            pass
        elif resp_body is not None:
            self.wfile.write(resp_body)
        else:
            try:
                while chunk := resp.read(1 << 20):
                    self.wfile.write(chunk)
            except OSError:  # the client went away mid-body: the upstream connection is out of step
                self._drop_upstream()
                raise
        if resp.will_close:
            self._drop_upstream()
        with proxy._lock:
            proxy._last[op] = time.monotonic()

    def _forward(self, method: str, body: bytes) -> http.client.HTTPResponse:
        """Send the request upstream, with the client's own headers; one retry on a stale keep-alive."""
        for attempt in (1, 2):
            reused = self._upstream is not None
            if self._upstream is None:
                proxy = self.server.proxy
                self._upstream = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=proxy.upstream_timeout
                )
            conn = self._upstream
            try:
                conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        conn.putheader(name, value)
                if body or method in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop_upstream()
                if not reused or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _drop_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    def _send_error(self, status: int, op: str) -> None:
        with self.server.proxy._lock:
            self.server.proxy._last[op] = time.monotonic()
        code, message = _FAULTS[status]
        request_id = uuid.uuid4().hex[:16].upper()
        payload = _error_xml(code, message, request_id)
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        self.send_header("Date", self.date_time_string())
        if status in (503, 429):
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
