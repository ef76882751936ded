"""PCache: an all-flash distributed file cache co-deployed on training nodes (Ling report §2.3)."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# gRPC's fork handlers (on by default in grpcio) crashed the forked children (SIGSEGV) of a
# process whose client threads were in gRPC at the fork; such a child cannot use PCache anyway
# (pcache.client.core.check_not_forked says so). Read by gRPC when it is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# gRPC's C core logged each failed TLS handshake as an INFO line on stderr, beside the error that
# PCache raises for it (naming the TLS mismatch): its errors only, unless set otherwise.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

if TYPE_CHECKING:  # loaded on first use: the client (aiohttp) is not needed by every pcache module
    from pcache.client import Client, PCacheClient
    from pcache.common.errors import PCacheError

__all__ = ["Client", "PCacheClient", "PCacheError"]
__version__ = "0.1.0"

_HOME = {"Client": "pcache.client", "PCacheClient": "pcache.client", "PCacheError": "pcache.common.errors"}


def __getattr__(name: str) -> Any:
    """``Client``, ``PCacheClient`` and ``PCacheError``, imported when first used (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'pcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
