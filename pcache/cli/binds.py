"""``pcache bind``, ``unbind``, ``binds``, ``refresh``, ``load``, ``free``: directories bound to an
under-store (wiring only)."""

from __future__ import annotations

import json
import os
import time

import click
from google.protobuf.json_format import MessageToDict

from pcache.cli.common import resolve_master
from pcache.cli.tenant import admin_client
from pcache.client.load import LoadReport
from pcache.common.cli import EXIT_OK, EXIT_PARTIAL, human_bytes
from pcache.common.errors import InvalidArgument

EXAMPLES = """Examples:

\b
  pcache bind /datasets/web 's3://corpus/web/?endpoint_url=http://10.0.0.5:9000&profile=train'
  pcache bind /datasets/imagenet s3://imagenet/train/ --meta-ttl immutable
  pcache bind /ckpt/run7 s3://ckpt/run7/ --mode writeback
  pcache binds
  pcache refresh /datasets/web        # list it from the store again now
  pcache load /datasets/web           # fetch it all into the cache now, on every worker
  pcache load --check /datasets/web   # how much of it is cached
  pcache free /datasets/web           # evict its cached blocks (the files stay)
  pcache persist --wait /ckpt/run7/step-1000   # block until a write-back directory is in its store
  pcache unbind /datasets/web

Credentials are named, never given: profile= (a section of the hosts' AWS config),
credentials_file= (an AWS credentials file on every host, e.g. a mounted Secret), or the
hosts' environment (AWS_ACCESS_KEY_ID, instance roles). The admin token comes from
$PCACHE_ADMIN_TOKEN_FILE, else CLUSTER_DIR/secrets/admin.token.
"""


def parse_ttl(text: str) -> float:
    """Seconds of ``--meta-ttl`` (``immutable``: -1, never checked again).

    Raises:
        InvalidArgument: neither seconds >= 0 nor ``immutable``.
    """
    if text.strip().lower() == "immutable":
        return -1.0
    try:
        value = float(text)
    except ValueError:
        value = -2.0
    if not value >= 0 or value == float("inf"):
        raise InvalidArgument(f"--meta-ttl takes seconds >= 0 or 'immutable', not {text!r}")
    return value


@click.command("bind", epilog=EXAMPLES)
@click.argument("path")
@click.argument("uri")
@click.option("--mode", type=click.Choice(["ro", "writeback"]), default="ro", show_default=True,
              help="ro: read-through, no writes; writeback: files closed here are uploaded.")  # fmt: skip
@click.option("--meta-ttl", "meta_ttl", default="60", show_default=True,
              help="Seconds a listed object is trusted before it is checked again; 'immutable': never.")  # fmt: skip
@click.option(
    "--no-check", is_flag=True, help="Do not list the store once first (it is unreachable from the master now)."
)
@click.pass_context
def bind_cmd(ctx: click.Context, path: str, uri: str, mode: str, meta_ttl: str, no_check: bool) -> None:
    """Bind directory PATH (new, or empty) to the object-store prefix URI."""
    ttl = parse_ttl(meta_ttl)
    with admin_client(ctx) as pc:
        bind = pc.bind(path, uri, mode=mode, meta_ttl=ttl, check=not no_check)
    click.echo(f"{bind.path} -> {bind.uri} ({bind.mode}, {_ttl(bind.meta_ttl)})")


@click.command("unbind", epilog=EXAMPLES)
@click.argument("path")
@click.option(
    "--force", is_flag=True, help="Unbind a write-back bind whose uploads are not done: those files are lost."
)
@click.pass_context
def unbind_cmd(ctx: click.Context, path: str, force: bool) -> None:
    """Remove the bind at PATH and what is cached under it; the store keeps its objects. A
    write-back bind with files not uploaded yet is refused (pcache persist --wait PATH first)."""
    with admin_client(ctx) as pc:
        pc.unbind(path, force=force)
    click.echo(f"unbound {path}")


@click.command("binds", epilog=EXAMPLES)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def binds_cmd(ctx: click.Context, as_json: bool) -> None:
    """The bound directories, their stores, modes and metadata TTLs (a tenant's token: its own)."""
    from pcache.client import Client
    from pcache.common.credentials import TOKEN_ENV, TOKEN_FILE_ENV

    # a token the caller named ($PCACHE_TOKEN[_FILE]) is the one asked with: a tenant's lists
    # its own binds, even on a host whose cluster directory holds the admin token
    named = os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_FILE_ENV)
    with Client(master=resolve_master(ctx)) if named else admin_client(ctx) as pc:
        binds = pc.binds()
    if as_json:
        click.echo(json.dumps([MessageToDict(b, preserving_proto_field_name=True) for b in binds], indent=2))
        return
    # the tenant column: an admin's view shows namespace paths (/default/ckpt), a tenant's its own (/ckpt)
    click.echo(f"{'path':<28} {'tenant':<12} {'mode':<10} {'meta ttl':<10} {'bound':<20} uri")
    for b in binds:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.created))
        click.echo(f"{b.path:<28} {b.tenant or '-':<12} {b.mode:<10} {_ttl(b.meta_ttl):<10} {when:<20} {b.uri}")


@click.command("refresh", epilog=EXAMPLES)
@click.argument("path")
@click.pass_context
def refresh_cmd(ctx: click.Context, path: str) -> None:
    """List the bound directory PATH from its store again now (a file: check it), whatever the TTL."""
    from pcache.client import Client

    with Client(master=resolve_master(ctx)) as pc:
        node = pc.refresh(path)
    click.echo(f"refreshed {path} ({'directory' if node.is_dir else f'{node.size} bytes'})")


@click.command("load", epilog=EXAMPLES)
@click.argument("path")
@click.option("--metadata-only", is_flag=True, help="Only list the tree (the master keeps what the store lists).")
@click.option("--check", is_flag=True, help="Fetch nothing: report how much is cached.")
@click.option("--evict", is_flag=True, help="Evict instead of loading (as pcache free).")
@click.option("-j", "--concurrency", type=click.IntRange(1, 1024), default=32, show_default=True,
              help="Directories listed at once, and blocks each worker fetches at once.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.pass_context
def load_cmd(
    ctx: click.Context, path: str, metadata_only: bool, check: bool, evict: bool, concurrency: int, as_json: bool,
    no_progress: bool,
) -> int:  # fmt: skip
    """Warm the cache: fetch every file under PATH from its under-store, spread over all workers.

    Exits 1 when some file could not be loaded (the first errors are listed)."""
    from pcache.client import Client

    if sum((metadata_only, check, evict)) > 1:
        raise click.UsageError("--metadata-only, --check and --evict exclude each other")
    if evict:
        return ctx.invoke(free_cmd, path=path, as_json=as_json)
    fetching = not (metadata_only or check)
    with Client(master=resolve_master(ctx)) as pc, _LoadProgress(enabled=not (no_progress or as_json)) as bar:
        before = _cache_room(pc) if fetching else None
        report = pc.load(
            path, metadata_only=metadata_only, check=check, concurrency=concurrency, on_progress=bar.update
        )
        after = _cache_room(pc) if before is not None else None
    evicted = after[1] - before[1] if before is not None and after is not None and after[2] == before[2] else None
    capacity = after[0] if after is not None else None
    copies = max(1, after[3]) if after is not None else 1
    if as_json:
        out = {k: getattr(report, k) for k in report.__dataclass_fields__}
        out["missing_blocks"] = report.missing_blocks
        out["cache_capacity_bytes"], out["evicted_bytes_meanwhile"] = capacity, evicted
        out["cache_copies"] = copies
        click.echo(json.dumps(out, indent=2))
    else:
        _echo_load(report, metadata_only, check)
    if fetching and capacity is not None and report.bytes * copies > capacity:
        gone = (
            f"{human_bytes(evicted)} of cached bound files were evicted during the load, least recently used"
            " first, so the files it loaded first are gone again"
            if evicted
            else "eviction (least recently used first) will remove the files it loaded first as the cache"
            " passes its high watermark"
        )
        click.echo(
            f"warning: {path} holds {human_bytes(report.bytes)}, more than the {human_bytes(capacity // copies)} the"
            f" live workers cache at {copies} cop{'y' if copies == 1 else 'ies'} of each block ({human_bytes(capacity)}"
            f" of disk; eviction keeps them under their high watermark): {gone}. Load a part that fits, or let"
            " the readers fetch it through the cache.",
            err=True,
        )
    elif fetching and evicted and not as_json:
        click.echo(f"evicted meanwhile: {human_bytes(evicted)} of other bound files (least recently used first)")
    return EXIT_PARTIAL if report.failed else EXIT_OK


def _cache_room(pc) -> tuple[int, int, int, int] | None:
    """(capacity of the live workers, bytes of bound files evicted so far, the leader's epoch,
    the copies of each block), in bytes; None when the master does not say (a load goes on
    without it)."""
    from pcache.common.errors import PCacheError

    try:
        st = pc.status()
    except PCacheError:
        return None
    return (
        sum(w.info.capacity_bytes for w in st.workers if w.alive),
        st.evicted_bytes,
        st.epoch,
        st.default_replication,
    )


@click.command("free", epilog=EXAMPLES)
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def free_cmd(ctx: click.Context, path: str, as_json: bool) -> None:
    """Evict the cached blocks of the bound files under PATH; they are fetched again when read.
    Files written to PCache itself, and files not yet persisted, keep theirs."""
    from pcache.client import Client

    with Client(master=resolve_master(ctx)) as pc:
        report = pc.free(path)
    if as_json:
        click.echo(json.dumps({"files": report.files, "blocks": report.blocks, "bytes": report.bytes}))
    else:
        click.echo(f"freed {report.blocks} blocks ({human_bytes(report.bytes)}) of {report.files} bound files")


@click.command("persist", epilog=EXAMPLES)
@click.argument("path")
@click.option("--wait", is_flag=True, help="Block until every file under PATH is in its store.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="Seconds --wait waits at most.")
@click.pass_context
def persist_cmd(ctx: click.Context, path: str, wait: bool, timeout: float) -> int:
    """Write-back state of the files under PATH (a write-back bind): pending, done, failed.

    Exits 1 when a file's upload keeps failing (or --wait timed out)."""
    from pcache.client import Client
    from pcache.common.errors import Timeout, Unavailable

    with Client(master=resolve_master(ctx)) as pc:
        if wait:
            started = time.monotonic()

            unclosed = pc.unclosed_check()

            def waiting(pending: list) -> None:  # a line every 10 s: silence looked like a hang
                first = pending[0]
                why = (
                    f"; its last attempt failed: {first.persist_error}"
                    if first.persist_error
                    else "; queued or uploading: no attempt has failed yet"
                )
                why = "; not closed by its writer yet: uploaded once it is" if unclosed(first) else why
                click.echo(f"waited {time.monotonic() - started:.0f} s: {len(pending)} files not in their store yet"
                           f" ({first.path}{why})", err=True)  # fmt: skip

            try:
                count = pc.wait_persisted(path, timeout=timeout, on_wait=waiting)
            except (Timeout, Unavailable) as exc:
                click.echo(f"pcache: {exc}", err=True)
                return EXIT_PARTIAL
            if not any(st.persist for st in pc.walk_files(path)):
                click.echo(f"no file under {path} is in a write-back bind: nothing to wait for")
            else:
                click.echo(f"{count} files under {path} are in their store")
            return EXIT_OK
        counts: dict[str, int] = {}
        failed, open_ = [], []
        unclosed = pc.unclosed_check()
        for st in pc.walk_files(path):
            state = "not closed" if unclosed(st) else st.persist or ("in the store" if st.listed else "not write-back")
            counts[state] = counts.get(state, 0) + 1
            if st.persist == "failed":
                failed.append(st)
            elif state == "not closed":
                open_.append(st)
    click.echo("  ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no files")
    for st in failed[:20]:
        click.echo(f"  {st.path}: {st.persist_error}", err=True)
    for st in open_[:20]:
        click.echo(f"  {st.path}: not closed by its writer yet (uploaded once it is; a writer that died leaves it so)",
                   err=True)  # fmt: skip
    return EXIT_PARTIAL if failed else EXIT_OK


def _echo_load(report: LoadReport, metadata_only: bool, check: bool) -> None:
    rate = report.fetched_bytes / report.seconds if report.seconds else 0.0
    click.echo(
        f"{report.files} files ({human_bytes(report.bytes)}) in {report.dirs} directories, {report.seconds:.1f} s"
    )
    if not metadata_only and not report.blocks:
        click.echo("nothing to fetch: no file under it has data")
    elif not metadata_only:
        cached = 100.0 * report.cached_bytes / report.bytes if report.bytes else 100.0
        click.echo(f"cached before: {report.cached_blocks} of {report.blocks} blocks ({cached:.1f}% of the bytes)")
        if not check:
            click.echo(
                f"fetched: {report.fetched_blocks} blocks, {human_bytes(report.fetched_bytes)} ({human_bytes(rate)}/s)"
            )
    if report.failed:
        click.echo(f"failed: {report.failed} (first {len(report.errors)} below)", err=True)
        for where, error in report.errors:
            click.echo(f"  {where}: {error}", err=True)


class _LoadProgress:
    """A rich progress bar of a load on stderr: files, bytes (of the total found so far), rate, ETA."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("[bold]load"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TextColumn("{task.fields[files]} files"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not (enabled and console.is_terminal),
        )
        self.task = self.bar.add_task("load", total=None, files=0)

    def __enter__(self) -> _LoadProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def update(self, report: LoadReport) -> None:
        done = report.cached_bytes + report.fetched_bytes
        self.bar.update(self.task, completed=done, total=report.bytes or None, files=report.files)


def _ttl(seconds: float) -> str:
    return "immutable" if seconds < 0 else f"{seconds:g} s"


COMMANDS = [bind_cmd, unbind_cmd, binds_cmd, refresh_cmd, load_cmd, free_cmd, persist_cmd]
