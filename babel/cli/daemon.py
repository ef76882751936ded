"""``babel daemon``: run submitted and scheduled jobs (wiring only)."""

from __future__ import annotations

import logging

import click

from babel.cli.common import run_async
from babel.daemon.config import DEFAULT_LISTEN, DaemonConfig, split_addr
from babel.daemon.security import DEFAULT_ALLOW
from babel.journal import default_state_dir


@click.command(
    "daemon",
    epilog="""Examples:

\b
  babel daemon --listen 0.0.0.0:7700 --max-jobs 4 --allow s3:// --allow file:///data
  babel sync file:///data/shards s3://train-data/shards --daemon 127.0.0.1:7700
  babel jobs --daemon 127.0.0.1:7700
  curl -X POST 127.0.0.1:7700/schedules -H "Authorization: Bearer $(cat ~/.local/state/babel/daemon.token)"
       -H 'Content-Type: application/json'
       -d '{"src": "s3://ckpt/run7", "dst": "file:///data/ckpt/run7", "every": 300, "newest_checkpoint": true}'
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
@click.option(
    "--allow",
    "allow",
    multiple=True,
    metavar="PREFIX",
    help="URI prefix jobs may name (repeat; replaces the default s3:// oss:// pcache://). "
    "file:// paths only when given, e.g. --allow file:///data.",
)
@click.option(
    "--allow-endpoint",
    "allow_endpoints",
    multiple=True,
    metavar="URL",
    help="endpoint_url= value jobs' s3:// and oss:// URIs may name (repeat); none by default.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Host header name to accept besides IP literals and localhost (repeat), e.g. a Service's DNS name.",
)
@click.option(
    "--token-file",
    default="",
    metavar="PATH",
    help="Bearer token file [default: STATE_DIR/daemon.token, created 0600]; $BABEL_DAEMON_TOKEN overrides it.",
)
def daemon_cmd(
    listen: str, state_dir: str | None, max_jobs: int, allow: tuple[str, ...], allow_endpoints: tuple[str, ...],
    allowed_hosts: tuple[str, ...], token_file: str,
) -> int:  # fmt: skip
    """Serve an HTTP API that queues syncs, runs schedules and keeps the job history.

    Every request needs the bearer token (the CLI on this machine finds it in the state
    directory); jobs may only name URIs under the allowed prefixes.
    """
    try:
        split_addr(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from exc
    for prefix in allow:
        if "://" not in prefix:
            raise click.BadParameter(f"expected a URI prefix such as s3://bucket/ or file:///data, got {prefix!r}",
                                     param_hint="--allow")  # fmt: skip
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        logging.getLogger("babel").setLevel(logging.INFO)  # a server logs its config and jobs without -v
    cfg = DaemonConfig(
        listen=listen, state_dir=state_dir or default_state_dir(), max_jobs=max_jobs, token_file=token_file,
        allow=tuple(allow) or DEFAULT_ALLOW, allow_endpoints=tuple(allow_endpoints), allowed_hosts=tuple(allowed_hosts),
    )  # fmt: skip
    from babel.daemon.api import serve  # the HTTP server: loaded only by this command

    run_async(serve(cfg))
    return 0


COMMANDS = [daemon_cmd]
