#!/usr/bin/env bash
# Install the project and what its tests need (idempotent). Runs as root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e '.[test,dev]'
