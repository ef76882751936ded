"""deploy/k8s: the manifests validate against the Kubernetes schemas (strict), every container's
command line parses against the real click commands with the ConfigMap's pcache.toml, and the
references between objects, ports, paths and the configuration hold.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from babel.daemon import Daemon, DaemonConfig, make_app, split_addr
from pcache.common.config import GiB, PCacheConfig, load_config
from pcache.common.errors import InvalidArgument
from tests.deploy.conftest import DEPLOY, PROGRAMS, REPO, Checked, check_command, memory_bytes, substitute

K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30"
"""Schemas of this Kubernetes release, shipped with kubernetes-validate (no network)."""
NAMESPACE = "pcache"
CONFIG_PATH = "/etc/pcache/pcache.toml"
"""Where pods mount the ConfigMap's pcache.toml."""
FIELD_SAMPLES = {
    "status.podIP": "10.0.0.11",
    "status.hostIP": "10.0.0.11",
    "spec.nodeName": "node-a",
    "metadata.name": "pod-0",
}
"""Downward-API values the checks substitute for $(VAR) references."""
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
ENV_REF = r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)"


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
DOCS = [(path, doc) for path in MANIFESTS + EXAMPLES for doc in _load(path)]


def _name(path: Path, doc: dict[str, Any]) -> str:
    return f"{path.relative_to(K8S)}:{doc['kind']}/{doc['metadata']['name']}"


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in objects(kind) if d["metadata"]["name"] == name]
    return doc


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def workloads() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path, doc in DOCS if doc["kind"] in WORKLOADS]


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in all_containers(pod_spec(doc)) if c["name"] == name]
    return found


CONTAINERS = [
    pytest.param(doc, c, id=f"{_name(path, doc)}:{c['name']}")
    for path, doc in workloads()
    for c in all_containers(pod_spec(doc))
]
PCACHE_CONTAINERS = [p for p in CONTAINERS if p.values[1]["command"][0] in PROGRAMS]


def argv_of(c: dict[str, Any]) -> list[str]:
    """The container's command line with $(VAR) replaced as the kubelet would (sample values)."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = FIELD_SAMPLES[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = "secret-value"
    return [substitute(word, ENV_REF, env.__getitem__) for word in [*c["command"], *c.get("args", [])]]


@pytest.fixture(scope="module")
def toml_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("k8s") / "pcache.toml"
    path.write_text(one("ConfigMap", "pcache-config")["data"]["pcache.toml"])
    return path


@pytest.fixture(scope="module")
def cfg(toml_file: Path) -> PCacheConfig:
    return load_config(toml_file)


def checked(doc: dict[str, Any], name: str, toml_file: Path) -> Checked:
    return check_command(argv_of(container(doc, name)), {CONFIG_PATH: toml_file})


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any attempt to open a network connection or resolve a name fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"network use: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


# ------------------------------------------------------------------------------ schemas --


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("doc", [pytest.param(doc, id=_name(path, doc)) for path, doc in DOCS])
def test_manifest_validates_strictly(doc: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


@pytest.mark.usefixtures("no_network")
def test_strict_validation_rejects_a_misspelt_field() -> None:
    doc = yaml.safe_load(yaml.safe_dump(one("DaemonSet", "pcache-worker")))
    worker = pod_spec(doc)["containers"][0]
    worker["volumeMount"] = worker.pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_the_manifests() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed: kustomize build not checked")
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True)
    built = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in built) == sorted(
        (d["kind"], d["metadata"]["name"]) for path, d in DOCS if path in MANIFESTS
    )


def test_objects_live_in_the_pcache_namespace() -> None:
    assert [d["metadata"]["name"] for d in objects("Namespace")] == [NAMESPACE]
    for path, doc in DOCS:
        if path in EXAMPLES and doc["kind"] == "Job":
            assert "namespace" not in doc["metadata"], "the training Job goes into the user's namespace"
        elif doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, _name(path, doc)


# ------------------------------------------------------------------------ configuration --


def test_configmap_toml_loads_strictly(toml_file: Path, cfg: PCacheConfig) -> None:
    assert cfg.master.data_dir and cfg.worker.metrics_port > 0 and cfg.master.metrics_port > 0
    assert tomllib.loads(toml_file.read_text()).keys() <= {"master", "worker", "client"}
    bad = toml_file.with_name("bad.toml")
    bad.write_text(toml_file.read_text().replace("[worker]\n", "[worker]\nmem_tier = 1\n"))
    with pytest.raises(InvalidArgument, match=r"unknown option worker\.mem_tier"):
        load_config(bad)


@pytest.mark.parametrize(("doc", "c"), PCACHE_CONTAINERS)
def test_command_parses_against_the_cli(doc: dict[str, Any], c: dict[str, Any], toml_file: Path) -> None:
    result = check_command(argv_of(c), {CONFIG_PATH: toml_file})
    if result.config is not None:
        assert result.ctx.params["config_path"] == CONFIG_PATH
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert str(Path(CONFIG_PATH).parent) in mounts


def test_every_container_command_is_checked() -> None:
    for param in CONTAINERS:
        command = param.values[1]["command"]
        assert (
            command[0] in PROGRAMS
            or command == ["etcd"]  # test_etcd_members_form_one_cluster
            or command[:2] == ["sh", "-c"]
            or command[:3]
            == [
                "python",
                "-m",
                "trainer_ref.launch",
            ]
        ), param.id


@pytest.mark.parametrize(
    ("name", "change", "error"),
    [
        pytest.param(
            "pcache-worker",
            lambda a: [w.replace("--worker.host=", "--worker.hots=") for w in a],
            InvalidArgument,
            id="worker-key",
        ),
        pytest.param(
            "pcache-worker",
            lambda a: [w.replace("--config", "--confg") for w in a],
            InvalidArgument,
            id="worker-option",
        ),
        pytest.param(
            "pcache-worker", lambda a: [*a, "--worker.mem_tier_bytes=lots"], InvalidArgument, id="worker-value"
        ),
        pytest.param(
            "pcache-worker", lambda a: ["wroker" if w == "worker" else w for w in a], click.UsageError, id="subcommand"
        ),
        pytest.param(
            "pcache-mount", lambda a: [w.replace("--master", "--mastr") for w in a], InvalidArgument, id="mount-option"
        ),
        pytest.param("pcache-mount", lambda a: a[:1], click.UsageError, id="mount-no-mountpoint"),
        pytest.param(
            "babel-daemon",
            lambda a: [w.replace("--max-jobs", "--max-job") for w in a],
            click.UsageError,
            id="babel-option",
        ),
        pytest.param(
            "babel-daemon", lambda a: [w.replace("0.0.0.0:7700", "0.0.0.0") for w in a], ValueError, id="babel-listen"
        ),
    ],
)
def test_a_misspelt_command_line_fails(name: str, change: Any, error: type[Exception], toml_file: Path) -> None:
    kind = "Deployment" if name == "babel-daemon" else "DaemonSet"
    doc = one(kind, name)
    argv = argv_of(pod_spec(doc)["containers"][0])
    check_command(argv, {CONFIG_PATH: toml_file})
    with pytest.raises(error):
        check_command(change(argv), {CONFIG_PATH: toml_file})


@pytest.mark.parametrize(("doc", "c"), CONTAINERS)
def test_env_references_are_defined(doc: dict[str, Any], c: dict[str, Any]) -> None:
    defined = {var["name"] for var in c.get("env", [])}
    for word in [*c["command"], *c.get("args", [])]:
        assert set(re.findall(ENV_REF, word)) <= defined, word
    for var in c.get("env", []):
        if "fieldRef" in var.get("valueFrom", {}):
            assert var["valueFrom"]["fieldRef"]["fieldPath"] in FIELD_SAMPLES


@pytest.mark.parametrize(("doc", "c"), CONTAINERS)
def test_shell_snippets_parse(doc: dict[str, Any], c: dict[str, Any]) -> None:
    scripts = []
    for command in (c["command"], c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])):
        if command[:2] == ["sh", "-c"]:
            scripts.append(command[2])
    for script in scripts:
        subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)


# ------------------------------------------------------------------------- references --


@pytest.mark.parametrize(("path", "doc"), [pytest.param(p, d, id=_name(p, d)) for p, d in workloads()])
def test_volume_mounts_name_volumes(path: Path, doc: dict[str, Any]) -> None:
    spec = pod_spec(doc)
    volumes = {v["name"] for v in spec.get("volumes", [])}
    volumes |= {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
    mounted = set()
    for c in all_containers(spec):
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{c['name']}: {m['name']}"
            mounted.add(m["name"])
    assert mounted == volumes, "a volume nobody mounts"


@pytest.mark.parametrize(("path", "doc"), [pytest.param(p, d, id=_name(p, d)) for p, d in workloads()])
def test_config_secret_and_claim_references_exist(path: Path, doc: dict[str, Any]) -> None:
    namespace = doc["metadata"].get("namespace", NAMESPACE)

    def data_keys(kind: str, name: str) -> set[str]:
        (found,) = [
            d for d in objects(kind) if d["metadata"]["name"] == name and d["metadata"]["namespace"] == namespace
        ]
        return set(found.get("data", {})) | set(found.get("stringData", {}))

    spec = pod_spec(doc)
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            keys = data_keys("ConfigMap", volume["configMap"]["name"])
            assert {i["key"] for i in volume["configMap"].get("items", [])} <= keys
        if "secret" in volume:
            keys = data_keys("Secret", volume["secret"]["secretName"])
            assert {i["key"] for i in volume["secret"].get("items", [])} <= keys
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            assert claim in {d["metadata"]["name"] for d in objects("PersistentVolumeClaim")}
    for c in all_containers(spec):
        for var in c.get("env", []):
            ref = var.get("valueFrom", {})
            if "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
                assert ref["secretKeyRef"]["key"] in data_keys("Secret", ref["secretKeyRef"]["name"])
            if "configMapKeyRef" in ref:
                assert ref["configMapKeyRef"]["key"] in data_keys("ConfigMap", ref["configMapKeyRef"]["name"])


@pytest.mark.parametrize(("path", "doc"), [pytest.param(p, d, id=_name(p, d)) for p, d in workloads()])
def test_workload_selector_matches_its_pods(path: Path, doc: dict[str, Any]) -> None:
    selector = doc["spec"].get("selector", {}).get("matchLabels")
    if doc["kind"] == "Job":
        assert selector is None  # generated by the Job controller
        return
    assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("svc", [pytest.param(d, id=d["metadata"]["name"]) for d in objects("Service")])
def test_service_selects_pods_and_their_ports(svc: dict[str, Any]) -> None:
    selector = svc["spec"]["selector"]
    pods = [
        doc
        for _, doc in workloads()
        if doc["metadata"].get("namespace") == svc["metadata"]["namespace"]
        and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert pods, "selects no pods"
    for doc in pods:
        ports = [p for c in pod_spec(doc)["containers"] for p in c.get("ports", [])]
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            key = "name" if isinstance(target, str) else "containerPort"
            assert target in {p.get(key) for p in ports}, f"{svc['metadata']['name']}: {target}"


@pytest.mark.parametrize(("doc", "c"), CONTAINERS)
def test_probes_use_declared_ports(doc: dict[str, Any], c: dict[str, Any]) -> None:
    names = {p["name"] for p in c.get("ports", [])}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(kind, {})
        for action in ("tcpSocket", "httpGet"):
            if action in probe:
                port = probe[action]["port"]
                assert port in names if isinstance(port, str) else port in {p["containerPort"] for p in c["ports"]}


def test_prometheus_annotations_name_the_metrics_ports(cfg: PCacheConfig) -> None:
    annotated = {}
    for _, doc in workloads():
        template = doc["spec"]["template"]
        notes = template["metadata"].get("annotations", {})
        metrics = [p for c in template["spec"]["containers"] for p in c.get("ports", []) if p["name"] == "metrics"]
        if notes.get("prometheus.io/scrape") == "true":
            assert [p["containerPort"] for p in metrics] == [int(notes["prometheus.io/port"])]
            assert notes["prometheus.io/path"] == "/metrics"
            annotated[doc["metadata"]["name"]] = int(notes["prometheus.io/port"])
        else:
            assert not metrics, "a metrics port nobody scrapes"
    assert annotated == {"pcache-master": cfg.master.metrics_port, "pcache-worker": cfg.worker.metrics_port}


# ------------------------------------------------------------------- PCache processes --


MASTER_ADDRESSES = ",".join(
    f"pcache-master-{i}.pcache-master-headless.{NAMESPACE}.svc.cluster.local:19600" for i in range(2)
)


def test_master_pair_on_etcd_each_on_its_volume(toml_file: Path, cfg: PCacheConfig) -> None:
    master = one("StatefulSet", "pcache-master")
    assert master["spec"]["replicas"] == 2  # a leader and a follower
    assert master["spec"]["serviceName"] == "pcache-master-headless"
    anti = pod_spec(master)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    run = checked(master, "master", toml_file).config
    assert run is not None and run.master.host == "0.0.0.0"
    # each pod advertises its own stable name under the headless Service
    assert run.master.advertise_host == f"pod-0.pcache-master-headless.{NAMESPACE}.svc.cluster.local"
    # etcd is the Service of etcd.yaml, on its client port
    etcd_svc = one("Service", "pcache-etcd")
    (port,) = etcd_svc["spec"]["ports"]
    assert run.master.etcd == f"pcache-etcd.{NAMESPACE}.svc.cluster.local:{port['port']}"
    assert run.master.data_dir and run.master.lease_ttl <= 5
    mounts = {m["name"]: m["mountPath"] for m in container(master, "master")["volumeMounts"]}
    (claim,) = master["spec"]["volumeClaimTemplates"]
    assert mounts[claim["metadata"]["name"]] == run.master.data_dir
    ports = {p["name"]: p["containerPort"] for p in container(master, "master")["ports"]}
    assert ports == {"grpc": cfg.master.port, "log-stream": cfg.master.stream_port, "metrics": cfg.master.metrics_port}


def _secret_at(doc: dict[str, Any], c: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) a container sees at file ``path``, read-only and not readable by all."""
    volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
    for m in c["volumeMounts"]:
        volume = volumes.get(m["name"], {})  # a claim template's volume is not in the pod spec
        if "secret" in volume and path.startswith(m["mountPath"].rstrip("/") + "/"):
            assert m.get("readOnly") and volume["secret"]["defaultMode"] & 0o007 == 0
            rel = path[len(m["mountPath"].rstrip("/")) + 1 :]
            (item,) = [i for i in volume["secret"]["items"] if i["path"] == rel]
            return volume["secret"]["secretName"], item["key"]
    raise AssertionError(f"no Secret mounted at {path}")


def test_every_process_gets_its_credential_from_a_secret(toml_file: Path, cfg: PCacheConfig) -> None:
    """The masters share one key file, workers hold a worker token, mounts, training pods and
    Babel a tenant token: each from a Secret, none on a command line."""
    master = one("StatefulSet", "pcache-master")
    assert _secret_at(master, container(master, "master"), cfg.master.keys_file) == ("pcache-keys", "keys.json")
    worker = one("DaemonSet", "pcache-worker")
    assert _secret_at(worker, container(worker, "worker"), cfg.worker.token_file) == ("pcache-worker-token", "token")
    mount = one("DaemonSet", "pcache-mount")
    env = {e["name"]: e for e in container(mount, "mount")["env"]}
    assert _secret_at(mount, container(mount, "mount"), env["PCACHE_TOKEN_FILE"]["value"]) == (
        "pcache-tenant-token", "token",
    )  # fmt: skip
    for doc, name in ((one("Job", "ling-moe-train"), "trainer"), (one("Deployment", "babel-daemon"), "babel")):
        ref = {e["name"]: e for e in container(doc, name)["env"]}["PCACHE_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("pcache-tenant-token", "token")
    for path, doc in workloads():
        for c in all_containers(pod_spec(doc)):
            argv = argv_of(c)
            assert not any("client.token" in a or re.search(r"v1\.[\w-]+\.[\w-]+\.\w+\.\d+\.", a) for a in argv), path


def test_clients_dial_every_master(toml_file: Path, cfg: PCacheConfig) -> None:
    svc = one("Service", "pcache-master-headless")
    grpc_port = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["port"] == cfg.master.port and svc["spec"]["clusterIP"] == "None"
    assert not [
        d for d in objects("Service") if d["metadata"]["name"] == "pcache-master"
    ]  # no Service hides the leader
    address = MASTER_ADDRESSES
    assert cfg.worker.master == cfg.client.master == address
    mount = checked(one("DaemonSet", "pcache-mount"), "mount", toml_file)
    assert mount.ctx.params["master"] == address
    job = container(one("Job", "ling-moe-train"), "trainer")
    assert {"name": "PCACHE_MASTER", "value": address} in job["env"]
    assert f"--ckpt.uri=pcache://{address}/ckpt/ling-moe-run1" in job["args"]


def test_etcd_members_form_one_cluster() -> None:
    etcd = one("StatefulSet", "pcache-etcd")
    c = container(etcd, "etcd")
    flags = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    replicas = etcd["spec"]["replicas"]
    assert replicas % 2 == 1 and etcd["spec"]["podManagementPolicy"] == "Parallel"
    headless = etcd["spec"]["serviceName"]
    members = dict(m.split("=", 1) for m in flags["initial-cluster"].split(","))
    assert members == {
        f"pcache-etcd-{i}": f"http://pcache-etcd-{i}.{headless}.{NAMESPACE}.svc.cluster.local:2380"
        for i in range(replicas)
    }
    assert flags["name"] == "$(POD_NAME)" and flags["initial-advertise-peer-urls"].startswith("http://$(POD_NAME).")
    assert flags["data-dir"].startswith(c["volumeMounts"][0]["mountPath"] + "/")
    exe = shutil.which("etcd")
    if exe is not None:  # every flag is one this etcd knows (Debian etcd-server; .ci/run installs it)
        known = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30).stdout
        for flag in flags:
            assert f"--{flag}" in known, flag


def _host_paths(doc: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec(doc)["volumes"] if "hostPath" in v}


def test_worker_binds_the_node_ip_and_a_directory_per_node(toml_file: Path, cfg: PCacheConfig) -> None:
    doc = one("DaemonSet", "pcache-worker")
    spec = pod_spec(doc)
    run = checked(doc, "worker", toml_file).config
    assert run is not None
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert run.worker.host == FIELD_SAMPLES["status.podIP"]  # under hostNetwork, the node's IP
    worker = container(doc, "worker")
    env = {v["name"]: v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for v in worker["env"]}
    assert env["PCACHE_NODE_ID"] == "spec.nodeName" and not run.worker.node_id
    (nvme,) = [m for m in worker["volumeMounts"] if m["name"] == "nvme"]
    assert _host_paths(doc)["nvme"] == nvme["mountPath"]  # the socket path is advertised: same inside and out
    assert run.worker.data_dir == f"{nvme['mountPath']}/{FIELD_SAMPLES['spec.nodeName']}"
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports == {"data": cfg.worker.port, "metrics": cfg.worker.metrics_port}
    assert run.worker.port != 0 and run.worker.short_circuit


def test_worker_memory_limit_holds_the_memory_tier(cfg: PCacheConfig) -> None:
    resources = container(one("DaemonSet", "pcache-worker"), "worker")["resources"]
    limit = memory_bytes(resources["limits"]["memory"])
    assert memory_bytes(resources["requests"]["memory"]) == limit  # no overcommit of the node's memory
    assert limit >= cfg.worker.mem_tier_bytes + 4 * GiB


def test_same_node_pods_see_the_worker_sockets_at_the_advertised_path() -> None:
    worker = one("DaemonSet", "pcache-worker")
    nvme = _host_paths(worker)["nvme"]
    for doc, name in ((one("DaemonSet", "pcache-mount"), "mount"), (one("Job", "ling-moe-train"), "trainer")):
        volume = next(n for n, p in _host_paths(doc).items() if p == nvme)
        (mount,) = [m for m in container(doc, name)["volumeMounts"] if m["name"] == volume]
        assert mount["mountPath"] == nvme and mount["readOnly"] is True
        assert pod_spec(doc)["nodeSelector"] == pod_spec(worker)["nodeSelector"]
        env = {
            v["name"]: v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for v in container(doc, name)["env"]
        }
        assert env["PCACHE_NODE_ID"] == "spec.nodeName"


def test_fuse_mount_pod(toml_file: Path) -> None:
    doc = one("DaemonSet", "pcache-mount")
    assert doc["spec"]["updateStrategy"]["type"] == "OnDelete"
    mount = container(doc, "mount")
    run = checked(doc, "mount", toml_file)
    point = run.ctx.params["mountpoint"]
    assert not run.ctx.params["daemon"]  # the container's process is the mount
    assert mount["securityContext"]["privileged"] is True
    assert "SYS_ADMIN" in mount["securityContext"]["capabilities"]["add"]
    mounts = {m["name"]: m for m in mount["volumeMounts"]}
    hosts = _host_paths(doc)
    shared = mounts["mnt"]
    assert shared["mountPropagation"] == "Bidirectional"
    assert hosts["mnt"] == shared["mountPath"] and Path(point).parent == Path(shared["mountPath"])
    assert hosts["fuse"] == mounts["fuse"]["mountPath"] == "/dev/fuse"
    assert f"fusermount3 -u {point}" in mount["lifecycle"]["preStop"]["exec"]["command"][2]
    assert mount["readinessProbe"]["exec"]["command"] == ["mountpoint", "-q", point]
    assert f"mkdir {point}" in container(doc, "mountpoint")["command"][2]


def test_training_job_sees_the_mount(toml_file: Path) -> None:
    mount_pod = one("DaemonSet", "pcache-mount")
    point = checked(mount_pod, "mount", toml_file).ctx.params["mountpoint"]
    shared = _host_paths(mount_pod)["mnt"]
    job = one("Job", "ling-moe-train")
    volume = next(n for n, p in _host_paths(job).items() if p == shared)
    for c in all_containers(pod_spec(job)):
        (m,) = [m for m in c["volumeMounts"] if m["name"] == volume]
        assert m["mountPropagation"] == "HostToContainer" and m["mountPath"] == shared
    assert f"mountpoint -q {point}" in container(job, "wait-for-pcache")["command"][2]
    trainer = container(job, "trainer")
    (root,) = [a.split("=", 1)[1] for a in trainer["args"] if a.startswith("--data.root=")]
    assert root.startswith(point + "/")
    shm = next(m for m in trainer["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert next(v for v in pod_spec(job)["volumes"] if v["name"] == shm["name"])["emptyDir"]["medium"] == "Memory"


def test_training_job_command_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_ref import launch

    trainer = container(one("Job", "ling-moe-train"), "trainer")
    assert trainer["command"] == ["python", "-m", "trainer_ref.launch"]
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, train_args: list[str], **kwargs: Any) -> None:
            seen.update(kwargs, train_args=train_args)

        def shutdown(self, *args: Any) -> None: ...

        def run(self) -> int:
            return 0

    monkeypatch.setattr(launch, "Supervisor", Recorder)
    monkeypatch.setattr(launch.signal, "signal", lambda *args: None)
    assert launch.main(list(trainer["args"])) == 0
    assert seen["nproc"] == int(trainer["resources"]["limits"]["nvidia.com/gpu"])
    assert seen["run_dir"].startswith(next(m["mountPath"] for m in trainer["volumeMounts"] if m["name"] == "scratch"))
    pytest.importorskip("torch")
    from trainer_ref.train import load_config as load_train_config

    train = load_train_config(None, seen["train_args"])
    assert train.ckpt.uri.startswith("pcache://") and train.data.root


# ---------------------------------------------------------------------------- Babel --


def test_babel_daemon(toml_file: Path, tmp_path: Path) -> None:
    doc = one("Deployment", "babel-daemon")
    assert doc["spec"]["replicas"] == 1 and doc["spec"]["strategy"]["type"] == "Recreate"  # one owner of the state
    babel = container(doc, "babel")
    run = checked(doc, "babel", toml_file)
    assert run.ctx.command.name == "daemon"
    host, port = split_addr(run.ctx.params["listen"])
    assert host == "0.0.0.0" and [p["containerPort"] for p in babel["ports"]] == [port]
    (svc_port,) = one("Service", "babel-daemon")["spec"]["ports"]
    assert svc_port["port"] == port
    svc = one("Service", "babel-daemon")["metadata"]
    assert {svc["name"], f"{svc['name']}.{svc['namespace']}.svc"} <= set(run.ctx.params["allowed_hosts"])
    assert run.ctx.params["allow"] and not any(p.startswith("file://") for p in run.ctx.params["allow"])
    token_env = next(e for e in babel["env"] if e["name"] == "BABEL_DAEMON_TOKEN")
    assert token_env["valueFrom"]["secretKeyRef"]["name"] == one("Secret", "babel-api-token")["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in babel["volumeMounts"]}
    assert mounts["state"] == run.ctx.params["state_dir"]
    assert {"name": "BABEL_STATE_DIR", "value": run.ctx.params["state_dir"]} in babel["env"]
    paths = {
        "/" + r.canonical.strip("/")
        for r in make_app(Daemon(DaemonConfig(state_dir=str(tmp_path))), "t").router.resources()
    }
    for kind in ("readinessProbe", "livenessProbe"):
        assert babel[kind]["httpGet"]["path"] in paths
    secret = one("Secret", "babel-credentials")
    assert all(v == "REPLACE_ME" for k, v in secret["stringData"].items() if k.startswith("AWS_"))


# ------------------------------------------------------------------------- the image --


def test_dockerfile_installs_every_package() -> None:
    dockerfile = (K8S / "Dockerfile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(
        p.name
        for p in REPO.iterdir()
        if (p / "__init__.py").exists() and any(re.fullmatch(pat.replace("*", ".*"), p.name) for pat in patterns)
    )
    copied = re.findall(r"^COPY (\S+) \./\1$", dockerfile, re.M)
    assert sorted(copied) == packages
    assert "COPY pyproject.toml README.md ./" in dockerfile  # README.md: the project's readme
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r"apt-get install .*\bfuse3\b", dockerfile)
    (extras,) = re.findall(r"^ARG EXTRAS=(\S+)$", dockerfile, re.M)
    for spec in (extras, *re.findall(r"--build-arg EXTRAS=(\S+)", dockerfile)):
        assert set(spec.split(",")) <= set(project["project"]["optional-dependencies"])
    ignore = (K8S / "Dockerfile.dockerignore").read_text().split()
    assert {f"!{p}/" for p in packages} | {"!pyproject.toml", "!README.md"} <= set(ignore)


def test_shared_sync_job_runs_one_command_on_every_pod_against_the_etcd_service() -> None:
    job = one("Job", "copy-ling-shards")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] >= 2
    argv = argv_of(container(job, "babel"))
    ctx = check_command(argv, {}).ctx
    etcd = one("Service", "pcache-etcd")
    host, port = ctx.params["etcd"].rsplit(":", 1)
    assert host.split(".")[:2] == [etcd["metadata"]["name"], NAMESPACE]
    assert int(port) in {p["port"] for p in etcd["spec"]["ports"]}
    assert ctx.params["shared_job"] == job["metadata"]["name"]  # one run, one name
    assert ctx.params["src"] and ctx.params["dst"] and ctx.params["state_dir"] == "/var/lib/babel"
    mounts = {m["mountPath"] for m in container(job, "babel")["volumeMounts"]}
    assert "/var/lib/babel" in mounts
