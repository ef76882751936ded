"""The main job, end to end on one machine: dataset in, training on PCache, checkpoint out across regions.

Every part is a real process on loopback, started here and stopped at the end:

1. two S3 "regions": moto's server (region A) and ``rclone serve s3`` (region B), and a PCache
   cluster from ``deploy/local/pcache.toml`` (``pcache up --masters 2``: a leader and a follower
   master on an etcd, 3 workers, FUSE mount; one master alone when ``etcd`` is not installed);
2. token shards built from the Python standard library's sources (``python -m trainer_ref.data
   build``) and uploaded to region A with ``babel sync``;
3. region A's dataset bound into PCache (``pcache bind``, no copy): listed lazily, warmed with
   ``pcache load`` (every block fetched by the workers at once), its shards read
   through the FUSE mount from the cache and their SHA-256s checked; a byte flipped in one replica of a shard on a worker's disk is caught by a same-host
   reader, never served, and repaired;
4. the reference Ling MoE trainer, 2 data-parallel ranks under ``trainer_ref.launch``, reading the
   shards through the mount and saving asynchronous checkpoints through ``ckpt_adapter``;
5. the leader master killed with SIGKILL at 35% of the steps (the follower takes over; the stall
   it caused is reported), then rank 1 killed with SIGKILL: the supervisor restarts both ranks
   from the newest complete checkpoint and the run finishes; then etcd's data is lost (SIGKILL,
   data directory deleted): the masters stop leading until ``pcache ha recover`` restores a
   leader with higher epochs, and every checkpoint is still there;
6. the newest committed checkpoint synced PCache -> region B (data first, ``.metadata`` last);
7. that checkpoint synced back from region B to local disk, loaded with the stock
   ``torch.distributed.checkpoint`` reader and compared tensor by tensor with the trainer's final
   in-memory state (``final-model.pt``, written by rank 0 after the last step);
8. a summary (loss first/last, throughput, recovery time, verification, where each piece of data
   lives), ``summary.json`` and the loss curve as ``loss.png`` in ``--out``.

Scratch data lives in a temporary directory that is removed at the end (``--keep`` keeps it);
nothing is left running or mounted, also on Ctrl-C or SIGTERM. Exit status 0 when every check
held, 1 when one failed, 2 when a stage could not run.

Usage: python scripts/demo.py [--quick] [--out DIR] [--keep] [--steps N] [--kill-at N]
       [--corpus-bytes N]   (``./scripts/demo`` installs what is needed first)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pcache.common.process import die_with_parent, reap_children, stop_process

ROOT = Path(__file__).resolve().parent.parent
PCACHE_TOML = ROOT / "deploy" / "local" / "pcache.toml"
TRAINER_TOML = ROOT / "deploy" / "local" / "trainer.toml"
ACCESS, SECRET, REGION = "demo-access-key", "demo-secret-key", "us-east-1"
DATASET, RUN = "stdlib-tokens", "ling-demo"
SAMPLES = 8  # 1 MiB ranges re-read per checkpoint object (head, tail, strided); smaller objects are read whole


class StageError(RuntimeError):
    """A stage could not run (a process failed or timed out); the message says which and why."""


def log(msg: str) -> None:
    print(msg, flush=True)


def tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"


@dataclass
class Demo:
    """One run of the main job; ``result`` becomes ``summary.json``."""

    work: Path
    out: Path
    steps: int
    kill_at: int
    corpus_bytes: int
    vocab_size: int
    result: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": ACCESS,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "BABEL_STATE_DIR": str(self.work / "babel-state"),
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "PCACHE_MASTER"):
            self.env.pop(name, None)
        self.servers: list = []
        self.up: subprocess.Popen | None = None
        self.trainer: subprocess.Popen | None = None
        self.mnt = self.work / "mnt"
        self.cluster_dir = self.work / "pcache"
        self.run_dir = self.work / "run"
        self.master = ""
        self.masters = 2 if shutil.which("etcd") else 1  # a leader + follower pair needs etcd
        self.checks: dict[str, bool] = {}

    # ------------------------------------------------------------------ helpers --

    def run_cmd(self, what: str, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run a child to completion; StageError (with its output) when it fails or times out."""
        try:
            proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StageError(f"{what}: no result within {timeout:.0f} s") from None
        if proc.returncode != 0:
            raise StageError(f"{what} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return proc

    def babel_sync(self, what: str, src: str, dst: str, *extra: str) -> dict:
        """``babel sync SRC DST --json``: the job report (``babel/sync.py``)."""
        cmd = [sys.executable, "-m", "babel.cli.main", "sync", src, dst, "--json", "--no-progress", *extra]
        report = json.loads(self.run_cmd(f"babel sync ({what})", cmd, timeout=600).stdout)
        ver = report["verification"]
        ok = report["state"] == "ok" and not report["failed"] and not ver["failures"]
        self.checks[f"babel sync {what}"] = ok
        mb = report["copied_bytes"] / 1e6
        log(
            f"      {what}: {report['copied']} objects, {mb:.1f} MB in {report['seconds']:.1f} s "
            f"({mb / max(report['seconds'], 1e-9):.1f} MB/s); verified: runtime CRC32C "
            f"{ver['runtime']['crc32c_in_stream']}, metadata {ver['metadata']['checked']} "
            f"({ver['metadata']['failed']} failed), sample {ver['sample']['checked']} + whole "
            f"{ver['full']['checked']} ({ver['sample']['failed'] + ver['full']['failed']} failed)"
            + ("" if ok else f"  <-- FAILED: {report['fatal'] or ver['failures'] or report['errors']}")
        )
        return report

    def region_a(self, path: str) -> str:
        return f"s3://{path}?endpoint_url={self.servers[0].endpoint}&region={REGION}"

    def region_b(self, path: str) -> str:
        return f"s3://{path}?endpoint_url={self.servers[1].endpoint}&region={REGION}&provider=rclone"

    def pcache(self, path: str) -> str:
        return f"pcache://{self.master}/{path}"

    # ------------------------------------------------------------------- stages --

    def start_services(self) -> None:
        """Stage 1: region A (moto), region B (rclone serve s3), PCache (pcache up --mount)."""
        import boto3

        from babel.testing.servers import ServerError, start_moto, start_rclone_serve

        os.environ.update({k: self.env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        t0 = time.monotonic()
        try:
            (self.work / "region-a").mkdir()
            (self.work / "region-b").mkdir()
            self.servers.append(start_moto(self.work / "region-a"))
            self.servers.append(
                start_rclone_serve(
                    self.work / "region-b" / "root", self.work / "region-b", access_key=ACCESS, secret_key=SECRET
                )
            )
        except ServerError as exc:
            raise StageError(str(exc)) from None
        for server, bucket in zip(self.servers, ("datasets", "checkpoints"), strict=True):
            boto3.client(
                "s3", endpoint_url=server.endpoint, region_name=REGION,
                aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
            ).create_bucket(Bucket=bucket)  # fmt: skip
        log_path = self.work / "pcache-up.log"
        with open(log_path, "wb") as fh:
            self.up = subprocess.Popen(
                [*die_with_parent(signal.SIGTERM),  # a demo killed with -9 still stops its cluster
                 sys.executable, "-m", "pcache", "up", "--config", str(PCACHE_TOML), "--data-dir",
                 str(self.cluster_dir), "--port", "0", "--masters", str(self.masters), "--mount", str(self.mnt)],
                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
            )  # fmt: skip
        manifest = self.cluster_dir / "cluster.json"
        deadline = time.monotonic() + 90
        while True:
            if self.up.poll() is not None:
                raise StageError(f"pcache up exited with {self.up.returncode}:\n{tail(log_path)}")
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                doc = json.loads(manifest.read_text())
                if doc.get("mount"):
                    break
            if time.monotonic() > deadline:
                raise StageError(f"pcache up did not come up within 90 s:\n{tail(log_path)}")
            time.sleep(0.1)
        self.master = doc["master"]
        if self.masters == 1:
            log("      etcd is not installed (Debian package etcd-server): one master alone, no leader kill")
        took = time.monotonic() - t0
        log(f"      region A  moto            {self.servers[0].endpoint}  (bucket datasets)")
        log(
            f"      region B  rclone serve s3 {self.servers[1].endpoint}  (bucket checkpoints, on {self.work}/region-b)"
        )
        which = "masters (leader + follower, etcd " + doc["etcd"] + ")" if doc.get("etcd") else "master"
        log(f"      PCache    {which} {self.master}, {len(doc['workers'])} workers, mounted at {self.mnt}")
        self.result["services"] = {
            "region_a": self.servers[0].endpoint, "region_b": self.servers[1].endpoint, "master": self.master,
            "workers": len(doc["workers"]), "mount": str(self.mnt), "start_seconds": took,
            "masters": self.masters,
        }  # fmt: skip

    def dataset_to_region_a(self) -> None:
        """Stage 2: token shards from the stdlib sources, uploaded to region A."""
        shards = self.work / "shards"
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "trainer_ref.data", "build", "--out", str(shards),
               "--vocab-size", str(self.vocab_size)]  # fmt: skip
        if self.corpus_bytes:
            cmd += ["--max-bytes", str(self.corpus_bytes)]
        self.run_cmd("trainer_ref.data build", cmd, timeout=600)
        index = json.loads((shards / "index.json").read_text())
        built = time.monotonic() - t0
        files = [s for split in index["splits"].values() for s in split["shards"]]
        tokens = sum(s["tokens"] for s in index["splits"]["train"]["shards"])
        log(f"      built {len(files)} shards, {tokens:,} training tokens from {index['corpus']['documents']:,} files "
            f"({index['corpus']['bytes'] / 1e6:.1f} MB), vocab {index['build']['vocab_size']:,}, in {built:.1f} s")  # fmt: skip
        report = self.babel_sync("local -> region A", f"file://{shards}", self.region_a(f"datasets/{DATASET}"))
        self.result["dataset"] = {"shards": len(files), "train_tokens": tokens,
                                  "build_seconds": built, "upload": report}  # fmt: skip

    def dataset_to_pcache(self) -> None:
        """Stage 3: region A's dataset bound into PCache (no copy): the master lists it lazily,
        ``pcache load`` has the workers fetch every block from region A, then the shards are read
        through the FUSE mount (from the cache) and their SHA-256s checked."""
        import boto3

        from pcache.client import Client
        from pcache.common.config import ClientConfig

        uri = self.region_a(f"datasets/{DATASET}")
        admin = (self.cluster_dir / "secrets" / "admin.token").read_text().strip()
        with Client(master=self.master) as pc:  # the default tenant: its root is /default
            pc.mkdir("/datasets", parents=True)
        with Client(ClientConfig(master=self.master, token=admin)) as pc:
            pc.bind(f"/default/datasets/{DATASET}", uri, meta_ttl=-1)  # a dataset never changes: listed once
        s3 = boto3.client("s3", endpoint_url=self.servers[0].endpoint, region_name=REGION)
        objects = {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in
                   s3.list_objects_v2(Bucket="datasets", Prefix=f"{DATASET}/")["Contents"]}  # fmt: skip
        root = self.mnt / "datasets" / DATASET
        listed = {p.name: p.stat().st_size for p in root.iterdir()}
        self.checks["region A's dataset bound: the mount lists every object"] = listed == objects
        # warm-up: every block fetched from region A by the workers, spread over all of them
        load = json.loads(self.run_cmd("pcache load (warm the cache from region A)",
                                       ["pcache", "--master", self.master, "load", "--json", f"/datasets/{DATASET}"],
                                       timeout=300).stdout)  # fmt: skip
        nbytes = sum(listed.values())
        self.checks["pcache load fetched the whole dataset"] = (
            load["failed"] == 0 and load["fetched_bytes"] + load["cached_bytes"] == load["bytes"] == nbytes
        )
        t0 = time.monotonic()
        self.run_cmd("trainer_ref.data verify (read through the mount, from the cache)",
                     [sys.executable, "-m", "trainer_ref.data", "verify", str(root)], timeout=300)  # fmt: skip
        took = time.monotonic() - t0
        self.checks["shards sha256 through the FUSE mount"] = True
        log(f"      bound {uri.split('?')[0]} at /datasets/{DATASET} (no copy): the mount lists its "
            f"{len(listed)} objects; `pcache load` fetched {load['fetched_blocks']} blocks "
            f"({load['fetched_bytes'] / 1e6:.1f} MB) from region A in {load['seconds']:.1f} s; every shard's "
            f"SHA-256 in index.json matches, read through {self.mnt} from the cache in {took:.1f} s")  # fmt: skip
        self.result["dataset"]["bind"] = {"uri": uri.split("?")[0], "objects": len(listed), "bytes": nbytes,
                                          "load": load, "read_seconds": took,
                                          "listed_equal": listed == objects}  # fmt: skip
        self.other_views(root, listed)
        self.integrity_drill()
        self.security_drill()

    def other_views(self, root: Path, listed: dict[str, int]) -> None:
        """The same dataset through ``ls -l`` on the mount (READDIRPLUS: every entry's attributes
        come with the listing) and through fsspec's ``pcache://`` (what pandas, Hugging Face
        ``datasets`` and Lightning open)."""
        import fsspec

        t0 = time.monotonic()
        out = self.run_cmd("ls -l through the mount", ["ls", "-l", str(root)], timeout=60).stdout
        ls_seconds = time.monotonic() - t0
        sizes = {line.split()[-1]: int(line.split()[4]) for line in out.splitlines()[1:]}
        self.checks["ls -l through the mount shows every object's size"] = sizes == listed
        url = f"pcache://{self.master}/datasets/{DATASET}/index.json"
        with fsspec.open(url, "rb") as f:
            via_fsspec = f.read()
        fs = fsspec.filesystem("pcache", master=self.master)
        found = {Path(p).name: fs.size(p) for p in fs.glob(f"/datasets/{DATASET}/*")}
        self.checks["fsspec pcache:// reads what the mount reads"] = (
            via_fsspec == (root / "index.json").read_bytes() and found == listed
        )
        log(f"      ls -l listed {len(sizes)} entries with their sizes in {ls_seconds:.2f} s (READDIRPLUS); "
            f"fsspec.open({url.split('/datasets')[0]}/...) read index.json ({len(via_fsspec)} bytes) and "
            f"globbed {len(found)} objects, as the mount shows them")  # fmt: skip
        self.result["dataset"]["views"] = {"ls_l_seconds": ls_seconds, "ls_l_entries": len(sizes),
                                           "fsspec_objects": len(found)}  # fmt: skip

    def security_drill(self) -> None:
        """A process that knows the master's address but not this cluster's token (none, or a
        forged one) is refused on every call; the default tenant's token, found by itself, works."""
        refused = {}
        for why, env in {
            "no token": {"PCACHE_TOKENS_FILE": str(self.work / "no-tokens.json")},
            "a forged token": {"PCACHE_TOKEN": "v1.k0.default.admin.0.Zm9yZ2Vk"},
        }.items():
            proc = subprocess.run(["pcache", "--master", self.master, "ls", f"/datasets/{DATASET}"],
                                  capture_output=True, text=True, timeout=60, env={**self.env, **env})  # fmt: skip
            refused[why] = proc.returncode == 2 and "token" in proc.stderr and not proc.stdout
        own = self.run_cmd("pcache ls (the default tenant's token)", ["pcache", "--master", self.master, "ls", "/"],
                           timeout=60)  # fmt: skip
        self.checks["a caller without the cluster's token is refused"] = (
            all(refused.values()) and "datasets" in own.stdout
        )
        log(f"      without a token / with a forged one, `pcache ls` was "
            f"{' / '.join('refused' if ok else 'NOT refused' for ok in refused.values())}; with the token "
            f"`pcache up` recorded for this address it lists /")  # fmt: skip
        self.result["security"] = refused
        self.tenant_drill()

    def tenant_drill(self) -> None:
        """A second tenant with a 4 MiB quota (made with the admin token ``pcache up`` wrote):
        it sees its own empty root, not the datasets; its writer stops at the quota with EDQUOT,
        and what it wrote before stays; a worker refuses a block read without a block token."""
        import asyncio
        import errno

        from pcache.client import Client
        from pcache.common import framing
        from pcache.common.config import ClientConfig
        from pcache.proto import pcache_pb2 as pb

        admin = (self.cluster_dir / "secrets" / "admin.token").read_text().strip()
        with Client(ClientConfig(master=self.master, token=admin)) as pc:
            pc.create_tenant("team-b", quota_bytes=4 << 20)
            token = pc.issue_token("team-b", ttl=3600)
            shard = pc.layout(f"/default/datasets/{DATASET}/index.json").blocks[0]
        stopped, kept = 0, []
        with Client(ClientConfig(master=self.master, token=token)) as pc:
            sees = [e.name for e in pc.listdir("/")]
            for n in range(8):
                try:
                    pc.write_file(f"/part-{n}", b"b" * (1 << 20), block_size=1 << 20)
                    kept.append(n)
                except OSError as exc:
                    stopped = exc.errno
                    break
            intact = all(pc.read_file(f"/part-{n}") == b"b" * (1 << 20) for n in kept)
            used = pc.status().tenants[0].used_bytes

        async def raw_read() -> str:
            addr = shard.replicas[0]
            reader, writer = await framing.open_connection(addr.host, addr.port, 5)
            try:
                request = pb.DataHeader(op=pb.READ_BLOCK, block_id=shard.block_id, offset=0, length=16)
                await framing.write_frame(writer, request, timeout=5)
                reply, _ = await framing.read_header(reader, 5)
                return reply.error
            finally:
                framing.close_writer(writer)

        tokenless = asyncio.run(raw_read())
        # team-b's token leaked: its tokens are revoked (no key rotation, no other tenant touched)
        with Client(ClientConfig(master=self.master, token=admin)) as pc:
            pc.revoke_tokens("team-b")
            reissued = pc.issue_token("team-b")
        revoked = ""
        with Client(ClientConfig(master=self.master, token=token)) as pc:
            try:
                pc.stat("/part-0")
            except PermissionError as exc:
                revoked = str(exc)
        with Client(ClientConfig(master=self.master, token=reissued)) as pc:
            reissued_ok = pc.read_file("/part-0") == b"b" * (1 << 20)
        self.checks["tenants are isolated, quotas enforced, blocks need tokens, leaked tokens revoked"] = (
            sees == [] and stopped == errno.EDQUOT and len(kept) == 4 and intact and used == 4 << 20
            and tokenless == "PermissionDenied" and "token revoked" in revoked and reissued_ok
        )  # fmt: skip
        log(f"      tenant team-b (quota 4 MiB) sees {sees or 'an empty root'} at /, wrote {len(kept)} MiB and got "
            f"{errno.errorcode.get(stopped, stopped)} at the quota, its files intact; a block read without a block "
            f"token: {tokenless or 'SERVED'}; after `pcache tenant revoke-tokens team-b` its old token is "
            f"{'refused' if revoked else 'STILL ACCEPTED'}, a new one {'works' if reissued_ok else 'FAILS'}")  # fmt: skip
        self.result["tenants"] = {"kept_mib": len(kept), "stopped_errno": stopped, "tokenless_read": tokenless,
                                  "revoked_token_refused": bool(revoked)}  # fmt: skip

    def integrity_drill(self) -> None:
        """A byte flipped in one replica of a shard on a worker's disk: a same-host reader (the SDK,
        short circuit) reads that replica first, catches the bad CRC and still gets the right bytes
        from the good replica; the master quarantines the bad copy, repairs the block from the good
        one and only then deletes the bad copy; ``pcache fsck`` ends clean."""
        from pcache.client import Client
        from pcache.common.errors import PCacheError
        from pcache.testing.faults import flip_byte, replica_file

        index = json.loads((self.mnt / "datasets" / DATASET / "index.json").read_text())
        shard = index["splits"]["train"]["shards"][0]
        path = f"/datasets/{DATASET}/{shard['name']}"
        t0 = time.monotonic()
        with Client(master=self.master) as pc:
            deadline = time.monotonic() + 60  # a fetched block is copied to its second worker in the background
            while len((layout := pc.layout(path)).blocks[0].replicas) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            block = layout.blocks[0]
            bad = replica_file(block.replicas[0], block.block_id)  # the replica a local reader tries first
            good = bad.read_bytes()[: block.length]
            flip_byte(bad, 100)
            try:
                served_right = hashlib.sha256(pc.read_file(path)).hexdigest() == shard["sha256"]
            except PCacheError as exc:
                log(f"      reading {path} after the flip failed: {exc}")
                served_right = False
        deadline = time.monotonic() + 60
        while True:
            st = self.cluster_status()
            fsck = self.run_cmd("pcache fsck", ["pcache", "--master", self.master, "fsck", "/"], timeout=60)
            bad_gone = not bad.exists() or bad.read_bytes()[: block.length] == good
            repaired = bad_gone and not st["under_replicated"] and not st["corrupt"] and fsck.returncode == 0
            if repaired or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.checks["a flipped byte on disk was caught, never served, and repaired"] = served_right and repaired
        log(f"      flipped a byte in one replica of {shard['name']}: the reader got "
            f"{'the right bytes' if served_right else 'WRONG bytes'}; the bad copy was "
            f"{'quarantined, the block repaired and the copy deleted' if repaired else 'NOT repaired'} in "
            f"{time.monotonic() - t0:.1f} s ({fsck.stdout.strip().splitlines()[-1] if fsck.stdout.strip() else 'no fsck output'})")  # fmt: skip
        self.result["integrity"] = {"shard": shard["name"], "served_right": served_right, "repaired": repaired,
                                    "seconds": time.monotonic() - t0}  # fmt: skip

    def train_with_a_kill(self) -> None:
        """Stages 4-5: 2 ranks under the supervisor; rank 1 gets SIGKILL once it reports ``kill_at``."""
        self.run_dir.mkdir()
        ckpt_uri = self.pcache(f"checkpoints/{RUN}")
        cmd = [sys.executable, "-m", "trainer_ref.launch", "--nproc", "2", "--max-restarts", "2",
               "--run-dir", str(self.run_dir), "--grace", "5", "--",
               "--config", str(TRAINER_TOML), f"--data.root={self.mnt / 'datasets' / DATASET}",
               f"--ckpt.uri={ckpt_uri}", f"--train.steps={self.steps}", f"--train.run_dir={self.run_dir}"]  # fmt: skip
        log_path = self.work / "trainer.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as fh:
            self.trainer = subprocess.Popen([*die_with_parent(signal.SIGTERM), *cmd], stdin=subprocess.DEVNULL,
                                            stdout=fh, stderr=subprocess.STDOUT,
                                            env={**self.env, "TRAINER_THREADS": "1"}, start_new_session=True)  # fmt: skip
        beat = self.run_dir / "heartbeat-rank1.json"
        killed: dict = {}
        leader_killed: dict = {}
        leader_kill_at = max(1, int(self.steps * 0.35)) if self.masters > 1 else None
        deadline = time.monotonic() + 900
        while self.trainer.poll() is None:
            if time.monotonic() > deadline:
                raise StageError(f"training did not finish within 900 s:\n{tail(log_path)}")
            if leader_kill_at is not None and not leader_killed:
                with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                    doc = json.loads(beat.read_text())
                    if doc.get("step", -1) >= leader_kill_at and doc.get("state") == "training":
                        leader_killed = self.kill_leader(doc["step"])
            elif not killed:
                with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                    doc = json.loads(beat.read_text())
                    # the story is a recovery from a checkpoint: the async persist of the last one may
                    # still be running (the leader's failover stalls it), so the kill waits for it
                    if (
                        doc.get("step", -1) >= self.kill_at
                        and doc.get("state") == "training"
                        and self.complete_checkpoint_before(doc["step"])
                    ):
                        os.kill(doc["pid"], signal.SIGKILL)
                        killed = {"step": doc["step"], "pid": doc["pid"], "time": time.time()}
                        log(
                            f"[5/8] SIGKILL to rank 1 (pid {doc['pid']}) at step {doc['step']}; the supervisor recovers"
                        )
            time.sleep(0.02)
        took = time.monotonic() - t0
        if self.trainer.returncode != 0:
            raise StageError(f"the trainer's supervisor exited with {self.trainer.returncode}:\n{tail(log_path)}")
        events = [json.loads(line) for line in (self.run_dir / "events.jsonl").read_text().splitlines()]
        summary = json.loads((self.run_dir / "summary.json").read_text())
        rows = [json.loads(line) for line in (self.run_dir / "metrics-rank0.jsonl").read_text().splitlines()]
        recovered = [e for e in events if e["event"] == "recovered"]
        failures = [e for e in events if e["event"] == "failure"]
        starts = [e for e in events if e["event"] == "start"]
        attempts = _attempts(rows)
        resumed_from = attempts[1][0]["step"] - 1 if len(attempts) > 1 else None
        self.checks["rank killed mid-run"] = bool(killed)
        stall = _stall_after(rows, leader_killed["time"], until=killed.get("time")) if leader_killed else None
        if self.masters > 1:
            self.checks["leader master killed mid-run"] = bool(leader_killed)
            self.checks["training went on across the failover"] = stall is not None and stall < 60
            if leader_killed and stall is not None:
                log(f"      leader {leader_killed['name']} SIGKILLed at step {leader_killed['step']}: the follower took"
                    f" over (epoch {leader_killed['epoch_after']}); longest step gap after it {stall:.1f} s")  # fmt: skip
        self.checks["supervisor recovered and finished"] = bool(recovered) and events[-1]["event"] == "finished"
        self.checks["trained to the last step"] = summary["step"] == self.steps
        curve = _loss_curve(rows)
        ok_rows = [r for r in rows if r["verdict"] == "ok"]
        tok_s = statistics.median(r["tokens_per_s"] for r in ok_rows) if ok_rows else 0.0
        self.checks["loss fell"] = curve[-1][1] < curve[0][1]
        blocked = summary.get("ckpt_blocked_s") or []
        log(f"      {self.steps} steps in {took:.0f} s with {len(starts) - 1} restart(s); "
            f"loss {curve[0][1]:.3f} -> {curve[-1][1]:.3f}; median {tok_s:,.0f} tokens/s (2 ranks)")  # fmt: skip
        if recovered:
            log(f"      failure: {failures[0]['reason']}; resumed from the checkpoint at step {resumed_from}, "
                f"training again {recovered[0]['recovery_seconds']:.1f} s after the failure was detected")  # fmt: skip
        self.result["training"] = {
            "steps": self.steps, "seconds": took, "restarts": len(starts) - 1, "killed": killed,
            "failure": failures[0]["reason"] if failures else "", "resumed_from_step": resumed_from,
            "recovery_seconds": recovered[0]["recovery_seconds"] if recovered else None,
            "first_loss": curve[0][1], "last_loss": curve[-1][1], "tokens_per_s_median": tok_s,
            "leader_killed": leader_killed, "failover_stall_seconds": stall,
            "ckpt_blocked_s_median": statistics.median(blocked) if blocked else None,
            "events": [e["event"] for e in events], "ckpt_uri": ckpt_uri,
        }  # fmt: skip
        self.curve, self.rows = curve, rows

    def complete_checkpoint_before(self, step: int) -> bool:
        """Whether a checkpoint of a step in (0, ``step``] is complete (its ``.metadata`` is written
        last, by rename), read through the mount (no negative lookup cache: seen at once)."""
        root = self.mnt / "checkpoints" / RUN
        with contextlib.suppress(OSError):
            for d in root.iterdir():
                done = d.name.startswith("step-") and d.name[5:].isdigit() and 0 < int(d.name[5:]) <= step
                if done and (d / ".metadata").exists():
                    return True
        return False

    def kill_leader(self, step: int) -> dict:
        """SIGKILL the leader master (``pcache up`` restarts it as the follower); returns what happened."""
        from pcache.client import Client
        from pcache.common.config import ClientConfig

        doc = json.loads((self.cluster_dir / "cluster.json").read_text())
        with Client(ClientConfig(master=self.master, rpc_timeout=2.0)) as pc:
            statuses = pc.master_statuses()
            leader = next(a for a, st in statuses if not isinstance(st, Exception) and st.master.role == "leader")
            proc = next(m for m in doc["masters"] if m["address"] == leader)
            before = pc.status().epoch
            t0 = time.time()
            os.kill(proc["pid"], signal.SIGKILL)
            log(f"[5/8] SIGKILL to the leader master {proc['name']} (pid {proc['pid']}) at step {step}")
            pc.mkdir("/.demo-failover", parents=True)  # the first mutation after the kill: on the new leader
            took = time.time() - t0
            after = pc.status().epoch
        log(f"      a client's next mutation succeeded {took:.1f} s after the kill (epoch {before} -> {after})")
        return {"name": proc["name"], "pid": proc["pid"], "step": step, "time": t0, "first_mutation_s": took,
                "epoch_before": before, "epoch_after": after}  # fmt: skip

    def etcd_loss_drill(self) -> None:
        """Stage 5, a pair on etcd only: etcd's data lost under the running cluster (SIGKILL, data
        directory deleted; ``pcache up`` restarts it empty). Both masters find their newest term
        missing from etcd and stop leading (a leader on an emptied etcd would have a lower epoch
        than every worker and client holds); ``pcache ha recover --yes`` gives the pair a leader
        again with higher epochs, and nothing written before is lost."""
        from pcache.client import Client
        from pcache.common.config import ClientConfig
        from pcache.common.errors import PCacheError

        if self.masters < 2:
            log("      one master alone (no etcd): skipped")
            return
        doc = json.loads((self.cluster_dir / "cluster.json").read_text())
        with Client(ClientConfig(master=self.master, rpc_timeout=2.0, failover_timeout=2.0)) as pc:
            before = pc.status().epoch
            listed = sorted(e.name for e in pc.listdir(f"/checkpoints/{RUN}"))
            t0 = time.monotonic()
            os.kill(doc["etcd_pid"], signal.SIGKILL)
            shutil.rmtree(doc["etcd_data_dir"], ignore_errors=True)
            log(
                f"      SIGKILL to etcd (pid {doc['etcd_pid']}), its data directory deleted; pcache up restarts it empty"
            )
            why: list[str] = []
            while time.monotonic() - t0 < 90 and not (why and all("etcd lost the cluster's record" in w for w in why)):
                time.sleep(0.5)
                why = [st.master.may_not_lead for _, st in pc.master_statuses() if not isinstance(st, Exception)]
            halted = time.monotonic() - t0
            if not why or not all("etcd lost the cluster's record" in w for w in why):
                raise StageError(f"the masters did not halt within 90 s after etcd lost its data: {why}")
            log(f"      both masters stopped leading within {halted:.1f} s: {why[0].split(': no master leads')[0]}")
            cmd = [sys.executable, "-m", "pcache", "--cluster-dir", str(self.cluster_dir), "ha", "recover", "--yes"]
            for line in self.run_cmd("pcache ha recover", cmd, timeout=60).stdout.splitlines():
                log(f"      pcache ha recover: {line}")
            while True:
                try:
                    pc.mkdir("/.demo-etcd-recovered", parents=True)  # the first mutation after the recovery
                    break
                except PCacheError as exc:
                    if time.monotonic() - t0 > 120:
                        raise StageError(f"no master led within 120 s of etcd's data loss: {exc}") from exc
            took = time.monotonic() - t0
            after = pc.status().epoch
            same = sorted(e.name for e in pc.listdir(f"/checkpoints/{RUN}")) == listed
        log(f"      a client's next mutation succeeded {took:.1f} s after the loss (epoch {before} -> {after});"
            f" the {len(listed)} checkpoints are all there: {'yes' if same else 'NO'}")  # fmt: skip
        self.checks["etcd data loss halted the pair, recovered, nothing lost"] = same and after > before
        self.result["etcd_loss"] = {"halted_s": halted, "first_mutation_s": took, "epoch_before": before,
                                    "epoch_after": after, "checkpoints_kept": same}  # fmt: skip

    def checkpoint_to_region_b(self) -> str:
        """Stage 6: the newest committed checkpoint PCache -> region B; data first, ``.metadata`` last."""
        from babel.daemon import newest_checkpoint
        from pcache.common.checkpoint import COMMIT_MARKER

        name = asyncio.run(newest_checkpoint(self.pcache(f"checkpoints/{RUN}")))
        if name is None:
            raise StageError(f"no committed checkpoint under {self.pcache(f'checkpoints/{RUN}')}")
        src, dst = self.pcache(f"checkpoints/{RUN}/{name}"), self.region_b(f"checkpoints/{RUN}/{name}")
        sampled = ("--verify", "sample", "--samples", str(SAMPLES))
        data = self.babel_sync(
            "checkpoint data PCache -> region B", src, dst, *sampled, "--exclude", f"/{COMMIT_MARKER}"
        )
        marker = self.babel_sync(
            "checkpoint .metadata PCache -> region B", src, dst, *sampled, "--include", f"/{COMMIT_MARKER}"
        )
        self.result["checkpoint"] = {"name": name, "pcache": src, "region_b": dst, "data": data, "marker": marker,
                                     "bytes": data["copied_bytes"] + marker["copied_bytes"]}  # fmt: skip
        return name

    def restore_and_compare(self, name: str) -> None:
        """Stage 7: region B -> local disk, loaded with the stock DCP reader, compared with final-model.pt."""
        import torch
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        restore = self.work / "restore" / name
        report = self.babel_sync("checkpoint region B -> local", self.region_b(f"checkpoints/{RUN}/{name}"),
                                 f"file://{restore}")  # fmt: skip
        t0 = time.monotonic()
        flat = self.work / "restored.pt"
        dcp_to_torch_save(str(restore), str(flat))
        state = torch.load(flat, weights_only=False)
        final = torch.load(self.run_dir / "final-model.pt", weights_only=True)
        model = state["app"]["model"]
        same_keys = set(model) == set(final)
        equal = same_keys and all(torch.equal(model[k], final[k]) for k in final)
        step = int(state["progress"]["step"])
        params = sum(t.numel() for t in final.values())
        took = time.monotonic() - t0
        self.checks["region B checkpoint == final trained state"] = equal and step == self.steps
        log(f"      loaded step {step} from region B with FileSystemReader in {took:.1f} s: {len(final)} tensors, "
            f"{params:,} parameters, " + ("all torch.equal to the final state" if equal else "DIFFERENT"))  # fmt: skip
        self.result["restore"] = {"local": str(restore), "step": step, "tensors": len(final), "parameters": params,
                                  "equal": equal, "sync": report}  # fmt: skip

    def cluster_status(self) -> dict:
        from pcache.client import Client

        with Client(master=self.master) as pc:
            st = pc.status()
        return {"inodes": st.inodes, "blocks": st.blocks, "replication": st.default_replication,
                "under_replicated": st.under_replicated_blocks, "missing": st.missing_blocks,
                "corrupt": st.corrupt_blocks, "workers": len(st.workers)}  # fmt: skip

    # ------------------------------------------------------------------ cleanup --

    def stop(self) -> list[str]:
        """Stop every process started here (trainer, pcache up and its mount, servers); problems found."""
        problems = []
        if self.trainer is not None and self.trainer.poll() is None:
            _stop_group(self.trainer, grace=15)
        if self.up is not None and self.up.poll() is None:
            _stop_group(self.up, grace=60)  # pcache up unmounts, then stops the workers and the master
        from fuse_client.mount import mounted, unmount

        if self.mnt.exists() and mounted(str(self.mnt)):
            problems.append(f"{self.mnt} was still mounted (unmounted lazily)")
            unmount(str(self.mnt), lazy=True)
        for server in self.servers:
            server.stop()
        reap_children()  # any child whose handle a signal took away mid-spawn (e.g. the shard build)
        return problems


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the process, SIGKILL to its whole process group after ``grace`` seconds."""
    stop_process(proc, grace=grace, group=True)


def _stall_after(rows: list[dict], when: float, *, until: float | None = None, window: float = 60.0) -> float | None:
    """The longest gap (seconds) between two consecutive logged steps of rank 0 from ``when`` on,
    for ``window`` seconds and not past ``until`` (the rank kill, whose restart gap is its own)."""
    end = min(when + window, until) if until else when + window
    times = sorted(r["time"] for r in rows if r.get("time"))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= when and a <= end]
    return max(gaps) if gaps else None


def _loss_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, loss) of the updates that count: after a restart the resumed attempt's rows win."""
    by_step: dict[int, float] = {}
    for row in rows:
        if row["verdict"] == "ok":
            by_step[row["step"]] = row["loss"]
    return sorted(by_step.items())


def _attempts(rows: list[dict]) -> list[list[dict]]:
    """Rows split per attempt: a step number going back means a restart resumed from a checkpoint."""
    attempts: list[list[dict]] = [[]]
    for row in rows:
        if attempts[-1] and row["step"] <= attempts[-1][-1]["step"]:
            attempts.append([])
        attempts[-1].append(row)
    return attempts


def plot_loss(rows: list[dict], killed: dict, resumed_from: int | None, path: Path) -> None:
    """The loss per step: the first attempt, the resumed attempt, the kill and the resume point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attempts = _attempts(rows)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for i, part in enumerate(attempts):
        label = "first attempt" if i == 0 else f"after restart {i} (resumed from step {part[0]['step'] - 1})"
        ax.plot([r["step"] for r in part], [r["loss"] for r in part], lw=4.0 if i == 0 else 1.5, label=label,
                alpha=0.45 if i == 0 else 1.0, color=("tab:blue", "tab:green", "tab:purple")[i % 3])  # fmt: skip
    if killed:
        ax.axvline(killed["step"], color="tab:red", ls="--", lw=1, label=f"rank 1 SIGKILLed (step {killed['step']})")
    if resumed_from:
        ax.axvline(resumed_from, color="tab:gray", ls=":", lw=1, label=f"checkpoint resumed (step {resumed_from})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, nats/token)")
    ax.set_title(
        "Reference Ling MoE (tiny) on the stdlib corpus, data via PCache FUSE, 2 DP ranks\n"
        "(the resumed attempt retraces the lost steps bit for bit)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def print_summary(demo: Demo, seconds: float) -> None:
    r = demo.result
    tr, ck = r["training"], r["checkpoint"]
    ds = r["dataset"]
    st = r.get("cluster", {})
    log("")
    log("Summary")
    log(f"  loss                first {tr['first_loss']:.3f} -> last {tr['last_loss']:.3f} over {tr['steps']} steps "
        f"(plot: {demo.out / 'loss.png'})")  # fmt: skip
    log(f"  training            median {tr['tokens_per_s_median']:,.0f} tokens/s on 2 ranks; async checkpoint "
        f"blocked the step {tr['ckpt_blocked_s_median'] or 0:.2f} s (median)")  # fmt: skip
    log(f"  recovery            {tr['failure'] or 'no failure'}; resumed from step {tr['resumed_from_step']}, "
        f"training again after {tr['recovery_seconds'] or 0:.1f} s")  # fmt: skip
    if tr.get("leader_killed"):
        lk = tr["leader_killed"]
        log(f"  master failover     leader SIGKILLed at step {lk['step']}: next mutation after "
            f"{lk['first_mutation_s']:.1f} s, longest training step gap {tr['failover_stall_seconds'] or 0:.1f} s")  # fmt: skip
    if "etcd_loss" in r:
        el = r["etcd_loss"]
        log(f"  etcd data lost      masters halted in {el['halted_s']:.1f} s; `pcache ha recover` -> next mutation "
            f"after {el['first_mutation_s']:.1f} s (epoch {el['epoch_before']} -> {el['epoch_after']})")  # fmt: skip
    b = ds["bind"]
    log(f"  bound dataset       {b['uri']} at /datasets/{DATASET}: {b['objects']} objects listed lazily, "
        f"{b['bytes'] / 1e6:.1f} MB fetched from region A by `pcache load` in {b['load']['seconds']:.1f} s, "
        f"then read from the cache in {b['read_seconds']:.1f} s")  # fmt: skip
    if "views" in ds:
        v = ds["views"]
        log(f"  other views         ls -l on the mount: {v['ls_l_entries']} entries in {v['ls_l_seconds']:.2f} s; "
            f"fsspec pcache:// globbed {v['fsspec_objects']} objects")  # fmt: skip
    for what, rep in [("dataset -> region A", ds["upload"]),
                      ("ckpt PCache -> region B", ck["data"]), ("ckpt region B -> local", r["restore"]["sync"])]:  # fmt: skip
        v = rep["verification"]
        log(f"  babel {what:<23} {rep['copied_bytes'] / 1e6:8.1f} MB {rep['bytes_per_second'] / 1e6:7.1f} MB/s  "
            f"crc32c in-stream {v['runtime']['crc32c_in_stream']}, metadata {v['metadata']['checked']}, "
            f"sampled {v['sample']['checked']}, whole {v['full']['checked']}, failed "
            f"{v['metadata']['failed'] + v['sample']['failed'] + v['full']['failed']}")  # fmt: skip
    log(f"  final state         region B's {ck['name']} == trainer's final state: "
        f"{'yes' if r['restore']['equal'] else 'NO'} ({r['restore']['tensors']} tensors)")  # fmt: skip
    if st:
        log(f"  PCache              {st['inodes']} inodes, {st['blocks']} blocks at RF {st['replication']} on "
            f"{st['workers']} workers, {st['under_replicated']} under-replicated, {st['missing']} missing, "
            f"{st['corrupt']} corrupt")  # fmt: skip
    if "integrity" in r:
        i = r["integrity"]
        log(f"  integrity           a byte flipped on disk in {i['shard']}: served right {'yes' if i['served_right'] else 'NO'}, "
            f"caught and repaired {'yes' if i['repaired'] else 'NO'} ({i['seconds']:.1f} s)")  # fmt: skip
    log("  where the data lives (until cleanup)")
    log(f"    shards            {demo.work / 'shards'}  ->  {demo.region_a(f'datasets/{DATASET}').split('?')[0]} "
        f"(region A)  ->  bound at pcache:/datasets/{DATASET} (blocks cached on the workers)")  # fmt: skip
    log(f"    training reads    {demo.mnt / 'datasets' / DATASET}  (FUSE mount of PCache)")
    log(f"    checkpoints       {tr['ckpt_uri']}/step-*  (PCache blocks under {demo.cluster_dir}/worker-*)")
    log(f"    newest checkpoint {ck['region_b'].split('?')[0]}  (region B, files under {demo.work}/region-b/root)")
    log(f"    restored          {r['restore']['local']}")
    log(f"    logs              {demo.work}/*.log, {demo.cluster_dir}/logs, {demo.run_dir}")
    failed = [k for k, ok in demo.checks.items() if not ok]
    log(f"  checks              {len(demo.checks) - len(failed)}/{len(demo.checks)} held"
        + (f"; FAILED: {', '.join(failed)}" if failed else "") + f"; {seconds:.0f} s in all")  # fmt: skip


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, a closed terminal


def _interrupt(signum: int, _frame: object) -> None:
    """The first stop signal ends the run; later ones are ignored, so the clean-up always finishes
    (a demo killed with -9 still stops its children: they die with their parent)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    for sig in STOP_SIGNALS:  # first of all: a signal at any moment runs the clean-up below
        signal.signal(sig, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="A smaller corpus and fewer steps (CI).")
    ap.add_argument("--steps", type=int, help="Training steps (default 150; 30 with --quick).")
    ap.add_argument("--kill-at", type=int, help="Step at which rank 1 is killed (default: 60%% of the steps).")
    ap.add_argument(
        "--corpus-bytes", type=int, help="Source bytes tokenized (default: the whole stdlib; 3 MB with --quick)."
    )
    ap.add_argument("--out", default="demo-out", help="Where summary.json and loss.png go (default ./demo-out).")
    ap.add_argument("--keep", action="store_true", help="Keep the scratch directory (its path is printed).")
    args = ap.parse_args()
    steps = args.steps or (30 if args.quick else 150)
    kill_at = args.kill_at if args.kill_at is not None else int(steps * 0.6)
    if not 0 < kill_at < steps:
        ap.error(f"--kill-at must be between 1 and {steps - 1}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pcache-demo-"))
    demo = Demo(work, out, steps, kill_at, args.corpus_bytes or (3_000_000 if args.quick else 0),
                4096 if args.quick else 8192)  # fmt: skip

    stages = [
        ("start region A, region B and a PCache cluster with its FUSE mount", demo.start_services),
        ("build token shards from the stdlib sources, upload them to region A", demo.dataset_to_region_a),
        (
            "bind region A's dataset into PCache, warm it (pcache load), read it through the mount",
            demo.dataset_to_pcache,
        ),
        ("train 2 ranks reading through the mount, async checkpoints into PCache", demo.train_with_a_kill),
        ("lose etcd's data under the running pair, recover with pcache ha recover", demo.etcd_loss_drill),
    ]
    t_all = time.monotonic()
    status = 0
    try:
        for i, (what, fn) in enumerate(stages, 1):
            log(f"[{i}/8] {what}")
            fn()
        log("[6/8] babel sync the newest checkpoint PCache -> region B (runtime + sampled verification)")
        name = demo.checkpoint_to_region_b()
        log("[7/8] load that checkpoint back from region B and compare it with the final trained state")
        demo.restore_and_compare(name)
        log("[8/8] summary")
        demo.result["cluster"] = demo.cluster_status()
        plot_loss(demo.rows, demo.result["training"]["killed"], demo.result["training"]["resumed_from_step"],
                  out / "loss.png")  # fmt: skip
        status = 0 if all(demo.checks.values()) else 1
    except StageError as exc:
        log(f"demo: {exc}")
        status = 2
    except KeyboardInterrupt:
        log("demo: interrupted; stopping everything")
        status = 130
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the clean-up short (and leak the cluster)
            signal.signal(sig, signal.SIG_IGN)
        problems = demo.stop()
        demo.result.update(checks=demo.checks, cleanup_problems=problems, work_dir=str(work), kept=args.keep)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - t_all
    demo.result["seconds"] = seconds
    demo.result["status"] = status
    (out / "summary.json").write_text(json.dumps(demo.result, indent=1, default=str) + "\n")
    if status == 0 or status == 1:
        print_summary(demo, seconds)
    log(f"everything stopped{'; scratch kept in ' + str(work) if args.keep else ' and removed'}; "
        f"{out / 'summary.json'}")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
