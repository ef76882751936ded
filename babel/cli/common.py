"""Pieces the babel commands share: size options, the progress bar, the summary table."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from babel.sync import Progress as ProgressSink
from babel.sync import SyncReport
from pcache.common.cli import human_bytes
from pcache.common.config import parse_size
from pcache.common.errors import InvalidArgument


class Size(click.ParamType):
    """A byte size: ``4096``, ``64M``, ``1GiB`` (binary multiples)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except InvalidArgument as exc:
            self.fail(str(exc), param, ctx)


SIZE = Size()


class RichProgress:
    """A rich progress bar per phase on stderr, against the phase's total: bytes (copying) or
    objects (planning, deleting, verifying), with rates and ETA; listing has no total yet and
    counts what it found; while copying starts during the listing, the total grows with it."""

    def __init__(self, enabled: bool) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.bar = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(),
            TextColumn("{task.fields[amount]}"),
            TextColumn("{task.fields[objects]} obj {task.fields[rate]:.0f} obj/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.enabled,
        )
        self.task: Any = None
        self.objects = 0
        self.total_bytes = self.total_objects = 0

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.stop()

    def sink(self) -> ProgressSink:
        """The callbacks :func:`babel.sync.run_sync` drives."""
        return ProgressSink(phase=self.phase, advance=self.advance, grow=self.grow)

    def phase(self, name: str, total_bytes: int, total_objects: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, visible=True)
            self.bar.stop_task(self.task)
        self.objects = 0
        self.total_bytes, self.total_objects = total_bytes, total_objects
        self.task = self.bar.add_task(
            name, total=total_bytes or total_objects or None, objects=0, rate=0.0, amount=self._amount(0, 0)
        )

    def grow(self, nbytes: int, nobjects: int) -> None:
        """The phase's totals grow (copies planned while the listing goes on)."""
        if self.task is None:
            return
        self.total_bytes += nbytes
        self.total_objects += nobjects
        self.bar.update(self.task, total=self.total_bytes or self.total_objects or None)

    def _amount(self, done_bytes: float, elapsed: float) -> str:
        """What the bar measures, done of total: bytes while copying, else objects."""
        if self.total_bytes:
            rate = f", {human_bytes(done_bytes / elapsed)}/s" if elapsed > 0 else ""
            return f"{human_bytes(done_bytes)} of {human_bytes(self.total_bytes)}{rate}"
        if self.total_objects:
            return f"{self.objects:,} of {self.total_objects:,} obj"
        return f"{self.objects:,} found" if self.objects else ""

    def advance(self, nbytes: int, nobjects: int) -> None:
        if self.task is None:
            return
        self.objects += nobjects
        task = self.bar.tasks[-1]
        elapsed = task.elapsed or 0.0
        step = nbytes if self.total_bytes else nobjects
        self.bar.update(
            self.task, advance=step, objects=self.objects, rate=self.objects / elapsed if elapsed > 0 else 0.0
        )
        done = self.bar.tasks[-1].completed
        self.bar.update(self.task, amount=self._amount(done, elapsed))


T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new uvloop event loop (less CPU per request and per task
    switch than asyncio's own loop), or on asyncio's when uvloop is not installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coro)
    return uvloop.run(coro)


def print_report(
    report: SyncReport, *, as_json: bool, extra: dict[str, Any] | None = None, resume: str | None = None
) -> None:
    """The final summary: a table on stderr, or the JSON report (plus ``extra``) on stdout;
    ``resume`` says how to go on with a job that did not end ok, as ``"LABEL: COMMAND"`` (default
    ``"resume: babel sync --resume JOB"``; ``""``: nothing to say)."""
    doc = {**report.to_dict(), **(extra or {})}
    if as_json:
        json.dump(doc, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return
    console = Console(stderr=True)
    if report.fatal and not (report.listed_src or report.listed_dst or report.copied):
        # failed before anything was listed (an unreachable endpoint, a file as destination...): one line
        console.print(f"babel: {report.fatal} (job {report.job})", markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(title=f"babel job {report.job}: {report.state}", show_header=False)
    table.add_column(justify="right", style="bold")
    table.add_column()
    table.add_row("source", f"{report.src} ({report.listed_src} objects)")
    table.add_row("destination", f"{report.dst} ({report.listed_dst} objects)")
    verb = "would copy" if report.dry_run else "copied"
    table.add_row(verb, f"{report.copied} objects, {human_bytes(report.copied_bytes)}")
    if report.already_done:
        table.add_row("already done", f"{report.already_done} objects (resumed job)")
    if report.vanished:
        table.add_row("vanished", f"{report.vanished} objects deleted at the source before their turn (not copied)")
    if report.parts_reused:
        table.add_row("parts reused", str(report.parts_reused))
    if report.resent_bytes:
        table.add_row("sent again", f"{human_bytes(report.resent_bytes)} an interrupted run had on their way")
    table.add_row("skipped", f"{report.skipped} (unchanged)")
    if report.not_files:
        kinds = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in report.not_files.items())
        table.add_row("not files", f"{kinds} in the source: not copied (symlinks are not followed)")
    if report.planned_delete:
        deleted = "would delete" if report.dry_run else "deleted"
        table.add_row(deleted, f"{report.deleted} of {report.planned_delete} extraneous")
    table.add_row("failed", str(report.failed))
    table.add_row("time", f"{report.seconds:.1f} s, {human_bytes(doc['bytes_per_second'])}/s, {report.retries} retries")
    v = report.verification
    if v and not report.dry_run:
        table.add_row(
            "metadata check", f"{v['metadata']['checked'] - v['metadata']['failed']}/{v['metadata']['checked']} ok"
        )
        rt = v["runtime"]
        table.add_row(
            "runtime check",
            f"CRC32C in-stream for {rt['crc32c_in_stream']} objects; "
            f"store checksum compared for {rt['store_checksum_compared']}",
        )
        for mode in ("sample", "full"):
            if v[mode]["checked"]:
                ok = v[mode]["checked"] - v[mode]["failed"]
                table.add_row(
                    f"{mode} check", f"{ok}/{v[mode]['checked']} ok, {human_bytes(v[mode]['bytes_read'])} read"
                )
        for f in v["failures"][:10]:
            table.add_row("[red]NOT VERIFIED", f"{f['key']}: {f['check']}: {f['detail']}")
    copy_errors = [e for e in report.errors if not e["error"].startswith("verification (")]  # shown above
    for err in copy_errors[:10]:
        table.add_row("[red]error", f"{err['key']}: {err['error']}" if err["key"] else err["error"])
    if report.errors_total > min(10, len(report.errors)):
        table.add_row(
            "", f"{report.errors_total} errors in all; --json lists the first {len(report.errors)}"
            + (f" ({doc['errors_not_listed']} not listed)" if doc["errors_not_listed"] else "")
        )  # fmt: skip
    if report.fatal:
        table.add_row("[red]fatal", report.fatal)
    if report.state != "ok" and not report.dry_run and resume != "":
        label, _, command = (resume or f"resume: babel sync --resume {report.job}").partition(": ")
        table.add_row(label, command)
    console.print(table)
