"""``babel jobs``: the job history of this machine or of a daemon (wiring only)."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from babel.journal import default_state_dir, list_jobs
from pcache.common.process import process_alive


@click.command("jobs", epilog="Examples:\n\n\b\n  babel jobs\n  babel jobs --daemon 127.0.0.1:7700 --json")
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--daemon", "daemon_addr", metavar="ADDR", default=None, help="Ask `babel daemon` at ADDR instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.option("--limit", type=int, default=20, show_default=True, help="Newest N jobs.")
def jobs_cmd(state_dir: str | None, daemon_addr: str | None, as_json: bool, limit: int) -> int:
    """List sync jobs, newest first, with their state and summary."""
    if daemon_addr:
        from babel.daemon import client_token, fetch_jobs

        jobs = fetch_jobs(daemon_addr, token=client_token(state_dir or default_state_dir()))
    else:
        jobs = list_jobs(state_dir or default_state_dir())
    jobs = jobs[:limit]
    if as_json:
        click.echo(json.dumps(jobs, indent=1, sort_keys=True))
        return 0
    table = Table(show_lines=False)
    # the id is what `babel sync --resume` needs: never cut it, whatever the terminal width
    table.add_column("job", no_wrap=True, min_width=max((len(j.get("id", "?")) for j in jobs), default=3))
    for name in ("kind", "state", "phase"):
        table.add_column(name, no_wrap=True)
    for name in ("src", "dst"):
        table.add_column(name, overflow="fold")
    for name in ("copied", "failed", "updated"):
        table.add_column(name, no_wrap=True)
    for job in jobs:
        s = job.get("summary") or {}
        state = job.get("state", "?")
        if state == "running" and not daemon_addr and not process_alive(job.get("pid")):
            state = "interrupted"  # its process died: `babel sync --resume ID`
        table.add_row(
            job.get("id", "?"), job.get("kind", "sync"), state, job.get("phase", ""), job.get("src", ""), job.get("dst", ""),
            str(s.get("copied", "")), str(s.get("failed", "")),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.get("updated", 0))),
        )  # fmt: skip
    Console().print(table)
    return 0


COMMANDS = [jobs_cmd]
