#!/usr/bin/env bash
# Start a local Prefect server for dprelease deployments (schedules, arrival triggers, pauses for
# review and concurrency limits all need one).  Default: http://127.0.0.1:4200, SQLite in
# $DPRELEASE_HOME/prefect; PostgreSQL: see deploy/README.md.
#   deploy/start-server.sh              # in the background; pid and log in $DPRELEASE_HOME/run
#   deploy/start-server.sh --foreground # in this terminal (containers, systemd)
set -euo pipefail
source "$(dirname "$0")/env.sh"
ARGS=(server start --host "$DPRELEASE_SERVER_HOST" --port "$DPRELEASE_SERVER_PORT" --analytics-off)
if [ "${1:-}" = "--foreground" ]; then
  exec "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}"
fi
PIDFILE="$RUN_DIR/server.pid"
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "Prefect server already running (pid $(cat "$PIDFILE")): $PREFECT_API_URL"
  exit 0
fi
nohup "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}" >"$RUN_DIR/server.log" 2>&1 &
echo $! >"$PIDFILE"
# A fresh database runs its migrations first: 16-30 s measured on 2 busy cores.
for _ in $(seq 1 240); do
  if healthy "$PREFECT_API_URL"; then
    echo "Prefect server (pid $(cat "$PIDFILE")) is up: UI http://$DPRELEASE_SERVER_HOST:$DPRELEASE_SERVER_PORT"
    echo "  export PREFECT_API_URL=$PREFECT_API_URL"
    exit 0
  fi
  kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { echo "server exited; see $RUN_DIR/server.log" >&2; exit 1; }
  sleep 0.5
done
echo "server not healthy after 120 s; see $RUN_DIR/server.log" >&2
exit 1
