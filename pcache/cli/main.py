"""``pcache``: the command-line entry point (wiring only).

Exit codes: 0 ok, 1 partial failure, 2 fatal error, 3 usage error.
"""

from __future__ import annotations

import sys

import click

from pcache.common.cli import EXIT_FATAL, pcache_error_exit, run_cli


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--master", envvar="PCACHE_MASTER", default=None, help="Master address host:port (env PCACHE_MASTER).")
@click.option(
    "--cluster-dir",
    envvar="PCACHE_CLUSTER_DIR",
    default="./pcache-data",
    show_default=True,
    help="Where `pcache up` wrote cluster.json; used when --master is not given.",
)
@click.pass_context
def cli(ctx: click.Context, master: str | None, cluster_dir: str) -> None:
    """PCache: a distributed all-flash file cache for training clusters."""
    ctx.ensure_object(dict)
    ctx.obj["master"] = master
    ctx.obj["cluster_dir"] = cluster_dir


def _register() -> None:
    from pcache.cli import binds, fs, fsck, ha, keys, serve, status, tenant, up

    for module in (serve, up, fs, status, fsck, keys, tenant, binds, ha):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    return run_cli(cli, "pcache", argv, pcache_error_exit, on_interrupt=(EXIT_FATAL, "interrupted"))


if __name__ == "__main__":
    sys.exit(main())
