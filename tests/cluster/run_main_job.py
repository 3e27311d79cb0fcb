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
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ngsi_assets.definitions import build_definitions, build_resources
from ngsi_assets.materialize import landed_hours, run_ingest
from resources.history import HistoryStore, TransactionHistoryResource
from resources.lake import LakeResource

COMMIT_TIME = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


class FixedClockHistory(TransactionHistoryResource):
    def store(
        self, spark: SparkSession, lake: LakeResource, clock: Callable[[], datetime] | None = None
    ) -> HistoryStore:
        return super().store(spark, lake, clock=lambda: COMMIT_TIME)


def main(outcome_path: str) -> int:
    resources = build_resources()
    base = resources["history"]
    resources["history"] = FixedClockHistory(postgres_url=base.postgres_url, schema_name=base.schema_name)
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
