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


def test_a_scraper_that_stalls_holds_no_thread_and_tls_needs_the_clusters_certificate(tmp_path, monkeypatch) -> None:
    """The endpoint's connections time out (a half-sent request no longer pins a thread for
    good); with the cluster's TLS context it serves HTTPS to a scraper holding a certificate of
    the cluster CA, and refuses plaintext and a scraper without one."""
    import socket
    import ssl
    import threading
    import time

    import pytest

    from pcache.common.tls import TLSConfig, make_local_tls

    monkeypatch.setattr(metrics._MetricsHandler, "timeout", 3.0)  # 10 s in service: the same, faster
    port = metrics.serve_metrics(0, role="master")
    before = threading.active_count()
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    for s in stalled:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
    time.sleep(1)
    assert threading.active_count() <= before + 2 * metrics.METRICS_CONNECTIONS  # the rest were closed
    time.sleep(3.5)
    assert threading.active_count() <= before + 2  # every stalled one was cut at its deadline
    trickle = socket.create_connection(("127.0.0.1", port))
    started, cut = time.monotonic(), None
    while time.monotonic() - started < 10 and cut is None:  # one byte every 0.6 s: still cut at the deadline
        try:
            trickle.sendall(b"G")
            time.sleep(0.6)
        except OSError:
            cut = time.monotonic() - started
    assert cut is not None and 2.5 < cut < 6.5, cut  # seen at the send after the next (0.6 s apart)
    for s in [*stalled, trickle]:
        s.close()

    tls = TLSConfig.load(str(make_local_tls(tmp_path / "tls")), need_cert=True)
    port = metrics.serve_metrics(0, role="master", tls=tls.server_context(client_auth=True))
    text = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5, context=tls.client_context())
    assert "pcache_master_live_workers" in text.read().decode()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))
    with pytest.raises(OSError):
        urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=5, context=anonymous).read()
