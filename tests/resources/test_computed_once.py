"""``computed_once``: frames computed in one job and kept, so later jobs neither replan nor reread them.

``collect_small``: the rows of several small frames, fetched in one job.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from resources.spark import collect_small, computed_once

pytestmark = pytest.mark.spark


def test_frames_come_back_with_their_rows_and_columns_after_their_source_is_gone(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = str(tmp_path / "source")
    spark.createDataFrame(
        [(1, "a", {"k": (1.5, "x")}), (2, "b", {}), (3, None, None)],
        "n int, s string, m map<string, struct<v: double, t: string>>",
    ).write.parquet(source)
    read = spark.read.parquet(source)
    small, rejected, empty = computed_once(
        read.where(F.col("n") < 3), read.where(F.col("n") == 3).select("n", F.lit("why").alias("reason")), read.limit(0)
    )
    shutil.rmtree(source)  # a plan that still read the files would fail now
    assert small.columns == ["n", "s", "m"]
    assert small.schema["m"].dataType == read.schema["m"].dataType
    assert sorted(tuple(r) for r in small.collect()) == [(1, "a", {"k": (1.5, "x")}), (2, "b", {})]
    assert [tuple(r) for r in rejected.collect()] == [(3, "why")]
    assert rejected.columns == ["n", "reason"]
    assert empty.collect() == [] and empty.columns == ["n", "s", "m"]


def test_nothing_to_compute() -> None:
    assert computed_once() == ()


def test_collect_small_gives_each_frame_its_own_rows(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "b")], "n int, s string")
    got = collect_small(
        counts=df.groupBy("s").count(),
        total=df.agg(F.sum("n").alias("n")),
        none=df.where(F.col("n") > 5),
        first=df.orderBy("n").limit(1).select(F.col("s").alias("only")),
    )
    assert list(got) == ["counts", "total", "none", "first"]
    assert sorted((r["s"], r["count"]) for r in got["counts"]) == [("a", 1), ("b", 2)]
    assert got["counts"][0].asDict().keys() == {"s", "count"}
    assert [r["n"] for r in got["total"]] == [6]
    assert got["none"] == []
    assert [r.asDict() for r in got["first"]] == [{"only": "a"}]


def test_collect_small_of_nothing() -> None:
    assert collect_small() == {}
