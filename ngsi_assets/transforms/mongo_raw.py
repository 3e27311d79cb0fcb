"""NGSI events -> the raw documents of Cygnus's NGSIMongoSink (one row per document to insert).

Pure DataFrame -> DataFrame functions: no I/O, no actions. The documents themselves are built on the
executors from these rows (``ngsi_assets.sinks.mongo_raw``), because their fields differ in type from
one document to the next (a number, a string, an object).

What Cygnus writes (``NGSIMongoSink.persistAggregation`` with ``NGSIGenericRowAggregator`` /
``NGSIGenericColumnAggregator``, telefonicaid/fiware-cygnus):

- row mode, a document per attribute update: ``entityId``, ``entityType`` (dm-by-service-path only),
  ``attrName`` (not in dm-by-attribute), ``attrType``, ``attrValue``, ``attrMetadata`` (with
  ``attr_metadata_store``), then ``recvTime``, a BSON date: the attribute's TimeInstant metadata,
  else the receive time;
- column mode, a document per notified entity: ``entityId``, ``entityType`` (dm-by-service-path
  only), then per attribute its value under its name and (with ``attr_metadata_store``) its
  metadata under ``<name>_md``, then ``recvTime``, the receive time.

The value keeps its JSON type where the events allow it to be known (``value_kind``): the events
hold every value as text, so the kind is read from the text and the NGSI type. A value of type
``DateTime``/``ISO8601`` becomes a BSON date, as Cygnus's ``castDate`` does.

Each document has a deterministic ``_id``, an ObjectId whose time is the receive second and whose
other 8 bytes are a digest of (messageId, entityIndex, attribute): inserting a document again is a
duplicate-key no-op, so reruns and increments never write a document twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ngsi_assets.ngsi.mongo_raw_config import AttrPersistence, MongoRawConfig
from ngsi_assets.ngsi.sth_config import DataModel
from ngsi_assets.transforms.sth import ENTITY_DELETE, NUMERIC_PATTERN, STH_REJECTS, names_udf, time_instant_ms

KIND_STRING = "string"
KIND_NUMBER = "number"
KIND_BOOLEAN = "boolean"
KIND_JSON = "json"
KIND_DATE = "date"
KIND_NULL = "null"

# NGSI types whose values are text even when they look like numbers.
TEXT_TYPES = ("Text", "String")
DATE_TYPES = ("DateTime", "ISO8601")

REASON_COLUMN_NAME = (
    "attribute name cannot be a MongoDB field name in column mode (empty, starts with '$', or holds '.' or NUL)"
)
REASON_NUL = "value or name contains a NUL character, which MongoDB cannot store in a key"

# Events that give no raw document because they cannot be written, with the reason: the layout of
# the STH rejects (one quarantine layout for both MongoDB sinks).
MONGO_RAW_REJECTS = STH_REJECTS


def value_kind(value: Column, attr_type: Column) -> Column:
    """How the text ``value`` of type ``attr_type`` is stored: string, number, boolean, json, date or null."""
    text_type = attr_type.isin(*TEXT_TYPES)
    trimmed = F.trim(value)
    looks_json = trimmed.startswith("{") | trimmed.startswith("[")
    return (
        F.when(value.isNull(), F.lit(KIND_NULL))
        .when(attr_type.isin(*DATE_TYPES) & value.try_cast("timestamp").isNotNull(), F.lit(KIND_DATE))
        .when(text_type, F.lit(KIND_STRING))
        .when(
            value.rlike(NUMERIC_PATTERN) & F.abs(value.try_cast("double")).between(0, 1.7976931348623157e308),
            F.lit(KIND_NUMBER),
        )
        .when(value.isin("true", "false") & ~attr_type.eqNullSafe(F.lit("Text")), F.lit(KIND_BOOLEAN))
        .when(looks_json & F.get_json_object(value, "$").isNotNull(), F.lit(KIND_JSON))
        .otherwise(F.lit(KIND_STRING))
    )


def object_id(recv_ms: Column, *identity: Column) -> Column:
    """A 24-hex-digit ObjectId: 4 bytes of receive second, 8 bytes of the identity's SHA-256."""
    seconds = F.lpad(F.lower(F.hex((recv_ms / 1000).cast("long"))), 8, "0")
    digest = F.substring(
        F.sha2(F.concat_ws("\x00", *[F.coalesce(c.cast("string"), F.lit("")) for c in identity]), 256), 1, 16
    )
    return F.concat(seconds, digest)


def _named(events: DataFrame, config: MongoRawConfig) -> DataFrame:
    name_cols = ["fiwareService", "fiwareServicePath", "entityId", "_nameType", "_nameAttr"]
    by_attribute = config.data_model is DataModel.BY_ATTRIBUTE
    events = events.withColumn("_nameType", F.coalesce(F.col("entityType"), F.lit(""))).withColumn(
        "_nameAttr", F.col("attrName") if by_attribute else F.lit("")
    )
    udf = names_udf(config.naming(), aggregated=False)
    names = events.select(*name_cols).distinct().withColumn("_names", udf(*[F.col(c) for c in name_cols]))
    return events.join(names, name_cols, "left").drop("_nameType", "_nameAttr")


def _has_nul(*cols: Column) -> Column:
    cond = F.lit(False)
    for c in cols:
        cond = cond | F.coalesce(F.instr(c, "\x00") > 0, F.lit(False))
    return cond


def classify_raw(events: DataFrame, config: MongoRawConfig) -> DataFrame:
    """Every event with its names and ``reason`` (null: written); entity deletes are left out.

    An entityDelete notification repeats the entity's last values: it is not a measurement, so it
    gives no raw document (as it gives no STH sample).
    """
    events = events.where(~F.col("alterationType").eqNullSafe(F.lit(ENTITY_DELETE)))
    named = _named(events, config)
    column_mode = config.attr_persistence is AttrPersistence.COLUMN
    bad_field = (F.col("attrName") == "") | F.col("attrName").startswith("$") | (F.instr(F.col("attrName"), ".") > 0)
    reason = F.when(F.col("_names.error").isNotNull(), F.col("_names.error")).when(
        _has_nul(F.col("attrName"), F.col("attrType"), F.col("attrValue"), F.col("attrMd")), F.lit(REASON_NUL)
    )
    if column_mode:
        reason = reason.when(bad_field, F.lit(REASON_COLUMN_NAME))
    return named.withColumn("reason", reason)


def raw_rejects(classified: DataFrame) -> DataFrame:
    """The events that cannot be written, with the reason (rows of ``MONGO_RAW_REJECTS``)."""
    return classified.where(F.col("reason").isNotNull()).select(*MONGO_RAW_REJECTS.fieldNames())


def raw_rows(classified: DataFrame, config: MongoRawConfig) -> DataFrame:
    """One row per raw document: database, collection, ``docId``, ``recvTimeMs`` and its fields.

    Row mode: entityId, entityType, attrName, attrType, attrValue, valueKind, attrMd. Column mode:
    entityId, entityType and ``attrs``, the entity's attributes (name, value, kind, md) sorted by
    name. An entity one of whose attributes is rejected is written without that attribute.
    """
    ok = classified.where(F.col("reason").isNull())
    kind = value_kind(F.col("attrValue"), F.col("attrType"))
    if config.attr_persistence is AttrPersistence.ROW:
        return ok.select(
            F.col("_names.database").alias("database"),
            F.col("_names.collection").alias("collection"),
            object_id(
                F.col("recvTimeTs"), F.col("messageId"), F.col("entityIndex"), F.col("attrName"), F.col("datasetId")
            ).alias("docId"),
            F.coalesce(time_instant_ms(), F.col("recvTimeTs")).alias("recvTimeMs"),
            "entityId",
            "entityType",
            "attrName",
            "attrType",
            "attrValue",
            kind.alias("valueKind"),
            "attrMd",
        )
    attr = F.struct(
        F.col("attrName").alias("name"),
        F.col("attrValue").alias("value"),
        kind.alias("kind"),
        F.col("attrMd").alias("md"),
    )
    return (
        ok.groupBy(
            F.col("_names.database").alias("database"),
            F.col("_names.collection").alias("collection"),
            "messageId",
            "entityIndex",
            "recvTimeTs",
            "entityId",
            "entityType",
        )
        .agg(F.array_sort(F.collect_list(attr)).alias("attrs"))
        .select(
            "database",
            "collection",
            object_id(F.col("recvTimeTs"), F.col("messageId"), F.col("entityIndex")).alias("docId"),
            F.col("recvTimeTs").alias("recvTimeMs"),
            "entityId",
            "entityType",
            "attrs",
        )
    )


__all__ = [
    "MONGO_RAW_REJECTS",
    "classify_raw",
    "object_id",
    "raw_rejects",
    "raw_rows",
    "value_kind",
]
