"""One pass over the landing lines before their rows are built (``head_scan``): every line counted,
readable or not, and the heads of the lines that carry a guid kept one per line, so the duplicates
found from them equal those found from the lines themselves."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.transforms.message_store import (
    duplicate_guids,
    guid_heads,
    head_scan,
    head_totals,
    parse_landing_lines,
)

pytestmark = pytest.mark.spark


def _line(message_id: str, recv_ms: int, guid: str | None) -> str:
    head = {
        "message_id": message_id,
        "recv_ms": recv_ms,
        "kind": "message",
        "format": "datahub",
        "service": "s",
        "service_path": "/",
        "origin": "test",
        "correlator": None,
        "cbnotif": None,
        "guid": guid,
    }
    return json.dumps(head, separators=(",", ":"))[:-1] + ',"body":{"data":[]}}'


def _lines(spark: SparkSession, values: list[str]) -> DataFrame:
    return spark.createDataFrame([(v,) for v in values], "value string")


def test_counts_every_line_and_keeps_one_head_per_guid_line(spark: SparkSession) -> None:
    values = [
        _line("m1", 10, None),
        _line("m2", 20, "g1"),
        _line("m3", 30, "g1"),
        _line("m4", 40, None),
        _line("m5", 50, "g2"),
        _line("m5", 50, "g2"),  # the same line twice: two heads, as two lines
        '{"message_id":"torn","recv_ms":60',  # a torn tail: counted, no head
    ]
    scan = head_scan(_lines(spark, values))
    totals = head_totals(scan).collect()[0]
    assert (totals["n"], totals["guids"]) == (7, 1)
    heads = sorted(tuple(r) for r in guid_heads(scan).collect())
    assert heads == [("m2", "g1", 20), ("m3", "g1", 30), ("m5", "g2", 50), ("m5", "g2", 50)]


def test_lines_without_guids_give_no_heads(spark: SparkSession) -> None:
    scan = head_scan(_lines(spark, [_line("m1", 10, None), _line("m2", 20, None)]))
    totals = head_totals(scan).collect()[0]
    assert (totals["n"], totals["guids"]) == (2, 0)
    assert guid_heads(scan).count() == 0
    empty = head_totals(head_scan(_lines(spark, []))).collect()[0]
    assert (empty["n"], empty["guids"]) == (0, 0)


def test_duplicates_from_the_heads_equal_those_from_the_lines(spark: SparkSession) -> None:
    values = [_line(f"m{i}", 1000 - i, f"g{i % 3}") for i in range(12)] + [_line("x", 5, None)]
    lines = _lines(spark, values)
    earlier = spark.createDataFrame([("g2",)], "guid string")
    from_lines = sorted(r[0] for r in duplicate_guids(parse_landing_lines(lines), earlier).collect())
    from_heads = sorted(r[0] for r in duplicate_guids(guid_heads(head_scan(lines)), earlier).collect())
    assert from_heads == from_lines
    # g0 and g1: all but the earliest received; g2: all (received in an earlier hour).
    assert len(from_lines) == 12 - 2
