"""NGSI events -> SQL sink rows and rejects, on small frames with explicit expected rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from ngsi_assets.transforms.sql_sinks import (
    LAST_DATA_STATE,
    historic_column_mode,
    historic_row_mode,
    last_data_output,
    last_data_records,
    last_data_rows,
    merge_last_data_state,
)

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
        # The newest value of each attribute: temperature came only with the older m1.
        (
            "sub_WasteContainer_last_data",
            "wc1",
            rt(T0 + 10),
            {"fillingLevel": ("0.7", "[]"), "temperature": ("20", "[]")},
            "u",
        ),
        ("sub_WasteContainer_last_data", "wc2", rt(T0), {}, "d"),
    ]
    assert rows_of(rejects, "sink", "messageId", "reason") == [
        ("last_data", "m4", "unique key column entityType is null")
    ]


# Last data merged from increments: any split of the records, merged in any order, equals one merge.
_ATTRS = ("speed", "oil_level", "fuel")


@st.composite
def _record_sets(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], list[int]]:
    n = draw(st.integers(min_value=1, max_value=12))
    rows = []
    for i in range(n):
        eid = draw(st.sampled_from(["car1", "car2"]))
        ms = T0 + draw(st.integers(min_value=0, max_value=5))  # few distinct times: ties happen
        delete = draw(st.booleans()) and draw(st.booleans())
        attrs = draw(st.lists(st.sampled_from(_ATTRS), min_size=1, max_size=3, unique=True))
        for a in attrs:
            rows.append(ev(f"m{i:02d}", eid, a, f"{a}{i}", ms, alteration="entityDelete" if delete else None))
    # Which increment each message goes to.
    parts = [draw(st.integers(min_value=0, max_value=3)) for _ in range(n)]
    return rows, parts


def _state_rows(df: DataFrame) -> list[tuple]:
    return sorted(
        (tuple((k, v if not isinstance(v, dict) else sorted(v.items())) for k, v in r.asDict(recursive=True).items())
         for r in df.collect()),
        key=repr,
    )  # fmt: skip


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_record_sets(), order_seed=st.randoms(use_true_random=False))
def test_last_data_state_from_any_split_equals_one_merge(spark: SparkSession, data: tuple, order_seed: Any) -> None:
    rows, parts = data
    c = cfg(Dialect.POSTGRESQL, last_data_mode="upsert")
    records, _ = last_data_records(events(spark, rows), c)
    whole = merge_last_data_state(records, c)
    increments = sorted(set(parts))
    order_seed.shuffle(increments)
    state = None
    for p in increments:
        mine = [r for r in rows if parts[int(r[14][1:])] == p]
        inc, _ = last_data_records(events(spark, mine), c)
        inc = inc.select(*LAST_DATA_STATE.fieldNames())
        state = merge_last_data_state(inc if state is None else state.unionByName(inc), c)
        state = spark.createDataFrame(state.collect(), LAST_DATA_STATE)  # as stored: no lineage kept
    assert state is not None
    assert _state_rows(state) == _state_rows(whole.select(*LAST_DATA_STATE.fieldNames()))
    again = merge_last_data_state(state.unionByName(records.select(*LAST_DATA_STATE.fieldNames())), c)
    assert _state_rows(again) == _state_rows(state)  # merging what is already in changes nothing
    assert _state_rows(last_data_output(state, c)) == _state_rows(last_data_output(whole, c))


def test_merge_keeps_only_the_keys_with_a_wanted_row(spark: SparkSession) -> None:
    c = cfg(Dialect.POSTGRESQL, last_data_mode="upsert")
    stored = [ev("m00", "car1", "speed", "10", T0), ev("m01", "car2", "speed", "20", T0 + 1)]
    new = [ev("m02", "car1", "fuel", "90", T0 + 2), ev("m03", "car3", "speed", "30", T0 + 3)]
    old_records, _ = last_data_records(events(spark, stored), c)
    new_records, _ = last_data_records(events(spark, new), c)
    state = old_records.select(*LAST_DATA_STATE.fieldNames(), F.lit(False).alias("run")).unionByName(
        new_records.select(*LAST_DATA_STATE.fieldNames(), F.lit(True).alias("run"))
    )
    everything = merge_last_data_state(state.drop("run"), c)
    got = merge_last_data_state(state, c, wanted=F.col("run"))
    assert sorted(r["entityId"] for r in got.collect()) == ["car1", "car3"]
    # A wanted key's row merges every row of that key, not only the wanted ones.
    car1 = got.where(F.col("entityId") == "car1").collect()[0]
    assert {k: v["value"] for k, v in car1["attrs"].items()} == {"speed": "10", "fuel": "90"}
    assert _state_rows(got) == _state_rows(everything.where(F.col("entityId") != "car2"))
