"""Node-aware planning without a process group: plans built from real state dicts."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.default_planner import create_default_local_save_plan

from ckpt_adapter.planner import balance_plans, item_bytes, node_bytes

torch.manual_seed(0)
MODEL = {f"layer{i}.weight": torch.randn(64 * (1 + i % 7), 256) for i in range(48)}  # 48 tensors, mixed sizes


def plans_for(world: int) -> list:
    return [create_default_local_save_plan(MODEL, is_coordinator=r == 0) for r in range(world)]


def test_eight_ranks_on_four_nodes_are_balanced_and_each_item_written_once() -> None:
    nodes = [f"node{r // 2}" for r in range(8)]
    plans = balance_plans(plans_for(8), nodes)
    written = [item.index for plan in plans for item in plan.items]
    assert len(written) == len(set(written)) == len(MODEL)  # every item exactly once
    per_node = node_bytes(plans, nodes)
    assert len(per_node) == 4
    mean = sum(per_node.values()) / 4
    assert max(per_node.values()) / mean <= 1.15
    total = sum(item_bytes(i) for i in plans_for(1)[0].items)
    assert sum(per_node.values()) == total


def test_nodes_first_then_ranks() -> None:
    # ranks 0-5 on node A, rank 6 alone on node B: B must get about half the bytes
    nodes = ["A"] * 6 + ["B"]
    per_node = node_bytes(balance_plans(plans_for(7), nodes), nodes)
    assert abs(per_node["A"] - per_node["B"]) / sum(per_node.values()) < 0.1


def test_the_baseline_puts_everything_on_the_first_node() -> None:
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

    nodes = [f"node{r // 2}" for r in range(8)]
    per_node = node_bytes(dedup_save_plans(plans_for(8), save_to_lowest_rank=True), nodes)
    assert {n for n, b in per_node.items() if b} == {"node0"}  # what "rank 0 of each DP group writes" does to a node


def test_sharded_items_stay_with_their_only_holder() -> None:
    plans = plans_for(2)
    own = {"rank1.only": torch.ones(1000)}
    plans[1] = plans[1].__class__(items=plans[1].items + create_default_local_save_plan(own, False).items)
    out = balance_plans(plans, ["n0", "n1"])
    assert any(i.index.fqn == "rank1.only" for i in out[1].items)
    assert not any(i.index.fqn == "rank1.only" for i in out[0].items)
