"""NGSI events -> STH samples -> per-partition partial aggregates -> STH-Comet documents.

Pure DataFrame -> DataFrame functions: no I/O, no actions; the time used for expiration is passed in.
Every time computation works on epoch milliseconds and ``DateType`` days, so the result does not
depend on the session time zone.

Determinism: floating-point sums depend on the order of the additions, and Spark's ``sum`` adds in
whatever order rows arrive. Sums here are folds over sorted values (within a partition) and over
partials sorted by partition (across partitions), so the same lake gives the same bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from ngsi_assets.ngsi.sth_config import DataModel, Resolution, STHConfig
from ngsi_assets.ngsi.sth_naming import OCCUR_ESCAPES, RANGES, SLOTS, STHNameError, sth_names
from ngsi_assets.transforms.instants import metadata_instant_ms, time_instant_metadata

# A JSON number as text (what Orion sends for a number, or a sensor for a number in a string):
# optional '-', digits, optional fraction, optional exponent. It must also be finite as a double.
NUMERIC_PATTERN = r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
# Empty, or only Unicode white space (Java's \s with UNICODE_CHARACTER_CLASS).
WHITE_SPACE_PATTERN = r"(?U)^\s*$"

STATUS_SAMPLE = "sample"
STATUS_SKIPPED = "skipped"
STATUS_REJECTED = "rejected"

REASON_NULL = "null value: no sample"
REASON_WHITE_SPACE = "value made only of white space (ignore_white_spaces=true)"
REASON_NUL_VALUE = "string value contains a NUL character, which a MongoDB key (occur map) cannot hold"
REASON_DELETE = "entityDelete notification: a delete is not a measurement, no sample"
ENTITY_DELETE = "entityDelete"

# MongoDB refuses documents over 16 MiB; leave room for the envelope of the write command.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024 - 16 * 1024

ACTION_UPSERT = "upsert"
ACTION_DELETE = "delete"
ACTION_REJECT = "reject"
# A batch's point updates (``point_updates``): added to the stored document in place, left out
# (its origin has expired), or the document rebuilt whole from the rollups (a text value that a
# field path cannot name: the empty string).
ACTION_UPDATE = "update"
ACTION_EXPIRED = "expired"
ACTION_REBUILD = "rebuild"

_NAMES = StructType(
    [StructField("database", StringType()), StructField("collection", StringType()), StructField("error", StringType())]
)
_OCCUR = MapType(StringType(), LongType())
_LATEST = StructType(
    [
        StructField("timeMs", LongType()),
        StructField("recvTimeTs", LongType()),
        StructField("messageId", StringType()),
        StructField("entityIndex", IntegerType()),
        StructField("attrType", StringType()),
    ]
)

# The document identity: database, collection and the entity/attribute fields of _id (null where
# the data model leaves them out of _id), then resolution and origin.
ID_COLUMNS = ["database", "collection", "idEntityId", "idEntityType", "idAttrName"]
DOC_COLUMNS = [*ID_COLUMNS, "resolution", "origin"]
SLOT_COLUMNS = [*DOC_COLUMNS, "offset"]

# Per-partition partial aggregates: one row per (document, offset) and receive hour (dt).
STH_PARTIALS = StructType(
    [
        StructField("database", StringType(), False),
        StructField("collection", StringType(), False),
        StructField("idEntityId", StringType()),
        StructField("idEntityType", StringType()),
        StructField("idAttrName", StringType()),
        StructField("resolution", StringType(), False),
        StructField("origin", LongType(), False),
        StructField("offset", IntegerType(), False),
        StructField("samples", LongType(), False),
        StructField("numSamples", LongType(), False),
        StructField("sum", DoubleType()),
        StructField("sum2", DoubleType()),
        StructField("min", DoubleType()),
        StructField("max", DoubleType()),
        StructField("occur", _OCCUR),
        StructField("latest", _LATEST),
        StructField("dt", StringType(), False),
    ]
)

# Events that give no sample because they cannot be written, with the reason.
STH_REJECTS = StructType(
    [
        StructField("messageId", StringType(), False),
        StructField("entityIndex", IntegerType(), False),
        StructField("fiwareService", StringType(), False),
        StructField("fiwareServicePath", StringType(), False),
        StructField("entityId", StringType(), False),
        StructField("entityType", StringType()),
        StructField("attrName", StringType(), False),
        StructField("attrValue", StringType()),
        StructField("reason", StringType(), False),
        StructField("dt", StringType(), False),
    ]
)

# Rollups: the partials re-keyed by document bucket, so rebuilding a document reads only its own
# bucket (STH_ROLLUPS, partitioned by ``bucket``), whatever the history's age. ``part`` names what a
# row sums: for second, minute and hour documents the receive hour (``dt``) itself; for day and
# month documents the receive day (``YYYY-MM-DD``), the day's hour partials merged in hour order,
# so a slot of a month document holds about 31 rows rather than about 720.
BY_RECEIVE_DAY = (Resolution.DAY.value, Resolution.MONTH.value)
STH_ROLLUPS = StructType(
    [
        *[f for f in STH_PARTIALS.fields if f.name != "dt"],
        StructField("part", StringType(), False),
        StructField("bucket", StringType(), False),
    ]
)


POINT = StructType(
    [
        StructField("offset", IntegerType(), False),
        StructField("samples", LongType(), False),
        StructField("sum", DoubleType(), False),
        StructField("sum2", DoubleType(), False),
        StructField("min", DoubleType(), False),
        StructField("max", DoubleType(), False),
        StructField("occur", _OCCUR, False),
        StructField("numSamples", LongType(), False),
    ]
)

STH_DOCUMENTS = StructType(
    [
        *[f for f in STH_PARTIALS.fields if f.name in DOC_COLUMNS],
        StructField("range", StringType(), False),
        StructField("attrType", StringType()),
        StructField("numeric", BooleanType(), False),
        StructField("text", BooleanType(), False),
        StructField("points", ArrayType(POINT, False), False),
        StructField("totalSamples", LongType(), False),
        StructField("textSamples", LongType(), False),
        StructField("estimatedBytes", LongType(), False),
        StructField("action", StringType(), False),
        StructField("reason", StringType()),
    ]
)


def time_instant_ms() -> Column:
    """Epoch ms of the attribute's own TimeInstant metadata, or null if absent or not a time.

    The value may be ISO 8601 in any common form (a zone-less one is UTC) or an epoch number in
    milliseconds or seconds, as Cygnus accepts (``ngsi_assets.transforms.instants``).
    """
    return metadata_instant_ms(time_instant_metadata())


def names_udf(config: STHConfig, *, aggregated: bool = True):  # noqa: ANN201 (a pyspark UDF)
    """A UDF (service, path, entity id, type, attribute) -> (database, collection, error) under
    ``config``'s naming: the STH aggregates' collections, or (``aggregated=False``) the raw ones."""

    # useArrow=False, as the SQL sinks' naming UDFs: evaluated the same way whatever the session's
    # spark.sql.execution.pythonUDF.arrow.enabled, and pyspark does not try to infer an eval type from
    # the hints, which printed "Cannot infer the eval type from type hints" in every run.
    @F.udf(_NAMES, useArrow=False)
    def names(service: str, path: str, entity_id: str, entity_type: str, attr: str) -> tuple:
        try:
            n = sth_names(service, path, entity_id, entity_type or None, attr, config, aggregated=aggregated)
        except STHNameError as exc:
            return (None, None, str(exc))
        return (n.database, n.collection, None)

    return names


_NAME_COLUMNS = ("fiwareService", "fiwareServicePath", "entityId", "_nameType", "attrName")


def _with_name_type(events: DataFrame) -> DataFrame:
    return events.withColumn("_nameType", F.coalesce(F.col("entityType"), F.lit("")))


def sth_name_lookup(events: DataFrame, config: STHConfig) -> DataFrame:
    """One row per distinct (service, service path, entity id, type, attribute) of ``events`` with its
    ``_names`` (database, collection, error) under ``config``: the lookup ``classify_events`` joins.
    Its rows follow the entities and attributes, not the events."""
    keys = _with_name_type(events).select(*_NAME_COLUMNS).distinct()
    return keys.withColumn("_names", names_udf(config)(*[F.col(c) for c in _NAME_COLUMNS]))


def classify_events(events: DataFrame, config: STHConfig, names: DataFrame | None = None) -> DataFrame:
    """One row per NGSI event with its STH fate: ``status`` sample, skipped or rejected, and ``reason``.

    Samples carry the STH time ``timeMs`` (TimeInstant metadata of the attribute, else recvTime),
    ``numValue`` (numeric samples) or ``occurKey`` (string samples, '$' and '.' escaped), and the
    document identity columns (database, collection, and the _id fields of the data model).

    ``names``: ``sth_name_lookup`` of these events (or more), computed beforehand; a caller that knows it is
    small marks it for broadcast, and the events are then named where they are read, not shuffled to
    meet it. None: computed here, and joined as Spark plans it.
    """
    name_cols = list(_NAME_COLUMNS)
    events = _with_name_type(events)
    if names is None:
        names = sth_name_lookup(events, config)
    value = F.col("attrValue")
    as_double = value.try_cast("double")
    numeric = (
        value.rlike(NUMERIC_PATTERN)
        & as_double.isNotNull()
        & ~F.isnan(as_double)
        & (F.abs(as_double) < F.lit(float("inf")))
    )
    white = value.rlike(WHITE_SPACE_PATTERN) if config.ignore_white_spaces else F.lit(False)
    deleted = F.col("alterationType").eqNullSafe(F.lit(ENTITY_DELETE))
    # The value's tests evaluated once (they are read in several branches below, which Spark's
    # subexpression elimination does not reach).
    named = events.join(names, name_cols, "left").select(
        "*",
        F.when(numeric, as_double).alias("_double"),
        white.alias("_white"),
    )
    numeric, white = F.col("_double").isNotNull(), F.col("_white")
    reason = (
        F.when(deleted, F.lit(REASON_DELETE))
        .when(value.isNull(), F.lit(REASON_NULL))
        .when(white, F.lit(REASON_WHITE_SPACE))
        .when(F.col("_names.error").isNotNull(), F.col("_names.error"))
        .when(~numeric & (F.instr(value, "\x00") > 0), F.lit(REASON_NUL_VALUE))
    )
    named = named.withColumn("reason", reason)
    status = (
        F.when(deleted | value.isNull() | white, F.lit(STATUS_SKIPPED))
        .when(F.col("reason").isNotNull(), F.lit(STATUS_REJECTED))
        .otherwise(F.lit(STATUS_SAMPLE))
    )
    model = config.data_model
    by_path = model is DataModel.BY_SERVICE_PATH
    keeps_attr = model in (DataModel.BY_SERVICE_PATH, DataModel.BY_ENTITY)
    null = F.lit(None).cast("string")
    occur_key = value
    for raw, escaped in OCCUR_ESCAPES.items():
        occur_key = F.replace(occur_key, F.lit(raw), F.lit(escaped))
    return named.select(
        *[c for c in events.columns if c != "_nameType"],
        status.alias("status"),
        F.col("reason"),
        F.coalesce(time_instant_ms(), F.col("recvTimeTs")).alias("timeMs"),
        # + 0.0 turns -0.0 into 0.0, so min/max never depend on which zero came first.
        (F.col("_double") + F.lit(0.0)).alias("numValue"),
        F.when(~numeric, occur_key).alias("occurKey"),
        F.col("_names.database").alias("database"),
        F.col("_names.collection").alias("collection"),
        (F.col("entityId") if by_path else null).alias("idEntityId"),
        (F.col("entityType") if by_path else null).alias("idEntityType"),
        (F.col("attrName") if keeps_attr else null).alias("idAttrName"),
    )


def sth_rejects(classified: DataFrame) -> DataFrame:
    """One row per event that cannot be written to MongoDB, keyed by (messageId, entityIndex, attrName)."""
    return classified.where(F.col("status") == STATUS_REJECTED).select(*STH_REJECTS.fieldNames())


def _slot(resolution: Resolution, t: Column) -> tuple[Column, Column]:
    """(origin ms, offset) of epoch-ms time ``t`` for ``resolution``, independent of the session zone."""
    day = F.floor(t / F.lit(86_400_000.0))
    date = F.date_from_unix_date(day.cast("int"))
    if resolution is Resolution.SECOND:
        return F.floor(t / F.lit(60_000.0)) * 60_000, F.pmod(F.floor(t / F.lit(1000.0)), F.lit(60))
    if resolution is Resolution.MINUTE:
        return F.floor(t / F.lit(3_600_000.0)) * 3_600_000, F.pmod(F.floor(t / F.lit(60_000.0)), F.lit(60))
    if resolution is Resolution.HOUR:
        return day * 86_400_000, F.pmod(F.floor(t / F.lit(3_600_000.0)), F.lit(24))
    if resolution is Resolution.DAY:
        return F.unix_date(F.trunc(date, "MM")).cast("long") * 86_400_000, F.dayofmonth(date)
    return F.unix_date(F.trunc(date, "YEAR")).cast("long") * 86_400_000, F.month(date) - 1


def explode_slots(samples: DataFrame, resolutions: tuple[Resolution, ...]) -> DataFrame:
    """One row per (sample, configured resolution) with ``resolution``, ``origin`` (epoch ms) and ``offset``."""
    t = F.col("timeMs")
    slots = []
    for res in resolutions:
        origin, offset = _slot(res, t)
        slots.append(
            F.struct(
                F.lit(res.value).alias("resolution"),
                origin.cast("long").alias("origin"),
                offset.cast("int").alias("offset"),
            )
        )
    return (
        samples.select("*", F.explode(F.array(*slots)).alias("_slot"))
        .select("*", "_slot.resolution", "_slot.origin", "_slot.offset")
        .drop("_slot")
    )


def _fold_sum(values: Column, square: bool = False) -> Column:
    """Sum of an array of doubles in its given order (callers sort it first)."""
    return F.aggregate(values, F.lit(0.0), lambda acc, x: acc + (x * x if square else x))


def _with_occurrences(frame: DataFrame, keys: str, alias: str) -> DataFrame:
    """``frame`` with ``alias``: the map of each distinct string of the array column ``keys`` (sorted
    ascending) to its count, its keys in that order; null for an empty array.

    The counts are the lengths of the runs of equal keys. Their 1-based start positions are a column of
    their own first, so each element reads them rather than recomputing them: linear in the array
    (``sequence(1, 0)`` would count down, hence the empty array decided before).
    """
    array = F.col(keys)
    size = F.size(array)
    starts = F.when(
        size > 0,
        F.filter(
            F.sequence(F.lit(1), size), lambda i: (i == 1) | (F.element_at(array, i) != F.element_at(array, i - 1))
        ),
    )
    with_starts = frame.select("*", starts.alias("_starts"))
    runs = F.col("_starts")
    counts = F.transform(runs, lambda s, j: F.coalesce(F.get(runs, j + 1), size + 1) - s)
    occur = F.map_from_arrays(F.transform(runs, lambda s: F.element_at(array, s)), counts)
    return with_starts.select("*", occur.alias(alias)).drop("_starts")


def sth_partials(classified: DataFrame, resolutions: tuple[Resolution, ...]) -> DataFrame:
    """One row per (document, offset, dt): samples, numeric sum/sum2/min/max, string occurrences.

    ``samples`` counts every sample, ``numSamples`` the numeric ones; ``occur`` maps escaped string
    values to their counts; ``latest`` is the newest sample's (time, receive time, message, entity
    index, attrType), which decides the document's attrType. One aggregation of the slots: a sample
    is either a number (``numValue``) or a string (``occurKey``), and each list collects its kind only.
    """
    samples = classified.where(F.col("status") == STATUS_SAMPLE)
    slots = explode_slots(samples, resolutions)
    latest = F.struct(F.col("timeMs"), F.col("recvTimeTs"), F.col("messageId"), F.col("entityIndex"), F.col("attrType"))
    partials = slots.groupBy(*SLOT_COLUMNS, "dt").agg(
        F.count(F.lit(1)).alias("samples"),
        # Sorted, so the sums and the stored map do not follow the shuffle's order (which differs
        # between runs and modes).
        F.sort_array(F.collect_list("numValue")).alias("_nums"),
        F.min("numValue").alias("min"),
        F.max("numValue").alias("max"),
        F.array_sort(F.collect_list("occurKey")).alias("_keys"),
        F.max(latest).alias("latest"),
    )
    nums = F.col("_nums")
    numeric = F.size(nums) > 0
    return (
        _with_occurrences(partials, "_keys", "_occur")
        .select(
            *SLOT_COLUMNS,
            F.col("samples").cast("long").alias("samples"),
            F.size(nums).cast("long").alias("numSamples"),
            F.when(numeric, _fold_sum(nums)).alias("sum"),
            F.when(numeric, _fold_sum(nums, square=True)).alias("sum2"),
            "min",
            "max",
            F.col("_occur").cast(_OCCUR).alias("occur"),
            F.col("latest").cast(_LATEST).alias("latest"),
            "dt",
        )
        .select(*STH_PARTIALS.fieldNames())
    )


def with_tombstones(new_partials: DataFrame, old_partials: DataFrame) -> DataFrame:
    """``new_partials`` plus an empty row (samples 0) for every (document, offset, dt) only in ``old_partials``.

    When a rerun of an hour no longer yields samples for a document (data or configuration
    changed), the empty row keeps that document among those the hour touches, so it is rebuilt
    (and deleted if nothing is left) instead of keeping stale samples.
    """
    gone = _null_safe_anti(old_partials.select(*SLOT_COLUMNS, "dt"), new_partials.select(*SLOT_COLUMNS, "dt"))
    empty = gone.select(
        *SLOT_COLUMNS,
        F.lit(0).cast("long").alias("samples"),
        F.lit(0).cast("long").alias("numSamples"),
        *[F.lit(None).cast("double").alias(c) for c in ("sum", "sum2", "min", "max")],
        F.lit(None).cast(_OCCUR).alias("occur"),
        F.lit(None).cast(_LATEST).alias("latest"),
        "dt",
    )
    return new_partials.select(*STH_PARTIALS.fieldNames()).unionByName(empty)


def _null_safe_cond(left: str, right: str, columns: list[str]) -> Column:
    """``left.c <=> right.c`` for every column ``c``, between the join's sides aliased ``left`` and
    ``right``: named by alias, a term stays two-sided when both sides come from the same frame (a
    self-join), where ``df[c]`` would name one attribute twice (Spark warns the term is trivially true)."""
    return functools.reduce(Column.__and__, [F.col(f"{left}.{c}").eqNullSafe(F.col(f"{right}.{c}")) for c in columns])


def _null_safe_anti(left: DataFrame, right: DataFrame) -> DataFrame:
    return left.alias("l").join(right.alias("r"), _null_safe_cond("l", "r", left.columns), "left_anti")


def documents_of(partials: DataFrame, keys: DataFrame) -> DataFrame:
    """The rows of ``partials`` (any hour) whose document (DOC_COLUMNS) is among ``keys``."""
    keys = keys.select(*DOC_COLUMNS).distinct()
    return partials.alias("p").join(keys.alias("k"), _null_safe_cond("p", "k", DOC_COLUMNS), "left_semi")


# A derived run rebuilds the documents its batch touched from their rollup buckets, and a bucket holds
# every document of its range (a second or minute bucket: the whole hour's). The rollups are written
# in document order (``ROLLUP_ORDER``), so a read filtered by the touched documents' collections and
# entity ids, as literal values, skips the Parquet pages of other documents, and the semi-join that
# finds the documents (``documents_of``) sees their rows only: its cost follows the batch, not the
# hour. One column alone would not do for every data model: per entity, each entity has a collection
# of its own; per service path, the entity id tells them apart. More values than this are not named
# (the read is then of the whole buckets, as the batch touches much of them anyway).
ROLLUP_ORDER = SLOT_COLUMNS
NARROWING_COLUMNS = ("collection", "idEntityId")
MAX_NARROWING_VALUES = 1000


def narrowing_values(documents: DataFrame) -> dict[str, DataFrame]:
    """Per column of ``NARROWING_COLUMNS``, its distinct values among ``documents``: at most
    ``MAX_NARROWING_VALUES`` + 1 rows each (a frame small by construction, to collect)."""
    return {c: documents.select(c).distinct().limit(MAX_NARROWING_VALUES + 1) for c in NARROWING_COLUMNS}


def narrowing_filter(values: Mapping[str, Sequence[Row]]) -> Column | None:
    """A filter keeping every row whose ``NARROWING_COLUMNS`` values are among ``values`` (the rows
    ``narrowing_values`` gave, by column; a null among them keeps the nulls). A column with more than
    ``MAX_NARROWING_VALUES`` values is left out; None when both are."""
    conditions = []
    for column in NARROWING_COLUMNS:
        found = [r[0] for r in values.get(column, [])]
        if len(found) > MAX_NARROWING_VALUES:
            continue
        named = sorted({v for v in found if v is not None})
        condition = F.col(column).isin(named) if named else F.lit(False)
        if len(named) < len(found):
            condition = condition | F.col(column).isNull()
        conditions.append(condition)
    return functools.reduce(lambda a, b: a & b, conditions) if conditions else None


def merge_partials(partials: DataFrame, order: str = "dt", by: tuple[str, ...] = ()) -> DataFrame:
    """One row per slot (SLOT_COLUMNS and ``by``): the slot's partials merged in ``order``.

    samples and numSamples are summed, min and max taken, ``latest`` the newest; sum and sum2 are
    folds over the rows sorted by ``order`` (so the result does not depend on the shuffle), and
    the occur maps are merged in that order. An empty row (a tombstone) adds nothing. The result
    has the partials' columns with ``sum``/``sum2`` 0.0 and ``occur`` empty where nothing was
    aggregated.
    """
    by_order = F.sort_array(F.collect_list(F.struct(F.col(order), F.col("sum"), F.col("sum2"))))
    empty_occur = F.create_map().cast(_OCCUR)
    per_slot = partials.groupBy(*SLOT_COLUMNS, *by).agg(
        F.sum("samples").alias("samples"),
        F.sum("numSamples").alias("numSamples"),
        by_order.alias("_by_order"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        # In order: the merged map's key order follows the order the maps are merged in. Only the rows
        # with a map are collected, as their entries (a map cannot be sorted, an array of entries can).
        F.transform(
            F.sort_array(
                F.collect_list(
                    F.when(
                        F.col("occur").isNotNull(),
                        F.struct(F.col(order).alias("k"), F.map_entries("occur").alias("entries")),
                    )
                )
            ),
            lambda x: x["entries"],
        ).alias("_occurs"),
        F.max("latest").alias("latest"),
    )
    return per_slot.select(
        *SLOT_COLUMNS,
        *by,
        F.col("samples").cast("long").alias("samples"),
        F.col("numSamples").cast("long").alias("numSamples"),
        F.aggregate("_by_order", F.lit(0.0), lambda acc, x: acc + F.coalesce(x["sum"], F.lit(0.0))).alias("sum"),
        F.aggregate("_by_order", F.lit(0.0), lambda acc, x: acc + F.coalesce(x["sum2"], F.lit(0.0))).alias("sum2"),
        "min",
        "max",
        F.aggregate(
            "_occurs",
            empty_occur,
            lambda acc, entries: F.map_zip_with(
                acc,
                F.map_from_entries(entries),
                lambda _k, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0)),
            ),
        ).alias("occur"),
        F.col("latest").cast(_LATEST).alias("latest"),
    )


def _by_document(partials: DataFrame) -> DataFrame:
    """``partials`` hash-partitioned by document (DOC_COLUMNS), for a merge per slot followed by a
    grouping per document: a partitioning by the document columns also clusters every slot of them
    (SLOT_COLUMNS holds them), so both aggregations run in the tasks of one shuffle rather than two.
    (Spark picks each aggregation's exchange from its own keys: left alone, it shuffles by slot, then
    again by document.)"""
    return partials.repartition(*DOC_COLUMNS)


def build_documents(partials: DataFrame, config: STHConfig, now_ms: int, order: str = "dt") -> DataFrame:
    """One row per STH document, keyed by DOC_COLUMNS, from partial rows of any hours (or rollups).

    Rows of one slot are merged in ``order`` (``dt`` for hour partials, ``part`` for rollups: see
    ``merge_partials``). ``points`` holds every slot of the range (empty ones with samples 0, sum 0,
    min +inf, max -inf, empty occur). ``samples`` counts every sample of the slot, numbers and
    text, as Cygnus's ``$inc`` of ``points.$.samples`` does for both; sum, sum2, min and max
    aggregate the numbers, ``occur`` counts the text. ``numeric`` and ``text`` say which kinds the
    document holds (an attribute that is usually a number but sometimes ``"n/a"`` has both, and its
    published points carry both). ``action`` is ``upsert``, ``delete`` (no sample left, or origin
    older than ``data_expiration`` before ``now_ms``) or ``reject`` (over MongoDB's document size
    limit, with ``reason``).
    """
    empty_occur = F.create_map().cast(_OCCUR)
    per_slot = merge_partials(_by_document(partials), order)
    point_in = F.struct("samples", "numSamples", "sum", "sum2", "min", "max", "occur")
    docs = per_slot.groupBy(*DOC_COLUMNS).agg(
        F.sum("samples").alias("totalSamples"),
        F.sum("numSamples").alias("numSamples"),
        F.map_from_entries(F.collect_list(F.struct(F.col("offset"), point_in))).alias("_pm"),
        F.max("latest").alias("latest"),
    )
    # Partials of a resolution no longer configured still name it: they get its real slots and range.
    lo, hi, rng = _slot_bounds(config)
    numeric = F.col("numSamples") > 0

    def point(o: Column) -> Column:
        p = F.try_element_at(F.col("_pm"), o)
        all_samples = F.coalesce(p["samples"], F.lit(0).cast("long"))
        num_samples = F.coalesce(p["numSamples"], F.lit(0).cast("long"))
        return F.struct(
            o.cast("int").alias("offset"),
            all_samples.alias("samples"),
            F.coalesce(p["sum"], F.lit(0.0)).alias("sum"),
            F.coalesce(p["sum2"], F.lit(0.0)).alias("sum2"),
            F.coalesce(p["min"], F.lit(float("inf"))).alias("min"),
            F.coalesce(p["max"], F.lit(float("-inf"))).alias("max"),
            F.coalesce(p["occur"], empty_occur).alias("occur"),
            num_samples.alias("numSamples"),
        )

    points = F.transform(F.sequence(lo, hi), point)
    # BSON bytes of a document, from above: each occur entry is a type byte, the key, its NUL and
    # an int64; each point and the envelope are bounded by the constants.
    occur_bytes = F.aggregate(
        F.col("points"),
        F.lit(0).cast("long"),
        lambda acc, p: (
            acc + F.aggregate(F.map_keys(p["occur"]), F.lit(0).cast("long"), lambda a, k: a + F.octet_length(k) + 10)
        ),
    )
    size = occur_bytes + F.size("points") * 96 + 512
    expired = (
        F.col("origin") < F.lit(now_ms - config.data_expiration * 1000) if config.data_expiration > 0 else F.lit(False)
    )
    action = (
        F.when((F.col("totalSamples") == 0) | expired, F.lit(ACTION_DELETE))
        .when(F.col("estimatedBytes") > MAX_DOCUMENT_BYTES, F.lit(ACTION_REJECT))
        .otherwise(F.lit(ACTION_UPSERT))
    )
    out = docs.select(
        *DOC_COLUMNS,
        rng.alias("range"),
        F.col("latest.attrType").alias("attrType"),
        numeric.alias("numeric"),
        (F.col("totalSamples") > F.col("numSamples")).alias("text"),
        points.alias("points"),
        F.col("totalSamples").cast("long").alias("totalSamples"),
        (F.col("totalSamples") - F.col("numSamples")).cast("long").alias("textSamples"),
    )
    out = out.withColumn("estimatedBytes", size.cast("long"))
    out = out.withColumn("action", action).withColumn(
        "reason",
        F.when(
            F.col("action") == ACTION_REJECT,
            F.format_string(
                "document of about %d bytes exceeds MongoDB's 16 MiB limit (too many distinct string values)",
                F.col("estimatedBytes"),
            ),
        ),
    )
    return out.select(*STH_DOCUMENTS.fieldNames())


def _slot_bounds(config: STHConfig) -> tuple[Column, Column, Column]:
    """The first and last offset and the range of a row's ``resolution`` (configured or not)."""
    res = F.col("resolution")
    lo, hi, rng = F.lit(0), F.lit(0), F.lit(None).cast("string")
    for r in (*config.resolutions, *[r for r in Resolution if r not in config.resolutions]):
        lo = F.when(res == r.value, F.lit(SLOTS[r][0])).otherwise(lo)
        hi = F.when(res == r.value, F.lit(SLOTS[r][1])).otherwise(hi)
        rng = F.when(res == r.value, F.lit(RANGES[r])).otherwise(rng)
    return lo, hi, rng


def point_updates(partials: DataFrame, config: STHConfig, now_ms: int) -> DataFrame:
    """One row per document a batch's partials touch: what the batch adds to it (DOC_COLUMNS, range,
    first, last, attrType, numeric, text, points as in ``build_documents``, action).

    ``points`` holds only the slots the batch has samples in, merged per slot (``merge_partials``),
    by offset; ``first`` and ``last`` are the range's offsets (a point's index in the stored array
    is its offset - ``first``). ``numeric`` and ``text`` say which kinds the batch brings, and
    ``attrType`` is its newest sample's. Added to a document with ``$inc`` (samples, sum, sum2,
    occur counts), ``$min`` and ``$max``, they give what ``build_documents`` gives from all the
    slot's rows, as Cygnus's per-notification updates do. ``action``: ``update``; ``expired`` (the
    origin is older than ``data_expiration`` before ``now_ms``: not written, as a whole rebuild
    deletes it); ``rebuild`` (a text value is the empty string, which no field path names: the
    document is rebuilt whole instead).
    """
    per_slot = merge_partials(_by_document(partials)).where(F.col("samples") > 0)
    point = F.struct(
        F.col("offset").cast("int").alias("offset"),
        "samples",
        "sum",
        "sum2",
        F.coalesce(F.col("min"), F.lit(float("inf"))).alias("min"),
        F.coalesce(F.col("max"), F.lit(float("-inf"))).alias("max"),
        "occur",
        "numSamples",
    )
    by_offset = F.array_sort(
        F.collect_list(point),
        lambda a, b: F.when(a["offset"] < b["offset"], -1).when(a["offset"] > b["offset"], 1).otherwise(0),
    )
    docs = per_slot.groupBy(*DOC_COLUMNS).agg(
        by_offset.alias("points"),
        (F.sum("numSamples") > 0).alias("numeric"),
        (F.sum("samples") > F.sum("numSamples")).alias("text"),
        F.max("latest").alias("latest"),
    )
    lo, hi, rng = _slot_bounds(config)
    expired = (
        F.col("origin") < F.lit(now_ms - config.data_expiration * 1000) if config.data_expiration > 0 else F.lit(False)
    )
    unnamed = F.exists("points", lambda p: F.array_contains(F.map_keys(p["occur"]), F.lit("")))
    action = F.when(expired, F.lit(ACTION_EXPIRED)).when(unnamed, F.lit(ACTION_REBUILD)).otherwise(F.lit(ACTION_UPDATE))
    return docs.select(
        *DOC_COLUMNS,
        rng.alias("range"),
        lo.cast("int").alias("first"),
        hi.cast("int").alias("last"),
        F.col("latest.attrType").alias("attrType"),
        "numeric",
        "text",
        "points",
        action.alias("action"),
    )


def day_hour_mismatches(documents: DataFrame) -> DataFrame:
    """One row per (day document slot) whose samples differ from the sum over the day's hour document.

    Counts every sample (numeric and string) on both sides; only days whose hour document is among
    ``documents`` are compared.
    """
    ident = ID_COLUMNS
    live = documents.where(F.col("action") != ACTION_DELETE)
    hours = live.where(F.col("resolution") == Resolution.HOUR.value).select(
        *ident,
        F.col("origin").alias("day"),
        F.aggregate("points", F.lit(0).cast("long"), lambda a, p: a + p["samples"]).alias("hourSamples"),
    )
    days = (
        documents.where(F.col("resolution") == Resolution.DAY.value)
        .select(*ident, F.col("origin").alias("month"), F.explode("points").alias("p"))
        .select(
            *ident,
            (F.col("month") + (F.col("p.offset") - 1).cast("long") * 86_400_000).alias("day"),
            F.col("p.samples").alias("daySamples"),
        )
    )
    # Both sides come from ``documents``: a self-join, whose terms name their side by alias.
    joined = hours.alias("h").join(days.alias("d"), _null_safe_cond("h", "d", [*ident, "day"]), "left")
    return joined.select(
        *[F.col(f"h.{c}").alias(c) for c in ident],
        F.col("h.day").alias("day"),
        F.col("h.hourSamples").alias("hourSamples"),
        F.coalesce(F.col("d.daySamples"), F.lit(0).cast("long")).alias("daySamples"),
    ).where(F.col("hourSamples") != F.col("daySamples"))


def unaccounted_samples(documents: DataFrame) -> DataFrame:
    """One row per (document, point) whose ``samples`` differ from its numbers plus its ``occur`` counts.

    The invariant of a published point: every sample is aggregated either as a number (sum, sum2,
    min, max) or as a text occurrence, and ``samples`` counts them all.
    """
    points = documents.where(F.col("action") != ACTION_DELETE).select(*DOC_COLUMNS, F.explode("points").alias("p"))
    return points.select(
        *DOC_COLUMNS,
        F.col("p.offset").alias("offset"),
        F.col("p.samples").alias("samples"),
        F.col("p.numSamples").alias("numSamples"),
        _occurrences(F.col("p")).alias("occurrences"),
    ).where(_unaccounted(F.col("p")))


def unaccounted_points() -> Column:
    """The number of a document's points that ``unaccounted_samples`` would list (0 for a delete),
    computed in the document's row: summed over the documents, the check's count without the explode
    and its shuffle."""
    return F.when(F.col("action") != ACTION_DELETE, F.size(F.filter("points", _unaccounted))).otherwise(F.lit(0))


def _occurrences(point: Column) -> Column:
    return F.aggregate(F.map_values(point["occur"]), F.lit(0).cast("long"), lambda a, n: a + n)


def _unaccounted(point: Column) -> Column:
    return point["samples"] != point["numSamples"] + _occurrences(point)


def bucket_of() -> Column:
    """The rollup folder of a document: the hour of a second document's minute, else its origin.

    ``second-YYYY-MM-DDTHH``, ``minute-YYYY-MM-DDTHH``, ``hour-YYYY-MM-DD``, ``day-YYYY-MM``,
    ``month-YYYY`` (UTC, from epoch ms: independent of the session time zone).
    """
    origin = F.col("origin")
    day = F.date_from_unix_date(F.floor(origin / F.lit(86_400_000.0)).cast("int")).cast("string")
    hour = F.lpad(F.pmod(F.floor(origin / F.lit(3_600_000.0)), F.lit(24)).cast("string"), 2, "0")
    res = F.col("resolution")
    return (
        F.when(
            res.isin(Resolution.SECOND.value, Resolution.MINUTE.value), F.concat(res, F.lit("-"), day, F.lit("T"), hour)
        )
        .when(res == Resolution.HOUR.value, F.concat(res, F.lit("-"), day))
        .when(res == Resolution.DAY.value, F.concat(res, F.lit("-"), F.substring(day, 1, 7)))
        .otherwise(F.concat(res, F.lit("-"), F.substring(day, 1, 4)))
    )


def rollup_rows(hour_partials: DataFrame, day_partials: DataFrame) -> DataFrame:
    """The rollup rows (STH_ROLLUPS) of some receive hours and days.

    ``hour_partials``: the partials of the hours, whose second, minute and hour rows are kept as
    they are (``part`` = ``dt``). ``day_partials``: the partials of every hour of those hours' days,
    whose day and month rows are merged per slot and receive day (``part`` = the day).
    """
    by_hour = hour_partials.where(~F.col("resolution").isin(*BY_RECEIVE_DAY)).withColumnRenamed("dt", "part")
    by_day = merge_partials(
        day_partials.where(F.col("resolution").isin(*BY_RECEIVE_DAY)).withColumn("part", F.substring("dt", 1, 10)),
        order="dt",
        by=("part",),
    )
    rows = by_hour.select(*[c for c in STH_ROLLUPS.fieldNames() if c != "bucket"]).unionByName(
        by_day.select(*[c for c in STH_ROLLUPS.fieldNames() if c != "bucket"])
    )
    return rows.withColumn("bucket", bucket_of())


def compact_rollups(rollups: DataFrame) -> DataFrame:
    """The same rollup rows (STH_ROLLUPS) merged to one row per slot, ``part`` and bucket: a bucket
    that batches added rows of their own to gives the same documents from fewer rows."""
    merged = merge_partials(rollups, order="part", by=("part", "bucket"))
    return merged.select(*STH_ROLLUPS.fieldNames())


def receive_parts(dts: list[str]) -> list[str]:
    """The ``part`` values that rollup rows of receive hours ``dts`` carry: the hours and their days."""
    return sorted({*dts, *(dt[:10] for dt in dts)})
