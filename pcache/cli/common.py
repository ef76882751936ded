"""What the ``pcache`` subcommands share: finding the master from the group's options."""

from __future__ import annotations

import click

from pcache.common.config import DEFAULT_MASTER_PORT
from pcache.common.errors import PCacheError


def resolve_master(ctx: click.Context) -> str:
    """The master address from --master, $PCACHE_MASTER, cluster.json, or the default port."""
    from pcache.local import read_manifest

    root = ctx.find_root()
    obj = root.obj or {}
    if obj.get("master"):
        return obj["master"]
    try:
        return read_manifest(obj.get("cluster_dir", "./pcache-data"))["master"]
    except PCacheError:
        return f"127.0.0.1:{DEFAULT_MASTER_PORT}"
