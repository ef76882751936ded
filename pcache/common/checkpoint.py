"""Checkpoint conventions shared by the SDK (``ckpt_adapter``), Babel's daemon and the demo.

``torch.distributed.checkpoint`` writes one file per rank, then the global ``.metadata``
last (``FileSystemWriter.finish``); ``ckpt_adapter`` publishes it by rename. A checkpoint
directory is therefore *committed* exactly when its ``COMMIT_MARKER`` exists, and a copy of one
(``babel`` schedules with ``newest_checkpoint``, the demo's PCache → region sync) writes the
marker last too.
"""

from __future__ import annotations

COMMIT_MARKER = ".metadata"
