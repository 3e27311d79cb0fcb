"""A transaction's numbering does not depend on how many partitions spread it: i runs from first_i in
(id, guid) order, contiguous, whatever the partition count the store picks."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ngsi_assets.transforms.transaction_history import number_changes, partition_offsets, sorted_for_numbering


def _numbered(spark: SparkSession, parts: int) -> list[tuple]:
    rows = [(1, f"id{n % 37:03d}", f"g{n:04d}", None, None, False, "{}", "h", n % 8, "someone") for n in range(400)]
    changed = spark.createDataFrame(
        rows,
        "action int, id string, guid string, puuid string, created_at timestamp, deleted boolean, state string, "
        "state_hash string, bucket int, last_updated_by string",
    )
    ordered = sorted_for_numbering(changed, parts).persist()
    try:
        per_part = {int(r[0]): int(r[1]) for r in ordered.groupBy("_part").count().collect()}
        out = number_changes(
            ordered,
            offsets=partition_offsets(per_part),
            first_i=101,
            tnx=7,
            ts=datetime(2026, 3, 1, tzinfo=UTC),
            txn=2,
        )
        return sorted(tuple(r) for r in out.select("i", "id", "guid", "uuid").orderBy("i").collect())
    finally:
        ordered.unpersist()


def test_numbering_is_the_same_for_one_or_several_partitions(spark: SparkSession) -> None:
    one = _numbered(spark, 1)
    several = _numbered(spark, 4)
    assert several == one
    assert [r[0] for r in one] == list(range(101, 501))
    assert [(r[1], r[2]) for r in one] == sorted((r[1], r[2]) for r in one)
    assert len({r[3] for r in one}) == 400
