#!/usr/bin/env bash
# Start a process worker that runs dprelease deployments (pool dprelease-process by default,
# created if missing).  It inherits this environment: DPRELEASE_HOME / DPRELEASE_CATALOG_URL
# decide which catalog the releases charge.
#   deploy/start-worker.sh              # in the background; pid and log in $DPRELEASE_HOME/run
#   deploy/start-worker.sh --foreground
set -euo pipefail
source "$(dirname "$0")/env.sh"
healthy "$PREFECT_API_URL" || { echo "no Prefect server at $PREFECT_API_URL (deploy/start-server.sh)" >&2; exit 1; }
ARGS=(worker start --pool "$DPRELEASE_POOL" --type process --install-policy never)
cd "$DPRELEASE_ROOT"
if [ "${1:-}" = "--foreground" ]; then
  exec "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}"
fi
PIDFILE="$RUN_DIR/worker.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "worker already running (pid $(cat "$PIDFILE"))"
  exit 0
fi
nohup "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}" >"$RUN_DIR/worker.log" 2>&1 &
echo $! >"$PIDFILE"
sleep 3
kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "worker exited; see $RUN_DIR/worker.log" >&2; exit 1; }
echo "worker (pid $(cat "$PIDFILE")) polls pool $DPRELEASE_POOL on $PREFECT_API_URL; log: $RUN_DIR/worker.log"
