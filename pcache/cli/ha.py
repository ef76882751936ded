"""``pcache ha``: operator commands for a leader + follower pair on etcd (wiring only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from pcache.common.errors import InvalidArgument


def _etcd_of(ctx: click.Context, etcd: str | None) -> str:
    """``--etcd``, else the etcd of the cluster ``pcache up`` started in ``--cluster-dir``."""
    if etcd:
        return etcd
    from pcache.local import read_manifest

    root = ctx.find_root().obj or {}
    cluster_dir = root.get("cluster_dir", "./pcache-data")
    if (Path(cluster_dir) / "cluster.json").exists():
        found = read_manifest(cluster_dir).get("etcd")
        if found:
            return str(found)
    raise InvalidArgument(f"give --etcd HOST:PORT (no cluster.json with an etcd in {cluster_dir})")


@click.group("ha")
def ha_cmd() -> None:
    """Operator commands for masters on etcd (master.etcd)."""


@ha_cmd.command(
    "recover",
    epilog="""Examples:

\b
  pcache ha recover --etcd 10.0.0.5:2379               # show the reports and the plan
  pcache ha recover --etcd 10.0.0.5:2379 --yes         # apply it
  pcache ha recover --etcd 10.0.0.5:2379 --member 3f2a9c01d4e5 --yes
""",
)
@click.option("--etcd", default=None, help="etcd endpoints HOST:PORT[,HOST:PORT] (default: pcache up's).")
@click.option("--cluster", "cluster", default="pcache", show_default=True, help="master.cluster of the pair.")
@click.option("--member", default=None, help="Master to lead next (default: the one holding the newest log).")
@click.option("--force", is_flag=True, help="Recover from --member even though another master holds more.")
@click.option("--yes", is_flag=True, help="Write the plan to etcd (without it: show it only).")
@click.pass_context
def recover_cmd(ctx: click.Context, etcd: str | None, cluster: str, member: str | None, force: bool, yes: bool) -> None:
    """Give a pair whose etcd lost its data (emptied, or restored from an older snapshot) a leader
    again.

    The masters find it themselves (they hold a newer term than etcd names), stop leading, and
    each reports the newest term and log index it holds. This makes the master with the newest
    log (or --member) the last leader, lifts the epochs above every term the workers and
    clients have seen, and lets the masters campaign again; the others follow it and catch up.
    With --yes on a pair where no master leads and none halted (the master an earlier recovery
    chose never came back), it halts them first and takes the running masters' reports.
    """
    from pcache.master.ha import recover

    plan = asyncio.run(recover(_etcd_of(ctx, etcd), cluster, member=member, force=force, apply=yes))
    if plan.halted:
        click.echo(f"halted: {plan.halted}")
    click.echo(f"{'member':<14} {'address':<24} {'term':>12} {'log index':>10}  running")
    for r in plan.reports:
        click.echo(
            f"{r.member:<14} {r.address:<24} {r.term:>12} {r.index:>10}  {'yes' if r.member in plan.running else 'no'}"
        )
    chosen, newest = plan.chosen, plan.newest
    verb = "leads next" if plan.applied else "would lead next"
    click.echo(f"master {chosen.member} ({chosen.address}) {verb}; epochs start above {plan.base}")
    if chosen != newest:
        click.echo(
            f"warning: master {newest.member} holds a newer log (term {newest.term} index {newest.index}): the"
            " mutations only it holds are dropped when it follows",
            err=True,
        )
    if chosen.member not in plan.running:
        click.echo(f"warning: master {chosen.member} is not running: no master leads until it is", err=True)
    if not plan.applied:
        click.echo("nothing written: run again with --yes to apply", err=True)


COMMANDS = [ha_cmd]
