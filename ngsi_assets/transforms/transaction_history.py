"""The transaction history (seed 003) as pure DataFrame functions over the versioned entities.

A *space* is one target entity (its ``versioned_entities`` table); a *feature* is one key of it,
identified by ``id`` (the key value as text, or the JSON array of the key values for a compound
key). A feature's *state* is its current version (the open row, ``valid_to_timestamp`` null) as a
JSON object of the row's non-null columns: guid, valid_from_timestamp, deleted_indicator, the key and
business fields, source_message and field_provenance. The versioned entities keep the valid-time
history (what was true when); the transaction history keeps the transaction time (what the platform
knew after each materialization), so the two together are bitemporal.

Each transaction compares the features of the buckets that changed with the history's HEAD (the
newest history row per feature) and writes one history row per feature whose state differs:

- absent (never seen, or purged) -> present and live: ``CREATE``, ``puuid`` null;
- absent -> present and deleted (created and deleted between two transactions): ``DELETE``, ``puuid`` null;
- present -> live with another state: ``UPDATE`` (also a recreate after a delete);
- present -> deleted with another state: ``DELETE``;
- present -> gone from the versioned entities (every record of the key was withdrawn, e.g. by
  reprocessing): ``PURGE``, carrying the last state. A later reappearance starts a new chain with a
  ``CREATE``.

So per feature, in ``i`` order, ``puuid`` is null exactly on the first row and on the row after a
PURGE, and otherwise is the previous row's ``uuid`` (``chain_breaks`` counts the rows that are not).
A state that did not change writes nothing, which is why rerunning a partition adds no rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ngsi_assets.ngsi.entity_schema import DELETED, FIELD_PROVENANCE, GUID, SOURCE_MESSAGE, VALID_FROM, VALID_TO
from ngsi_assets.ngsi.transactions import Action
from ngsi_assets.transforms.transaction_ids import uuid_column

BUCKET = "bucket"
TXN = "txn"  # the per-space transaction counter: the history's partition column

# One row per change of a feature, in the seed's columns (lastUpdatedBy as last_updated_by, the
# feature's JSON as state) plus what the store needs: guid and bucket to find the row again,
# created_at (when the feature's chain began) and the state's hash.
HISTORY = StructType(
    [
        StructField("i", LongType(), False),
        StructField("action", IntegerType(), False),
        StructField("tnx", LongType(), False),
        StructField("ts", TimestampType(), False),
        StructField("id", StringType(), False),
        StructField("uuid", StringType(), False),
        StructField("puuid", StringType()),
        StructField("last_updated_by", StringType()),
        StructField("created_at", TimestampType(), False),
        StructField("deleted", BooleanType(), False),
        StructField("state", StringType(), False),
        StructField("state_hash", StringType(), False),
        StructField("guid", StringType(), False),
        StructField(BUCKET, IntegerType(), False),
        StructField(TXN, LongType(), False),
    ]
)

# The newest history row of every feature not purged: what the next transaction compares against.
HEAD = StructType([f for f in HISTORY.fields if f.name != TXN])

# The features of versioned-entity rows as the history sees them.
CURRENT = StructType(
    [
        StructField("guid", StringType(), False),
        StructField(BUCKET, IntegerType(), False),
        StructField("id", StringType(), False),
        StructField("deleted", BooleanType(), False),
        StructField("source_message", StringType(), False),
        StructField("state", StringType(), False),
        StructField("state_hash", StringType(), False),
    ]
)

_PROVENANCE = MapType(StringType(), StructType([StructField("m", StringType()), StructField("p", IntegerType())]))
_STANDARD = (GUID, VALID_FROM, DELETED)
_TRAILING = (SOURCE_MESSAGE, FIELD_PROVENANCE)


def feature_id(key_fields: Sequence[str]) -> Column:
    """A feature's ``id``: the key value as text, or the JSON array of the key values (as text)."""
    if not key_fields:
        raise ValueError("a space needs at least one key field")
    if len(key_fields) == 1:
        return F.col(key_fields[0]).cast("string")
    return F.to_json(F.array(*[F.col(k).cast("string") for k in key_fields]))


def current_features(versions: DataFrame, key_fields: Sequence[str]) -> DataFrame:
    """One row per guid of a versioned-entities table: the open version as a feature (``CURRENT``).

    The state lists the standard columns first, then the business fields by name, then source_message
    and field_provenance (as a JSON object), leaving nulls out: a column that appears in the table
    (a new NGSI attribute) does not change the state of rows that do not have it.
    """
    business = sorted(c for c in versions.columns if c not in (*_STANDARD, *_TRAILING, VALID_TO, BUCKET))
    state = F.to_json(
        F.struct(
            *[F.col(c) for c in _STANDARD],
            *[F.col(c) for c in business],
            F.col(SOURCE_MESSAGE),
            F.from_json(F.col(FIELD_PROVENANCE), _PROVENANCE).alias(FIELD_PROVENANCE),
        ),
        {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"},
    )
    return (
        versions.where(F.col(VALID_TO).isNull())
        .select(
            F.col(GUID).alias("guid"),
            F.col(BUCKET),
            feature_id(key_fields).alias("id"),
            F.col(DELETED).alias("deleted"),
            F.col(SOURCE_MESSAGE).alias("source_message"),
            state.alias("state"),
        )
        .withColumn("state_hash", F.sha2(F.col("state"), 256))
    )


def changes(head: DataFrame, current: DataFrame, by: Sequence[str] = ()) -> DataFrame:
    """The features whose state differs between ``head`` (HEAD rows) and ``current`` (CURRENT rows).

    Both must cover the same buckets. One row per changed guid: action, puuid, created_at (null for a
    new chain), deleted, state, state_hash, id, guid, bucket, source_message (null for a PURGE).
    ``by``: columns both have that tell spaces apart (several spaces compared in one pass); kept.
    """
    old = head.select(
        *by,
        F.col("guid"),
        F.col(BUCKET).alias("_old_bucket"),
        F.col("id").alias("_old_id"),
        F.col("uuid").alias("_old_uuid"),
        F.col("created_at").alias("_old_created"),
        F.col("deleted").alias("_old_deleted"),
        F.col("state").alias("_old_state"),
        F.col("state_hash").alias("_old_hash"),
    )
    joined = old.join(current, [*by, "guid"], "full_outer")
    has_old = F.col("_old_uuid").isNotNull()
    has_new = F.col("state").isNotNull()
    action = (
        F.when(has_old & ~has_new, F.lit(int(Action.PURGE)))
        .when(F.col("deleted"), F.lit(int(Action.DELETE)))
        .when(has_old, F.lit(int(Action.UPDATE)))
        .otherwise(F.lit(int(Action.CREATE)))
    )
    return joined.where(~has_old | ~has_new | (F.col("_old_hash") != F.col("state_hash"))).select(
        *by,
        action.alias("action"),
        F.col("_old_uuid").alias("puuid"),
        F.col("_old_created").alias("created_at"),
        F.coalesce(F.col("deleted"), F.col("_old_deleted")).alias("deleted"),
        F.coalesce(F.col("state"), F.col("_old_state")).alias("state"),
        F.coalesce(F.col("state_hash"), F.col("_old_hash")).alias("state_hash"),
        F.coalesce(F.col("id"), F.col("_old_id")).alias("id"),
        F.col("guid"),
        F.coalesce(F.col(BUCKET), F.col("_old_bucket")).alias(BUCKET),
        F.col("source_message"),
    )


SPACE_N = "space_n"  # the space of a row being numbered: its index in the run's spaces


@dataclass(frozen=True)
class Numbering:
    """What numbers one space's transaction: its first ``i``, tnx, time and counter."""

    first_i: int
    tnx: int
    ts: datetime
    txn: int


def sorted_for_numbering(changed: DataFrame, partitions: int) -> DataFrame:
    """``changed`` (the changes of one or several spaces, told apart by the int column ``SPACE_N``)
    range-partitioned and sorted by (space, id, guid), with ``_part`` (its partition) and ``_pos`` (its
    position in the partition), from which ``number_changes`` derives contiguous ``i`` values per space.

    Persist the result before counting it (``numbering_counts``): the numbering must see the same
    partitions.
    """
    mono = F.monotonically_increasing_id()  # (partition index << 33) + position, in sorted order
    return (
        changed.repartitionByRange(max(1, partitions), SPACE_N, "id", "guid")
        .sortWithinPartitions(SPACE_N, "id", "guid")
        .withColumn("_mono", mono)
        .withColumn("_part", F.shiftright(F.col("_mono"), 33))
        .withColumn("_pos", F.col("_mono").bitwiseAND(F.lit((1 << 33) - 1)))
        .drop("_mono")
    )


def numbering_counts(ordered: DataFrame) -> DataFrame:
    """Per (space, partition, action) of ``sorted_for_numbering``'s rows: their count and smallest ``_pos``
    (a few rows per space: what ``partition_offsets`` needs, and the transaction's action counts)."""
    return ordered.groupBy(SPACE_N, "_part", "action").agg(
        F.count(F.lit(1)).alias("count"), F.min("_pos").alias("start")
    )


def partition_offsets(counts: Mapping[tuple[int, int], tuple[int, int]]) -> dict[tuple[int, int], int]:
    """(space, partition) -> (rows, smallest ``_pos``) to (space, partition) -> what to add to a row's
    ``_pos`` to get its place among its space's rows: the space's rows in the partitions before, less
    the first ``_pos`` of the space in this one (a partition can hold the end of one space and the start
    of the next)."""
    offsets: dict[tuple[int, int], int] = {}
    before: dict[int, int] = {}
    for space, part in sorted(counts):
        rows, start = counts[(space, part)]
        offsets[(space, part)] = before.get(space, 0) - start
        before[space] = before.get(space, 0) + rows
    return offsets


def by_space(values: Mapping[int, object]) -> Column:
    """The value of the row's space (a literal map lookup)."""
    return F.element_at(
        F.create_map(*[x for k, v in sorted(values.items()) for x in (F.lit(k), F.lit(v))]), F.col(SPACE_N)
    )


def number_changes(
    ordered: DataFrame, *, offsets: Mapping[tuple[int, int], int], numbering: Mapping[int, Numbering]
) -> DataFrame:
    """HISTORY rows (and ``SPACE_N``) for one transaction per space: ``i`` from the space's ``first_i``
    upwards in (id, guid) order, uuid from (tnx, i).

    ``ordered`` comes from ``sorted_for_numbering`` over ``changes`` with a ``last_updated_by`` column;
    ``offsets`` from ``partition_offsets`` of ``numbering_counts`` (a few numbers per space are all that
    reach the driver); ``numbering``: each space's ``Numbering``.
    """
    key = F.col(SPACE_N).cast("long") * F.lit(1 << 32) + F.col("_part")
    offset_of = F.create_map(
        *[x for (space, part), off in sorted(offsets.items()) for x in (F.lit((space << 32) + part), F.lit(off))]
    )
    first_i = by_space({s: n.first_i for s, n in numbering.items()})
    tnx = by_space({s: n.tnx for s, n in numbering.items()}).cast("long")
    ts_col = by_space({s: n.ts for s, n in numbering.items()}).cast("timestamp")
    i = (first_i + F.element_at(offset_of, key) + F.col("_pos")).cast("long")
    created = F.when(F.col("created_at").isNull(), ts_col).otherwise(F.col("created_at"))
    return ordered.select(
        i.alias("i"),
        F.col("action").cast("int").alias("action"),
        tnx.alias("tnx"),
        ts_col.alias("ts"),
        F.col("id"),
        uuid_column(tnx, i).alias("uuid"),
        F.col("puuid"),
        F.col("last_updated_by"),
        created.alias("created_at"),
        F.col("deleted"),
        F.col("state"),
        F.col("state_hash"),
        F.col("guid"),
        F.col(BUCKET).cast("int").alias(BUCKET),
        by_space({s: n.txn for s, n in numbering.items()}).cast("long").alias(TXN),
        F.col(SPACE_N),
    )


def advance_head(head: DataFrame, history: DataFrame, by: Sequence[str] = ()) -> DataFrame:
    """HEAD after ``history`` rows (of later transactions than ``head``): each guid's newest row, purged
    guids gone. ``by``: columns both have that tell spaces apart; kept."""
    newest = Window.partitionBy(*by, "guid").orderBy(F.col("i").desc())
    latest = (
        history.select(*by, *HEAD.fieldNames())
        .withColumn("_rank", F.row_number().over(newest))
        .where(F.col("_rank") == 1)
        .drop("_rank")
    )
    kept = head.select(*by, *HEAD.fieldNames()).join(latest.select(*by, "guid"), [*by, "guid"], "left_anti")
    return kept.unionByName(latest).where(F.col("action") != int(Action.PURGE))


def last_updated_by(changed: DataFrame, messages: DataFrame, by: Sequence[str] = ()) -> DataFrame:
    """``changed`` with ``last_updated_by``: who sent the message behind the change (user, else source system).

    The message is the state's source_message if ``messages`` (message_identifier, user, source_system:
    the messages the run processed) has it, else the smallest of the run's messages named in the
    state's field_provenance: a late message that changed a field of the current version is in the
    provenance but is not the version's source. A change none of the run's messages explains (made by
    an earlier run whose history was not recorded, or a PURGE) gets null. ``by``: columns of
    ``changed`` that tell spaces apart (a guid is unique within its space).
    """
    who = messages.select(
        F.col("message_identifier").alias("_m"),
        F.coalesce(F.col("user"), F.col("source_system")).alias("_who"),
    ).dropDuplicates(["_m"])
    provenance = F.from_json(F.get_json_object(F.col("state"), "$." + FIELD_PROVENANCE), _PROVENANCE)
    candidates = changed.select(
        *by,
        "guid",
        F.explode(
            F.array_union(
                F.array(F.struct(F.lit(0).alias("rank"), F.col("source_message").alias("m"))),
                F.transform(
                    F.coalesce(F.map_values(provenance), F.array().cast("array<struct<m:string,p:int>>")),
                    lambda e: F.struct(F.lit(1).alias("rank"), e["m"].alias("m")),
                ),
            )
        ).alias("c"),
    ).where(F.col("c.m").isNotNull())
    best = (
        candidates.join(who, F.col("c.m") == F.col("_m"))
        .groupBy(*by, "guid")
        .agg(F.min(F.struct(F.col("c.rank"), F.col("c.m"), F.col("_who"))).alias("_best"))
        .select(*by, "guid", F.col("_best._who").alias("last_updated_by"))
    )
    purge = F.col("action") == int(Action.PURGE)
    return changed.join(best, [*by, "guid"], "left").withColumn(
        "last_updated_by", F.when(purge, F.lit(None).cast("string")).otherwise(F.col("last_updated_by"))
    )


# -- reading the history --------------------------------------------------------------------------


def as_of(history: DataFrame, *, tnx: int | None = None, ts: datetime | None = None) -> DataFrame:
    """The newest row of every feature at transaction ``tnx`` (inclusive) or time ``ts`` (inclusive).

    Purged features are left out; deleted ones are kept (their state says deleted_indicator true),
    as the versioned entities keep them. With neither bound: the HEAD.
    """
    rows = history
    if tnx is not None:
        rows = rows.where(F.col("tnx") <= F.lit(tnx))
    if ts is not None:
        rows = rows.where(F.col("ts") <= F.lit(ts).cast("timestamp"))
    newest = Window.partitionBy("id").orderBy(F.col("i").desc())
    return (
        rows.withColumn("_rank", F.row_number().over(newest))
        .where((F.col("_rank") == 1) & (F.col("action") != int(Action.PURGE)))
        .drop("_rank")
    )


def live(state: DataFrame) -> DataFrame:
    """The features of an ``as_of`` result that exist in the space (not deleted)."""
    return state.where(F.col("action").isin(int(Action.CREATE), int(Action.UPDATE)))


def difference(before: DataFrame, after: DataFrame) -> DataFrame:
    """Per id, how two ``as_of`` results differ: change ``added``/``removed``/``changed``, both states and uuids."""
    a = before.select(
        "id", F.col("uuid").alias("uuid_before"), F.col("state").alias("state_before"), F.col("state_hash").alias("_hb")
    )
    b = after.select(
        "id", F.col("uuid").alias("uuid_after"), F.col("state").alias("state_after"), F.col("state_hash").alias("_ha")
    )
    joined = a.join(b, "id", "full_outer")
    change = (
        F.when(F.col("_hb").isNull(), F.lit("added"))
        .when(F.col("_ha").isNull(), F.lit("removed"))
        .otherwise(F.lit("changed"))
    )
    return joined.where(F.col("_hb").isNull() | F.col("_ha").isNull() | (F.col("_hb") != F.col("_ha"))).select(
        "id", change.alias("change"), "uuid_before", "uuid_after", "state_before", "state_after"
    )


def layer(base: DataFrame, delta: DataFrame) -> DataFrame:
    """A layer view: ``delta`` (an ``as_of`` result of the delta space) read through onto ``base``.

    Per id: a delta CREATE or UPDATE shows the delta's state; a delta DELETE hides the feature; with no
    delta row (never written, or purged, so ``as_of`` left it out) the base's live feature shows.
    Columns: id, layer ('delta' or 'base'), uuid, state.
    """
    from_delta = live(delta).select("id", F.lit("delta").alias("layer"), "uuid", "state")
    from_base = (
        live(base)
        .join(delta.select("id"), "id", "left_anti")
        .select("id", F.lit("base").alias("layer"), "uuid", "state")
    )
    return from_delta.unionByName(from_base)


def chain_breaks(history: DataFrame, by: Sequence[str] = ()) -> DataFrame:
    """History rows that break their feature's puuid chain, with the reason.

    In ``i`` order per id: the first row and the row after a PURGE must have a null puuid (and be a
    CREATE, or a DELETE of a feature first seen deleted); every other row must have the previous
    row's uuid as puuid and must not be a CREATE. ``by``: columns that tell spaces apart; kept.
    """
    by_id = Window.partitionBy(*by, "id").orderBy("i")
    prev_uuid = F.lag("uuid").over(by_id)
    prev_action = F.lag("action").over(by_id)
    starts = prev_uuid.isNull() | (prev_action == int(Action.PURGE))
    rows = history.select(*by, "id", "i", "uuid", "puuid", "action", starts.alias("_start"), prev_uuid.alias("_prev"))
    reason = (
        F.when(F.col("_start") & F.col("puuid").isNotNull(), F.lit("chain start with a puuid"))
        .when(
            F.col("_start") & ~F.col("action").isin(int(Action.CREATE), int(Action.DELETE)),
            F.lit("chain start that is not a CREATE or DELETE"),
        )
        .when(~F.col("_start") & (F.col("action") == int(Action.CREATE)), F.lit("CREATE inside a chain"))
        .when(~F.col("_start") & ~F.col("puuid").eqNullSafe(F.col("_prev")), F.lit("puuid is not the previous uuid"))
    )
    return rows.select(*by, "id", "i", "uuid", "puuid", "action", reason.alias("reason")).where(
        F.col("reason").isNotNull()
    )


FAULT_CHAIN = "chain"
FAULT_UUID = "uuid"


def transaction_faults(
    tips: DataFrame, rows: DataFrame, first_i: int | Column, last_i: int | Column, by: Sequence[str] = ()
) -> DataFrame:
    """The faults of one transaction's stored ``rows`` (its ``i`` from ``first_i`` to ``last_i``).

    ``tips``: HEAD before the transaction (the newest earlier row of every live feature of the
    buckets it changed). So the cost follows the transaction, not the history's length, and still
    covers what a scan of the whole history would find in these rows:

    - ``chain``: ``chain_breaks`` of each feature's tip followed by its new row: a puuid that is not
      the tip's uuid, a chain start with a puuid, a CREATE of a feature that has a live tip;
    - ``uuid``: a row whose uuid is not the one of its (tnx, i) or whose ``i`` is outside the range,
      and a uuid found twice among the rows and the tips. Together with each transaction's range
      starting after the previous one's (``record`` numbers them so), a uuid is unique in the whole
      history without reading it.

    ``by``: columns of ``tips`` and ``rows`` that tell the transactions of several spaces apart, each
    checked within its space in one pass (``first_i`` and ``last_i`` are then columns: the row's
    space's). Columns: ``by``, check (``chain`` or ``uuid``), id, i, uuid, reason.
    """
    cols = [*by, "id", "i", "uuid", "puuid", "action"]
    first = first_i if isinstance(first_i, Column) else F.lit(first_i)
    last = last_i if isinstance(last_i, Column) else F.lit(last_i)
    mine = F.col("i").between(first, last)
    context = tips.join(rows.select(*by, "id").distinct(), [*by, "id"], "left_semi").select(*cols)
    breaks = chain_breaks(context.unionByName(rows.select(*cols)), by).where(mine)
    chain = breaks.select(*by, F.lit(FAULT_CHAIN).alias("check"), "id", "i", "uuid", "reason")
    misnumbered = rows.where(~F.col("uuid").eqNullSafe(uuid_column(F.col("tnx"), F.col("i"))) | ~mine).select(
        *by,
        F.lit(FAULT_UUID).alias("check"),
        "id",
        "i",
        "uuid",
        F.lit("uuid is not the one of its (tnx, i), or i is outside the transaction's range").alias("reason"),
    )
    seen = (
        tips.select(*by, "uuid")
        .unionByName(rows.select(*by, "uuid"))
        .groupBy(*by, "uuid")
        .count()
        .where(F.col("count") > 1)
    )
    twice = rows.join(seen, [*by, "uuid"], "left_semi").select(
        *by, F.lit(FAULT_UUID).alias("check"), "id", "i", "uuid", F.lit("uuid found twice").alias("reason")
    )
    return chain.unionByName(misnumbered).unionByName(twice)
