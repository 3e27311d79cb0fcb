"""A transaction's numbering does not depend on how many partitions spread it, nor on the other
spaces numbered with it: i runs from each space's first_i in (id, guid) order, contiguous, whatever the
partition count the store picks."""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ngsi_assets.transforms.transaction_history import (
    Numbering,
    number_changes,
    numbering_counts,
    partition_offsets,
    sorted_for_numbering,
)

TS = datetime(2026, 3, 1, tzinfo=UTC)


def _numbered(spark: SparkSession, parts: int, spaces: int) -> dict[int, list[tuple]]:
    # Space s has 400 - 100 * s rows; the spaces' ids overlap, so only the space tells their rows apart.
    rows = [
        (1, f"id{n % 37:03d}", f"g{n:04d}", None, None, False, "{}", "h", n % 8, "someone", s)
        for s in range(spaces)
        for n in range(400 - 100 * s)
    ]
    changed = spark.createDataFrame(
        rows,
        "action int, id string, guid string, puuid string, created_at timestamp, deleted boolean, state string, "
        "state_hash string, bucket int, last_updated_by string, space_n int",
    )
    ordered = sorted_for_numbering(changed, parts).persist()
    try:
        counts = {(int(r[0]), int(r[1])): (int(r[3]), int(r[4])) for r in numbering_counts(ordered).collect()}
        numbering = {s: Numbering(first_i=101 + 1000 * s, tnx=7 + s, ts=TS, txn=2 + s) for s in range(spaces)}
        out = number_changes(ordered, offsets=partition_offsets(counts), numbering=numbering)
        found: dict[int, list[tuple]] = {}
        for r in out.select("space_n", "i", "id", "guid", "uuid", "tnx", "txn").orderBy("space_n", "i").collect():
            found.setdefault(r[0], []).append(tuple(r[1:]))
        return found
    finally:
        ordered.unpersist()


def test_numbering_is_the_same_for_one_or_several_partitions(spark: SparkSession) -> None:
    one = _numbered(spark, 1, 1)[0]
    several = _numbered(spark, 4, 1)[0]
    assert several == one
    assert [r[0] for r in one] == list(range(101, 501))
    assert [(r[1], r[2]) for r in one] == sorted((r[1], r[2]) for r in one)
    assert len({r[3] for r in one}) == 400


def test_spaces_numbered_together_are_numbered_as_alone(spark: SparkSession) -> None:
    """Three spaces in one numbering, over partitions that hold the end of one space and the start of
    the next: each space's rows get its own contiguous i, tnx and txn, as if numbered alone."""
    together = _numbered(spark, 5, 3)
    assert sorted(together) == [0, 1, 2]
    assert together[0] == _numbered(spark, 1, 1)[0]
    for s in (1, 2):
        got = together[s]
        assert [r[0] for r in got] == list(range(101 + 1000 * s, 101 + 1000 * s + 400 - 100 * s))
        assert [(r[1], r[2]) for r in got] == sorted((r[1], r[2]) for r in got)
        assert {(r[4], r[5]) for r in got} == {(7 + s, 2 + s)}
    assert len({r[3] for rows in together.values() for r in rows}) == 900
