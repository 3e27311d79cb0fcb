"""``empty_frame``: a frame with no rows that the optimizer removes from the plans using it."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.frames import empty_frame

pytestmark = pytest.mark.spark

SCHEMA = "guid string, n int"


def _physical_plan(df: DataFrame, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    df.explain()
    return capsys.readouterr().out


def _rows(spark: SparkSession) -> DataFrame:
    return spark.range(6).select(F.col("id").cast("string").alias("guid"), F.col("id").cast("int").alias("n"))


def test_it_has_the_schema_and_no_rows(spark: SparkSession) -> None:
    empty = empty_frame(spark, SCHEMA)
    assert empty.columns == ["guid", "n"]
    assert [f.dataType.simpleString() for f in empty.schema.fields] == ["string", "int"]
    assert empty.collect() == []


def test_a_union_with_it_keeps_no_branch_for_it(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    union = _rows(spark).unionByName(empty_frame(spark, SCHEMA))
    plan = _physical_plan(union.groupBy("guid").count(), capsys)
    assert "Union" not in plan and "Scan ExistingRDD" not in plan, plan
    assert sorted(r["guid"] for r in union.collect()) == [str(i) for i in range(6)]


def test_joins_with_it_need_no_shuffle(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    rows, empty = _rows(spark), empty_frame(spark, SCHEMA).select("guid")
    anti = rows.join(empty, "guid", "left_anti")
    semi = rows.join(empty, "guid", "left_semi")
    for joined in (anti, semi):
        plan = _physical_plan(joined, capsys)
        assert "Join" not in plan and "Exchange" not in plan, plan
    assert anti.count() == 6 and semi.count() == 0


def test_a_plain_empty_frame_is_not_seen_as_empty(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    """What ``empty_frame`` avoids: without it, a classic session keeps the scan and the join's shuffles."""
    if spark.__class__.__module__.startswith("pyspark.sql.connect"):
        pytest.skip("through Spark Connect an empty frame is a local relation already")
    plan = _physical_plan(_rows(spark).join(spark.createDataFrame([], "guid string"), "guid", "left_anti"), capsys)
    assert "Join" in plan, plan
