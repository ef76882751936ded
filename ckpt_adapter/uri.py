"""``pcache://HOST:PORT/path`` URIs and the process-wide clients behind them."""

from __future__ import annotations

import atexit
import os
import threading
from urllib.parse import urlparse

from pcache.client import Client
from pcache.common.config import ClientConfig
from pcache.common.errors import InvalidArgument
from pcache.common.paths import normalize

SCHEME = "pcache"

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def split_uri(uri: str | os.PathLike[str]) -> tuple[str, str]:
    """``pcache://host:port/a/b`` -> (``host:port``, ``/a/b``); no host means ``$PCACHE_MASTER``.

    Raises:
        InvalidArgument: not a ``pcache://`` URI, or a bad path.
    """
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme != SCHEME:
        raise InvalidArgument(f"not a pcache:// URI: {text!r}")
    master = parsed.netloc or ClientConfig().master
    return master, normalize(parsed.path or "/")


def join_uri(uri: str, name: str) -> str:
    """Append one path component to a ``pcache://`` URI."""
    return uri.rstrip("/") + "/" + name


def client_for(master: str) -> Client:
    """The shared sync client of ``master`` (one per process; closed at exit)."""
    with _lock:
        client = _clients.get(master)
        if client is None:
            client = _clients[master] = Client(ClientConfig(master=master))
        return client


def _close_all() -> None:
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


atexit.register(_close_all)
