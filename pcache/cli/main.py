"""``pcache``: the command-line entry point (wiring only).

Exit codes: 0 ok, 1 partial failure, 2 fatal error, 3 usage error.
"""

from __future__ import annotations

import logging
import sys

import click

from pcache.common.errors import InvalidArgument, PCacheError

EXIT_OK, EXIT_PARTIAL, EXIT_FATAL, EXIT_USAGE = 0, 1, 2, 3


def setup_logging(level: str = "INFO") -> None:
    """Install the process's log handler (entry points only)."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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


def resolve_master(ctx: click.Context) -> str:
    """The master address from --master, $PCACHE_MASTER, cluster.json, or the default port."""
    from pcache.common.config import DEFAULT_MASTER_PORT
    from pcache.local import read_manifest

    root = ctx.find_root()
    if root.obj.get("master"):
        return root.obj["master"]
    try:
        return read_manifest(root.obj["cluster_dir"])["master"]
    except PCacheError:
        return f"127.0.0.1:{DEFAULT_MASTER_PORT}"


def _register() -> None:
    from pcache.cli import fs, fsck, serve, status, up

    for module in (serve, up, fs, status, fsck):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    try:
        rv = cli.main(args=argv, prog_name="pcache", standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_FATAL
    except click.exceptions.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return EXIT_FATAL
    except InvalidArgument as exc:
        click.echo(f"pcache: {exc}", err=True)
        return EXIT_USAGE
    except PCacheError as exc:
        click.echo(f"pcache: {exc}", err=True)
        return EXIT_FATAL
    except BrokenPipeError:  # `pcache ls | head`
        sys.stderr.close()
        return EXIT_OK
    except OSError as exc:  # the local side: a missing directory, an existing file, a full disk
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"pcache: {exc.strerror or exc}{where}", err=True)
        return EXIT_FATAL
    except KeyboardInterrupt:
        return EXIT_FATAL


if __name__ == "__main__":
    sys.exit(main())
