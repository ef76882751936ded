"""File system check: which files have blocks that are corrupt, missing or under-replicated.

Walks the namespace under a path (as HDFS ``fsck`` does) and joins each file's blocks with the
block manager's live state. Corrupt blocks name the workers still holding their quarantined
copies, so a salvage can read the chunks that pass their CRCs.
"""

from __future__ import annotations

from pcache.common.layout import HOLE
from pcache.master.blocks import BlockManager
from pcache.master.namespace import Namespace
from pcache.proto import pcache_pb2 as pb


def check(ns: Namespace, blocks: BlockManager, path: str = "/") -> pb.FsckReport:
    """Report every damaged or under-replicated block of the files under ``path``.

    Raises:
        NotFound: no such path.
    """
    report = pb.FsckReport()
    seen: set[int] = set()  # a file with several names (hard links) is checked once
    for file_path, node in ns.walk(path):
        if node.nlink > 1:
            if node.id in seen:
                continue
            seen.add(node.id)
        report.files += 1
        for index, block_id in enumerate(node.blocks):
            if block_id == HOLE:
                continue
            report.blocks += 1
            state = block_state(blocks, block_id)
            if state is None:
                continue
            meta = ns.get_block(block_id)
            report.damaged.append(
                pb.DamagedBlock(
                    path=file_path,
                    index=index,
                    block_id=block_id,
                    offset=index * node.block_size,
                    length=meta.length if meta else 0,
                    state=state,
                    good=[w.info.addr for w in blocks.live_replicas(block_id)],
                    quarantined=[w.info.addr for w in blocks.quarantined_live(block_id)],
                    crc32c=meta.crc32c if meta else 0,
                    dead=[
                        blocks.registry.workers[w].info.addr
                        for w in sorted(blocks.died_with.get(block_id, ()))
                        if w in blocks.registry.workers and not blocks.registry.workers[w].alive
                    ],
                )  # fmt: skip
            )
    return report


def block_state(blocks: BlockManager, block_id: int) -> str | None:
    """'corrupt', 'missing', 'under-replicated', or None for a healthy block (or a bound file's
    block: a cached copy of its under-store, at no risk with fewer copies or none, fetched again
    when read; ``pcache status`` counts them so too)."""
    if block_id in blocks.ufs:
        return None
    live = len(blocks.live_replicas(block_id))
    if live == 0:
        return "corrupt" if blocks.quarantined_live(block_id) else "missing"
    alive = len(blocks.registry.alive())
    if live < min(blocks.target.get(block_id, 1), alive):
        return "under-replicated"
    return None


def damaged_files(ns: Namespace, blocks: BlockManager) -> int:
    """Files with at least one block that has no good live replica."""
    inodes = set()
    for block_id in blocks.unreadable():
        meta = ns.get_block(block_id)
        if meta is not None:
            inodes.add(meta.inode)
    return len(inodes)
