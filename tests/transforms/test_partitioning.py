"""``cluster_by`` keeps its exchange where Spark drops a plain ``repartition`` as redundant (input already
hash-partitioned by the same columns), and the fold of the versioned entities uses it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.transforms.partitioning import cluster_by
from ngsi_assets.transforms.versioned_entities import ENTITY_RECORDS, fold_versions
from tests.support.spark import physical_plan, session_settings

pytestmark = pytest.mark.spark

# Static planning only, and no broadcast: a join on guid is a sort-merge join whose output is
# hash-partitioned by guid, the case in which Spark's EnsureRequirements drops a repartition("guid").
_PLANNING = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"}


@pytest.fixture
def static_planning(spark: SparkSession) -> Iterator[SparkSession]:
    with session_settings(spark, _PLANNING) as session:
        yield session


def partitioned_by_guid(spark: SparkSession) -> DataFrame:
    left = spark.createDataFrame([(f"g{i}", i) for i in range(20)], "guid string, n int")
    right = spark.createDataFrame([(f"g{i}",) for i in range(0, 20, 2)], "guid string")
    return left.join(right, "guid", "left_semi")


def test_a_plain_repartition_of_partitioned_input_is_dropped(static_planning: SparkSession) -> None:
    """The hazard ``cluster_by`` exists for: no exchange of the repartition is left in the plan."""
    plan = physical_plan(partitioned_by_guid(static_planning).repartition("guid"))
    assert "SortMergeJoin" in plan
    assert "REPARTITION_BY_COL" not in plan


@pytest.mark.parametrize("partitions", [None, 3])
def test_cluster_by_keeps_its_exchange(static_planning: SparkSession, partitions: int | None) -> None:
    df = cluster_by(partitioned_by_guid(static_planning), "guid", partitions=partitions)
    plan = physical_plan(df)
    assert ("REPARTITION_BY_NUM" if partitions else "REPARTITION_BY_COL") in plan
    assert "xxhash64" in plan
    # Every key in exactly one partition.
    spread = df.withColumn("p", F.spark_partition_id()).groupBy("guid").agg(F.countDistinct("p").alias("parts"))
    assert {r["parts"] for r in spread.collect()} == {1}
    assert df.count() == 10


def test_cluster_by_needs_a_column(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="at least one column"):
        cluster_by(spark.range(1))


def test_the_fold_clusters_its_input_even_when_already_partitioned(static_planning: SparkSession) -> None:
    """The fold's input came from a join on guid (as in ``VersioningRun.process``): its own exchange stays."""
    spark = static_planning
    at = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    records = spark.createDataFrame(
        [
            ("Car", f"g{i}", f"g{i}", at, "m1", 0, "upsert", 0, {"id": f"g{i}"}, {}, ["id"], "2026-03-01-10", 1)
            for i in range(20)
        ],
        ENTITY_RECORDS,
    )
    touched = spark.createDataFrame([(f"g{i}",) for i in range(0, 20, 2)], "guid string")
    plan = physical_plan(fold_versions(records.join(touched, "guid", "left_semi")))
    assert "REPARTITION_BY_COL" in plan
    assert "xxhash64" in plan
