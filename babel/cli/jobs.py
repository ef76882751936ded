"""``babel jobs``: the job history of this machine or of a daemon (wiring only)."""

from __future__ import annotations

import json
import os
import signal
import time

import click
from rich.console import Console
from rich.table import Table

from babel.journal import default_state_dir, list_jobs
from pcache.common.cli import human_bytes
from pcache.common.process import process_alive

ETCD_OPTION = click.option(
    "--etcd",
    metavar="HOST:PORT[,...]",
    default=None,
    help="Shared jobs in the etcd whose members are listed (any one that answers).",
)


@click.command(
    "jobs",
    epilog="Examples:\n\n\b\n  babel jobs\n  babel jobs --daemon 127.0.0.1:7700 --json"
    "\n  babel jobs --etcd 10.0.0.9:2379\n  babel jobs copy-data --etcd 10.0.0.9:2379    # its shards",
)
@click.argument("job_id", metavar="[JOB]", required=False)
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--daemon", "daemon_addr", metavar="ADDR", default=None, help="Ask `babel daemon` at ADDR instead.")
@ETCD_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.option("--limit", type=int, default=20, show_default=True, help="Newest N jobs.")
def jobs_cmd(
    job_id: str | None, state_dir: str | None, daemon_addr: str | None, etcd: str | None, as_json: bool, limit: int
) -> int:
    """List sync jobs, newest first, with their state and summary; with --etcd the shared jobs,
    and with a JOB name its shards (key range, keys, chunks done, owner)."""
    if etcd:
        return _shared_jobs(etcd, job_id, as_json)
    if job_id:
        raise click.UsageError("a JOB argument shows a shared job's shards: give --etcd too")
    if daemon_addr:
        from babel.daemon import client_token, fetch_jobs

        jobs = fetch_jobs(daemon_addr, token=client_token(state_dir or default_state_dir()))
    else:
        jobs = list_jobs(state_dir or default_state_dir())
    jobs = jobs[:limit]
    for job in jobs if not daemon_addr else ():
        if job.get("state") == "running" and not process_alive(job.get("pid")):
            job["state"] = "interrupted"  # its process died: `babel sync --resume ID` (table and JSON alike)
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
        table.add_row(
            job.get("id", "?"), job.get("kind", "sync") + (" (dry run)" if (job.get("options") or {}).get("dry_run") else ""),
            job.get("state", "?"), job.get("phase", ""), job.get("src", ""), job.get("dst", ""),
            str(s.get("copied", "")), str(s.get("failed", "")),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.get("updated", 0))),
        )  # fmt: skip
    _console().print(table)
    return 0


def _console() -> Console:
    """stdout for tables: the terminal's width, or 200 columns into a pipe or file (rich's 80 cut
    the job ids and counts of a table a script reads)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


SHARED_ALONE_WAIT = 30.0  # seconds a shared job may have no process before `babel wait` says it is interrupted


def _shared_state(job: dict) -> str:
    """A shared job's state as shown: ``running`` with no process alive is ``stalled`` (nothing
    copies until a process joins: ``babel sync --etcd HOST:PORT --job NAME``)."""
    return "stalled" if job["state"] == "running" and not job.get("members") else job["state"]


def _etcd_call(etcd: str, fn, *args):
    """Run a coroutine function of :mod:`babel.scaleout`; its errors become one line."""
    import asyncio

    from babel.errors import BabelError
    from babel.scaleout import ETCD_ERRORS, etcd_error, parse_etcd

    try:
        return asyncio.run(fn(*args))
    except (FileNotFoundError, BabelError) as exc:
        raise click.ClickException(str(exc)) from exc
    except ETCD_ERRORS as exc:
        raise click.ClickException(f"etcd at {parse_etcd(etcd)}: {etcd_error(exc)}") from exc


def _shared_jobs(etcd: str, job_id: str | None, as_json: bool) -> int:
    from babel.scaleout import describe_job, shared_jobs

    if job_id is None:
        jobs = _etcd_call(etcd, shared_jobs, etcd)
        if as_json:
            click.echo(json.dumps(jobs, indent=1, sort_keys=True))
            return 0
        table = Table()
        table.add_column("job", no_wrap=True, min_width=max((len(j["id"]) for j in jobs), default=3))
        for name in ("state", "shards", "members"):
            table.add_column(name, no_wrap=True)
        for name in ("src", "dst"):
            table.add_column(name, overflow="fold")
        table.add_column("copied", no_wrap=True)
        for job in jobs:
            done = sum(s["state"] != "todo" for s in job["shards"])
            s = job["summary"]
            table.add_row(job["id"], _shared_state(job), f"{done}/{len(job['shards'])}" if job["cut"] else job["phase"],
                          str(len(job["members"])), job["src"], job["dst"],
                          f"{s['copied']} ({human_bytes(s['copied_bytes'])})")  # fmt: skip
        _console().print(table)
        return 0
    job = _etcd_call(etcd, describe_job, etcd, job_id)
    if as_json:
        click.echo(json.dumps(job, indent=1, sort_keys=True))
        return 0
    s = job["summary"]
    click.echo(f"{job['id']}: {_shared_state(job)} ({job['phase']}), {len(job['members'])} processes, "
               f"copied {s['copied']} ({human_bytes(s['copied_bytes'])}), failed {s['failed']}")  # fmt: skip
    if s.get("fatal"):
        click.echo(f"fatal: {s['fatal']}")
    table = Table()
    for name in ("shard", "keys after", "up to", "keys", "chunks", "state", "owner", "copied"):
        table.add_column(name, overflow="fold" if name in ("keys after", "up to") else "ellipsis")
    for sh in job["shards"]:
        owner = sh["owner"] + (" (working)" if sh["working"] else "") if sh["owner"] else ""
        table.add_row(str(sh["index"]), sh["after"] or "(start)", sh["until"] if sh["until"] is not None else "(end)",
                      str(sh["keys"]), f"{sh['done']}/{sh['chunks']}", sh["state"], owner, str(sh["copied"]))  # fmt: skip
    _console().print(table)
    return 0


def _is_babel(pid: int) -> bool:
    """Whether process ``pid`` runs babel (its command line), not a program that got a dead job's pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"babel" in fh.read()
    except OSError:
        return False


def _job_doc(job_id: str, state_dir: str, daemon_addr: str | None) -> dict:
    """A job's job.json, from the daemon at ``daemon_addr`` or the local state directory."""
    if daemon_addr:
        from babel.daemon import client_token, fetch_job

        return fetch_job(daemon_addr, job_id, token=client_token(state_dir))
    doc = next((j for j in list_jobs(state_dir) if j.get("id") == job_id), None)
    if doc is None:
        raise click.ClickException(f"no job {job_id!r} in {state_dir}")
    return doc


@click.command(
    "cancel",
    epilog="Examples:\n\n\b\n  babel cancel JOB --daemon 127.0.0.1:7700\n  babel cancel JOB"
    "\n  babel cancel copy-data --etcd 10.0.0.9:2379",
)
@click.argument("job_id", metavar="JOB")
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--daemon", "daemon_addr", metavar="ADDR", default=None, help="The job runs in `babel daemon` at ADDR.")
@ETCD_OPTION
@click.option("--forget", is_flag=True, help="With --etcd: delete the shared job's keys from etcd (after it stopped).")
def cancel_cmd(job_id: str, state_dir: str | None, daemon_addr: str | None, etcd: str | None, forget: bool) -> int:
    """Stop a running job; it stays resumable (babel sync --resume JOB, or the daemon's resume).

    A job of a local `babel sync` is sent SIGTERM (it stops as on Ctrl-C). A shared job (--etcd)
    is marked canceled: each process stops within seconds (dropping the chunk on its way) and exits 2; a
    canceled shared job is not resumed (a restarted pod would undo the cancel): --forget it once
    its processes exited, and submit it again."""
    state_dir = state_dir or default_state_dir()
    if forget and not etcd:
        raise click.UsageError("--forget goes with --etcd")
    if etcd:
        return _cancel_shared(etcd, job_id, forget)
    if daemon_addr:
        from babel.daemon import cancel_job, client_token

        doc = cancel_job(daemon_addr, job_id, token=client_token(state_dir))
        click.echo(f"{job_id}: {doc['state']}")
        return 0
    doc = _job_doc(job_id, state_dir, None)
    pid = doc.get("pid")
    if doc.get("state") != "running" or not isinstance(pid, int) or not process_alive(pid):
        raise click.ClickException(f"job {job_id} is not running ({doc.get('state', '?')})")
    if doc.get("runner") == "daemon":
        raise click.ClickException(f"job {job_id} runs in a babel daemon (pid {pid}): give --daemon ADDR")
    if not _is_babel(pid):  # the job's process died and its pid was reused: never signal a stranger
        raise click.ClickException(f"job {job_id} is not running (pid {pid} is another program now)")
    os.kill(pid, signal.SIGTERM)
    click.echo(f"{job_id}: SIGTERM sent to pid {pid}")
    return 0


def _cancel_shared(etcd: str, job_id: str, forget: bool) -> int:
    from babel.scaleout import SharedJob

    async def cancel() -> int:
        job = SharedJob(etcd, job_id, "")
        try:
            if forget:  # also the keys of a job forgotten while a process still wrote (no spec)
                n = await job.delete()
                if not n:
                    raise FileNotFoundError(f"no shared job {job_id!r} in etcd")
                return n
            await job.spec()  # FileNotFoundError: no such job
            await job.cancel()
            return 0
        finally:
            await job.close()

    n = _etcd_call(etcd, cancel)
    click.echo(f"{job_id}: {f'forgotten ({n} keys deleted from etcd)' if forget else 'canceled'}")
    return 0


@click.command(
    "wait",
    epilog="Examples:\n\n\b\n  babel wait JOB --daemon 127.0.0.1:7700 --timeout 3600"
    "\n  babel wait copy-data --etcd 10.0.0.9:2379",
)
@click.argument("job_id", metavar="JOB")
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--daemon", "daemon_addr", metavar="ADDR", default=None, help="The job runs in `babel daemon` at ADDR.")
@ETCD_OPTION
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit 124, as timeout(1)).")
@click.option(
    "--orphan-after",
    type=click.FloatRange(min=0),
    default=SHARED_ALONE_WAIT,
    show_default=True,
    help="With --etcd: seconds a shared job may have no process before it counts as interrupted.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the finished job's job.json.")
def wait_cmd(
    job_id: str,
    state_dir: str | None,
    daemon_addr: str | None,
    etcd: str | None,
    timeout: float | None,
    orphan_after: float,
    as_json: bool,
) -> int:
    """Block until a job has finished; exit 0 ok, 1 partial, 2 failed, canceled or interrupted
    (its process died), 124 when --timeout passed first (still running). With --etcd, a shared job (its state in
    etcd: done when every shard is; interrupted once no process has held it for --orphan-after seconds)."""
    state_dir = state_dir or default_state_dir()
    deadline = None if timeout is None else time.monotonic() + timeout
    alone_since: float | None = None  # a shared job: since when no process holds it
    while True:
        if etcd:
            from babel.scaleout import describe_job

            doc = _etcd_call(etcd, describe_job, etcd, job_id)
        else:
            doc = _job_doc(job_id, state_dir, daemon_addr)
        state = doc.get("state", "created")  # made, not started yet
        if state in ("running", "queued") and not daemon_addr and not etcd and not process_alive(doc.get("pid")):
            state = "interrupted"
        if etcd and state == "running" and not doc.get("members"):
            alone_since = alone_since or time.monotonic()
            if time.monotonic() - alone_since >= orphan_after:
                click.echo(f"babel: no process has held shared job {job_id} for {orphan_after:g} s (they died):"
                           f" babel sync --etcd {etcd} --job {job_id} goes on with it", err=True)  # fmt: skip
                state = "interrupted"
        else:
            alone_since = None
        if state not in ("running", "queued", "created"):
            break
        if deadline is not None and time.monotonic() > deadline:
            click.echo(f"babel: job {job_id} still {state} after {timeout:g} s", err=True)
            return EXIT_WAIT_TIMEOUT
        time.sleep(0.5)
    if as_json:
        click.echo(json.dumps(doc, indent=1, sort_keys=True))
    else:
        click.echo(f"{job_id}: {state}")
    return {"ok": 0, "partial": 1}.get(state, 2)


EXIT_WAIT_TIMEOUT = 124  # `babel wait --timeout` gave up: the job still runs (not failed: exit 2)
COMMANDS = [jobs_cmd, cancel_cmd, wait_cmd]
