"""historic_tables and last_data materialized through Dagster from a small ngsi_events lake, on both servers."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.sql_sinks import NOT_CONFIGURED, historic_tables, hour_ranges, last_data
from ngsi_assets.transforms.schemas import NGSI_EVENT_REJECTS, NGSI_EVENTS
from ngsi_assets.transforms.sql_sinks import SQL_SINK_REJECTS
from resources.lake import LakeResource
from resources.sql_sinks import SqlSinksResource
from tests.sinks.support import H10, Sink
from tests.transforms.test_sql_sinks import T0, ev, iso, rt

KEY = "2026-03-01-10:00"


def test_hour_ranges() -> None:
    assert hour_ranges([KEY]) == (H10,)


def _lake(spark: SparkSession, tmp_path: Path) -> LakeResource:
    lake = LakeResource(root=str(tmp_path / "lake"))
    rows = [
        ev("m1", "car1", "speed", "112.9", T0),
        ev("m1", "car1", "oil_level", "74.6", T0),
        ev("m2", "car1", "speed", "100", T0 + 5),
        ev("m3", "e" * 80, "speed", "1", T0 + 6),  # over-long table name: quarantined
    ]
    lake.replace_partitions(spark.createDataFrame(rows, NGSI_EVENTS), "ngsi_events", [KEY])
    lake.replace_partitions(spark.createDataFrame([], NGSI_EVENT_REJECTS), "ngsi_event_rejects", [KEY])
    return lake


def _materialize(lake: LakeResource, sinks: dict | None) -> dict:
    result = materialize(
        [historic_tables, last_data],
        partition_key=KEY,
        resources={
            "spark": LazyPySparkResource(spark_config={}),
            "lake": lake,
            "sql_sinks": SqlSinksResource(sinks=sinks if sinks is not None else {}),
        },
        instance=DagsterInstance.ephemeral(),
        selection=[historic_tables, last_data],
    )
    assert result.success
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    meta = {
        m.asset_key.to_user_string(): {k: v.value for k, v in m.metadata.items()}
        for m in result.get_asset_materialization_events()
        for m in [m.materialization]
    }
    return {"checks": checks, "meta": meta}


@pytest.mark.spark
def test_not_configured_skips_with_metadata(spark: SparkSession, tmp_path: Path) -> None:
    out = _materialize(_lake(spark, tmp_path), None)
    assert out["meta"]["historic_tables"] == {"skipped": NOT_CONFIGURED}
    assert out["meta"]["last_data"] == {"skipped": NOT_CONFIGURED}
    assert out["checks"] == {"every_shaped_row_written": True, "last_data_row_equals_newest_event": True}


@pytest.mark.integration
@pytest.mark.spark
def test_both_sinks_written_rerun_identical(
    spark: SparkSession, tmp_path: Path, postgres_db_url: str, mysql_db_url: str
) -> None:
    lake = _lake(spark, tmp_path)
    sinks = {
        "postgresql": {"url": postgres_db_url, "last_data_mode": "both"},
        "mysql": {"url": mysql_db_url, "last_data_mode": "both", "attr_persistence": "column"},
    }
    pg, my = Sink(*_dialects(postgres_db_url, mysql_db_url)[0]), Sink(*_dialects(postgres_db_url, mysql_db_url)[1])
    my.created_dbs.append("vehicles")
    try:
        for _ in range(2):  # the second run must leave every table as the first did
            out = _materialize(lake, sinks)
            assert out["checks"] == {"every_shaped_row_written": True, "last_data_row_equals_newest_event": True}
            assert pg.rows("vehicles", "4wheels_car1_car", ["recvtimets", "recvtime", "attrname", "attrvalue"]) == [
                (T0, iso(T0), "oil_level", "74.6"),
                (T0, iso(T0), "speed", "112.9"),
                (T0 + 5, iso(T0 + 5), "speed", "100"),
            ]
            assert my.rows("vehicles", "4wheels_car1_car", ["recvTime", "speed", "oil_level"]) == [
                (rt(T0), "112.9", "74.6"),
                (rt(T0 + 5), "100", None),
            ]
            # Last data holds each attribute's newest value: speed from m2, oil_level from the older m1.
            for s in (pg, my):
                cols = [c if s is my else c.lower() for c in ("entityId", "recvTime")] + ["speed", "oil_level"]
                assert s.rows("vehicles", "4wheels_car1_car_last_data", cols) == [("car1", rt(T0 + 5), "100", "74.6")]
        meta = out["meta"]
        assert meta["historic_tables"]["postgresql_rows_by_table"] == {"vehicles.4wheels_car1_car": 3}
        assert meta["historic_tables"]["mysql_rows_by_table"] == {"vehicles.4wheels_car1_car": 2}
        assert meta["last_data"]["mysql_rows_by_table"] == {"vehicles.4wheels_car1_car_last_data": 1}
        assert meta["historic_tables"]["rejects"] == 2
        rejects = lake.read(spark, "historic_table_rejects", SQL_SINK_REJECTS, [KEY])
        assert sorted((r["dialect"], r["messageId"]) for r in rejects.collect()) == [
            ("mysql", "m3"),
            ("postgresql", "m3"),
        ]
    finally:
        my.drop_created()


def _dialects(pg_url: str, my_url: str):
    from ngsi_assets.ngsi.sql_naming import Dialect

    return [(Dialect.POSTGRESQL, pg_url, []), (Dialect.MYSQL, my_url, [])]
