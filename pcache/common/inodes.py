"""Helpers on the stored inode record shared by master and clients."""

from __future__ import annotations

import stat as stat_mod

from pcache.proto import pcache_pb2 as pb


def file_mode(node: pb.Inode) -> int:
    """The full ``st_mode`` (type bits plus permission bits) of an inode."""
    kind = {pb.DIRECTORY: stat_mod.S_IFDIR, pb.SYMLINK: stat_mod.S_IFLNK}.get(node.type, stat_mod.S_IFREG)
    return kind | node.mode
