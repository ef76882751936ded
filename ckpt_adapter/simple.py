"""``torch.save`` / ``torch.load`` of one object to a ``pcache://`` URI, through the SDK."""

from __future__ import annotations

import io
from typing import Any

import torch

from ckpt_adapter.uri import client_for, split_uri

BUFFER = 8 << 20


def save(obj: Any, uri: str) -> None:
    """``torch.save(obj)`` into ``pcache://MASTER/path`` (parents created; atomic at close).

    Raises:
        InvalidArgument: not a pcache:// URI. PCacheError: the cluster refused the write.
    """
    master, path = split_uri(uri)
    client = client_for(master)
    parent = path.rsplit("/", 1)[0] or "/"
    client.mkdir(parent, parents=True)
    raw = client.open(path, "wb")
    try:
        f = io.BufferedWriter(raw, BUFFER)
        torch.save(obj, f)
        f.flush()
    except BaseException:
        # before the buffer is closed: its close would commit what torch wrote so far over the
        # last good file (``with BufferedWriter`` did); aborted, the handle is closed, and the
        # buffer's close or collection does nothing
        raw.abort()
        raise
    f.close()  # the commit: the whole object, at once


def load(uri: str, **kwargs: Any) -> Any:
    """``torch.load`` from ``pcache://MASTER/path``; ``kwargs`` go to ``torch.load``.

    Raises:
        FileNotFoundError: no such file.
    """
    master, path = split_uri(uri)
    with io.BufferedReader(client_for(master).open(path, "rb"), BUFFER) as f:
        return torch.load(f, **kwargs)
