# Shared settings of the deploy/ scripts (sourced, not run).  Override any of them in the
# environment.  State lives under $DPRELEASE_HOME (default: <repo>/.dprelease), as for the CLI.
DPRELEASE_ROOT="${DPRELEASE_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
DPRELEASE_HOME="${DPRELEASE_HOME:-$DPRELEASE_ROOT/.dprelease}"
DPRELEASE_VENV="${DPRELEASE_VENV:-$DPRELEASE_ROOT/.venv}"
DPRELEASE_SERVER_HOST="${DPRELEASE_SERVER_HOST:-127.0.0.1}"
DPRELEASE_SERVER_PORT="${DPRELEASE_SERVER_PORT:-4200}"
DPRELEASE_POOL="${DPRELEASE_POOL:-dprelease-process}"
RUN_DIR="$DPRELEASE_HOME/run"                       # pid files and logs of the scripts
export DPRELEASE_ROOT DPRELEASE_HOME
export PREFECT_HOME="${PREFECT_HOME:-$DPRELEASE_HOME/prefect}"
export PREFECT_API_URL="${PREFECT_API_URL:-http://$DPRELEASE_SERVER_HOST:$DPRELEASE_SERVER_PORT/api}"
export DO_NOT_TRACK=1                               # no SDK telemetry
export PREFECT_SERVER_ANALYTICS_ENABLED=false       # no server telemetry
mkdir -p "$RUN_DIR" "$PREFECT_HOME"

# healthy URL -> exit 0 when GET URL/health answers true (no curl needed)
healthy() {
  "$DPRELEASE_VENV/bin/python" - "$1" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as response:
        sys.exit(0 if json.loads(response.read()) is True else 1)
except (OSError, ValueError):
    sys.exit(1)
PY
}

# stop_pid NAME PIDFILE -> SIGTERM, then SIGINT (a Prefect worker ignores SIGTERM), then SIGKILL
stop_pid() {
  local name="$1" pidfile="$2" pid step signal ticks
  [ -f "$pidfile" ] || { echo "$name: not running (no $pidfile)"; return 0; }
  pid="$(cat "$pidfile")"
  for step in TERM:10 INT:40 KILL:10; do   # signal:half-seconds to wait (5 s, 20 s, 5 s)
    signal="${step%%:*}" ticks="${step##*:}"
    kill -0 "$pid" 2>/dev/null || break
    kill "-$signal" "$pid" 2>/dev/null || true
    for _ in $(seq 1 "$ticks"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name (pid $pid) did not stop" >&2
    return 1
  fi
  rm -f "$pidfile"
  echo "$name (pid $pid) stopped"
}
