#!/usr/bin/env bash
# Stop the worker, then the server, started by deploy/start-*.sh (by their pid files).
# A worker ignores SIGTERM: stop_pid escalates to SIGINT, then SIGKILL (bounded waits).
set -euo pipefail
source "$(dirname "$0")/env.sh"
stop_pid worker "$RUN_DIR/worker.pid"
stop_pid "Prefect server" "$RUN_DIR/server.pid"
