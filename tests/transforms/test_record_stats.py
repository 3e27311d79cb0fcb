"""``record_stats``: what a run learns about its default NGSI records in one small job, per entity and
bucket: how many records (SEEN markers not counted) and every field name they carry."""

from __future__ import annotations

from pyspark.sql import SparkSession

from ngsi_assets.transforms.versioned_entities import SEEN, record_stats

RECORDS = "entity string, bucket int, op string, fields map<string,string>"


def test_counts_records_and_gathers_field_names_per_entity_and_bucket(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            ("car", 1, "upsert", {"id": "c1", "speed": "5"}),
            ("car", 1, "delete", {"id": "c2"}),
            ("car", 1, SEEN, {"id": "c3", "marker_only": "x"}),
            ("car", 7, "upsert", {"id": "c9", "colour": "red", "speed": "1"}),
            ("bus", 1, "upsert", {"id": "b1", "route": "4"}),
            ("bus", 1, SEEN, {"id": "b2"}),
            ("tram", 3, SEEN, {"id": "t1"}),
            ("tram", 3, "upsert", {}),
        ],
        RECORDS,
    )
    stats = {(r["entity"], r["bucket"]): (r["records"], r["field_names"]) for r in record_stats(records).collect()}
    assert stats == {
        ("car", 1): (2, ["id", "marker_only", "speed"]),
        ("car", 7): (1, ["colour", "id", "speed"]),
        ("bus", 1): (1, ["id", "route"]),
        ("tram", 3): (1, ["id"]),
    }


def test_no_records_no_rows(spark: SparkSession) -> None:
    assert record_stats(spark.createDataFrame([], RECORDS)).count() == 0
