"""Landing lines -> the seed 004 message store.

Pure DataFrame -> DataFrame functions: no I/O, no actions.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
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


def _once(parsed: Column) -> Column:
    """``parsed`` as a column ``_once`` that Spark evaluates exactly once per row.

    Filters on fields of a parsed struct would otherwise be pushed below the parse, inlining one
    ``from_json`` per field referenced (measured: 15 JSON parses per landing line). A predicate on a
    generator's output cannot be pushed below the generator, so parsing inside one is a barrier.
    """
    return F.explode(F.array(parsed)).alias("_once")


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
    # The line ends with the envelope's closing brace (a torn line does not, and then its body does
    # not parse, which marks it unreadable): the body is everything between the marker and it.
    start = f"(instr(value, '{BODY_MARKER}') + {len(BODY_MARKER)})"
    body = F.when(marker > 0, F.expr(f"substring(value, {start}, length(value) - {start})"))
    return lines.select(_once(F.struct(body.alias("body"), head.alias("h")))).select(
        *[F.col("_once.h")[f.name].alias(f.name) for f in ENVELOPE_HEAD.fields], F.col("_once.body").alias("body")
    )


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
    parsed = F.struct(
        F.when(~simplified, F.from_json(F.col("body"), _BODY, _PARSE)).alias("b"),
        F.when(simplified, F.from_json(F.col("body"), _SIMPLIFIED_BODY, _PARSE)).alias("s"),
    )
    env = (
        envelopes.select("*", _once(parsed))
        .withColumn("_b", F.col("_once.b"))
        .withColumn("_s", F.col("_once.s"))
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
        F.col("guid"),
        F.col("origin"),
        F.col("_b.subscriptionId").alias("subscription_id"),
        F.when(is_message, F.coalesce(F.expr("try_cast(_b.refresh as boolean)"), F.lit(False))).alias("refresh"),
        F.col("_b.source").alias("source_system"),
        F.col("_b.user").alias("user"),
        F.date_format(recv_ts, "yyyy-MM-dd-HH").alias("dt"),
    )
    return out.select(*MESSAGE_STORE.fieldNames())


def duplicate_guids(envelopes: DataFrame, earlier_guids: DataFrame) -> DataFrame:
    """The ``message_id`` of every envelope whose guid was received before (one column).

    "Before" means in an earlier hour (``earlier_guids``: one ``guid`` column) or earlier in these
    hours, ordered by receive time then message identifier, so the first arrival is not listed.
    Works on the envelope head alone (the receiver puts a message's guid there), so the bodies are
    neither parsed nor shuffled, and messages without a guid (most notifications) are not shuffled.
    """
    with_guid = envelopes.select("message_id", "guid", "recv_ms").where(F.col("guid").isNotNull())
    first = Window.partitionBy("guid").orderBy("recv_ms", "message_id")
    seen = earlier_guids.where(F.col("guid").isNotNull()).select("guid").distinct().withColumn("_seen", F.lit(True))
    return (
        with_guid.join(seen, on="guid", how="left")
        .withColumn("_rank", F.row_number().over(first))
        .where(F.col("_seen").isNotNull() | (F.col("_rank") > 1))
        .select("message_id")
    )


def mark_duplicates(messages: DataFrame, duplicates: DataFrame) -> DataFrame:
    """Status 5 (previously received) for the messages listed in ``duplicates`` (``message_id``)."""
    dup = duplicates.select(F.col("message_id").alias("message_identifier"), F.lit(True).alias("_dup"))
    is_dup = F.col("_dup").isNotNull()
    return (
        messages.join(dup, on="message_identifier", how="left")
        .withColumn("status", F.when(is_dup, F.lit(int(MessageStatus.PREVIOUSLY_RECEIVED))).otherwise(F.col("status")))
        .withColumn("error_text", F.when(is_dup, F.lit("guid previously received")).otherwise(F.col("error_text")))
        .select(*MESSAGE_STORE.fieldNames())
    )


def head_scan(lines: DataFrame) -> DataFrame:
    """One pass over landing lines for what is needed before their rows are built: a row per line that
    carries a guid (``head``: its message_id, guid and recv_ms; ``n``: 1, or how many lines have that
    same head) and one row with a null ``head`` whose ``n`` counts every other line, readable or not.

    Lines without a guid (most notifications) collapse into that one row where they are read, so only
    the heads with a guid are shuffled. ``guid_heads`` and ``head_totals`` read the result.
    """
    head = F.when(F.col("guid").isNotNull(), F.struct("message_id", "guid", "recv_ms"))
    return parse_landing_lines(lines).groupBy(head.alias("head")).agg(F.count(F.lit(1)).alias("n"))


def guid_heads(scan: DataFrame) -> DataFrame:
    """``head_scan``'s lines that carry a guid, one row per line (message_id, guid, recv_ms)."""
    one_per_line = F.explode(F.sequence(F.lit(1), F.col("n"))).alias("_line")
    return scan.where(F.col("head").isNotNull()).select("head.*", one_per_line).drop("_line")


def head_totals(scan: DataFrame) -> DataFrame:
    """``head_scan``'s totals as one row: ``n`` lines, ``guids`` 1 when any carries a guid (else 0)."""
    return scan.agg(
        F.coalesce(F.sum("n"), F.lit(0)).alias("n"),
        F.coalesce(F.max(F.col("head").isNotNull().cast("int")), F.lit(0)).alias("guids"),
    )


def build_message_store(
    lines: DataFrame, duplicates: DataFrame | None = None, *, broadcast_duplicates: bool = False
) -> DataFrame:
    """Landing lines of some hours -> their message store rows, the ``duplicates`` marked (status 5).

    ``duplicates``: ``duplicate_guids``'s ids, or None when no line carries a guid. The messages are
    the large side of that join (their bodies); with ``broadcast_duplicates`` the ids, few by nature,
    are sent to every task instead, so the bodies are written without being shuffled first.
    """
    messages = to_message_store(parse_landing_lines(lines))
    if duplicates is None:
        return messages
    return mark_duplicates(messages, F.broadcast(duplicates) if broadcast_duplicates else duplicates)
