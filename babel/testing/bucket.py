"""An in-memory ListObjectsV2 server for the lister's tests and ``bench/babel_list.py``."""

from __future__ import annotations

import asyncio
import bisect

from objstore.base import ListPage, ObjectInfo


class MemoryBucket:
    """ListObjectsV2 over a sorted key list in memory (``/`` delimiter or none, StartAfter, pages),
    what a remote service does on its side; ``calls`` counts the requests.

    Args:
        keys: the bucket's keys.
        rolls_up_start: a delimiter listing whose StartAfter lies inside a common prefix returns
            that prefix (as S3 and moto do; gofakes3 and this project's file store do not).
        fresh: hand out new records per page (as a client parsing an answer allocates) rather
            than the ones built once.
    """

    def __init__(self, keys: list[str], *, rolls_up_start: bool = False, fresh: bool = False) -> None:
        self.keys = sorted(keys)
        self.infos = [ObjectInfo(k, 0, 0.0) for k in self.keys]
        self.rolls_up_start = rolls_up_start
        self.fresh = fresh
        self.calls = 0

    async def list_page(
        self, prefix: str = "", *, delimiter: str | None = None, start_after: str = "", max_keys: int = 1000
    ) -> ListPage:
        self.calls += 1
        await asyncio.sleep(0)
        keys = self.keys
        i = max(bisect.bisect_right(keys, start_after), bisect.bisect_left(keys, prefix))
        if not delimiter:  # flat pages are slices: the "server" costs its caller next to nothing
            end = bisect.bisect_left(keys, prefix + "\U0010ffff") if prefix else len(keys)
            j = min(end, i + max_keys)
            page = self.infos[i:j]
            if self.fresh:
                page = [ObjectInfo(o.key, o.size, o.mtime) for o in page]
            return ListPage(page, [], j < end)
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        while i < len(keys) and keys[i].startswith(prefix) and len(objects) + len(prefixes) < max_keys:
            cut = keys[i].find(delimiter, len(prefix))
            if cut < 0:
                objects.append(self.infos[i])
                i += 1
                continue
            common = keys[i][: cut + len(delimiter)]
            if common > start_after or self.rolls_up_start:
                prefixes.append(common)
            i = bisect.bisect_left(keys, common + "\U0010ffff")
        return ListPage(objects, prefixes, i < len(keys) and keys[i].startswith(prefix))

    async def close(self) -> None:
        pass
