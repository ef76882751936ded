"""``babel ls URI``: list objects with the parallel lister (wiring only)."""

from __future__ import annotations

import json
import sys
import time

import click

from babel.cli.common import run_async
from babel.sync import iter_listing
from pcache.common.cli import human_bytes


@click.command("ls", epilog="Example:\n\n  babel ls s3://train-data/shards?endpoint_url=http://127.0.0.1:9000 -l")
@click.argument("uri")
@click.option("-l", "--long", "long_", is_flag=True, help="Show size and mtime.")
@click.option("--summary", is_flag=True, help="Print only the object count and total size.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--concurrency", type=click.IntRange(1, 1024), default=32, show_default=True, help="Listing calls at once."
)
def ls_cmd(uri: str, long_: bool, summary: bool, as_json: bool, concurrency: int) -> int:
    """List every object under URI (unordered: pages arrive from many ranges at once)."""
    count = total = 0
    start = time.monotonic()

    async def go() -> None:
        nonlocal count, total
        async for page in iter_listing(uri, concurrency=concurrency):
            count += len(page)
            total += sum(o.size for o in page)
            if summary:
                continue
            out = []
            for o in page:
                if as_json:
                    out.append(json.dumps({"key": o.key, "size": o.size, "mtime": o.mtime, "etag": o.etag}))
                elif long_:
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(o.mtime))
                    out.append(f"{o.size:>14} {stamp} {o.key}")
                else:
                    out.append(o.key)
            sys.stdout.write("\n".join(out) + "\n")

    run_async(go())
    if summary or long_:
        click.echo(f"{count} objects, {human_bytes(total)} ({total} bytes), listed in {time.monotonic() - start:.1f} s",
                   err=not summary)  # fmt: skip
    return 0


COMMANDS = [ls_cmd]
