"""Last data as a Cygnus user expects it, through the last_data asset on the real servers, hour by hour
in any order: the timestamp key (TimeInstant), partial updates, and tombstones of entityDelete."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.sql_sinks import last_data
from ngsi_assets.ngsi.sql_naming import Dialect, fixed_column
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from resources.lake import LakeResource
from resources.sql_sinks import SqlSinksResource
from tests.sinks.support import Sink
from tests.transforms.test_sql_sinks import T0, ev, iso, rt

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOUR = 3_600_000
TABLE = "4wheels_car1_car_last_data"
ISO_FORMAT = {Dialect.POSTGRESQL: 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"', Dialect.MYSQL: "%Y-%m-%dT%H:%i:%s.%fZ"}


def _key(hour: int) -> str:
    return f"2026-03-01-{hour:02d}:00"


def _at(hour: int, row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*row[:-1], f"2026-03-01-{hour:02d}")


class Hours:
    """A lake of ngsi_events by hour, and the last_data asset run over chosen hours in a chosen order."""

    def __init__(self, spark: SparkSession, tmp_path: Path, s: Sink, **cfg: Any) -> None:
        self.spark = spark
        self.lake = LakeResource(root=str(tmp_path / "lake"))
        self.sink = s
        self.sinks = {s.dialect.value: {"url": s.url, "last_data_mode": "upsert", **cfg}}
        s.created_dbs.append("vehicles")

    def land(self, hour: int, rows: Sequence[tuple[Any, ...]]) -> None:
        df = self.spark.createDataFrame([_at(hour, r) for r in rows], NGSI_EVENTS)
        self.lake.replace_partitions(df, "ngsi_events", [_key(hour)])

    def run(self, *hours: int, tags: dict[str, str] | None = None, checks_pass: bool = True) -> list[dict]:
        metas = []
        for hour in hours:
            result = materialize(
                [last_data],
                partition_key=_key(hour),
                tags=tags,
                resources={
                    "spark": LazyPySparkResource(spark_config={}),
                    "lake": self.lake,
                    "sql_sinks": SqlSinksResource(sinks=self.sinks),
                },
                instance=DagsterInstance.ephemeral(),
            )
            assert result.success
            assert all(c.passed for c in result.get_asset_check_evaluations()) is checks_pass
            (m,) = result.get_asset_materialization_events()
            metas.append({k: v.value for k, v in m.materialization.metadata.items()})
        return metas

    def rows(self, *columns: str) -> list[tuple]:
        d = self.sink.dialect
        cols = [fixed_column(c, d) if c in ("entityId", "recvTime") else c.lower() if d is Dialect.POSTGRESQL else c
                for c in columns]  # fmt: skip
        if TABLE not in self.sink.tables("vehicles"):
            return []
        return self.sink.rows("vehicles", TABLE, cols)


def test_an_older_time_instant_arriving_later_does_not_overwrite(
    spark: SparkSession, sink: Sink, tmp_path: Path
) -> None:
    h = Hours(spark, tmp_path, sink, last_data_timestamp_key="TimeInstant",
              last_data_sql_timestamp_format=ISO_FORMAT[sink.dialect])  # fmt: skip
    newer, older = iso(T0 + 600_000), iso(T0)
    # Hour 10: observed at newer. Hour 11 (received an hour later): a buffered observation from before.
    h.land(10, [ev("m1", "car1", "speed", "80", T0), ev("m1", "car1", "TimeInstant", newer, T0)])
    h.land(11, [ev("m2", "car1", "speed", "10", T0 + HOUR), ev("m2", "car1", "TimeInstant", older, T0 + HOUR)])
    for order in ((10, 11), (11, 10)):
        h.run(*order)
        assert h.rows("entityId", "recvTime", "speed", "TimeInstant") == [("car1", rt(T0), "80", newer)], order
    # Within one run too: both records in one hour, the older observation received last.
    late, early = T0 + 2 * HOUR + 5, T0 + 2 * HOUR
    h.land(12, [ev("m4", "car1", "speed", "99", late), ev("m4", "car1", "TimeInstant", iso(T0 + 1), late),
                ev("m3", "car1", "speed", "50", early),
                ev("m3", "car1", "TimeInstant", iso(T0 + 900_000), early)])  # fmt: skip
    h.run(12)
    assert h.rows("entityId", "recvTime", "speed", "TimeInstant") == [
        ("car1", rt(T0 + 2 * HOUR), "50", iso(T0 + 900_000))
    ]


def test_a_record_without_a_usable_time_instant_falls_back_to_its_receive_time(
    spark: SparkSession, sink: Sink, tmp_path: Path
) -> None:
    h = Hours(spark, tmp_path, sink, last_data_timestamp_key="TimeInstant",
              last_data_sql_timestamp_format=ISO_FORMAT[sink.dialect])  # fmt: skip
    h.land(10, [ev("m1", "car1", "speed", "80", T0), ev("m1", "car1", "TimeInstant", iso(T0 - 5000), T0)])
    # m2: TimeInstant the format cannot read; m3: none at all. Both use their receive times.
    h.land(11, [ev("m2", "car1", "speed", "81", T0 + HOUR), ev("m2", "car1", "TimeInstant", "n/a", T0 + HOUR),
                ev("m3", "car1", "oil_level", "7", T0 + HOUR + 1)])  # fmt: skip
    (m10,) = h.run(10)
    (m11,) = h.run(11)
    d = sink.dialect.value
    assert (m10[f"{d}_timestamp_fallbacks"], m11[f"{d}_timestamp_fallbacks"]) == (0, 2)
    assert m11[f"{d}_timestamp_key"] == "TimeInstant"
    # The unreadable value never reaches the column the server's guard parses.
    assert h.rows("speed", "oil_level", "TimeInstant") == [("81", "7", iso(T0 - 5000))]


@pytest.mark.parametrize("order", [(10, 11), (11, 10)], ids=["in-order", "out-of-order"])
def test_a_partial_update_keeps_the_other_attributes(
    spark: SparkSession, sink: Sink, tmp_path: Path, order: tuple[int, int]
) -> None:
    h = Hours(spark, tmp_path, sink, attr_persistence="column")
    h.land(10, [ev("m1", "car1", "speed", "80", T0), ev("m1", "car1", "oil_level", "70", T0),
                ev("m2", "car1", "speed", "81", T0 + 1)])  # fmt: skip
    h.land(11, [ev("m3", "car1", "speed", "90", T0 + HOUR), ev("m4", "car1", "fuel", "33", T0 + HOUR - 1)])
    h.run(*order)
    want = [("car1", rt(T0 + HOUR), "90", "70", "33")]
    assert h.rows("entityId", "recvTime", "speed", "oil_level", "fuel") == want
    h.run(*order)  # a rerun of either hour changes nothing
    assert h.rows("entityId", "recvTime", "speed", "oil_level", "fuel") == want


def test_an_update_older_than_a_delete_does_not_resurrect(spark: SparkSession, sink: Sink, tmp_path: Path) -> None:
    h = Hours(spark, tmp_path, sink)
    h.land(10, [ev("m1", "car1", "speed", "80", T0), ev("m1", "car1", "oil_level", "70", T0)])
    h.land(11, [ev("m2", "car1", "speed", "80", T0 + HOUR, alteration="entityDelete")])
    h.land(12, [ev("m3", "car1", "speed", "5", T0 + 2 * HOUR)])
    h.run(10)
    assert h.rows("entityId", "speed") == [("car1", "80")]
    h.run(11)
    assert h.rows("entityId") == []
    h.run(10)  # the older update again (a backfill): the tombstone keeps the row deleted
    assert h.rows("entityId") == []
    h.run(12)  # a newer update recreates it, without the attributes from before the delete
    assert h.rows("entityId", "recvTime", "speed", "oil_level") == [("car1", rt(T0 + 2 * HOUR), "5", None)]
    h.run(11, 10)  # neither the delete nor the older update undoes the newer one
    assert h.rows("entityId", "recvTime", "speed", "oil_level") == [("car1", rt(T0 + 2 * HOUR), "5", None)]
