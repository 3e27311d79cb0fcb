"""Run the main job once, in this process, the way ``ngsi-assets materialize`` does; for the mode tests.

    python -m tests.cluster.run_main_job OUTCOME_JSON

Everything comes from the environment, as for a user (``NGSI_SPARK_MASTER`` or ``NGSI_SPARK_REMOTE``,
``NGSI_LANDING_ROOT``, ``NGSI_LAKE_ROOT``, the SQL sink URLs, ``DAGSTER_HOME``). One thing differs: the
transaction history's commit time is fixed, because tnx, uuids and commit times are *defined* by the
wall clock, and the test compares every table of runs made minutes apart.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime

import ngsi_assets.history_store
from ngsi_assets.definitions import build_definitions, build_resources
from ngsi_assets.materialize import landed_hours, run_ingest

COMMIT_TIME = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def main(outcome_path: str) -> int:
    # The history store's default clock, read when a store is made.
    ngsi_assets.history_store.utc_now = lambda: COMMIT_TIME
    resources = build_resources()
    defs = build_definitions(resources)
    hours = landed_hours(resources["landing"])
    outcome = run_ingest(defs, hours[0], hours[-1])
    spark = resources["spark"].spark_session
    mode = "connect" if spark.__class__.__module__.startswith("pyspark.sql.connect") else spark.conf.get("spark.master")
    with open(outcome_path, "w") as f:
        json.dump({**asdict(outcome), "session": mode}, f)
    return 0 if outcome.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
