"""NGSI events -> SQL sink rows and rejects, on small frames with explicit expected rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from ngsi_assets.transforms.sql_sinks import historic_column_mode, historic_row_mode, last_data_rows

pytestmark = pytest.mark.spark

T0 = 1_772_360_100_000  # 2026-03-01 10:15 UTC
DT = "2026-03-01-10"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def rt(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def ev(
    msg: str,
    eid: str,
    attr: str,
    value: str | None,
    ms: int = T0,
    *,
    idx: int = 0,
    etype: str | None = "car",
    service: str = "vehicles",
    path: str = "/4wheels",
    md: str = "[]",
    alteration: str | None = None,
    dataset: str | None = None,
) -> tuple[Any, ...]:
    time_index = datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)
    return (ms, iso(ms), service, path, eid, etype, attr, "Float", value, md, dataset,
            time_index, "recvTime", alteration, msg, idx, DT)  # fmt: skip


def events(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, NGSI_EVENTS)


def cfg(dialect: Dialect = Dialect.MYSQL, **kw: Any) -> SqlSinkConfig:
    return SqlSinkConfig(dialect=dialect, **kw)


def rows_of(df: DataFrame, *cols: str) -> list[tuple]:
    return sorted((tuple(r[c] for c in cols) for r in df.collect()), key=repr)


def test_row_mode_rows_and_rejects(spark: SparkSession) -> None:
    long_id = "e" * 70
    df = events(
        spark,
        [
            ev("m1", "car1", "speed", "112.9"),
            ev("m1", "car1", "oil_level", "74.6"),
            ev("m2", long_id, "speed", "1"),
            ev("m3", "car2", "speed", "a\u0000b"),
        ],
    )
    rows, rejects = historic_row_mode(df, cfg(Dialect.POSTGRESQL))
    assert rows_of(rows, "db", "table", "recvTimeTs", "recvTime", "fiwareServicePath", "entityId", "attrName",
                   "attrValue", "attrMd") == [
        ("vehicles", "4wheels_car1_car", T0, iso(T0), "/4wheels", "car1", "oil_level", "74.6", "[]"),
        ("vehicles", "4wheels_car1_car", T0, iso(T0), "/4wheels", "car1", "speed", "112.9", "[]"),
    ]  # fmt: skip
    assert rows_of(rejects, "dialect", "sink", "messageId", "entityId", "attrName", "reason", "dt") == [
        ("postgresql", "historic", "m2", long_id, "speed",
         f"bad name: table name '4wheels_{long_id}_car' is 82 characters long, over the postgresql limit of 63", DT),
        ("postgresql", "historic", "m3", "car2", "speed",
         "attrValue holds a NUL character, which PostgreSQL text refuses", DT),
    ]  # fmt: skip


def test_column_mode_one_row_per_notified_entity(spark: SparkSession) -> None:
    df = events(
        spark,
        [
            ev("m1", "car1", "speed", "112.9"),
            ev("m1", "car1", "oil_level", "74.6", md='[{"name":"u","type":"Text","value":"%"}]'),
            ev("m1", "car1", "entityId", "spoof"),  # would overwrite a fixed column: quarantined alone
            ev("m2", "car1", "speed", "100", T0 + 5),
            ev("m2", "car1", "Speed", "101", T0 + 5),  # the same column: the first name kept
        ],
    )
    rows, rejects = historic_column_mode(df, cfg(Dialect.MYSQL, attr_persistence="column", enable_lowercase=True))
    got = rows_of(rows, "db", "table", "recvTime", "fiwareServicePath", "entityId", "entityType", "attrs")
    assert got == sorted(
        [
            ("vehicles", "4wheels_car1_car", rt(T0), "/4wheels", "car1", "car",
             {"speed": ("112.9", "[]"), "oil_level": ("74.6", '[{"name":"u","type":"Text","value":"%"}]')}),
            ("vehicles", "4wheels_car1_car", rt(T0 + 5), "/4wheels", "car1", "car",
             {"Speed": ("101", "[]"), "speed": ("100", "[]")}),
        ],
        key=repr,
    )  # fmt: skip
    assert rows_of(rejects, "messageId", "attrName", "reason") == [
        ("m1", "entityId", "bad column name: attribute 'entityId' would overwrite the fixed column 'entityId'")
    ]


def test_column_mode_postgresql_folds_attribute_names_and_keeps_one(spark: SparkSession) -> None:
    df = events(spark, [ev("m2", "car1", "speed", "100"), ev("m2", "car1", "Speed", "101")])
    rows, _ = historic_column_mode(df, cfg(Dialect.POSTGRESQL, attr_persistence="column"))
    assert rows_of(rows, "table", "attrs") == [("4wheels_car1_car", {"speed": ("101", "[]")})]


def test_last_data_newest_record_per_key_and_entity_delete(spark: SparkSession) -> None:
    df = events(
        spark,
        [
            ev("m1", "wc1", "fillingLevel", "0.5", T0, etype="WasteContainer", path="/sub"),
            ev("m1", "wc1", "temperature", "20", T0, etype="WasteContainer", path="/sub"),
            ev("m2", "wc1", "fillingLevel", "0.7", T0 + 10, etype="WasteContainer", path="/sub"),
            ev("m0", "wc1", "fillingLevel", "0.9", T0 - 10, etype="WasteContainer", path="/sub"),
            ev("m3", "wc2", "fillingLevel", "0.1", T0, etype="WasteContainer", path="/sub", alteration="entityDelete"),
            ev("m4", "wc3", "fillingLevel", "0.1", T0, etype=None, path="/sub"),
        ],
    )
    c = cfg(Dialect.MYSQL, last_data_mode="upsert", data_model="dm-by-entity-type",
            last_data_unique_key="entityId,entityType")  # fmt: skip
    rows, rejects = last_data_rows(df, c)
    assert rows_of(rows, "table", "entityId", "recvTime", "attrs", "op") == [
        ("sub_WasteContainer_last_data", "wc1", rt(T0 + 10), {"fillingLevel": ("0.7", "[]")}, "u"),
        ("sub_WasteContainer_last_data", "wc2", rt(T0), {"fillingLevel": ("0.1", "[]")}, "d"),
    ]
    assert rows_of(rejects, "sink", "messageId", "reason") == [
        ("last_data", "m4", "unique key column entityType is null")
    ]
