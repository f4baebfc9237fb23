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
# The editable source too: uv compiles site-packages only, and every command, flow run and
# validation service imports these packages (0.2-0.3 CPU-s more per process without .pyc files).
.venv/bin/python -m compileall -q -j 0 flows tasks catalog mechanisms
# A migrated, empty Prefect database in the user cache: the first command then starts its local
# server in seconds instead of migrating (~15 s). A failure here only costs that time later.
.venv/bin/dprelease server prepare || echo "note: Prefect database not prepared; the first command will migrate it"
echo "dprelease installed in $(pwd)/.venv"
