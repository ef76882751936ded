"""Configuration: nested dataclasses, TOML files, ``--section.key=value`` overrides.

Each process receives only its own section (``master``, ``worker``,
``client``, ``cluster``). Sizes accept suffixes (``64MiB``, ``1G``); durations
are seconds. Modelled on torchtitan's ``JobConfig``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pcache.common.errors import InvalidArgument
from pcache.common.layout import MAX_BLOCK_SIZE, MAX_REPLICATION, MIN_BLOCK_SIZE

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

DEFAULT_MASTER_PORT = 19600


def default_node_id() -> str:
    """The physical node a process runs on: ``$PCACHE_NODE_ID`` or the host name."""
    return os.environ.get("PCACHE_NODE_ID") or socket.gethostname()


@dataclass
class MasterConfig:
    host: str = "127.0.0.1"
    """Address the gRPC server binds to."""
    port: int = DEFAULT_MASTER_PORT
    """gRPC port; 0 picks a free one."""
    data_dir: str = ""
    """Directory of the RocksDB metastore; empty keeps metadata in memory only."""
    metastore: str = ""
    """Metastore URI (``rocksdb:///path`` or ``memory://``); empty derives it from data_dir."""
    default_block_size: int = 32 * MiB
    """Bytes per block for files created without an explicit block size."""
    default_replication: int = 2
    """Replicas per block (capped by the number of live workers)."""
    heartbeat_interval: float = 1.0
    """Seconds between worker heartbeats, told to workers at registration."""
    dead_after: float = 6.0
    """Seconds without a heartbeat after which a worker is dead and its blocks re-replicated."""
    replication_check_interval: float = 1.0
    """Seconds between scans for under-replicated blocks."""
    replication_timeout: float = 30.0
    """Seconds before an unconfirmed re-replication is issued again."""
    sync_writes: bool = False
    """fsync the RocksDB WAL on every mutation (survives power loss, not just kill -9)."""
    listdir_limit: int = 1000
    """Largest page a ListDir returns."""
    orphan_grace: float = 600.0
    """Seconds an allocated but uncommitted block may live before workers drop it."""
    ufs_timeout: float = 30.0
    """Seconds one under-store call of the master may take (a bind's check, a listing page)."""
    cache_high_watermark: float = 0.9
    """Fraction of a worker's (or the cluster's) capacity above which clean blocks of bound files
    are evicted, least recently used first."""
    cache_low_watermark: float = 0.8
    """Fraction eviction brings a worker (or the cluster) down to."""
    metrics_port: int = -1
    """Prometheus metrics HTTP port; -1 disables, 0 picks a free one."""
    log_level: str = "INFO"
    """Python logging level."""
    advertise_host: str = ""
    """Address other masters, workers and clients reach this master at; empty: host."""
    etcd: str = ""
    """etcd for a leader + follower pair (HA): ``HOST:PORT``, or its members ``HOST:PORT,HOST:PORT,...``
    (any member that answers serves; the next is dialled when one dies); empty runs a single master."""
    cluster: str = "pcache"
    """Name of the HA cluster in etcd (masters of one cluster elect one leader)."""
    lease_ttl: float = 3.0
    """Seconds the leader's etcd lease lives without a keep-alive (failover takes about this)."""
    ack_timeout: float = 2.0
    """Seconds a leader waits for an in-sync follower's acknowledgement before marking it out of
    sync and going on alone."""
    stream_port: int = 0
    """TCP port of this master's replication stream (log entries from the leader, on the
    data-plane framing: a fifth of gRPC's round trip); 0 picks a free one (followers tell the
    leader which), -1 replicates over gRPC instead."""
    commit_timeout: float = 8.0
    """Seconds a mutation may wait for replication before it fails with Unavailable."""
    batch_stream_idle: float = 300.0
    """Seconds a client's batch stream may carry nothing before the master ends it (the client
    opens another with its next batch): an idle stream, its token expired or not, holds nothing
    for long."""
    log_tail_entries: int = 200_000
    """Log entries a master keeps in memory for followers that fall behind; one further behind
    gets a RocksDB checkpoint instead."""
    keys_file: str = ""
    """JSON key file signing tokens (0600); empty: data_dir/keys.json, created at the first start.
    Every master of an HA pair needs the same file."""
    default_tenant: str = "default"
    """Tenant made at the first start (root ``/NAME``, no quota) for the embedded default's token;
    empty makes none (create tenants with ``pcache tenant create``)."""
    block_token_ttl: float = 3600.0
    """Seconds a block token handed out with a block location is valid (HDFS: 10 hours)."""
    tls_dir: str = ""
    """Directory with ca.pem, cert.pem and key.pem: gRPC over TLS (``pcache.common.tls``); empty:
    plaintext. Every master, worker and client of the cluster needs TLS then."""
    tls_client_auth: bool = True
    """With TLS, require a certificate of the cluster CA from every caller (mutual TLS: workers,
    the other master, clients); false lets clients in with their token alone."""


@dataclass
class WorkerConfig:
    host: str = "127.0.0.1"
    """Address the data-plane (and metrics) server binds to; advertised too unless advertise_host is set."""
    advertise_host: str = ""
    """Address the master hands to clients and peers (e.g. the node IP when host is 0.0.0.0); empty: host."""
    port: int = 0
    """Data-plane TCP port; 0 picks a free one."""
    data_dir: str = ""
    """Block store directory (the node's NVMe); required."""
    master: str = f"127.0.0.1:{DEFAULT_MASTER_PORT}"
    """Master address host:port; for a leader + follower pair, every master: a:port,b:port."""
    capacity_bytes: int = 0
    """Quota of block bytes on this worker; 0 means the free space of data_dir's disk."""
    reserve_bytes: int = 64 * MiB
    """Free disk kept untouched; a write that would cut into it gets ENOSPC."""
    mem_tier_bytes: int = 256 * MiB
    """Bytes of the memory tier (hot chunks and write staging); 0 disables it."""
    eviction: str = "lru"
    """Memory-tier eviction policy: lru, lfu or fifo."""
    fsync: bool = True
    """fsync each block file before acknowledging the write."""
    node_id: str = ""
    """Physical node id; empty means $PCACHE_NODE_ID or the host name."""
    short_circuit: bool = True
    """Serve same-host clients through file descriptors over a UNIX socket."""
    io_timeout: float = 10.0
    """Seconds a data-plane peer may stall before the connection is dropped."""
    ufs_timeout: float = 60.0
    """Seconds one under-store call may take (fetching a bound file's block)."""
    peer_timeout: float = 2.0
    """Seconds a downstream replica may go without progress before a pipeline write goes on without
    it (the block is acknowledged with fewer replicas and the master re-replicates it)."""
    block_report_interval: float = 600.0
    """Seconds between full block reports (the master deletes blocks no file references)."""
    block_check_interval: float = 5.0
    """Seconds between checks that every block file is still on disk (lost ones are reported at once)."""
    scrub_bytes_per_s: int = 16 * MiB
    """Bytes/s the background scrub reads to verify every block's CRC32Cs; 0 disables the scrub."""
    scrub_interval: float = 7 * 86400.0
    """Seconds between the starts of two full scrub passes."""
    bandwidth_limit: int = 0
    """Bytes/s the TCP data plane may move (emulates a node NIC in benchmarks); 0 = unlimited."""
    metrics_port: int = -1
    """Prometheus metrics HTTP port; -1 disables, 0 picks a free one."""
    token_file: str = ""
    """File holding this worker's token (scope worker); empty: $PCACHE_TOKEN or $PCACHE_TOKEN_FILE."""
    tls_dir: str = ""
    """Directory with ca.pem, cert.pem and key.pem: the data plane and the master links over TLS;
    empty: plaintext."""
    tls_client_auth: bool = True
    """With TLS, require a certificate of the cluster CA from every data-plane caller."""
    log_level: str = "INFO"
    """Python logging level."""


@dataclass
class ClientConfig:
    master: str = field(default_factory=lambda: os.environ.get("PCACHE_MASTER") or f"127.0.0.1:{DEFAULT_MASTER_PORT}")
    """Master address host:port, or every master of an HA pair: a:port,b:port (default:
    $PCACHE_MASTER, else 127.0.0.1:19600)."""
    failover_timeout: float = 30.0
    """Seconds a call keeps trying the other masters of an HA pair while none leads (failover)."""
    rpc_timeout: float = 10.0
    """Seconds any master RPC may take."""
    connect_timeout: float = 1.0
    """Seconds to open a data-plane connection."""
    io_timeout: float = 10.0
    """Seconds a data-plane request may take in all."""
    fetch_timeout: float = 75.0
    """Seconds a read of a bound file's uncached block waits for the worker to fetch it from the
    under-store (more than the worker's ``ufs_timeout``), as long as the worker answers a PING
    every ``stall_timeout`` seconds meanwhile."""
    stall_timeout: float = 2.0
    """Seconds a worker may go without progress (the first byte of a reply, accepting a write)
    before this request goes to another replica and the worker becomes a suspect."""
    suspect_seconds: float = 30.0
    """Seconds a worker that stalled or failed is tried last (for every block, not only the one
    that failed); an answer from it clears it sooner."""
    nospace_wait: float = 10.0
    """Seconds a write waits for space when every worker is full (deleted files free theirs
    within seconds) before it fails with ENOSPC."""
    hedge_reads: bool = True
    """Ask a second replica when the first is slower than twice the 95th percentile of recent reads."""
    metadata_ttl: float = 1.0
    """Seconds a cached stat / block location stays valid (own writes invalidate at once)."""
    statahead_ttl: float = 0.0
    """With ``metadata_ttl`` 0: seconds the inodes a statahead listed (a rising run of uncached
    stats in one directory) answer stats; the mount sets its ``--attr-timeout``, the window in
    which the kernel would answer from its own cache anyway. 0: no statahead without the cache."""
    read_unit: int = 8 * MiB
    """Bytes fetched per data-plane read request."""
    readahead_units: int = 4
    """Read units prefetched ahead of a sequential reader."""
    read_budget: int = 512 * MiB
    """Bytes of read units (the unit being read and the read-ahead) all open files of this client
    may cache together, under one LRU (:mod:`pcache.client.budget`): a mount's read memory stays
    within it however many files are open. Past it, read-ahead pauses and reads fetch just the
    bytes asked for."""
    max_inflight_blocks: int = 4
    """Blocks a writer may have in flight (write-behind bound, memory = this x block size)."""
    write_budget: int = 512 * MiB
    """Bytes of full blocks all writers of this client may have in flight together
    (:class:`pcache.client.budget.WriteBudget`); past it a writer waits for others' blocks to land."""
    short_circuit: bool = True
    """Use the same-host fd path when the worker is local."""
    stream_writes: bool = True
    """A sequential writer's blocks after its file's first, once 4 MiB of each are buffered, go
    straight into their files on this host's worker (short circuit;
    :class:`pcache.client.data.BlockStream`): no block-sized buffer, one copy. A file that ends
    inside such a block leaves its allocation to expire, charged until then. Off: blocks are
    buffered whole and stored when full or at the commit."""
    tune_malloc: bool = True
    """Set glibc's mmap/trim thresholds of this process to the values its dynamic thresholds
    reach anyway after one 32 MiB buffer (:mod:`pcache.common.memory`), so that received read
    units do not fault their pages in afresh: +25% remote-read throughput with read-ahead. Off by
    default in a mount (``pcache mount``), whose memory its budgets bound: up to 64 MiB kept free
    in each arena of its many threads would come on top."""
    node_id: str = ""
    """Node of this client for placement; empty means $PCACHE_NODE_ID or the host name."""
    block_size: int = 0
    """Block size of files this client creates; 0 takes the master default."""
    replication: int = 0
    """Replicas of files this client creates; 0 takes the master default."""
    token: str = ""
    """Token sent with every master RPC (it names the tenant); empty: $PCACHE_TOKEN, the file
    $PCACHE_TOKEN_FILE, or the entry ``pcache up`` recorded for the master address in
    ~/.pcache/tokens.json (:mod:`pcache.common.credentials`)."""
    tls_dir: str = ""
    """Directory with the cluster CA's ca.pem (and this client's cert.pem and key.pem, needed when
    the cluster requires client certificates): talk TLS to masters and workers; empty:
    $PCACHE_TLS_DIR, or the directory ``pcache up --tls`` recorded for the master address."""


@dataclass
class ClusterConfig:
    data_dir: str = "./pcache-data"
    """Root directory of a local cluster (master metadata and one dir per worker)."""
    workers: int = 3
    """Worker processes `pcache up` starts."""
    masters: int = 1
    """Masters `pcache up` starts: 1 runs one master alone; 2 or 3 a leader and followers on an etcd
    it starts too (the ``etcd`` binary, Debian package etcd-server)."""
    worker_capacity_bytes: int = 0
    """Quota per worker; 0 means free disk."""
    start_timeout: float = 30.0
    """Seconds to wait for all workers to register."""


@dataclass
class PCacheConfig:
    master: MasterConfig = field(default_factory=MasterConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


_SUFFIXES = {
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": GiB, "gb": GiB, "gib": GiB,
    "t": 1024 * GiB, "tb": 1024 * GiB, "tib": 1024 * GiB,
}  # fmt: skip


def check_addresses(addresses: str, what: str = "master address") -> list[str]:
    """A comma-separated list of ``HOST:PORT`` (the masters of an HA pair), each checked.

    Raises:
        InvalidArgument: empty, or an item that is not HOST:PORT.
    """
    items = [a.strip() for a in addresses.split(",") if a.strip()]
    if not items:
        raise InvalidArgument(f"{what} must be HOST:PORT[,HOST:PORT...], got {addresses!r}")
    for item in items:
        check_address(item, what)
    return items


def check_address(address: str, what: str = "master address") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:19600`` for IPv6) as (host, port), port 1-65535.

    Raises:
        InvalidArgument: not HOST:PORT (a missing or out-of-range port included).
    """
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise InvalidArgument(f"{what} must be HOST:PORT with a port 1-65535, got {address!r}")
    return host, int(port)


def parse_size(text: str | int) -> int:
    """Parse ``"64MiB"``, ``"1g"``, ``"4096"`` into bytes (binary multiples).

    Raises:
        InvalidArgument: not a size.
    """
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("_", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :].strip()
    try:
        value = float(num)
    except ValueError as exc:
        raise InvalidArgument(f"not a size: {text!r}") from exc
    if unit and unit not in _SUFFIXES and unit != "b":
        raise InvalidArgument(f"unknown size unit in {text!r}")
    value *= _SUFFIXES.get(unit, 1)
    if not math.isfinite(value) or value >= 1 << 63:
        raise InvalidArgument(f"size out of range: {text!r}")
    return int(value)


def _coerce(section: str, name: str, ftype: Any, value: Any) -> Any:
    type_name = ftype if isinstance(ftype, str) else getattr(ftype, "__name__", str(ftype))
    try:
        # TOML arrays and tables fit no field, and a TOML bool is no number (int(True) == 1)
        if isinstance(value, list | dict) or (isinstance(value, bool) and type_name != "bool"):
            raise ValueError(value)
        if type_name == "bool":
            if isinstance(value, bool):
                return value
            low = str(value).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if type_name == "int":
            return parse_size(value) if isinstance(value, str) else int(value)
        if type_name == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError, InvalidArgument) as exc:  # TypeError: e.g. int() of a TOML date
        raise InvalidArgument(f"{section}.{name}: expected {type_name}, got {value!r}") from exc


def _apply(
    section_obj: Any, section: str, values: dict[str, Any], limits_table: dict[tuple[str, str], tuple[float, float]]
) -> None:
    fields = {f.name: f for f in dataclasses.fields(section_obj)}
    for key, value in values.items():
        if key not in fields:
            raise InvalidArgument(f"unknown option {section}.{key}")
        coerced = _coerce(section, key, fields[key].type, value)
        limits = limits_table.get((section, key))
        if limits is not None and not limits[0] <= coerced <= limits[1]:
            raise InvalidArgument(f"{section}.{key}={value!r} is outside {limits[0]:g}..{limits[1]:g}")
        setattr(section_obj, key, coerced)


# (section, key) -> (lowest, highest) accepted value
SECRET_KEYS = frozenset({("client", "token")})
"""Settings never taken from an override: a command line is readable by every user (``ps``)."""

LIMITS: dict[tuple[str, str], tuple[float, float]] = {
    ("master", "port"): (0, 65535),
    ("master", "stream_port"): (-1, 65535),
    ("worker", "port"): (0, 65535),
    ("master", "default_block_size"): (MIN_BLOCK_SIZE, MAX_BLOCK_SIZE),
    ("master", "default_replication"): (1, MAX_REPLICATION),
    ("master", "dead_after"): (0.1, 86400),
    ("master", "heartbeat_interval"): (0.01, 3600),
    ("master", "replication_check_interval"): (0.01, 3600),
    ("master", "listdir_limit"): (1, 100_000),
    ("master", "ufs_timeout"): (0.1, 3600),
    ("master", "cache_high_watermark"): (0.05, 1.0),
    ("master", "cache_low_watermark"): (0.0, 1.0),
    ("master", "lease_ttl"): (2, 60),
    ("master", "ack_timeout"): (0.1, 600),
    ("master", "commit_timeout"): (0.5, 3600),
    ("master", "batch_stream_idle"): (0.1, 86400),
    ("master", "log_tail_entries"): (1, 100_000_000),
    ("client", "failover_timeout"): (0, 3600),
    ("client", "read_budget"): (0, 1 << 50),
    ("client", "write_budget"): (64 * KiB, 1 << 50),
    ("worker", "capacity_bytes"): (0, 1 << 60),
    ("worker", "reserve_bytes"): (0, 1 << 60),
    ("worker", "mem_tier_bytes"): (0, 1 << 50),
    ("worker", "io_timeout"): (0.1, 3600),
    ("worker", "ufs_timeout"): (0.1, 3600),
    ("worker", "peer_timeout"): (0.05, 3600),
    ("worker", "block_check_interval"): (0.05, 86400),
    ("worker", "scrub_bytes_per_s"): (0, 1 << 40),
    ("worker", "scrub_interval"): (0.1, 365 * 86400),
    ("worker", "bandwidth_limit"): (0, 1 << 50),
    ("client", "rpc_timeout"): (0.1, 3600),
    ("client", "connect_timeout"): (0.05, 3600),
    ("client", "io_timeout"): (0.1, 3600),
    ("client", "stall_timeout"): (0.05, 3600),
    ("client", "fetch_timeout"): (0.1, 3600),
    ("client", "suspect_seconds"): (0, 86400),
    ("client", "nospace_wait"): (0, 3600),
    ("client", "metadata_ttl"): (0, 3600),
    ("client", "read_unit"): (64 * KiB, GiB),
    ("client", "readahead_units"): (0, 64),
    ("client", "max_inflight_blocks"): (1, 64),
    ("client", "block_size"): (0, MAX_BLOCK_SIZE),
    ("client", "replication"): (0, MAX_REPLICATION),
    ("cluster", "workers"): (0, 256),
    ("cluster", "masters"): (1, 5),
}


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> PCacheConfig:
    """Build the configuration from an optional TOML file and overrides.

    Args:
        path: TOML file with ``[master]``, ``[worker]``, ``[client]``, ``[cluster]`` tables.
        overrides: ``--section.key=value`` (or ``section.key=value``) strings,
            applied after the file.

    Raises:
        InvalidArgument: unknown section or key, a value of the wrong type,
            or an unreadable file.
    """
    return configure(PCacheConfig(), path, overrides, LIMITS)


T = TypeVar("T")


def configure(
    cfg: T,
    path: str | os.PathLike[str] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    limits: dict[tuple[str, str], tuple[float, float]] | None = None,
) -> T:
    """Fill ``cfg`` (a dataclass of dataclass sections) from a TOML file, then ``--section.key=value``
    overrides, range-checked by ``limits`` ((section, key) -> (lowest, highest)); returns ``cfg``.

    Raises:
        InvalidArgument: unknown section or key, a value of the wrong type or range, an unreadable file.
    """
    sections = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}  # type: ignore[arg-type]
    table = limits or {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"cannot read config {path}: {exc}") from exc
        for name, values in data.items():
            if name not in sections or not isinstance(values, dict):
                raise InvalidArgument(f"unknown config section [{name}] in {path}")
            _apply(sections[name], name, values, table)
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        key, sep, value = text.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise InvalidArgument(f"bad override {key!r}: expected --section.key=value")
        if section not in sections:  # the form was right: say what is wrong with it
            raise InvalidArgument(f"unknown config section {section!r} in --{key} (sections: {', '.join(sections)})")
        if (section, name) in SECRET_KEYS:
            raise InvalidArgument(
                f"--{key} is not taken on a command line (every local user can read it with ps): put it in"
                " the config file, or in $PCACHE_TOKEN or the file named by $PCACHE_TOKEN_FILE"
            )
        _apply(sections[section], section, {name: value}, table)
    return cfg


def describe(section: Any) -> str:
    """One-line ``key=value`` rendering of a config section for the start-up log."""
    return " ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(section).items())
