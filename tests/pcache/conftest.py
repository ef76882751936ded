"""Fixtures of the master's storage tests: a metastore of each engine, a namespace on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pcache.master.metastore import MetaStore, open_metastore
from pcache.master.namespace import Namespace

BLOCK = 4096  # the namespace fixture's default block size


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetaStore]:
    """One empty store of each engine."""
    uri = "memory://" if request.param == "memory" else f"rocksdb://{tmp_path / 'meta'}"
    store = open_metastore(uri)
    yield store
    store.close()


@pytest.fixture
def ns(store: MetaStore) -> Namespace:
    """A namespace on ``store`` (``BLOCK``-byte blocks, two replicas)."""
    return Namespace(store, default_block_size=BLOCK, default_replication=2)
