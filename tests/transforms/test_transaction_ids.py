"""The Spark column twins of the transaction ids and uuids equal the Python functions, in any session time zone."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ngsi_assets.ngsi.transactions import I_MAX, INT8_MAX, INT8_MIN, tnx_of, uuid_of
from ngsi_assets.transforms.transaction_ids import tnx_column, uuid_column

pytestmark = pytest.mark.spark

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FIRST = datetime(2000, 1, 1, tzinfo=UTC)
LAST = datetime(4047, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
EDGE_TS = [
    FIRST,
    datetime(2000, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2047, 12, 31, 23, 59, tzinfo=UTC),
    datetime(2048, 1, 1, tzinfo=UTC),
    datetime(2048, 2, 29, 23, 59, 59, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # a DST change in Europe; not in UTC
    datetime(4047, 1, 1, tzinfo=UTC),
    LAST,
]
EDGE_COUNTERS = [0, 1, 0xFFF, 0x1000, 0xFFFFFFF, 0x10000000, 2**40 + 7, INT8_MAX, INT8_MIN, -1]
EDGE_I = [0, 1, 2**56 - 1, 2**56, I_MAX]
SCHEMA = StructType([StructField(n, LongType(), False) for n in ("n", "ts_us", "counter", "i", "any_tnx")])


def micros(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def inputs() -> list[tuple[int, datetime, int, int, int]]:
    rng = random.Random(4047)
    span = micros(LAST) - micros(FIRST)
    rows = []
    for ts in EDGE_TS:
        for c in EDGE_COUNTERS:
            for i in EDGE_I:
                rows.append((ts, c, i, rng.choice([0, -1, INT8_MIN, INT8_MAX, rng.randrange(INT8_MIN, INT8_MAX)])))
    for _ in range(1000):
        ts = FIRST + timedelta(microseconds=rng.randrange(span + 1))
        c = rng.choice([rng.randrange(2**28), rng.randrange(INT8_MIN, INT8_MAX + 1)])
        i = rng.choice([rng.randrange(2**24), rng.randrange(I_MAX + 1)])
        rows.append((ts, c, i, rng.randrange(INT8_MIN, INT8_MAX + 1)))
    return [(n, *r) for n, r in enumerate(rows)]


def frame(spark: SparkSession, rows: list[tuple[int, datetime, int, int, int]]) -> DataFrame:
    data = [(n, micros(ts), c, i, a) for n, ts, c, i, a in rows]
    # From epoch microseconds: building the timestamps reads no time zone either.
    return spark.createDataFrame(data, SCHEMA).withColumn("ts", F.timestamp_micros("ts_us"))


def test_spark_equals_python_in_a_non_utc_session(spark: SparkSession) -> None:
    rows = inputs()
    assert len(rows) >= 1000
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        df = frame(spark, rows)
        tnx = tnx_column(F.col("ts"), F.col("counter"))
        got = (
            df.select(
                "n",
                tnx.alias("tnx"),
                uuid_column(tnx, F.col("i")).alias("u"),
                uuid_column(F.col("any_tnx"), F.col("i")).alias("ua"),
            )
            .orderBy("n")
            .collect()
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert spark.conf.get("spark.sql.session.timeZone") == before
    expected = [(n, tnx_of(ts, c), str(uuid_of(tnx_of(ts, c), i)), str(uuid_of(a, i))) for n, ts, c, i, a in rows]
    assert [tuple(r) for r in got] == expected


def test_nulls_give_null(spark: SparkSession) -> None:
    df = spark.createDataFrame([(None, None, None)], "ts timestamp, counter long, i long")
    row = df.select(
        tnx_column(F.col("ts"), F.lit(1)).alias("a"),
        tnx_column(F.lit(datetime(2026, 1, 1, tzinfo=UTC)), F.col("counter")).alias("b"),
        uuid_column(F.lit(5), F.col("i")).alias("c"),
    ).collect()[0]
    assert tuple(row) == (None, None, None)


@pytest.mark.parametrize(
    ("ts", "i", "message"),
    [
        (datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC), 0, "tnx_column: UTC year 1999 is outside 2000..4047"),
        (datetime(4048, 1, 1, tzinfo=UTC), 0, "tnx_column: UTC year 4048 is outside 2000..4047"),
        (FIRST, 2**62, "uuid_column: i 4611686018427387904 is outside 0..2\\*\\*62-1"),
        (FIRST, -1, "uuid_column: i -1 is outside 0..2\\*\\*62-1"),
    ],
)
def test_out_of_range_values_fail_the_job_with_the_reason(
    spark: SparkSession, ts: datetime, i: int, message: str
) -> None:
    df = frame(spark, [(0, ts, 1, i, 0)])
    tnx = tnx_column(F.col("ts"), F.col("counter"))
    with pytest.raises(Exception, match=message):
        df.select(uuid_column(tnx, F.col("i"))).collect()
