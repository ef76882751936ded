"""``babel verify SRC DST``: compare two trees without copying (wiring only)."""

from __future__ import annotations

import click

from babel.cli.common import RichProgress, print_report, run_async
from babel.journal import default_state_dir
from babel.sync import SyncOptions, run_verify


@click.command(
    "verify",
    epilog="""Examples:

\b
  babel verify s3://ckpt/step-4000 pcache://10.0.0.2:7000/ckpt/step-4000
  babel verify file:///data/shards s3://train-data/shards --mode full --json
""",
)
@click.argument("src")
@click.argument("dst")
@click.option("--mode", type=click.Choice(["metadata", "sample", "full"]), default="sample", show_default=True,
              help="metadata: sizes and stored mtimes/CRCs; sample: plus sampled ranges; full: every byte.")  # fmt: skip
@click.option("--include", multiple=True, help="Only keys matching this glob (repeatable).")
@click.option("--exclude", multiple=True, help="Skip keys matching this glob (repeatable).")
@click.option(
    "--checkers", type=click.IntRange(1, 1024), default=16, show_default=True, help="Objects checked at once."
)
@click.option(
    "--samples", type=click.IntRange(2, 100000), default=32, show_default=True, help="Sampled ranges per object."
)
@click.option("--state-dir", default=None, help="Where job journals live.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--progress/--no-progress", default=True, help="Progress bar on stderr (only on a terminal).")
def verify_cmd(src, dst, mode, include, exclude, checkers, samples, state_dir, as_json, progress) -> int:
    """Check that DST holds the same objects as SRC: exit 0 when all match, 1 when some differ."""
    options = SyncOptions(include=tuple(include), exclude=tuple(exclude), checkers=checkers, samples=samples,
                          verify="none" if mode == "metadata" else mode)  # fmt: skip
    with RichProgress(progress and not as_json) as bar:
        report = run_async(run_verify(src, dst, options, state_dir=state_dir or default_state_dir(),
                                        progress=bar.sink()))  # fmt: skip
    repair = (
        ""
        if report.state == "failed"
        # a failed verify (e.g. unreachable) has nothing to repair
        else (
            f"repair: babel sync '{src}' '{dst}' --ignore-times (copies them again; --include /KEY for each"
            " failed object, or every object is copied again)"
        )
    )
    print_report(report, as_json=as_json, resume=repair)
    return report.exit_code


COMMANDS = [verify_cmd]
