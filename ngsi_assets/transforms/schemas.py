"""Spark schemas of the landing envelope and of the lake datasets (the contracts between assets)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The envelope fields before "body" (see ngsi_assets.ngsi.envelope).
ENVELOPE_HEAD = StructType(
    [
        StructField("message_id", StringType()),
        StructField("recv_ms", LongType()),
        StructField("kind", StringType()),
        StructField("format", StringType()),
        StructField("service", StringType()),
        StructField("service_path", StringType()),
        StructField("correlator", StringType()),
        StructField("cbnotif", LongType()),
        StructField("guid", StringType()),
        StructField("origin", StringType()),
    ]
)

# Seed 004 message store, plus the NGSI envelope columns.
MESSAGE_STORE = StructType(
    [
        StructField("message_identifier", StringType(), False),
        StructField("source_entity", StringType()),
        StructField("message_timestamp", TimestampType(), False),
        StructField("effective_timestamp", TimestampType()),
        StructField("data", StringType()),
        StructField("status", IntegerType(), False),
        StructField("error_text", StringType()),
        StructField("recv_ms", LongType(), False),
        StructField("kind", StringType(), False),
        StructField("format", StringType(), False),
        StructField("service", StringType(), False),
        StructField("service_path", StringType(), False),
        StructField("correlator", StringType()),
        StructField("cbnotif", LongType()),
        StructField("guid", StringType()),
        StructField("origin", StringType()),
        StructField("subscription_id", StringType()),
        StructField("refresh", BooleanType()),
        StructField("source_system", StringType()),
        StructField("user", StringType()),
        StructField("dt", StringType(), False),
    ]
)

# One row per entity attribute update: the Cygnus/Draco NGSIEvent columns plus lineage.
NGSI_EVENTS = StructType(
    [
        StructField("recvTimeTs", LongType(), False),
        StructField("recvTime", StringType(), False),
        StructField("fiwareService", StringType(), False),
        StructField("fiwareServicePath", StringType(), False),
        StructField("entityId", StringType(), False),
        StructField("entityType", StringType()),
        StructField("attrName", StringType(), False),
        StructField("attrType", StringType()),
        StructField("attrValue", StringType()),
        StructField("attrMd", StringType(), False),
        StructField("datasetId", StringType()),
        StructField("timeIndex", TimestampType(), False),
        StructField("timeIndexSource", StringType(), False),
        StructField("alterationType", StringType()),
        StructField("messageId", StringType(), False),
        StructField("entityIndex", IntegerType(), False),
        StructField("dt", StringType(), False),
    ]
)

# NGSI messages that produced no event, with the reason.
NGSI_EVENT_REJECTS = StructType(
    [
        StructField("messageId", StringType(), False),
        StructField("reason", StringType(), False),
        StructField("dt", StringType(), False),
    ]
)

# Parsing helpers: entities as maps of raw JSON text, NGSI v2 normalized attributes.
ENTITY_LIST = ArrayType(MapType(StringType(), StringType()))
V2_METADATA = MapType(StringType(), StructType([StructField("type", StringType()), StructField("value", StringType())]))
V2_ATTRIBUTE = StructType(
    [
        StructField("type", StringType()),
        StructField("value", StringType()),
        StructField("metadata", V2_METADATA),
    ]
)
