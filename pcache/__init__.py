"""PCache: an all-flash distributed file cache co-deployed on training nodes (Ling report §2.3)."""

from pcache.client import Client, PCacheClient
from pcache.common.errors import PCacheError

__all__ = ["Client", "PCacheClient", "PCacheError"]
__version__ = "0.1.0"
