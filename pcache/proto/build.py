"""Regenerate the protobuf and gRPC modules from ``pcache.proto``.

Run from anywhere: ``python -m pcache.proto.build``. Needs ``grpcio-tools``
(the ``dev`` extra). The generated ``pcache_pb2*.py`` files are committed so
that an install needs no code generator.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    """Run protoc over pcache.proto; returns protoc's exit status."""
    from grpc_tools import protoc

    root = Path(__file__).resolve().parents[2]
    proto = Path("pcache/proto/pcache.proto")
    return protoc.main(
        [
            "protoc",
            f"-I{root}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            str(proto),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
