"""Every module of the project imports on its own, in a fresh interpreter (no import cycles).

A cycle shows only when the cycle's far end is imported first (``python -c "import
pcache.cli.fs"`` failed while ``pcache`` itself worked), so each module is imported first, in a
child forked from an interpreter that has loaded only third-party libraries.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pcache", "babel", "objstore", "fuse_client", "ckpt_adapter", "trainer_ref")

# Forks one child per module from an interpreter that has only the heavy third-party libraries
# loaded (so each child is fast), and prints each failure's traceback.
_PROBE = r"""
import importlib, os, sys, traceback
for lib in ("torch", "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict", "numpy", "grpc",
            "google.protobuf", "botocore", "aiobotocore.session", "boto3", "click", "rich.progress", "mfusepy", "rocksdict",
            "tenacity", "prometheus_client", "cachetools", "uvloop", "aiohttp", "tokenizers", "fsspec"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not any(m.split(".")[0] in {packages} for m in sys.modules), "a project module was loaded before the probe"
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name)
print("FAILED:" + ",".join(failed))
"""


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__main__":
                continue  # running it is its job
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = _modules()
    assert len(modules) > 60 and "pcache.cli.fs" in modules and "babel.cli.sync" in modules
    probe = _PROBE.replace("{packages}", repr(set(PACKAGES)))
    proc = subprocess.run(
        [sys.executable, "-c", probe, *modules], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    failed = proc.stdout.strip().rpartition("FAILED:")[2]
    assert failed == "", f"modules that do not import on their own: {failed}\n{proc.stderr[-6000:]}"


# what each package may load of the project's others: objstore sits below pcache and babel, and
# pcache never loads babel (babel's pcache:// backend loads pcache)
LAYERS = {"objstore": set(), "pcache": {"objstore"}}


def test_objstore_sits_below_pcache_and_babel() -> None:
    for package, allowed in LAYERS.items():
        modules = [m for m in _modules() if m.split(".")[0] == package]
        assert len(modules) >= 5, package
        probe = (
            "import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
        )
        proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        loaded = set(proc.stdout.split()) & set(PACKAGES)
        assert loaded - {package} <= allowed, f"{package} loads {sorted(loaded - {package} - allowed)}"
