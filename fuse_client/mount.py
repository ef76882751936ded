"""Mount lifecycle: stale-mount cleanup, mount options, foreground or daemon, unmount."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from pcache.common.config import ClientConfig
from pcache.common.errors import InvalidArgument, PCacheError, Timeout
from pcache.common.process import stop_process

logger = logging.getLogger(__name__)

MiB = 1 << 20
LIBFUSE_STOPPED_BY_SIGNAL = 8  # fuse_main()'s status after a signal ended the loop (libfuse 3)


@dataclass
class MountOptions:
    """How the kernel may cache and how long operations may take."""

    attr_timeout: float = 1.0
    """Seconds the kernel caches file attributes."""
    entry_timeout: float = 1.0
    """Seconds the kernel caches name lookups."""
    negative_timeout: float = 0.0
    """Seconds the kernel caches "no such file" (0: a file created elsewhere is seen at once)."""
    allow_other: bool = False
    """Let other users (training pods) use the mount; needs root or user_allow_other. The kernel
    checks permission bits either way (default_permissions)."""
    max_request: int = MiB
    """Bytes per read/write request to the kernel (libfuse3)."""
    max_threads: int = 64
    """Requests the mount serves at once (libfuse >= 3.12's worker threads; its default is 10:
    the eleventh reader of a training job's loaders waited for one of the first ten, even for a
    block the page cache of another worker would answer at once)."""
    debug: bool = False
    """libfuse debug output."""


def mounted(mountpoint: str) -> str | None:
    """The filesystem type mounted at ``mountpoint`` per /proc/self/mounts, or None."""
    target = os.path.realpath(mountpoint)
    with contextlib.suppress(OSError), open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[1].replace("\\040", " ") == target:
                return parts[2]
    return None


def mount_device(target: str) -> str | None:
    """The ``major:minor`` of the filesystem mounted at the resolved path ``target`` (from
    mountinfo; no stat, no ``realpath``: both would ask a FUSE mount's own daemon)."""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 4 and parts[4].replace("\\040", " ") == target:
                return parts[2]
    return None


def raise_readahead(mountpoint: str, kib: int, timeout: float = 10.0) -> None:
    """Once mounted, let the kernel read ahead ``kib`` KiB per request (root; best effort).

    FUSE mounts start with the VM default (128 KiB); 1 MiB requests need a bigger window.
    Call it before mounting: the path is resolved here, and the thread that waits for the mount
    never touches the mountpoint (an lstat of it from the daemon's own process waits for the
    daemon; SIGKILLed meanwhile, the process could never exit and the mount would hang for
    every caller).
    """
    target = os.path.realpath(mountpoint)

    def work() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dev = mount_device(target)
            if dev:
                try:
                    with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as fh:
                        fh.write(str(kib))
                except OSError as exc:
                    logger.info("cannot raise read-ahead of %s: %s", mountpoint, exc)
                return
            time.sleep(0.05)

    import threading

    threading.Thread(target=work, name="pcache-readahead", daemon=True).start()


def unmount(mountpoint: str, *, lazy: bool = False) -> bool:
    """Unmount a FUSE mount with fusermount3/fusermount (or umount as root); True on success."""
    for tool in ("fusermount3", "fusermount"):
        if shutil.which(tool):
            args = [tool, "-u", *(["-z"] if lazy else []), mountpoint]
            if subprocess.run(args, capture_output=True, timeout=30).returncode == 0:
                return True
    if os.geteuid() == 0:
        args = ["umount", *(["-l"] if lazy else []), mountpoint]
        return subprocess.run(args, capture_output=True, timeout=30).returncode == 0
    return False


def stop_mount(proc: subprocess.Popen | None, mountpoint: str, *, grace: float = 20.0) -> None:
    """Stop a ``pcache-mount`` process (SIGTERM: libfuse unmounts and exits; SIGKILL after
    ``grace`` seconds) and make sure nothing stays mounted at ``mountpoint`` (lazy unmounts,
    for up to 10 s)."""
    if proc is not None:
        stop_process(proc, grace=grace)
    deadline = time.monotonic() + 10
    while mounted(mountpoint) and time.monotonic() < deadline:
        unmount(mountpoint, lazy=True)
        time.sleep(0.2)


def prepare_mountpoint(mountpoint: str) -> None:
    """Clean a stale mount left by a killed mount process, and check the directory.

    Raises:
        InvalidArgument: not a directory, or something is live-mounted there already.
    """
    try:
        os.listdir(mountpoint)  # readdir always reaches the daemon; stat may answer from cached attributes
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise InvalidArgument(f"mountpoint {mountpoint}: {exc.strerror}") from exc
        logger.warning("%s: stale FUSE mount (transport endpoint is not connected); cleaning it", mountpoint)
        if not unmount(mountpoint, lazy=True):
            raise InvalidArgument(f"cannot clean the stale mount at {mountpoint}") from exc
    if not os.path.isdir(mountpoint):
        raise InvalidArgument(f"mountpoint {mountpoint} is not a directory")
    kind = mounted(mountpoint)
    if kind is not None:
        raise InvalidArgument(f"{mountpoint} is already mounted ({kind})")


def mount(mountpoint: str, client_cfg: ClientConfig, opts: MountOptions | None = None) -> None:
    """Mount PCache at ``mountpoint`` and serve until unmounted or signalled (blocks).

    Raises:
        InvalidArgument: bad mountpoint. PCacheError: the master cannot be reached.
    """
    import mfusepy

    from fuse_client.ops import PCacheFuse, PCacheOperations
    from pcache.client import Client

    opts = opts or MountOptions()
    prepare_mountpoint(mountpoint)
    client = Client(client_cfg)
    try:
        client.status()  # fail before mounting when the master is unreachable
        ops = PCacheOperations(client)
        kwargs: dict = {
            "foreground": True,
            "nothreads": False,
            "fsname": "pcache:" + client_cfg.master.replace(",", "+"),  # a comma would split the -o options
            "subtype": "pcache",
            "default_permissions": True,
            "use_ino": True,  # st_ino is PCache's inode number: two hard links show one file
            "attr_timeout": opts.attr_timeout,
            "entry_timeout": opts.entry_timeout,
            "negative_timeout": opts.negative_timeout,
            "debug": opts.debug,
        }
        if opts.allow_other:
            kwargs["allow_other"] = True
        if (mfusepy.fuse_version_major, mfusepy.fuse_version_minor) >= (3, 12):
            kwargs["max_threads"] = opts.max_threads
            # said explicitly: libfuse 3.12-3.16 passes its unset default (UINT_MAX) to
            # fuse_loop_cfg_set_idle_threads, which logs "Ignoring invalid max threads value
            # 4294967295" at every mount; idle workers are kept up to the pool's size
            kwargs["max_idle_threads"] = opts.max_threads
            ops.max_background = opts.max_threads
        if mfusepy.fuse_version_major == 2:
            kwargs["big_writes"] = True
            kwargs["max_write"] = min(opts.max_request, 128 * 1024)
        logger.info("mounting %s at %s (libfuse %d)", client_cfg.master, mountpoint, mfusepy.fuse_version_major)
        raise_readahead(mountpoint, opts.max_request // 1024)
        try:
            PCacheFuse(ops, mountpoint, **kwargs)
        except RuntimeError as exc:
            # fuse_main() of libfuse3 returns 8 when a signal (SIGTERM, SIGINT) ended its loop;
            # mfusepy raises on any non-zero status, but that is the normal way to stop a mount
            if str(exc) != str(LIBFUSE_STOPPED_BY_SIGNAL):
                raise
            logger.info("unmounted %s", mountpoint)
    finally:
        client.close()


def _answers(mountpoint: str) -> bool:
    """Whether the mount serves requests (a stale one says ENOTCONN)."""
    try:
        os.listdir(mountpoint)  # not stat: the kernel may answer that from cached attributes
        return True
    except OSError:
        return False


def wait_mounted(
    mountpoint: str, timeout: float, proc: subprocess.Popen | None = None, log_file: str | None = None
) -> None:
    """Block until ``mountpoint`` is a live FUSE mount.

    Raises:
        Timeout: not mounted in time. PCacheError: the mount process exited (the last line of
            its ``log_file``, which says why, in the message).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (mounted(mountpoint) or "").startswith("fuse") and _answers(mountpoint):
            return
        if proc is not None and proc.poll() is not None:
            why = f"mount process exited with {proc.returncode}"
            if log_file:
                why += f": {_last_line(log_file)} (log: {log_file})"
            raise PCacheError(why)
        time.sleep(0.05)
    raise Timeout(f"{mountpoint} was not mounted within {timeout:.0f}s" + (f" (log: {log_file})" if log_file else ""))


def _last_line(path: str) -> str:
    """The last non-empty line of the file at ``path`` (its last 4 KiB), or what kept it unread."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError as exc:
        return f"(its log is unreadable: {exc})"
    return lines[-1][:500] if lines else "(nothing in its log)"


def spawn_daemon(argv: list[str], mountpoint: str, log_file: str | None, timeout: float = 30.0) -> int:
    """Re-run ``pcache-mount`` in the background and wait for the mount; returns its pid."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "fuse_client", *argv],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_mounted(mountpoint, timeout, proc, log_file)
    return proc.pid
