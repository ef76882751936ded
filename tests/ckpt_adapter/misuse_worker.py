"""One rank of the checkpoint-misuse tests: a save that not every rank calls, or a dead peer.

Usage: python -m tests.ckpt_adapter.misuse_worker SCENARIO ROOT_URI RANK PORT
SCENARIO ``alone``: rank 0 saves, rank 1 waits in a training barrier on the default group.
SCENARIO ``dead``: both save; rank 1 exits (as if killed) before it does.
SCENARIO ``unlisted``: both load; rank 1's listing fails as a write-back bind's store that does
not answer makes it fail (StoreTimeout), rank 0's finds nothing to load.
Prints one JSON line: the rank, seconds its call took, and the error it raised (if any).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from ckpt_adapter import CheckpointManager
from pcache.common.errors import StoreTimeout


def main() -> int:
    scenario, root, rank, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mgr = CheckpointManager(root, {"model": {"w": torch.ones(4, 4) * rank}}, collective_timeout=5)
    result: dict = {"rank": rank}
    started = time.monotonic()
    if scenario == "dead" and rank == 1:
        os._exit(0)  # gone without a word, as a SIGKILLed rank
    if scenario == "unlisted":
        if rank == 1:

            def unlisted() -> list:
                raise StoreTimeout("the under-store did not answer within 8 s")

            mgr.committed = unlisted  # type: ignore[method-assign]
        try:
            result["loaded"] = mgr.load()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = f"{type(exc).__name__}: {exc}"
    elif rank == 0:
        try:
            mgr.save(1, force=True)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.monotonic() - started
    print(json.dumps(result), flush=True)
    if scenario == "alone":
        dist.barrier()  # rank 1 has been waiting here all along: training goes on
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
