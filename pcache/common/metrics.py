"""Prometheus metrics shared by the master and workers (``prometheus-client``).

Each process exposes them on ``metrics_port`` (disabled by default) at
``/metrics``. Names follow the Prometheus conventions: ``_total`` counters,
``_seconds`` histograms, base units (bytes, seconds). The master's and the
workers' metrics live in two registries, so that each process serves only its
own (a worker never reports ``pcache_master_live_workers 0``), next to the
usual ``process_*`` and ``python_*`` series.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from typing import Literal
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)

logger = logging.getLogger(__name__)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


REGISTRIES: dict[str, CollectorRegistry] = {"master": _registry(), "worker": _registry()}
_MASTER, _WORKER = REGISTRIES["master"], REGISTRIES["worker"]

RPC_SECONDS = Histogram("pcache_master_rpc_seconds", "Master RPC latency.", ["method"], registry=_MASTER)
RPC_ERRORS = Counter(
    "pcache_master_rpc_errors_total", "Master RPCs that raised.", ["method", "error"], registry=_MASTER
)
MASTER_WORKERS = Gauge("pcache_master_live_workers", "Workers currently alive.", registry=_MASTER)
MASTER_UNDER_REPLICATED = Gauge(
    "pcache_master_under_replicated_blocks", "Blocks below their replica target.", registry=_MASTER
)
MASTER_MISSING = Gauge("pcache_master_missing_blocks", "Blocks with no copy on a live worker.", registry=_MASTER)
MASTER_CORRUPT = Gauge(
    "pcache_master_corrupt_blocks", "Blocks with no good replica, only quarantined copies.", registry=_MASTER
)
MASTER_DAMAGED_FILES = Gauge(
    "pcache_master_damaged_files", "Files with a corrupt or missing block (pcache fsck names them).", registry=_MASTER
)
MASTER_BAD_REPLICAS = Counter(
    "pcache_master_corrupt_replicas_total",
    "Replicas reported failing their CRC32C, by workers, same-host readers and scrubs alike.",
    registry=_MASTER,
)
MASTER_LOST_REPLICAS = Counter(
    "pcache_master_lost_replicas_total", "Replicas whose block file a worker found gone.", registry=_MASTER
)
MASTER_FAILED_REPLICATIONS = Counter(
    "pcache_master_failed_replications_total",
    "Re-replication copies a worker reported it could not make (the target is then chosen again at once).",
    registry=_MASTER,
)
MASTER_EVICTED_BLOCKS = Counter(
    "pcache_master_evicted_blocks_total",
    "Clean blocks of bound files evicted from the cache (every copy) under capacity pressure.",
    registry=_MASTER,
)
MASTER_EVICTED_BYTES = Counter(
    "pcache_master_evicted_bytes_total", "Bytes of the blocks evicted (one copy's length each).", registry=_MASTER
)
TENANT_USAGE = Gauge(
    "pcache_tenant_usage",
    "Per tenant: used_bytes, reserved_bytes (open writers), quota_bytes, used_inodes, quota_inodes (quota 0: none).",
    ["tenant", "kind"],
    registry=_MASTER,
)
MASTER_TLS_EXPIRY = Gauge(
    "pcache_master_tls_certificate_expiry_timestamp_seconds",
    "When the TLS certificate this master serves expires (seconds since the epoch; 0: no TLS).",
    registry=_MASTER,
)
WORKER_TLS_EXPIRY = Gauge(
    "pcache_worker_tls_certificate_expiry_timestamp_seconds",
    "When the TLS certificate this worker serves expires (seconds since the epoch; 0: no TLS).",
    registry=_WORKER,
)
MASTER_IS_LEADER = Gauge(
    "pcache_master_is_leader", "1 while this master leads (or runs standalone), 0 as a follower.", registry=_MASTER
)
MASTER_EPOCH = Gauge("pcache_master_epoch", "Fencing epoch of this master's current term.", registry=_MASTER)
MASTER_APPLIED_INDEX = Gauge(
    "pcache_master_applied_index", "Last metastore log index applied by this master.", registry=_MASTER
)
MASTER_IN_SYNC_FOLLOWERS = Gauge(
    "pcache_master_in_sync_followers", "Followers that have every acknowledged mutation (leader only).",
    registry=_MASTER,
)  # fmt: skip
MASTER_ALONE = Gauge(
    "pcache_master_alone",
    "1 while an HA leader goes on with no in-sync follower (a failover now would have to wait for it).",
    registry=_MASTER,
)
MASTER_FOLLOWER_LAG = Gauge(
    "pcache_master_follower_lag_entries", "Log entries a follower is behind the leader.", ["member"], registry=_MASTER
)
MASTER_UFS_CALLS = Counter(
    "pcache_master_ufs_calls_total",
    "Under-store requests of the master for bound directories: listed pages, HEAD checks, single-name lookups.",
    ["op"], registry=_MASTER,
)  # fmt: skip
MASTER_REPL_BATCH = Histogram(
    "pcache_master_replication_batch_entries", "Log entries shipped per round trip (group commit).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096), registry=_MASTER,
)  # fmt: skip

DATA_OPS = Counter("pcache_worker_ops_total", "Data-plane requests served.", ["op"], registry=_WORKER)
DATA_BYTES = Counter(
    "pcache_worker_bytes_total",
    "Block bytes moved by the data plane (fetch: read from an under-store).",
    ["direction"],
    registry=_WORKER,
)
DATA_SECONDS = Histogram(
    "pcache_worker_op_seconds",
    "Data-plane request latency.",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=_WORKER,
)
TIER_HITS = Counter("pcache_worker_mem_tier_hits_total", "Chunk reads served from the memory tier.", registry=_WORKER)
TIER_MISSES = Counter("pcache_worker_mem_tier_misses_total", "Chunk reads that went to disk.", registry=_WORKER)
TIER_HIT_RATIO = Gauge(
    "pcache_worker_mem_tier_hit_ratio", "Memory-tier hits / chunk reads since start.", registry=_WORKER
)
TIER_BYTES = Gauge("pcache_worker_mem_tier_bytes", "Bytes held by the memory tier.", registry=_WORKER)
CRC_FAILURES = Counter("pcache_worker_crc_failures_total", "Chunks that failed their CRC32C check.", registry=_WORKER)
SCRUB_BYTES = Counter("pcache_worker_scrub_bytes_total", "Block bytes the scrub read and verified.", registry=_WORKER)
SCRUB_CORRUPT = Counter(
    "pcache_worker_scrub_corrupt_total", "Blocks the scrub found failing their CRC32C.", registry=_WORKER
)
MISFIT_BLOCKS = Counter(
    "pcache_worker_misfit_blocks_total",
    "Block files found with another size than their CRC record gives (truncated; reported corrupt).",
    registry=_WORKER,
)
LOST_BLOCKS = Counter(
    "pcache_worker_lost_blocks_total",
    "Block files found gone from the disk (reported to the master).",
    registry=_WORKER,
)


METRICS_CONNECTIONS = 16  # scrapes served at once; more are closed at once


class _MetricsHandler(WSGIRequestHandler):
    """One scrape per connection, all of it within ``timeout`` seconds: a peer that trickles a
    request holds its thread no longer (prometheus-client's own server sets no timeout)."""

    timeout = 10.0

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(self.timeout, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def serve_metrics(
    port: int,
    host: str = "127.0.0.1",
    *,
    role: Literal["master", "worker"],
    tls: ssl.SSLContext | None = None,
) -> int | None:
    """Start the ``/metrics`` endpoint of a ``role`` process (prometheus-client's WSGI app, one
    thread a connection); returns the bound port, None when disabled (-1). ``tls``: serve HTTPS
    with this server context (the cluster's: with client authentication, a scraper needs a
    certificate of the cluster CA, as Prometheus's ``tls_config`` gives).

    Raises:
        OSError: the port cannot be bound.
    """
    if port < 0:
        return None
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIServer

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        slots = threading.BoundedSemaphore(METRICS_CONNECTIONS)

        def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
            if not self.slots.acquire(blocking=False):
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
            logger.debug("metrics request from %s failed", client_address, exc_info=True)  # a cut, a bad TLS peer

        def process_request_thread(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    try:
        server = make_server(host, port, make_wsgi_app(REGISTRIES[role]), Server, handler_class=_MetricsHandler)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot bind the metrics endpoint to {host}:{port}: {exc.strerror}") from exc
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    bound = server.server_address[1]
    logger.info("metrics on %s://%s:%d/metrics", "https" if tls else "http", host, bound)
    return bound
