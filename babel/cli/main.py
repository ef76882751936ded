"""``babel``: the command-line entry point (wiring only).

Exit codes: 0 ok, 1 partial (some objects failed or did not verify), 2 fatal (a missing
bucket, denied credentials, an unreachable endpoint), 3 usage (bad flags, a bad URI).
"""

from __future__ import annotations

import logging
import sys

import click

from babel.errors import BabelError, BadURI
from pcache.common.cli import EXIT_FATAL, EXIT_USAGE, run_cli
from pcache.common.logs import setup_logging


def babel_error_exit(exc: Exception) -> tuple[int, str] | None:
    """Babel's errors: a bad URI or a rejected option (a ``BabelError`` that is a ``ValueError``)
    is a usage error, any other ``BabelError`` is fatal."""
    if isinstance(exc, BadURI):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, BabelError):
        return (EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FATAL), f"{type(exc).__name__}: {exc}"
    return None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug) to stderr.")
def cli(verbose: int) -> None:
    """Babel: move datasets and checkpoints between object stores, clusters and regions.

    URIs: s3://bucket/prefix[?endpoint_url=&region=&profile=], oss://bucket/prefix,
    file:///abs/path, pcache://MASTER:PORT/path.
    """
    setup_logging(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG)


def _register() -> None:
    from babel.cli import clean, daemon, jobs, ls, sync, verify

    for module in (sync, ls, verify, jobs, clean, daemon):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    interrupted = (EXIT_FATAL, "interrupted (resume with `babel sync --resume JOB`)")
    return run_cli(cli, "babel", argv, babel_error_exit, on_interrupt=interrupted)


if __name__ == "__main__":
    sys.exit(main())
