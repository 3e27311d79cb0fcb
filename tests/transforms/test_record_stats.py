"""``record_stats``: what a run learns about its default NGSI records in one small job, per entity and
bucket: how many records (SEEN markers not counted), how many keys (theirs counted) and every field
name they carry."""

from __future__ import annotations

from pyspark.sql import SparkSession

from ngsi_assets.transforms.versioned_entities import SEEN, record_stats

RECORDS = "entity string, guid string, bucket int, op string, fields map<string,string>"


def test_counts_records_and_gathers_field_names_per_entity_and_bucket(spark: SparkSession) -> None:
    records = spark.createDataFrame(
        [
            ("car", "c1", 1, "upsert", {"id": "c1", "speed": "5"}),
            ("car", "c1", 1, "upsert", {"id": "c1", "speed": "6"}),
            ("car", "c2", 1, "delete", {"id": "c2"}),
            ("car", "c3", 1, SEEN, {"id": "c3", "marker_only": "x"}),
            ("car", "c9", 7, "upsert", {"id": "c9", "colour": "red", "speed": "1"}),
            ("bus", "b1", 1, "upsert", {"id": "b1", "route": "4"}),
            ("bus", "b2", 1, SEEN, {"id": "b2"}),
            ("tram", "t1", 3, SEEN, {"id": "t1"}),
            ("tram", "t1", 3, "upsert", {}),
        ],
        RECORDS,
    )
    stats = {
        (r["entity"], r["bucket"]): (r["records"], r["keys"], r["field_names"]) for r in record_stats(records).collect()
    }
    assert stats == {
        ("car", 1): (3, 3, ["id", "marker_only", "speed"]),
        ("car", 7): (1, 1, ["colour", "id", "speed"]),
        ("bus", 1): (1, 2, ["id", "route"]),
        ("tram", 3): (1, 1, ["id"]),
    }


def test_no_records_no_rows(spark: SparkSession) -> None:
    assert record_stats(spark.createDataFrame([], RECORDS)).count() == 0
