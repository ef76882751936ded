"""deploy/systemd: the units have what a long-running service needs, every ExecStart parses against
the real click commands with the example /etc/pcache/pcache.toml and environment files, the
units agree with that configuration, and ``systemd-analyze verify`` accepts them where it exists.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

from pcache.common.config import GiB, PCacheConfig, load_config
from pcache.common.errors import InvalidArgument
from tests.deploy.conftest import DEPLOY, Checked, check_command, systemd_bytes

SYSTEMD = DEPLOY / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
INSTALL_BIN = "/opt/pcache/bin/"
"""Where the units expect the console scripts (a virtual environment at /opt/pcache)."""
FILES = {
    "/etc/pcache/pcache.toml": SYSTEMD / "pcache.toml",
    "/etc/pcache/worker.env": SYSTEMD / "worker.env",
    "/etc/pcache/master.env": SYSTEMD / "master.env",
    "/etc/babel/babel.env": SYSTEMD / "babel.env",
}
"""Installed path -> the example in this repository."""
HOSTNAME = "node-a"
"""What the checks substitute for %H."""
ENV_REF = r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)"

Unit = dict[str, list[tuple[str, str]]]


def read_unit(path: Path) -> Unit:
    """Sections -> (key, value) pairs in order (keys may repeat, as ExecStartPre does)."""
    sections: Unit = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}: line continuations are not checked here"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: Unit, section: str, key: str) -> str:
    (found,) = values(unit, section, key)
    return found


def words(unit: Unit, section: str, key: str) -> list[str]:
    """A space-separated list setting (After=, Wants=, ...), every occurrence."""
    return [w for v in values(unit, section, key) for w in v.split()]


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, val = line.partition("=")
            assert sep, f"{path.name}: {line!r}"
            env[key.strip()] = val.strip()
    return env


def unit_env(unit: Unit) -> dict[str, str]:
    """The environment ExecStart sees: Environment= and the example EnvironmentFile= contents."""
    env: dict[str, str] = {}
    for path in values(unit, "Service", "EnvironmentFile"):
        optional = path.startswith("-")
        path = path.lstrip("-")
        if path in FILES:
            env.update(read_env_file(FILES[path]))
        else:
            assert optional, f"EnvironmentFile {path} has no example in deploy/systemd"
    for setting in values(unit, "Service", "Environment"):
        for assignment in shlex.split(setting):
            key, _, val = assignment.partition("=")
            env[key] = val
    return env


def exec_argv(unit: Unit, key: str) -> list[str]:
    """The command line of ExecStart= (or another Exec key) as systemd would run it here."""
    (line,) = values(unit, "Service", key)
    env = unit_env(unit)
    line = line.replace("%H", HOSTNAME).replace("%%", "%")

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in env, f"${name} is not set by the unit or its environment files"
        return env[name]

    argv = shlex.split(re.sub(ENV_REF, lookup, line))
    argv[0] = argv[0].lstrip("-@:+!")
    return argv


def units() -> list[object]:
    return [pytest.param(path, id=path.name) for path in UNITS]


@pytest.fixture(scope="module")
def cfg() -> PCacheConfig:
    return load_config(FILES["/etc/pcache/pcache.toml"])


def started(name: str) -> tuple[Unit, Checked]:
    unit = read_unit(SYSTEMD / name)
    return unit, check_command(exec_argv(unit, "ExecStart"), FILES)


def test_the_expected_units_are_here() -> None:
    assert [p.name for p in UNITS] == [
        "babel-daemon.service",
        "pcache-master.service",
        "pcache-mount.service",
        "pcache-worker.service",
    ]


@pytest.mark.parametrize("path", units())
def test_unit_has_what_a_service_needs(path: Path) -> None:
    unit = read_unit(path)
    assert set(unit) == {"Unit", "Service", "Install"}
    assert value(unit, "Unit", "Description")
    assert "network-online.target" in words(unit, "Unit", "After")
    assert "network-online.target" in words(unit, "Unit", "Wants")
    assert value(unit, "Service", "Type") == "simple"  # the processes stay in the foreground
    assert value(unit, "Service", "ExecStart").startswith(INSTALL_BIN)
    assert value(unit, "Service", "Restart") == "on-failure"
    assert int(value(unit, "Service", "RestartSec")) > 0
    assert int(value(unit, "Service", "LimitNOFILE")) >= 65536
    assert value(unit, "Install", "WantedBy") == "multi-user.target"


@pytest.mark.parametrize("path", units())
def test_exec_start_parses_against_the_cli(path: Path) -> None:
    unit = read_unit(path)
    run = check_command(exec_argv(unit, "ExecStart"), FILES)
    if run.config is not None:
        assert run.ctx.params["config_path"] == "/etc/pcache/pcache.toml"


@pytest.mark.parametrize("path", units())
def test_shell_snippets_parse(path: Path) -> None:
    unit = read_unit(path)
    for key in ("ExecStartPre", "ExecStartPost", "ExecStop"):
        for line in values(unit, "Service", key):
            argv = shlex.split(line)
            if "/bin/sh" in argv:
                script = argv[argv.index("-c", argv.index("/bin/sh")) + 1]
                subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)


def test_a_misspelt_exec_start_fails() -> None:
    unit = read_unit(SYSTEMD / "pcache-worker.service")
    argv = exec_argv(unit, "ExecStart")
    with pytest.raises(InvalidArgument, match="hots"):
        check_command([w.replace("--worker.host=", "--worker.hots=") for w in argv], FILES)
    with pytest.raises(KeyError):  # a --config the deployment does not ship
        check_command([w.replace("/etc/pcache/pcache.toml", "/etc/pcache.toml") for w in argv], FILES)


def test_example_config_loads_strictly(cfg: PCacheConfig) -> None:
    text = FILES["/etc/pcache/pcache.toml"].read_text()
    assert tomllib.loads(text).keys() == {"master", "worker", "client"}
    assert cfg.worker.master == cfg.client.master
    masters = cfg.worker.master.split(",")
    assert len(masters) == 2 and all(m.rpartition(":")[2] == str(cfg.master.port) for m in masters)
    assert cfg.master.etcd  # a leader + follower pair


def _ready_file_awaited(unit: Unit, run: Checked) -> None:
    """--ready-file is in the unit's RuntimeDirectory and ExecStartPost waits for exactly it."""
    ready = run.ctx.params["ready_file"]
    assert Path(ready).parent == Path("/run") / value(unit, "Service", "RuntimeDirectory")
    assert f"[ -s {ready} ]" in value(unit, "Service", "ExecStartPost")


def test_master_unit(cfg: PCacheConfig) -> None:
    unit, run = started("pcache-master.service")
    assert run.ctx.command.name == "master" and run.config is not None
    assert run.config.master.data_dir == "/var/lib/" + value(unit, "Service", "StateDirectory")
    assert value(unit, "Service", "User") == "pcache"
    host = read_env_file(FILES["/etc/pcache/master.env"])["PCACHE_MASTER_HOST"]
    assert run.config.master.advertise_host == host != "0.0.0.0"
    assert f"{host}:{run.config.master.port}" in run.config.client.master.split(",")  # the clients know it
    assert "etcd.service" in words(unit, "Unit", "After")
    _ready_file_awaited(unit, run)


def test_worker_unit(cfg: PCacheConfig) -> None:
    unit, run = started("pcache-worker.service")
    assert run.ctx.command.name == "worker" and run.config is not None
    worker = run.config.worker
    assert worker.host == read_env_file(FILES["/etc/pcache/worker.env"])["PCACHE_WORKER_HOST"] != "0.0.0.0"
    data_root = value(unit, "Service", "ReadWritePaths")
    assert value(unit, "Unit", "RequiresMountsFor") == data_root
    assert worker.data_dir == f"{data_root}/{HOSTNAME}"  # a directory per host: distinct socket paths
    assert "pcache-master.service" in words(unit, "Unit", "After")
    assert systemd_bytes(value(unit, "Service", "MemoryMax")) >= worker.mem_tier_bytes + 4 * GiB
    assert value(unit, "Service", "UMask") == "0007"  # the socket usable by the pcache group
    _ready_file_awaited(unit, run)


def test_mount_unit() -> None:
    unit, run = started("pcache-mount.service")
    point = run.ctx.params["mountpoint"]
    assert not run.ctx.params["daemon"]  # the service's main process is the mount
    assert exec_argv(unit, "ExecStop") == ["/bin/fusermount3", "-u", point]
    assert f"mountpoint -q {point}" in value(unit, "Service", "ExecStartPost")
    assert exec_argv(unit, "ExecStartPre") == ["/bin/mkdir", "-p", point]
    assert "pcache-worker.service" in words(unit, "Unit", "After")
    assert "pcache-worker.service" in words(unit, "Unit", "Wants")
    assert not values(unit, "Unit", "Requires"), "a worker restart must not restart the mount"
    assert not values(unit, "Service", "User")  # root: allow_other


def test_babel_unit() -> None:
    unit, run = started("babel-daemon.service")
    assert run.ctx.command.name == "daemon"
    state = "/var/lib/" + value(unit, "Service", "StateDirectory")
    assert run.ctx.params["state_dir"] == state == unit_env(unit)["BABEL_STATE_DIR"]
    assert run.ctx.params["listen"].startswith("127.0.0.1:")  # the API has no authentication
    assert value(unit, "Service", "EnvironmentFile").startswith("-")
    assert all(v == "REPLACE_ME" for v in read_env_file(FILES["/etc/babel/babel.env"]).values())


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    scripts = sysconfig.get_path("scripts")
    if not all(Path(scripts, name).exists() for name in ("pcache", "pcache-mount", "babel")):
        pytest.skip(f"console scripts not in {scripts}")
    for path in UNITS:  # the executables where this interpreter installed them
        (tmp_path / path.name).write_text(path.read_text().replace(INSTALL_BIN, scripts + "/"))
    out = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / p.name) for p in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if ".service" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
