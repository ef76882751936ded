"""Checkpoint SDK: DCP storage plug-ins over PCache, node-aware planner, checkpoint manager."""

from ckpt_adapter.manager import CheckpointInfo, CheckpointManager
from ckpt_adapter.planner import LowestRankSavePlanner, NodeAwareSavePlanner
from ckpt_adapter.simple import load, save
from ckpt_adapter.storage import PCacheStorageReader, PCacheStorageWriter

__all__ = [
    "CheckpointInfo",
    "CheckpointManager",
    "LowestRankSavePlanner",
    "NodeAwareSavePlanner",
    "PCacheStorageReader",
    "PCacheStorageWriter",
    "load",
    "save",
]
