"""Babel: move datasets and checkpoints between object stores, clusters and regions (Ling report §2.3.2)."""

from babel.backends import ObjectInfo, ObjectStore, open_store
from babel.lister import list_parallel, list_serial

__all__ = ["ObjectInfo", "ObjectStore", "list_parallel", "list_serial", "open_store"]
