"""``pcache keys``: the cluster's signing keys and the tokens they sign (wiring only)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from pcache.common.auth import SCOPES, mint_token
from pcache.common.credentials import ClusterKeys, write_secret
from pcache.common.errors import InvalidArgument


@click.group(
    "keys",
    epilog="""Examples:

\b
  pcache keys create keys.json
  pcache keys token --keys-file keys.json --scope worker --tenant workers > worker.token
  pcache keys token --keys-file keys.json --tenant default --ttl 86400
  pcache keys rotate keys.json     # masters reload it within a second; copy it to every master
""",
)
def keys_cmd() -> None:
    """Create key files, mint tokens, rotate keys (the masters' master.keys_file)."""


@keys_cmd.command("create")
@click.argument("path", type=click.Path(dir_okay=False))
def create(path: str) -> None:
    """Write a new key file at PATH (0600); refuses to replace one."""
    if os.path.exists(path):
        raise InvalidArgument(f"{path} exists: a new key file would revoke every token it signed (see rotate)")
    ClusterKeys.load_or_create(path)
    click.echo(f"wrote {path}: give it to every master (master.keys_file), to no one else", err=True)


@keys_cmd.command("token")
@click.option("--keys-file", required=True, type=click.Path(exists=True, dir_okay=False), help="The masters' key file.")
@click.option("--scope", type=click.Choice([s for s in SCOPES if s != "master"]), default="tenant", show_default=True)
@click.option("--tenant", default="default", show_default=True, help="Tenant the token names.")
@click.option("--ttl", type=click.FloatRange(min=0), default=0, show_default=True, help="Seconds valid; 0: no expiry.")
def token(keys_file: str, scope: str, tenant: str, ttl: float) -> None:
    """Print a token signed with the current key (a secret: pass it as a file or Secret, not argv)."""
    keys = ClusterKeys.load(keys_file)
    click.echo(mint_token(keys.tokens, tenant, scope, ttl=ttl))


@keys_cmd.command("rotate")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
def rotate(path: str) -> None:
    """Make a new current key; the current one stays as the previous key (still accepted), the one
    before is dropped (its tokens stop working). A running master reloads its key file within
    master.replication_check_interval seconds."""
    keys = ClusterKeys.load(path)
    rotated = ClusterKeys(keys.tokens.rotated(), keys.blocks.rotated())
    write_secret(Path(path), rotated.to_json())
    click.echo(f"rotated {path}: new key {rotated.tokens.current}, previous {keys.tokens.current}", err=True)


COMMANDS = [keys_cmd]
