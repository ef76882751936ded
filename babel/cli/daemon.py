"""``babel daemon``: run submitted and scheduled jobs (wiring only)."""

from __future__ import annotations

import asyncio
import logging

import click

from babel.daemon import DEFAULT_LISTEN, DaemonConfig, serve, split_addr
from babel.journal import default_state_dir


@click.command(
    "daemon",
    epilog="""Examples:

\b
  babel daemon --listen 0.0.0.0:7700 --max-jobs 4
  babel sync file:///data/shards s3://train-data/shards --daemon 127.0.0.1:7700
  babel jobs --daemon 127.0.0.1:7700
  curl -X POST 127.0.0.1:7700/schedules -d '{"src": "s3://ckpt/run7", "dst": "file:///ckpt/run7",
       "every": 300, "newest_checkpoint": true}'
""",
)
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT", help="HTTP API address.")
@click.option(
    "--state-dir", default=None, help="Where job journals live [default: $BABEL_STATE_DIR or ~/.local/state/babel]."
)
@click.option(
    "--max-jobs",
    type=click.IntRange(1, 1024),
    default=2,
    show_default=True,
    help="Jobs running at once (others queue).",
)
def daemon_cmd(listen: str, state_dir: str | None, max_jobs: int) -> int:
    """Serve an HTTP API that queues syncs, runs schedules and keeps the job history."""
    try:
        split_addr(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        logging.getLogger("babel").setLevel(logging.INFO)  # a server logs its config and jobs without -v
    asyncio.run(serve(DaemonConfig(listen=listen, state_dir=state_dir or default_state_dir(), max_jobs=max_jobs)))
    return 0


COMMANDS = [daemon_cmd]
