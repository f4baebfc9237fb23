#!/usr/bin/env bash
# Start a local Prefect server for dprelease deployments (schedules, arrival triggers, pauses for
# review and concurrency limits all need one).  Default: http://127.0.0.1:4200, SQLite in
# $PREFECT_HOME ($DPRELEASE_HOME/prefect); PostgreSQL: see deploy/README.md.
#   deploy/start-server.sh              # in the background; log in $DPRELEASE_HOME/run/server.log
#   deploy/start-server.sh --foreground # in this terminal (containers, systemd)
# One Prefect server per database: it refuses to start while the shared server of `dprelease
# run`/`demo` serves the same $PREFECT_HOME (stop that one first: `dprelease server stop`), and
# those commands use this server instead of starting their own while it runs.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ARGS=(server start --host "$DPRELEASE_SERVER_HOST" --port "$DPRELEASE_SERVER_PORT" --analytics-off)
PY="$DPRELEASE_VENV/bin/python"
if shared="$("$PY" -m dprelease.flows.server shared-server --home "$DPRELEASE_HOME" --prefect-home "$PREFECT_HOME")"; then
  echo "the shared dprelease server (pid ${shared%% *}, ${shared#* }) already serves the Prefect" \
    "database in $PREFECT_HOME; one server per database: stop it first with" \
    "\`DPRELEASE_HOME=$DPRELEASE_HOME dprelease server stop\`, then run this again" >&2
  exit 3
fi
# A default (SQLite) database starts from the migrated copy install.sh prepared, if there is one.
if [ -z "${PREFECT_API_DATABASE_CONNECTION_URL:-}${PREFECT_SERVER_DATABASE_CONNECTION_URL:-}" ]; then
  "$PY" -m dprelease.flows.server seed-database --prefect-home "$PREFECT_HOME" || true
fi
if [ "${1:-}" = "--foreground" ]; then
  printf '{"pid": %s, "start": "%s", "url": "%s"}\n' "$$" "$(proc_start $$)" "$PREFECT_API_URL" \
    >"$PREFECT_HOME/deploy-server.json"
  exec "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}"
fi
if registered server; then
  echo "Prefect server already running (pid $REG_PID, DPRELEASE_HOME=$REG_HOME): $REG_URL"
  exit 0
fi
nohup "$DPRELEASE_VENV/bin/prefect" "${ARGS[@]}" >"$RUN_DIR/server.log" 2>&1 &
PID=$!
register server "$PID" "server start --host $DPRELEASE_SERVER_HOST --port $DPRELEASE_SERVER_PORT" \
  "$RUN_DIR/server.log" "$PREFECT_API_URL"
# dprelease commands on this PREFECT_HOME find it here and use it (one server per database)
printf '{"pid": %s, "start": "%s", "url": "%s"}\n' "$PID" "$(proc_start "$PID")" "$PREFECT_API_URL" \
  >"$PREFECT_HOME/deploy-server.json"
# A fresh database runs its migrations first: 16-30 s measured on 2 busy cores.
for _ in $(seq 1 240); do
  if healthy "$PREFECT_API_URL"; then
    echo "Prefect server (pid $PID) is up: UI http://$DPRELEASE_SERVER_HOST:$DPRELEASE_SERVER_PORT"
    echo "  export PREFECT_API_URL=$PREFECT_API_URL"
    exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { echo "server exited; see $RUN_DIR/server.log" >&2; exit 1; }
  sleep 0.5
done
echo "server not healthy after 120 s; see $RUN_DIR/server.log" >&2
exit 1
