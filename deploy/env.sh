# Shared settings of the deploy/ scripts (sourced, not run).  Override any of them in the
# environment.  State lives under $DPRELEASE_HOME (default: <repo>/.dprelease), as for the CLI.
DPRELEASE_ROOT="${DPRELEASE_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
DPRELEASE_HOME="${DPRELEASE_HOME:-$DPRELEASE_ROOT/.dprelease}"
DPRELEASE_VENV="${DPRELEASE_VENV:-$DPRELEASE_ROOT/.venv}"
DPRELEASE_SERVER_HOST="${DPRELEASE_SERVER_HOST:-127.0.0.1}"
DPRELEASE_SERVER_PORT="${DPRELEASE_SERVER_PORT:-4200}"
DPRELEASE_POOL="${DPRELEASE_POOL:-dprelease-process}"
RUN_DIR="$DPRELEASE_HOME/run"                       # logs of the scripts (worker.log: flow logs)
# What the scripts started, per checkout and independent of DPRELEASE_HOME (which may change
# between start and stop): one NAME.run file per process with its pid and start time.
RUN_REGISTRY="${DPRELEASE_RUN_REGISTRY:-$DPRELEASE_ROOT/.dprelease-run}"
export DPRELEASE_ROOT DPRELEASE_HOME
export PREFECT_HOME="${PREFECT_HOME:-$DPRELEASE_HOME/prefect}"
export PREFECT_API_URL="${PREFECT_API_URL:-http://$DPRELEASE_SERVER_HOST:$DPRELEASE_SERVER_PORT/api}"
export DO_NOT_TRACK=1                               # no SDK telemetry
export PREFECT_SERVER_ANALYTICS_ENABLED=false       # no server telemetry
export PYTHONPATH="$DPRELEASE_ROOT${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RUN_DIR" "$PREFECT_HOME"

# healthy URL -> exit 0 when GET URL/health answers true (no curl needed); a server busy on a
# loaded 2-core machine can take several seconds to answer (an absent one is refused at once)
healthy() {
  "$DPRELEASE_VENV/bin/python" - "$1" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/health", timeout=10) as response:
        sys.exit(0 if json.loads(response.read()) is True else 1)
except (OSError, ValueError):
    sys.exit(1)
PY
}

# proc_start PID -> the process's start time (clock ticks since boot, /proc/PID/stat field 22)
proc_start() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  echo "${20}"
}

# register NAME PID MARKER LOG [URL] -> record a started process in $RUN_REGISTRY/NAME.run
register() {
  mkdir -p "$RUN_REGISTRY"
  printf 'pid=%s\nstart=%s\nmarker=%s\nhome=%s\nprefect_home=%s\nlog=%s\nurl=%s\n' \
    "$2" "$(proc_start "$2")" "$3" "$DPRELEASE_HOME" "$PREFECT_HOME" "$4" "${5:-}" \
    >"$RUN_REGISTRY/$1.run.tmp"
  mv "$RUN_REGISTRY/$1.run.tmp" "$RUN_REGISTRY/$1.run"
}

# registered NAME -> exit 0 and set REG_PID REG_HOME REG_PREFECT_HOME REG_LOG REG_URL when the
# recorded process still runs: same pid, same start time and its command line holds the marker.
# A stale entry (process gone, or the pid now belongs to another program) is removed.
registered() {
  local file="$RUN_REGISTRY/$1.run" key value start="" marker="" line
  REG_PID="" REG_HOME="" REG_PREFECT_HOME="" REG_LOG="" REG_URL=""
  [ -f "$file" ] || return 1
  while IFS='=' read -r key value; do
    case "$key" in
      pid) REG_PID="$value" ;; start) start="$value" ;; marker) marker="$value" ;;
      home) REG_HOME="$value" ;; prefect_home) REG_PREFECT_HOME="$value" ;;
      log) REG_LOG="$value" ;; url) REG_URL="$value" ;;
    esac
  done <"$file"
  line="$(tr '\0' ' ' <"/proc/$REG_PID/cmdline" 2>/dev/null || true)"
  if [ -n "$REG_PID" ] && [ -n "$start" ] && [ "$(proc_start "$REG_PID" || true)" = "$start" ] \
    && [[ "$line" == *"$marker"* ]]; then
    return 0
  fi
  rm -f "$file"
  return 1
}

# stop_registered NAME LABEL -> SIGTERM, then SIGINT (a Prefect worker does not stop on SIGTERM;
# on a second interrupt it SIGKILLs itself), then SIGKILL, to the recorded process only (never
# one it cannot prove it started)
stop_registered() {
  local name="$1" label="$2" pid step signal ticks
  if ! registered "$name"; then
    echo "$label: not running (nothing recorded in $RUN_REGISTRY)"
    return 0
  fi
  pid="$REG_PID"
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
    echo "$label (pid $pid) did not stop" >&2
    return 1
  fi
  rm -f "$RUN_REGISTRY/$name.run"
  echo "$label (pid $pid, DPRELEASE_HOME=$REG_HOME) stopped"
}
