"""``ngsi-assets spark warm-up`` through a real Spark Connect server: the main job runs there on a
throwaway sample, and nothing of the platform's (its lake, landing zone, Dagster home, databases) is
read or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ngsi_assets.spark_warmup import warm_up
from tests.support.spark_servers import connect_url  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_the_warm_up_runs_through_the_server_and_leaves_nothing(
    connect_url: str,  # noqa: F811 (fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    platform = tmp_path / "platform"
    # Databases that do not answer: a run given any of them would fail.
    sinks = tmp_path / "sql_sinks.yaml"
    sinks.write_text("postgresql:\n  url: postgresql://nobody:x@127.0.0.1:1/db\n  last_data_mode: both\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(platform / "home"),
        "NGSI_LAKE_ROOT": str(platform / "lake"),
        "NGSI_LANDING_ROOT": str(platform / "landing"),
        "NGSI_SQL_SINKS_CONFIG": str(sinks),
        "NGSI_MONGO_URL": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=500",
        "NGSI_MONGO_RAW_ENABLED": "true",
    }
    env.pop("NGSI_SPARK_MASTER", None)
    runs = warm_up(connect_url, 2, 500, base_env=env)
    assert len(runs) == 2
    assert all(r.seconds > 0 for r in runs)
    assert not platform.exists()
    assert list(scratch.iterdir()) == []
