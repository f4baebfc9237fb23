#!/usr/bin/env bash
# Stop the watcher, the worker, then the server started by deploy/start-*.sh, as recorded in the
# run registry ($DPRELEASE_RUN_REGISTRY, default <repo>/.dprelease-run): it finds them whatever
# DPRELEASE_HOME is now, and signals only a process whose pid, start time and command line match
# the record.  A worker does not stop on SIGTERM: stop_registered escalates to SIGINT, then SIGKILL.
set -euo pipefail
source "$(dirname "$0")/env.sh"
stop_registered watcher watcher
stop_registered worker worker
if registered server && [ -n "$REG_PREFECT_HOME" ]; then
  rm -f "$REG_PREFECT_HOME/deploy-server.json"
fi
stop_registered server "Prefect server"
