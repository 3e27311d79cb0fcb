"""Helpers for the versioned-entities tests: data-hub messages straight into the lake's message store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.assets.versioned_entities import LOG_DS, VERSIONS_DS, VersioningRun, versioned_entities
from ngsi_assets.ngsi.entity_schema import EntitySchema, entity_folder, parse_schema
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENTS
from ngsi_assets.transforms.versioned_entities import MESSAGE_LOG
from resources.lake import LakeResource, key_to_dt
from resources.spark import default_spark_config
from resources.versioning import VersioningResource


@dataclass(frozen=True)
class Msg:
    """A data-hub message as the message store holds it."""

    mid: str
    entity: str
    effective: str  # ISO, e.g. 2019-06-05T09:31:17
    data: list[dict[str, Any]] | str  # records, or CSV text for a csv reader
    hour: str = "2026-03-01-10:00"  # receive hour (partition)
    refresh: bool = False
    source: str | None = None

    def row(self, minute: int = 0) -> dict[str, Any]:
        dt = key_to_dt(self.hour)
        recv = datetime.strptime(dt, "%Y-%m-%d-%H").replace(minute=minute, tzinfo=UTC)
        body = {"entity": self.entity, "timestamp": self.effective, "data": self.data}
        if self.refresh:
            body["refresh"] = True
        return {
            "message_identifier": self.mid,
            "source_entity": self.entity,
            "message_timestamp": recv.replace(tzinfo=None),
            "effective_timestamp": datetime.fromisoformat(self.effective),
            "data": json.dumps(body),
            "status": 0,
            "error_text": None,
            "recv_ms": int(recv.timestamp() * 1000),
            "kind": "message",
            "format": "datahub",
            "service": "default",
            "service_path": "/",
            "correlator": None,
            "cbnotif": None,
            "guid": None,
            "origin": "test",
            "subscription_id": None,
            "refresh": self.refresh,
            "source_system": self.source,
            "user": None,
            "dt": dt,
        }


def store_messages(spark: SparkSession, lake: LakeResource, messages: list[Msg]) -> list[str]:
    """Write the messages into the message store, replacing their hours; returns the hour keys."""
    hours = sorted({m.hour for m in messages})
    rows = [m.row(minute=i % 60) for i, m in enumerate(messages)]
    df = spark.createDataFrame(rows, MESSAGE_STORE) if rows else spark.createDataFrame([], MESSAGE_STORE)
    lake.replace_partitions(df, "message_store", hours)
    return hours


def process(spark: SparkSession, lake: LakeResource, schema: EntitySchema, hours: list[str], buckets: int = 4) -> None:
    """One versioning run over ``hours`` (what one materialization does)."""
    messages = lake.read(spark, "message_store", MESSAGE_STORE, hours)
    events = lake.read(spark, "ngsi_events", NGSI_EVENTS, hours)
    VersioningRun(spark, lake, schema, buckets, hours).run(messages, events)


def table(spark: SparkSession, lake: LakeResource, entity: str) -> DataFrame:
    df = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder(entity))
    assert df is not None, f"no table for {entity}"
    return df.drop("bucket")


def table_rows(spark: SparkSession, lake: LakeResource, entity: str, columns: list[str]) -> list[tuple]:
    return sorted((tuple(r) for r in table(spark, lake, entity).select(*columns).collect()), key=repr)


def log_rows(spark: SparkSession, lake: LakeResource) -> dict[str, tuple[int, str | None]]:
    df = lake.read(spark, LOG_DS, MESSAGE_LOG)
    return {r["message_identifier"]: (r["status"], r["error_text"]) for r in df.collect()}


def schema_of(doc: dict[str, Any]) -> EntitySchema:
    return parse_schema(doc)


def materialize_versioned(
    lake_root: str, hours: list[str], schema_path: str | None = None, buckets: int | None = 4
) -> Any:
    """Materialize the asset itself through Dagster (checks and metadata); ``buckets`` None as with
    NGSI_ENTITY_BUCKETS unset."""
    resources = {
        "spark": LazyPySparkResource(spark_config=default_spark_config("local[2]", shuffle_partitions=4, ui=False)),
        "lake": LakeResource(root=lake_root),
        "versioning": VersioningResource(schema_path=schema_path, buckets=buckets),
    }
    from dagster import PartitionKeyRange

    if len(hours) == 1:
        kwargs: dict[str, Any] = {"partition_key": hours[0]}
    else:
        kwargs = {"partition_key_range": PartitionKeyRange(hours[0], hours[-1])}
    return materialize([versioned_entities], resources=resources, instance=DagsterInstance.ephemeral(), **kwargs)


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def provenance(df_value: str) -> dict[str, Any]:
    return json.loads(df_value)


__all__ = ["F", "Msg", "process", "store_messages", "table_rows", "log_rows", "schema_of", "ts"]
