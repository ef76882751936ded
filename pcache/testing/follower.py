"""A bare replication follower for tests: ``python -m pcache.testing.follower DIR KEYS_FILE [--stream]``.

Serves the ``pcache.Replication`` service over a RocksDB :class:`ReplicatedStore` in ``DIR``
on a free loopback port (printed on stdout), taking entries from holders of a master-scope
token of ``KEYS_FILE``, until SIGTERM. With ``--stream`` it also takes replication streams
(:mod:`pcache.master.logstream`) and says so in its Probe answers. Lets a test drive a :class:`LogShipper` in its own
process against a follower in another, as a leader and a follower run.
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from pcache.common.auth import Guard
from pcache.common.credentials import ClusterKeys
from pcache.common.process import wait_for_stop_signal
from pcache.master import logstream
from pcache.master.metastore import RocksMetaStore
from pcache.master.replication import REPLICATION_SCOPES, ReplicatedStore, ReplicationServicer
from pcache.proto import pcache_pb2_grpc as pb_grpc


async def main(path: str, keys_file: str, stream: bool) -> None:
    store = ReplicatedStore(RocksMetaStore(path), path=path)
    guard = Guard(ClusterKeys.load(keys_file).tokens, REPLICATION_SCOPES)
    server = grpc.aio.server()
    servicer = ReplicationServicer(store, "f1", lambda: False, guard=guard)
    pb_grpc.add_ReplicationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    streams = await logstream.serve(servicer, "127.0.0.1", 0, None) if stream else None
    if streams is not None:
        servicer.stream_port = streams.sockets[0].getsockname()[1]
    print(port, flush=True)
    await wait_for_stop_signal()
    if streams is not None:
        streams.close()
    await server.stop(None)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], "--stream" in sys.argv[3:]))
