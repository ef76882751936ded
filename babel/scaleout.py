"""One sync job shared by several babel processes on etcd: shards, claims under leases, cursors, fencing.

The Ling report's Babel daemons (arXiv 2503.05139, §2.3.2) move one dataset from many hosts at
once; no single host lists, plans and copies billions of objects alone. Every process runs the
same command (``babel sync SRC DST --etcd HOST:PORT --job NAME``: processes, systemd units, or
the pods of a Kubernetes Indexed Job) and they share the work through etcd, never through each
other:

1. **Cut**: one process (whoever wins ``cutter``, a key under its lease) lists the source with the
   parallel lister and cuts the key space into **shards** of about ``shard_keys`` keys, each cut
   again into **chunks** of about ``chunk_keys`` (boundaries at listing pages: a page is a run of
   consecutive keys, so sorting the pages by their first key orders the whole listing without
   holding its keys). The first shard starts at the beginning of the key space and the last one
   has no end, so keys created later, and destination keys to ``--delete``, all fall in a shard.
   A cutter that dies is replaced by another process, which lists again.
2. **Claim**: a process claims a shard with a transaction that creates ``claims/N`` only if it
   does not exist, under the process's own **lease** (``ttl`` seconds, kept alive every
   ``ttl / 4``). The claim's **create revision** is its fencing token.
3. **Work**: the owner syncs the shard chunk by chunk (:class:`~babel.sync.SyncJob` limited to the
   chunk's key range, with its own local journal: list, plan, copy, delete, verify). After each
   chunk it writes the shard record (cursor ``done`` = chunks finished, the counts) in a
   transaction that compares the claim's create revision: a process whose claim was lost (its
   lease expired while it was stopped or cut off) cannot write, and stops.
4. **Take over**: a process that dies stops keeping its lease; etcd deletes its claims after
   ``ttl`` seconds and another process claims the shard and goes on **from its cursor** (the chunk
   that was in flight is planned again: what it had copied is skipped as equal).
5. **Finish**: when every shard is done (or failed), each process prints the job's report, summed
   over all shards, and exits.

Layout (values JSON) under ``/babel/jobs/<job>/``: ``spec`` (src, dst, options, shard and chunk
sizes; written once), ``cutter``, ``cut`` (written after the last shard record), ``shards/NNNNNN``
(``after``, ``until``: keys ``after < key <= until``, None for no end; ``chunks``: each chunk's upper
key; ``keys``; ``done``; ``state`` todo/done/failed; ``report``; ``owner``; ``attempts``;
``fatal``), ``claims/NNNNNN`` (owner id, under its lease), ``members/<id>`` (host, pid, started,
under its lease), ``canceled``.

What fencing does not cover: an object PUT is not an etcd write, so a stopped process that wakes
after losing its claim may finish the copy it had on its way before it sees the loss; it writes
the same bytes of the same source object the new owner writes, and its journal record is never
counted. Sources: etcd's lease and transaction API (https://etcd.io/docs/v3.5/learning/api/),
fencing tokens as in Kleppmann's "How to do distributed locking", shard claims as in Kafka
consumer groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aetcd

from babel.backends import open_store
from babel.errors import BabelError
from babel.journal import JobBusy, Journal
from babel.lister import list_parallel_pages
from babel.options import SyncOptions, options_from_dict
from babel.retry import ATTEMPTS, with_retries
from babel.sync import (
    MAX_REPORTED,
    Progress,
    SyncJob,
    SyncReport,
    check_not_overlapping,
    check_reachable,
    check_source_prefix,
    new_verification,
)
from babel.transfer import Bandwidth
from pcache.master.election import endpoint_text, etcd_client, etcd_error

logger = logging.getLogger(__name__)

PREFIX = "/babel/jobs/"
DEFAULT_TTL = 5.0  # seconds a process's lease (its claims) outlives its last keep-alive
MARGIN = 0.5  # seconds a process stops writing before its lease can expire
SHARD_KEYS = 100_000  # source keys per shard (about)
CHUNK_KEYS = 10_000  # source keys per chunk: the cursor's step, the most work a takeover repeats
MAX_ATTEMPTS = 3  # a shard whose chunk failed fatally this often is failed for good
JOB_FATAL = ("NoSuchBucket", "AccessDenied")  # a chunk failing so fails the job at once: no shard would do better
STOP_CHECK = 2.0  # seconds between looks, while a chunk runs, for a cancel of the job
PER_PROCESS = ("transfers", "checkers", "list_concurrency", "bwlimit", "memory")
"""Options each process may set for itself (how hard it works, not what the job does): a process
that submits the job with SRC and DST uses its own, one that joins with ``--etcd --job`` only the
job's."""
ETCD_ERRORS = (aetcd.ClientError, ConnectionError, asyncio.TimeoutError)  # not OSError: store errors are OSErrors
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

# report fields summed over chunks and shards
_COUNTS = (
    "listed_src", "listed_dst", "copied", "copied_bytes", "skipped", "already_done", "deleted", "planned_delete",
    "failed", "retries", "parts_reused", "vanished", "resent_bytes", "errors_total",
)  # fmt: skip


class JobSpecMismatch(BabelError, ValueError):
    """A shared job of that name exists with another source, destination or options (a usage error)."""


class BadJobName(BabelError, ValueError):
    """A shared job's name with characters it may not have (a usage error)."""


class NoSuchJob(BabelError, ValueError):
    """No shared job of that name to join (a usage error: submit it with SRC and DST)."""


def parse_etcd(endpoint: str) -> str:
    """The etcd members of ``endpoint`` (``HOST:PORT[,HOST:PORT...]``, ``http://`` prefixes
    allowed) as ``HOST:PORT,...``, checked as PCache's masters read their etcd endpoint
    (:func:`pcache.master.election.parse_endpoints`).

    Raises:
        BabelError: not a list of HOST:PORT.
    """
    try:
        return endpoint_text(endpoint)
    except ValueError as exc:
        raise BabelError(str(exc)) from exc


def _client(endpoint: str, timeout: float) -> aetcd.Client:
    """An etcd client of ``endpoint``'s members (:func:`pcache.master.election.etcd_client`).

    Raises:
        BabelError: a member's name does not resolve, or the list mixes IPv4 and IPv6.
    """
    try:
        return etcd_client(endpoint, timeout)
    except ValueError as exc:
        raise BabelError(str(exc)) from exc


def check_job_name(name: str) -> str:
    """A shared job's name: letters, digits, ``.``, ``_``, ``-`` (it is part of etcd keys and of
    local journal names).

    Raises:
        BadJobName: anything else.
    """
    if not _JOB_NAME.match(name or ""):
        raise BadJobName(f"a shared job's name is letters, digits, '.', '_' and '-' (at most 128), got {name!r}")
    return name


@dataclass
class Shard:
    """One shard's record (``shards/NNNNNN``): keys ``after < key <= until`` cut into chunks."""

    index: int
    after: str
    until: str | None
    chunks: list[str | None]  # each chunk's upper key; the last equals ``until``
    keys: int = 0  # source keys in it when cut
    done: int = 0  # chunks finished: the cursor
    state: str = "todo"  # todo, done, failed
    report: dict[str, Any] = field(default_factory=dict)
    owner: str = ""
    attempts: int = 0
    fatal: str = ""

    def chunk_range(self, j: int) -> tuple[str, str | None]:
        """Chunk ``j``'s keys ``(after, until]``."""
        low = self.after if j == 0 else self.chunks[j - 1]
        assert low is not None
        return low, self.chunks[j]

    def to_json(self) -> bytes:
        doc = asdict(self)
        del doc["index"]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, index: int, raw: bytes) -> Shard:
        return cls(index=index, **json.loads(raw))


def cut_points(pages: list[tuple[str, str, int]], shard_keys: int, chunk_keys: int) -> list[Shard]:
    """Shards of about ``shard_keys`` keys in chunks of about ``chunk_keys``, from listing pages.

    ``pages``: ``(first key, last key, keys)`` of each page, in any order; pages never overlap
    (a flat listing: every listed key is in one page, and no page's keys straddle another's), so
    sorted by first key they order the whole listing.
    Boundaries fall on page ends: a chunk holds ``chunk_keys`` keys or up to a page more. The first
    shard starts at ``""``, the last one has no end (``until`` None).
    """
    shards: list[Shard] = []
    chunks: list[str | None] = []
    after = ""
    in_chunk = in_shard = 0
    for _first, last, n in sorted(pages):
        in_chunk += n
        in_shard += n
        if in_chunk >= chunk_keys:
            chunks.append(last)
            in_chunk = 0
            if in_shard >= shard_keys:
                shards.append(Shard(len(shards), after, last, chunks, keys=in_shard))
                after, chunks, in_shard = last, [], 0
    if in_shard == 0 and shards:  # the keys ended on a shard boundary: the last shard gets the open end
        last_shard = shards[-1]
        last_shard.chunks[-1] = last_shard.until = None
    else:
        if chunks and in_chunk == 0:
            chunks[-1] = None  # the last chunk ended on a page: it becomes the open end
        else:
            chunks.append(None)
        shards.append(Shard(len(shards), after, None, chunks, keys=in_shard))
    return shards


async def check_endpoints(*uris: str) -> None:
    """Fail fast when a job's store does not answer (:func:`babel.sync.check_reachable`): before a
    shared job is cut, as a single-process sync does before it lists. A hung source hung the cut
    for ever, and an unreachable destination failed every shard in turn, three tries each.

    Raises:
        TransientError: an endpoint refused every connection, or took one and answered nothing.
    """
    stores = [open_store(uri) for uri in uris]
    try:
        await asyncio.gather(*(check_reachable(store) for store in stores))
    finally:
        for store in stores:
            await store.close()


async def cut_key_space(
    uri: str, *, shard_keys: int, chunk_keys: int, concurrency: int = 32
) -> tuple[list[Shard], int]:
    """List ``uri`` with the parallel lister and cut its keys (:func:`cut_points`); returns the
    shards and the number of keys listed. Memory: three values per listing page, not per key.

    Raises:
        BabelError: the listing failed (missing bucket, denied access, store unreachable).
    """
    store = open_store(uri)
    pages: list[tuple[str, str, int]] = []
    listed = 0
    try:
        page_size = max(1, min(1000, chunk_keys))
        # flat: a page of a delimiter listing holds a level's keys with whole directories between them
        async for page in list_parallel_pages(store, concurrency=concurrency, page_size=page_size):
            pages.append((page[0].key, page[-1].key, len(page)))
            listed += len(page)
        if not listed:
            await check_source_prefix(store, lambda fn: with_retries(fn, attempts=ATTEMPTS))
    finally:
        await store.close()
    return cut_points(pages, shard_keys, chunk_keys), listed


def add_report(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """Add the counts of ``part`` (a :meth:`SyncReport.to_dict`, or a sum of them) into ``total``
    (the same form, or ``{}``); errors and verification failures stay capped at ``MAX_REPORTED``."""
    for name in _COUNTS:
        total[name] = total.get(name, 0) + part.get(name, 0)
    nf = total.setdefault("not_files", {})
    for kind, n in part.get("not_files", {}).items():
        nf[kind] = nf.get(kind, 0) + n
    errors = total.setdefault("errors", [])
    errors.extend(part.get("errors", [])[: max(0, MAX_REPORTED - len(errors))])
    pv = part.get("verification")
    if pv:
        tv = total.setdefault("verification", new_verification(pv.get("mode", "sample")))
        for section in ("metadata", "runtime", "sample", "full"):
            for name, value in pv.get(section, {}).items():
                if isinstance(value, int):
                    tv[section][name] = tv[section].get(name, 0) + value
        tv["failures"].extend(pv.get("failures", [])[: max(0, MAX_REPORTED - len(tv["failures"]))])
    return total


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


@dataclass
class View:
    """A shared job's state in etcd at one revision."""

    shards: list[Shard] = field(default_factory=list)
    # shard -> (owner, claim's create revision, the lease it is under)
    claims: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)
    cut: dict[str, Any] | None = None  # the cut's summary once every shard record is written
    canceled: bool = False
    spec: dict[str, Any] | None = None  # None: the job was forgotten (or never submitted)
    fatal: str = ""  # an error that failed the whole job (a missing bucket, denied access)


class SharedJob:
    """One process's part in a shared job: its lease, its claims, the shards it works on.

    Args:
        endpoint: etcd ``HOST:PORT``. job: the job's name (:func:`check_job_name`).
        state_dir: this process's local state (each chunk's journal while it runs).
        ttl: seconds of the process's lease: how soon a dead process's shards are taken over.
        poll: seconds between looks at the job while waiting (for the cut, for a free shard).
        timeout: seconds per etcd call.
        member: this process's id (default ``host-pid-random``).
        on_event: told one line per step worth a log line (a chunk done, a shard taken over).
    """

    def __init__(
        self,
        endpoint: str,
        job: str,
        state_dir: str,
        *,
        ttl: float = DEFAULT_TTL,
        poll: float = 1.0,
        timeout: float = 5.0,
        member: str | None = None,
        progress: Progress | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        if ttl < 2 * MARGIN + 1:
            raise BabelError(f"lease ttl must be at least {2 * MARGIN + 1} s, got {ttl}")
        self.endpoint = parse_etcd(endpoint)
        self.job = check_job_name(job)
        self.state_dir = state_dir
        self.ttl = ttl
        self.poll = poll
        self.timeout = timeout
        self.member = member or f"{socket.gethostname()}-{os.getpid()}-{random.randrange(16**4):04x}"
        self.progress = progress
        self.on_event = on_event or (lambda line: logger.info("%s", line))
        self._client = _client(endpoint, timeout)
        self._lease: aetcd.Lease | None = None
        self._valid_until = 0.0  # monotonic: this process's claims are its own until then
        self._keeper: asyncio.Task | None = None
        self.chunks_done = 0  # chunks this process finished (its report says so)
        self._bandwidth: Bandwidth | None = None
        self.local_options: dict[str, Any] = {}  # PER_PROCESS options this process was given
        self._mirrored: dict[str, str] = {}  # object key -> upload id recorded in etcd
        self._upload_ops: list[tuple[str, str | None]] = []  # etcd writes of uploads, in order
        self._upload_writer: asyncio.Future | None = None
        self._warned = 0.0  # monotonic: when etcd trouble was last logged at WARNING

    # ---------------------------------------------------------------- keys --

    def _key(self, *parts: str) -> bytes:
        return (PREFIX + self.job + "/" + "/".join(parts)).encode()

    async def _etcd(self, aw):
        return await asyncio.wait_for(aw, self.timeout)

    # ---------------------------------------------------------------- spec --

    async def submit(self, src_uri: str, dst_uri: str, options: SyncOptions, *,
                     shard_keys: int = SHARD_KEYS, chunk_keys: int = CHUNK_KEYS) -> dict[str, Any]:  # fmt: skip
        """Create the job in etcd, or check that the existing one is the same job; returns its spec.

        Raises:
            JobSpecMismatch: a job of this name exists with another src, dst or options.
            BadURI, BadOption: as for a local sync (checked before anything is written).
            BabelError: etcd does not answer.
        """
        options = options.check()
        if options.dry_run:
            raise BabelError("--dry-run is not supported for a shared job: run it without --etcd to see the plan")
        if shard_keys < 1 or chunk_keys < 1:
            raise BabelError("shard and chunk sizes must be at least one key")
        check_not_overlapping(src_uri, dst_uri)
        spec = {"src": src_uri, "dst": dst_uri, "options": asdict(options),
                "shard_keys": shard_keys, "chunk_keys": min(chunk_keys, shard_keys)}  # fmt: skip
        tx = self._client.transactions
        key = self._key("spec")
        try:
            ok, _ = await self._etcd(self._client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, _encode({**spec, "created": time.time()}))],
                failure=[],
            ))  # fmt: skip
            if ok:
                return spec
            existing = await self.spec()
        except ETCD_ERRORS as exc:
            raise BabelError(f"etcd at {self.endpoint}: {etcd_error(exc)}") from exc
        self.local_options = {k: v for k, v in asdict(options).items() if k in PER_PROCESS}
        mine = json.loads(_encode(spec))
        diff = [f"{k}: {existing.get(k)!r} there, {mine[k]!r} here" for k in ("src", "dst", "shard_keys", "chunk_keys")
                if existing.get(k) != mine[k]]  # fmt: skip
        theirs = existing.get("options", {})
        diff += [f"--{k.replace('_', '-')}: {theirs.get(k)!r} there, {v!r} here" for k, v in mine["options"].items()
                 if k not in PER_PROCESS and theirs.get(k) != v]  # fmt: skip
        if diff:
            raise JobSpecMismatch(
                f"shared job {self.job!r} exists with other settings ({'; '.join(diff)}): give the same "
                "command, or another --job name"
            )
        return existing

    async def spec(self) -> dict[str, Any]:
        """The job's spec.

        Raises:
            FileNotFoundError: no job of this name.
        """
        got = await self._etcd(self._client.get(self._key("spec")))
        if got is None:
            raise FileNotFoundError(f"no shared job {self.job!r} in etcd")
        return json.loads(got.value)

    # --------------------------------------------------------------- lease --

    def alive(self) -> bool:
        """Whether this process's lease (so its claims) cannot have expired yet."""
        return self._lease is not None and time.monotonic() < self._valid_until

    async def _drop_lease(self) -> None:
        """Stop keeping the lease and revoke it when etcd answers (its claims go at once instead of
        after ``ttl``)."""
        lease, self._lease = self._lease, None
        self._valid_until = 0.0
        if self._keeper is not None:
            self._keeper.cancel()
        if lease is not None:
            with contextlib.suppress(*ETCD_ERRORS):
                await self._etcd(lease.revoke())

    async def _ensure_lease(self) -> None:
        if self.alive():
            return
        await self._drop_lease()
        sent = time.monotonic()
        lease = await self._etcd(self._client.lease(int(round(self.ttl))))
        self._lease = lease
        self._valid_until = sent + self.ttl - MARGIN
        self._keeper = asyncio.ensure_future(self._keep_alive(lease))
        member = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        await self._etcd(self._client.put(self._key("members", self.member), _encode(member), lease=lease))

    async def _keep_alive(self, lease: aetcd.Lease) -> None:
        refresh = lease.refresh
        while self._lease is lease and self.alive():
            await asyncio.sleep(self.ttl / 4)
            sent = time.monotonic()
            try:
                reply = await self._etcd(refresh())
            except ETCD_ERRORS as exc:
                self._etcd_trouble(exc)
                continue
            if reply is None or reply.TTL <= 0:
                logger.warning("shared job %s: the lease of %s expired", self.job, self.member)
                self._valid_until = 0.0
                break
            self._valid_until = sent + self.ttl - MARGIN

    # --------------------------------------------------------------- state --

    async def view(self) -> View:
        """The job's state in etcd now (one range read)."""
        found = await self._etcd(self._client.get_prefix(self._key("")))
        view = View()
        base = len(self._key(""))
        for kv in found:
            name = kv.key[base:].decode()
            if name.startswith("shards/"):
                view.shards.append(Shard.from_json(int(name[7:]), kv.value))
            elif name.startswith("claims/"):
                view.claims[int(name[7:])] = (kv.value.decode(), kv.create_revision, kv.lease)
            elif name.startswith("members/"):
                view.members.append(name[8:])
            elif name == "cut":
                view.cut = json.loads(kv.value)
            elif name == "canceled":
                view.canceled = True
            elif name == "spec":
                view.spec = json.loads(kv.value)
            elif name == "fatal":
                view.fatal = json.loads(kv.value)["fatal"]
        view.shards.sort(key=lambda s: s.index)
        return view

    # ------------------------------------------------------------------ cut --

    async def _try_cut(self, spec: dict[str, Any]) -> bool:
        """Become the cutter (a key under this process's lease) and publish the shards; False when
        another process cuts."""
        tx = self._client.transactions
        key = self._key("cutter")
        ok, responses = await self._etcd(self._client.transaction(
            compare=[tx.create(key) == 0, tx.create(self._key("cut")) == 0, tx.version(self._key("spec")) > 0],
            success=[tx.put(key, self.member.encode(), lease=self._lease)],
            failure=[],
        ))  # fmt: skip
        if ok:
            rev = responses[0].response_put.header.revision
        else:  # another process cuts, or this one does: a put applied while its answer was lost
            cutter = await self._etcd(self._client.get(key))
            lease = self._lease.id if self._lease is not None else None
            if cutter is None or cutter.value != self.member.encode() or cutter.lease != lease:
                return False
            if await self._etcd(self._client.get(self._key("cut"))) is not None:
                return False
            rev = cutter.create_revision
        started = time.monotonic()
        opts = options_from_dict(spec["options"])
        self.on_event(f"{self.member}: listing {spec['src']} to cut it into shards")
        fence = [tx.create(key) == rev]
        try:
            await check_endpoints(spec["src"], spec["dst"])
            shards, listed = await cut_key_space(spec["src"], shard_keys=spec["shard_keys"],
                                                 chunk_keys=spec["chunk_keys"], concurrency=opts.list_concurrency)  # fmt: skip
        except BabelError as exc:  # a store does not answer, the source cannot be listed: the job fails, for all
            name, text = type(exc).__name__, str(exc)
            fatal = text if text.startswith(f"{name}:") else f"{name}: {text}"
            await self._etcd(self._client.transaction(
                compare=fence, success=[tx.put(self._key("cut"), _encode({"shards": 0, "fatal": fatal})),
                                        tx.delete(key)], failure=[]))  # fmt: skip
            return True
        if not self.alive():
            raise _LeaseLost("the lease expired while listing")
        for i in range(0, len(shards), 64):  # etcd's default limit is 128 operations per transaction
            puts = [tx.put(self._key("shards", f"{s.index:06d}"), s.to_json()) for s in shards[i : i + 64]]
            ok, _ = await self._etcd(self._client.transaction(compare=fence, success=puts, failure=[]))
            if not ok:
                raise _LeaseLost("another process took over the cut")
        summary = {"shards": len(shards), "listed": listed, "seconds": round(time.monotonic() - started, 3),
                   "by": self.member}  # fmt: skip
        ok, _ = await self._etcd(self._client.transaction(
            compare=fence, success=[tx.put(self._key("cut"), _encode(summary)), tx.delete(key)], failure=[]
        ))  # fmt: skip
        if not ok:
            raise _LeaseLost("another process took over the cut")
        self.on_event(f"{self.member}: cut {listed} keys into {len(shards)} shards in {summary['seconds']:.1f} s")
        return True

    # ---------------------------------------------------------------- claim --

    async def _claim(self, shard: Shard) -> int | None:
        """Claim ``shard`` under this process's lease; its create revision (the fencing token), or
        None when another process was first."""
        tx = self._client.transactions
        key = self._key("claims", f"{shard.index:06d}")
        ok, responses = await self._etcd(self._client.transaction(
            compare=[tx.create(key) == 0, tx.version(self._key("spec")) > 0],  # never into a forgotten job
            success=[tx.put(key, self.member.encode(), lease=self._lease)],
            failure=[],
        ))  # fmt: skip
        return responses[0].response_put.header.revision if ok else None

    async def _write_shard(self, shard: Shard, fence: int, *, release: bool = False) -> bool:
        """Write the shard record if this process's claim (revision ``fence``) still holds;
        ``release`` also deletes the claim. False: the claim is lost, nothing written."""
        tx = self._client.transactions
        claim = self._key("claims", f"{shard.index:06d}")
        ops = [tx.put(self._key("shards", f"{shard.index:06d}"), shard.to_json())]
        if release:
            ops.append(tx.delete(claim))
        while self.alive():
            try:
                ok, _ = await self._etcd(
                    self._client.transaction(compare=[tx.create(claim) == fence], success=ops, failure=[])
                )
                return bool(ok)
            except ETCD_ERRORS as exc:
                self._etcd_trouble(exc)
                await asyncio.sleep(min(1.0, self.ttl / 4))
        return False

    # ----------------------------------------------------------------- work --

    async def _run_chunk(self, spec: dict[str, Any], shard: Shard, j: int) -> SyncReport:
        """Sync chunk ``j`` of ``shard`` with a local journal (kept while it runs: a restart of this
        process on this host resumes its multipart uploads)."""
        name = f"{self.job}.{shard.index:06d}.{j:04d}"
        try:
            journal = Journal(self.state_dir, name, create=True)
        except JobBusy:  # a stopped process of this host still holds it: start afresh beside it
            journal = Journal(self.state_dir, f"{name}.{self.member}", create=True)
        try:
            desc = journal.describe()
            if desc.get("src") not in (None, spec["src"]) or desc.get("dst") not in (None, spec["dst"]):
                journal.close()
                shutil.rmtree(journal.dir, ignore_errors=True)
                journal = Journal(self.state_dir, name, create=True)
            journal.update(src=spec["src"], dst=spec["dst"], options=spec["options"], kind="shared",
                           shared=self.job, created=time.time())  # fmt: skip
            ours = {rec["upload_id"] for _key, rec in journal.scan("u")}  # resumable here: kept
            await self._abort_uploads(spec["dst"], shard.chunk_range(j), keep=ours)
            journal.watch("u", self._mirror_upload)
            options = options_from_dict({**spec["options"], **self.local_options})
            if options.bwlimit and self._bandwidth is None:
                self._bandwidth = Bandwidth(options.bwlimit)  # one limit over all chunks of this process
            job = SyncJob(spec["src"], spec["dst"], options, journal, self.progress, key_range=shard.chunk_range(j),
                          bandwidth=self._bandwidth)  # fmt: skip
            try:
                report = await job.run()
            finally:
                await self._flush_uploads()
        finally:
            journal.close()
        if report.state != "failed":
            shutil.rmtree(journal.dir, ignore_errors=True)
        return report

    # ------------------------------------------------------ open uploads --
    # A chunk's open multipart uploads live in its local journal; a process that dies takes them
    # with it, so each is also recorded in etcd (``uploads/KEY``: upload id, owner) while open, and
    # whoever runs that chunk next aborts the ones it cannot resume (a file:// destination's
    # temporary file goes with its upload).

    def _mirror_upload(self, key: str, record: Any) -> None:
        """Journal observer of ``u/`` records: queue the etcd write (the first record of an upload)
        or delete (the upload completed or was aborted)."""
        if record is None:
            if self._mirrored.pop(key, None) is not None:
                self._upload_ops.append((key, None))
        elif self._mirrored.get(key) != record["upload_id"]:
            self._mirrored[key] = record["upload_id"]
            self._upload_ops.append((key, record["upload_id"]))
        if self._upload_writer is None or self._upload_writer.done():
            self._upload_writer = asyncio.ensure_future(self._flush_uploads())

    async def _flush_uploads(self) -> None:
        while self._upload_ops:
            key, upload_id = self._upload_ops[0]
            name = self._key("uploads", key)
            try:
                if upload_id is None:
                    await self._etcd(self._client.delete(name))
                else:
                    record = {"upload_id": upload_id, "owner": self.member, "at": time.time()}
                    await self._etcd(self._client.put(name, _encode(record)))
            except ETCD_ERRORS as exc:
                self._etcd_trouble(exc)
                if not self.alive():
                    return  # whoever takes the chunk over finds the upload in the store's own state, or not at all
                await asyncio.sleep(min(1.0, self.poll))
                continue
            self._upload_ops.pop(0)

    async def _abort_uploads(self, dst_uri: str, key_range: tuple[str, str | None], *, keep: set[str]) -> int:
        """Abort the uploads etcd records for keys in ``key_range`` (a previous owner's: this
        process holds the claim now), but those in ``keep``; returns how many."""
        after, until = key_range
        base = self._key("uploads", "")
        found = await self._etcd(self._client.get_prefix(base))
        stale = []
        for kv in found:
            key = kv.key[len(base) :].decode()
            record = json.loads(kv.value)
            if key > after and (until is None or key <= until) and record["upload_id"] not in keep:
                stale.append((key, record["upload_id"]))
        if not stale:
            return 0
        store = open_store(dst_uri)
        try:
            for key, upload_id in stale:
                with contextlib.suppress(OSError):  # gone already, or the store forgot it (BabelError is one)
                    await store.abort_multipart(key, upload_id)
                await self._etcd(self._client.delete(base + key.encode()))
        finally:
            await store.close()
        self.on_event(f"{self.member}: aborted {len(stale)} multipart uploads a previous owner left open")
        return len(stale)

    async def _run_shard(self, spec: dict[str, Any], shard: Shard, fence: int) -> None:
        if shard.done:
            self.on_event(f"{self.member}: took over shard {shard.index} at chunk {shard.done}/{len(shard.chunks)}"
                          f" (last owner {shard.owner or '?'})")  # fmt: skip
        shard.owner = self.member
        while shard.done < len(shard.chunks):
            if not self.alive():
                raise _LeaseLost("the lease expired")
            if await self._stopped():
                return
            report = await self._run_chunk(spec, shard, shard.done)
            doc = report.to_dict()
            if report.state == "failed" and report.fatal.startswith(JOB_FATAL):
                tx = self._client.transactions
                await self._etcd(self._client.transaction(
                    compare=[tx.create(self._key("fatal")) == 0],
                    success=[tx.put(self._key("fatal"), _encode({"fatal": report.fatal, "shard": shard.index}))],
                    failure=[],
                ))  # fmt: skip
                self.on_event(f"{self.member}: shard {shard.index}: {report.fatal} (the job fails)")
                return
            if report.state == "failed":
                shard.attempts += 1
                shard.fatal = report.fatal
                if shard.attempts >= MAX_ATTEMPTS:
                    shard.state = "failed"
                    add_report(shard.report, doc)
                await self._write_shard(shard, fence, release=True)
                await asyncio.sleep(self.poll * shard.attempts)  # a store that is down gets time to come back
                self.on_event(f"{self.member}: shard {shard.index} chunk {shard.done}: {report.fatal}"
                              + (" (failed for good)" if shard.state == "failed" else " (will be tried again)"))  # fmt: skip
                return
            add_report(shard.report, doc)
            shard.done += 1
            self.chunks_done += 1
            if shard.done == len(shard.chunks):
                shard.state = "done"
            if not await self._write_shard(shard, fence, release=shard.state == "done"):
                raise _LeaseLost(f"lost the claim of shard {shard.index}")
            self.on_event(f"{self.member}: shard {shard.index} chunk {shard.done}/{len(shard.chunks)}: "
                          f"copied {report.copied} ({report.copied_bytes} bytes), skipped {report.skipped}")  # fmt: skip

    async def _guarded(self, spec: dict[str, Any], shard: Shard, fence: int) -> None:
        """Run the shard; cancel it the moment this process's lease may have expired (fencing:
        whoever takes the shard over must not find this process still at work), and within
        ``STOP_CHECK`` seconds of the job being canceled, failed or forgotten (the chunk on its way
        is dropped: its open uploads are recorded, and ``--forget`` aborts them)."""
        task = asyncio.ensure_future(self._run_shard(spec, shard, fence))
        checked = time.monotonic()
        try:
            while not task.done():
                stop = ""
                if not self.alive():
                    stop = "lease"
                elif time.monotonic() - checked > STOP_CHECK:
                    checked = time.monotonic()
                    with contextlib.suppress(*ETCD_ERRORS):  # the keep-alive watches etcd's health
                        if await self._stopped():
                            stop = "job"
                if stop:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, _LeaseLost):
                        await task
                    if stop == "lease":
                        raise _LeaseLost(f"lost the lease while working on shard {shard.index}")
                    self.on_event(f"{self.member}: the job was stopped; shard {shard.index} left at chunk "
                                  f"{shard.done}/{len(shard.chunks)}")  # fmt: skip
                    return
                await asyncio.wait({task}, timeout=0.1)
            task.result()
        finally:
            if not task.done():
                task.cancel()

    async def run(self) -> SyncReport:
        """Work on the job until every shard is done or failed (or it is canceled); return the
        job's report, summed over every shard (all processes' work).

        Raises:
            FileNotFoundError: no job of this name (:meth:`submit` first).
            BabelError: etcd did not answer for ``ttl`` seconds at the start.
        """
        started = time.monotonic()
        spec = await self._retrying(self.spec)
        while True:
            try:
                await self._ensure_lease()
                view = await self.view()
                if view.spec is None:
                    raise BabelError(f"shared job {self.job!r} was forgotten while this process worked on it")
                if view.canceled or view.fatal:
                    break
                if view.cut is None:
                    if not await self._try_cut(spec):
                        await self._wait_for_cut()
                    continue
                open_ = [s for s in view.shards if s.state == "todo"]
                if not open_:
                    break
                mine = self._orphans(view)
                if mine:  # claimed by a call whose answer was lost: ours, and nobody else's to take
                    orphan, held = mine[0]
                    self.on_event(f"{self.member}: found its own claim of shard {orphan.index} (its answer was lost)")
                    await self._guarded(spec, orphan, held)
                    continue
                free = [s for s in open_ if s.index not in view.claims]
                # taken-over shards first (their cursor moved), then a random one of the rest: processes
                # starting together spread over the key space instead of racing for shard 0
                free.sort(key=lambda s: (s.done == 0, random.random()))
                for shard in free:
                    fence = await self._claim(shard)
                    if fence is not None:
                        await self._guarded(spec, shard, fence)
                        break
                else:
                    await asyncio.sleep(self.poll)
            except _LeaseLost as exc:
                self.on_event(f"{self.member}: {exc}; its shards are left to others")
                await asyncio.sleep(self.poll)
            except ETCD_ERRORS as exc:
                self._etcd_trouble(exc)
                await asyncio.sleep(self.poll)
        return await self._retrying(lambda: self.report(spec, seconds=time.monotonic() - started))

    def _orphans(self, view: View) -> list[tuple[Shard, int]]:
        """The shards left to do that this process claimed under its current lease, with their
        fences: a claim whose transaction etcd applied while its answer was lost (the call timed
        out, etcd stalled) is this process's, kept alive by its own keep-alive, and no other
        process may take it: without this, a job whose processes all lost such answers stood
        still for ever, every shard claimed and none worked on."""
        lease = self._lease.id if self._lease is not None else None
        return [
            (s, view.claims[s.index][1])
            for s in view.shards
            if s.state == "todo" and s.index in view.claims
            and view.claims[s.index][0] == self.member and view.claims[s.index][2] == lease
        ]  # fmt: skip

    def _etcd_trouble(self, exc: BaseException) -> None:
        """Log an etcd failure: at WARNING once per 10 s (an outage is one line, not one per call)."""
        now = time.monotonic()
        level = logging.WARNING if now - self._warned > 10 else logging.DEBUG
        if level == logging.WARNING:
            self._warned = now
        logger.log(level, "shared job %s: etcd at %s: %s (retrying)", self.job, self.endpoint, etcd_error(exc))

    async def _stopped(self) -> bool:
        """Whether the job was canceled, failed for good or forgotten (three single-key reads)."""
        got = await asyncio.gather(*(self._etcd(self._client.get(self._key(name)))
                                     for name in ("canceled", "fatal", "spec")))  # fmt: skip
        return got[0] is not None or got[1] is not None or got[2] is None

    async def _wait_for_cut(self) -> None:
        """Wait while another process cuts: one key read every ``poll / 5`` seconds (the cut is
        what every process starts with), at most until the cutter's lease could have expired."""
        deadline = time.monotonic() + self.ttl
        while time.monotonic() < deadline:
            await asyncio.sleep(self.poll / 5)
            if await self._etcd(self._client.get(self._key("cut"))) is not None:
                return
            if await self._etcd(self._client.get(self._key("cutter"))) is None:
                return  # the cutter died: try to take its place

    async def _retrying(self, fn):
        deadline = time.monotonic() + max(self.ttl, self.timeout)
        while True:
            try:
                return await fn()
            except ETCD_ERRORS as exc:
                if time.monotonic() > deadline:
                    raise BabelError(f"etcd at {self.endpoint}: {etcd_error(exc)}") from exc
                await asyncio.sleep(min(1.0, self.poll))

    async def report(
        self, spec: dict[str, Any] | None = None, *, seconds: float = 0.0, view: View | None = None
    ) -> SyncReport:
        """The job's report as etcd has it now (or as ``view`` has it): every shard's counts summed;
        state ``running`` while shards are left, then ok, partial or failed (a shard failed for good)."""
        spec = spec or await self.spec()
        view = view or await self.view()
        shards, cut, canceled = view.shards, view.cut, view.canceled
        total: dict[str, Any] = {}
        for shard in shards:
            add_report(total, shard.report)
        report = SyncReport(self.job, spec["src"], spec["dst"])
        for name in _COUNTS:
            setattr(report, name, total.get(name, 0))
        report.not_files = total.get("not_files", {})
        report.errors = total.get("errors", [])
        report.verification = total.get("verification") or new_verification(spec["options"].get("verify", "sample"))
        report.seconds = seconds
        failed = [s for s in shards if s.state == "failed"]
        if view.fatal:
            report.fatal = view.fatal
        elif cut and cut.get("fatal"):
            report.fatal = cut["fatal"]
        elif failed:
            report.fatal = f"{len(failed)} of {len(shards)} shards failed: " + "; ".join(
                f"shard {s.index}: {s.fatal}" for s in failed[:3]
            )
        bad = sum(report.verification[k]["failed"] for k in ("metadata", "sample", "full"))
        if canceled:
            report.state, report.fatal = "canceled", report.fatal or "canceled"
        elif failed or view.fatal or (cut and cut.get("fatal")):
            report.state = "failed"
        elif not cut or any(s.state == "todo" for s in shards):
            report.state = "running"
        else:
            report.state = "partial" if (report.failed or bad) else "ok"
        return report

    async def cancel(self) -> None:
        """Ask every process of the job to stop (within STOP_CHECK seconds; the chunks on their way are dropped)."""
        await self._etcd(self._client.put(self._key("canceled"), _encode({"at": time.time()})))

    async def delete(self, *, force: bool = False) -> int:
        """Delete the job's keys from etcd (its objects are not touched); returns how many.

        Raises:
            BabelError: processes still work on it (``force`` deletes anyway: they stop at their
                next write, which finds the job gone).
        """
        view = await self.view()
        if view.members and not force:
            raise BabelError(
                f"{len(view.members)} processes still work on job {self.job!r}: cancel it, wait for them "
                "to exit, then forget it"
            )
        if view.spec is not None:  # the uploads its processes left open (killed, canceled)
            await self._abort_uploads(view.spec["dst"], ("", None), keep=set())
        deleted = await self._etcd(self._client.delete_prefix(self._key("")))
        return int(getattr(deleted, "deleted", 0))

    async def close(self) -> None:
        """Revoke the lease (this process's claims go at once) and close the etcd connection."""
        await self._drop_lease()
        with contextlib.suppress(*ETCD_ERRORS):
            await self._client.close()


class _LeaseLost(Exception):
    """This process may no longer act on its claims (lease expired, or the claim is gone)."""


async def shared_jobs(endpoint: str, *, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every shared job in etcd: name, src, dst, state, shards (done/total), members, counts.

    Raises:
        BabelError: etcd does not answer within ``timeout`` seconds.
    """
    client = _client(endpoint, timeout)  # a malformed list: BabelError
    try:
        found = await asyncio.wait_for(client.get_prefix(PREFIX.encode(), keys_only=True), timeout)
        names = sorted({kv.key[len(PREFIX) :].decode().split("/", 1)[0] for kv in found})
    except ETCD_ERRORS as exc:
        raise BabelError(f"etcd at {endpoint}: {etcd_error(exc)}") from exc
    finally:
        with contextlib.suppress(*ETCD_ERRORS):
            await client.close()
    jobs = []
    for name in names:
        try:
            jobs.append(await describe_job(endpoint, name, timeout=timeout))
        except FileNotFoundError:  # keys without a spec: a job forgotten while a process still wrote
            jobs.append({"id": name, "kind": "shared", "src": "", "dst": "", "state": "orphaned", "phase": "",
                         "cut": None, "members": [], "shards": [], "summary": {"copied": 0, "copied_bytes": 0}})  # fmt: skip
    return jobs


async def describe_job(endpoint: str, job: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """One shared job as ``babel jobs --etcd`` shows it: its report, its shards (range, keys,
    cursor, state, owner: the claim's holder now, or the last one), its members.

    Raises:
        FileNotFoundError: no such job. BabelError: etcd does not answer.
    """
    view = SharedJob(endpoint, job, "", timeout=timeout)  # reads only: never takes a lease
    try:
        state = await view.view()  # one range read: the spec, the shards, the claims
        if state.spec is None:
            raise FileNotFoundError(f"no shared job {job!r} in etcd")
        spec = state.spec
        report = await view.report(spec, view=state)
    except ETCD_ERRORS as exc:
        raise BabelError(f"etcd at {endpoint}: {etcd_error(exc)}") from exc
    finally:
        await view.close()
    return {
        "id": job, "kind": "shared", "src": spec["src"], "dst": spec["dst"], "state": report.state,
        "phase": "done" if report.state not in ("running",) else "copying" if state.cut else "cutting", "created": spec.get("created"), "canceled": state.canceled,
        "members": sorted(state.members), "cut": state.cut, "summary": report.to_dict(),
        "shards": [
            {"index": s.index, "after": s.after, "until": s.until, "keys": s.keys, "chunks": len(s.chunks),
             "done": s.done, "state": s.state, "owner": state.claims.get(s.index, (s.owner, 0, 0))[0],
             "working": s.index in state.claims, "copied": s.report.get("copied", 0),
             "copied_bytes": s.report.get("copied_bytes", 0), "fatal": s.fatal}
            for s in state.shards
        ],
    }  # fmt: skip
