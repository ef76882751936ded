"""Prometheus metrics shared by the master and workers (``prometheus-client``).

Each process exposes them on ``metrics_port`` (disabled by default) at
``/metrics``. Names follow the Prometheus conventions: ``_total`` counters,
``_seconds`` histograms, base units (bytes, seconds).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

RPC_SECONDS = Histogram("pcache_master_rpc_seconds", "Master RPC latency.", ["method"])
RPC_ERRORS = Counter("pcache_master_rpc_errors_total", "Master RPCs that raised.", ["method", "error"])
MASTER_WORKERS = Gauge("pcache_master_live_workers", "Workers currently alive.")
MASTER_UNDER_REPLICATED = Gauge("pcache_master_under_replicated_blocks", "Blocks below their replica target.")

DATA_OPS = Counter("pcache_worker_ops_total", "Data-plane requests served.", ["op"])
DATA_BYTES = Counter("pcache_worker_bytes_total", "Block bytes moved by the data plane.", ["direction"])
DATA_SECONDS = Histogram(
    "pcache_worker_op_seconds",
    "Data-plane request latency.",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TIER_HITS = Counter("pcache_worker_mem_tier_hits_total", "Chunk reads served from the memory tier.")
TIER_MISSES = Counter("pcache_worker_mem_tier_misses_total", "Chunk reads that went to disk.")
TIER_HIT_RATIO = Gauge("pcache_worker_mem_tier_hit_ratio", "Memory-tier hits / chunk reads since start.")
TIER_BYTES = Gauge("pcache_worker_mem_tier_bytes", "Bytes held by the memory tier.")
CRC_FAILURES = Counter("pcache_worker_crc_failures_total", "Chunks that failed their CRC32C check.")


def serve_metrics(port: int, host: str = "127.0.0.1") -> int | None:
    """Start the ``/metrics`` endpoint; returns the bound port, None when disabled (-1)."""
    if port < 0:
        return None
    server, _thread = start_http_server(port, addr=host)
    bound = server.server_address[1]
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return bound
