"""``babel daemon`` as a real process on loopback: jobs from the CLI, schedules of the newest
checkpoint, restarts (SIGTERM and SIGKILL), bad requests; the queue bound in process.

Destinations are checked with independent clients (boto3, the file system).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import boto3
import pytest

from babel.daemon import (
    Daemon,
    DaemonConfig,
    RequestRejected,
    join_uri,
    natural_key,
    newest_checkpoint,
    options_from_json,
)
from babel.errors import TransientError
from babel.journal import list_jobs
from babel.sync import SyncOptions
from pcache.common.process import free_port
from pcache.testing.faults import wait_for

pytestmark = pytest.mark.s3

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    addr: str,
    method: str,
    path: str,
    body: Any = None,
    raw: bytes | None = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """(status, JSON body) of one request to the daemon, as JSON with ``token`` (None: no
    Authorization header); ``headers`` added last (they may replace those)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method, headers={**sent, **(headers or {})})
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def babel(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "babel.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


class DaemonProcess:
    """``babel daemon`` in a subprocess, its log in ``<state>/../daemon-N.log``."""

    def __init__(self, state: Path, *extra: str) -> None:
        self.addr = f"127.0.0.1:{free_port()}"
        self.log = state.parent / f"daemon-{time.monotonic_ns()}.log"
        allow = ["--allow", "s3://", "--allow", f"file://{state.parent}"]  # the test's own directory only
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "babel.cli.main", "daemon", "--listen", self.addr, "--state-dir", str(state),
                 *allow, *extra],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for(self._healthy, 30, "the daemon's /healthz", every=0.05)
        except AssertionError:
            self.proc.kill()
            raise AssertionError(self.log.read_text()) from None
        self.token = (state / "daemon.token").read_text().strip()
        self.env = {"BABEL_DAEMON_TOKEN": self.token}  # for the CLI, whose default state dir is not this one

    def http(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        """:func:`http` to this daemon with its token."""
        return http(self.addr, method, path, body, raw, token=self.token)

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return http(self.addr, "GET", "/healthz")[1]["ok"]
        except (OSError, ValueError):
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def daemons() -> Iterator[Callable[..., DaemonProcess]]:
    """A factory of daemon processes, all killed at the end."""
    started: list[DaemonProcess] = []

    def start(state: Path, *extra: str) -> DaemonProcess:
        started.append(DaemonProcess(state, *extra))
        return started[-1]

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def bucket_contents(bucket: str, endpoint: str, prefix: str = "data/") -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) :]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def job_doc(state: Path, job_id: str) -> dict:
    return json.loads((state / job_id / "job.json").read_text())


# ------------------------------------------------------------ no network --


def test_options_json_round_trip_and_uri_helpers() -> None:
    opts = SyncOptions(include=("*.pt",), exclude=("tmp/**",), dry_run=True, delete=True, max_delete=-1, checkers=3,
                       bwlimit=1e6, verify="full", part_size=8 << 20, memory=64 << 20)  # fmt: skip
    assert options_from_json(json.loads(json.dumps(asdict(opts)))) == opts  # every field has a JSON form
    for bad, where in [({"nope": 1}, "options.nope"), ({"checkers": 0}, "options.checkers"),
                       ({"verify": "most"}, "options.verify"), ({"include": "*.pt"}, "options.include"),
                       ({"dry_run": 1}, "options.dry_run"), ([], "options"),
                       ({"memory": 1}, "options.memory"), ({"part_size": 1}, "options.part_size"),
                       ({"bwlimit": 0}, "options.bwlimit"), ({"samples": 1}, "options.samples"),
                       ({"exclude": [""]}, "options.exclude")]:  # fmt: skip
        with pytest.raises(RequestRejected) as info:
            options_from_json(bad)
        assert info.value.field == where
        assert str(info.value).startswith(where)
    assert sorted(["step-200", "step-90", "step-1000", "step-300"], key=natural_key) == [
        "step-90", "step-200", "step-300", "step-1000"]  # fmt: skip
    assert join_uri("s3://b/ckpt?endpoint_url=http://h:9", "step-2") == "s3://b/ckpt/step-2/?endpoint_url=http://h:9"
    assert join_uri("file:///ckpt/", "step-2") == "file:///ckpt/step-2/"
    assert join_uri("s3://b", "step-2") == "s3://b/step-2/"


def test_queue_runs_at_most_max_jobs(tmp_path: Path) -> None:
    """The domain object alone: jobs are queued at submit; never more than max_jobs run at once."""
    state = tmp_path / "state"
    srcs = []
    for i in range(3):
        write_tree(tmp_path / f"src{i}", {f"f{j}": os.urandom(20_000) for j in range(30)})
        srcs.append(f"file://{tmp_path}/src{i}")

    async def scenario() -> tuple[list[str], int]:
        daemon = Daemon(
            DaemonConfig(listen="127.0.0.1:0", state_dir=str(state), max_jobs=1, allow=(f"file://{tmp_path}",))
        )
        await daemon.start()
        try:
            ids = [daemon.submit(src, f"file://{tmp_path}/dst{i}")["id"] for i, src in enumerate(srcs)]
            assert [job_doc(state, i)["state"] for i in ids] == ["queued"] * 3
            most = 0
            while any(job_doc(state, i)["state"] in ("queued", "running") for i in ids):
                most = max(most, sum(job_doc(state, i)["state"] == "running" for i in ids))
                await asyncio.sleep(0.005)
            return ids, most
        finally:
            await daemon.close()

    ids, most = asyncio.run(scenario())
    assert most == 1
    assert all(job_doc(state, i)["state"] == "ok" for i in ids)
    for i in range(3):
        assert tree(tmp_path / f"dst{i}") == tree(tmp_path / f"src{i}")


def test_newest_checkpoint_from_s3_in_process(tmp_path: Path, s3_uri: str, moto_endpoint: str) -> None:
    """A schedule's first tick on S3: the endpoint query survives the per-checkpoint URIs."""
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = s3_uri.split("/")[2]
    objects = {"step-8/.metadata": b"m8", "step-9/shard": b"s9", "step-9/.metadata": b"m9", "step-10/shard": b"s10"}
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=f"data/{key}", Body=body)
    assert asyncio.run(newest_checkpoint(s3_uri)) == "step-9"  # step-10 has no .metadata yet

    async def scenario() -> dict:
        cfg = DaemonConfig(state_dir=str(tmp_path / "state"), allow=("s3://", f"file://{tmp_path}"),
                           allow_endpoints=(moto_endpoint,))  # fmt: skip
        daemon = Daemon(cfg)
        await daemon.start()
        try:
            sid = daemon.add_schedule(s3_uri, f"file://{tmp_path}/out", 60, newest_checkpoint=True)["id"]
            while daemon.schedule(sid)["last_synced"] != "step-9":
                await asyncio.sleep(0.02)
            return daemon.schedule(sid)
        finally:
            await daemon.close()

    sched = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert sched["last_error"] == "" and not sched["active"]
    assert tree(tmp_path / "out") == {"step-9/shard": b"s9", "step-9/.metadata": b"m9"}


# ------------------------------------------------------------ processes --


def test_cli_submits_and_lists_jobs(tmp_path: Path, s3_uri: str, moto_endpoint: str, daemons) -> None:
    state = tmp_path / "state"
    src = tmp_path / "src"
    files = {f"shard-{i:03d}.bin": os.urandom(10_000 + i) for i in range(40)}
    write_tree(src, files)
    d = daemons(state, "--allow-endpoint", moto_endpoint)

    r = babel("sync", f"file://{src}", s3_uri, "--daemon", d.addr, "--verify", "full", env=d.env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()

    def done() -> dict | None:
        r = babel("jobs", "--daemon", d.addr, "--json", env=d.env)
        assert r.returncode == 0, r.stderr
        jobs = {j["id"]: j for j in json.loads(r.stdout)}
        return jobs[job_id] if jobs[job_id]["state"] not in ("queued", "running") else None

    job = wait_for(done, 20, "the job to finish", every=0.2)
    assert job["state"] == "ok", job
    assert job["phase"] == "done" and job["summary"]["copied"] == len(files)
    assert job["summary"]["verification"]["full"]["checked"] == len(files)
    bucket = s3_uri.split("/")[2]
    assert bucket_contents(bucket, moto_endpoint) == files

    from babel.daemon import fetch_job, fetch_jobs

    assert fetch_job(d.addr, job_id, token=d.token)["summary"]["copied"] == len(files)
    # a job the CLI runs itself on the same state directory is in the daemon's history too
    r = babel("sync", f"file://{src}", f"file://{tmp_path}/local", "--json", env={"BABEL_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    history = fetch_jobs(d.addr, token=d.token)
    assert [j["id"] for j in history][1] == job_id and history[0]["dst"] == f"file://{tmp_path}/local"
    assert "runner" not in history[0]  # not the daemon's: never resumed by it


def test_cancel_and_wait_through_the_daemon_and_locally(tmp_path: Path, daemons) -> None:
    """``babel cancel`` stops a daemon's running job (``canceled``, resumable to ok) and a local
    job (SIGTERM); ``babel wait`` blocks until a job ends and exits by its state."""
    state = tmp_path / "state"
    src = tmp_path / "src"
    write_tree(src, {"big.bin": os.urandom(8 << 20)})
    d = daemons(state)
    r = babel("sync", f"file://{src}", f"file://{tmp_path}/out", "--bwlimit", "1M", "--daemon", d.addr, env=d.env)
    job = r.stdout.strip()
    wait_for(lambda: babel("jobs", "--daemon", d.addr, "--json", env=d.env).stdout.count('"running"') or None, 20,
             "the job to run", every=0.1)  # fmt: skip
    slow = babel("wait", job, "--daemon", d.addr, "--timeout", "0.5", env=d.env)
    assert slow.returncode == 124 and "still running" in slow.stderr  # not 2: the job did not fail
    r = babel("cancel", job, "--daemon", d.addr, env=d.env)
    assert r.returncode == 0 and f"{job}: canceling" in r.stdout, r.stderr
    r = babel("wait", job, "--daemon", d.addr, "--timeout", "20", "--json", env=d.env)
    assert r.returncode == 2 and json.loads(r.stdout)["state"] == "canceled"
    again = babel("cancel", job, "--daemon", d.addr, env=d.env)
    assert again.returncode != 0 and "not queued or running" in again.stderr
    assert d.http("POST", f"/jobs/{job}/resume")[0] == 202
    # the resumed job keeps --bwlimit 1M: about 8 s for the 8 MiB
    r = babel("wait", job, "--daemon", d.addr, "--timeout", "60", env=d.env)
    assert r.returncode == 0 and f"{job}: ok" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()

    env = {**d.env, "BABEL_STATE_DIR": str(state)}
    local = subprocess.Popen([sys.executable, "-m", "babel.cli.main", "sync", f"file://{src}", f"file://{tmp_path}/o2",
                              "--bwlimit", "1M", "--no-progress"], env={**os.environ, **env},
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    mine = wait_for(lambda: next((j["id"] for j in json.loads(babel("jobs", "--json", env=env).stdout)
                                  if j.get("state") == "running" and j.get("dst", "").endswith("/o2")), None),
                    20, "the local job to run", every=0.1)  # fmt: skip
    r = babel("cancel", mine, env=env)
    assert r.returncode == 0 and f"SIGTERM sent to pid {local.pid}" in r.stdout
    assert local.wait(timeout=30) == 2 and f"resume with: babel sync --resume {mine}" in local.stderr.read()
    r = babel("wait", mine, env=env)
    assert r.returncode == 2 and f"{mine}: interrupted" in r.stdout
    # a dead job whose pid another program got: cancel must not signal that program
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        doc_path = state / mine / "job.json"
        doc_path.write_text(json.dumps({**json.loads(doc_path.read_text()), "state": "running", "pid": stranger.pid}))
        r = babel("cancel", mine, env=env)
        assert r.returncode != 0 and "another program" in r.stderr and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_bad_requests_get_400_naming_the_field(tmp_path: Path, daemons) -> None:
    d = daemons(tmp_path / "state")
    ok = {"src": f"file://{tmp_path}/a", "dst": f"file://{tmp_path}/b"}
    cases = [
        ("/jobs", {**ok, "src": "nope://x/y"}, "src"),
        ("/jobs", {**ok, "dst": "s3:///no-bucket"}, "dst"),
        ("/jobs", {"src": ok["src"]}, "dst"),
        ("/jobs", {**ok, "options": {"transfer": 4}}, "options.transfer"),
        ("/jobs", {**ok, "options": {"bwlimit": "fast"}}, "options.bwlimit"),
        ("/jobs", {**ok, "options": {"part_size": "6G"}}, "options.part_size"),  # above S3's 5 GiB part
        ("/jobs", {**ok, "dst": "s3://b/p?endpoint_url=notaurl"}, "dst"),
        ("/jobs", {**ok, "extra": 1}, "extra"),
        ("/jobs", [1, 2], "body"),
        ("/schedules", {**ok, "every": 0}, "every"),
        ("/schedules", {**ok, "every": "often"}, "every"),
        ("/schedules", ok, "every"),
        ("/schedules", {**ok, "every": 5, "newest_checkpoint": "yes"}, "newest_checkpoint"),
    ]
    for path, body, where in cases:
        status, doc = d.http("POST", path, body)
        assert (status, doc["field"]) == (400, where), (body, doc)
    status, doc = d.http("POST", "/jobs", {**ok, "src": "nope://x/y"})
    assert "BadURI" in doc["error"] and "nope" in doc["error"]
    assert d.http("POST", "/jobs", raw=b"{not json")[0] == 400
    huge = b'{"src": "%s", "dst": "%s", "options": {"memory": 1%s}}' % (
        ok["src"].encode(),
        ok["dst"].encode(),
        b"0" * 5000,
    )
    assert d.http("POST", "/jobs", raw=huge)[0] == 400  # past Python's int-parsing limit: not a 500
    assert d.http("GET", "/jobs/20990101-000000-abcdef")[0] == 404
    assert d.http("GET", "/jobs/..")[0] == 404
    assert d.http("POST", "/jobs/nope/resume")[0] == 404
    assert d.http("DELETE", "/schedules/nope")[0] == 404
    assert list_jobs(str(tmp_path / "state")) == []  # nothing was created by a rejected request

    r = babel("sync", "nope://x", f"file://{tmp_path}/b", "--daemon", d.addr, env=d.env)
    assert r.returncode == 3 and "BadURI" in r.stderr and "Traceback" not in r.stderr
    port = free_port()
    r = babel("daemon", "--listen", "127.0.0.1:99999", "--state-dir", str(tmp_path / "s2"))
    assert r.returncode == 3 and "--listen" in r.stderr and "Traceback" not in r.stderr
    r = babel("jobs", "--daemon", f"127.0.0.1:{port}")
    assert r.returncode == 2 and f"babel daemon at 127.0.0.1:{port} is not reachable" in r.stderr
    from babel.daemon import fetch_jobs

    with pytest.raises(TransientError):
        fetch_jobs(f"127.0.0.1:{port}", timeout=2)


def test_newest_checkpoint_schedule_survives_restart(tmp_path: Path, daemons) -> None:
    ckpt, mirror, state = tmp_path / "ckpt", tmp_path / "mirror", tmp_path / "state"
    step = {n: {"__0_0.distcp": os.urandom(30_000), "__1_0.distcp": os.urandom(30_000), ".metadata": b"meta%d" % n}
            for n in (90, 100, 200, 300)}  # fmt: skip
    for n in (90, 100, 200):
        write_tree(ckpt / f"step-{n}", step[n])
    write_tree(ckpt / "step-300", {k: v for k, v in step[300].items() if k != ".metadata"})  # being written
    (ckpt / "latest.txt").write_text("200")
    assert asyncio.run(newest_checkpoint(f"file://{ckpt}")) == "step-200"  # by number: step-90 < step-200

    d = daemons(state)
    status, sched = d.http("POST", "/schedules",
                         {"src": f"file://{ckpt}", "dst": f"file://{mirror}", "every": 0.3, "newest_checkpoint": True})  # fmt: skip
    assert status == 201 and sched["every"] == 0.3
    sid = sched["id"]

    def synced(name: str):
        def check():
            doc = d.http("GET", f"/schedules/{sid}")[1]
            return doc if doc["last_synced"] == name else None

        return check

    wait_for(synced("step-200"), 20, "step-200 to be synced", every=0.05)
    assert tree(mirror) == {f"step-200/{k}": v for k, v in step[200].items()}
    time.sleep(1.0)  # a few periods: nothing new, nothing submitted

    def ckpt_jobs(name: str) -> list[dict]:
        return [j for j in d.http("GET", "/jobs")[1] if j.get("checkpoint") == name]

    data, commit = sorted(ckpt_jobs("step-200"), key=lambda j: j["created"])
    assert (data["stage"], commit["stage"]) == ("data", "commit")
    assert data["summary"]["copied"] == 2 and commit["summary"]["copied"] == 1  # shards first, .metadata last
    assert data["dst"] == f"file://{mirror}/step-200/" and data["state"] == commit["state"] == "ok"

    (ckpt / "step-300" / ".metadata").write_bytes(step[300][".metadata"])  # the writer commits step-300
    wait_for(synced("step-300"), 10, "step-300 to be synced", every=0.05)
    assert tree(mirror) == {**{f"step-200/{k}": v for k, v in step[200].items()},
                            **{f"step-300/{k}": v for k, v in step[300].items()}}  # fmt: skip
    history = [j.get("checkpoint") for j in d.http("GET", "/jobs")[1]]
    assert history == ["step-300"] * 2 + ["step-200"] * 2  # newest first

    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - t0 < 5
    d2 = daemons(state)
    status, schedules = d2.http("GET", "/schedules")
    assert status == 200 and [s["id"] for s in schedules] == [sid]
    assert schedules[0]["last_synced"] == "step-300" and schedules[0]["newest_checkpoint"] is True
    time.sleep(1.0)
    assert len(d2.http("GET", "/jobs")[1]) == 4  # step-300 was synced already: not again
    assert d2.http("DELETE", f"/schedules/{sid}") == (200, {"id": sid, "deleted": True})
    assert d2.http("GET", "/schedules") == (200, [])
    assert json.loads((state / "schedules.json").read_text()) == {"schedules": []}


def test_sigterm_and_sigkill_mid_job_then_resumed_to_ok(
    tmp_path: Path, s3_uri: str, moto_endpoint: str, daemons
) -> None:
    state, src = tmp_path / "state", tmp_path / "src"
    files = {"big.bin": os.urandom(24 << 20), **{f"small/{i}": os.urandom(5000) for i in range(10)}}
    write_tree(src, files)
    d = daemons(state, "--allow-endpoint", moto_endpoint)
    r = babel("sync", f"file://{src}", s3_uri, "--daemon", d.addr, "--bwlimit", "12M", "--part-size", "5M",
              "--transfers", "2", env=d.env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()

    def copying_in(proc: subprocess.Popen) -> bool:
        doc = job_doc(state, job_id)
        return doc.get("phase") == "copying" and doc["state"] == "running" and doc.get("pid") == proc.pid

    wait_for(lambda: copying_in(d.proc), 20, "the job to copy", every=0.05)
    time.sleep(0.5)
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0  # cancelled at a safe point, quickly
    assert time.monotonic() - t0 < 5
    assert job_doc(state, job_id)["state"] == "running"  # not finished: left for the next daemon

    d2 = daemons(state, "--allow-endpoint", moto_endpoint)
    wait_for(lambda: copying_in(d2.proc), 20, "the job to be resumed", every=0.05)
    time.sleep(0.5)
    d2.stop(signal.SIGKILL)
    assert job_doc(state, job_id)["state"] == "running"

    d3 = daemons(state, "--allow-endpoint", moto_endpoint)
    job = wait_for(
        lambda: (j := d3.http("GET", f"/jobs/{job_id}")[1])["state"] == "ok" and j, 20, "the job", every=0.05
    )
    assert job["summary"]["already_done"] > 0  # the killed runs' copies were kept
    assert bucket_contents(s3_uri.split("/")[2], moto_endpoint) == files
    assert d3.http("GET", "/healthz")[1]["running"] == 0


def test_an_attacker_gets_nothing_from_the_daemon(tmp_path: Path, daemons) -> None:
    """From the attacker's side: no token, a wrong or truncated token, a form post (CSRF), a
    foreign Host header (DNS rebinding), jobs naming /etc, /root, a '..' escape or a symlink out
    of the allowed directory: each refused, and no job is created."""
    state = tmp_path / "state"
    d = daemons(state, "--allowed-host", "babel.svc")
    token_file = state / "daemon.token"
    assert token_file.stat().st_mode & 0o777 == 0o600 and len(d.token) >= 40
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "escape").symlink_to("/etc")
    ok = {"src": f"file://{tmp_path}/data", "dst": f"file://{tmp_path}/out"}
    for token in (None, "", "wrong", d.token[:-1], d.token + "x", d.token.upper()):
        for method, path, body in (("GET", "/jobs", None), ("POST", "/jobs", ok), ("GET", "/schedules", None),
                                   ("POST", "/schedules", {**ok, "every": 5}), ("DELETE", "/schedules/x", None),
                                   ("POST", "/jobs/x/resume", None), ("GET", "/jobs/x", None)):  # fmt: skip
            status, doc = http(d.addr, method, path, body, token=token)
            assert (status, doc["type"]) == (401, "Unauthorized"), (token, method, path, doc)
    assert http(d.addr, "GET", "/healthz") == (200, {"ok": True})  # a liveness probe learns nothing more
    assert "pid" in d.http("GET", "/healthz")[1]
    form = http(d.addr, "POST", "/jobs", raw=b"src=file:///etc&dst=file:///tmp/x", token=d.token,
                headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert form[0] == 415
    plain = http(
        d.addr, "POST", "/jobs", raw=json.dumps(ok).encode(), token=d.token, headers={"Content-Type": "text/plain"}
    )
    assert plain[0] == 415
    port = d.addr.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1", f"babel.svc.evil:{port}", ""):
        status, doc = http(d.addr, "GET", "/jobs", token=d.token, headers={"Host": host})
        assert status == 403 and doc["field"] == "Host", host
    for host in (f"localhost:{port}", f"babel.svc:{port}", f"[::1]:{port}", f"10.1.2.3:{port}"):
        assert http(d.addr, "GET", "/jobs", token=d.token, headers={"Host": host})[0] == 200, host
    forbidden = [
        ("src", "file:///etc"), ("src", "file:///etc/shadow"), ("dst", "file:///root/x"),
        ("src", f"file://{tmp_path}/data/../../etc"), ("src", f"file://{tmp_path}/data/escape"),
        ("dst", f"file://{tmp_path}database"), ("src", "file://" + str(tmp_path).rstrip("/") + "x/y"),
    ]  # fmt: skip
    for field, uri in forbidden:
        status, doc = d.http("POST", "/jobs", {**ok, field: uri})
        assert status in (400, 403) and doc["field"] == field, (uri, doc)
        status, doc = d.http("POST", "/schedules", {**ok, field: uri, "every": 5})
        assert status in (400, 403) and doc["field"] == field, (uri, doc)
    for field, uri in [
        ("src", "s3://b/x?endpoint_url=http://169.254.169.254/latest/meta-data/"),
        ("dst", "s3://b/y?endpoint_url=http://attacker.example/"),
        ("src", "s3://b/x?ca_bundle=/etc/shadow"),
    ]:
        status, doc = d.http("POST", "/jobs", {**ok, field: uri})
        assert (status, doc["field"]) == (403, field), (uri, doc)
    assert d.http("GET", "/jobs?limit=%C2%B2")[0] == 400  # a digit to str.isdigit, not to int()
    assert d.http("POST", "/jobs", raw=b"[" * 100_000 + b"]" * 100_000)[0] in (400, 413)  # nesting, not a 500
    assert d.http("POST", "/schedules", {**ok, "every": 0.000001})[0] == 400  # a flood of jobs
    assert http(d.addr, "GET", "/jobs", headers={"Authorization": "Bearer \u00e9\u00ff"})[0] == 401
    for host in (f"evil.com:{port}@127.0.0.1:{port}", f"127.0.0.1:{port}/evil.com", f"127.0.0.1:0{port}"):
        assert http(d.addr, "GET", "/jobs", token=d.token, headers={"Host": host})[0] == 403, host
    assert list_jobs(str(state)) == [] and d.http("GET", "/schedules") == (200, [])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"SECRET")
    (tmp_path / "data" / "link-to-secret").symlink_to(outside / "secret")  # a file link in the source
    (tmp_path / "data" / "sub").mkdir()
    (tmp_path / "data" / "sub" / "pwn").write_bytes(b"pwned")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").symlink_to(outside)  # a directory link in the destination
    status, doc = d.http("POST", "/jobs", ok)  # the allowed directory itself works
    assert status == 202
    job = wait_for(lambda: (j := d.http("GET", f"/jobs/{doc['id']}")[1])["state"] not in ("queued", "running") and j,
                   30, "the job", every=0.1)  # fmt: skip
    assert not (tmp_path / "out" / "link-to-secret").exists()  # the link was not followed out of the source
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]  # nothing written through the link
    assert job["state"] in ("partial", "failed") and job["summary"]["failed"] >= 1, job
    # the CLI finds the token in the daemon's state directory; with another one it is refused
    r = babel("jobs", "--daemon", d.addr, "--state-dir", str(state), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["id"] == job["id"], r.stderr
    r = babel("jobs", "--daemon", d.addr, "--state-dir", str(tmp_path / "other"))
    assert r.returncode != 0 and "bearer token" in r.stderr and "Traceback" not in r.stderr
    assert d.token not in d.log.read_text()  # the token is never logged
