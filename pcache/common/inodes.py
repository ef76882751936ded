"""Helpers on the stored inode record shared by master and clients."""

from __future__ import annotations

import stat as stat_mod

from pcache.proto import pcache_pb2 as pb


def file_mode(node: pb.Inode) -> int:
    """The full ``st_mode`` (type bits plus permission bits) of an inode."""
    return TYPE_BITS.get(node.type, stat_mod.S_IFREG) | node.mode


TYPE_BITS = {
    pb.DIRECTORY: stat_mod.S_IFDIR,
    pb.SYMLINK: stat_mod.S_IFLNK,
    pb.FIFO: stat_mod.S_IFIFO,
    pb.CHAR_DEVICE: stat_mod.S_IFCHR,
    pb.BLOCK_DEVICE: stat_mod.S_IFBLK,
    pb.SOCKET: stat_mod.S_IFSOCK,
}
"""Stored file type -> the ``S_IFMT`` bits of ``st_mode``."""


def type_of_mode(mode: int) -> pb.FileType:
    """The stored file type for an ``st_mode`` (regular when no special type bits match)."""
    fmt = stat_mod.S_IFMT(mode)
    for kind, bits in TYPE_BITS.items():
        if bits == fmt:
            return kind
    return pb.REGULAR
