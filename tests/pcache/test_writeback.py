"""Write-back (``pcache bind --mode writeback``) under faults: a checkpoint saved through
``ckpt_adapter`` while the master and a worker are killed with SIGKILL, on a moto S3 server."""

from __future__ import annotations

import os
import signal
import time

import pytest

from babel.testing.servers import Server
from pcache.client import Client
from pcache.common.config import ClientConfig
from tests.conftest import create_bucket
from tests.pcache.test_binds import _Completes, _s3


@pytest.mark.slow
def test_a_checkpoint_in_a_write_back_path_reaches_the_store_whole_and_in_order_across_kill_9(
    make_cluster, moto_endpoint: str, moto_server: Server
) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from ckpt_adapter.storage import PCacheStorageWriter

    bucket = create_bucket(moto_endpoint)
    s3 = _s3(moto_endpoint)
    cluster = make_cluster(workers=3, master_args=["--master.default_block_size=1MiB"])
    with Client(ClientConfig(master=cluster.master_address, token=cluster.admin_token)) as admin:
        admin.bind("/default/ck", f"s3://{bucket}/ckpt/?endpoint_url={moto_endpoint}", mode="writeback")
    handler = _Completes(moto_server, bucket)
    state = {f"layer{i}": torch.randn(1 << 20, generator=torch.Generator().manual_seed(i)) for i in range(6)}
    uri = f"pcache://{cluster.master_address}/ck/step-1"
    dcp.save(state, storage_writer=PCacheStorageWriter(uri, thread_count=2), no_dist=True)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        doomed = os.urandom(12 << 20)
        pc.write_file("/ck/doomed.bin", doomed)  # its upload starts ...
        time.sleep(0.3)
        pc.remove("/ck/doomed.bin")  # ... and it is deleted meanwhile
    cluster.kill(cluster.master, signal.SIGKILL)  # uploads under way: parts staged, none completed
    cluster.kill(cluster.worker_procs[0], signal.SIGKILL)
    time.sleep(0.5)
    cluster.start_master()
    cluster.start_worker(0)
    cluster.wait_workers(3)
    with Client(ClientConfig(master=cluster.master_address, token=cluster.token)) as pc:
        files = {st.path: pc.read_file(st.path) for st in pc.walk_files("/ck/step-1")}
        assert pc.wait_persisted("/ck", timeout=120) == len(files) >= 3
        assert {st.persist for st in pc.walk_files("/ck")} == {"done"}
    deadline = time.monotonic() + 10  # the server logs a request after answering it
    while not any(k.endswith(".metadata") for k in handler.keys) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path, body in files.items():  # whole, as PCache has it
        assert s3.get_object(Bucket=bucket, Key="ckpt" + path[len("/ck") :])["Body"].read() == body
    shards = [k for k in handler.keys if k.endswith(".distcp")]
    assert shards and handler.keys.index("ckpt/step-1/.metadata") > max(handler.keys.index(k) for k in shards)
    deadline = time.monotonic() + 15  # the canceled and restarted uploads are aborted
    while (open_uploads := s3.list_multipart_uploads(Bucket=bucket).get("Uploads")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not open_uploads, [u["Key"] for u in open_uploads]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/").get("Contents", [])}
    assert keys == {"ckpt" + p[len("/ck") :] for p in files}  # no doomed.bin, no .metadata.tmp
