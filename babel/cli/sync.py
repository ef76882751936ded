"""``babel sync SRC DST``: make DST hold what SRC holds (wiring only)."""

from __future__ import annotations

import click

from babel.cli.common import SIZE, RichProgress, print_report, run_async
from babel.journal import default_state_dir
from babel.options import CONCURRENCY, SAMPLES, BadOption, SyncOptions
from babel.scaleout import CHUNK_KEYS, DEFAULT_TTL, SHARD_KEYS
from babel.sync import mark_interrupted, planned, run_sync
from pcache.common.cli import EXIT_FATAL


@click.command(
    "sync",
    epilog="""Examples:

\b
  babel sync file:///data/shards s3://train-data/shards?endpoint_url=http://10.0.0.5:9000
  babel sync s3://ckpt/run7/step-4000 pcache://10.0.0.2:7000/ckpt/step-4000 --verify full
  babel sync --resume 20261129-133000-ab12cd
  babel sync s3://a/data s3://b/data --etcd 10.0.0.9:2379 --job copy-data   # on every host that helps
""",
)
@click.argument("src", required=False)
@click.argument("dst", required=False)
@click.option("--include", multiple=True, help="Only keys matching this glob (repeatable; `*.pt`, `logs/**`).")
@click.option("--exclude", multiple=True, help="Leave keys matching this glob alone (repeatable; wins over --include).")
@click.option(
    "--dry-run", "-n", is_flag=True, help="Plan and report, change nothing; print each key it would copy or delete."
)
@click.option("--delete", is_flag=True, help="Delete destination objects missing from the source (after copies).")
@click.option(
    "--max-delete", type=int, default=-1, help="Refuse all deletions when more are planned. [default: no limit]"
)
@click.option(
    "--checkers", type=click.IntRange(*CONCURRENCY), default=16, show_default=True, help="HEADs/verifications at once."
)
@click.option(
    "--transfers",
    type=click.IntRange(*CONCURRENCY),
    default=16,
    show_default=True,
    help="Objects/parts copied at once.",
)
@click.option(
    "--list-concurrency",
    type=click.IntRange(*CONCURRENCY),
    default=32,
    show_default=True,
    help="Listing calls at once per side.",
)
@click.option("--bwlimit", type=SIZE, default=None, help="Bandwidth limit in bytes/s (e.g. 100M).")
@click.option("--verify", "verify_mode", type=click.Choice(["none", "sample", "full"]), default="sample", show_default=True,
              help="Content check after copying (metadata is always validated).")  # fmt: skip
@click.option("--size-only", is_flag=True, help="Skip objects of equal size (ignore mtimes).")
@click.option("--ignore-times", is_flag=True,
              help="Copy every object, even one of equal size and mtime (repairs what babel verify found corrupt).")  # fmt: skip
@click.option(
    "--checksum", "-c", is_flag=True, help="Compare stored CRC32Cs instead of mtimes where both sides have one."
)
@click.option("--multipart-threshold", type=SIZE, default="64M", show_default=True, help="Multipart from this size.")
@click.option(
    "--part-size",
    type=SIZE,
    default=None,
    help="Part size (default: chosen from the object size); raised to the store's minimum where it has one (5 MiB on S3).",
)
@click.option("--memory", type=SIZE, default="512M", show_default=True, help="Object bytes held in memory at once.")
@click.option(
    "--samples", type=click.IntRange(*SAMPLES), default=32, show_default=True, help="Sampled ranges per object."
)
@click.option(
    "--state-dir", default=None, help="Where job journals live [default: $BABEL_STATE_DIR or ~/.local/state/babel]."
)
@click.option("--resume", "resume", metavar="JOB", default=None, help="Resume a killed or failed job by its id.")
@click.option("--daemon", "daemon_addr", metavar="ADDR", default=None, help="Submit the job to `babel daemon` at ADDR.")
@click.option("--etcd", metavar="HOST:PORT[,...]", default=None,
              help="Share the job with every babel process given the same --etcd and --job (scale-out).")  # fmt: skip
@click.option("--job", "shared_job", metavar="NAME", default=None, help="The shared job's name (with --etcd).")
@click.option("--shard-keys", type=click.IntRange(1), default=SHARD_KEYS, show_default=True,
              help="Source keys per shard of a shared job (one process works on a shard at a time).")  # fmt: skip
@click.option("--chunk-keys", type=click.IntRange(1), default=CHUNK_KEYS, show_default=True,
              help="Source keys per chunk of a shard: the cursor's step, the most a takeover repeats.")  # fmt: skip
@click.option("--lease-ttl", type=click.FloatRange(2.0), default=DEFAULT_TTL, show_default=True,
              help="Seconds after which a dead process's shards are taken over (with --etcd).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--progress/--no-progress", default=True, help="Progress bar on stderr (only on a terminal).")
def sync_cmd(src, dst, include, exclude, dry_run, delete, max_delete, checkers, transfers, list_concurrency, bwlimit,
             verify_mode, size_only, ignore_times, checksum, multipart_threshold, part_size, memory, samples, state_dir,
             resume, daemon_addr, etcd, shared_job, shard_keys, chunk_keys, lease_ttl, as_json, progress) -> int:  # fmt: skip
    """Copy new and changed objects from SRC to DST, verified; resumable after a crash.

    With --etcd and --job, every process given the same command shares the job: the key space is
    cut into shards that the processes claim in etcd; a shard whose process died is taken over
    from its last finished chunk within --lease-ttl seconds. Without SRC and DST a process joins
    the named job as it was submitted."""
    state_dir = state_dir or default_state_dir()
    options = SyncOptions(
        include=tuple(include), exclude=tuple(exclude), dry_run=dry_run, delete=delete, max_delete=max_delete,
        checkers=checkers, transfers=transfers, list_concurrency=list_concurrency, bwlimit=bwlimit,
        verify=verify_mode, size_only=size_only, ignore_times=ignore_times, checksum=checksum, multipart_threshold=multipart_threshold,
        part_size=part_size, memory=memory, samples=samples,
    )  # fmt: skip
    try:
        options.check()  # the daemon applies the same rules to its jobs' options
    except BadOption as exc:
        raise click.BadParameter(exc.reason, param_hint="--" + exc.field.replace("_", "-")) from exc
    if etcd or shared_job:
        if resume or daemon_addr:
            raise click.UsageError(
                "--etcd does not go with --resume or --daemon: give the same command again to resume"
            )
        return _shared(src, dst, etcd, shared_job, state_dir, options, shard_keys, chunk_keys, lease_ttl, as_json)
    if resume is None and (not src or not dst):
        raise click.UsageError("give SRC and DST, or --resume JOB")
    if resume is not None and (src or dst):
        raise click.UsageError("--resume takes its SRC and DST from the job; do not give them again")
    if resume is not None:
        given = _given_options(("resume",))
        if given:
            raise click.UsageError(f"--resume runs the job with its own options; do not give {', '.join(given)}")
    if daemon_addr:
        from babel.daemon import client_token, submit

        job = submit(daemon_addr, src, dst, options, token=client_token(state_dir))
        click.echo(job["id"])
        return 0
    started: list[str] = []
    try:
        with RichProgress(progress and not as_json) as bar:
            report = run_async(run_sync(src or "", dst or "", options, state_dir=state_dir, job_id=resume,
                                          progress=bar.sink(), on_job=started.append))  # fmt: skip
    except FileNotFoundError as exc:
        if resume is None or started:
            raise
        raise click.UsageError(f"{exc} (babel jobs lists them)") from exc  # a mistyped id: exit 3, as a bad flag
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the journal is closed; record it and say how to go on
        if not started:
            raise
        mark_interrupted(state_dir, started[0])
        click.echo(f"babel: interrupted; resume with: babel sync --resume {started[0]}", err=True)
        return EXIT_FATAL
    extra = None
    if report.dry_run and started:
        steps = planned(state_dir, started[0])
        if as_json:  # the plan in the report: {"action", "key", "reason"} per step
            extra = {"plan": [{"action": a, "key": k, "reason": r} for a, k, r in steps]}
        else:
            verbs = {"copy": "would copy", "delete": "would delete", "fail": "cannot copy"}
            for action, key, reason in steps:
                click.echo(f"{verbs[action]:<13} {key}" + (f"  ({reason})" if reason else ""))
    print_report(report, as_json=as_json, extra=extra)
    return report.exit_code


def _given_options(allowed: tuple[str, ...]) -> list[str]:
    """The sync options given on the command line, but ``allowed`` and those every form takes."""
    ctx = click.get_current_context()
    always = ("state_dir", "as_json", "progress", "src", "dst", *allowed)
    return [
        p.opts[0] for p in ctx.command.params
        if p.name not in always and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE
    ]  # fmt: skip


def _shared(src, dst, etcd, job, state_dir, options, shard_keys, chunk_keys, lease_ttl, as_json) -> int:
    """``babel sync --etcd HOST:PORT --job NAME [SRC DST]``: take part in a shared job until it ends."""
    from babel.errors import BabelError
    from babel.scaleout import NoSuchJob, SharedJob

    if not etcd or not job:
        raise click.UsageError("a shared job needs both --etcd HOST:PORT and --job NAME")
    if bool(src) != bool(dst):
        raise click.UsageError("give SRC and DST, or neither to join the job as it was submitted")
    if not src:
        given = _given_options(("etcd", "shared_job", "lease_ttl"))
        if given:
            raise click.UsageError(f"joining job {job} takes its options from etcd; do not give {', '.join(given)}")
    if options.dry_run:
        raise click.UsageError("--dry-run does not go with --etcd: run it without --etcd to see the plan")

    async def main():
        shared = SharedJob(etcd, job, state_dir, ttl=lease_ttl, on_event=lambda line: click.echo(line, err=True))
        try:
            if src:
                await shared.submit(src, dst, options, shard_keys=shard_keys, chunk_keys=chunk_keys)
            return await shared.run(), shared.chunks_done, shared.member
        finally:
            await shared.close()

    try:
        report, mine, member = run_async(main())
    except FileNotFoundError as exc:
        raise NoSuchJob(f"{exc} at {etcd}: give SRC and DST to submit it") from exc
    except BabelError as exc:
        if isinstance(exc, ValueError):  # a bad name, another job's settings: exit 3, as a bad flag
            raise
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        click.echo(f"babel: interrupted; the other processes of job {job} take over its shards, or give the same "
                   "command again", err=True)  # fmt: skip
        return EXIT_FATAL
    resume = (f"canceled: babel cancel {job} --etcd {etcd} --forget once every process exited, then submit it again"
              if report.state == "canceled" else f"resume: the same command again (--etcd {etcd} --job {job})")  # fmt: skip
    print_report(report, as_json=as_json, extra={"shared": {"etcd": etcd, "member": member, "chunks_by_me": mine}},
                 resume=resume)  # fmt: skip
    return report.exit_code


COMMANDS = [sync_cmd]
