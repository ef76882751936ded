"""Object-store backends shared by Babel and PCache's under storage (``file://``, ``s3://``,
``oss://``): one implementation of the :class:`~objstore.base.ObjectStore` contract per scheme.

Neither :mod:`babel` nor :mod:`pcache` is imported here; Babel adds its ``pcache://`` backend on
top (:func:`babel.backends.open_store`), and PCache's master and workers read bound paths through
these (``../shared/DESIGN.md``, "under storage").
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

from objstore.base import ListPage, ObjectInfo, ObjectStore, PartInfo, StoreLimits
from objstore.errors import BadURI

__all__ = ["ListPage", "ObjectInfo", "ObjectStore", "PartInfo", "SCHEMES", "StoreLimits", "open_store"]

SCHEMES = ("file", "s3", "oss")
S3_OPTIONS = frozenset({
    "endpoint_url", "region", "profile", "credentials_file", "ca_bundle", "addressing_style", "checksum", "provider",
    "connect_timeout", "read_timeout", "request_timeout", "max_attempts", "max_pool_connections",
})  # fmt: skip


def open_store(uri: str) -> ObjectStore:
    """The backend for ``uri`` (``file:///abs/path``, ``s3://bucket/prefix?options``, ``oss://…``).

    Raises:
        BadURI: another scheme, a URI without a bucket / absolute path, an unknown s3:// / oss://
            option value, or an oss:// URI with neither endpoint nor region.
    """
    if uri.startswith("file://"):
        from objstore.local import LocalStore

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
        from objstore.oss import OSSStore
        from objstore.s3 import S3Store

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
    raise BadURI(f"no object-store backend for scheme {parsed.scheme!r} (file://, s3://, oss://)", uri=uri)
