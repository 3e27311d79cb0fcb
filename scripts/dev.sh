#!/usr/bin/env bash
# `make dev`: the receiver on :5050 and the Dagster UI on :3000 with the landing sensor running,
# on the embedded default (.data/ for landing and lake, .dagster_home for the SQLite instance).
# Post notifications to http://127.0.0.1:5050/notify (e.g. from an Orion subscription) and watch
# the sensor request runs for the hours they land in. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

prepare_runtime

export NGSI_DATA_ROOT=${NGSI_DATA_ROOT:-$(pwd)/.data}
export NGSI_LANDING_ROOT=${NGSI_LANDING_ROOT:-$NGSI_DATA_ROOT/landing}
export NGSI_LAKE_ROOT=${NGSI_LAKE_ROOT:-$NGSI_DATA_ROOT/lake}
export DAGSTER_HOME=${DAGSTER_HOME:-$(pwd)/.dagster_home}
mkdir -p "$DAGSTER_HOME" "$NGSI_LANDING_ROOT"
[[ -f $DAGSTER_HOME/dagster.yaml ]] || cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

.venv/bin/ngsi-assets serve --host "${NGSI_RECEIVER_HOST:-127.0.0.1}" --port "${NGSI_RECEIVER_PORT:-5050}" \
    --landing-root "$NGSI_LANDING_ROOT" &
receiver=$!
trap 'kill "$receiver" 2>/dev/null; wait "$receiver" 2>/dev/null' EXIT
log "receiver on http://${NGSI_RECEIVER_HOST:-127.0.0.1}:${NGSI_RECEIVER_PORT:-5050} (pid $receiver)"
.venv/bin/dagster dev -w workspace.yaml -h "${DAGSTER_UI_HOST:-127.0.0.1}" -p "${DAGSTER_UI_PORT:-3000}"
