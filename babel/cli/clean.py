"""``babel clean``: what abandoned jobs left behind (wiring over :func:`babel.sync.clean_job`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

import click

from babel.journal import default_state_dir, list_jobs
from babel.sync import clean_job
from pcache.common.cli import EXIT_PARTIAL, human_bytes
from pcache.common.process import process_alive

EXAMPLES = """Examples:

\b
  babel clean 20261204-193119-10d536      # one job
  babel clean --all                       # every interrupted, failed or partial job
  babel clean --all --dry-run             # only say which
"""


@click.command("clean", epilog=EXAMPLES)
@click.argument("jobs", nargs=-1)
@click.option(
    "--all", "every", is_flag=True, help="Every abandoned job: interrupted (its process died), failed, partial."
)
@click.option("--dry-run", "-n", is_flag=True, help="List the jobs that would be cleaned; change nothing.")
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--json", "as_json", is_flag=True, help="Print what was cleaned as JSON.")
def clean_cmd(jobs: tuple[str, ...], every: bool, dry_run: bool, state_dir: str | None, as_json: bool) -> int:
    """Abort the multipart uploads abandoned jobs left open, delete Babel's temporary files in
    their file-system destinations, and forget the jobs (they can no longer be resumed).

    A running job is never touched. Exits 1 when some job could not be cleaned."""
    state_dir = state_dir or default_state_dir()
    if bool(jobs) == every:
        raise click.UsageError("give job ids, or --all")
    known = {j["id"]: j for j in list_jobs(state_dir) if "id" in j}
    if every:
        jobs = tuple(
            jid for jid, j in known.items()
            if j.get("state") in ("failed", "partial", "interrupted", "canceled")
            or (j.get("state") == "running" and not process_alive(j.get("pid")))
        )  # fmt: skip
    busy = {j.get("dst") for jid, j in known.items() if j.get("state") == "running" and process_alive(j.get("pid"))}
    results: list[dict[str, Any]] = []
    failed = 0
    for jid in jobs:
        job = known.get(jid)
        if job is None:
            results.append({"job": jid, "error": "no such job"})
            failed += 1
            continue
        if job.get("state") == "running" and process_alive(job.get("pid")):
            results.append({"job": jid, "error": f"running (pid {job.get('pid')}): not cleaned"})
            failed += 1
            continue
        state = "interrupted" if job.get("state") == "running" else job.get("state")  # its process died
        if job.get("kind") == "shared":  # a chunk of a shared job: its uploads are the shared job's (etcd)
            if not dry_run:
                try:
                    shutil.rmtree(os.path.join(state_dir, jid))
                except OSError as exc:
                    results.append({"job": jid, "error": f"{type(exc).__name__}: {exc}"})
                    failed += 1
                    continue
            results.append({"job": jid, "state": state, "chunk_of": job.get("shared", "?"), "dry_run": dry_run})
            continue
        if dry_run:
            results.append({"job": jid, "state": state, "dst": job.get("dst"), "dry_run": True})
            continue
        try:
            done = asyncio.run(clean_job(state_dir, jid, temp_files=job.get("dst") not in busy))
        except OSError as exc:  # a store error (BabelError is one), or the state directory
            results.append({"job": jid, "error": f"{type(exc).__name__}: {exc}"})
            failed += 1
            continue
        results.append({"job": jid, **done})
    if as_json:
        click.echo(json.dumps(results, indent=1))
    else:
        for r in results:
            if "error" in r:
                click.echo(f"{r['job']}: {r['error']}", err=True)
            elif "chunk_of" in r:
                click.echo(f"{r['job']}: {'would forget' if r['dry_run'] else 'forgot'} this host's journal of a chunk"
                           f" of shared job {r['chunk_of']} ({r['state']}; its uploads are the shared job's)")  # fmt: skip
            elif r.get("dry_run"):
                click.echo(f"{r['job']}: would clean ({r['state']}, destination {r['dst']})")
            else:
                temp = (f", {r['temp_files']} temporary file{'' if r['temp_files'] == 1 else 's'}"
                        f" ({human_bytes(r['temp_bytes'])}) deleted"
                        if r["temp_files"] else "")  # fmt: skip
                n = r["uploads_aborted"]
                click.echo(f"{r['job']}: {n} upload{'' if n == 1 else 's'} aborted{temp}; forgotten")
        if not results:
            click.echo("nothing to clean")
    return EXIT_PARTIAL if failed else 0


COMMANDS = [clean_cmd]
