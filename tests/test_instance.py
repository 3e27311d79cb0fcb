"""The Dagster instance configurations: the embedded SQLite default and dagster-postgres."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest
from dagster import DagsterInstance, materialize
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.ingest import message_store
from ngsi_assets.ingest.landing import LandingWriter
from ngsi_assets.ngsi.envelope import Envelope
from resources.lake import LakeResource
from resources.landing import LandingZoneResource

REPO = Path(__file__).resolve().parents[1]
T = int(datetime(2026, 4, 2, 8, 30, tzinfo=UTC).timestamp() * 1000)


def _landing(root: Path) -> None:
    body = {"entity": "product", "timestamp": "2026-04-02T08:00:00", "data": [{"product_number": 1}]}
    with LandingWriter(root) as writer:
        writer.append_many_blocking(
            [Envelope(f"m{i}", T + i, "message", "datahub", "default", "/", None, None, None, "t",
                      json.dumps(body).encode()) for i in range(3)]
        )  # fmt: skip


def _materialize(instance: DagsterInstance, tmp_path: Path) -> str:
    _landing(tmp_path / "landing")
    result = materialize(
        [message_store],
        partition_key="2026-04-02-08:00",
        instance=instance,
        resources={
            "spark": LazyPySparkResource(spark_config={}),
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "landing": LandingZoneResource(root=str(tmp_path / "landing")),
        },
    )
    assert result.success
    return result.run_id


def test_embedded_default_is_sqlite(tmp_path: Path, spark: SparkSession) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, SqliteRunStorage)
        run_id = _materialize(instance, tmp_path)
        assert instance.get_run_by_id(run_id).is_success
    assert list(home.rglob("*.db")), "SQLite storage files under DAGSTER_HOME"


def test_production_storage_on_postgres(
    tmp_path: Path, spark: SparkSession, postgres_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-postgres.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_PG_URL", postgres_db_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        run_id = _materialize(instance, tmp_path)
    # Read the run back from PostgreSQL itself, not through Dagster's cache.
    with psycopg2.connect(postgres_db_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
        assert cur.fetchone() == ("SUCCESS",)
        cur.execute(
            "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
            (run_id,),
        )
        assert cur.fetchone() == (1,)
    assert not list(home.rglob("*.db")), "nothing in SQLite when PostgreSQL is configured"
