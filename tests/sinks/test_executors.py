"""``on_each_partition``: a writer sees every row once, in its partition's order, as ``collect`` shows it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.sinks.executors import on_each_partition

pytestmark = pytest.mark.spark


def test_rows_reach_the_writer_as_collect_gives_them(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [
            ("a", 1, datetime(2026, 11, 24, 10, 0, 0, 123000), Decimal("1.50"), {"k": "v"}, [1, 2], None),
            ("b", 2, datetime(2026, 11, 24, 11, 0), Decimal("-2.25"), {}, [], "x"),
        ],
        "name string, n long, ts timestamp, price decimal(10,2), attrs map<string,string>, xs array<int>, s string",
    ).coalesce(1)

    def write(rows: Iterator[Row]) -> Iterator[dict]:
        seen = list(rows)
        yield {"rows": [r.asDict(recursive=True) for r in seen]}

    (result,) = on_each_partition(df, write)
    expected = [r.asDict(recursive=True) for r in df.collect()]
    # Values cross as JSON (str for datetimes and decimals): compare the same way.
    assert result["rows"] == [{k: v if isinstance(v, int | dict | list | None) else str(v) for k, v in r.items()}
                              for r in expected]  # fmt: skip


def test_every_partition_writes_its_rows_in_order_and_only_results_come_back(spark: SparkSession) -> None:
    df = spark.range(0, 1000).repartition(4, F.col("id") % 4).sortWithinPartitions("id")

    def write(rows: Iterator[Row]) -> Iterator[dict]:
        ids = [r["id"] for r in rows]
        if ids:
            yield {"count": len(ids), "sorted": ids == sorted(ids), "buckets": sorted({i % 4 for i in ids})}

    results = on_each_partition(df, write)
    buckets = [b for r in results for b in r["buckets"]]
    assert sorted(buckets) == [0, 1, 2, 3]  # each bucket written by one partition only
    assert sum(r["count"] for r in results) == 1000
    assert all(r["sorted"] for r in results)


def test_a_writer_that_fails_fails_the_call(spark: SparkSession) -> None:
    def write(rows: Iterator[Row]) -> Iterator[dict]:
        for _ in rows:
            raise RuntimeError("the database went away")
        yield {}

    with pytest.raises(Exception, match="the database went away"):
        on_each_partition(spark.range(3), write)
