"""Process lifecycle helpers shared by the entry points, launchers, tests and benchmarks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (another process may take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def other_process_alive(pid: object) -> bool:
    """Whether ``pid`` (read from a lock or state file) is another process that is still alive.

    Our own pid counts as not alive: a state file naming it was written by an earlier process
    that had the same pid (containers restart with pid 1). Anything not a positive int is not.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, and someone else's
    return True


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
