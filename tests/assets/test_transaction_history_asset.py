"""The transaction_history asset through Dagster: checks, metadata, reruns, and publication to real PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
import yaml
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.transaction_history import transaction_history
from ngsi_assets.assets.versioned_entities import versioned_entities
from ngsi_assets.history_store import HistoryStore
from ngsi_assets.sinks.history_pg import history_table_names
from resources.history import TransactionHistoryResource
from resources.lake import LakeResource
from resources.spark import default_spark_config
from resources.versioning import VersioningResource
from tests.assets.versioning_support import Msg, store_messages

H1 = "2026-03-01-10:00"
H2 = "2026-03-01-11:00"
SCHEMA = {
    "entities": {
        "product": {
            "fields": {
                "sku": {"type": "text", "key": True},
                "name": {"type": "text"},
            }
        }
    }
}


def _resources(tmp_path: Path, history: TransactionHistoryResource) -> dict[str, Any]:
    schema_file = tmp_path / "schema.yaml"
    schema_file.write_text(yaml.safe_dump(SCHEMA))
    return {
        "spark": LazyPySparkResource(spark_config=default_spark_config("local[2]", shuffle_partitions=4, ui=False)),
        "lake": LakeResource(root=str(tmp_path / "lake")),
        "versioning": VersioningResource(schema_path=str(schema_file), buckets=2),
        "history": history,
    }


def _run(resources: dict[str, Any], instance: DagsterInstance, hour: str) -> dict[str, Any]:
    result = materialize(
        [versioned_entities, transaction_history], partition_key=hour, resources=resources, instance=instance
    )
    assert result.success
    checks = {
        e.check_name: e.passed
        for e in result.get_asset_check_evaluations()
        if e.asset_key.to_user_string() == "transaction_history"
    }
    meta = result.asset_materializations_for_node("transaction_history")[0].metadata
    return {"checks": checks, "meta": {k: v.value for k, v in meta.items()}}


def _pg(url: str, query: str, params: tuple = ()) -> list[tuple]:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall()
    finally:
        conn.close()


def test_asset_commits_publishes_and_reruns_idempotently(
    spark: SparkSession, tmp_path: Path, postgres_db_url: str
) -> None:
    resources = _resources(tmp_path, TransactionHistoryResource(postgres_url=postgres_db_url, schema_name="hist"))
    lake = resources["lake"]
    instance = DagsterInstance.ephemeral()
    store_messages(
        spark,
        lake,
        [
            Msg("m1", "product", "2026-03-01T09:00:00", [{"sku": "A", "name": "Toaster"}], H1, source="erp"),
            Msg("m2", "product", "2026-03-01T09:01:00", [{"sku": "B", "name": "Kettle"}], H1, source="erp"),
        ],
    )
    first = _run(resources, instance, H1)
    assert first["checks"] == {"puuid_chains_unbroken": True, "uuids_unique": True, "tnx_non_decreasing": True}
    assert first["meta"]["transactions"] == 1
    assert first["meta"]["dagster/row_count"] == 2
    assert first["meta"]["published"]["product"]["rows"] == 2

    head, hst = history_table_names("product")
    before = _pg(postgres_db_url, f'SELECT i, action, tnx, id, uuid::text, puuid::text FROM hist."{hst}" ORDER BY i')
    again = _run(resources, instance, H1)
    assert again["meta"]["transactions"] == 0
    assert (
        _pg(postgres_db_url, f'SELECT i, action, tnx, id, uuid::text, puuid::text FROM hist."{hst}" ORDER BY i')
        == before
    )
    assert _pg(postgres_db_url, "SELECT count(*) FROM xyz_config.transactions") == [(1,)]

    store_messages(
        spark,
        lake,
        [
            Msg("m3", "product", "2026-03-01T10:00:00", [{"sku": "A", "name": "Toaster 2"}], H2, source="pim"),
            Msg("m4", "product", "2026-03-01T10:01:00", [{"sku": "B", "deleted_indicator": True}], H2, source="erp"),
        ],
    )
    second = _run(resources, instance, H2)
    assert second["meta"]["transactions"] == 1
    assert all(second["checks"].values())

    # The lake and PostgreSQL agree row for row, and PostgreSQL's own xyz_uuid_of gives every uuid.
    lake_rows = sorted(
        (r["i"], r["action"], r["tnx"], r["id"], r["uuid"], r["puuid"], r["last_updated_by"])
        for r in HistoryStore(spark, lake).history("product").collect()
    )
    pg_rows = _pg(
        postgres_db_url,
        f'SELECT i, action, tnx, id, uuid::text, puuid::text, lastupdatedby FROM hist."{hst}" ORDER BY i',
    )
    assert [tuple(r) for r in pg_rows] == lake_rows
    assert _pg(postgres_db_url, f'SELECT count(*) FROM hist."{hst}" WHERE uuid <> public.xyz_uuid_of(tnx, i)') == [(0,)]
    # HEAD holds the live features only: B was deleted.
    assert _pg(postgres_db_url, f"SELECT id, jsondata->'properties'->>'name' FROM hist.\"{head}\"") == [
        ("A", "Toaster 2")
    ]
    assert [r[0] for r in _pg(postgres_db_url, "SELECT tnx FROM xyz_config.transactions ORDER BY id")] == [
        c.tnx for c in HistoryStore(spark, lake).commits("product")
    ]


def test_asset_without_postgres_keeps_the_lake_history(spark: SparkSession, tmp_path: Path) -> None:
    space = "product"
    resources = _resources(tmp_path, TransactionHistoryResource())
    lake = resources["lake"]
    store_messages(spark, lake, [Msg("m1", space, "2026-03-01T09:00:00", [{"sku": "A", "name": "x"}], H1)])
    out = _run(resources, DagsterInstance.ephemeral(), H1)
    assert out["meta"]["published"] == {"skipped": "no PostgreSQL configured"}
    assert [r["id"] for r in HistoryStore(spark, lake).history(space).collect()] == ["A"]
