#!/usr/bin/env bash
# `make dev`: the receiver on :5050, a Spark Connect server on :15002 that every run shares, the
# Dagster UI on :3000 with the landing sensor running, on the embedded default (.data/ for landing
# and lake, .dagster_home for the SQLite instance), and, when NGSI_MONGO_URL is set, the STH-Comet
# read API on :8666.
# Post notifications to http://127.0.0.1:5050/notify (e.g. from an Orion subscription) and watch
# the sensor request runs for the hours they land in. Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

prepare_runtime

export NGSI_DATA_ROOT=${NGSI_DATA_ROOT:-$(pwd)/.data}
export NGSI_LANDING_ROOT=${NGSI_LANDING_ROOT:-$NGSI_DATA_ROOT/landing}
export NGSI_LAKE_ROOT=${NGSI_LAKE_ROOT:-$NGSI_DATA_ROOT/lake}
export DAGSTER_HOME=${DAGSTER_HOME:-$(pwd)/.dagster_home}
mkdir -p "$DAGSTER_HOME" "$NGSI_LANDING_ROOT" "$NGSI_DATA_ROOT"
[[ -f $DAGSTER_HOME/dagster.yaml ]] || cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"
# The instance's storage created (or migrated after a Dagster upgrade) once, before the UI and the
# daemon open it side by side: two first openings of a fresh SQLite storage at once can stamp its
# version twice, after which every opening fails (dagster-io/dagster#27390).
.venv/bin/dagster instance migrate >/dev/null

# Each service in a process group of its own, stopped group by group (politely, then by force) when
# this script ends, however it ends: a launcher script's JVM and dagster dev's children go with them.
pids=()
stop_all() {
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for _ in $(seq 40); do
        local alive=0
        for pid in "${pids[@]}"; do
            kill -0 -- "-$pid" 2>/dev/null && alive=1
        done
        [[ $alive -eq 0 ]] && return 0
        sleep 0.5
    done
    for pid in "${pids[@]}"; do
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
}
trap stop_all EXIT
trap 'stop_all; exit 130' INT TERM
# One warm Spark for every run the sensors start: a local Spark Connect server (its work on
# NGSI_SPARK_MASTER, default local[*]), unless NGSI_SPARK_REMOTE already names a server to use.
if [[ -z ${NGSI_SPARK_REMOTE:-} ]]; then
    connect_port=${NGSI_SPARK_CONNECT_PORT:-15002}
    setsid .venv/bin/ngsi-assets spark connect-server --port "$connect_port" \
        --master "${NGSI_SPARK_MASTER:-local[*]}" --log-dir "$NGSI_DATA_ROOT/spark" \
        >"$NGSI_DATA_ROOT/spark-connect.log" 2>&1 &
    pids+=($!)
    export NGSI_SPARK_REMOTE="sc://127.0.0.1:$connect_port"
    for _ in $(seq 240); do
        (exec 3<>"/dev/tcp/127.0.0.1/$connect_port") 2>/dev/null && break
        kill -0 "${pids[-1]}" 2>/dev/null || { log "the Spark Connect server exited; see $NGSI_DATA_ROOT/spark-connect.log"; exit 1; }
        sleep 0.5
    done
    log "Spark Connect server on $NGSI_SPARK_REMOTE (log: $NGSI_DATA_ROOT/spark-connect.log)"
    # A new server compiles Spark's code as the first runs use it (those are several times slower):
    # a few runs on a throwaway sample pay that, beside the platform's first runs.
    warm_up_runs=${NGSI_SPARK_WARM_UP_RUNS:-3}
    if [[ $warm_up_runs -gt 0 ]]; then
        setsid .venv/bin/ngsi-assets spark warm-up --runs "$warm_up_runs" \
            >"$NGSI_DATA_ROOT/spark-warm-up.log" 2>&1 &
        pids+=($!)
        log "warming the Spark Connect server up with $warm_up_runs runs (log: $NGSI_DATA_ROOT/spark-warm-up.log)"
    fi
fi

setsid .venv/bin/ngsi-assets serve --host "${NGSI_RECEIVER_HOST:-127.0.0.1}" --port "${NGSI_RECEIVER_PORT:-5050}" \
    --landing-root "$NGSI_LANDING_ROOT" &
pids+=($!)
log "receiver on http://${NGSI_RECEIVER_HOST:-127.0.0.1}:${NGSI_RECEIVER_PORT:-5050} (pid ${pids[-1]})"
# The STH-Comet read API beside the receiver, over the MongoDB the STH and raw sinks write to.
if [[ -n ${NGSI_MONGO_URL:-} ]]; then
    setsid .venv/bin/ngsi-assets sth-api --host "${NGSI_STH_API_HOST:-127.0.0.1}" --port "${NGSI_STH_API_PORT:-8666}" &
    pids+=($!)
    log "STH API on http://${NGSI_STH_API_HOST:-127.0.0.1}:${NGSI_STH_API_PORT:-8666} (pid ${pids[-1]})"
else
    log "STH API not started: set NGSI_MONGO_URL (the MongoDB the STH aggregates are published to)"
fi
setsid .venv/bin/dagster dev -w workspace.yaml -h "${DAGSTER_UI_HOST:-127.0.0.1}" -p "${DAGSTER_UI_PORT:-3000}" &
pids+=($!)
wait "${pids[-1]}"
