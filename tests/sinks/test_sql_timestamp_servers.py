"""The Spark pattern made from last_data_sql_timestamp_format reads a value only if the server's
to_timestamp / STR_TO_DATE reads it too, and to the same instant: a value Spark accepts can never
break the server's upsert guard."""

from __future__ import annotations

from datetime import datetime

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.ngsi.sql_timestamp import spark_pattern
from tests.sinks.support import Sink

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FORMATS = {
    Dialect.POSTGRESQL: ["YYYY-MM-DD HH24:MI:SS.MS", 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"', "YYYY-MM-DD HH24:MI:SS.US"],
    Dialect.MYSQL: ["%Y-%m-%d %H:%i:%s.%f", "%Y-%m-%dT%H:%i:%s.%fZ", "%Y-%m-%d %T"],
}
VALUES = [
    "2026-03-01 10:15:00.123",
    "2026-03-01 10:15:00.5",
    "2026-03-01 10:15:00.123456",
    "2026-03-01 10:15:00",
    "2026-03-01T10:15:00.123Z",
    "2026-03-01T10:15:00.1Z",
    "2026-03-01T10:15:00Z",
    "2026-03-01T10:15:00.123+02:00",
    "2026-03-01T10:15:00.123",
    "2026-02-30T10:15:00.000Z",
    "n/a",
    "",
]


def _server(s: Sink, fmt: str, value: str) -> str | None:
    conn = s.connect()
    try:
        with conn.cursor() as cur:
            if s.dialect is Dialect.POSTGRESQL:
                cur.execute("SELECT to_timestamp(%s, %s) AT TIME ZONE 'UTC'", (value, fmt))
            else:
                cur.execute("SELECT STR_TO_DATE(%s, %s)", (value, fmt))
            got = cur.fetchone()[0]
            return got.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(got, datetime) else None
    except Exception:  # the server refuses the value
        return None
    finally:
        conn.close()


def test_spark_reads_a_value_only_as_the_server_does(spark: SparkSession, sink: Sink) -> None:
    checked = 0
    for fmt in FORMATS[sink.dialect]:
        pattern = spark_pattern(fmt, sink.dialect)
        df = spark.createDataFrame([(v,) for v in VALUES], "v string")
        # As text in the session's zone (UTC): no conversion to the test process's zone.
        as_text = F.date_format(F.try_to_timestamp("v", F.lit(pattern)), "yyyy-MM-dd HH:mm:ss.SSSSSS")
        parsed = {r["v"]: r["t"] for r in df.select("v", as_text.alias("t")).collect()}
        for value in VALUES:
            if parsed[value] is None:
                continue
            checked += 1
            assert _server(sink, fmt, value) == parsed[value], (fmt, value)
    assert checked >= 6  # each format reads some of the values
