"""Bound paths: namespace directories whose content comes from an object-store prefix (under
storage; ``../shared/DESIGN.md``, "under storage"; Alluxio's mount table, Fluid's Dataset).

The mount table is namespace metadata (``u<path> -> Bind``), written in the same atomic batch as
the bound directory, so it is replicated to the follower with everything else. Rules, each
checked by the :class:`~pcache.master.namespace.Namespace` mutation it concerns:

* a bind makes its directory (its parent must exist) or takes an empty one; binds do not nest,
  and a tenant root is never bound itself (a directory inside it may be);
* binding and unbinding are an admin's calls: the under-store is read with the credentials of
  the cluster's hosts (a profile, a credentials file, the environment), which a tenant must not
  aim at a store of its choosing; a tenant sees the binds inside its root;
* a URI names credentials by reference only (``profile=``, ``credentials_file=``, or the
  environment chain of each host): user information in the URI or its ``endpoint_url`` is
  refused, so the mount table, ``pcache binds`` and the logs never hold a secret;
* under a ``ro`` bind no client creates, changes, renames or deletes anything (``ReadOnly``,
  EROFS); a bind point, or a directory above one, is neither renamed nor deleted (``Busy``,
  EBUSY): ``pcache unbind`` removes it with its cached content.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import parse_qsl, urlsplit

from pcache.common import errors as E
from pcache.common.paths import normalize
from pcache.master.metastore import MetaStore
from pcache.proto import pcache_pb2 as pb

PREFIX = b"u"
MODES = ("ro", "writeback")
IMMUTABLE = -1.0  # meta_ttl of a bind whose objects never change: listed once, never re-checked
MAX_URI = 4096  # bytes
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
_ENDPOINT = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _key(path: str) -> bytes:
    return PREFIX + path.encode("utf-8", "surrogateescape")


def stale(bind: pb.Bind, when: float, now: float) -> bool:
    """Whether what was listed or checked at ``when`` (seconds since the epoch; 0: never) must be
    looked at again under ``bind``'s ``meta_ttl``."""
    return when <= 0 or (bind.meta_ttl >= 0 and now - when > bind.meta_ttl)


def _store_prefix(uri: str) -> tuple[tuple[str, str, str], str]:
    """((scheme, endpoint, bucket), key prefix ending in ``/``, or "" for a whole bucket) of a
    checked URI; a ``file://`` URI's path is taken literally, as its backend does."""
    if uri.startswith("file://"):
        path = posixpath.normpath("/" + uri[len("file://") :].partition("/")[2])
        return ("file", "", ""), path.rstrip("/") + "/"
    parts = urlsplit(uri)
    endpoint = dict(parse_qsl(parts.query)).get("endpoint_url", "").rstrip("/").lower()
    prefix = parts.path.strip("/")
    return (parts.scheme, endpoint, parts.netloc), prefix + "/" if prefix else ""


def overlap(uri: str, other: str) -> str | None:
    """``other``'s store prefix (``s3://bucket/prefix/``) when it is, holds or lies inside ``uri``'s
    on the same store (scheme, endpoint, bucket); None when the two are apart. Two endpoints
    naming one server differently are taken for two stores."""
    (store, prefix), (store2, prefix2) = _store_prefix(uri), _store_prefix(other)
    if store != store2 or not (prefix.startswith(prefix2) or prefix2.startswith(prefix)):
        return None
    scheme, _, bucket = store2
    return f"{scheme}://{bucket}/{prefix2}" if scheme != "file" else f"file://{prefix2}"


def check_uri(uri: str) -> None:
    """Refuse a URI that is not an object store's, or that may carry a secret; the refusal
    never repeats the URI or its option values (they may hold the secret).

    A bucket is a plain name, ``endpoint_url`` is ``http(s)://HOST[:PORT][/PATH]``, ``profile`` a
    plain name, and no option value holds ``@``: user information, plain or percent-encoded,
    never passes.

    Raises:
        InvalidArgument: not ``file://``, ``s3://`` or ``oss://``; not parsable by the backend;
            anything that may be a credential in it.
    """
    import objstore
    from objstore.errors import StoreError

    if len(uri.encode("utf-8", "surrogateescape")) > MAX_URI:
        raise E.InvalidArgument(f"an under-store URI holds at most {MAX_URI} bytes")
    parts = urlsplit(uri)
    if parts.scheme not in objstore.SCHEMES:
        raise E.InvalidArgument(
            f"cannot bind {parts.scheme or 'a URI without a scheme'!r}: file://, s3://, oss:// only"
        )
    plain = "@" not in parts.netloc and "%" not in parts.netloc and not parts.fragment
    if parts.scheme != "file" and parts.netloc and not _BUCKET.fullmatch(parts.netloc):
        plain = False
    options = parse_qsl(parts.query, keep_blank_values=True)
    for name, value in options:
        if "@" in value:
            plain = False
        elif name == "endpoint_url" and not _ENDPOINT.fullmatch(value):
            # said apart (without the value): a missing http:// was taken for a credential
            raise E.InvalidArgument(
                "endpoint_url is http://HOST[:PORT] or https://HOST[:PORT] (with its scheme, no user information)"
            )
        if name == "profile" and not _NAME.fullmatch(value):
            plain = False
    if not plain:
        raise E.InvalidArgument(
            "an under-store URI is scheme://BUCKET/PREFIX?endpoint_url=http(s)://HOST[:PORT]&profile=NAME..."
            " and names credentials by reference (profile=, credentials_file=, or the hosts' environment),"
            " never user:password@ or a key in it"
        )
    try:
        objstore.open_store(uri)  # parses and validates its options; no request is made
    except StoreError as exc:
        text = exc.message  # without the URI
        for _, value in options:
            if value:
                text = text.replace(value, "...")
        raise E.InvalidArgument(f"bad under-store URI: {text}") from exc


class Binds:
    """The mount table, cached in memory (only the leader changes it; a new term reloads it)."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self._by_path: dict[str, pb.Bind] = {}
        self._by_inode: dict[int, pb.Bind] = {}
        for key, raw in store.scan(PREFIX):
            self._add(key[len(PREFIX) :].decode("utf-8", "surrogateescape"), pb.Bind.FromString(raw))

    def _add(self, path: str, bind: pb.Bind) -> None:
        bind.path = path
        self._by_path[path] = bind
        self._by_inode[bind.inode] = bind

    def all(self) -> list[pb.Bind]:
        """Every bind, in path order."""
        return [self._by_path[p] for p in sorted(self._by_path)]

    def get(self, path: str) -> pb.Bind | None:
        """The bind whose directory is exactly ``path`` (a normalised namespace path)."""
        return self._by_path.get(path)

    def of_inode(self, inode: int) -> pb.Bind | None:
        """The bind whose directory is inode ``inode``."""
        return self._by_inode.get(inode)

    def inodes(self) -> dict[int, pb.Bind]:
        """Bound directories by inode."""
        return self._by_inode

    def covering(self, path: str) -> pb.Bind | None:
        """The bind at ``path`` or above it, or None."""
        if not self._by_path:
            return None
        path = normalize(path)
        while True:
            bind = self._by_path.get(path)
            if bind is not None or path == "/":
                return bind
            path = path.rsplit("/", 1)[0] or "/"

    def under(self, path: str) -> list[pb.Bind]:
        """Binds at ``path`` or below it."""
        path = normalize(path)
        base = "/" if path == "/" else path + "/"
        return [b for p, b in self._by_path.items() if p == path or p.startswith(base)]

    def check_writable(self, path: str) -> None:
        """Refuse a client's change at ``path`` under a read-only bind.

        Raises:
            ReadOnly: ``path`` is under a ``ro`` bind.
        """
        bind = self.covering(path)
        if bind is not None and bind.mode == "ro":
            raise E.ReadOnly(f"bound read-only to {bind.uri} (pcache bind --mode writeback allows writes)", path=path)

    def check_movable(self, path: str, what: str) -> None:
        """Refuse renaming or deleting a bind point or a directory above one.

        Raises:
            Busy: a bind is at or below ``path``.
        """
        held = self.under(path)
        if held:  # no other path in the text: the caller's view of it may differ (a tenant's)
            where = f"it is bound to {held[0].uri}" if held[0].path == normalize(path) else "a directory in it is bound"
            raise E.Busy(f"cannot {what}: {where} (pcache binds; pcache unbind first)", path=path)

    @staticmethod
    def record(bind: pb.Bind) -> tuple[bytes, bytes]:
        """The batch entry storing ``bind`` (then :meth:`remember` it, once written)."""
        return _key(bind.path), bind.SerializeToString()

    def remember(self, bind: pb.Bind) -> None:
        self._add(bind.path, bind)

    @staticmethod
    def key(path: str) -> bytes:
        """The batch delete of the bind at ``path`` (then :meth:`forget` it, once written)."""
        return _key(path)

    def forget(self, path: str) -> None:
        bind = self._by_path.pop(path, None)
        if bind is not None:
            self._by_inode.pop(bind.inode, None)
