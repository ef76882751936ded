"""A FUSE mount over a leader + follower pair keeps reading and writing across a leader SIGKILL
(issue #14): no EIO, no stale or lost bytes."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

from tests.conftest import FAST_MASTER, REQUIRES_ETCD
from tests.fuse_client.conftest import Mount

pytestmark = REQUIRES_ETCD


def test_mount_reads_and_writes_in_a_loop_across_failovers(fuse_ready, tmp_path: Path) -> None:
    from pcache.local import LocalCluster

    master_args = [*FAST_MASTER, "--master.lease_ttl=2", "--master.ack_timeout=1"]
    with LocalCluster(str(tmp_path / "cluster"), workers=2, masters=2, master_args=master_args) as cluster:
        mount = Mount(cluster.master_address, tmp_path / "mnt", "--attr-timeout", "0", "--entry-timeout", "0").start()
        errors: list[BaseException] = []
        done: dict[str, bytes] = {}
        stop = threading.Event()
        worst = [0.0]

        def loop() -> None:
            rng = random.Random(5)
            i = 0
            try:
                while not stop.is_set():
                    t0 = time.monotonic()
                    path = mount.path / f"f{i % 40}"
                    data = rng.randbytes(rng.choice([1, 5000, 300_000]))
                    path.write_bytes(data)  # open, write, close: commit through the master
                    done[path.name] = data
                    name = f"f{rng.randrange(min(i, 39) + 1)}"
                    assert (mount.path / name).read_bytes() == done[name], f"{name}: stale or lost bytes"
                    worst[0] = max(worst[0], time.monotonic() - t0)
                    i += 1
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=loop, daemon=True)
        try:
            thread.start()
            for _ in range(2):
                time.sleep(1.5)
                leader = cluster.leader()
                cluster.kill(leader, signal.SIGKILL)
                cluster.leader(timeout=20)
                time.sleep(1.5)
                cluster.start_ha_master(cluster.master_procs.index(leader))
                cluster.wait_in_sync(timeout=30)
                assert not errors, errors
        finally:
            stop.set()
            thread.join(60)
            mount.stop()
        assert not errors, f"{errors!r}; mount log:\n{mount.log.read_text()[-3000:]}"
        print(f"\n{len(done)} files rewritten in a loop across 2 leader kills; longest step {worst[0]:.2f} s")
        assert len(done) == 40
