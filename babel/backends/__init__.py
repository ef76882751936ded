"""Storage backends picked by URI scheme (``file://``, ``s3://``, ``oss://``, ``pcache://``)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

from babel.backends.base import ListPage, ObjectInfo, ObjectStore
from babel.errors import BadURI

__all__ = ["ListPage", "ObjectInfo", "ObjectStore", "open_store"]


def open_store(uri: str) -> ObjectStore:
    """The backend for ``uri``.

    Raises:
        BadURI: unknown scheme, or a URI without a bucket / absolute path, a bad pcache:// path,
            an unknown s3:// / oss:// option value, or an oss:// URI with neither endpoint nor region.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        from babel.backends.local import LocalStore

        if parsed.netloc not in ("", "localhost"):
            raise BadURI("file:// URIs take no host (file:///abs/path)", uri=uri)
        return LocalStore(uri, parsed.path)
    if parsed.scheme in ("s3", "oss"):
        from babel.backends.oss import OSSStore
        from babel.backends.s3 import S3Store

        if not parsed.netloc:
            raise BadURI(f"{parsed.scheme}:// URIs need a bucket ({parsed.scheme}://bucket/prefix)", uri=uri)
        prefix = parsed.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        cls = OSSStore if parsed.scheme == "oss" else S3Store
        return cls(uri.split("?", 1)[0], parsed.netloc, prefix, dict(parse_qsl(parsed.query)))
    if parsed.scheme == "pcache":
        from babel.backends.pcache import PCacheStore, parse_uri

        master, root = parse_uri(uri)
        return PCacheStore(uri, master, root)
    raise BadURI(f"no backend for scheme {parsed.scheme!r} (file://, s3://, oss://, pcache://)", uri=uri)
