"""Message store -> NGSI events: one row per entity attribute update.

Pure DataFrame -> DataFrame functions: no I/O, no actions.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructField, StructType

from ngsi_assets.ngsi.constants import (
    ATTR_ALTERATION_TYPE,
    ATTR_DATE_MODIFIED,
    ATTR_TIME_INSTANT,
    LD_CONTEXT,
    LD_DATASET_ID,
    LD_OBSERVED_AT,
    MD_TIME_INSTANT,
    Format,
    Kind,
    MessageStatus,
)
from ngsi_assets.ngsi.timeindex import PREFERENCE
from ngsi_assets.transforms.instants import metadata_instant
from ngsi_assets.transforms.schemas import ENTITY_LIST, NGSI_EVENT_REJECTS, NGSI_EVENTS, V2_ATTRIBUTE

# Entity keys that are not attributes.
_V2_NOT_ATTRIBUTES = ("id", "type", ATTR_ALTERATION_TYPE)
_LD_NOT_ATTRIBUTES = ("id", "type", LD_CONTEXT, "createdAt", "modifiedAt", "deletedAt", "scope")
# NGSI-LD attribute keys that hold the value; the others are its metadata (sub-attributes).
_LD_VALUE_KEYS = ("value", "object", "languageMap", "json", "vocab")
_NORMALIZED = (Format.NORMALIZED.value, Format.SIMPLIFIED_NORMALIZED.value)
_RAW_MAP = MapType(StringType(), StringType())
_RAW_LIST = ArrayType(StringType())
_SIMPLIFIED = (Format.SIMPLIFIED_NORMALIZED.value, Format.SIMPLIFIED_KEY_VALUES.value)
_NOTIFICATION = StructType([StructField("data", ENTITY_LIST)])


def ngsi_messages(message_store: DataFrame) -> DataFrame:
    """The NGSI notifications of the message store that are to be processed (status 0)."""
    return message_store.where(
        F.col("kind").isin(Kind.NGSI_V2.value, Kind.NGSI_LD.value) & (F.col("status") == int(MessageStatus.RECEIVED))
    )


def explode_entities(messages: DataFrame) -> DataFrame:
    """One row per notified entity: ``entity`` (a map of raw JSON text), ``entityIndex``, its path.

    The entities are the ``data`` array of the notification, or the body itself in the simplified
    NGSI v2 formats.
    """
    paths = F.split(F.col("service_path"), ",")
    simplified = F.col("format").isin(*_SIMPLIFIED)
    entities = F.when(simplified, F.array(F.from_json(F.col("data"), _RAW_MAP))).otherwise(
        F.from_json(F.col("data"), _NOTIFICATION)["data"]
    )
    return messages.select(
        "*",
        F.posexplode_outer(entities).alias("entityIndex", "entity"),
    ).withColumn(
        "entityServicePath",
        F.trim(F.when(F.size(paths) == 1, paths[0]).otherwise(F.get(paths, F.col("entityIndex")))),
    )


def _entity_value(name: str, normalized: Column) -> Column:
    """The value of an entity-level attribute (normalized: its ``value``; keyValues: itself)."""
    raw = F.col("entity")[name]
    return F.when(normalized | _is_ld(), F.get_json_object(raw, "$.value")).otherwise(raw)


def _is_ld() -> Column:
    return F.col("kind") == Kind.NGSI_LD.value


def _attributes() -> Column:
    """The attributes of ``entity``: its keys but id, type and the other non-attribute keys."""
    is_ld = _is_ld()
    return F.map_filter(
        F.col("entity"), lambda k, _v: ~k.isin(*_V2_NOT_ATTRIBUTES) & ~(is_ld & k.isin(*_LD_NOT_ATTRIBUTES))
    )


def explode_attributes(entities: DataFrame) -> DataFrame:
    """One row per (entity, attribute instance): ``attrName`` and its raw JSON text ``raw``.

    An NGSI-LD multi-attribute (a list of instances with ``datasetId``) gives one row per instance.
    """
    is_ld = _is_ld()
    attrs = _attributes()
    exploded = entities.select("*", F.explode(attrs).alias("attrName", "_raw"))
    instances = F.when(is_ld & F.col("_raw").startswith("["), F.from_json(F.col("_raw"), _RAW_LIST)).otherwise(
        F.array(F.col("_raw"))
    )
    return exploded.select("*", F.explode(instances).alias("raw")).drop("_raw")


def to_ngsi_events(message_store: DataFrame) -> DataFrame:
    """One row per entity attribute update, keyed by (messageId, entityIndex, attrName, datasetId).

    Columns are the Cygnus/Draco NGSIEvent ones (recvTimeTs in ms, recvTime ISO 8601 UTC,
    fiwareService, fiwareServicePath, entityId, entityType, attrName, attrType, attrValue, attrMd
    as a JSON array of ``{name, type, value}``) plus datasetId, the time index and its source,
    alterationType and the message identifier.
    """
    entities = explode_entities(ngsi_messages(message_store)).where(
        F.col("entity").isNotNull() & F.col("entity")["id"].isNotNull()
    )
    normalized = F.col("format").isin(*_NORMALIZED)
    is_ld = _is_ld()
    entities = (
        entities.withColumn("_entityTimeInstant", _entity_value(ATTR_TIME_INSTANT, normalized))
        .withColumn(
            "_dateModified",
            F.when(is_ld, F.col("entity")["modifiedAt"]).otherwise(_entity_value(ATTR_DATE_MODIFIED, normalized)),
        )
        .withColumn(
            "alterationType",
            F.when(~is_ld, _entity_value(ATTR_ALTERATION_TYPE, normalized)),
        )
    )
    attrs = explode_attributes(entities)
    v2n = (~is_ld) & normalized
    attrs = attrs.withColumn("_n", F.when(v2n, F.from_json(F.col("raw"), V2_ATTRIBUTE))).withColumn(
        "_m", F.when(is_ld, F.from_json(F.col("raw"), _RAW_MAP))
    )
    ld_md = F.map_filter(F.col("_m"), lambda k, _v: ~k.isin("type", *_LD_VALUE_KEYS))
    attr_md = (
        F.when(
            v2n,
            F.to_json(
                F.transform(
                    F.map_entries(
                        F.coalesce(F.col("_n.metadata"), F.create_map().cast(V2_ATTRIBUTE["metadata"].dataType))
                    ),
                    lambda x: F.struct(
                        x["key"].alias("name"), x["value"]["type"].alias("type"), x["value"]["value"].alias("value")
                    ),
                )
            ),
        )
        .when(
            is_ld,
            F.to_json(
                F.transform(F.map_entries(ld_md), lambda x: F.struct(x["key"].alias("name"), x["value"].alias("value")))
            ),
        )
        .otherwise(F.lit("[]"))
    )
    attr_value = (
        F.when(v2n, F.col("_n.value"))
        .when(is_ld, F.coalesce(*[F.col("_m")[k] for k in _LD_VALUE_KEYS]))
        .otherwise(F.col("raw"))
    )
    recv_ts = F.col("message_timestamp")
    candidates = [
        F.col("_entityTimeInstant").try_cast("timestamp"),
        metadata_instant(F.col("_n.metadata")[MD_TIME_INSTANT]["value"]),
        F.col("_m")[LD_OBSERVED_AT].try_cast("timestamp"),
        F.col("_dateModified").try_cast("timestamp"),
    ]
    # Each candidate evaluated once: the time index and its source both test them, in branches that
    # Spark's subexpression elimination does not reach (the TimeInstant metadata is a regex parse).
    attrs = attrs.withColumn("_times", F.array(*candidates))
    times = [F.col("_times")[i] for i in range(len(candidates))]
    source = F.lit(PREFERENCE[-1].value)
    for cand, name in reversed(list(zip(times, PREFERENCE[:-1], strict=True))):
        source = F.when(cand.isNotNull(), F.lit(name.value)).otherwise(source)
    events = attrs.select(
        F.col("recv_ms").alias("recvTimeTs"),
        F.date_format(recv_ts, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("recvTime"),
        F.col("service").alias("fiwareService"),
        F.col("entityServicePath").alias("fiwareServicePath"),
        F.col("entity")["id"].alias("entityId"),
        F.col("entity")["type"].alias("entityType"),
        F.col("attrName"),
        F.when(v2n, F.col("_n.type")).when(is_ld, F.col("_m")["type"]).alias("attrType"),
        attr_value.alias("attrValue"),
        F.coalesce(attr_md, F.lit("[]")).alias("attrMd"),
        F.when(is_ld, F.col("_m")[LD_DATASET_ID]).alias("datasetId"),
        F.coalesce(*times, recv_ts).alias("timeIndex"),
        source.alias("timeIndexSource"),
        F.col("alterationType"),
        F.col("message_identifier").alias("messageId"),
        F.col("entityIndex").cast("int").alias("entityIndex"),
        F.col("dt"),
    )
    return events.select(*NGSI_EVENTS.fieldNames())


def ngsi_event_rejects(message_store: DataFrame) -> DataFrame:
    """One row per NGSI message, or entity of one, that yields no event, with the reason.

    Together with the events this accounts for every NGSI message of the message store.
    """
    entities = explode_entities(ngsi_messages(message_store))
    n_attrs = F.size(_attributes())
    reason = (
        F.when(F.col("entity").isNull(), F.lit("data holds no entity"))
        .when(F.col("entity")["id"].isNull(), F.format_string("entity #%d has no id", F.col("entityIndex")))
        .when(n_attrs == 0, F.format_string("entity '%s' carries no attribute", F.col("entity")["id"]))
    )
    return (
        entities.select(F.col("message_identifier").alias("messageId"), reason.alias("reason"), F.col("dt"))
        .where(F.col("reason").isNotNull())
        .select(*NGSI_EVENT_REJECTS.fieldNames())
    )
