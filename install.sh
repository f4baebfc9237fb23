#!/usr/bin/env bash
# Install dprelease and its pinned dependencies into ./.venv (needs only Python 3.11 and pip).
# uv installs the pinned set in ~30 s; --compile-bytecode matters where PYTHONDONTWRITEBYTECODE=1
# is set (importing prefect + great_expectations is twice as slow without .pyc files).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check uv
.venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode -r requirements.txt -e .
echo "dprelease installed in $(pwd)/.venv"
