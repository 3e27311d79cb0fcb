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
from pyspark.sql.types import MapType, StringType, StructField, StructType

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


def latest_per_key(records: DataFrame, keys: list[str]) -> DataFrame:
    """The newest record per (db, table, keys): latest receive time, then the latest message and entity."""
    w = Window.partitionBy("database", "db", "table", *keys).orderBy(
        F.col("recvTimeTs").desc(), F.col("messageId").desc(), F.col("entityIndex").desc()
    )
    return records.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") == 1).drop("_rank")


def last_data_rows(events: DataFrame, cfg: SqlSinkConfig) -> tuple[DataFrame, DataFrame]:
    """(rows, rejects): the newest record per (db, table, last_data_unique_key) in the batch, with ``op``."""
    records, rejects = _column_mode(events, cfg, LAST_DATA)
    newest = latest_per_key(records, list(cfg.last_data_unique_key))
    rows = newest.select(
        "database",
        "db",
        "table",
        column_recv_time(F.col("recvTimeTs")).alias("recvTime"),
        *COLUMN_FIXED[1:],
        "attrs",
        F.when(F.col("alterationType") == ENTITY_DELETE, F.lit(OP_DELETE)).otherwise(F.lit(OP_UPSERT)).alias("op"),
        "recvTimeTs",
    )
    return rows, rejects


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
