"""Tenant, admin and block tokens from an attacker's side: every altered, replayed, expired or
foreign credential is refused, and rotation keeps the previous key's tokens valid."""

from __future__ import annotations

import asyncio
import time

import pytest

from pcache.common import errors as E
from pcache.common.auth import (
    KeyRing,
    check_block_token,
    mint_block_token,
    mint_token,
    verify_block_token,
    verify_token,
)

NOW = 1_800_000_000.0


def _flips(token: str):
    """Every token with one character changed (to a different character of the same alphabet)."""
    for i, ch in enumerate(token):
        yield token[:i] + ("A" if ch != "A" else "B") + token[i + 1 :]


def test_a_token_says_who_and_what_and_nothing_else_verifies() -> None:
    ring = KeyRing.generate("k1")
    token = mint_token(ring, "team-a", "tenant", ttl=3600, now=NOW)
    claims = verify_token(ring, token, now=NOW)
    assert (claims.tenant, claims.scope, claims.kid, claims.expiry) == ("team-a", "tenant", "k1", int(NOW + 3600))
    assert claims.issued == int(NOW * 1000)
    admin = verify_token(ring, mint_token(ring, "ops", "admin"), now=NOW)
    assert (admin.scope, admin.issued) == ("admin", 0)  # v1: what masters of every release read
    for bad in _flips(token):
        with pytest.raises(E.PermissionDenied):
            verify_token(ring, bad, now=NOW)
    version, kid, tenant, scope, issued, expiry, mac = token.split(".")
    later = str(int(issued) + 86_400_000)
    forged = [
        ".".join((version, kid, "team-b", scope, issued, expiry, mac)),  # another tenant, same MAC
        ".".join((version, kid, tenant, "admin", issued, expiry, mac)),  # escalation
        ".".join((version, kid, tenant, scope, issued, str(int(expiry) + 86400), mac)),  # longer life
        ".".join((version, kid, tenant, scope, issued, "0", mac)),  # no expiry
        ".".join((version, kid, tenant, scope, later, expiry, mac)),  # issued after a revocation
        ".".join(("v1", kid, tenant, scope, expiry, mac)),  # no issue time to be revoked by
        ".".join((version, "k2", tenant, scope, issued, expiry, mac)),  # unknown key id
        ".".join((version, kid, tenant, scope, issued, expiry)),  # no MAC
        ".".join((version, kid, tenant, scope, issued, expiry, "")),
        ".".join((version, kid, tenant, scope, "9" * 40, expiry, mac)),
        token + ".x",
        token[:-1],
        "", "v1", "v2", "garbage", "v3" + token[2:], "v2.k1.team-a.tenant.-5.0." + mac,
        token.replace("team-a", "team-ä"),
    ]  # fmt: skip
    for bad in forged:
        with pytest.raises(E.PermissionDenied):
            verify_token(ring, bad, now=NOW)
    with pytest.raises(E.PermissionDenied, match="expired"):
        verify_token(ring, token, now=NOW + 3601)
    with pytest.raises(E.PermissionDenied):  # another cluster's key with the same id
        verify_token(KeyRing.generate("k1"), token, now=NOW)


def test_a_token_issued_further_ahead_than_the_clock_skew_is_refused() -> None:
    """Its issue time would put it after any revocation for as long as it is ahead."""
    from pcache.common.auth import MAX_CLOCK_SKEW

    ring = KeyRing.generate("k1")
    near = mint_token(ring, "team-a", now=NOW + MAX_CLOCK_SKEW - 1)
    assert verify_token(ring, near, now=NOW).issued == int((NOW + MAX_CLOCK_SKEW - 1) * 1000)
    with pytest.raises(E.PermissionDenied, match="issued in the future"):
        verify_token(ring, mint_token(ring, "team-a", now=NOW + MAX_CLOCK_SKEW + 1), now=NOW)


def test_a_v2_token_is_a_tenant_token_and_a_v1_tenant_token_still_verifies() -> None:
    """Tenant tokens minted before issue times were carried (v1) keep working until their
    tenant's first revocation; an admin, worker or master token cannot take the v2 form."""
    ring = KeyRing.generate("k1")
    fields = ("v1", "k1", "team-a", "tenant", "0")
    old = ".".join((*fields, ring.mac("k1", fields)))
    assert verify_token(ring, old, now=NOW).issued == 0
    fields = ("v2", "k1", "team-a", "admin", "1", "0")
    with pytest.raises(E.PermissionDenied, match="malformed"):
        verify_token(ring, ".".join((*fields, ring.mac("k1", fields))), now=NOW)
    minted = mint_token(ring, "team-a", now=NOW, not_before_ms=int(NOW * 1000) + 5)
    assert verify_token(ring, minted, now=NOW).issued == int(NOW * 1000) + 5


def test_rotation_accepts_the_previous_key_and_drops_the_one_before() -> None:
    ring = KeyRing.generate("k1")
    old = mint_token(ring, "team-a")
    ring2 = ring.rotated("k2")
    new = mint_token(ring2, "team-a")
    assert new.split(".")[1] == "k2" and ring2.current == "k2"
    assert verify_token(ring2, old).tenant == verify_token(ring2, new).tenant == "team-a"
    ring3 = ring2.rotated("k3")
    assert verify_token(ring3, new).kid == "k2"
    with pytest.raises(E.PermissionDenied):
        verify_token(ring3, old)  # k1 left the ring: its tokens are revoked
    again = KeyRing.parse(ring3.format())
    assert again.current == "k3" and again.keys == ring3.keys
    with pytest.raises(E.InvalidArgument):
        ring3.rotated("k3")


@pytest.mark.parametrize(
    "spec", ["", "k1", "k1:", ":abc", "k1:c2hvcnQ", "k1:" + "A" * 43 + ",k1:" + "B" * 43, "bad id:" + "A" * 43]
)
def test_malformed_key_rings_are_refused(spec: str) -> None:
    with pytest.raises(E.InvalidArgument):
        KeyRing.parse(spec)


def test_a_block_token_opens_one_block_for_its_operations_at_its_workers_until_it_expires() -> None:
    ring = KeyRing.generate("b1")
    token = mint_block_token(ring, 42, "r", "team-a", ttl=600, workers=["w-1", "w-2"], now=NOW)
    assert check_block_token(ring, token, 42, "r", "w-1", now=NOW) == "team-a"
    assert check_block_token(ring, token, 42, "r", "w-2", now=NOW) == "team-a"
    for block, op, worker, now, why in [
        (43, "r", "w-1", NOW, "for block 42"),  # replayed for another block
        (42, "w", "w-1", NOW, "does not allow"),  # a read token used to overwrite
        (42, "d", "w-1", NOW, "does not allow"),
        (42, "r", "w-3", NOW, "not for worker"),  # replayed against another worker
        (42, "r", "w-1", NOW + 601, "expired"),
    ]:
        with pytest.raises(E.PermissionDenied, match=why):
            check_block_token(ring, token, block, op, worker, now=now)
    for bad in _flips(token):
        with pytest.raises(E.PermissionDenied):
            check_block_token(ring, bad, 42, "r", "w-1", now=NOW)
    version, kid, block, ops, length, tenant, workers, expiry, mac = token.split(".")
    for bad in [
        ".".join((version, kid, block, "rwd", length, tenant, workers, expiry, mac)),
        ".".join((version, kid, block, "rw", str(1 << 30), tenant, workers, expiry, mac)),
        ".".join((version, kid, "43", ops, length, tenant, workers, expiry, mac)),
        ".".join((version, kid, block, ops, length, tenant, workers + "+w-3", expiry, mac)),
        ".".join((version, kid, block, ops, length, tenant, workers, str(int(expiry) + 600), mac)),
        mint_token(ring, "team-a"),  # a master token is not a block token
        "",
    ]:
        with pytest.raises(E.PermissionDenied):
            check_block_token(ring, bad, 42, "r", "w-1", now=NOW)
    with pytest.raises(E.PermissionDenied):
        check_block_token(KeyRing.generate("b1"), token, 42, "r", "w-1", now=NOW)  # another cluster's key
    with pytest.raises(E.InvalidArgument):
        mint_block_token(ring, 42, "x", "team-a", ttl=600, workers=["w-1"])
    with pytest.raises(E.InvalidArgument):
        mint_block_token(ring, 42, "r", "team-a", ttl=0, workers=["w-1"])
    for workers_bad in ([], ["w.1"], ["w+1"], [""]):
        with pytest.raises(E.InvalidArgument):
            mint_block_token(ring, 42, "r", "team-a", ttl=60, workers=workers_bad)
    # a write token names the exact length the writer may store; only a write token has one
    write = mint_block_token(ring, 42, "rw", "team-a", ttl=600, workers=["w-1"], now=NOW, length=4096)
    assert verify_block_token(ring, write).length == 4096
    for ops, length in (("w", 0), ("r", 4096)):
        with pytest.raises(E.InvalidArgument):
            mint_block_token(ring, 42, ops, "team-a", ttl=60, workers=["w-1"], length=length)


def test_the_worker_checker_denies_until_it_has_keys_and_caches_only_verified_tokens() -> None:
    from pcache.common.auth import BlockTokenChecker

    ring = KeyRing.generate("b1")
    checker = BlockTokenChecker("w-1")
    token = mint_block_token(ring, 7, "rw", "t", ttl=60, workers=["w-1"], length=10)
    with pytest.raises(E.PermissionDenied, match="no block keys"):
        checker.check(token, 7, "r")
    checker.set_keys(ring.format())
    assert checker.check(token, 7, "w").block_id == 7
    with pytest.raises(E.PermissionDenied):
        checker.check(token, 8, "w")  # a cached grant is still checked for the block
    checker.set_keys(KeyRing.generate("b2").format())  # the master's keys changed: the grant is forgotten
    with pytest.raises(E.PermissionDenied):
        checker.check(token, 7, "r")


def test_a_revoked_tenants_block_tokens_minted_before_its_revocation_are_refused() -> None:
    """A worker told that tenant t's tokens minted before an instant are revoked refuses t's block
    tokens minted before it (a b2 token, which carries no issue time, among them); a b3 token
    minted at or after it, other tenants' and the workers' own transfer tokens pass; the issue
    time cannot be moved by its holder."""
    from pcache.common.auth import BlockTokenChecker

    ring = KeyRing.generate("b1")
    checker = BlockTokenChecker("w-1")
    checker.set_keys(ring.format())
    revoked = int(time.time() * 1000)
    old_b2 = mint_block_token(ring, 7, "r", "t", ttl=60, workers=["w-1"])
    old_b3 = mint_block_token(ring, 7, "r", "t", ttl=60, workers=["w-1"], issued_ms=revoked - 1)
    new_b3 = mint_block_token(ring, 7, "r", "t", ttl=60, workers=["w-1"], issued_ms=revoked)
    other = mint_block_token(ring, 7, "r", "u", ttl=60, workers=["w-1"])
    assert old_b3.startswith("b3.") and old_b2.startswith("b2.")
    assert checker.check(old_b2, 7, "r").issued == 0  # cached as verified before the revocation
    checker.set_revoked({"t": revoked})
    for token in (old_b2, old_b3):
        with pytest.raises(E.PermissionDenied, match="revoked"):
            checker.check(token, 7, "r")
    assert checker.check(new_b3, 7, "r").issued == revoked
    assert checker.check(other, 7, "r").tenant == "u"
    assert checker.mint(7, "r", ["w-2"]).startswith("b2.")  # re-replication: tenant "cluster"
    version, kid, block, ops, length, tenant, workers, issued, expiry, mac = old_b3.split(".")
    for forged in (
        ".".join((version, kid, block, ops, length, tenant, workers, str(revoked + 10), expiry, mac)),
        ".".join(("b2", kid, block, ops, length, tenant, workers, expiry, mac)),
        ".".join((version, kid, block, ops, length, tenant, workers, "0" + issued, expiry, mac)),
    ):
        with pytest.raises(E.PermissionDenied, match="invalid|malformed"):
            checker.check(forged, 7, "r")
    checker.set_revoked({})  # the leader says none (not a reregistration answer: the worker keeps the last)
    assert checker.check(old_b2, 7, "r").tenant == "t"


def test_a_token_file_that_is_empty_or_missing_is_named_not_taken_for_no_token(tmp_path, monkeypatch) -> None:
    """An empty $PCACHE_TOKEN_FILE was taken for no token at all: the master's answer told the
    user to give $PCACHE_TOKEN_FILE, which they had."""
    from pcache.common.credentials import find_token

    monkeypatch.delenv("PCACHE_TOKEN", raising=False)
    empty = tmp_path / "token"
    empty.write_text("\n")
    monkeypatch.setenv("PCACHE_TOKEN_FILE", str(empty))
    with pytest.raises(E.InvalidArgument, match=f"PCACHE_TOKEN_FILE={empty} is empty"):
        find_token("127.0.0.1:1")
    monkeypatch.setenv("PCACHE_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(E.InvalidArgument, match="No such file"):
        find_token("127.0.0.1:1")
    empty.write_text("tok-123\n")
    monkeypatch.setenv("PCACHE_TOKEN_FILE", str(empty))
    assert find_token("127.0.0.1:1") == "tok-123"


def test_a_token_with_its_newline_is_sent_without_it_and_an_empty_or_broken_one_is_named(monkeypatch) -> None:
    """From a helper's drill: ``$PCACHE_TOKEN`` or ``ClientConfig(token=...)`` holding a token
    with the newline its file (or Kubernetes Secret) ends with failed in gRPC's C core ("Illegal
    header value", a traceback from the CLI); ``PCACHE_TOKEN=""`` (an unset ``$TEAM_TOKEN``
    substituted) silently used this machine's default tenant."""
    from pcache.client.master import MasterClient
    from pcache.common.config import ClientConfig
    from pcache.common.credentials import find_token

    monkeypatch.delenv("PCACHE_TOKEN_FILE", raising=False)
    monkeypatch.setenv("PCACHE_TOKEN", "v1.k0.team.rw.0.abc\n")
    assert find_token("127.0.0.1:1") == "v1.k0.team.rw.0.abc"
    for value, reason in [("", "is empty"), ("  \n", "is empty"), ("v1.k0 team", "characters no token has")]:
        monkeypatch.setenv("PCACHE_TOKEN", value)
        with pytest.raises(E.InvalidArgument, match=reason) as info:
            find_token("127.0.0.1:1")
        assert "$PCACHE_TOKEN" in str(info.value) and (not value.strip() or value not in str(info.value))
    monkeypatch.delenv("PCACHE_TOKEN")

    async def made() -> None:  # gRPC's aio channels are made on a running loop
        client = MasterClient(ClientConfig(master="127.0.0.1:1", token="v1.k0.team.rw.0.abc\n"), "c1")
        assert client.token == "v1.k0.team.rw.0.abc"
        await client.close()
        with pytest.raises(E.InvalidArgument, match="characters no token has"):
            MasterClient(ClientConfig(master="127.0.0.1:1", token="v1.k0.team\x00x"), "c2")

    asyncio.run(made())
