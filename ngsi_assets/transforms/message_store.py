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

# The body fields the message store keeps as columns; `data` keeps its raw JSON text.
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
        StructField("data", StringType()),
        StructField("type", StringType()),
    ]
)
_TYPES_ONLY = ArrayType(StructType([StructField("type", StringType())]))
_SIMPLIFIED = (Format.SIMPLIFIED_NORMALIZED.value, Format.SIMPLIFIED_KEY_VALUES.value)


def parse_landing_lines(lines: DataFrame) -> DataFrame:
    """One row per landing line (input: a ``value`` text column): the envelope head, ``body`` text.

    Rows whose line is not a readable envelope (a torn tail left by a crash) have a null
    ``message_id``.
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


def readable_envelopes(envelopes: DataFrame) -> DataFrame:
    """Only the lines that are complete envelopes."""
    return envelopes.where(F.col("message_id").isNotNull() & F.col("body").isNotNull())


def unreadable_lines(envelopes: DataFrame) -> DataFrame:
    """The lines that are not complete envelopes (torn tails, or corruption)."""
    return envelopes.where(F.col("message_id").isNull() | F.col("body").isNull())


def to_message_store(envelopes: DataFrame) -> DataFrame:
    """One row per acknowledged message, keyed by ``message_identifier``; status 0 (received).

    ``data`` is the JSON text of the records: the ``data`` array of a generic message, NGSI v2
    normalized/keyValues or NGSI-LD notification, or ``[entity]`` for the simplified formats.
    """
    env = readable_envelopes(envelopes)
    b = F.from_json(F.col("body"), _BODY)
    is_message = F.col("kind") == Kind.MESSAGE.value
    simplified = F.col("format").isin(*_SIMPLIFIED)
    data = F.when(simplified, F.concat(F.lit("["), F.col("body"), F.lit("]"))).otherwise(F.col("_b.data"))
    recv_ts = F.timestamp_millis(F.col("recv_ms"))
    entity_types = F.array_join(
        F.array_sort(F.array_distinct(F.transform(F.from_json(F.col("data"), _TYPES_ONLY), lambda e: e["type"]))),
        ",",
    )
    msg_ts = F.expr("try_cast(_b.timestamp as timestamp)")
    ld_ts = F.expr("try_cast(_b.notifiedAt as timestamp)")
    effective = (
        F.when(is_message, msg_ts)
        .when(F.col("kind") == Kind.NGSI_LD.value, F.coalesce(ld_ts, recv_ts))
        .otherwise(recv_ts)
    )
    bad_ts = is_message & msg_ts.isNull()
    out = (
        env.withColumn("_b", b)
        .withColumn("data", data)
        .select(
            F.col("message_id").alias("message_identifier"),
            F.when(is_message, F.col("_b.entity")).otherwise(entity_types).alias("source_entity"),
            recv_ts.alias("message_timestamp"),
            effective.alias("effective_timestamp"),
            F.col("data"),
            F.when(bad_ts, F.lit(int(MessageStatus.ERROR)))
            .otherwise(F.lit(int(MessageStatus.RECEIVED)))
            .cast("int")
            .alias("status"),
            F.when(bad_ts, F.concat(F.lit("timestamp: not an ISO 8601 time: "), F.col("_b.timestamp"))).alias(
                "error_text"
            ),
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
    )
    return out.select(*MESSAGE_STORE.fieldNames())


def mark_duplicate_guids(messages: DataFrame, earlier_guids: DataFrame) -> DataFrame:
    """Status 5 (previously received) for every message whose guid was received before.

    "Before" means in an earlier hour (``earlier_guids``: one ``guid`` column) or earlier in these
    hours, ordered by receive time then message identifier, so the first arrival keeps its status.
    """
    first = Window.partitionBy("guid").orderBy("recv_ms", "message_identifier")
    seen = earlier_guids.select("guid").where(F.col("guid").isNotNull()).distinct().withColumn("_seen", F.lit(True))
    flagged = (
        messages.join(seen, on="guid", how="left")
        .withColumn("_rank", F.when(F.col("guid").isNotNull(), F.row_number().over(first)))
        .withColumn("_dup", F.coalesce(F.col("_seen"), F.lit(False)) | (F.coalesce(F.col("_rank"), F.lit(1)) > 1))
    )
    return (
        flagged.withColumn(
            "status", F.when(F.col("_dup"), F.lit(int(MessageStatus.PREVIOUSLY_RECEIVED))).otherwise(F.col("status"))
        )
        .withColumn(
            "error_text", F.when(F.col("_dup"), F.lit("guid previously received")).otherwise(F.col("error_text"))
        )
        .select(*MESSAGE_STORE.fieldNames())
    )


def build_message_store(lines: DataFrame, earlier_guids: DataFrame) -> DataFrame:
    """Landing lines of some hours -> their message store rows (see the two steps above)."""
    return mark_duplicate_guids(to_message_store(parse_landing_lines(lines)), earlier_guids)
