"""Tenants: a namespace root, quotas and usage per tenant (DESIGN.md, "security / tenancy").

A tenant is a directory of the namespace, its *root*: the tenant's token resolves every path
inside it, so the tenant sees the root as ``/`` and no path it can name (``..`` is refused by
:func:`~pcache.common.paths.split_path`, the master never follows symlinks) leaves it. Each inode
records its tenant (inherited from the directory it is created in), which is what the inode-based
calls (``GetLayout``, ``AllocateBlock``, ``CommitFile``) check, and whose usage it counts against.

Usage is kept in the tenant's record (``t<name> -> Tenant``) and changed in the same atomic batch
as the mutation that changes it, so it is exact across crashes and failovers (the record is
replicated with the batch). Quotas, as HDFS's namespace and space quotas and JuiceFS's
directory quotas:

* inodes: checked when an inode is created (its root is not counted);
* bytes: the logical bytes of committed blocks (not multiplied by replication). A writer
  *reserves* the block's length (at most its file's block size) when it is allocated; the block
  is refused with ``QuotaExceeded`` (EDQUOT) when used + reserved bytes + that length would pass
  the quota, and the reservation turns into usage at the commit (or ends when the allocation
  expires). The block token lets the workers store exactly that length and the commit must name
  it, so what is charged is what is stored. Concurrent writers at the limit never pass the quota,
  not even by a block.

Revocation: a tenant token carries when it was minted (:mod:`pcache.common.auth`); ``pcache tenant
revoke-tokens`` stores in the record the instant before which the tenant's tokens are refused, so
a leaked token dies at once without rotating the cluster's keys (which would cut off every
tenant, and the workers). Tokens without an issue time (``v1``) are refused once a tenant has a
revocation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from pcache.common import errors as E
from pcache.common.auth import MAX_CLOCK_SKEW, check_name
from pcache.common.paths import normalize
from pcache.master.metastore import MetaStore
from pcache.proto import pcache_pb2 as pb

RESERVED_TENANTS = frozenset({"cluster"})  # the tenant of block tokens no tenant owns (admin files, worker transfers)
PREFIX = b"t"
GONE = b"T"  # T<name> -> the token key ids in the ring when tenant <name> was deleted; its revocation (ms)


def _key(name: str) -> bytes:
    return PREFIX + name.encode()


@dataclass(frozen=True)
class Scope:
    """The part of the namespace a caller may use: a tenant's root, or all of it (an admin)."""

    tenant: str  # "" for an admin: the whole namespace, every tenant
    root: str  # the admin's path of the tenant root; "" for an admin
    root_inode: int = 0

    @property
    def admin(self) -> bool:
        return not self.tenant

    def inside(self, path: str) -> str:
        """The namespace path of the caller's ``path``.

        Raises:
            InvalidPath: ``path`` is not a valid absolute path (``..`` among others).
        """
        if self.admin:
            return path
        norm = normalize(path)
        return self.root if norm == "/" else self.root + norm

    def outside(self, path: str | None) -> str | None:
        """The caller's view of a namespace ``path`` (the inverse of :meth:`inside`)."""
        if self.admin or path is None:
            return path
        if path == self.root:
            return "/"
        if path.startswith(self.root + "/"):
            return path[len(self.root) :]
        return path

    def owns(self, node: pb.Inode) -> bool:
        """Whether the caller may use ``node`` by its inode number."""
        return self.admin or node.tenant == self.tenant


ADMIN = Scope(tenant="", root="")


class Tenants:
    """Tenant records in the metastore, and the in-memory map of their roots.

    Records are read from the store when they change (usage), so they never drift from what
    is stored; the roots are cached (only this leader creates or deletes tenants).
    """

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self._roots: dict[str, tuple[str, int]] = {}  # name -> (root path, root inode)
        self._revoked: dict[str, int] = {}  # name -> its tokens minted before this (ms) are refused
        for _, raw in store.scan(PREFIX):
            rec = pb.Tenant()
            rec.ParseFromString(raw)
            self._cache(rec)
        for key, raw in store.scan(GONE):  # deleted tenants: their block tokens stay refused
            name = key[len(GONE) :].decode(errors="replace")
            instant = _tombstone(raw)[1]
            if name not in self._roots and instant:
                self._revoked[name] = instant

    def _cache(self, rec: pb.Tenant) -> None:
        self._roots[rec.name] = (rec.root, rec.root_inode)
        if rec.revoked_before_ms:
            self._revoked[rec.name] = rec.revoked_before_ms
        else:
            self._revoked.pop(rec.name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._roots

    def get(self, name: str) -> pb.Tenant:
        """The stored record of ``name``.

        Raises:
            NotFound: no such tenant.
        """
        raw = self.store.get(_key(name))
        if raw is None:
            raise E.NotFound(f"no tenant {name!r}")
        rec = pb.Tenant()
        rec.ParseFromString(raw)
        return rec

    def all(self) -> list[pb.Tenant]:
        """Every tenant's record, by name."""
        return [self.get(name) for name in sorted(self._roots)]

    def scope(self, name: str, issued_ms: int = 0) -> Scope:
        """The scope of the holder of a tenant token of ``name`` minted at ``issued_ms``
        (milliseconds since the epoch; 0: a token that does not say).

        Raises:
            PermissionDenied: the tenant does not exist (never created, or deleted: its tokens
                are revoked with it), or its tokens minted before ``issued_ms`` were revoked.
        """
        entry = self._roots.get(name)
        if entry is None:
            raise E.PermissionDenied(f"tenant {name!r} does not exist on this cluster (deleted, or never created)")
        revoked = self._revoked.get(name, 0)
        if issued_ms < revoked:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(revoked / 1000))
            raise E.PermissionDenied(
                f"token revoked: tenant {name!r}'s tokens issued before {when} were revoked;"
                f" an admin issues a new one (pcache tenant token {name})"
            )
        return Scope(tenant=name, root=entry[0], root_inode=entry[1])

    @property
    def revoked(self) -> dict[str, int]:
        """Tenant -> the instant (ms since the epoch) before which its tokens are refused, for
        every tenant that has had a revocation, and every deleted one (whose block tokens the
        workers refuse alike: :meth:`for_workers`)."""
        return self._revoked

    def revoke(self, name: str, now: float | None = None) -> pb.Tenant:
        """Tenant ``name``'s record with every token minted until ``now`` (seconds since the
        epoch) revoked, and those stamped up to :data:`~pcache.common.auth.MAX_CLOCK_SKEW`
        seconds later (the masters mint its tokens at that instant from then on: they work at
        once); store it with :meth:`put`. A revocation never moves back (a master whose clock is
        behind the last one's keeps the later instant).

        Raises:
            NotFound: no such tenant. InvalidArgument: a reserved name.
        """
        if name in RESERVED_TENANTS:
            raise E.InvalidArgument(f"{name!r} is not a tenant: its block tokens are the admin's and the workers'")
        rec = self.get(name)
        rec.revoked_before_ms = max(rec.revoked_before_ms, _revocation_instant(now))
        return rec

    def for_workers(self, horizon: float, now: float | None = None) -> dict[str, int]:
        """The revocations the workers enforce on block tokens: every live tenant's, and a deleted
        tenant's until ``horizon`` seconds (the longest a block token lives, plus the clock skew)
        after its deletion, when every block token minted before it has expired."""
        cutoff = int(((time.time() if now is None else now) - horizon) * 1000)
        return {name: ms for name, ms in self._revoked.items() if name in self._roots or ms > cutoff}

    def root_inodes(self) -> dict[int, str]:
        """Root inode -> tenant name."""
        return {ino: name for name, (_, ino) in self._roots.items()}

    def new_record(self, name: str, root: str, root_inode: int, quota_bytes: int, quota_inodes: int) -> pb.Tenant:
        """A fresh tenant record (not stored: :meth:`put` it in the batch that makes its root)."""
        check_name(name, "tenant")
        if name in self._roots:
            raise E.AlreadyExists(f"tenant {name!r} exists")
        return pb.Tenant(
            name=name,
            root=root,
            root_inode=root_inode,
            quota_bytes=quota_bytes,
            quota_inodes=quota_inodes,
            created=time.time(),
            # a deleted tenant of that name: block tokens minted to it stay refused (b3 from now on)
            revoked_before_ms=self._revoked.get(name, 0),
        )

    def put(self, rec: pb.Tenant) -> tuple[bytes, bytes]:
        """The batch entry storing ``rec``; the root map follows at once (call with the batch)."""
        self._cache(rec)
        return _key(rec.name), _stored(rec)

    def remove(self, name: str) -> bytes:
        """The batch delete of ``name``'s record; the root map forgets it (store its
        :meth:`tombstone` in the same batch)."""
        self._roots.pop(name, None)
        return _key(name)

    def tombstone(self, name: str, key_ids: Iterable[str], now: float | None = None) -> tuple[bytes, bytes]:
        """The batch entry remembering that ``name`` was deleted (at ``now``, seconds since the
        epoch) while the token keys ``key_ids`` were in the ring: its tokens (a token names its
        tenant, nothing more) must not come back to life in a new tenant of the same name while
        one of those keys still verifies. Its block tokens (another key ring, each living
        ``master.block_token_ttl``) are revoked from now on, as by :meth:`revoke`: the workers
        refuse them (:meth:`for_workers`), and a new tenant of that name starts with that
        revocation."""
        instant = max(self._revoked.get(name, 0), _revocation_instant(now))
        self._revoked[name] = instant
        return GONE + name.encode(), f"{','.join(sorted(key_ids))};{instant}".encode()

    def deleted(self, name: str) -> bool:
        """Whether a tenant ``name`` was deleted (and its tombstone stands)."""
        return self.store.get(GONE + name.encode()) is not None

    def check_reuse(self, name: str, key_ids: Iterable[str]) -> list[bytes]:
        """The batch deletes that let ``name`` be used again (its tombstone, if any).

        Raises:
            AlreadyExists: a deleted tenant's tokens of that name would be valid again: a key
                that was in the ring when it was deleted still is.
        """
        raw = self.store.get(GONE + name.encode())
        if raw is None:
            return []
        live = sorted(set(_tombstone(raw)[0]) & set(key_ids))
        if live:
            raise E.AlreadyExists(
                f"tenant {name!r} was deleted, and tokens issued to it are signed by keys still in the ring"
                f" ({', '.join(live)}): a new tenant of that name would let them in. Use another name, or"
                " rotate the keys twice (pcache keys rotate) so that those tokens die first"
            )
        return [GONE + name.encode()]

    def roots_under(self, path: str) -> list[str]:
        """Names of the tenants whose root is ``path`` or below it."""
        return sorted(n for n, (root, _) in self._roots.items() if root == path or root.startswith(path + "/"))

    def charge(self, deltas: dict[str, list[int]]) -> list[tuple[bytes, bytes]]:
        """Batch entries applying ``{tenant: [inodes, bytes]}`` to the usage records ("" and
        unknown tenants are not counted). Usage never goes below 0."""
        puts = []
        for name, (inodes, nbytes) in deltas.items():
            if not name or name not in self._roots or not (inodes or nbytes):
                continue
            rec = self.get(name)
            rec.used_inodes = max(0, rec.used_inodes + inodes)
            rec.used_bytes = max(0, rec.used_bytes + nbytes)
            puts.append((_key(name), _stored(rec)))
        return puts

    def check_inodes(self, name: str, count: int = 1) -> None:
        """Refuse ``count`` more inodes for ``name`` past its inode quota.

        Raises:
            QuotaExceeded: the quota would be passed.
        """
        if not name or name not in self._roots:
            return
        rec = self.get(name)
        if rec.quota_inodes and rec.used_inodes + count > rec.quota_inodes:
            raise E.QuotaExceeded(
                f"tenant {name!r} has used {rec.used_inodes} of its {rec.quota_inodes} inodes (pcache tenant quota)"
            )

    def check_bytes(self, name: str, nbytes: int, reserved: int) -> None:
        """Refuse a block of ``nbytes`` for ``name`` when used + ``reserved`` + ``nbytes`` passes
        its byte quota.

        Raises:
            QuotaExceeded: the quota would be passed.
        """
        if not name or name not in self._roots:
            return
        rec = self.get(name)
        if rec.quota_bytes and rec.used_bytes + reserved + nbytes > rec.quota_bytes:
            raise E.QuotaExceeded(
                f"tenant {name!r} has used {rec.used_bytes} of its {rec.quota_bytes} bytes"
                f" ({reserved} more reserved by blocks allocated and not committed: open writers, and writers"
                f" that failed or died, whose allocations end after master.orphan_grace); a {nbytes} byte block"
                " does not fit (pcache tenant quota)"
            )


def _revocation_instant(now: float | None) -> int:
    """The revocation instant (ms since the epoch) of a revocation made at ``now`` (seconds;
    None: this clock): ahead of it by the skew a token's issue time may have
    (:data:`~pcache.common.auth.MAX_CLOCK_SKEW`), so that a token minted just now by a master or
    host whose clock is ahead is revoked too."""
    return int(((time.time() if now is None else now) + MAX_CLOCK_SKEW) * 1000) + 1


def _tombstone(raw: bytes) -> tuple[list[str], int]:
    """A tombstone's token key ids and its block token revocation (ms; 0 in one stored before
    tombstones carried it): ``KEY,KEY;MS``."""
    keys, _, instant = raw.decode(errors="replace").partition(";")
    return [k for k in keys.split(",") if k], int(instant) if instant.isascii() and instant.isdigit() else 0


def add(deltas: dict[str, list[int]], tenant: str, inodes: int = 0, nbytes: int = 0) -> None:
    """Add a usage change to a ``{tenant: [inodes, bytes]}`` map (:meth:`Tenants.charge`)."""
    entry = deltas.setdefault(tenant, [0, 0])
    entry[0] += inodes
    entry[1] += nbytes


def freed_bytes(metas: Iterable[pb.BlockMeta]) -> int:
    """The logical bytes of block records charged to a quota (a bound file's blocks are cache of
    its under-store, never charged)."""
    return sum(m.length for m in metas if not m.ufs)


def _stored(rec: pb.Tenant) -> bytes:
    out = pb.Tenant()
    out.CopyFrom(rec)
    out.ClearField("reserved_bytes")  # answer-only
    return out.SerializeToString()
