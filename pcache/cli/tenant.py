"""``pcache tenant``: tenants, their roots, quotas and tokens (an admin token's commands; wiring only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from google.protobuf.json_format import MessageToDict

from pcache.cli.common import resolve_master
from pcache.common.cli import human_bytes
from pcache.common.config import parse_size
from pcache.common.credentials import write_secret
from pcache.common.errors import InvalidArgument

if TYPE_CHECKING:
    from pcache.client import Client
    from pcache.proto import pcache_pb2 as pb

ADMIN_TOKEN_FILE_ENV = "PCACHE_ADMIN_TOKEN_FILE"


def admin_client(ctx: click.Context) -> Client:
    """A client with the admin token: $PCACHE_ADMIN_TOKEN_FILE, else the cluster directory's
    secrets/admin.token (``pcache up``), else the token every client finds ($PCACHE_TOKEN...)."""
    from pcache.client import Client
    from pcache.common.config import ClientConfig

    root = ctx.find_root().obj or {}
    path = os.environ.get(ADMIN_TOKEN_FILE_ENV) or str(
        Path(root.get("cluster_dir", "./pcache-data")) / "secrets" / "admin.token"
    )
    token = ""
    if os.path.exists(path):
        token = Path(path).read_text().strip()
    elif os.environ.get(ADMIN_TOKEN_FILE_ENV):
        raise InvalidArgument(f"${ADMIN_TOKEN_FILE_ENV} names {path}, which does not exist")
    return Client(ClientConfig(master=resolve_master(ctx), token=token))


def _size(text: str | None) -> int:
    """Bytes of a quota option (binary units: 10T, 500GiB); 0 for none.

    Raises:
        InvalidArgument: not a size, or a negative one.
    """
    if text in (None, "", "0", "none"):
        return 0
    assert text is not None
    size = parse_size(text)
    if size < 0:
        raise InvalidArgument(f"a byte quota cannot be negative: {text!r} (0 or none: no limit)")
    return size


def _count(text: str | None) -> int:
    """An inode count (decimal units: 50M = 50,000,000); 0 for none.

    Raises:
        InvalidArgument: not a count.
    """
    if text in (None, "", "0", "none"):
        return 0
    assert text is not None
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise InvalidArgument(f"not an inode count: {text!r} (e.g. 1000000 or 50M)")
    return int(digits) * scale


def echo_tenants(tenants: list[pb.Tenant]) -> None:
    click.echo(
        f"{'tenant':<16} {'root':<24} {'used':>10} {'reserved':>10} {'quota':>10} {'inodes':>10} {'of':>10}"
        f"  tokens revoked before"
    )
    for t in tenants:
        revoked = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t.revoked_before_ms / 1000))
        click.echo(
            f"{t.name:<16} {t.root:<24} {human_bytes(t.used_bytes):>10} {human_bytes(t.reserved_bytes):>10}"
            f" {human_bytes(t.quota_bytes) if t.quota_bytes else '-':>10} {t.used_inodes:>10}"
            f" {t.quota_inodes or '-':>10}  {revoked if t.revoked_before_ms else '-'}"
        )


@click.group(
    "tenant",
    epilog="""Examples:

\b
  pcache tenant create team-a --bytes 10T --inodes 50M --token-file team-a.token
  pcache tenant list
  pcache tenant quota team-a --bytes 20T
  pcache tenant token team-a --ttl 86400 --token-file team-a.day.token
  pcache tenant revoke-tokens team-a --token-file team-a.token   # a token leaked: a new one
  pcache tenant delete team-a --purge

The admin token comes from $PCACHE_ADMIN_TOKEN_FILE, else CLUSTER_DIR/secrets/admin.token.
""",
)
def tenant_cmd() -> None:
    """Manage tenants: each has its own namespace root (it sees it as /), quotas and tokens."""


@tenant_cmd.command("create")
@click.argument("name")
@click.option("--root", default="", help="Its namespace root (an admin's path); default /NAME.")
@click.option("--bytes", "quota_bytes", default=None, help="Byte quota (e.g. 10T, 500G); default none.")
@click.option("--inodes", "quota_inodes", default=None, help="Inode quota (e.g. 50M); default none.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="Write the tenant's first token here (0600); else it is printed.")  # fmt: skip
@click.option("--token-ttl", type=click.FloatRange(min=0), default=0, help="Seconds the token is valid; 0: no expiry.")
@click.pass_context
def create(ctx: click.Context, name: str, root: str, quota_bytes: str | None, quota_inodes: str | None,
           token_file: str | None, token_ttl: float) -> None:  # fmt: skip
    """Create tenant NAME and give it a token."""
    with admin_client(ctx) as pc:
        rec = pc.create_tenant(name, root, quota_bytes=_size(quota_bytes), quota_inodes=_count(quota_inodes))
        token = pc.issue_token(name, token_ttl)
    if token_file:
        write_secret(Path(token_file), token + "\n")
        click.echo(f"tenant {rec.name} at {rec.root}; token written to {token_file}", err=True)
    else:
        click.echo(f"tenant {rec.name} at {rec.root}; its token:", err=True)
        click.echo(token)


@tenant_cmd.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """Every tenant: root, usage, bytes reserved by open writers, quotas, token revocation."""
    with admin_client(ctx) as pc:
        tenants = pc.tenants()
    if as_json:
        click.echo(json.dumps([MessageToDict(t, preserving_proto_field_name=True) for t in tenants], indent=2))
    else:
        echo_tenants(tenants)


@tenant_cmd.command("quota")
@click.argument("name")
@click.option("--bytes", "quota_bytes", default=None, help="New byte quota (0 or none: no limit); default: keep.")
@click.option("--inodes", "quota_inodes", default=None, help="New inode quota (0 or none: no limit); default: keep.")
@click.pass_context
def quota(ctx: click.Context, name: str, quota_bytes: str | None, quota_inodes: str | None) -> None:
    """Show or change tenant NAME's quotas; usage above a lowered quota only stops growth."""
    with admin_client(ctx) as pc:
        rec = next((t for t in pc.tenants() if t.name == name), None)
        if rec is None:
            raise InvalidArgument(f"no tenant {name!r}")
        if quota_bytes is not None or quota_inodes is not None:
            pc.set_quota(
                name,
                quota_bytes=rec.quota_bytes if quota_bytes is None else _size(quota_bytes),
                quota_inodes=rec.quota_inodes if quota_inodes is None else _count(quota_inodes),
            )
            rec = next(t for t in pc.tenants() if t.name == name)
    echo_tenants([rec])


@tenant_cmd.command("token")
@click.argument("name")
@click.option("--ttl", type=click.FloatRange(min=0), default=0, help="Seconds valid; 0: no expiry.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="Write it here (0600, replaced whole) instead of printing it.")  # fmt: skip
@click.pass_context
def token(ctx: click.Context, name: str, ttl: float, token_file: str | None) -> None:
    """Print a new token of tenant NAME (a secret: hand it over as a file or a Secret)."""
    with admin_client(ctx) as pc:
        minted = pc.issue_token(name, ttl)
    if token_file:  # `> file` leaves it 0644 under a usual umask
        write_secret(Path(token_file), minted + "\n")
        click.echo(f"token of tenant {name} written to {token_file}", err=True)
    else:
        click.echo(minted)


@tenant_cmd.command("revoke-tokens")
@click.argument("name")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="Then issue a new token and write it here (0600).")  # fmt: skip
@click.option("--ttl", type=click.FloatRange(min=0), default=0, help="Seconds the new token is valid; 0: no expiry.")
@click.pass_context
def revoke_tokens(ctx: click.Context, name: str, token_file: str | None, ttl: float) -> None:
    """Refuse every token of tenant NAME issued until now (a leaked one): the masters at once,
    the workers the block tokens its holders got from their next heartbeat (~1 s). Other
    tenants, admin and worker tokens and the cluster keys are untouched; tokens the masters
    issue afterwards work at once (one minted offline with `pcache keys token` only 5 minutes
    later: the clock skew allowed). Tenant tokens of releases before issue times were carried
    (v1.) are refused too. Upgrade the workers first: earlier ones refuse the new block tokens."""
    with admin_client(ctx) as pc:
        rec = pc.revoke_tokens(name)
        minted = pc.issue_token(name, ttl) if token_file else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(rec.revoked_before_ms / 1000))
    click.echo(f"tokens of tenant {name} issued before {when} revoked", err=True)
    if token_file:
        write_secret(Path(token_file), minted + "\n")
        click.echo(f"new token of tenant {name} written to {token_file}", err=True)


@tenant_cmd.command("delete")
@click.argument("name")
@click.option("--purge", is_flag=True, help="Remove its files too (else its root must be empty).")
@click.pass_context
def delete(ctx: click.Context, name: str, purge: bool) -> None:
    """Delete tenant NAME: its tokens stop working at once."""
    with admin_client(ctx) as pc:
        pc.delete_tenant(name, purge=purge)
    click.echo(f"tenant {name} deleted" + (" with its files" if purge else ""), err=True)


COMMANDS = [tenant_cmd]
