"""Storage backends picked by URI scheme (``file://``, ``s3://``, ``oss://``, ``pcache://``)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

from babel.backends.base import ListPage, ObjectInfo, ObjectStore
from babel.errors import BadURI

__all__ = ["ListPage", "ObjectInfo", "ObjectStore", "open_store"]

S3_OPTIONS = frozenset({
    "endpoint_url", "region", "profile", "ca_bundle", "addressing_style", "checksum", "provider",
    "connect_timeout", "read_timeout", "max_attempts", "max_pool_connections",
})  # fmt: skip


def open_store(uri: str) -> ObjectStore:
    """The backend for ``uri``.

    Raises:
        BadURI: unknown scheme, or a URI without a bucket / absolute path, a bad pcache:// path,
            an unknown s3:// / oss:// option value, or an oss:// URI with neither endpoint nor region.
    """
    if uri.startswith("file://"):
        from babel.backends.local import LocalStore

        # the path is taken literally: '#', '?' and '%' are ordinary characters of file names
        rest = uri[len("file://") :]
        host, slash, path = rest.partition("/")
        if host not in ("", "localhost") or not slash:
            raise BadURI("file:// URIs take no host (file:///abs/path)", uri=uri)
        return LocalStore(uri, "/" + path)
    parsed = urlparse(uri)
    if parsed.fragment or uri.endswith("#"):
        raise BadURI("'#' has no meaning in an object-store URI (a key prefix cannot contain it here)", uri=uri)
    if parsed.scheme in ("s3", "oss"):
        from babel.backends.oss import OSSStore
        from babel.backends.s3 import S3Store

        if not parsed.netloc:
            raise BadURI(f"{parsed.scheme}:// URIs need a bucket ({parsed.scheme}://bucket/prefix)", uri=uri)
        prefix = parsed.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        options = dict(parse_qsl(parsed.query, keep_blank_values=True))
        unknown = sorted(set(options) - S3_OPTIONS)
        if unknown:
            raise BadURI(f"unknown option {unknown[0]!r} (known: {', '.join(sorted(S3_OPTIONS))})", uri=uri)
        cls = OSSStore if parsed.scheme == "oss" else S3Store
        return cls(uri.split("?", 1)[0], parsed.netloc, prefix, options)
    if parsed.scheme == "pcache":
        from babel.backends.pcache import PCacheStore, parse_uri

        master, root = parse_uri(uri)
        return PCacheStore(uri, master, root)
    raise BadURI(f"no backend for scheme {parsed.scheme!r} (file://, s3://, oss://, pcache://)", uri=uri)
