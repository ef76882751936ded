"""What every command-line entry point shares: exit codes, error-to-exit-code mapping, byte units.

Used by ``pcache``, ``pcache-mount`` and ``babel`` (``click`` groups and commands). Exit codes:
0 ok, 1 partial failure, 2 fatal error, 3 usage error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

import click

from pcache.common.errors import InvalidArgument, PCacheError

EXIT_OK, EXIT_PARTIAL, EXIT_FATAL, EXIT_USAGE = 0, 1, 2, 3

#: A domain error's exit code and message, or None when the classifier does not know the error.
Classifier = Callable[[Exception], "tuple[int, str] | None"]


def pcache_error_exit(exc: Exception) -> tuple[int, str] | None:
    """PCache's errors: a bad argument is a usage error, any other ``PCacheError`` is fatal."""
    if isinstance(exc, InvalidArgument):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, PCacheError):
        return EXIT_FATAL, str(exc)
    return None


def run_cli(
    command: click.Command,
    prog_name: str,
    argv: Sequence[str] | None,
    classify: Classifier,
    *,
    on_interrupt: tuple[int, str | None] = (EXIT_FATAL, None),
    sigterm_interrupts: bool = True,
) -> int:
    """Run ``command`` and map how it ended to an exit code (messages go to stderr).

    A command may return an int exit code; ``None`` means 0. Domain errors go through
    ``classify`` first (so a ``PCacheError``, which is an ``OSError``, keeps its own code);
    then a closed pipe (``… | head``) is 0 and any other local ``OSError`` (a missing directory,
    a full disk) is fatal. Ctrl-C, and SIGTERM with ``sigterm_interrupts``, give ``on_interrupt``
    (code, message or None). Anything else propagates, with its traceback: it is a bug.
    """
    if sigterm_interrupts and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # `kill PID` cleans up as Ctrl-C does (servers set their own)
    try:
        rv = command.main(args=list(argv) if argv is not None else None, prog_name=prog_name, standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except SystemExit:
        # click turns EPIPE on stdout (`... | head`) into sys.exit(1) after wrapping the streams;
        # the reader has all it wanted: that is success
        if type(sys.stdout).__name__ == "_PacifyFlushWrapper":
            return EXIT_OK
        raise
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click's non-standalone mode wraps Ctrl-C
            code, message = on_interrupt
            if message:
                click.echo(f"{prog_name}: {message}", err=True)
            return code
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
    except KeyboardInterrupt:
        code, message = on_interrupt
        if message:
            click.echo(f"{prog_name}: {message}", err=True)
        return code
    except Exception as exc:
        verdict = classify(exc)
        if verdict is not None:
            code, message = verdict
            click.echo(f"{prog_name}: {message}", err=True)
            return code
        if isinstance(exc, BrokenPipeError):  # `... | head`: the reader has all it wanted
            # Python's recipe (library/signal, "Note on SIGPIPE"): point stdout at /dev/null so
            # the flush at exit does not fail again and turn the exit code into 1
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        if isinstance(exc, OSError):
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"{prog_name}: {exc.strerror or exc}{where}", err=True)
            return EXIT_FATAL
        raise


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def human_bytes(n: float) -> str:
    """Bytes as a short binary-unit string: ``512 B``, ``1.5 KiB`` … ``2.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
