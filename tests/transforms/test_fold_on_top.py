"""Which keys a batch folds on from their latest version, and that the fold then equals a fold of all
their records (small frames)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.transforms.versioned_entities import (
    ENTITY_RECORDS,
    RECORD_MARKS,
    SEEN,
    fold_starts,
    fold_versions,
    keys_after_their_marks,
    keys_never_stored,
    merged_marks,
    record_marks,
    typed_versions,
)

pytestmark = pytest.mark.spark

FIELDS = {"id": None, "type": None, "speed": None, "colour": None}


def at(minute: int) -> datetime:
    return datetime(2026, 3, 1, 10, minute, tzinfo=UTC)


def rec(guid: str, minute: int, message: str, op: str = "upsert", **fields: str | None) -> tuple:
    values = {"id": guid, "type": "Car", **fields}
    return ("Car", guid, guid, at(minute), message, 0, op, 0, values, {}, ["id", "type"], "2026-03-01-10", 1)


def _table(spark: SparkSession, records: list[tuple]):  # noqa: ANN202
    df = spark.createDataFrame(records, ENTITY_RECORDS)
    return typed_versions(fold_versions(df), FIELDS)


def _rows(df) -> list[tuple]:  # noqa: ANN001
    return sorted(tuple(r) for r in df.collect())


def test_keys_after_their_marks(spark: SparkSession) -> None:
    stored = [
        rec("a", 1, "m1", speed="1"),
        rec("a", 5, "m2", speed="1"),  # changes nothing, but is later than a's open row
        rec("b", 1, "m3", speed="2"),
        rec("c", 1, "m4", speed="3"),
        rec("d", 9, "m5", op=SEEN),  # seen only: nothing folded
    ]
    new = [
        rec("a", 4, "n1", speed="4"),  # after a's open row (1), not after its stored no-op (5)
        rec("b", 3, "n2", speed="5"),
        rec("c", 3, "n3", speed="6"),
        rec("c", 2, "n4", speed="7"),
        rec("d", 10, "n5", speed="8"),
        rec("e", 1, "n6", speed="9"),  # a new key: nothing stored
    ]
    stored_df = spark.createDataFrame(stored, ENTITY_RECORDS)
    table = _table(spark, stored)
    new_df = spark.createDataFrame(new, ENTITY_RECORDS)
    marks = record_marks(stored_df)
    on_top = keys_after_their_marks(marks, new_df, table)
    assert sorted(r.guid for r in on_top.collect()) == ["b", "c"]
    # A run killed between its two writes: the table already holds b's new version, the records not.
    ahead = _table(spark, [*stored, new[1]])
    on_top = keys_after_their_marks(marks, new_df, ahead)
    assert sorted(r.guid for r in on_top.collect()) == ["c"]
    # A run killed after its marks, before its records: c's mark holds its new records' time.
    marks_ahead = merged_marks([marks, record_marks(spark.createDataFrame([new[2]], ENTITY_RECORDS))])
    on_top = keys_after_their_marks(marks_ahead, new_df, table)
    assert sorted(r.guid for r in on_top.collect()) == ["b"]


def test_keys_never_stored(spark: SparkSession) -> None:
    """Keys with no mark and no open row: folded from their new records alone, which gives the fold of
    all their records (a stored ``seen`` record folds nothing)."""
    stored = [rec("a", 1, "m1", speed="1"), rec("d", 9, "m5", op=SEEN)]
    new = [
        rec("a", 4, "n1", speed="4"),
        rec("d", 10, "n5", speed="8"),
        rec("e", 1, "n6", speed="9"),
        rec("e", 2, "n7", speed="10"),
        rec("f", 3, "n8", op=SEEN),  # nothing to fold
    ]
    stored_df, new_df = spark.createDataFrame(stored, ENTITY_RECORDS), spark.createDataFrame(new, ENTITY_RECORDS)
    table = _table(spark, stored)
    marks = record_marks(stored_df)
    never = keys_never_stored(marks, new_df, table)
    assert sorted(r.guid for r in never.collect()) == ["d", "e"]
    alone = fold_versions(new_df.where("guid in ('d', 'e')"))
    everything = fold_versions(stored_df.unionByName(new_df)).where("guid in ('d', 'e')")
    assert _rows(typed_versions(alone, FIELDS)) == _rows(typed_versions(everything, FIELDS))
    # A run killed after its marks, before its records: e is marked, so it is folded as a stored key.
    marked = merged_marks([marks, record_marks(spark.createDataFrame([new[2]], ENTITY_RECORDS))])
    assert sorted(r.guid for r in keys_never_stored(marked, new_df, table).collect()) == ["d"]
    # Killed between the versions and the records (a table ahead): e's open row keeps it out too.
    ahead = _table(spark, [*stored, new[2]])
    assert sorted(r.guid for r in keys_never_stored(marks, new_df, ahead).collect()) == ["d"]


def test_record_marks_merged_equal_the_marks_of_all_records(spark: SparkSession) -> None:
    """Marks kept batch by batch (merged) equal marks of every record at once; a key with ``seen``
    records only has no mark, and a later ``seen`` record does not move a mark."""
    first = [rec("a", 1, "m1", speed="1"), rec("a", 5, "m2", speed="1"), rec("d", 9, "m5", op=SEEN)]
    second = [rec("a", 3, "n1", speed="4"), rec("b", 2, "n2", speed="5"), rec("b", 8, "n3", op=SEEN)]
    one, two = (spark.createDataFrame(r, ENTITY_RECORDS) for r in (first, second))
    merged = merged_marks([record_marks(one), record_marks(two)])
    assert _rows(merged) == _rows(record_marks(one.unionByName(two)))
    assert _rows(merged) == _rows(spark.createDataFrame([("a", at(5), 1), ("b", at(2), 1)], RECORD_MARKS))


def test_a_fold_on_from_the_open_rows_equals_a_fold_of_everything(spark: SparkSession) -> None:
    stored = [
        rec("a", 1, "m1", speed="1", colour="red"),
        rec("a", 2, "m2", speed="2"),
        rec("a", 3, "m3", colour=None),  # an explicit null: in the provenance, null in the table
        rec("b", 1, "m4", speed="5"),
        rec("b", 2, "m5", op="delete"),
    ]
    new = [rec("a", 4, "n1", speed="3"), rec("a", 5, "n2", speed="3"), rec("b", 6, "n3", colour="blue")]
    table = _table(spark, stored)
    expected = _rows(_table(spark, [*stored, *new]))
    starts = fold_starts(table, "Car", list(FIELDS))
    on_top = typed_versions(fold_versions(spark.createDataFrame(new, ENTITY_RECORDS), starts), FIELDS)
    earlier = table.where("valid_to_timestamp IS NOT NULL")
    assert _rows(on_top.unionByName(earlier)) == expected
    assert len(expected) == 7  # a: 4 versions (n2 changes nothing); b: 3 (a delete, then a recreate)
