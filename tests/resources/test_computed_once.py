"""``computed_once``: frames computed in one job and kept, so later jobs neither replan nor reread them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from resources.spark import computed_once

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
