"""``pcache master`` and ``pcache worker``: run one server process."""

from __future__ import annotations

import asyncio

import click

from pcache.common.config import load_config
from pcache.common.logs import setup_logging

SERVER_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True}


def _run(coro_factory) -> None:
    try:
        import uvloop

        uvloop.run(coro_factory())
    except ImportError:  # pragma: no cover
        asyncio.run(coro_factory())


@click.command(
    context_settings=SERVER_SETTINGS,
    epilog="Example: pcache master --master.data_dir=/var/lib/pcache/master --master.port=19600",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Write host:port here once serving.")
@click.pass_context
def master(ctx: click.Context, config_path: str | None, ready_file: str | None) -> None:
    """Run the metadata master (overrides: --master.KEY=VALUE)."""
    from pcache.master.server import serve

    cfg = load_config(config_path, ctx.args).master
    setup_logging(cfg.log_level)
    _run(lambda: serve(cfg, ready_file=ready_file))


@click.command(
    context_settings=SERVER_SETTINGS,
    epilog="Example: pcache worker --worker.data_dir=/nvme0/pcache --worker.master=10.0.0.1:19600",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Write host:port here once serving.")
@click.pass_context
def worker(ctx: click.Context, config_path: str | None, ready_file: str | None) -> None:
    """Run a block worker on this node (overrides: --worker.KEY=VALUE)."""
    from pcache.worker.server import serve

    cfg = load_config(config_path, ctx.args).worker
    setup_logging(cfg.log_level)
    _run(lambda: serve(cfg, ready_file=ready_file))


COMMANDS = [master, worker]
