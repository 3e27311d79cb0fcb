"""Landing lines -> the seed 004 message store.

Pure DataFrame -> DataFrame functions: no I/O, no actions.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from ngsi_assets.ngsi.constants import Format, Kind, MessageStatus
from ngsi_assets.transforms.schemas import ENVELOPE_HEAD, MESSAGE_STORE

BODY_MARKER = ',"body":'

# The body fields the message store keeps as columns. Entities are read for their type only: the
# parser skips everything else without copying it.
_BODY = StructType(
    [
        StructField("subscriptionId", StringType()),
        StructField("notifiedAt", StringType()),
        StructField("entity", StringType()),
        StructField("timestamp", StringType()),
        StructField("guid", StringType()),
        StructField("refresh", StringType()),
        StructField("source", StringType()),
        StructField("user", StringType()),
        StructField("data", ArrayType(StructType([StructField("type", StringType())]))),
        StructField("_corrupt_record", StringType()),
    ]
)
# A simplified-format body is the entity itself, whose attributes may have any name ("data" too).
_SIMPLIFIED_BODY = StructType([StructField("type", StringType()), StructField("_corrupt_record", StringType())])
_PARSE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}
# Envelope fields every landed line has (the receiver writes them all).
_REQUIRED = ("message_id", "recv_ms", "kind", "format", "service", "service_path", "origin")
_SIMPLIFIED = (Format.SIMPLIFIED_NORMALIZED.value, Format.SIMPLIFIED_KEY_VALUES.value)


def parse_landing_lines(lines: DataFrame) -> DataFrame:
    """One row per landing line (input: a ``value`` text column): the envelope head, ``body`` text.

    Whether the line is a readable envelope is decided with the body parse (see to_message_store).
    """
    # The head is written by orjson, which escapes every '"' inside its strings, so the first
    # ',"body":' is the real one: the head is what precedes it, the body runs from there to the
    # envelope's closing brace. Parsing only the head keeps the (larger) body out of this parse.
    marker = F.instr(F.col("value"), BODY_MARKER)
    head_text = F.concat(F.expr("substring(value, 1, instr(value, '" + BODY_MARKER + "') - 1)"), F.lit("}"))
    head = F.when(marker > 0, F.from_json(head_text, ENVELOPE_HEAD))
    body = F.expr(f"substring(value, instr(value, '{BODY_MARKER}') + {len(BODY_MARKER)})")
    return lines.select(
        F.when(marker > 0, F.regexp_replace(body, r"\}\s*$", "")).alias("body"), head.alias("_h")
    ).select(*[F.col("_h")[f.name].alias(f.name) for f in ENVELOPE_HEAD.fields], "body")


def to_message_store(envelopes: DataFrame) -> DataFrame:
    """One row per acknowledged message, keyed by ``message_identifier``; status 0 (received).

    ``data`` is the message body exactly as it was received (JSON text): the records of a generic
    message are its ``data`` array, the entities of a notification its ``data`` array, or the body
    itself for the simplified NGSI v2 formats. Keeping the bytes verbatim loses nothing (number
    spellings included) and spares a re-serialisation.
    """
    is_message = F.col("kind") == Kind.MESSAGE.value
    simplified = F.col("format").isin(*_SIMPLIFIED)
    # A line is an envelope when its head has every field and its body is JSON; anything else is a
    # torn tail (a write a crash cut short, never acknowledged) or corruption, left out here and
    # counted by the asset's check.
    readable = F.lit(True)
    for name in _REQUIRED:
        readable = readable & F.col(name).isNotNull()
    readable = (
        readable
        & F.col("body").isNotNull()
        & F.coalesce(F.col("_b._corrupt_record"), F.col("_s._corrupt_record")).isNull()
    )
    env = (
        envelopes.withColumn("_b", F.when(~simplified, F.from_json(F.col("body"), _BODY, _PARSE)))
        .withColumn("_s", F.when(simplified, F.from_json(F.col("body"), _SIMPLIFIED_BODY, _PARSE)))
        .where(readable)
    )
    recv_ts = F.timestamp_millis(F.col("recv_ms"))
    entity_types = F.when(simplified, F.col("_s.type")).otherwise(
        F.array_join(F.array_sort(F.array_distinct(F.transform(F.col("_b.data"), lambda e: e["type"]))), ",")
    )
    msg_ts = F.expr("try_cast(_b.timestamp as timestamp)")
    ld_ts = F.expr("try_cast(_b.notifiedAt as timestamp)")
    effective = (
        F.when(is_message, msg_ts)
        .when(F.col("kind") == Kind.NGSI_LD.value, F.coalesce(ld_ts, recv_ts))
        .otherwise(recv_ts)
    )
    bad_ts = is_message & msg_ts.isNull()
    out = env.select(
        F.col("message_id").alias("message_identifier"),
        F.when(is_message, F.col("_b.entity")).otherwise(entity_types).alias("source_entity"),
        recv_ts.alias("message_timestamp"),
        effective.alias("effective_timestamp"),
        F.col("body").alias("data"),
        F.when(bad_ts, F.lit(int(MessageStatus.ERROR)))
        .otherwise(F.lit(int(MessageStatus.RECEIVED)))
        .cast("int")
        .alias("status"),
        F.when(bad_ts, F.concat(F.lit("timestamp: not an ISO 8601 time: "), F.col("_b.timestamp"))).alias("error_text"),
        F.col("recv_ms"),
        F.col("kind"),
        F.col("format"),
        F.col("service"),
        F.col("service_path"),
        F.col("correlator"),
        F.col("cbnotif"),
        F.coalesce(F.col("guid"), F.when(is_message, F.col("_b.guid"))).alias("guid"),
        F.col("origin"),
        F.col("_b.subscriptionId").alias("subscription_id"),
        F.when(is_message, F.coalesce(F.expr("try_cast(_b.refresh as boolean)"), F.lit(False))).alias("refresh"),
        F.col("_b.source").alias("source_system"),
        F.col("_b.user").alias("user"),
        F.date_format(recv_ts, "yyyy-MM-dd-HH").alias("dt"),
    )
    return out.select(*MESSAGE_STORE.fieldNames())


def mark_duplicate_guids(messages: DataFrame, earlier_guids: DataFrame) -> DataFrame:
    """Status 5 (previously received) for every message whose guid was received before.

    "Before" means in an earlier hour (``earlier_guids``: one ``guid`` column) or earlier in these
    hours, ordered by receive time then message identifier, so the first arrival keeps its status.
    Only messages that carry a guid are shuffled; the rest (most NGSI notifications) pass through.
    """
    with_guid = messages.where(F.col("guid").isNotNull())
    first = Window.partitionBy("guid").orderBy("recv_ms", "message_identifier")
    seen = earlier_guids.where(F.col("guid").isNotNull()).select("guid").distinct().withColumn("_seen", F.lit(True))
    dup = F.coalesce(F.col("_seen"), F.lit(False)) | (F.row_number().over(first) > 1)
    flagged = (
        with_guid.join(seen, on="guid", how="left")
        .withColumn("_dup", dup)
        .withColumn(
            "status", F.when(F.col("_dup"), F.lit(int(MessageStatus.PREVIOUSLY_RECEIVED))).otherwise(F.col("status"))
        )
        .withColumn(
            "error_text", F.when(F.col("_dup"), F.lit("guid previously received")).otherwise(F.col("error_text"))
        )
        .select(*MESSAGE_STORE.fieldNames())
    )
    return messages.where(F.col("guid").isNull()).select(*MESSAGE_STORE.fieldNames()).unionByName(flagged)


def build_message_store(lines: DataFrame, earlier_guids: DataFrame) -> DataFrame:
    """Landing lines of some hours -> their message store rows (see the two steps above)."""
    return mark_duplicate_guids(to_message_store(parse_landing_lines(lines)), earlier_guids)
