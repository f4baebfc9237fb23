#!/usr/bin/env bash
# Save the Prefect notification block that tells reviewers a release is staged (see
# deploy/NOTIFICATIONS.md), on the server at $PREFECT_API_URL (default: the one start-server.sh runs).
#   deploy/setup-notifications.sh NAME URL [NAME:VALUE header ...]
#   e.g. deploy/setup-notifications.sh dprelease-reviewers https://chat.example.org/hooks/abc
# then name it in a spec:  review: {approvers: 2, notify: custom-webhook/NAME}
# Re-running replaces the block of that name (a new URL or headers take effect at the next release).
set -euo pipefail
if [ "$#" -lt 2 ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
source "$(dirname "$0")/env.sh"
NAME="$1" URL="$2"
shift 2
ARGS=(notify webhook "$NAME" --url "$URL" --overwrite)
for header in "$@"; do
  ARGS+=(--header "$header")
done
exec "$DPRELEASE_VENV/bin/dprelease" "${ARGS[@]}"
