"""Process lifecycle helpers shared by the entry points, launchers, tests and benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable


def die_with_parent(sig: int = signal.SIGTERM) -> list[str]:
    """A prefix for a child's argv: the child gets ``sig`` when this process dies.

    Linux ``prctl(PR_SET_PDEATHSIG)``, set by util-linux's ``setpriv --pdeathsig`` just before it
    execs the command: a parent killed with SIGKILL, or one that crashes, no longer leaves its
    servers running (holding ports and data directories). Not a ``preexec_fn``: Python code
    between fork and exec in a process that runs gRPC can crash the child (gRPC's fork handlers),
    and without one ``subprocess`` uses vfork. The signal follows the *thread* that started the
    child: start children from the main thread (or another that lives as long as they should).
    Without ``setpriv`` (not Linux) the prefix is empty and children do not follow their parent.
    """
    exe = shutil.which("setpriv")
    return [exe, f"--pdeathsig={signal.Signals(sig).name}", "--"] if exe else []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (another process may take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def other_process_alive(pid: object) -> bool:
    """Whether ``pid`` (read from a lock or state file) is another process that is still alive.

    Our own pid counts as not alive: a state file naming it was written by an earlier process
    that had the same pid (containers restart with pid 1).
    """
    return pid != os.getpid() and process_alive(pid)


def process_alive(pid: object) -> bool:
    """Whether a process ``pid`` exists (anything not a positive int: no)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and it is someone else's
    try:  # a zombie (dead, not yet reaped: an init that does not reap, in a container) is not alive
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def stop_processes(
    procs: Iterable[subprocess.Popen],
    *,
    grace: float = 10.0,
    sig: int = signal.SIGTERM,
    group: bool = False,
) -> list[int | None]:
    """Stop child processes: ``sig`` to each one still running, SIGKILL to those still alive after
    ``grace`` seconds (for all of them together), and reap every one.

    With ``group`` the SIGKILL goes to each child's whole process group (a child started with
    ``start_new_session=True`` and its own children). Returns the exit codes, in order
    (None only if even SIGKILL did not end a process within 10 s: one in uninterruptible sleep).
    """
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
    deadline = time.monotonic() + grace
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            continue
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        try:
            codes.append(proc.wait(timeout=10))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def stop_process(
    proc: subprocess.Popen, *, grace: float = 10.0, sig: int = signal.SIGTERM, group: bool = False
) -> int | None:
    """:func:`stop_processes` for one process; returns its exit code."""
    return stop_processes([proc], grace=grace, sig=sig, group=group)[0]


def own_children() -> list[int]:
    """Pids of this process's live children (from /proc)."""
    me, pids = os.getpid(), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def reap_children(timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, whatever this process started and is still running.

    LocalCluster registers a process only once it is ready, so an interrupt during
    ``start()`` would otherwise leave the one being started behind.
    """
    pids = own_children()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            pids.remove(pid)
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def write_ready_file(path: str, address: str) -> None:
    """Atomically write ``address`` to ``path``: tells a launcher the process is serving."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(address + "\n")
    os.replace(tmp, path)


async def wait_for_stop_signal() -> None:
    """Return once the process gets SIGTERM or SIGINT (servers' graceful-stop hook)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def lock_data_dir(data_dir: str, role: str) -> int:
    """Hold ``data_dir/LOCK`` (an ``flock``) for as long as this process runs, or until the
    returned descriptor is closed; the file names the holder's pid.

    A second worker on one directory deleted the first one's half-written blocks at its start
    and served its files as its own (two ``pcache up`` on one data directory did that).

    Raises:
        Busy: another process holds it (its pid named).
    """
    import fcntl

    from pcache.common.errors import Busy

    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, "LOCK")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise Busy(f"{data_dir} is in use by another {role} (pid {holder}); stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
