#!/usr/bin/env bash
# Start the arrival watcher: `dprelease watch` announces every complete new Parquet file under the
# landing folder to the server, for the specs with `trigger: arrival`.
#   deploy/start-watcher.sh [LANDING] [--foreground]
# LANDING: $DPRELEASE_LANDING, else <repo>/landing (created); specs: $DPRELEASE_SPECS, else
# <repo>/deploy/specs; poll interval: $DPRELEASE_WATCH_INTERVAL seconds (5).  Log:
# $DPRELEASE_HOME/run/watcher.log.  Its claims live in the catalog (DPRELEASE_HOME or
# DPRELEASE_CATALOG_URL), so start it with the same catalog settings as the worker.
set -euo pipefail
source "$(dirname "$0")/env.sh"
FOREGROUND=""
LANDING="${DPRELEASE_LANDING:-$DPRELEASE_ROOT/landing}"
for arg in "$@"; do
  case "$arg" in
    --foreground) FOREGROUND=1 ;;
    *) LANDING="$arg" ;;
  esac
done
SPECS="${DPRELEASE_SPECS:-$DPRELEASE_ROOT/deploy/specs}"
mkdir -p "$LANDING"
LANDING="$(cd "$LANDING" && pwd)"
healthy "$PREFECT_API_URL" || { echo "no Prefect server at $PREFECT_API_URL (deploy/start-server.sh)" >&2; exit 1; }
ARGS=(watch "$LANDING" --spec-dir "$SPECS" --interval "${DPRELEASE_WATCH_INTERVAL:-5}")
if [ -n "$FOREGROUND" ]; then
  exec "$DPRELEASE_VENV/bin/dprelease" "${ARGS[@]}"
fi
if registered watcher; then
  echo "watcher already running (pid $REG_PID, DPRELEASE_HOME=$REG_HOME); log: $REG_LOG"
  exit 0
fi
nohup "$DPRELEASE_VENV/bin/dprelease" "${ARGS[@]}" >>"$RUN_DIR/watcher.log" 2>&1 &
PID=$!
register watcher "$PID" "watch $LANDING" "$RUN_DIR/watcher.log" "$PREFECT_API_URL"
sleep 2
kill -0 "$PID" 2>/dev/null || { echo "watcher exited; see $RUN_DIR/watcher.log" >&2; exit 1; }
echo "watcher (pid $PID) announces new Parquet files under $LANDING (specs $SPECS); log: $RUN_DIR/watcher.log"
