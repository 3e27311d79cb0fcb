"""The versioned-entities checks' counts on small typed tables: sound tables count nothing, each broken
invariant is counted for its own entity only, whatever the other entities in the same job hold."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ngsi_assets.transforms.versioned_entities import invariant_counts, invariant_rows

COLUMNS = (
    "guid string, valid_from_timestamp timestamp, valid_to_timestamp timestamp, deleted_indicator boolean, "
    "speed string, field_provenance string"
)


def t(minute: int) -> datetime:
    return datetime(2026, 3, 1, 10, minute, tzinfo=UTC)


PROV = '{"speed": "m1"}'


def test_sound_and_broken_tables_are_counted_per_entity(spark: SparkSession) -> None:
    sound = spark.createDataFrame(
        [
            ("a", t(0), t(5), False, "1", PROV),
            ("a", t(5), None, False, "2", PROV),
            ("b", t(1), None, False, None, "{}"),
        ],
        COLUMNS,
    )
    broken = spark.createDataFrame(
        [
            # c: a gap between its versions (10:05 -> 10:06), and both open rows missing
            ("c", t(0), t(5), False, "1", PROV),
            ("c", t(6), None, False, "2", PROV),
            # d: two open rows (an overlap too), one with a populated field and no provenance for it
            ("d", t(0), None, False, "1", PROV),
            ("d", t(3), None, False, "2", "{}"),
        ],
        COLUMNS,
    )
    counts = invariant_counts([invariant_rows(sound, "car", ["speed"]), invariant_rows(broken, "truck", ["speed"])])
    assert counts["car"] == {
        "rows_in_rewritten_buckets": 3,
        "overlapping": 0,
        "open_rows_not_one": 0,
        "missing_provenance": 0,
    }
    assert counts["truck"] == {
        "rows_in_rewritten_buckets": 4,
        "overlapping": 2,
        "open_rows_not_one": 1,
        "missing_provenance": 1,
    }


def test_a_key_with_no_open_row_is_counted(spark: SparkSession) -> None:
    closed = spark.createDataFrame([("a", t(0), t(5), False, "1", PROV)], COLUMNS)
    assert invariant_counts([invariant_rows(closed, "car", ["speed"])])["car"]["open_rows_not_one"] == 1
