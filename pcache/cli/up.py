"""``pcache up``: start a local cluster (master + N workers) and keep it running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pcache.common.config import load_config
from pcache.common.credentials import tokens_file
from pcache.common.errors import InvalidArgument, PCacheError
from pcache.common.process import die_with_parent, process_alive, stop_process

if TYPE_CHECKING:
    from pcache.local import Proc


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    epilog="Example: pcache up --data-dir ./pcache-data --workers 3 --mount /mnt/pcache  (Ctrl-C stops it)",
)
@click.option("--data-dir", default=None, help="Root of the cluster's data (default from [cluster]).")
@click.option("--workers", type=click.IntRange(0, 256), default=None, help="Worker processes to start.")
@click.option(
    "--masters",
    type=click.IntRange(1, 5),
    default=None,
    help="Masters: 1 alone (default); 2 or 3 a leader + followers on an etcd started here.",
)
@click.option("--port", type=int, default=None, help="Master port (default 19600; 0 picks a free one).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config for every process.")
@click.option("--mount", "mount_dir", type=click.Path(file_okay=False), help="Also mount the cluster here (FUSE).")
@click.option("--tls", is_flag=True, help="Mutual TLS everywhere, with a throw-away CA in DATA_DIR/tls.")
@click.pass_context
def up(
    ctx: click.Context,
    data_dir: str | None,
    workers: int | None,
    masters: int | None,
    port: int | None,
    config_path: str | None,
    mount_dir: str | None,
    tls: bool,
) -> None:
    """Start a local cluster; extra --master.K=V / --worker.K=V go to the processes."""
    from pcache.local import LocalCluster

    load_config(config_path, ctx.args)  # every override valid (unknown sections too) before anything starts
    cfg = load_config(config_path, [a for a in ctx.args if a.startswith("--cluster.")])
    master_args = [a for a in ctx.args if a.startswith("--master.")]
    worker_args = [a for a in ctx.args if a.startswith("--worker.")]
    load_config(None, master_args + worker_args)  # validate before starting anything
    if cfg.cluster.worker_capacity_bytes:
        worker_args.append(f"--worker.capacity_bytes={cfg.cluster.worker_capacity_bytes}")
    root = data_dir or cfg.cluster.data_dir
    running = _running_process(root)
    if running:
        raise InvalidArgument(f"{root} is in use by a running cluster ({running[0]} pid {running[1]}); stop it first")
    cluster = LocalCluster(
        data_dir=root,
        workers=workers if workers is not None else cfg.cluster.workers,
        masters=masters if masters is not None else cfg.cluster.masters,
        master_port=port if port is not None else cfg.master.port,
        config=config_path,
        master_args=master_args,
        worker_args=worker_args,
        start_timeout=cfg.cluster.start_timeout,
        tls=tls,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    mount_proc: subprocess.Popen | None = None
    try:
        cluster.start(manifest=False)
        if mount_dir:
            mount_proc = _mount(cluster, mount_dir)
            click.echo(f"mount    {mount_dir}  (log {cluster.root / 'logs' / 'mount.log'})")
        cluster.write_manifest(**({"mount": os.path.abspath(mount_dir)} if mount_dir else {}))
        if cluster.etcd is not None:
            click.echo(f"etcd     {cluster.etcd.endpoint}  (data {cluster.etcd.data_dir})")
            for proc in cluster.master_procs:
                click.echo(f"{proc.name:<8} {proc.address}  (data {cluster.root / proc.name})")
            click.echo(f"masters  {cluster.master_address}  (leader: {cluster.leader().name}; see pcache status)")
        else:
            click.echo(f"master   {cluster.master_address}")
        for proc in cluster.worker_procs:
            click.echo(f"{proc.name:<8} {proc.address}  (data {cluster.root / proc.name})")
        click.echo(f"manifest {cluster.root / 'cluster.json'}; logs in {cluster.root / 'logs'}")
        click.echo(
            f"token    {cluster.secrets / 'token'} (tenant default; clients on this machine find it in"
            f" {tokens_file()}), admin.token and worker.token beside it"
        )
        if cluster.tls_dir:
            click.echo(f"tls      {cluster.tls_dir} (CA, certificate, key; clients on this machine find it too)")
        click.echo("cluster is up; Ctrl-C or SIGTERM stops it", err=True)
        reported: set[str] = set()
        restarted: dict[int, float] = {}
        failed: set[int] = set()  # masters whose last restart failed: still down, not "exited" again
        handed: set[int] = set()  # masters whose data directory another process took: not ours now

        def restart_due(index: int, proc: Proc) -> bool:
            """Whether master ``index`` (-1: the single one) is down and due a restart; one whose
            data directory another process holds (a master restarted by hand, as the operator
            guide describes) is left to it, once said."""
            if proc.alive() or index in handed or time.monotonic() - restarted.get(index, -1e9) <= 10:
                return False
            if _held_by_another(cluster.root / proc.name / "meta"):
                handed.add(index)
                click.echo(f"pcache up: {proc.name} exited, and another process holds its data directory (a master"
                           " started by hand?): it is left to that process, not restarted nor stopped by pcache up",
                           err=True)  # fmt: skip
                return False
            restarted[index] = time.monotonic()
            return True

        def restart_failed(index: int, name: str, exc: PCacheError) -> None:
            failed.add(index)
            click.echo(f"pcache up: {name} did not restart: {exc}", err=True)

        def exited(index: int, proc: Proc) -> str:
            if index in failed:
                return f"{proc.name} is still down"
            return f"{proc.name} exited ({proc.popen.returncode if proc.popen else '?'})"

        while not stop.wait(1.0):
            etcd = cluster.etcd
            if etcd is not None and etcd.proc.poll() is not None and time.monotonic() - restarted.get(-2, -1e9) > 10:
                restarted[-2] = time.monotonic()  # etcd died: back on its data directory (one try per 10 s)
                click.echo(
                    f"pcache up: etcd exited ({etcd.proc.returncode}); restarting it (log {etcd.log_path})", err=True
                )
                try:
                    cluster.start_etcd()
                    cluster.write_manifest(**({"mount": os.path.abspath(mount_dir)} if mount_dir else {}))
                except PCacheError as exc:
                    click.echo(f"pcache up: etcd did not restart: {exc}", err=True)
            for index, proc in enumerate(cluster.master_procs):
                # a master of the pair died: it comes back as the follower (one try per 10 s)
                if restart_due(index, proc):
                    click.echo(f"pcache up: {exited(index, proc)}; restarting it as a follower", err=True)
                    try:
                        cluster.start_ha_master(index)
                        cluster.write_manifest(**({"mount": os.path.abspath(mount_dir)} if mount_dir else {}))
                        failed.discard(index)
                    except PCacheError as exc:
                        restart_failed(index, proc.name, exc)
            master = cluster.master
            if master is not None and restart_due(-1, master):  # the single master died: back on its data directory
                click.echo(f"pcache up: {exited(-1, master)}; restarting it (log {master.log})", err=True)
                try:
                    cluster.start_master()
                    cluster.write_manifest(**({"mount": os.path.abspath(mount_dir)} if mount_dir else {}))
                    failed.discard(-1)
                except PCacheError as exc:
                    restart_failed(-1, "the master", exc)
            for child in cluster.worker_procs:
                if child is not None and not child.alive() and child.name not in reported:
                    reported.add(child.name)
                    click.echo(f"pcache up: {child.name} exited; see {child.log}", err=True)
    finally:
        if mount_proc is not None:
            _unmount(mount_proc, mount_dir)
        cluster.stop()
        click.echo("cluster stopped", err=True)


def _held_by_another(meta_dir: Path) -> bool:
    """Whether another process holds the RocksDB ``LOCK`` of the metastore ``meta_dir`` (a
    master runs on it). RocksDB locks the file with ``fcntl`` record locks, which a probe from
    this process takes and gives back at once when nobody holds them."""
    import fcntl

    try:
        fd = os.open(meta_dir / "LOCK", os.O_RDWR)
    except OSError:
        return False  # never opened: nobody holds it
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _running_process(root: str) -> tuple[str, int] | None:
    """(name, pid) of a live process recorded in ``root/cluster.json`` (a master, or a worker
    whose master died: a second cluster on the directory would share its blocks), if any."""
    from pcache.common.errors import PCacheError
    from pcache.local import read_manifest

    try:
        pids = {str(name): int(pid) for name, pid in read_manifest(root)["pids"].items()}
    except (PCacheError, KeyError, ValueError, AttributeError, TypeError):
        return None
    return next(((name, pid) for name, pid in pids.items() if process_alive(pid)), None)


def _mount(cluster, mount_dir: str) -> subprocess.Popen:
    from fuse_client.mount import wait_mounted

    os.makedirs(mount_dir, exist_ok=True)
    with open(cluster.root / "logs" / "mount.log", "ab") as log:
        proc = subprocess.Popen(
            [
                *die_with_parent(signal.SIGTERM),  # a killed `pcache up` unmounts too
                sys.executable,
                "-m",
                "fuse_client",
                mount_dir,
                "--master",
                cluster.master_address,
                *(["--config", cluster.config] if cluster.config else []),
            ],  # its [client] section
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_mounted(mount_dir, 30, proc, str(cluster.root / "logs" / "mount.log"))
    return proc


def _unmount(proc: subprocess.Popen, mount_dir: str | None) -> None:
    from fuse_client.mount import stop_mount

    if mount_dir:
        stop_mount(proc, mount_dir)
    else:
        stop_process(proc, grace=20)


COMMANDS = [up]
