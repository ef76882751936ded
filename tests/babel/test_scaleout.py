"""One sync job shared by several babel processes on a real etcd: cut, claims, takeover, fencing.

Processes are real (``python -m babel.cli.main sync ... --etcd --job``), killed with SIGKILL or
stopped with SIGSTOP; etcd is Debian's ``etcd-server``, killed and restarted on its data.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from babel.options import SyncOptions
from babel.scaleout import JobSpecMismatch, Shard, SharedJob, add_report, cut_points, describe_job
from babel.sync import MAX_REPORTED
from pcache.testing.etcd import Etcd, start_etcd
from tests.babel.test_sync import babel, tree_contents
from tests.conftest import REQUIRES_ETCD, create_bucket

TTL = "2"  # seconds: a dead process's shards are free again this soon


# ------------------------------------------------------------------------ cutting (no etcd) --


def _pages(keys: list[str], sizes: list[int]) -> list[tuple[str, str, int]]:
    pages, i = [], 0
    for n in sizes:
        if i >= len(keys):
            break
        page = keys[i : i + n]
        pages.append((page[0], page[-1], len(page)))
        i += n
    return pages


def _check_cover(shards: list[Shard], keys: list[str], chunk_keys: int) -> None:
    assert shards[0].after == "" and shards[-1].until is None and shards[-1].chunks[-1] is None
    for a, b in zip(shards, shards[1:], strict=False):
        assert a.until == b.after and a.chunks[-1] == a.until
    # every key in exactly one chunk, chunks in order, each full but the last of the key space
    seen: list[str] = []
    for shard in shards:
        for j in range(len(shard.chunks)):
            lo, hi = shard.chunk_range(j)
            inside = [k for k in keys if k > lo and (hi is None or k <= hi)]
            assert hi is None or len(inside) >= chunk_keys, (shard.index, j, len(inside))
            seen.extend(inside)
        assert shard.keys == sum(1 for k in keys if k > shard.after and (shard.until is None or k <= shard.until))
    assert seen == keys


def test_cut_points_cover_the_key_space_once_in_order_from_shuffled_pages() -> None:
    rng = random.Random(7)
    keys = sorted({f"{rng.choice('abcxyz')}/{rng.randrange(10**6):06d}.bin" for _ in range(5000)})
    pages = _pages(keys, [rng.randrange(1, 120) for _ in range(5000)])
    rng.shuffle(pages)  # the parallel lister hands pages over in no order
    shards = cut_points(pages, shard_keys=1000, chunk_keys=250)
    assert 4 <= len(shards) <= 6
    assert all(3 <= len(s.chunks) <= 5 for s in shards[:-1])
    _check_cover(shards, keys, 250)


@pytest.mark.parametrize(
    ("n", "want_shards"),
    [(0, 1), (1, 1), (300, 3), (301, 4)],  # 300: the keys end on a shard boundary (open end moves there)
)
def test_cut_points_edges(n: int, want_shards: int) -> None:
    keys = [f"k{i:05d}" for i in range(n)]
    shards = cut_points(_pages(keys, [50] * 10), shard_keys=100, chunk_keys=50)
    assert len(shards) == want_shards
    _check_cover(shards, keys, 50)


def test_reports_of_chunks_add_up_and_errors_stay_capped() -> None:
    part = {"copied": 3, "copied_bytes": 30, "failed": 1, "errors_total": 40, "not_files": {"symlink": 2},
            "errors": [{"key": f"k{i}", "error": "x"} for i in range(40)],
            "verification": {"mode": "sample", "metadata": {"checked": 3, "failed": 0, "proves": "..."},
                             "runtime": {"crc32c_in_stream": 3, "store_checksum_compared": 0},
                             "sample": {"checked": 1, "failed": 1, "bytes_read": 10}, "full": {"checked": 2},
                             "failures": [{"key": "k0"}]}}  # fmt: skip
    total = add_report(add_report({}, part), part)
    assert (total["copied"], total["copied_bytes"], total["failed"], total["errors_total"]) == (6, 60, 2, 80)
    assert total["not_files"] == {"symlink": 4} and len(total["errors"]) == MAX_REPORTED
    v = total["verification"]
    assert (v["metadata"]["checked"], v["sample"]["failed"], v["sample"]["bytes_read"], v["full"]["checked"]) == (
        6, 2, 20, 4)  # fmt: skip
    assert len(v["failures"]) == 2 and v["metadata"]["proves"] != "..."  # texts are not summed


# ------------------------------------------------------------------------------ with etcd --


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    server = start_etcd(tmp_path / "etcd")
    yield server
    server.stop()


def _tree(root: Path, n: int, size: int) -> Path:
    rng = random.Random(n)
    for i in range(n):
        p = root / f"d{i % 5}" / f"part-{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size + i))
    return root


def _bucket_contents(uri: str, endpoint: str) -> dict[str, bytes]:
    bucket, _, prefix = uri.removeprefix("s3://").split("?")[0].partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def _start(src: str, dst: str, etcd: Etcd, job: str, state: Path, *extra: str) -> subprocess.Popen:
    state.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "babel.cli.main", "sync", src, dst, "--etcd", etcd.endpoint, "--job", job,
         "--state-dir", str(state), "--lease-ttl", TTL, "--json", "--no-progress", *extra],
        stdout=subprocess.PIPE, stderr=open(state / "stderr.log", "w"), text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 180) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return json.loads(out)


def _wait_for(path: Path, pattern: str, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text())
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in {path}: {path.read_text()[-2000:]}")


@REQUIRES_ETCD
@pytest.mark.s3
@pytest.mark.timeout(300)
def test_three_processes_share_a_job_and_a_killed_ones_shard_is_taken_over_from_its_cursor(
    tmp_path: Path, etcd: Etcd, moto_endpoint: str
) -> None:
    src = _tree(tmp_path / "src", 240, 16 << 10)
    dst = f"s3://{create_bucket(moto_endpoint)}/copy?endpoint_url={moto_endpoint}"
    args = ("--shard-keys", "80", "--chunk-keys", "20", "--bwlimit", "400K")
    procs = [_start(f"file://{src}", dst, etcd, "nightly", tmp_path / f"p{i}", *args) for i in range(3)]
    # kill -9 the first process once it finished a chunk and is in the middle of its shard
    victim = tmp_path / "p0" / "stderr.log"
    got = _wait_for(victim, r"shard (\d+) chunk 1/[2-9]")
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    killed_at = time.monotonic()
    reports = [_finish(p) for p in procs[1:]]
    logs = "".join((tmp_path / f"p{i}" / "stderr.log").read_text() for i in (1, 2))
    took = re.search(rf"took over shard {got.group(1)} at chunk (\d)/", logs)
    assert took, logs
    assert int(took.group(1)) >= 1  # from the cursor, not from the start of the shard
    for report in reports:  # each survivor prints the whole job's report
        assert report["state"] == "ok", report
        assert report["listed_src"] == 240
        assert (
            report["copied"] + report["skipped"] + report["already_done"] == 240
        )  # the chunk in flight was planned again
        assert report["verification"]["metadata"]["checked"] == report["copied"] + report["already_done"]
    chunks = sum(s["chunks"] for s in asyncio.run(describe_job(etcd.endpoint, "nightly"))["shards"])
    assert 1 <= chunks - reports[0]["shared"]["chunks_by_me"] - reports[1]["shared"]["chunks_by_me"] < chunks
    assert _bucket_contents(dst, moto_endpoint) == tree_contents(src)
    job = asyncio.run(describe_job(etcd.endpoint, "nightly"))
    assert [s["state"] for s in job["shards"]] == ["done"] * 3 and job["members"] == []
    assert all(s["done"] == s["chunks"] >= 2 for s in job["shards"])
    assert time.monotonic() - killed_at < 120
    shown = babel("jobs", "nightly", "--etcd", etcd.endpoint)
    assert shown.returncode == 0 and "nightly: ok" in shown.stdout and "done" in shown.stdout, shown.stdout


@REQUIRES_ETCD
@pytest.mark.timeout(120)
def test_a_claim_lost_to_another_process_fences_its_writes(tmp_path: Path, etcd: Etcd) -> None:
    """The attacker's side of fencing: a process whose lease etcd dropped (as after SIGSTOP)
    still thinks it holds its shard; its write is refused by the transaction, not by its own clock."""
    src = _tree(tmp_path / "src", 30, 100)

    async def scenario() -> None:
        a = SharedJob(etcd.endpoint, "fence", str(tmp_path / "a"), ttl=3)
        b = SharedJob(etcd.endpoint, "fence", str(tmp_path / "b"), ttl=3)
        try:
            await a.submit(f"file://{src}", f"file://{tmp_path}/dst", SyncOptions(), shard_keys=10, chunk_keys=5)
            await a._ensure_lease()
            assert await a._try_cut(await a.spec())
            shard = (await a.view()).shards[0]
            fence_a = await a._claim(shard)
            assert fence_a is not None and await b._ensure_lease() is None
            assert await b._claim(shard) is None  # held: nobody else gets it
            await a._lease.revoke()  # etcd drops a's lease; a's own clock still says it holds the claim
            assert a.alive()
            fence_b = await b._claim(shard)
            assert fence_b is not None and fence_b > fence_a
            shard.done, shard.owner = 1, "a"
            assert await a._write_shard(shard, fence_a) is False  # refused: the claim is b's now
            view = await b.view()
            assert view.shards[0].done == 0 and view.claims[0][0] == b.member
            shard.owner = b.member
            assert await b._write_shard(shard, fence_b) is True
            assert (await b.view()).shards[0].done == 1
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


@REQUIRES_ETCD
@pytest.mark.timeout(120)
def test_a_claim_and_a_cut_whose_answers_were_lost_are_taken_up_by_their_owner(tmp_path: Path, etcd: Etcd) -> None:
    """etcd stopped (SIGSTOP) longer than the lease: on its return it applied transactions whose
    callers had timed out. Claims so made stood under each process's live lease, kept alive by its
    own keep-alive, worked on by nobody and taken by nobody: both processes of a job polled for
    ever. A process now takes up what etcd says it holds under its current lease: the cutter key,
    then the claims."""
    src = _tree(tmp_path / "src", 40, 100)

    async def scenario() -> dict:
        a = SharedJob(etcd.endpoint, "lost", str(tmp_path / "a"), ttl=3, poll=0.2)
        try:
            await a.submit(f"file://{src}", f"file://{tmp_path}/dst", SyncOptions(), shard_keys=10, chunk_keys=5)
            await a._ensure_lease()
            # the transactions went through, their answers never came back
            await a._client.put(a._key("cutter"), a.member.encode(), lease=a._lease)
            assert await a._try_cut(await a.spec())  # its own cutter key: it cuts
            view = await a.view()
            assert view.cut is not None and len(view.shards) == 3
            for shard in view.shards:
                await a._client.put(a._key("claims", f"{shard.index:06d}"), a.member.encode(), lease=a._lease)
            report = await asyncio.wait_for(a.run(), 60)
            assert report.state == "ok" and report.copied == 40, report.to_dict()
            return {"done": [s.state for s in (await a.view()).shards], "claims": (await a.view()).claims}
        finally:
            await a.close()

    got = asyncio.run(scenario())
    assert got == {"done": ["done"] * 3, "claims": {}}
    assert tree_contents(tmp_path / "dst") == tree_contents(src)


@REQUIRES_ETCD
@pytest.mark.timeout(240)
def test_a_stopped_process_loses_its_shard_and_never_writes_it_again(tmp_path: Path, etcd: Etcd) -> None:
    src = _tree(tmp_path / "src", 120, 8 << 10)
    args = ("--shard-keys", "60", "--chunk-keys", "20", "--bwlimit", "200K")
    a = _start(f"file://{src}", f"file://{tmp_path}/dst", etcd, "stop", tmp_path / "a", *args)
    got = _wait_for(tmp_path / "a" / "stderr.log", r"shard (\d+) chunk 1/[2-9]")
    a.send_signal(signal.SIGSTOP)
    try:
        b = _start(f"file://{src}", f"file://{tmp_path}/dst", etcd, "stop", tmp_path / "b", *args)
        _wait_for(tmp_path / "b" / "stderr.log", rf"took over shard {got.group(1)} at chunk [1-9]/")
    finally:
        a.send_signal(signal.SIGCONT)
    ra, rb = _finish(a), _finish(b)
    log_a = (tmp_path / "a" / "stderr.log").read_text()
    assert "lost the lease" in log_a or "lost the claim" in log_a, log_a
    for report in (ra, rb):
        assert report["state"] == "ok" and report["listed_src"] == 120
        assert report["copied"] + report["skipped"] + report["already_done"] == 120
    assert tree_contents(tmp_path / "dst") == tree_contents(src)


@REQUIRES_ETCD
@pytest.mark.timeout(300)
def test_etcd_killed_and_restarted_mid_job_the_job_still_ends_complete(tmp_path: Path, etcd: Etcd) -> None:
    src = _tree(tmp_path / "src", 150, 8 << 10)
    args = ("--shard-keys", "50", "--chunk-keys", "25", "--bwlimit", "150K")
    procs = [_start(f"file://{src}", f"file://{tmp_path}/dst", etcd, "outage", tmp_path / f"p{i}", *args)
             for i in range(3)]  # fmt: skip
    deadline = time.monotonic() + 60
    while not any("chunk 1/" in (tmp_path / f"p{i}" / "stderr.log").read_text() for i in range(3)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    port = int(etcd.endpoint.rsplit(":", 1)[1])
    etcd.proc.send_signal(signal.SIGKILL)
    etcd.proc.wait()
    time.sleep(4.0)  # longer than the lease: every claim is in doubt
    restarted = start_etcd(etcd.data_dir, client_port=port)
    try:
        reports = [_finish(p) for p in procs]
    finally:
        restarted.stop()
    logs = "".join((tmp_path / f"p{i}" / "stderr.log").read_text() for i in range(3))
    assert "lost the lease while working on shard" in logs  # the outage hit processes at work
    for report in reports:
        assert report["state"] == "ok" and report["listed_src"] == 150, report
        assert report["copied"] + report["skipped"] + report["already_done"] == 150
    assert tree_contents(tmp_path / "dst") == tree_contents(src)


@REQUIRES_ETCD
@pytest.mark.timeout(120)
def test_shared_job_mistakes_are_one_line_each(tmp_path: Path, etcd: Etcd, moto_endpoint: str) -> None:
    src = _tree(tmp_path / "src", 5, 10)
    ep = etcd.endpoint
    assert babel("sync", f"file://{src}", f"file://{tmp_path}/d1", "--etcd", ep, "--job", "j1",
                 "--lease-ttl", TTL).returncode == 0  # fmt: skip
    other = babel("sync", f"file://{src}", f"file://{tmp_path}/d2", "--etcd", ep, "--job", "j1")
    assert other.returncode == 3 and f"exists with other settings (dst: 'file://{tmp_path}/d1' there" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    nojob = babel("sync", "--etcd", ep, "--job", "nope")
    assert nojob.returncode == 3 and "no shared job 'nope'" in nojob.stderr
    bad = babel("sync", f"file://{src}", f"file://{tmp_path}/d3", "--etcd", ep, "--job", "a/b")
    assert bad.returncode == 3 and "name is letters" in bad.stderr
    dry = babel("sync", f"file://{src}", f"file://{tmp_path}/d3", "--etcd", ep, "--job", "j3", "--dry-run")
    assert dry.returncode == 3 and "--dry-run does not go with --etcd" in dry.stderr
    half = babel("sync", f"file://{src}", f"file://{tmp_path}/d3", "--job", "j3")
    assert half.returncode == 3 and "needs both --etcd" in half.stderr
    # a source that cannot be listed fails the job for every process, with the store's error
    missing = f"s3://no-such-bucket/x?endpoint_url={moto_endpoint}"
    gone = babel("sync", missing, f"file://{tmp_path}/d4", "--etcd", ep, "--job", "j4", "--json")
    assert gone.returncode == 2 and "NoSuchBucket" in json.loads(gone.stdout)["fatal"], gone.stdout
    joined = babel("sync", "--etcd", ep, "--job", "j4", "--json")
    assert joined.returncode == 2 and "NoSuchBucket" in json.loads(joined.stdout)["fatal"]
    # so does a missing destination bucket: at once, not after 3 tries of every shard
    started = time.monotonic()
    nodst = f"s3://no-such-dst/x?endpoint_url={moto_endpoint}"
    r = babel("sync", f"file://{src}", nodst, "--etcd", ep, "--job", "j5", "--shard-keys", "1", "--chunk-keys", "1",
              "--json")  # fmt: skip
    assert r.returncode == 2 and json.loads(r.stdout)["fatal"].startswith("NoSuchBucket"), r.stdout
    assert time.monotonic() - started < 30
    listed = babel("jobs", "--etcd", ep, "--json")
    assert {j["id"]: j["state"] for j in json.loads(listed.stdout)} == {"j1": "ok", "j4": "failed", "j5": "failed"}
    assert babel("cancel", "nope", "--etcd", "127.0.0.1:1").stderr.count("\n") == 1  # one line, no traceback
    # every member of an etcd cluster listed: a dead one first is passed over
    members = babel("jobs", "--etcd", f"127.0.0.1:1,{ep}", "--json")
    assert members.returncode == 0 and {j["id"] for j in json.loads(members.stdout)} == {"j1", "j4", "j5"}
    unknown = babel("jobs", "--etcd", "etcd-a.invalid:2379,etcd-b.invalid:2379")
    assert unknown.returncode != 0 and "no etcd member resolves: etcd-a.invalid:2379" in unknown.stderr
    assert unknown.stderr.count("\n") == 1, unknown.stderr
    assert babel("wait", "j1", "--etcd", ep).returncode == 0 and babel("wait", "j4", "--etcd", ep).returncode == 2
    # cancel, then forget
    assert babel("cancel", "j1", "--etcd", ep).returncode == 0
    canceled = babel("sync", "--etcd", ep, "--job", "j1", "--json")  # canceled: nothing more is done
    assert canceled.returncode == 2 and json.loads(canceled.stdout)["state"] == "canceled"
    forgot = babel("cancel", "j1", "--etcd", ep, "--forget")
    assert forgot.returncode == 0 and "forgotten" in forgot.stdout
    assert babel("jobs", "j1", "--etcd", ep).returncode != 0


@REQUIRES_ETCD
@pytest.mark.parametrize("side", ["src", "dst"])
def test_a_shared_job_whose_store_does_not_answer_fails_once_within_15_seconds(
    tmp_path: Path, etcd: Etcd, side: str
) -> None:
    """A source that takes connections and sends nothing hung the cut of a shared job for ever
    (a single-process sync fails in one line within 15 s), and an unreachable destination failed
    each shard in turn, three tries each (7 shards: 108 s). The cutter probes both stores first:
    the job fails once, for every process, naming the endpoint."""
    import socket

    src = _tree(tmp_path / "src", 20, 10)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # never accepting: the kernel completes the handshakes, nobody answers
        silent = f"s3://bkt/p?endpoint_url=http://127.0.0.1:{sock.getsockname()[1]}"
        pair = (silent, f"file://{tmp_path}/dst") if side == "src" else (f"file://{src}", silent)
        t0 = time.monotonic()
        r = babel("sync", *pair, "--etcd", etcd.endpoint, "--job", f"hung-{side}", "--shard-keys", "5",
                  "--chunk-keys", "5", "--json", "--no-progress", "--state-dir", str(tmp_path / "state"))  # fmt: skip
        took = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "sent no answer" in json.loads(r.stdout)["fatal"] and took < 15, (r.stdout, took)
    listed = babel("jobs", "--etcd", etcd.endpoint, "--json")
    assert {j["id"]: j["state"] for j in json.loads(listed.stdout)} == {f"hung-{side}": "failed"}


@REQUIRES_ETCD
def test_submit_refuses_another_spec_under_the_same_name(tmp_path: Path, etcd: Etcd) -> None:
    async def scenario() -> None:
        job = SharedJob(etcd.endpoint, "same", str(tmp_path))
        try:
            spec = await job.submit(f"file://{tmp_path}/a", f"file://{tmp_path}/b", SyncOptions(transfers=4))
            assert (await job.submit(f"file://{tmp_path}/a", f"file://{tmp_path}/b", SyncOptions(transfers=4)))[
                "src"] == spec["src"]  # fmt: skip
            # how hard a process works is its own choice; what the job does is not
            await job.submit(f"file://{tmp_path}/a", f"file://{tmp_path}/b", SyncOptions(transfers=8, bwlimit=1e6))
            assert job.local_options["transfers"] == 8 and job.local_options["bwlimit"] == 1e6
            with pytest.raises(JobSpecMismatch, match=r"--verify: 'sample' there, 'full' here"):
                await job.submit(f"file://{tmp_path}/a", f"file://{tmp_path}/b", SyncOptions(verify="full"))
        finally:
            await job.close()

    os.makedirs(tmp_path / "a")
    asyncio.run(scenario())


def test_a_bandwidth_limit_has_no_first_second_burst_and_is_shared_by_its_users() -> None:
    from babel.transfer import Bandwidth

    async def scenario() -> float:
        bw = Bandwidth(200_000)  # bytes/s, shared by two "chunks" of one process
        start = time.monotonic()
        await asyncio.gather(*(bw.take(50_000) for _ in range(6)))  # 300 kB: 1.5 s at the rate
        return time.monotonic() - start

    # a bucket that started empty would have let 200 kB through at once (0.5 s in all)
    assert asyncio.run(scenario()) >= 1.4


@REQUIRES_ETCD
@pytest.mark.timeout(120)
def test_forgetting_a_job_that_processes_still_work_on_is_refused_and_never_leaves_a_ghost(
    tmp_path: Path, etcd: Etcd
) -> None:
    """From a user's trial: --forget while a process ran made it cut the job again without a spec;
    the ghost broke `babel jobs --etcd`, and a new job of that name 'copied' nothing, exit 0."""
    src = _tree(tmp_path / "src", 60, 8 << 10)
    args = ("--shard-keys", "20", "--chunk-keys", "10", "--bwlimit", "100K")
    proc = _start(f"file://{src}", f"file://{tmp_path}/dst", etcd, "ghost", tmp_path / "p", *args)
    _wait_for(tmp_path / "p" / "stderr.log", r"chunk 1/")
    refused = babel("cancel", "ghost", "--etcd", etcd.endpoint, "--forget")
    assert refused.returncode != 0 and "1 processes still work on job 'ghost'" in refused.stderr
    # an operator deleting the keys by hand (etcdctl del --prefix) while the process runs
    asyncio.run(_delete_keys(etcd.endpoint, "ghost"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "was forgotten while this process worked on it" in (
        tmp_path / "p" / "stderr.log").read_text()  # fmt: skip
    listed = babel("jobs", "--etcd", etcd.endpoint, "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # nothing re-created
    fresh = babel("sync", f"file://{src}", f"file://{tmp_path}/dst2", "--etcd", etcd.endpoint, "--job", "ghost",
                  "--json", "--lease-ttl", TTL)  # fmt: skip
    report = json.loads(fresh.stdout)
    assert fresh.returncode == 0 and report["copied"] == 60 and report["listed_src"] == 60
    assert tree_contents(tmp_path / "dst2") == tree_contents(src)


@REQUIRES_ETCD
def test_a_shared_job_every_process_of_which_died_is_stalled_and_wait_says_interrupted(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Its processes killed, a shared job showed "running" and ``babel wait`` waited for ever;
    their chunk journals here were "would clean (running ...)" and listed above newer jobs."""
    src = _tree(tmp_path / "src", 60, 8 << 10)
    proc = _start(f"file://{src}", f"file://{tmp_path}/dst", etcd, "orphan", tmp_path / "p",
                  "--shard-keys", "20", "--chunk-keys", "10", "--bwlimit", "100K")  # fmt: skip
    deadline = time.monotonic() + 60
    while True:  # killed inside a chunk: stopped first, and only killed while a chunk's journal says running
        assert time.monotonic() < deadline, (tmp_path / "p" / "stderr.log").read_text()
        if list((tmp_path / "p").glob("orphan.*/job.json")):
            proc.send_signal(signal.SIGSTOP)
            if any(_state(j) == "running" for j in (tmp_path / "p").glob("orphan.*/job.json")):
                break
            proc.send_signal(signal.SIGCONT)  # between two chunks (a loaded machine polls late)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    started = time.monotonic()
    r = babel("wait", "orphan", "--etcd", etcd.endpoint, "--orphan-after", "1", "--timeout", "60")
    assert r.returncode == 2 and "no process has held shared job orphan" in r.stderr, (r.stdout, r.stderr)
    assert time.monotonic() - started < 30  # the lease, then a second
    assert "stalled" in babel("jobs", "--etcd", etcd.endpoint).stdout
    # this host's journal of the dead process's chunk, then a newer local job
    later = babel("sync", f"file://{src}", f"file://{tmp_path}/dst3", "--state-dir", str(tmp_path / "p"), "--json")
    assert later.returncode == 0, later.stderr
    jobs = json.loads(babel("jobs", "--state-dir", str(tmp_path / "p"), "--json").stdout)
    assert jobs[0]["id"] == json.loads(later.stdout)["job"] and jobs[1]["id"].startswith("orphan.")
    dry = babel("clean", "--all", "--dry-run", "--state-dir", str(tmp_path / "p"))
    assert "would forget this host's journal of a chunk of shared job orphan (interrupted" in dry.stdout, dry.stdout
    done = babel("clean", "--all", "--state-dir", str(tmp_path / "p"))
    assert done.returncode == 0 and "forgot" in done.stdout
    assert [j["id"] for j in json.loads(babel("jobs", "--state-dir", str(tmp_path / "p"), "--json").stdout)] == [
        jobs[0]["id"]
    ]


def _state(job_json: Path) -> str:
    """The ``state`` in a chunk's ``job.json`` ("" while it is being written)."""
    try:
        return str(json.loads(job_json.read_text()).get("state", ""))
    except (OSError, ValueError):
        return ""


def _big_objects(tmp_path: Path, endpoint: str, n: int, size: int) -> tuple[Path, str, str]:
    """``n`` files of ``size`` random bytes in ``tmp_path/src``, and a fresh bucket: (src, bucket, dst URI)."""
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(n)
    for i in range(n):
        (src / f"big-{i}.bin").write_bytes(rng.randbytes(size))
    bucket = create_bucket(endpoint)
    return src, bucket, f"s3://{bucket}/copy?endpoint_url={endpoint}"


async def _delete_keys(endpoint: str, job: str) -> None:
    forget = SharedJob(endpoint, job, "")
    try:
        assert await forget.delete(force=True) > 0
    finally:
        await forget.close()


@REQUIRES_ETCD
@pytest.mark.s3
@pytest.mark.timeout(240)
def test_multipart_uploads_a_killed_process_left_open_are_aborted_by_the_next_owner(
    tmp_path: Path, etcd: Etcd, moto_endpoint: str
) -> None:
    src, bucket, dst = _big_objects(tmp_path, moto_endpoint, 3, 6 << 20)  # two parts each
    args = ("--shard-keys", "1", "--chunk-keys", "1", "--multipart-threshold", "5M", "--part-size", "5M",
            "--bwlimit", "3M", "--transfers", "1")  # fmt: skip
    first = _start(f"file://{src}", dst, etcd, "parts", tmp_path / "a", *args)
    _wait_for(tmp_path / "a" / "stderr.log", r"chunk 1/1")
    time.sleep(1.5)  # into the next object's upload
    first.send_signal(signal.SIGKILL)
    first.wait()
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads"), "the kill left no upload open: too late"
    second = _start(f"file://{src}", dst, etcd, "parts", tmp_path / "b", *args)
    report = _finish(second)
    assert report["state"] == "ok"
    assert "aborted 1 multipart uploads a previous owner left open" in (tmp_path / "b" / "stderr.log").read_text()
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert _bucket_contents(dst, moto_endpoint) == tree_contents(src)
    job = asyncio.run(_etcd_keys(etcd.endpoint, "/babel/jobs/parts/uploads/"))
    assert job == []


async def _etcd_keys(endpoint: str, prefix: str) -> list[str]:
    import aetcd

    host, port = endpoint.rsplit(":", 1)
    client = aetcd.Client(host=host, port=int(port))
    try:
        return [kv.key.decode() for kv in await client.get_prefix(prefix.encode())]
    finally:
        await client.close()


@REQUIRES_ETCD
@pytest.mark.s3
@pytest.mark.timeout(240)
def test_cancel_stops_a_process_mid_chunk_and_forget_aborts_its_uploads(
    tmp_path: Path, etcd: Etcd, moto_endpoint: str
) -> None:
    src, bucket, dst = _big_objects(tmp_path, moto_endpoint, 2, 11 << 20)  # 3 parts each, one chunk
    proc = _start(f"file://{src}", dst, etcd, "stopme", tmp_path / "p", "--multipart-threshold", "5M",
                  "--part-size", "5M", "--bwlimit", "1M", "--transfers", "2")  # fmt: skip
    _wait_for(tmp_path / "p" / "stderr.log", r"cut 2 keys")
    time.sleep(2.0)  # parts on their way (22 MiB at 1 MB/s: 20 s for the chunk)
    assert babel("cancel", "stopme", "--etcd", etcd.endpoint).returncode == 0
    canceled_at = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - canceled_at < 10  # not after the chunk's 20 s
    assert proc.returncode == 2 and json.loads(out)["state"] == "canceled"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    forgot = babel("cancel", "stopme", "--etcd", etcd.endpoint, "--forget")
    assert forgot.returncode == 0, forgot.stderr
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert asyncio.run(_etcd_keys(etcd.endpoint, "/babel/jobs/stopme/")) == []
