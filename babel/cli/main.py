"""``babel``: the command-line entry point (wiring only).

Exit codes: 0 ok, 1 partial (some objects failed or did not verify), 2 fatal (a missing
bucket, denied credentials, an unreachable endpoint), 3 usage (bad flags, a bad URI).
"""

from __future__ import annotations

import logging
import sys

import click

from babel.errors import BabelError, BadURI

EXIT_OK, EXIT_PARTIAL, EXIT_FATAL, EXIT_USAGE = 0, 1, 2, 3


def setup_logging(verbose: int) -> None:
    """Install the process's log handler (entry points only); -v info, -vv debug."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug) to stderr.")
def cli(verbose: int) -> None:
    """Babel: move datasets and checkpoints between object stores, clusters and regions.

    URIs: s3://bucket/prefix[?endpoint_url=&region=&profile=], oss://bucket/prefix,
    file:///abs/path, pcache://MASTER:PORT/path.
    """
    setup_logging(verbose)


def _register() -> None:
    from babel.cli import daemon, jobs, ls, sync, verify

    for module in (sync, ls, verify, jobs, daemon):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    try:
        rv = cli.main(args=argv, prog_name="babel", standalone_mode=False)
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
    except BadURI as exc:
        click.echo(f"babel: {exc}", err=True)
        return EXIT_USAGE
    except BabelError as exc:  # one that is also a ValueError is a bad request (a rejected option, URI)
        click.echo(f"babel: {type(exc).__name__}: {exc}", err=True)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FATAL
    except BrokenPipeError:  # `babel ls | head`
        sys.stderr.close()
        return EXIT_OK
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"babel: {exc.strerror or exc}{where}", err=True)
        return EXIT_FATAL
    except KeyboardInterrupt:
        click.echo("babel: interrupted (resume with `babel sync --resume JOB`)", err=True)
        return EXIT_FATAL


if __name__ == "__main__":
    sys.exit(main())
