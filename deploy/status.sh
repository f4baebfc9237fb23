#!/usr/bin/env bash
# Which of the server, worker and watcher started by deploy/start-*.sh run (from the run
# registry): pid, DPRELEASE_HOME, log, and whether the server answers.  Exit 0 if all three run.
set -euo pipefail
source "$(dirname "$0")/env.sh"
missing=0
for name in server worker watcher; do
  if registered "$name"; then
    extra=""
    if [ "$name" = server ]; then
      if healthy "$REG_URL"; then extra=" healthy $REG_URL"; else extra=" NOT answering at $REG_URL"; fi
    fi
    echo "$name: running (pid $REG_PID, DPRELEASE_HOME=$REG_HOME, log $REG_LOG)$extra"
  else
    echo "$name: not running"
    missing=1
  fi
done
exit "$missing"
