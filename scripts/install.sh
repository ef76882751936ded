#!/usr/bin/env bash
# Install the project and what its tests need (idempotent). Runs as root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# FUSE for pcache-mount and its tests (Debian packages; needs root)
if ! command -v fusermount3 >/dev/null 2>&1 || ! ldconfig -p | grep -q libfuse3; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 >/dev/null
  else
    echo "install.sh: fuse3 missing and cannot apt-get it; FUSE tests will be skipped" >&2
  fi
fi
# etcd for the master leader election and its tests (Debian package etcd-server; needs root)
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    systemctl disable --now etcd >/dev/null 2>&1 || true  # the package's own service is not ours
  else
    echo "install.sh: etcd missing and cannot apt-get it; election tests will be skipped" >&2
  fi
fi
# A C compiler and perl's prove for the vendored pjdfstest suites (tests/fuse_client/pjdfstest)
if ! command -v cc >/dev/null 2>&1 || ! command -v prove >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev perl >/dev/null
  else
    echo "install.sh: cc or prove missing and cannot apt-get them; pjdfstest will be skipped" >&2
  fi
fi
# PyTorch: the CPU build (2.13.0) first, so the range in pyproject.toml pulls nothing bigger
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "torch==2.13.0"
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[test,dev]'
