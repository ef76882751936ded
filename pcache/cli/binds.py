"""``pcache bind``, ``unbind``, ``binds``: directories bound to an under-store (wiring only)."""

from __future__ import annotations

import json
import time

import click
from google.protobuf.json_format import MessageToDict

from pcache.cli.common import resolve_master
from pcache.cli.tenant import admin_client
from pcache.common.errors import InvalidArgument

EXAMPLES = """Examples:

\b
  pcache bind /datasets/web 's3://corpus/web/?endpoint_url=http://10.0.0.5:9000&profile=train'
  pcache bind /datasets/imagenet s3://imagenet/train/ --meta-ttl immutable
  pcache bind /ckpt/run7 s3://ckpt/run7/ --mode writeback
  pcache binds
  pcache refresh /datasets/web        # list it from the store again now
  pcache unbind /datasets/web

Credentials are named, never given: profile= (a section of the hosts' AWS config),
credentials_file= (an AWS credentials file on every host, e.g. a mounted Secret), or the
hosts' environment (AWS_ACCESS_KEY_ID, instance roles). The admin token comes from
$PCACHE_ADMIN_TOKEN_FILE, else CLUSTER_DIR/secrets/admin.token.
"""


def parse_ttl(text: str) -> float:
    """Seconds of ``--meta-ttl`` (``immutable``: -1, never checked again).

    Raises:
        InvalidArgument: neither seconds >= 0 nor ``immutable``.
    """
    if text.strip().lower() == "immutable":
        return -1.0
    try:
        value = float(text)
    except ValueError:
        value = -2.0
    if not value >= 0 or value == float("inf"):
        raise InvalidArgument(f"--meta-ttl takes seconds >= 0 or 'immutable', not {text!r}")
    return value


@click.command("bind", epilog=EXAMPLES)
@click.argument("path")
@click.argument("uri")
@click.option("--mode", type=click.Choice(["ro", "writeback"]), default="ro", show_default=True,
              help="ro: read-through, no writes; writeback: files closed here are uploaded.")  # fmt: skip
@click.option("--meta-ttl", "meta_ttl", default="60", show_default=True,
              help="Seconds a listed object is trusted before it is checked again; 'immutable': never.")  # fmt: skip
@click.option(
    "--no-check", is_flag=True, help="Do not list the store once first (it is unreachable from the master now)."
)
@click.pass_context
def bind_cmd(ctx: click.Context, path: str, uri: str, mode: str, meta_ttl: str, no_check: bool) -> None:
    """Bind directory PATH (new, or empty) to the object-store prefix URI."""
    ttl = parse_ttl(meta_ttl)
    with admin_client(ctx) as pc:
        bind = pc.bind(path, uri, mode=mode, meta_ttl=ttl, check=not no_check)
    click.echo(f"{bind.path} -> {bind.uri} ({bind.mode}, {_ttl(bind.meta_ttl)})")


@click.command("unbind", epilog=EXAMPLES)
@click.argument("path")
@click.pass_context
def unbind_cmd(ctx: click.Context, path: str) -> None:
    """Remove the bind at PATH and what is cached under it; the store keeps its objects."""
    with admin_client(ctx) as pc:
        pc.unbind(path)
    click.echo(f"unbound {path}")


@click.command("binds", epilog=EXAMPLES)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def binds_cmd(ctx: click.Context, as_json: bool) -> None:
    """The bound directories, their stores, modes and metadata TTLs."""
    with admin_client(ctx) as pc:
        binds = pc.binds()
    if as_json:
        click.echo(json.dumps([MessageToDict(b, preserving_proto_field_name=True) for b in binds], indent=2))
        return
    click.echo(f"{'path':<28} {'mode':<10} {'meta ttl':<10} {'bound':<20} uri")
    for b in binds:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.created))
        click.echo(f"{b.path:<28} {b.mode:<10} {_ttl(b.meta_ttl):<10} {when:<20} {b.uri}")


@click.command("refresh", epilog=EXAMPLES)
@click.argument("path")
@click.pass_context
def refresh_cmd(ctx: click.Context, path: str) -> None:
    """List the bound directory PATH from its store again now (a file: check it), whatever the TTL."""
    from pcache.client import Client

    with Client(master=resolve_master(ctx)) as pc:
        node = pc.refresh(path)
    click.echo(f"refreshed {path} ({'directory' if node.is_dir else f'{node.size} bytes'})")


def _ttl(seconds: float) -> str:
    return "immutable" if seconds < 0 else f"{seconds:g} s"


COMMANDS = [bind_cmd, unbind_cmd, binds_cmd, refresh_cmd]
