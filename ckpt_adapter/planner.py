"""Node-aware save planning: each replicated item written once, bytes balanced over nodes.

Under data parallelism every DP rank holds the same copy of the (non-sharded)
state. torch's default planner picks one writer per item by rank; the usual
"rank 0 of each DP group writes" policy puts the writers of every group on the
first nodes of the job, whose NICs and disks then carry the whole checkpoint.
The Ling report (arXiv 2503.05139, §2.3.1, "AI co-design") spreads DP-group
checkpoint writes over *physical nodes*; this planner does that: items are
assigned largest first (LPT) to the candidate rank whose node has written the
fewest bytes so far, ties broken by the rank's own bytes.

A rank's node is ``$PCACHE_NODE_ID`` or the host name, gathered from all ranks
when the planner is set up.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed.checkpoint import DefaultSavePlanner, SavePlan
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import WriteItem

from pcache.common.config import default_node_id


def item_bytes(item: WriteItem) -> int:
    """Bytes an item will occupy (1 for pickled non-tensor objects, whose size is unknown)."""
    return item.tensor_storage_size() or 1


def balance_plans(all_plans: Sequence[SavePlan], nodes: Sequence[str]) -> list[SavePlan]:
    """Keep each write item in exactly one plan, balancing bytes over nodes, then ranks.

    Args:
        all_plans: one local plan per rank (rank = list position).
        nodes: the node id of each rank, same length.

    Returns:
        New plans; an item present in several plans stays only in the chosen one.

    Raises:
        ValueError: ``nodes`` does not have one entry per plan.
    """
    if len(nodes) != len(all_plans):
        raise ValueError(f"{len(all_plans)} plans but {len(nodes)} node ids")
    holders: dict[MetadataIndex, list[int]] = defaultdict(list)
    items: dict[MetadataIndex, WriteItem] = {}
    for rank, plan in enumerate(all_plans):
        for item in plan.items:
            holders[item.index].append(rank)
            items[item.index] = item
    node_bytes: dict[str, int] = defaultdict(int)
    rank_bytes = [0] * len(all_plans)
    keep: list[set[MetadataIndex]] = [set() for _ in all_plans]
    replicated = []
    for index, ranks in holders.items():
        if len(ranks) == 1:  # a shard only one rank has: fixed load
            rank = ranks[0]
            keep[rank].add(index)
            rank_bytes[rank] += item_bytes(items[index])
            node_bytes[nodes[rank]] += item_bytes(items[index])
        else:
            replicated.append(index)
    replicated.sort(key=lambda idx: (-item_bytes(items[idx]), str(idx)))
    for index in replicated:
        size = item_bytes(items[index])
        rank = min(holders[index], key=lambda r: (node_bytes[nodes[r]], rank_bytes[r], r))
        keep[rank].add(index)
        rank_bytes[rank] += size
        node_bytes[nodes[rank]] += size
    return [
        dataclasses.replace(plan, items=[item for item in plan.items if item.index in keep[rank]])
        for rank, plan in enumerate(all_plans)
    ]


def gather_nodes(group: dist.ProcessGroup | None = None) -> list[str]:
    """Node id of every rank of ``group`` (a collective when a process group is up)."""
    mine = default_node_id()
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    nodes: list[str] = [""] * dist.get_world_size(group)
    dist.all_gather_object(nodes, mine, group=group)
    return nodes


class NodeAwareSavePlanner(DefaultSavePlanner):
    """DCP save planner that spreads replicated items' writes over physical nodes."""

    def __init__(self, *args, nodes: Sequence[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._nodes = list(nodes) if nodes is not None else None

    def use_nodes(self, nodes: Sequence[str]) -> None:
        """Node id of each rank, known in advance (no gather at set-up)."""
        self._nodes = list(nodes)

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        if self._nodes is None:
            self._nodes = gather_nodes()  # every rank calls set_up_planner: a safe collective

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        nodes = self._nodes or [default_node_id()] * len(all_plans)
        return balance_plans(all_plans, nodes)


class LowestRankSavePlanner(DefaultSavePlanner):
    """The baseline: every replicated item is written by the lowest rank holding it
    (rank 0 of each DP group)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, dedup_save_to_lowest_rank=True, **kwargs)


def node_bytes(plans: Sequence[SavePlan], nodes: Sequence[str]) -> dict[str, int]:
    """Bytes each node writes under ``plans`` (for reports and tests)."""
    out: dict[str, int] = defaultdict(int)
    for rank, plan in enumerate(plans):
        out[nodes[rank]] += sum(item_bytes(i) for i in plan.items)
    return dict(out)


__all__ = ["LowestRankSavePlanner", "NodeAwareSavePlanner", "balance_plans", "node_bytes"]
