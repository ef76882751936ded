"""Each process's /metrics carries its own role's series only."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest

from pcache.common import metrics


def test_roles_do_not_leak_into_each_other() -> None:
    master = generate_latest(metrics.REGISTRIES["master"]).decode()
    worker = generate_latest(metrics.REGISTRIES["worker"]).decode()
    assert "pcache_master_live_workers" in master and "pcache_worker_" not in master
    assert "pcache_worker_crc_failures_total" in worker and "pcache_master_" not in worker
    for text in (master, worker):  # the standard process series stay
        assert "process_cpu_seconds_total" in text or "python_info" in text


def test_serve_metrics_serves_the_role_registry() -> None:
    assert metrics.serve_metrics(-1, role="worker") is None
    port = metrics.serve_metrics(0, role="worker")
    assert port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "pcache_worker_ops_total" in text and "pcache_master_" not in text
