"""Helpers for the deploy/ checks: parse a command line against the real click commands.

A command line from a manifest or a unit is parsed with ``make_context`` (nothing runs), then the
``--section.key=value`` overrides that ``pcache master``/``worker`` and ``pcache-mount`` pass
through to :func:`pcache.common.config.load_config` are loaded with the deployment's own TOML
file, so a misspelt option, key or value fails here as it would fail at start on a node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from babel.cli import daemon as babel_daemon_cli
from babel.cli.main import cli as babel_cli
from babel.daemon import split_addr
from fuse_client.cli import main_command as mount_command
from pcache.cli import serve
from pcache.cli.main import cli as pcache_cli
from pcache.common.config import PCacheConfig, load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

PROGRAMS: dict[str, click.Command] = {"pcache": pcache_cli, "pcache-mount": mount_command, "babel": babel_cli}
"""Console scripts of pyproject.toml by name, as the click commands they run."""

CONFIGURED = (serve.master, serve.worker, mount_command)
"""Commands whose --config file and extra arguments go through load_config."""


def parse_command(argv: Sequence[str]) -> click.Context:
    """Parse ``argv`` (the program first, by path or name) without running it; returns the leaf context.

    Group options before a subcommand are not supported (none of the deployments uses them):
    the word after a group must name a subcommand.

    Raises:
        click.UsageError: an unknown program, subcommand or option, a bad or missing value.
    """
    prog = os.path.basename(argv[0])
    if prog not in PROGRAMS:
        raise click.UsageError(f"{prog} is not a console script of this project")
    command, info_name, args, parent = PROGRAMS[prog], prog, list(argv[1:]), None
    while isinstance(command, click.Group):
        parent = click.Context(command, info_name=info_name, parent=parent)
        sub = command.get_command(parent, args[0]) if args else None
        if sub is None:
            raise click.UsageError(f"{info_name}: no subcommand {args[:1]}")
        command, info_name, args = sub, args[0], args[1:]
    return command.make_context(info_name, args, parent=parent)


@dataclass
class Checked:
    """A command line that parsed."""

    ctx: click.Context
    """The context of the command that would run (its ``params`` and extra ``args``)."""
    config: PCacheConfig | None
    """For ``pcache master``/``worker`` and ``pcache-mount``: the configuration it would run with."""


def check_command(argv: Sequence[str], files: Mapping[str, Path]) -> Checked:
    """Parse ``argv`` and load its configuration as the process would at start.

    Args:
        argv: the command line, with environment references already substituted.
        files: the deployment's files by the path the process sees (``/etc/pcache/pcache.toml``)
            -> where they are in this repository.

    Raises:
        click.UsageError: see :func:`parse_command`; extra arguments to a command that takes none.
        InvalidArgument: an unknown config key or override, a value of the wrong type or range.
        KeyError: a --config path the deployment does not provide.
    """
    ctx = parse_command(argv)
    config = None
    if ctx.command in CONFIGURED:
        path = ctx.params["config_path"]
        config = load_config(files[path] if path else None, ctx.args)
    elif ctx.args:
        raise click.UsageError(f"{ctx.command.name}: unexpected arguments {ctx.args}")
    if ctx.command is babel_daemon_cli.daemon_cmd:
        split_addr(ctx.params["listen"])  # ValueError unless HOST:PORT
    return Checked(ctx, config)


def substitute(text: str, pattern: str, lookup: Callable[[str], str]) -> str:
    """Replace every match of ``pattern`` (one group: the variable name) with ``lookup(name)``."""
    return re.sub(pattern, lambda m: lookup(m.group(1)), text)


MEMORY_UNITS = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def memory_bytes(quantity: str | int) -> int:
    """A Kubernetes memory quantity (``24Gi``, ``512M``, ``1000``) in bytes."""
    text = str(quantity)
    for suffix in sorted(MEMORY_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * MEMORY_UNITS[suffix])
    return int(text)


def systemd_bytes(value: str) -> int:
    """A systemd memory size (``24G``: K, M, G, T are powers of 1024 there) in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if value[-1:] in units:
        return int(float(value[:-1]) * units[value[-1]])
    return int(value)
