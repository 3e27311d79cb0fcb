"""NGSI events -> rows for the SQL sinks (historic tables and last data), plus the records they reject.

Pure DataFrame -> DataFrame functions: no I/O, no actions. Names come from the pure naming code
(``ngsi_assets.ngsi.sql_naming``), applied once per distinct naming key (service, service path,
entity id and type; attribute name) through a Python UDF and joined back.

Shapes handed to ``ngsi_assets.sinks.sql_writer`` (every row also has ``database``: the PostgreSQL
database of a ``*-database*`` data model, else null for the sink URL's own):

- row mode (historic): one row per event: ``db``, ``table`` and Cygnus's row columns;
- column mode (historic and last data): one row per notified entity (``messageId``, ``entityIndex``):
  ``db``, ``table``, recvTime, fiwareServicePath, entityId, entityType and ``attrs``, a map from the
  attribute's column name to (value, metadata); last data keeps the newest record per unique key and
  adds ``op`` (``d`` for an ``entityDelete``, else ``u``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, MapType, StringType, StructField, StructType

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import (
    COLUMN_FIXED,
    ROW_COLUMNS,
    Dialect,
    NamingError,
    attribute_column,
    database_name,
    db_name,
    table_name,
)
from ngsi_assets.sinks.sql_writer import HISTORIC, LAST_DATA, MYSQL_KEY_CHARS, OP_DELETE, OP_UPSERT
from ngsi_assets.transforms.instants import iso8601_ns

ENTITY_DELETE = "entityDelete"

SQL_SINK_REJECTS = StructType(
    [
        StructField("dialect", StringType(), False),
        StructField("sink", StringType(), False),
        StructField("messageId", StringType()),
        StructField("entityId", StringType()),
        StructField("attrName", StringType()),
        StructField("reason", StringType(), False),
        StructField("dt", StringType(), False),
    ]
)
_NAMES = StructType(
    [
        StructField("database", StringType()),
        StructField("db", StringType()),
        StructField("table", StringType()),
        StructField("error", StringType()),
    ]
)
_COLUMN = StructType([StructField("col", StringType()), StructField("error", StringType())])
_ATTR = StructType([StructField("value", StringType()), StructField("md", StringType())])
ATTRS_TYPE = MapType(StringType(), _ATTR)
_NAME_KEYS = ("fiwareService", "fiwareServicePath", "entityId", "entityType")


def _names_udf(cfg: SqlSinkConfig, suffix: str):
    naming = cfg.naming

    def names(service: str | None, path: str | None, entity_id: str, entity_type: str | None) -> tuple:
        try:
            return (
                database_name(service, naming),
                db_name(service, naming, path),
                table_name(path, entity_id, entity_type, naming, suffix),
                None,
            )
        except NamingError as exc:
            return (None, None, None, f"bad name: {exc}")

    return F.udf(names, _NAMES, useArrow=False)


def _column_udf(dialect: Dialect):
    def column(attr_name: str) -> tuple:
        try:
            return (attribute_column(attr_name, dialect), None)
        except NamingError as exc:
            return (None, f"bad column name: {exc}")

    return F.udf(column, _COLUMN, useArrow=False)


def with_sql_names(events: DataFrame, cfg: SqlSinkConfig, sink: str) -> DataFrame:
    """Add ``db``, ``table`` and ``nameError`` (the reason a record cannot be named, else null)."""
    suffix = cfg.last_data_table_suffix if sink == LAST_DATA else ""
    keys = events.select(*_NAME_KEYS).distinct()
    named = keys.select(*_NAME_KEYS, _names_udf(cfg, suffix)(*[F.col(k) for k in _NAME_KEYS]).alias("_n")).select(
        *[F.col(k).alias("_k_" + k) for k in _NAME_KEYS],
        F.col("_n.database").alias("database"),
        F.col("_n.db").alias("db"),
        F.col("_n.table").alias("table"),
        F.col("_n.error").alias("nameError"),
    )
    cond = [events[k].eqNullSafe(named["_k_" + k]) for k in _NAME_KEYS]
    return events.join(named, cond, "left").drop(*["_k_" + k for k in _NAME_KEYS])


def with_attr_columns(events: DataFrame, dialect: Dialect) -> DataFrame:
    """Add ``attrColumn`` (the attribute's column in column mode) and ``columnError``."""
    names = events.select("attrName").distinct()
    cols = names.select(F.col("attrName").alias("_a"), _column_udf(dialect)(F.col("attrName")).alias("_c")).select(
        "_a", F.col("_c.col").alias("attrColumn"), F.col("_c.error").alias("columnError")
    )
    return events.join(cols, events["attrName"] == cols["_a"], "left").drop("_a")


def _value_error(dialect: Dialect) -> Column:
    """Why a value cannot be stored as text: PostgreSQL text refuses the NUL character."""
    if dialect is not Dialect.POSTGRESQL:
        return F.lit(None).cast("string")
    checks = [
        F.when(F.instr(F.col(c), "\u0000") > 0, F.lit(f"{c} holds a NUL character, which PostgreSQL text refuses"))
        for c in ("fiwareServicePath", "entityId", "entityType", "attrName", "attrType", "attrValue", "attrMd")
    ]
    return F.coalesce(*checks)


def _rejects(df: DataFrame, reason: Column, cfg: SqlSinkConfig, sink: str) -> DataFrame:
    return df.where(reason.isNotNull()).select(
        F.lit(cfg.dialect.value).alias("dialect"),
        F.lit(sink).alias("sink"),
        "messageId",
        "entityId",
        "attrName",
        reason.alias("reason"),
        "dt",
    )


def column_recv_time(recv_ts_ms: Column) -> Column:
    """recvTime of column-mode and last-data tables: 'YYYY-MM-DD HH:MM:SS.mmm' UTC (no T, no Z).

    The default ``last_data_sql_timestamp_format`` of both servers parses exactly this.
    """
    return F.date_format(F.timestamp_millis(recv_ts_ms), "yyyy-MM-dd HH:mm:ss.SSS")


def historic_row_mode(events: DataFrame, cfg: SqlSinkConfig) -> tuple[DataFrame, DataFrame]:
    """(rows, rejects): one row per event keyed by (db, table, recvTimeTs, entityId, attrName), Cygnus's row layout."""
    named = with_sql_names(events, cfg, HISTORIC)
    reason = F.coalesce(F.col("nameError"), _value_error(cfg.dialect))
    rows = named.where(reason.isNull()).select("database", "db", "table", *ROW_COLUMNS)
    return rows, _rejects(named, reason, cfg, HISTORIC)


def _entity_records(named: DataFrame) -> DataFrame:
    """One row per notified entity (messageId, entityIndex) with its attributes as a map of columns.

    Two instances of one column in a notification (NGSI-LD datasetIds, or names PostgreSQL folds
    together) keep one: the default instance (no datasetId), then the smallest attribute name.
    """
    w = Window.partitionBy("messageId", "entityIndex", "attrColumn").orderBy(
        F.col("datasetId").asc_nulls_first(), F.col("attrName")
    )
    one = named.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") == 1)
    return one.groupBy("database", "db", "table", "messageId", "entityIndex").agg(
        F.first("recvTimeTs").alias("recvTimeTs"),
        F.first("fiwareServicePath").alias("fiwareServicePath"),
        F.first("entityId").alias("entityId"),
        F.first("entityType").alias("entityType"),
        F.first("alterationType", ignorenulls=True).alias("alterationType"),
        # Sorted, so the map does not follow the shuffle's order (which differs between runs and modes).
        F.map_from_entries(
            F.array_sort(
                F.collect_list(
                    F.struct(
                        F.col("attrColumn"), F.struct(F.col("attrValue").alias("value"), F.col("attrMd").alias("md"))
                    )
                )
            )
        )
        .cast(ATTRS_TYPE)
        .alias("attrs"),
    )


def _column_mode(events: DataFrame, cfg: SqlSinkConfig, sink: str) -> tuple[DataFrame, DataFrame]:
    named = with_attr_columns(with_sql_names(events, cfg, sink), cfg.dialect)
    reason = F.coalesce(F.col("nameError"), F.col("columnError"), _value_error(cfg.dialect))
    if sink == LAST_DATA:
        for key in cfg.last_data_unique_key:
            reason = F.coalesce(reason, F.when(F.col(key).isNull(), F.lit(f"unique key column {key} is null")))
            if cfg.dialect is Dialect.MYSQL:
                reason = F.coalesce(
                    reason,
                    F.when(
                        F.length(F.col(key)) > MYSQL_KEY_CHARS,
                        F.lit(f"unique key column {key} is longer than {MYSQL_KEY_CHARS} characters"),
                    ),
                )
    good = named.where(reason.isNull())
    return _entity_records(good), _rejects(named, reason, cfg, sink)


def historic_column_mode(events: DataFrame, cfg: SqlSinkConfig) -> tuple[DataFrame, DataFrame]:
    """(rows, rejects): one row per notified entity keyed by (db, table, messageId, entityIndex)."""
    records, rejects = _column_mode(events, cfg, HISTORIC)
    rows = records.select(
        "database",
        "db",
        "table",
        column_recv_time(F.col("recvTimeTs")).alias("recvTime"),
        *COLUMN_FIXED[1:],
        "attrs",
        F.col("recvTimeTs"),
        F.col("messageId"),
        F.col("entityIndex"),
    )
    return rows, rejects


# ---------------------------------------------------------------------------------------------------
# Last data: a merge of every record of a key, whatever order its records and runs come in.
#
# A key's last-data row is a function of the *set* of its records, each ordered by (ts, messageId,
# entityIndex), where ts is the record's timestamp key (its receive time, or an attribute such as
# TimeInstant read as an ISO 8601 instant in nanoseconds, or parsed with last_data_sql_timestamp_format;
# a record whose attribute is missing or does not read falls back to its receive time):
# - each attribute column holds the value of the newest record that carried it;
# - the fixed columns come from the newest update record;
# - the newest entityDelete is the key's tombstone: attributes no newer than it are dropped, and the
#   row exists only while an update is newer than it (an older update never resurrects the row).
# The merge is associative, commutative and idempotent, so the state a run stores (``last_data_state``)
# can be merged with any later increment, and a rerun of any hour changes nothing.

# Order of records: struct comparison is lexicographic over (ts, msg, idx).
_ORDER = StructType(
    [StructField("ts", LongType()), StructField("msg", StringType()), StructField("idx", IntegerType())]
)
_STATE_ATTR = StructType(
    [
        StructField("value", StringType()),
        StructField("md", StringType()),
        StructField("ts", LongType()),
        StructField("msg", StringType()),
        StructField("idx", IntegerType()),
    ]
)
LAST_DATA_STATE = StructType(
    [
        StructField("database", StringType()),
        StructField("db", StringType()),
        StructField("table", StringType()),
        StructField("recvTime", StringType()),
        StructField("fiwareServicePath", StringType()),
        StructField("entityId", StringType()),
        StructField("entityType", StringType()),
        StructField("upd", _ORDER),  # the newest update record (null: none)
        StructField("del", _ORDER),  # the newest entityDelete record: the tombstone (null: none)
        StructField("attrs", MapType(StringType(), _STATE_ATTR)),
        StructField("bucket", IntegerType()),
    ]
)
LAST_DATA_STATE_BUCKETS = 64
TS_FALLBACK = "tsFallback"
# The writer row's ordering instant (epoch ns) of an instant-ordered sink: see last_data_output.
INSTANT = "instant"


def _order(ts: Column, msg: Column, idx: Column) -> Column:
    return F.struct(ts.alias("ts"), msg.alias("msg"), idx.alias("idx")).cast(_ORDER)


def state_bucket(cfg: SqlSinkConfig, buckets: int = LAST_DATA_STATE_BUCKETS) -> Column:
    """The state bucket of a last-data key: (database, db, table, last_data_unique_key) hashed."""
    parts = [F.coalesce(F.col(c), F.lit("")) for c in ("database", "db", "table", *cfg.last_data_unique_key)]
    return F.pmod(F.xxhash64(*parts), F.lit(buckets)).cast("int")


def record_timestamp(records: DataFrame, events: DataFrame, cfg: SqlSinkConfig) -> DataFrame:
    """Add ``ts`` and ``tsFallback`` to per-entity records: the timestamp key, else the receive time.

    ``ts`` is in milliseconds, or in nanoseconds when the sink orders by an ISO 8601 instant
    (``cfg.orders_by_instant``; the receive time is then scaled to nanoseconds). With an attribute as
    the key (matched case-insensitively, as Cygnus does), its value is read as ISO 8601 in any form, or
    with the Spark pattern of ``last_data_sql_timestamp_format``. A value that does not read falls back
    to the receive time; under a format, it is also removed from the record's columns (the server's
    guard parses that column and could not compare it), while an instant-ordered sink keeps the text as
    the device sent it (its guard compares the instant column).
    """
    if cfg.timestamp_is_recv_time:
        return records.withColumn("ts", F.col("recvTimeTs")).withColumn(TS_FALLBACK, F.lit(False))
    key = cfg.last_data_timestamp_key.lower()
    if cfg.orders_by_instant:
        instant = iso8601_ns(F.col("attrValue"))
        recv_ts = F.col("recvTimeTs") * F.lit(1_000_000)
    else:
        instant = (F.unix_micros(F.try_to_timestamp(F.col("attrValue"), F.lit(cfg.timestamp_pattern))) / 1000).cast(
            "long"
        )
        recv_ts = F.col("recvTimeTs")
    found = (
        events.where(F.lower(F.col("attrName")) == key)
        .groupBy("messageId", "entityIndex")
        .agg(
            # Several instances (NGSI-LD datasetIds): the default one, then the smallest name.
            F.min_by(
                F.struct(instant.alias("at"), F.col("attrName").alias("name")),
                F.struct(F.col("datasetId").isNotNull(), F.col("datasetId"), F.col("attrName")),
            ).alias("_t")
        )
        .select(
            F.col("messageId").alias("_tm"),
            F.col("entityIndex").alias("_ti"),
            F.col("_t.at").alias("_ts"),
            F.col("_t.name").alias("_tname"),
        )
    )
    joined = records.join(
        found, (records["messageId"] == found["_tm"]) & (records["entityIndex"] == found["_ti"]), "left"
    )
    ts_col = cfg.timestamp_column
    attrs = F.col("attrs")
    if not cfg.orders_by_instant:
        attrs = F.when(
            F.col("_ts").isNull(), F.map_filter(attrs, lambda k, _v: F.lower(k) != F.lit(ts_col.lower()))
        ).otherwise(attrs)
    return joined.select(
        *[c for c in records.columns if c != "attrs"],
        attrs.alias("attrs"),
        F.coalesce(F.col("_ts"), recv_ts).alias("ts"),
        F.col("_ts").isNull().alias(TS_FALLBACK),
    )


def last_data_records(events: DataFrame, cfg: SqlSinkConfig) -> tuple[DataFrame, DataFrame]:
    """(records, rejects): one ``LAST_DATA_STATE`` row per notified entity, plus ``tsFallback``."""
    records, rejects = _column_mode(events, cfg, LAST_DATA)
    records = record_timestamp(records, events, cfg)
    is_delete = F.coalesce(F.col("alterationType") == ENTITY_DELETE, F.lit(False))
    order = _order(F.col("ts"), F.col("messageId"), F.col("entityIndex"))
    state = records.select(
        "database",
        "db",
        "table",
        column_recv_time(F.col("recvTimeTs")).alias("recvTime"),
        *COLUMN_FIXED[1:],
        F.when(~is_delete, order).alias("upd"),
        F.when(is_delete, order).alias("del"),
        F.when(
            ~is_delete,
            F.transform_values(
                F.col("attrs"),
                lambda _k, v: F.struct(
                    v["value"].alias("value"),
                    v["md"].alias("md"),
                    F.col("ts").alias("ts"),
                    F.col("messageId").alias("msg"),
                    F.col("entityIndex").alias("idx"),
                ),
            ),
        )
        .otherwise(F.create_map())
        .cast(LAST_DATA_STATE["attrs"].dataType)
        .alias("attrs"),
        state_bucket(cfg).alias("bucket"),
        F.col(TS_FALLBACK),
    )
    return state, rejects


def _newer_attr(_col: Column, a: Column, b: Column) -> Column:
    """Of two values of one attribute column (either may be missing), the newer record's."""
    newer = _order(b["ts"], b["msg"], b["idx"]) > _order(a["ts"], a["msg"], a["idx"])
    return F.when(a.isNull(), b).when(b.isNull(), a).when(newer, b).otherwise(a)


def merge_last_data_state(state: DataFrame, cfg: SqlSinkConfig, wanted: Column | None = None) -> DataFrame:
    """Merge ``LAST_DATA_STATE`` rows into one per key (see the rules above); tombstoned attributes dropped.

    ``wanted`` (a boolean column of ``state``): only the keys with a row where it is true.

    One aggregation, one shuffle: each key's attribute maps are folded pairwise (the newer value of
    each column wins), so a key's rows are held together while it is merged. A run's records hold as
    many rows per key as the key had notifications in it; stored state holds at most one per delta.
    The ordering is total (two values with one order are one record's), so the fold gives the same
    map whatever order the rows come in. Through Spark Connect the plan matters as much as the rows:
    per-attribute aggregations joined back to the keys cost about two seconds of planning and
    stages per run, whatever the rows.
    """
    keys = ["database", "db", "table", *cfg.last_data_unique_key]
    fixed_names = [c for c in ("recvTime", *COLUMN_FIXED[1:]) if c not in cfg.last_data_unique_key]
    attrs_type = LAST_DATA_STATE["attrs"].dataType
    # The fixed columns of the newest update, or of the newest delete for a key that has only deletes.
    chooser = F.struct(F.col("upd").isNotNull().alias("u"), F.coalesce(F.col("upd"), F.col("del")).alias("o"))
    aggregates = [
        F.max("upd").alias("upd"),
        F.max("del").alias("del"),
        F.max_by(F.struct(*[F.col(c) for c in fixed_names]), chooser).alias("_f")
        if fixed_names
        else F.lit(None).alias("_f"),
        F.first("bucket").alias("bucket"),
        F.aggregate(
            F.collect_list(F.col("attrs")),
            F.create_map().cast(attrs_type),
            lambda merged, attrs: F.map_zip_with(merged, attrs, _newer_attr),
        ).alias("attrs"),
    ]
    if wanted is not None:
        aggregates.append(F.max(F.coalesce(wanted, F.lit(False))).alias("_wanted"))
    merged = state.groupBy(*keys).agg(*aggregates)
    if wanted is not None:
        merged = merged.where(F.col("_wanted"))
    live = F.map_filter(
        F.col("attrs"),
        lambda _k, v: F.col("del").isNull() | (_order(v["ts"], v["msg"], v["idx"]) > F.col("del")),
    )
    return merged.select(
        *[
            (F.col(c) if c in keys else F.col("_f")[c]).alias(c)
            for c in ("database", "db", "table", "recvTime", *COLUMN_FIXED[1:])
        ],
        "upd",
        "del",
        live.alias("attrs"),
        "bucket",
    ).select(*LAST_DATA_STATE.fieldNames())


def last_data_output(state: DataFrame, cfg: SqlSinkConfig) -> DataFrame:
    """Writer rows of merged state: ``op`` ``u`` with the live attributes, or ``d`` for a tombstoned key.

    A delete row carries the tombstone's time in the timestamp key's column, for the server's guard
    (stored newer than the delete: untouched). An instant-ordered sink's rows carry ``instant`` (epoch
    ns) instead: the newest update's, or the tombstone's.
    """
    alive = F.col("upd").isNotNull() & (F.col("del").isNull() | (F.col("upd") > F.col("del")))
    attrs = F.transform_values(F.col("attrs"), lambda _k, v: F.struct(v["value"].alias("value"), v["md"].alias("md")))
    extra: list[Column] = []
    if cfg.timestamp_is_recv_time:
        recv_time = F.when(alive, F.col("recvTime")).otherwise(column_recv_time(F.col("del.ts")))
        dead_attrs = F.create_map()
    elif cfg.orders_by_instant:
        # The guard compares the row's instant: the newest update's, or for a delete the tombstone's.
        recv_time = F.col("recvTime")
        dead_attrs = F.create_map()
        extra.append(F.when(alive, F.col("upd.ts")).otherwise(F.col("del.ts")).alias(INSTANT))
    else:
        recv_time = F.col("recvTime")
        del_time = F.timestamp_millis(F.col("del.ts"))
        dead_attrs = F.create_map(
            F.lit(cfg.timestamp_column),
            F.struct(F.date_format(del_time, cfg.timestamp_pattern).alias("value"), F.lit(None).alias("md")),
        )
    return state.select(
        "database",
        "db",
        "table",
        recv_time.alias("recvTime"),
        *COLUMN_FIXED[1:],
        F.when(alive, attrs).otherwise(dead_attrs).cast(ATTRS_TYPE).alias("attrs"),
        F.when(alive, F.lit(OP_UPSERT)).otherwise(F.lit(OP_DELETE)).alias("op"),
        *extra,
    )


def last_data_rows(events: DataFrame, cfg: SqlSinkConfig) -> tuple[DataFrame, DataFrame]:
    """(rows, rejects) of one batch on its own: its records merged per (db, table, last_data_unique_key).

    The last_data asset merges the batch with the stored state first (``merge_last_data_state``).
    """
    records, rejects = last_data_records(events, cfg)
    return last_data_output(merge_last_data_state(records, cfg), cfg), rejects


def sink_rows(events: DataFrame, cfg: SqlSinkConfig, sink: str) -> tuple[DataFrame, DataFrame]:
    """The rows one sink writes and the records it rejects (historic per attr_persistence, or last data)."""
    if sink == LAST_DATA:
        return last_data_rows(events, cfg)
    if cfg.attr_persistence.value == "column":
        return historic_column_mode(events, cfg)
    return historic_row_mode(events, cfg)


def writer_order(cfg: SqlSinkConfig, sink: str) -> list[str]:
    """Sort columns within a Spark partition: whole tables together, rows in key order inside."""
    if sink == LAST_DATA:
        return ["database", "db", "table", *cfg.last_data_unique_key]
    if cfg.attr_persistence.value == "column":
        return ["database", "db", "table", "recvTimeTs", "entityId", "messageId", "entityIndex"]
    return ["database", "db", "table", "recvTimeTs", "entityId", "attrName"]
