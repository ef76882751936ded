"""Signed credentials: tenant and admin tokens for master RPCs, block tokens for the data plane.

Both are HMAC-SHA256 over every field they carry, under a key named by its id, so a holder cannot
change any field (tenant, scope, block, operations, expiry) without the key, and a verifier needs
no lookup but the key ring. The design is HDFS's: delegation tokens for the namespace and block
access tokens (``BlockTokenSecretManager``: block id, access modes, expiry, key id; the NameNode
hands them out with every located block, DataNodes check them on every op).

Formats (ASCII, ``.``-separated; no field may contain a dot)::

    v2.KID.TENANT.tenant.ISSUED.EXPIRY.MAC      tenant token for master RPCs
    v1.KID.TENANT.SCOPE.EXPIRY.MAC              admin, worker and master tokens (and tenant tokens
                                                minted before issue times were carried)
    b2.KID.BLOCK.OPS.LENGTH.TENANT.WORKERS.EXPIRY.MAC  block token
    b3.KID.BLOCK.OPS.LENGTH.TENANT.WORKERS.ISSUED.EXPIRY.MAC  block token of a tenant with a revocation

``WORKERS`` is the ``+``-joined ids of the workers the token may be used at (a read token: the
block's replicas when it was handed out; a write token: the pipeline), so a token replayed at
another worker is refused too. ``SCOPE`` is ``tenant`` (namespace operations inside that tenant's root), ``admin`` (everything,
any tenant) or ``worker`` (worker registration and heartbeats); ``OPS`` a subset of ``rwd``
(read, write, delete); ``LENGTH`` the exact byte count a write stores (the master reserved
that much of the tenant's quota for it: a writer cannot store more than it is charged for;
0 in tokens without ``w``); ``ISSUED`` milliseconds since the epoch when it was minted (a tenant's
tokens issued before its revocation are refused: ``pcache tenant revoke-tokens``, as a JWT's
``iat`` against a not-before); ``EXPIRY`` whole seconds since the epoch (0: never); ``MAC`` the
unpadded URL-safe base64 of HMAC-SHA256(key, ``"pcache\\0" + the fields joined by "\\0"``).
Only tenant tokens carry ``ISSUED``: admin, worker and master tokens stay ``v1``, which masters of
every release read (a follower not yet upgraded keeps taking its leader's log). Block tokens carry
it (``b3``) only for a tenant that has had a revocation; the workers learn each tenant's revocation
instant from the masters' heartbeat answers and refuse that tenant's block tokens minted before it
(a ``b2`` token of such a tenant among them), so a revoked holder's cached block tokens die too.

Key rotation: a :class:`KeyRing` signs with its current key and verifies with any key it holds,
so adding a new current key while the previous one stays in the ring cuts nobody off; dropping
the previous key then revokes every credential it signed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import re
import secrets
import time
from dataclasses import dataclass

from pcache.common.errors import InvalidArgument, PermissionDenied

SCOPES = ("tenant", "admin", "worker", "master")
OPS = frozenset("rwdf")  # read, write, delete, fetch from the under-store on a miss (a bound file's block)
KEY_BYTES = 32
MAX_CLOCK_SKEW = 300.0  # seconds a token's issue time may be ahead of the verifier's clock (Kerberos's 5 min)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")  # key ids and tenant names


def check_name(name: str, what: str = "name") -> str:
    """``name`` if it is a valid key id or tenant name: 1-63 of ``[A-Za-z0-9_-]``, not starting
    with ``-`` or ``_``.

    Raises:
        InvalidArgument: it is not.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"{what} must be 1-63 letters, digits, '-' or '_' (not first), got {name!r}")
    return name


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class KeyRing:
    """HMAC keys by id; ``current`` signs, every key verifies.

    Raises (constructor):
        InvalidArgument: no keys, ``current`` not among them, a bad id, or a key shorter than
            16 bytes.
    """

    def __init__(self, keys: dict[str, bytes], current: str) -> None:
        if not keys or current not in keys:
            raise InvalidArgument(f"the current key {current!r} is not in the key ring")
        for kid, secret in keys.items():
            check_name(kid, "key id")
            if len(secret) < 16:
                raise InvalidArgument(f"key {kid!r} has {len(secret)} bytes; at least 16 are needed")
        self.keys = dict(keys)
        self.current = current

    @classmethod
    def generate(cls, kid: str = "") -> KeyRing:
        """A ring of one fresh random 256-bit key (id: ``kid`` or ``k`` + 8 hex digits)."""
        kid = kid or "k" + secrets.token_hex(4)
        return cls({kid: os.urandom(KEY_BYTES)}, kid)

    @classmethod
    def parse(cls, spec: str) -> KeyRing:
        """A ring from ``KID:BASE64URL[,KID:BASE64URL...]``; the first key is the current one.

        Raises:
            InvalidArgument: empty, malformed, a repeated id or a short key.
        """
        keys: dict[str, bytes] = {}
        first = ""
        for part in (p.strip() for p in spec.split(",")):
            kid, sep, encoded = part.partition(":")
            if not sep or not kid or not encoded:
                raise InvalidArgument("a key ring is KID:BASE64URL[,KID:BASE64URL...] (the first signs)")
            if kid in keys:
                raise InvalidArgument(f"key id {kid!r} appears twice in the key ring")
            try:
                keys[kid] = _unb64(encoded)
            except ValueError as exc:
                raise InvalidArgument(f"key {kid!r} is not base64url") from exc
            first = first or kid
        return cls(keys, first)

    def format(self) -> str:
        """The :meth:`parse` form, current key first (a secret: store it 0600)."""
        order = [self.current, *(k for k in self.keys if k != self.current)]
        return ",".join(f"{kid}:{_b64(self.keys[kid])}" for kid in order)

    def rotated(self, kid: str = "") -> KeyRing:
        """A ring with a fresh current key and only the current one as the previous key."""
        fresh = KeyRing.generate(kid)
        if fresh.current in self.keys:
            raise InvalidArgument(f"key id {fresh.current!r} is in the key ring already")
        return KeyRing({fresh.current: fresh.keys[fresh.current], self.current: self.keys[self.current]}, fresh.current)

    def mac(self, kid: str, fields: tuple[str, ...]) -> str:
        """MAC of ``fields`` under key ``kid`` (KeyError: not in the ring)."""
        message = "\0".join(("pcache", *fields)).encode()
        return _b64(hmac.new(self.keys[kid], message, hashlib.sha256).digest())

    def check(self, kid: str, fields: tuple[str, ...], mac: str) -> bool:
        """Whether ``mac`` is the MAC of ``fields`` under key ``kid`` (constant-time compare)."""
        if kid not in self.keys:
            return False
        return hmac.compare_digest(self.mac(kid, fields).encode(), mac.encode("ascii", "replace"))


@dataclass(frozen=True)
class Claims:
    """What a verified master token says."""

    tenant: str
    scope: str
    expiry: int  # seconds since the epoch; 0: never
    kid: str
    issued: int = 0  # milliseconds since the epoch it was minted at; 0: a v1 token, which does not say


def mint_token(
    ring: KeyRing,
    tenant: str,
    scope: str = "tenant",
    ttl: float = 0.0,
    now: float | None = None,
    *,
    not_before_ms: int = 0,
) -> str:
    """A master token for ``tenant`` with ``scope``, valid ``ttl`` seconds (0: no expiry).

    A tenant token carries when it was minted (``now``, seconds since the epoch; at least
    ``not_before_ms``, milliseconds: the tenant's revocation, so that a token minted right after
    it, or by a master whose clock is behind, is not born revoked).

    Raises:
        InvalidArgument: a bad tenant name or scope.
    """
    check_name(tenant, "tenant")
    if scope not in SCOPES:
        raise InvalidArgument(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    now = time.time() if now is None else now
    expiry = 0 if ttl <= 0 else int(now + ttl)
    if scope == "tenant":
        issued = max(int(now * 1000), not_before_ms)
        fields: tuple[str, ...] = ("v2", ring.current, tenant, scope, str(issued), str(expiry))
    else:
        fields = ("v1", ring.current, tenant, scope, str(expiry))
    return ".".join((*fields, ring.mac(ring.current, fields)))


def verify_token(ring: KeyRing, token: str, now: float | None = None) -> Claims:
    """The claims of a master token this ring signed and that has not expired.

    Raises:
        PermissionDenied: no token, a malformed one, an unknown key id, a wrong MAC, or expired.
    """
    if not token:
        raise PermissionDenied(
            "no token: give this cluster's token as $PCACHE_TOKEN or $PCACHE_TOKEN_FILE (an admin makes"
            " one with `pcache tenant token NAME`)"
        )
    parts = token.split(".")
    if len(parts) == 6 and parts[0] == "v1":
        version, kid, tenant, scope, expiry, mac = parts
        issued = "0"
        fields: tuple[str, ...] = (version, kid, tenant, scope, expiry)
    elif len(parts) == 7 and parts[0] == "v2" and parts[3] == "tenant":
        version, kid, tenant, scope, issued, expiry, mac = parts
        fields = (version, kid, tenant, scope, issued, expiry)
    else:
        raise PermissionDenied("malformed token")
    digits = all(f.isascii() and f.isdigit() and len(f) <= 16 for f in (issued, expiry))
    if scope not in SCOPES or not digits or not _NAME.fullmatch(tenant):
        raise PermissionDenied("malformed token")
    if not ring.check(kid, fields, mac):
        raise PermissionDenied("invalid token (unknown key or bad signature)")
    now = time.time() if now is None else now
    if int(expiry) and int(expiry) < now:
        raise PermissionDenied("token expired")
    if int(issued) > (now + MAX_CLOCK_SKEW) * 1000:  # it would outlive a revocation
        raise PermissionDenied(
            f"token issued in the future (more than {MAX_CLOCK_SKEW:.0f} s ahead of this master's clock:"
            " the clocks of the host that minted it and of this master differ; run NTP)"
        )
    return Claims(tenant=tenant, scope=scope, expiry=int(expiry), kid=kid, issued=int(issued))


def mint_block_token(
    ring: KeyRing,
    block_id: int,
    ops: str,
    tenant: str,
    ttl: float,
    workers: list[str] | tuple[str, ...],
    now: float | None = None,
    *,
    length: int = 0,
    issued_ms: int = 0,
) -> str:
    """A block token letting its holder do ``ops`` (subset of ``rwd``) on ``block_id`` at the
    workers ``workers`` (ids) for ``ttl`` seconds; a write must store exactly ``length`` bytes.
    ``issued_ms`` (milliseconds since the epoch; 0: not carried) is for a tenant with a revocation.

    Raises:
        InvalidArgument: bad ops, tenant or ttl; no workers, or an id with ``.`` or ``+``; a
            write token without a positive ``length``.
    """
    if not ops or set(ops) - OPS:
        raise InvalidArgument(f"block token ops must be a subset of 'rwdf', got {ops!r}")
    if ("w" in ops) != (length > 0):
        raise InvalidArgument(f"a block token has a length (> 0) exactly when it allows writes, got {length}")
    if ttl <= 0:
        raise InvalidArgument("a block token needs an expiry (ttl > 0)")
    check_name(tenant, "tenant")
    if not workers or any(not w or "." in w or "+" in w for w in workers):
        raise InvalidArgument(f"a block token names one or more worker ids without '.' or '+', got {workers!r}")
    expiry = math.ceil((time.time() if now is None else now) + ttl)  # valid ttl seconds at least
    ops = "".join(sorted(set(ops)))
    fields: tuple[str, ...] = (str(int(block_id)), ops, str(int(length)), tenant, "+".join(workers))
    if issued_ms > 0:
        fields = ("b3", ring.current, *fields, str(int(issued_ms)), str(expiry))
    else:
        fields = ("b2", ring.current, *fields, str(expiry))
    return ".".join((*fields, ring.mac(ring.current, fields)))


@dataclass(frozen=True)
class BlockGrant:
    """What a verified block token allows."""

    block_id: int
    ops: str
    tenant: str
    workers: frozenset[str]
    expiry: int
    length: int = 0  # the exact bytes a write stores (0: no write)
    issued: int = 0  # ms since the epoch it was minted at (b3); 0: it does not say (b2)

    def check_write_length(self, length: int) -> None:
        """A write stores exactly the length the token names: what the master reserved of the
        tenant's quota, and what the commit must name.

        Raises:
            PermissionDenied: another length.
        """
        if length != self.length:
            raise PermissionDenied(
                f"the block token of block {self.block_id} allows a write of {self.length} bytes, not {length}"
            )


def verify_block_token(ring: KeyRing, token: str) -> BlockGrant:
    """The grant of a block token this ring signed (expiry not checked: :func:`check_grant`).

    Raises:
        PermissionDenied: no token, malformed, or forged (unknown key or bad MAC).
    """
    if not token:
        raise PermissionDenied("no block token (the master hands one out with every block location)")
    parts = token.split(".")
    if len(parts) == 9 and parts[0] == "b2":
        version, kid, block, ops, length, tenant, workers, expiry, mac = parts
        issued = "0"
        fields: tuple[str, ...] = (version, kid, block, ops, length, tenant, workers, expiry)
    elif len(parts) == 10 and parts[0] == "b3":
        version, kid, block, ops, length, tenant, workers, issued, expiry, mac = parts
        fields = (version, kid, block, ops, length, tenant, workers, issued, expiry)
    else:
        raise PermissionDenied("malformed block token")
    if not all(f.isascii() and f.isdigit() and len(f) <= 20 for f in (block, length, issued, expiry)):
        raise PermissionDenied("malformed block token")
    if not ring.check(kid, fields, mac):
        raise PermissionDenied("invalid block token (unknown key or bad signature)")
    return BlockGrant(int(block), ops, tenant, frozenset(workers.split("+")), int(expiry), int(length), int(issued))


def check_grant(grant: BlockGrant, block_id: int, op: str, worker_id: str, now: float | None = None) -> None:
    """Check that ``grant`` allows ``op`` (one of ``rwd``) on ``block_id`` at ``worker_id`` now.

    Raises:
        PermissionDenied: another block, operation or worker, or expired.
    """
    if grant.block_id != block_id:
        raise PermissionDenied(f"the block token is for block {grant.block_id}, not {block_id}")
    if op not in grant.ops:
        raise PermissionDenied(f"the block token of block {block_id} does not allow {op!r} (only {grant.ops!r})")
    if worker_id not in grant.workers:
        raise PermissionDenied(f"the block token of block {block_id} is not for worker {worker_id}")
    if grant.expiry < (time.time() if now is None else now):
        raise PermissionDenied(f"the block token of block {block_id} expired")


def check_block_token(
    ring: KeyRing, token: str, block_id: int, op: str, worker_id: str, now: float | None = None
) -> str:
    """Check that ``token`` allows ``op`` on ``block_id`` at ``worker_id`` now; returns its tenant.

    Raises:
        PermissionDenied: no token, malformed, forged, for another block, operation or worker,
            or expired.
    """
    grant = verify_block_token(ring, token)
    check_grant(grant, block_id, op, worker_id, now)
    return grant.tenant


class BlockTokenChecker:
    """A worker's check of the block token on every data-plane and short-circuit request.

    Deny by default: until the master has handed over its block keys (registration), every
    request is refused. Verified tokens are remembered (the string fixes every field), so a
    frame costs a dictionary lookup after its token's first.
    """

    CACHE = 100_000

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.ring: KeyRing | None = None
        self._grants: dict[str, BlockGrant] = {}
        self.revoked: dict[str, int] = {}  # tenant -> its tokens minted before this (ms) are refused

    def set_keys(self, spec: str) -> None:
        """Take the master's block key ring (``KeyRing.format``); a change forgets verified tokens.

        Raises:
            InvalidArgument: a malformed ring.
        """
        if self.ring is not None and spec == self.ring.format():
            return
        self.ring = KeyRing.parse(spec)
        self._grants = {}

    def check(self, token: str, block_id: int, op: str) -> BlockGrant:
        """The grant of ``token`` if it allows ``op`` on ``block_id`` at this worker now.

        Raises:
            PermissionDenied: no keys yet, or a token that does not allow it.
        """
        grant = self._grants.get(token)
        if grant is None:
            if self.ring is None:
                raise PermissionDenied("this worker has no block keys yet (not registered with a master)")
            grant = verify_block_token(self.ring, token)
            if len(self._grants) >= self.CACHE:
                self._grants.clear()
            self._grants[token] = grant
        check_grant(grant, block_id, op, self.worker_id)
        if self.revoked and grant.issued < self.revoked.get(grant.tenant, 0):
            raise PermissionDenied(f"the block token of block {block_id} was revoked (its tenant's tokens were)")
        return grant

    def set_revoked(self, revoked: dict[str, int]) -> None:
        """Take the masters' tenant revocations (tenant -> milliseconds since the epoch)."""
        if revoked != self.revoked:
            self.revoked = dict(revoked)

    def mint(self, block_id: int, ops: str, workers: list[str], ttl: float = 600.0, *, length: int = 0) -> str:
        """A token for this worker's own transfers (re-replication of a ``length`` byte block),
        under the master's block key (as HDFS DataNodes, which hold the block keys, sign their
        transfers).

        Raises:
            PermissionDenied: no keys yet.
        """
        if self.ring is None:
            raise PermissionDenied("this worker has no block keys yet (not registered with a master)")
        return mint_block_token(self.ring, block_id, ops, "cluster", ttl, workers, length=length)


AUTH_METADATA = "authorization"  # gRPC call metadata: ``Bearer TOKEN``


def bearer(token: str) -> tuple[tuple[str, str], ...] | None:
    """gRPC call metadata carrying ``token`` (None when there is none)."""
    return ((AUTH_METADATA, f"Bearer {token}"),) if token else None


class Guard:
    """Checks the bearer token of every RPC of a servicer against ``scopes`` (method -> the
    scopes that may call it). A method not in the table is refused: deny by default.

    Verified tokens are remembered (the string fixes every claim; expiry is checked each time),
    so a call costs one dictionary lookup after the first.
    """

    CACHE = 10_000  # verified tokens remembered at most

    def __init__(self, ring: KeyRing, scopes: dict[str, frozenset[str]]) -> None:
        self.ring = ring
        self.scopes = scopes
        self._verified: dict[str, Claims] = {}

    def set_ring(self, ring: KeyRing) -> None:
        """Verify with ``ring`` from now on (key rotation); forgets every verified token."""
        self.ring = ring
        self._verified = {}

    def authorize(self, method: str, metadata) -> Claims:
        """The claims of the call's token if it may call ``method``.

        Raises:
            PermissionDenied: no table entry for the method, no token, an invalid or expired one,
                or a scope the method does not accept.
        """
        allowed = self.scopes.get(method)
        if not allowed:
            raise PermissionDenied(f"{method} is not open to any credential")
        values = [value for key, value in metadata or () if key == AUTH_METADATA]
        if len(values) > 1:  # a proxy might check another one than this master: no ambiguity
            raise PermissionDenied("more than one authorization entry")
        token = ""
        if values:
            scheme, _, token = values[0].partition(" ")
            if scheme.lower() != "bearer":
                raise PermissionDenied("the authorization metadata must be 'Bearer TOKEN'")
        claims = self._verified.get(token)
        if claims is None:
            claims = verify_token(self.ring, token)
            if len(self._verified) >= self.CACHE:
                self._verified.clear()
            self._verified[token] = claims
        elif claims.expiry and claims.expiry < time.time():
            raise PermissionDenied("token expired")
        if claims.scope not in allowed:
            wanted = " or ".join(sorted(allowed))
            raise PermissionDenied(
                f"{method} needs {_a(wanted)} {wanted} token, not {_a(claims.scope)} {claims.scope} token"
            )
        return claims


def _a(word: str) -> str:
    """The indefinite article of ``word``."""
    return "an" if word[:1] in "aeiou" else "a"
