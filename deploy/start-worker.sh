#!/usr/bin/env bash
# Start a process worker that runs dprelease deployments (pool dprelease-process by default,
# created if missing).  It inherits this environment: DPRELEASE_HOME / DPRELEASE_CATALOG_URL
# decide which catalog the releases charge.  Flow-run logs go to $DPRELEASE_HOME/run/worker.log.
# The worker runs with a Great Expectations validation service beside it (flows/worker_host.py:
# GX imported once per worker, not in every flow run; DPRELEASE_VALIDATION_SERVICE=off: none)
# and a run starter that forks each flow-run process from imports done once
# (flows/run_starter.py; DPRELEASE_RUN_STARTER=off: every run starts a fresh interpreter).
#   deploy/start-worker.sh              # in the background (recorded in $DPRELEASE_RUN_REGISTRY)
#   deploy/start-worker.sh --foreground
set -euo pipefail
source "$(dirname "$0")/env.sh"
healthy "$PREFECT_API_URL" || { echo "no Prefect server at $PREFECT_API_URL (deploy/start-server.sh)" >&2; exit 1; }
ARGS=(-m dprelease.flows.worker_host -- "$DPRELEASE_VENV/bin/prefect"
  worker start --pool "$DPRELEASE_POOL" --type process --install-policy never)
cd "$DPRELEASE_ROOT"
if [ "${1:-}" = "--foreground" ]; then
  exec "$DPRELEASE_VENV/bin/python" "${ARGS[@]}"
fi
if registered worker; then
  echo "worker already running (pid $REG_PID, DPRELEASE_HOME=$REG_HOME); log: $REG_LOG"
  exit 0
fi
nohup "$DPRELEASE_VENV/bin/python" "${ARGS[@]}" >>"$RUN_DIR/worker.log" 2>&1 &
PID=$!
register worker "$PID" "worker start --pool $DPRELEASE_POOL" "$RUN_DIR/worker.log" "$PREFECT_API_URL"
sleep 3
kill -0 "$PID" 2>/dev/null || { echo "worker exited; see $RUN_DIR/worker.log" >&2; exit 1; }
echo "worker (pid $PID) polls pool $DPRELEASE_POOL on $PREFECT_API_URL; log: $RUN_DIR/worker.log"
