"""On a shared Spark Connect server, each run's jobs are scheduled in the pool its lane tag names.

The server schedules FAIR over the pools of ``resources/spark_pools.xml``; the increments' pool is
served first, so a derived run's long jobs do not hold the last-data tables back.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from ngsi_assets.sensors import DERIVED_LANE, INGEST_LANE
from ngsi_assets.spark_servers import connect_server_command
from resources.spark import BACKGROUND_POOL, FRESH_POOL, POOLS_FILE, pool_for_tags, scheduler_config
from tests.support.snippets import run_snippet
from tests.support.spark_servers import connect_url  # noqa: F401 (fixture)

# One Dagster run of a one-asset job with the platform's Spark resource and the given run tags; prints
# the session it used, the pool its session names, and the pool a task of its job was submitted in.
RUN = """
import json, sys
from dagster import asset, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import functions as F
from pyspark.sql.types import StringType
from ngsi_assets.definitions import build_resources

def pool_of_task(_):
    from pyspark import TaskContext
    return TaskContext.get().getLocalProperty("spark.scheduler.pool")

@asset
def probe(spark: LazyPySparkResource):
    session = spark.spark_session
    task_pool = session.range(1).select(F.udf(pool_of_task, StringType())("id")).first()[0]
    return {
        "session": session.client._session_id,
        "conf_pool": session.conf.get("spark.scheduler.pool", None),
        "task_pool": task_pool,
    }

tags = json.loads(sys.argv[1])
result = materialize([probe], resources={"spark": build_resources()["spark"]}, tags=tags)
print(json.dumps(result.output_for_node("probe")))
"""


def run_with_tags(url: str, tags: dict[str, str]) -> dict:
    return run_snippet(RUN, json.dumps(tags), env={"NGSI_SPARK_REMOTE": url})


def test_the_first_tag_the_run_carries_names_its_pool() -> None:
    pools = {INGEST_LANE: FRESH_POOL, DERIVED_LANE: BACKGROUND_POOL}
    assert pool_for_tags(pools, {INGEST_LANE: "1"}) == FRESH_POOL
    assert pool_for_tags(pools, {DERIVED_LANE: "1"}) == BACKGROUND_POOL
    # A whole-hour run carries both lanes: it brings last data too.
    assert pool_for_tags(pools, {DERIVED_LANE: "1", INGEST_LANE: "1"}) == FRESH_POOL
    assert pool_for_tags(pools, {"dagster/backfill": "x"}) is None


def test_the_pools_file_defines_the_pools_the_runs_name() -> None:
    pools = {p.get("name"): p for p in ET.parse(POOLS_FILE).getroot().iter("pool")}
    assert {FRESH_POOL, BACKGROUND_POOL} <= set(pools)

    def number(pool: str, field: str) -> int:
        return int(pools[pool].findtext(field, "0"))

    # Always below its share, so always served first, on any cluster size.
    assert number(FRESH_POOL, "minShare") >= 10_000
    assert number(BACKGROUND_POOL, "minShare") == 0
    assert number(FRESH_POOL, "weight") > number(BACKGROUND_POOL, "weight")


def test_the_platforms_connect_server_schedules_fair_over_the_pools_file() -> None:
    cmd = connect_server_command(15002)
    conf = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")
    assert conf["spark.scheduler.mode"] == "FAIR"
    assert (
        conf["spark.scheduler.allocation.file"]
        == POOLS_FILE.as_uri()
        == scheduler_config()["spark.scheduler.allocation.file"]
    )
    assert POOLS_FILE.is_file()


@pytest.mark.cluster
def test_each_lane_runs_its_jobs_in_its_pool_on_a_session_of_its_own(connect_url: str) -> None:  # noqa: F811
    increment = run_with_tags(connect_url, {INGEST_LANE: "1"})
    derived = run_with_tags(connect_url, {DERIVED_LANE: "1"})
    manual = run_with_tags(connect_url, {})
    # The pool reaches the tasks: the server submitted the run's job in it.
    assert (increment["conf_pool"], increment["task_pool"]) == (FRESH_POOL, FRESH_POOL)
    assert (derived["conf_pool"], derived["task_pool"]) == (BACKGROUND_POOL, BACKGROUND_POOL)
    assert manual["conf_pool"] is None and manual["task_pool"] in (None, "default")
    # The pool is a session setting: the lanes share a session each, not one between them.
    assert len({increment["session"], derived["session"], manual["session"]}) == 3
