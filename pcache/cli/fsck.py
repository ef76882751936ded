"""``pcache fsck``: find files with corrupt, missing or under-replicated blocks; salvage one."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from google.protobuf.json_format import MessageToDict

from pcache.cli.common import resolve_master
from pcache.common.cli import EXIT_OK, EXIT_PARTIAL

if TYPE_CHECKING:
    from pcache.client import Client


@click.command(
    epilog="Examples: pcache fsck /ckpt ; pcache fsck /ckpt/step-100/shard-0.distcp --salvage ./shard-0.distcp"
)
@click.argument("path", default="/")
@click.option(
    "--salvage",
    "dest",
    type=click.Path(dir_okay=False, writable=True),
    help="Copy the readable chunks of the file PATH here.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def fsck(ctx: click.Context, path: str, dest: str | None, as_json: bool) -> int:
    """Check the files under PATH; exit 1 if any block is corrupt or missing."""
    from pcache.client import Client

    with Client(master=resolve_master(ctx)) as pc:
        _wait_for_block_reports(pc)
        report = pc.fsck(path)
        result = pc.salvage(path, dest) if dest else None
        damaged = [d for d in report.damaged if d.state in ("corrupt", "missing")]
        # `pcache status` counts every tenant's damaged files; a tenant's token checks its own
        elsewhere = pc.status().damaged_files - len({d.path for d in damaged}) if path in ("", "/") else 0
    if as_json:
        out = MessageToDict(report, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        if result is not None:
            out["salvage"] = {"dest": dest, "size": result.size, "lost": [list(r) for r in result.lost]}
        click.echo(json.dumps(out, indent=2))
    else:
        for d in report.damaged:
            holders = ",".join(a.worker_id for a in d.good) or "-"
            bad = ",".join(a.worker_id for a in d.quarantined) or "-"
            dead = "".join(
                f"  held by {a.worker_id} ({a.host}:{a.port}, node {a.node_id}) when it died" for a in d.dead
            )
            click.echo(
                f"{d.state.upper():<17} {d.path}  block {d.index} (id {d.block_id}, bytes {d.offset}+{d.length})"
                f"  good: {holders}  quarantined: {bad}{dead}"
            )
        files = len({d.path for d in damaged})
        click.echo(
            f"{report.files} files, {report.blocks} blocks: {len(damaged)} damaged blocks in {files} files,"
            f" {len(report.damaged) - len(damaged)} under-replicated"
        )
        if elsewhere > 0:
            click.echo(
                f"note: {elsewhere} more damaged files in the cluster are not under what this token sees"
                " (pcache status counts every tenant's): run fsck with the admin token to name them"
                " ($PCACHE_TOKEN_FILE=CLUSTER_DIR/secrets/admin.token)"
            )
        if result is not None:
            click.echo(
                f"salvaged {path} -> {dest}: {result.size - result.lost_bytes} of {result.size} bytes;"
                f" lost (zeros): {', '.join(f'{o}+{n}' for o, n in result.lost) or 'none'}"
            )
    return EXIT_PARTIAL if damaged or (result is not None and result.lost) else EXIT_OK


def _wait_for_block_reports(pc: Client) -> None:
    """Right after a master (re)started or took over, wait until the workers have reported
    their blocks (``starting_left``, at most :data:`REPORT_WAIT_MAX` seconds): until then a
    block of a worker not re-registered yet looks missing, and a cron job's fsck would raise a
    false alarm (``pcache status`` exits 0 then, for the same reason)."""
    import sys
    import time

    deadline = time.monotonic() + REPORT_WAIT_MAX
    said = False
    while (left := pc.status().starting_left) > 0 and time.monotonic() < deadline:
        if not said:
            print(f"pcache fsck: the master started moments ago: waiting {left:.1f} s for the workers to report"
                  " their blocks", file=sys.stderr)  # fmt: skip
            said = True
        time.sleep(min(left, 1.0) + 0.05)


REPORT_WAIT_MAX = 120.0  # seconds fsck waits for a (re)started master's block reports
COMMANDS = [fsck]
