"""POSIX mount of PCache (``pcache-mount``): a thin mfusepy layer over :mod:`pcache.client`."""

import os

# libfuse3 where installed: 1 MiB requests (max_pages) instead of libfuse2's 128 KiB.
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

from fuse_client.mount import MountOptions, mount  # noqa: E402

__all__ = ["MountOptions", "mount"]
