"""File commands: put, get, ls, stat, rm, mkdir, mv, du, cat."""

from __future__ import annotations

import json
import stat as stat_mod
import sys
import time
from typing import TYPE_CHECKING

import click

from pcache.cli.common import resolve_master
from pcache.common.cli import human_bytes

if TYPE_CHECKING:
    from pcache.client import Client


def _client(ctx: click.Context) -> Client:
    from pcache.client import Client

    return Client(master=resolve_master(ctx))


@click.command(epilog="Example: pcache put ./dataset /datasets/wiki")
@click.argument("local", type=click.Path(exists=True))
@click.argument("remote")
@click.pass_context
def put(ctx: click.Context, local: str, remote: str) -> None:
    """Copy a local file or directory (recursively) into PCache."""
    start = time.monotonic()
    with _client(ctx) as pc:
        files, nbytes = pc.put(local, remote)
    secs = time.monotonic() - start
    click.echo(f"put {files} files, {human_bytes(nbytes)} in {secs:.2f}s ({human_bytes(nbytes / max(secs, 1e-9))}/s)")


@click.command(epilog="Example: pcache get /datasets/wiki ./wiki-copy")
@click.argument("remote")
@click.argument("local", type=click.Path())
@click.pass_context
def get(ctx: click.Context, remote: str, local: str) -> None:
    """Copy a PCache file or directory (recursively) to the local disk."""
    start = time.monotonic()
    with _client(ctx) as pc:
        files, nbytes = pc.get(remote, local)
    secs = time.monotonic() - start
    click.echo(f"got {files} files, {human_bytes(nbytes)} in {secs:.2f}s ({human_bytes(nbytes / max(secs, 1e-9))}/s)")


@click.command(epilog="Example: pcache ls -l /datasets")
@click.argument("path", default="/")
@click.option("-l", "long", is_flag=True, help="Long listing: mode, size, mtime.")
@click.pass_context
def ls(ctx: click.Context, path: str, long: bool) -> None:
    """List a directory (or show one file)."""
    with _client(ctx) as pc:
        st = pc.stat(path)
        entries = pc.listdir(path) if st.is_dir else [st]
    for e in entries:
        name = e.name + ("/" if e.is_dir else "")
        if long:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime))
            target = f" -> {e.symlink_target}" if stat_mod.S_ISLNK(e.mode) else ""  # as ls -l
            click.echo(f"{stat_mod.filemode(e.mode)} {e.size:>14} {when} {name}{target}")
        else:
            click.echo(name)


@click.command("stat", epilog="Example: pcache stat /datasets/wiki/shard-0000.bin")
@click.argument("path")
@click.pass_context
def stat_cmd(ctx: click.Context, path: str) -> None:
    """Show a path's metadata as JSON."""
    with _client(ctx) as pc:
        st = pc.stat(path)
    out = dict(st.__dict__)
    out["mode"] = stat_mod.filemode(st.mode)
    click.echo(json.dumps(out, indent=2))


@click.command(epilog="Example: pcache rm -r /scratch/old-run")
@click.argument("paths", nargs=-1, required=True)
@click.option("-r", "recursive", is_flag=True, help="Remove directories and their contents.")
@click.pass_context
def rm(ctx: click.Context, paths: tuple[str, ...], recursive: bool) -> None:
    """Remove files (and with -r, directory trees)."""
    with _client(ctx) as pc:
        for path in paths:
            pc.remove(path, recursive=recursive)


@click.command(epilog="Example: pcache mkdir -p /ckpt/run-1")
@click.argument("paths", nargs=-1, required=True)
@click.option("-p", "parents", is_flag=True, help="Create parents; no error if it exists.")
@click.pass_context
def mkdir(ctx: click.Context, paths: tuple[str, ...], parents: bool) -> None:
    """Create directories."""
    with _client(ctx) as pc:
        for path in paths:
            pc.mkdir(path, parents=parents)


@click.command(epilog="Example: pcache mv /ckpt/step-100.tmp /ckpt/step-100")
@click.argument("src")
@click.argument("dst")
@click.pass_context
def mv(ctx: click.Context, src: str, dst: str) -> None:
    """Rename atomically (into DST if it is a directory)."""
    with _client(ctx) as pc:
        try:
            if pc.stat(dst).is_dir:
                dst = dst.rstrip("/") + "/" + src.rstrip("/").rsplit("/", 1)[-1]
        except FileNotFoundError:
            pass
        pc.rename(src, dst)


@click.command(epilog="Example: pcache ln /datasets/wiki/v3 /datasets/wiki/latest")
@click.argument("src")
@click.argument("dst")
@click.option("-s", "symbolic", is_flag=True, help="Make a symbolic link to SRC (SRC is not checked).")
@click.pass_context
def ln(ctx: click.Context, src: str, dst: str, symbolic: bool) -> None:
    """Make DST a hard link to the file SRC (another name of it), or with -s a symbolic link."""
    with _client(ctx) as pc:
        if symbolic:
            pc.symlink(src, dst)
        else:
            pc.link(src, dst)


@click.command(epilog="Example: pcache du /datasets")
@click.argument("paths", nargs=-1)
@click.option("-h", "human", is_flag=True, help="Human-readable sizes.")
@click.pass_context
def du(ctx: click.Context, paths: tuple[str, ...], human: bool) -> None:
    """Bytes, files and directories under each path."""
    with _client(ctx) as pc:
        for path in paths or ("/",):
            nbytes, files, dirs = pc.du(path)
            size = human_bytes(nbytes) if human else str(nbytes)
            click.echo(f"{size}\t{files} files\t{dirs} dirs\t{path}")


@click.command(epilog="Example: pcache cat /datasets/README")
@click.argument("path")
@click.pass_context
def cat(ctx: click.Context, path: str) -> None:
    """Write a file's bytes to stdout."""
    out = sys.stdout.buffer
    with _client(ctx) as pc, pc.open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            out.write(chunk)


COMMANDS = [put, get, ls, stat_cmd, rm, mkdir, mv, ln, du, cat]
