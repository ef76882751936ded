"""Storage backends picked by URI scheme: ``file://``, ``s3://`` and ``oss://`` from the shared
:mod:`objstore` package, and ``pcache://`` (:mod:`babel.backends.pcache`), which only Babel has."""

from __future__ import annotations

from urllib.parse import urlparse

import objstore
from objstore.base import ListPage, ObjectInfo, ObjectStore
from objstore.errors import BadURI

__all__ = ["ListPage", "ObjectInfo", "ObjectStore", "open_store"]


def open_store(uri: str) -> ObjectStore:
    """The backend for ``uri``.

    Raises:
        BadURI: unknown scheme, or a URI without a bucket / absolute path, a bad pcache:// path,
            an unknown s3:// / oss:// option value, or an oss:// URI with neither endpoint nor region.
    """
    scheme = "file" if uri.startswith("file://") else urlparse(uri).scheme
    if scheme == "pcache":
        from babel.backends.pcache import PCacheStore, parse_uri

        master, root = parse_uri(uri)
        return PCacheStore(uri, master, root)
    if scheme not in objstore.SCHEMES:
        raise BadURI(f"no backend for scheme {scheme!r} (file://, s3://, oss://, pcache://)", uri=uri)
    return objstore.open_store(uri)
