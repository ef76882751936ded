"""``babel daemon``'s configuration and its persisted schedules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from babel.daemon.security import DEFAULT_ALLOW
from babel.journal import default_state_dir

DEFAULT_LISTEN = "127.0.0.1:7700"


@dataclass
class DaemonConfig:
    """``babel daemon``'s configuration."""

    listen: str = DEFAULT_LISTEN
    """HOST:PORT the HTTP API listens on (port 0: a free port, logged at start)."""
    state_dir: str = field(default_factory=default_state_dir)
    """Where job journals, ``job.json`` files and ``schedules.json`` live."""
    max_jobs: int = 2
    """Jobs running at once; the others wait with state ``queued``."""
    stop_grace: float = 5.0
    """Seconds the jobs get to stop after SIGTERM/SIGINT before the process exits anyway."""
    token_file: str = ""
    """File holding the API's bearer token ("" = ``<state_dir>/daemon.token``, created 0600);
    ``$BABEL_DAEMON_TOKEN`` overrides it."""
    allow: tuple[str, ...] = DEFAULT_ALLOW
    """URI prefixes jobs and schedules may name (default: the object stores, no ``file://``)."""
    allow_endpoints: tuple[str, ...] = ()
    """``endpoint_url`` values jobs' ``s3://``/``oss://`` URIs may name (default: none, so the
    stores' own endpoints, from region or profile, only)."""
    allowed_hosts: tuple[str, ...] = ()
    """Names besides IP literals and ``localhost`` the ``Host`` header may give (a Service's DNS name)."""


@dataclass
class Schedule:
    """A recurring sync (persisted in ``schedules.json``); times in seconds."""

    id: str
    src: str
    dst: str
    every: float
    """Period in seconds."""
    newest_checkpoint: bool = False
    """``src`` is a directory of checkpoints; sync only the newest committed one, once."""
    options: dict[str, Any] = field(default_factory=dict)
    """:class:`SyncOptions` fields (JSON form)."""
    created: float = 0.0
    last_run: float | None = None
    """When it last submitted a job (seconds since the epoch)."""
    last_job: str | None = None
    """The id of the job it submitted last."""
    last_synced: str | None = None
    """With ``newest_checkpoint``: the checkpoint name last synced successfully."""
    last_error: str = ""
    """Why the last tick or job failed ("" when it did not)."""


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:7700``, an ``http://`` prefix allowed) as (host, port).

    Raises:
        ValueError: not HOST:PORT.
    """
    rest = addr.removeprefix("http://").rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)
