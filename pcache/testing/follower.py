"""A bare replication follower for tests: ``python -m pcache.testing.follower DIR KEYS_FILE``.

Serves the ``pcache.Replication`` service over a RocksDB :class:`ReplicatedStore` in ``DIR``
on a free loopback port (printed on stdout), taking entries from holders of a master-scope
token of ``KEYS_FILE``, until SIGTERM. Lets a test drive a :class:`LogShipper` in its own
process against a follower in another, as a leader and a follower run.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from pcache.common.auth import Guard
from pcache.common.credentials import ClusterKeys
from pcache.common.process import wait_for_stop_signal
from pcache.master.metastore import RocksMetaStore
from pcache.master.replication import REPLICATION_SCOPES, ReplicatedStore, ReplicationServicer
from pcache.proto import pcache_pb2_grpc as pb_grpc


async def main(path: str, keys_file: str) -> None:
    store = ReplicatedStore(RocksMetaStore(path), path=path)
    guard = Guard(ClusterKeys.load(keys_file).tokens, REPLICATION_SCOPES)
    server = grpc.aio.server()
    pb_grpc.add_ReplicationServicer_to_server(ReplicationServicer(store, "f1", lambda: False, guard=guard), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await wait_for_stop_signal()
    await server.stop(None)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
