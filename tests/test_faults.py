"""Faults under continuous load, shortened: one database stopped and the Spark Connect server killed
while notifications flow; nothing acknowledged is lost or duplicated, and last data recovers.

The platform runs as in ``make dev`` (receiver, Dagster daemon with the sensors, webserver, a Spark
Connect server, PostgreSQL, MariaDB and a MongoDB server with the raw history and the STH aggregates);
``benchmarks/bench_faults.py`` runs every fault at full rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_faults import run_faults

pytestmark = pytest.mark.integration


def test_a_database_stop_and_a_spark_connect_kill_lose_nothing(tmp_path: Path) -> None:
    result = run_faults(
        tmp_path,
        ["postgres-stop", "connect-kill"],
        rate=5,
        cars=5,
        down_s=20,
        settle_s=60,
        warmup_s=45,
        drain_s=600,
        derived_interval_s=30,
    )
    assert result["acknowledged"] > 0
    for fault in result["faults"]:
        assert fault["acknowledged"] > 0, fault
        for t in ("message_store", "ngsi_events", "postgresql_historic", "mysql_historic", "mongo_raw_history"):
            assert fault[t] == {"lost": 0, "duplicated": 0}, (fault["fault"], t, fault[t])
        assert fault["recovered_after_s"] is not None, fault
    whole = result["whole_run"]
    assert all(whole[t] == {"lost": 0, "duplicated": 0} for t in whole if t != "acknowledged"), whole
    sth = result["sth_aggregates"]
    assert set(sth) == {"second", "minute", "hour", "day", "month"}, sth
    assert all(r == {"missing": 0, "extra": 0, "sums_equal": True} for r in sth.values()), sth
    assert result["last_data_current"] == {"postgresql": True, "mysql": True}
    assert result["runs_left_started"] == 0
