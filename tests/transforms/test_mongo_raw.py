"""The raw MongoDB transform on small frames: value kinds, deterministic ids, rows per mode, rejects."""

from __future__ import annotations

import re

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.sinks.mongo_raw import typed_value
from ngsi_assets.transforms.mongo_raw import (
    KIND_BOOLEAN,
    KIND_DATE,
    KIND_JSON,
    KIND_NULL,
    KIND_NUMBER,
    KIND_STRING,
    classify_raw,
    raw_rejects,
    raw_rows,
    value_kind,
)
from tests.transforms.test_sth import ev, events, ms

T = ms(2026, 3, 1, 10, 20, 0)


@pytest.mark.parametrize(
    ("value", "attr_type", "kind"),
    [
        ("21.5", "Number", KIND_NUMBER),
        ("-3e2", "Float", KIND_NUMBER),
        ("21.5", "Text", KIND_STRING),
        ("21.5", "String", KIND_STRING),
        ("abc", "Number", KIND_STRING),
        ("1e999", "Number", KIND_STRING),  # not a finite double: kept as text
        ("true", "Boolean", KIND_BOOLEAN),
        ("false", None, KIND_BOOLEAN),
        ("true", "Text", KIND_STRING),
        ('{"a": [1, 2]}', "StructuredValue", KIND_JSON),
        ("[1, 2", "StructuredValue", KIND_STRING),  # not JSON: text
        ('{"a": 1}', "Text", KIND_STRING),
        ("2026-03-01T10:00:00Z", "DateTime", KIND_DATE),
        ("not a date", "DateTime", KIND_STRING),
        (None, "Number", KIND_NULL),
    ],
)
def test_value_kind(spark: SparkSession, value: str | None, attr_type: str | None, kind: str) -> None:
    df = spark.createDataFrame([(value, attr_type)], "value string, attrType string")
    (row,) = df.select(value_kind(F.col("value"), F.col("attrType")).alias("k")).collect()
    assert row["k"] == kind


def test_typed_values() -> None:
    assert typed_value("7", KIND_NUMBER) == 7 and isinstance(typed_value("7", KIND_NUMBER), int)
    assert typed_value("99999999999999999999", KIND_NUMBER) == 1e20  # beyond int64: a double
    assert typed_value("7.25", KIND_NUMBER) == 7.25
    assert typed_value("false", KIND_BOOLEAN) is False
    assert typed_value('{"a": [1, "x"]}', KIND_JSON) == {"a": [1, "x"]}
    assert typed_value("2026-03-01T10:00:00", KIND_DATE).isoformat() == "2026-03-01T10:00:00+00:00"
    assert typed_value("abc", KIND_STRING) == "abc"
    assert typed_value(None, KIND_NULL) is None


def test_ids_are_deterministic_object_ids_of_the_receive_second(spark: SparkSession) -> None:
    rows = [ev("car1", "speed", "1", T, mid="m1"), ev("car1", "state", "on", T, mid="m1", attr_type="Text")]
    config = MongoRawConfig()
    first = [r["docId"] for r in raw_rows(classify_raw(events(spark, rows), config), config).orderBy("docId").collect()]
    again = [r["docId"] for r in raw_rows(classify_raw(events(spark, rows), config), config).orderBy("docId").collect()]
    assert first == again and len(set(first)) == 2
    assert all(re.fullmatch(r"[0-9a-f]{24}", d) for d in first)
    assert {d[:8] for d in first} == {format(T // 1000, "08x")}


def test_column_mode_one_row_per_entity_sorted_attributes(spark: SparkSession) -> None:
    rows = [
        ev("car1", "speed", "1", T, mid="m1"),
        ev("car1", "accel", "2", T, mid="m1"),
        ev("car2", "speed", "3", T, mid="m1", idx=1),
        ev("car1", "speed", "4", T + 1000, mid="m2"),
    ]
    config = MongoRawConfig(attr_persistence="column")
    out = raw_rows(classify_raw(events(spark, rows), config), config).collect()
    assert sorted((r["entityId"], [a["name"] for a in r["attrs"]]) for r in out) == [
        ("car1", ["accel", "speed"]),
        ("car1", ["speed"]),
        ("car2", ["speed"]),
    ]
    assert {r["recvTimeMs"] for r in out} == {T, T + 1000}


def test_entity_deletes_give_no_document_and_bad_names_are_rejected(spark: SparkSession) -> None:
    rows = [
        ev("car1", "speed", "1", T, mid="del", alteration="entityDelete"),
        ev("car1", "speed", "1", T, mid="big", service="s" * 70),
        ev("car1", "$x", "1", T, mid="dollar"),
    ]
    row_config, column_config = MongoRawConfig(), MongoRawConfig(attr_persistence="column")
    row_mode = classify_raw(events(spark, rows), row_config)
    assert {r["messageId"] for r in raw_rejects(row_mode).collect()} == {"big"}
    assert [r["attrName"] for r in raw_rows(row_mode, row_config).collect()] == ["$x"]
    column_mode = classify_raw(events(spark, rows), column_config)
    reasons = {r["messageId"]: r["reason"] for r in raw_rejects(column_mode).collect()}
    assert set(reasons) == {"big", "dollar"}
    assert "database name" in reasons["big"] and "column mode" in reasons["dollar"]
    assert raw_rows(column_mode, column_config).count() == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"collections_size": 100, "max_documents": 5}, "collections_size must be 0 or at least 4096 bytes"),
        ({"collections_size": 8192}, "collections_size and max_documents must be set together"),
        ({"collections_size": 8192, "max_documents": 5, "data_expiration": 60}, "TTL indexes on capped collections"),
        ({"attr_persistence": "column", "data_model": "dm-by-attribute"}, "cannot be combined with data_model"),
        ({"attr_persistence": "columns"}, "attr_persistence"),
        ({"collection_prefix": "system.x"}, "'system.' is reserved"),
        ({"batch_retry_intervals": "-5"}, "intervals must be >= 0"),
    ],
)
def test_configuration_errors_name_the_problem(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MongoRawConfig(**settings)
