#!/usr/bin/env bash
# The main job (`make demo`): on a fresh Debian 12 machine, set up .venv, then generate a city of
# NGSI notifications, post them over HTTP to the receiver, and materialize message_store and
# ngsi_events with Spark on the embedded default (local Spark, SQLite Dagster instance, local lake).
# Arguments go to `python -m ngsi_assets.demo.run` (e.g. --notifications 20000 --hours 6).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

prepare_runtime
# Spark's launcher starts every JVM with --add-modules=jdk.incubator.vector (JavaModuleOptions, not
# configurable), and the JVM then prints one "Using incubator modules" line that asks nothing of a
# user; exactly that line is dropped.
exec .venv/bin/python -m ngsi_assets.demo.run "$@" \
    2> >(grep -v -x "WARNING: Using incubator modules: jdk.incubator.vector" >&2)
