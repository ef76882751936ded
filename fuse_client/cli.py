"""``pcache-mount MOUNTPOINT --master ADDR``: mount PCache (wiring only)."""

from __future__ import annotations

import os
import sys
import tempfile

import click

from fuse_client.mount import MountOptions, mount, prepare_mountpoint, spawn_daemon
from pcache.common.cli import EXIT_OK, pcache_error_exit, run_cli
from pcache.common.config import load_config
from pcache.common.logs import setup_logging


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]},
    epilog="Example: pcache-mount /mnt/pcache --master 10.0.0.1:19600 --attr-timeout 5 --daemon",
)
@click.argument("mountpoint", type=click.Path())
@click.option("--master", envvar="PCACHE_MASTER", help="Master address host:port (env PCACHE_MASTER).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config ([client] section).")
@click.option(
    "--attr-timeout",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Kernel attribute cache, seconds.",
)
@click.option(
    "--entry-timeout", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Kernel name cache, seconds."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds any operation may take (RPC and data I/O).",
)
@click.option(
    "--allow-other/--no-allow-other",
    default=False,
    show_default=True,
    help="Let other users use the mount (training pods running as other uids); permission bits still apply.",
)
@click.option(
    "--max-threads",
    type=click.IntRange(min=1, max=4096),
    default=64,
    show_default=True,
    help="Requests served at once (libfuse >= 3.12; libfuse's own default is 10).",
)
@click.option("--daemon", is_flag=True, help="Mount in the background and return once mounted.")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False),
    help="Log here (daemon mode; default: a new /tmp/pcache-mount-*.log, named when mounted).",
)
@click.option("--debug", is_flag=True, help="libfuse debug output.")
@click.pass_context
def main_command(
    ctx: click.Context,
    mountpoint: str,
    master: str | None,
    config_path: str | None,
    attr_timeout: float,
    entry_timeout: float,
    timeout: float | None,
    allow_other: bool,
    max_threads: int,
    daemon: bool,
    log_file: str | None,
    debug: bool,
) -> None:
    """Mount a PCache cluster at MOUNTPOINT (extra --client.KEY=VALUE options tune the client)."""
    cfg = load_config(config_path, ctx.args).client
    if not any(a.startswith("--client.metadata_ttl") for a in ctx.args):
        # the kernel caches attributes (--attr-timeout); a second cache here would only
        # delay close-to-open visibility, so the mount asks the master at every open
        cfg.metadata_ttl = 0.0
    if not any(a.startswith("--client.statahead_ttl") for a in ctx.args):
        # what a statahead listed answers lookups while the kernel would answer from its own cache
        cfg.statahead_ttl = attr_timeout
    if not any(a.startswith("--client.tune_malloc") for a in ctx.args):
        # the mount's memory is bounded by its budgets: memory glibc keeps free in each of the
        # arenas of its many FUSE and receiver threads would come on top (test_mount_memory)
        cfg.tune_malloc = False
    if master:
        cfg.master = master
    if timeout is not None:
        cfg.rpc_timeout = cfg.io_timeout = timeout
        cfg.connect_timeout = min(cfg.connect_timeout, timeout)
    if daemon:
        # checked here first: a mount already live there would pass the wait for "mounted"
        # while the background process refuses it (another tenant's mount reported as this one)
        prepare_mountpoint(mountpoint)
        argv = [a for a in sys.argv[1:] if a != "--daemon"]
        made = log_file is None
        if made:  # its output somewhere: a mount that fails at start says why, not only its exit code
            fd, log_file = tempfile.mkstemp(prefix="pcache-mount-", suffix=".log")
            os.close(fd)
        pid = spawn_daemon(argv, mountpoint, log_file)
        click.echo(f"mounted {cfg.master} at {mountpoint} (pid {pid}" + (f", log {log_file}" if made else "") + ")")
        return
    setup_logging("DEBUG" if debug else "INFO")
    opts = MountOptions(
        attr_timeout=attr_timeout,
        entry_timeout=entry_timeout,
        allow_other=allow_other,
        max_threads=max_threads,
        debug=debug,
    )
    mount(mountpoint, cfg, opts)


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit codes as ``pcache``: 0 ok, 2 fatal, 3 usage (Ctrl-C unmounts: 0)."""
    # SIGTERM stays libfuse's (it unmounts and exits; it installs its handler only over SIG_DFL)
    return run_cli(
        main_command, "pcache-mount", argv, pcache_error_exit, on_interrupt=(EXIT_OK, None), sigterm_interrupts=False
    )


if __name__ == "__main__":
    sys.exit(main())
