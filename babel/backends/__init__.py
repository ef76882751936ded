"""Storage backends picked by URI scheme (``file://``, ``s3://``, ``pcache://``)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

from babel.backends.base import ListPage, ObjectInfo, ObjectStore
from babel.errors import BadURI

__all__ = ["ListPage", "ObjectInfo", "ObjectStore", "open_store"]


def open_store(uri: str) -> ObjectStore:
    """The backend for ``uri``.

    Raises:
        BadURI: unknown scheme, or a URI without a bucket / absolute path, or a bad pcache:// path.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        from babel.backends.local import LocalStore

        if parsed.netloc not in ("", "localhost"):
            raise BadURI("file:// URIs take no host (file:///abs/path)", uri=uri)
        return LocalStore(uri, parsed.path)
    if parsed.scheme == "s3":
        from babel.backends.s3 import S3Store

        if not parsed.netloc:
            raise BadURI("s3:// URIs need a bucket (s3://bucket/prefix)", uri=uri)
        prefix = parsed.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return S3Store(uri.split("?", 1)[0], parsed.netloc, prefix, dict(parse_qsl(parsed.query)))
    if parsed.scheme == "pcache":
        from babel.backends.pcache import PCacheStore, parse_uri

        master, root = parse_uri(uri)
        return PCacheStore(uri, master, root)
    raise BadURI(f"no backend for scheme {parsed.scheme!r} (file://, s3://, pcache://)", uri=uri)
