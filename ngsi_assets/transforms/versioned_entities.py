"""Versioned entities (seed 004) on Spark: messages -> records -> versions, one key's history at a time.

The pipeline, all pure DataFrame -> DataFrame functions (the asset only reads and writes):

1. ``datahub_source_records`` / ``ngsi_source_records``: one row per incoming record, its values as a
   map of raw JSON text, keyed by (message_identifier, record_seq).
2. ``map_to_target``: a source record mapped to one target entity: values converted to the target
   types, keys, guid, links resolved, priorities; records that fail go to the errors frame with the
   message's status (4 error, 1 requires reprocessing) and the reason (a failed record whose key is
   known is kept as a ``seen`` marker, so no refresh deletes its row). Children become source records
   of the child entity plus child-refresh events.
3. ``refresh_deletes``: the deletes a refresh generates for keys it did not contain.
4. ``fold_versions``: every record of the touched keys, folded in effective order by the pure rules
   of ``ngsi_assets.ngsi.versioning`` (mapInArrow over key-sorted partitions: no per-key overhead);
   or, for keys whose new records all come after their stored ones (``keys_after_their_marks``),
   only the new records, on from the key's latest version (``fold_starts``).
5. ``typed_versions``: the generic versions as the target table's typed columns.

A guid is the UUID v5 of the entity name and the key values, so a key keeps its guid through any
rebuild, and rows live in hash buckets of the guid: a run rewrites only the buckets its keys fall in.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ngsi_assets.ngsi.constants import Kind, MessageStatus
from ngsi_assets.ngsi.entity_schema import (
    DELETED,
    FIELD_PROVENANCE,
    GUID,
    NGSI_ENTITY_ID,
    NGSI_ENTITY_TYPE,
    NGSI_KEYS,
    NGSI_SERVICE,
    NGSI_SERVICE_PATH,
    NGSI_SOURCE_SYSTEM,
    SOURCE_MESSAGE,
    STANDARD_FIELDS,
    VALID_FROM,
    VALID_TO,
    EntityMapping,
    FieldDef,
    TargetEntity,
)
from ngsi_assets.ngsi.versioning import (
    DELETE,
    GUID_FIELD,
    REFRESH_DELETE,
    UPSERT,
    Record,
    Version,
    fold_key,
    provenance_from_json,
    provenance_names,
)
from ngsi_assets.transforms.conversions import convert_value, typed_column
from ngsi_assets.transforms.partitioning import cluster_by
from resources.frames import empty_frame

# Namespace of entity guids (uuid5 of "<entity>\n<key JSON>").
GUID_NAMESPACE = uuid.UUID("6b1f0f3e-3c0a-5d7e-9a55-5e0d1f7c2a41")
DEFAULT_BUCKETS = 64
MAX_ERROR_TEXT = 1000
# The op of a record that failed but whose key is known: stored with the records, never folded; it
# only marks its key as contained in its message (see ``refresh_deletes``).
SEEN = "seen"

RAW_VALUES = MapType(StringType(), StringType())

# One row per incoming record (step 1).
SOURCE_RECORDS = StructType(
    [
        StructField("message_identifier", StringType(), False),
        StructField("effective_ts", TimestampType()),
        StructField("source_system", StringType()),
        StructField("source_entity", StringType()),
        StructField("refresh", BooleanType()),
        StructField("record_seq", IntegerType(), False),
        StructField("values", RAW_VALUES),
        StructField("deleted_raw", StringType()),
        StructField("dt", StringType(), False),
    ]
)

# One row per record of one target entity, ready to fold (step 2); stored in the lake by bucket.
ENTITY_RECORDS = StructType(
    [
        StructField("entity", StringType(), False),
        StructField("guid", StringType(), False),
        StructField("key", StringType(), False),
        StructField("effective_ts", TimestampType(), False),
        StructField("message_identifier", StringType(), False),
        StructField("record_seq", IntegerType(), False),
        StructField("op", StringType(), False),
        StructField("priority", IntegerType(), False),
        StructField("fields", RAW_VALUES),
        StructField("field_priority", MapType(StringType(), IntegerType())),
        StructField("key_fields", ArrayType(StringType())),
        StructField("dt", StringType(), False),
        StructField("bucket", IntegerType(), False),
    ]
)

# Records that could not be processed: status 4 (error) or 1 (requires reprocessing), with the reason.
RECORD_ERRORS = StructType(
    [
        StructField("message_identifier", StringType(), False),
        StructField("record_seq", IntegerType(), False),
        StructField("entity", StringType()),
        StructField("status", IntegerType(), False),
        StructField("error_text", StringType(), False),
        StructField("dt", StringType(), False),
    ]
)

# A refresh: deletes every live row of ``entity`` whose key values match ``scope`` and that the
# message did not contain. Scope is empty for a message refresh, the parent link for a child refresh.
REFRESHES = StructType(
    [
        StructField("entity", StringType(), False),
        StructField("scope", RAW_VALUES),
        StructField("effective_ts", TimestampType(), False),
        StructField("message_identifier", StringType(), False),
        StructField("priority", IntegerType(), False),
        StructField("dt", StringType(), False),
    ]
)

# The folded history of a key, generic (step 4).
VERSIONS = StructType(
    [
        StructField("entity", StringType(), False),
        StructField("guid", StringType(), False),
        StructField("valid_from", TimestampType(), False),
        StructField("valid_to", TimestampType()),
        StructField("deleted", BooleanType(), False),
        StructField("fields", RAW_VALUES),
        StructField("provenance", StringType(), False),
        StructField("source_message", StringType(), False),
        StructField("bucket", IntegerType(), False),
    ]
)

# Per message of the run's hours: how processing ended (the seed's message log).
MESSAGE_LOG = StructType(
    [
        StructField("message_identifier", StringType(), False),
        StructField("status", IntegerType(), False),
        StructField("error_text", StringType()),
        StructField("records", IntegerType(), False),
        StructField("dt", StringType(), False),
    ]
)


def guid_of(entity: str, key_json: str) -> str:
    """The guid of a key (Python twin of ``guid_column``, for tests and tools)."""
    return str(uuid.uuid5(GUID_NAMESPACE, f"{entity}\n{key_json}"))


def guid_column(entity: Column, key_json: Column) -> Column:
    """UUID v5 (RFC 4122: SHA-1 of namespace bytes + name, version and variant bits set) in Spark."""
    name = F.concat(F.unhex(F.lit(GUID_NAMESPACE.hex)), F.encode(F.concat(entity, F.lit("\n"), key_json), "UTF-8"))
    h = F.sha1(name)
    variant = F.lower(F.conv(((F.conv(F.substring(h, 17, 1), 16, 10).cast("int") % 4) + 8).cast("string"), 10, 16))
    return F.concat(
        F.substring(h, 1, 8),
        F.lit("-"),
        F.substring(h, 9, 4),
        F.lit("-5"),
        F.substring(h, 14, 3),
        F.lit("-"),
        variant,
        F.substring(h, 18, 3),
        F.lit("-"),
        F.substring(h, 21, 12),
    )


def bucket_column(guid: Column, buckets: int) -> Column:
    return F.pmod(F.xxhash64(guid), F.lit(buckets)).cast("int")


def _bounded(text: Column) -> Column:
    return F.substring(text, 1, MAX_ERROR_TEXT)


# ---------------------------------------------------------------------------------------------------
# Step 1: source records


def _lits(names: Sequence[str]) -> Column:
    return F.array(*[F.lit(n) for n in names]) if names else F.array().cast("array<string>")


def datahub_source_records(messages: DataFrame) -> DataFrame:
    """One row per record of each data-hub message with status 0, keyed by (message_identifier, record_seq).

    ``deleted_indicator`` in a record makes it a delete (a value that is not a boolean is an error,
    reported when it is mapped); it is not a field.
    """
    body = F.from_json(F.col("data"), StructType([StructField("data", ArrayType(RAW_VALUES))]))
    msgs = messages.where((F.col("kind") == Kind.MESSAGE.value) & (F.col("status") == int(MessageStatus.RECEIVED)))
    exploded = msgs.select(
        "message_identifier",
        F.col("effective_timestamp").alias("effective_ts"),
        "source_system",
        "source_entity",
        "refresh",
        "dt",
        F.posexplode(body["data"]).alias("pos", "raw"),
    )
    return _as_source_records(exploded, F.col("raw"))


def _as_source_records(df: DataFrame, raw: Column) -> DataFrame:
    """SOURCE_RECORDS of one data-hub record per row: ``raw`` is its map, ``pos`` its 0-based place.

    ``deleted_indicator`` makes a record a delete (a value that is not a boolean is an error,
    reported when it is mapped); it is not a field.
    """
    if "effective_ts" not in df.columns:
        df = df.withColumnRenamed("effective_timestamp", "effective_ts")
    return df.select(
        "message_identifier",
        "effective_ts",
        "source_system",
        "source_entity",
        "refresh",
        (F.col("pos") + 1).cast("int").alias("record_seq"),
        F.map_filter(raw, lambda k, _: k != DELETED).alias("values"),
        raw[DELETED].alias("deleted_raw"),
        "dt",
    )


def ngsi_source_records(events: DataFrame) -> DataFrame:
    """One row per notified NGSI entity, keyed by (message_identifier, record_seq = entityIndex + 1).

    The values are the attributes (``name#datasetId`` for an NGSI-LD multi-attribute instance) plus
    fiware_service, fiware_service_path, entity_id and entity_type. The effective timestamp is the
    latest time index of the entity's attributes; ``alterationType`` entityDelete makes a delete.
    """
    name = F.when(F.col("datasetId").isNull(), F.col("attrName")).otherwise(
        F.concat(F.col("attrName"), F.lit("#"), F.col("datasetId"))
    )
    grouped = events.groupBy("messageId", "entityIndex", "dt").agg(
        F.first("fiwareService").alias("svc"),
        F.first("fiwareServicePath").alias("path"),
        F.first("entityId").alias("eid"),
        F.first("entityType").alias("etype"),
        F.max("timeIndex").alias("effective_ts"),
        F.max((F.col("alterationType") == "entityDelete").cast("int")).alias("del"),
        # Sorted: collect_list follows the shuffle's order, which differs from run to run and between
        # a local session, a cluster and Spark Connect; the stored map must not.
        F.map_from_entries(F.array_sort(F.collect_list(F.struct(name, F.col("attrValue"))))).alias("attrs"),
    )
    ids = F.create_map(
        *[
            x
            for n, c in (
                (NGSI_SERVICE, "svc"),
                (NGSI_SERVICE_PATH, "path"),
                (NGSI_ENTITY_ID, "eid"),
                (NGSI_ENTITY_TYPE, "etype"),
            )
            for x in (F.lit(n), F.col(c))
        ]
    )
    return grouped.select(
        F.col("messageId").alias("message_identifier"),
        "effective_ts",
        F.lit(NGSI_SOURCE_SYSTEM).alias("source_system"),
        F.col("etype").alias("source_entity"),
        F.lit(False).alias("refresh"),
        (F.col("entityIndex") + 1).cast("int").alias("record_seq"),
        # An attribute named like an NGSI key or a standard column keeps its place in `attrs` (and is
        # refused when mapped); the identifying fields always come from the entity.
        F.map_concat(F.map_filter("attrs", lambda k, _: ~F.array_contains(F.map_keys(ids), k)), ids).alias("values"),
        F.when(F.col("del") == 1, F.lit("true")).alias("deleted_raw"),
        "dt",
        F.filter(F.map_keys("attrs"), lambda k: F.array_contains(_lits(RESERVED_ATTRIBUTES), k)).alias("clashes"),
    )


RESERVED_ATTRIBUTES = (*STANDARD_FIELDS, *NGSI_KEYS, NGSI_ENTITY_TYPE)


CSV_MAX_COLUMNS = 128
_CSV_SCHEMA = ", ".join(f"c{i} STRING" for i in range(CSV_MAX_COLUMNS + 1))


def _with_csv_cells(df: DataFrame, line: Column, name: str) -> DataFrame:
    """``df`` with column ``name``: the cells of one CSV line (quotes and escaped quotes handled),
    padded with nulls."""
    # RFC 4180: a quote inside a quoted cell is doubled (Spark's default escape is a backslash).
    parsed = F.from_csv(line, _CSV_SCHEMA, {"mode": "PERMISSIVE", "escape": '"'})
    # Parsed once, in its own projection: an array of the parse's fields written as one expression
    # would hold the parse once per cell (129 times), which Spark analyzes and optimizes every time
    # a plan reads the records (measured: CsvToStructs was a tenth of a warm server's planning time).
    cells = F.array(*[F.col("_csv")[f"c{i}"] for i in range(CSV_MAX_COLUMNS + 1)])
    return df.select("*", parsed.alias("_csv")).select(*[F.col(c) for c in df.columns], cells.alias(name))


def csv_source_records(messages: DataFrame, csv_systems: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """(SOURCE_RECORDS, RECORD_ERRORS) of data-hub messages whose ``data`` is text (status 0).

    The CSV reader (a source system with ``reader: csv``): the first non-blank line names the
    fields, every further non-blank line is a record (record_seq from 1); an empty cell is an
    explicit null; a line may not hold a line break inside quotes. Text for a source system without
    the CSV reader, an empty or repeated field name, more than ``CSV_MAX_COLUMNS`` columns, or a line
    with more cells than the header is an error for its message or record.
    """
    raw = F.from_json(F.col("data"), StructType([StructField("data", StringType())]))["data"]
    texts = messages.where(
        (F.col("kind") == Kind.MESSAGE.value) & (F.col("status") == int(MessageStatus.RECEIVED))
    ).select("*", raw.alias("_text"))
    texts = texts.where(F.col("_text").isNotNull() & F.json_array_length("_text").isNull())
    readable = F.col("source_system").isin(list(csv_systems)) if csv_systems else F.lit(False)

    def error_rows(df: DataFrame, seq: Column, text: Column) -> DataFrame:
        return df.select(
            "message_identifier",
            seq.cast("int").alias("record_seq"),
            F.lit(None).cast("string").alias("entity"),
            F.lit(int(MessageStatus.ERROR)).alias("status"),
            _bounded(text).alias("error_text"),
            "dt",
        )

    unreadable = error_rows(
        texts.where(~readable),
        F.lit(0),
        F.concat(
            F.lit("data is text, and source system "),
            F.coalesce(F.concat(F.lit("'"), F.col("source_system"), F.lit("'")), F.lit("(none)")),
            F.lit(" has no csv reader"),
        ),
    )
    if not csv_systems:
        # No source system reads CSV (the default): every text is an error above, and the records'
        # plan holds no CSV parse. Its 129 cells are otherwise analysed in every plan that reads the
        # run's records (measured: 2.7 s of a 30 s derived run's driver time, local Spark).
        nothing = texts.where(F.lit(False)).select("*", F.lit(0).alias("pos"), F.create_map().alias("_values"))
        return _as_source_records(nothing, F.col("_values").cast(RAW_VALUES)), unreadable
    lines = F.filter(F.split(F.col("_text"), "\r?\n"), lambda x: F.trim(x) != "")
    csv = texts.where(readable).select("*", lines.alias("_lines"))
    csv = _with_csv_cells(csv, F.element_at("_lines", 1), "_head")
    last = F.array_max(F.transform("_head", lambda x, i: F.when(x.isNotNull(), i + 1).otherwise(0)))
    csv = csv.withColumn("_n", last)
    head = F.slice("_head", 1, F.greatest(F.col("_n"), F.lit(1)))
    bad_head = (
        F.when(F.col("_n") > CSV_MAX_COLUMNS, F.lit(f"the header has more than {CSV_MAX_COLUMNS} columns"))
        .when(F.exists(head, lambda x: x.isNull() | (F.trim(x) == "")), F.lit("the header has an empty field name"))
        .when(F.size(F.array_distinct(head)) != F.size(head), F.lit("the header repeats a field name"))
    )
    csv = csv.withColumn("_bad_head", bad_head)
    header_errors = error_rows(
        csv.where(F.col("_bad_head").isNotNull()), F.lit(0), F.concat(F.lit("csv: "), F.col("_bad_head"))
    )
    rows = csv.where(F.col("_bad_head").isNull()).select(
        "*", F.posexplode(F.slice("_lines", 2, F.greatest(F.size("_lines") - 1, F.lit(0)))).alias("pos", "_line")
    )
    rows = _with_csv_cells(rows, F.col("_line"), "_cells").withColumn(
        "_extra", F.exists(F.slice("_cells", F.col("_n") + 1, CSV_MAX_COLUMNS + 1), lambda x: x.isNotNull())
    )
    cell_errors = error_rows(
        rows.where(F.col("_extra")),
        F.col("pos") + 1,
        F.concat(F.lit("csv record "), (F.col("pos") + 1).cast("string"), F.lit(": more cells than the header has")),
    )
    values = F.map_from_arrays(F.slice("_head", 1, F.col("_n")), F.slice("_cells", 1, F.col("_n")))
    records = _as_source_records(rows.where(~F.col("_extra")).withColumn("_values", values), F.col("_values"))
    return records, unreadable.unionByName(header_errors).unionByName(cell_errors)


def refresh_messages(messages: DataFrame) -> DataFrame:
    """Data-hub messages with ``refresh`` true (status 0), even those with no records."""
    return messages.where(
        (F.col("kind") == Kind.MESSAGE.value)
        & (F.col("status") == int(MessageStatus.RECEIVED))
        & F.coalesce(F.col("refresh"), F.lit(False))
    ).select(
        "message_identifier",
        F.col("effective_timestamp").alias("effective_ts"),
        "source_system",
        "source_entity",
        "dt",
    )


# ---------------------------------------------------------------------------------------------------
# Step 2: mapping to a target entity


@dataclass(frozen=True)
class MappedRecords:
    """What mapping a batch of source records to one target entity yields."""

    records: DataFrame  # ENTITY_RECORDS without bucket (op SEEN for failed records whose key is known)
    errors: DataFrame  # RECORD_ERRORS
    refreshes: DataFrame  # REFRESHES: child refreshes (message refreshes come from refresh_messages)
    children: dict[str, DataFrame]  # child entity -> source records (values by the child's field names)


_ERR = StructType([StructField("status", IntegerType()), StructField("text", StringType())])


def _err(status: MessageStatus, text: Column) -> Column:
    return F.struct(F.lit(int(status)).alias("status"), text.alias("text"))


def _record_columns(
    df: DataFrame, entity_name: str, keys: Sequence[str], priority: int, field_priority: dict
) -> DataFrame:
    """The ENTITY_RECORDS columns (no bucket) from a frame with guid, key, fields, _del and the source columns."""
    return df.select(
        F.lit(entity_name).alias("entity"),
        "guid",
        "key",
        "effective_ts",
        "message_identifier",
        "record_seq",
        F.when(F.col("_del"), F.lit(DELETE)).otherwise(F.lit(UPSERT)).alias("op"),
        F.lit(priority).cast("int").alias("priority"),
        # A delete carries its keys only (the other fields are nulled by the rules).
        F.when(F.col("_del"), F.map_filter("fields", lambda k, _: F.array_contains(_lits(keys), k)))
        .otherwise(F.col("fields"))
        .alias("fields"),
        F.create_map(*[x for n, p in field_priority.items() for x in (F.lit(n), F.lit(p))])
        .cast(MapType(StringType(), IntegerType()))
        .alias("field_priority"),
        _lits(keys).alias("key_fields"),
        "dt",
    )


def _error_rows(df: DataFrame, entity_name: str | None) -> DataFrame:
    """RECORD_ERRORS from a frame with a non-empty ``_errs`` array: an error (4) outranks status 1.

    The text names the target entity's record; with ``entity_name`` None (NGSI types no schema entity
    maps), the record's NGSI type, if it has one, and the entity column is null."""
    # (concat_ws leaves a null type out, separator included.)
    named = (
        F.lit(f"{entity_name} record ")
        if entity_name is not None
        else F.concat_ws(" ", "source_entity", F.lit("record "))
    )
    return df.select(
        "message_identifier",
        "record_seq",
        F.lit(entity_name).cast("string").alias("entity"),
        F.when(F.exists("_errs", lambda e: e["status"] == int(MessageStatus.ERROR)), F.lit(int(MessageStatus.ERROR)))
        .otherwise(F.lit(int(MessageStatus.REQUIRES_REPROCESSING)))
        .cast("int")
        .alias("status"),
        _bounded(
            F.concat(
                named,
                F.col("record_seq").cast("string"),
                F.lit(": "),
                F.array_join(F.transform("_errs", lambda e: e["text"]), "; "),
            )
        ).alias("error_text"),
        "dt",
    )


def _deleted_flag(df: DataFrame) -> DataFrame:
    """``_del`` from deleted_raw (a boolean word), and its conversion error into ``_errs``."""
    conv = convert_value(F.col("deleted_raw"), FieldDef(type="boolean"), DELETED)
    return df.withColumn("_del", F.coalesce(conv["value"] == "true", F.lit(False))).withColumn(
        "_errs", F.concat("_errs", F.array(F.when(conv["error"].isNotNull(), _err(MessageStatus.ERROR, conv["error"]))))
    )


def map_ngsi_default(source: DataFrame) -> MappedRecords:
    """NGSI source records of types the schema does not name -> target entity ``entity_type``.

    Keyed by fiware_service, fiware_service_path and entity_id; every attribute is a text field.
    """
    df = source.withColumn("_errs", F.array().cast(ArrayType(_ERR)))
    df = df.withColumn(
        "_errs",
        F.concat(
            "_errs",
            F.array(
                F.when(F.col("source_entity").isNull(), _err(MessageStatus.ERROR, F.lit("entity has no type"))),
                F.when(
                    F.size("clashes") > 0,
                    _err(
                        MessageStatus.ERROR,
                        F.concat(
                            F.lit("attribute names clash with columns of the target table: "),
                            F.array_join("clashes", ", "),
                        ),
                    ),
                ),
            ),
        ),
    )
    df = _deleted_flag(df).withColumn("_errs", F.filter("_errs", lambda e: e.isNotNull()))
    df = (
        df.withColumn("fields", F.col("values"))
        .withColumn("key", F.to_json(F.array(*[F.col("values")[k] for k in NGSI_KEYS])))
        .withColumn("entity", F.coalesce(F.col("source_entity"), F.lit("")))
        .withColumn("guid", guid_column(F.col("entity"), F.col("key")))
    )
    ok = df.where(F.size("_errs") == 0)
    records = ok.select(
        "entity",
        "guid",
        "key",
        "effective_ts",
        "message_identifier",
        "record_seq",
        F.when(F.col("_del"), F.lit(DELETE)).otherwise(F.lit(UPSERT)).alias("op"),
        F.lit(0).alias("priority"),
        F.when(F.col("_del"), F.map_filter("fields", lambda k, _: F.array_contains(_lits(NGSI_KEYS), k)))
        .otherwise(F.col("fields"))
        .alias("fields"),
        F.create_map().cast(MapType(StringType(), IntegerType())).alias("field_priority"),
        _lits(NGSI_KEYS).alias("key_fields"),
        "dt",
    )
    bad = df.where(F.size("_errs") > 0)
    errors = _error_rows(bad, None)
    return MappedRecords(records, errors, empty_frame(source.sparkSession, REFRESHES), {})


def map_to_target(
    source: DataFrame,
    entity_name: str,
    entity: TargetEntity,
    mapping: EntityMapping,
    link_lookups: dict[str, DataFrame],
    link_keys: dict[str, tuple[str, ...]],
    *,
    child_of: str | None = None,
    link_fields: dict[str, dict[str, FieldDef]] | None = None,
) -> MappedRecords:
    """Source records -> records of target ``entity_name`` through ``mapping``: converted, keyed, linked.

    ``link_lookups[e]`` holds the live rows of each linked entity ``e`` as (guid, values: map of the
    canonical text of its fields), ``link_keys[e]`` its key fields (the default link key), and
    ``link_fields[e]`` its field definitions: source link-key values are converted to those types
    before the lookup (an integer key sent as ``1.0`` or a timestamp key without milliseconds match).
    ``child_of`` names the parent-identifier field when the records are children built from a
    parent's array: their values use target names and carry the parent's guid.
    """
    fmap = {fm.reference: fm for fm in (mapping.fields or [])}
    selected = list(entity.fields) if mapping.fields is None else [fm.reference for fm in mapping.fields]
    keys = entity.key_fields
    df = source
    if entity.unique:
        # Unique facts: the message identifier (and the record number) are the key.
        extra = {entity.uniqueIdentifier or "": F.col("message_identifier")}
        if entity.uniqueSequence:
            extra[entity.uniqueSequence] = F.col("record_seq").cast("string")
        df = df.withColumn(
            "values",
            F.map_concat(
                F.map_filter("values", lambda k, _: ~F.array_contains(_lits(list(extra)), k)),
                F.create_map(*[x for n, c in extra.items() for x in (F.lit(n), c)]),
            ),
        )
        selected += [n for n in extra if n not in selected]
        fmap = {n: fm for n, fm in fmap.items() if n not in extra}

    def src(name: str) -> str:
        fm = fmap.get(name)
        return fm.source_name if fm and child_of is None else name

    df = df.withColumn("_errs", F.array().cast(ArrayType(_ERR)))
    df = _deleted_flag(df)
    entries: list[Column] = []
    errs: list[Column] = []
    for name in selected:
        f = entity.fields[name]
        if f.type in ("children", "link"):
            continue
        conv = convert_value(F.col("values")[src(name)], f, name)
        present = F.map_contains_key("values", src(name))
        entries.append(F.struct(F.lit(name).alias("k"), conv["value"].alias("v"), present.alias("p")))
        errs.append(F.when(present & conv["error"].isNotNull(), _err(MessageStatus.ERROR, conv["error"])))
    df = df.withColumn("_errs", F.concat("_errs", F.array(*errs)) if errs else F.col("_errs"))
    df = df.withColumn(
        "fields",
        F.map_from_entries(
            F.transform(F.filter(F.array(*entries), lambda x: x["p"]), lambda x: F.struct(x["k"], x["v"]))
        )
        if entries
        else F.create_map().cast(RAW_VALUES),
    )

    for name in selected:
        f = entity.fields[name]
        if f.type != "link":
            continue
        if child_of == name:
            # The parent identifier of a child record is the parent's guid, known from the parent.
            df = df.withColumn("fields", F.map_concat("fields", F.create_map(F.lit(name), F.col("values")[name])))
            continue
        target_keys = list(f.linkKey or link_keys[f.linkEntity or ""])
        fm = fmap.get(name)
        source_keys = list(fm.sourceLinkKey) if fm and fm.sourceLinkKey else target_keys
        target_defs = (link_fields or {}).get(f.linkEntity or "", {})
        key_defs = [target_defs.get(k) for k in target_keys]
        df = _resolve_link(df, name, f, source_keys, target_keys, link_lookups[f.linkEntity or ""], key_defs)

    for k in keys:
        errs_k = F.when(
            F.col("fields")[k].isNull(), _err(MessageStatus.ERROR, F.lit(f"key field {k}: missing or null"))
        )
        df = df.withColumn("_errs", F.concat("_errs", F.array(errs_k)))
    df = df.withColumn("_errs", F.filter("_errs", lambda e: e.isNotNull()))
    df = df.withColumn("key", F.to_json(F.array(*[F.col("fields")[k] for k in keys])))
    df = df.withColumn("guid", guid_column(F.lit(entity_name), F.col("key")))

    field_priority = {
        n: (fmap[n].priority if n in fmap and fmap[n].priority is not None else mapping.priority)
        for n in selected
        if entity.fields[n].stored
    }
    ok = df.where(F.size("_errs") == 0)
    failed = df.where(F.size("_errs") > 0)
    # A failed record whose key is known still names its row: a refresh (or its parent's list of
    # children) must not delete that row because the record could not be applied.
    keyed = failed.where(F.forall(F.array(*[F.col("fields")[k] for k in keys]), lambda v: v.isNotNull()))
    seen = _record_columns(keyed, entity_name, keys, mapping.priority, field_priority).withColumns(
        {"op": F.lit(SEEN), "fields": F.map_filter("fields", lambda k, _: F.array_contains(_lits(keys), k))}
    )
    records = _record_columns(ok, entity_name, keys, mapping.priority, field_priority).unionByName(seen)
    errors = _error_rows(failed, entity_name)

    children: dict[str, DataFrame] = {}
    refresh_parts: list[DataFrame] = []
    for name in selected:
        f = entity.fields[name]
        if f.type != "children":
            continue
        parents = ok.withColumn("_kids", F.col("values")[src(name)]).where(F.col("_kids").isNotNull() | F.col("_del"))
        # The list of children replaces the parent's children; a parent delete deletes them all.
        refresh_parts.append(
            parents.select(
                F.lit(f.childEntity).alias("entity"),
                F.create_map(F.lit(f.parentIdentifier), F.col("guid")).alias("scope"),
                "effective_ts",
                "message_identifier",
                F.lit(mapping.priority).cast("int").alias("priority"),
                "dt",
            )
        )
        items = parents.where(~F.col("_del")).select(
            "message_identifier",
            "effective_ts",
            "refresh",
            "record_seq",
            "guid",
            "dt",
            F.posexplode(F.from_json(F.col("_kids"), ArrayType(RAW_VALUES))).alias("pos", "child"),
        )
        extra = [F.lit(f.parentIdentifier), F.col("guid")]
        drop = [f.parentIdentifier or "", DELETED]
        if f.childSequence:
            extra += [F.lit(f.childSequence), (F.col("pos") + 1).cast("string")]
            drop.append(f.childSequence)
        dropped = _lits(drop)
        children[f.childEntity or ""] = items.select(
            "message_identifier",
            "effective_ts",
            F.lit(None).cast("string").alias("source_system"),
            F.lit(f.childEntity).alias("source_entity"),
            "refresh",
            # Children keep their parent record's number, spaced by position (ordering only).
            (F.col("record_seq") * 10000 + F.col("pos") + 1).cast("int").alias("record_seq"),
            F.map_concat(
                F.map_filter("child", lambda k, _: ~F.array_contains(dropped, k)),  # noqa: B023 (applied at once)
                F.create_map(*extra),
            ).alias("values"),
            F.col("child")[DELETED].alias("deleted_raw"),
            "dt",
        )
    return MappedRecords(records, errors, union_all(refresh_parts, REFRESHES, source.sparkSession), children)


def _resolve_link(
    df: DataFrame,
    name: str,
    f: FieldDef,
    source_keys: list[str],
    target_keys: list[str],
    lookup: DataFrame,
    key_defs: Sequence[FieldDef | None] = (),
) -> DataFrame:
    """Adds the link field to ``fields`` (the linked row's guid) and link errors to ``_errs``.

    All key values null -> the link is null (without a lookup). No live row matches -> status 1
    (requires reprocessing); more than one -> an error. Values compare as canonical text: each source
    value is first converted to its target key's type (``key_defs``; a value that cannot be is an error).
    """
    defs = (list(key_defs) + [None] * len(source_keys))[: len(source_keys)]
    convs = [
        convert_value(F.col("values")[s], d, s) if d is not None else None
        for s, d in zip(source_keys, defs, strict=True)
    ]
    raw = F.array(
        *[c["value"] if c is not None else F.col("values")[s] for s, c in zip(source_keys, convs, strict=True)]
    )
    bad = [
        F.when(c["error"].isNotNull(), _err(MessageStatus.ERROR, F.concat(F.lit(f"link {name}: "), c["error"])))
        for c in convs
        if c is not None
    ]
    present = F.exists(F.array(*[F.map_contains_key("values", s) for s in source_keys]), lambda x: x)
    all_null = F.forall(raw, lambda x: x.isNull())
    matches = (
        lookup.select(F.to_json(F.array(*[F.col("values")[k] for k in target_keys])).alias("_lj"), "guid")
        .groupBy("_lj")
        .agg(F.count("*").alias("_ln"), F.min("guid").alias("_lg"))
    )
    joined = df.withColumn("_lj", F.to_json(raw)).join(matches, "_lj", "left")
    what = F.concat(F.lit(f"link {name}: no live {f.linkEntity} with {target_keys} = "), F.col("_lj"))
    many = F.concat(
        F.lit(f"link {name}: "), F.col("_ln").cast("string"), F.lit(f" {f.linkEntity} rows match "), F.col("_lj")
    )
    err = (
        F.when(~present | all_null, F.lit(None).cast(_ERR))
        .when(F.col("_ln").isNull(), _err(MessageStatus.REQUIRES_REPROCESSING, what))
        .when(F.col("_ln") > 1, _err(MessageStatus.ERROR, many))
    )
    value = F.when(~all_null & (F.col("_ln") == 1), F.col("_lg"))
    return (
        joined.withColumn("_errs", F.concat("_errs", F.array(err, *bad)))
        .withColumn(
            "fields",
            F.when(present, F.map_concat("fields", F.create_map(F.lit(name), value))).otherwise(F.col("fields")),
        )
        .drop("_lj", "_ln", "_lg")
    )


def union_all(frames: Sequence[DataFrame], schema: StructType, spark: SparkSession) -> DataFrame:
    """The frames stacked by column name, projected on ``schema`` (an empty frame of it when none)."""
    if not frames:
        return empty_frame(spark, schema)
    names = schema.fieldNames()
    out = frames[0].select(*names)
    for frame in frames[1:]:
        out = out.unionByName(frame.select(*names))
    return out


def message_refreshes(refreshing: DataFrame, entity_name: str, mapping: EntityMapping) -> DataFrame:
    """REFRESHES of ``entity_name`` for refresh messages mapped to it (scope: the whole entity)."""
    return refreshing.select(
        F.lit(entity_name).alias("entity"),
        F.create_map().cast(RAW_VALUES).alias("scope"),
        "effective_ts",
        "message_identifier",
        F.lit(mapping.priority).cast("int").alias("priority"),
        "dt",
    )


# ---------------------------------------------------------------------------------------------------
# Step 3: refresh deletes


def refresh_deletes(keys: DataFrame, refreshes: DataFrame, records: DataFrame) -> DataFrame:
    """ENTITY_RECORDS (op refresh_delete) for each key a refresh did not contain.

    ``keys``: (entity, guid, key, key_values map, key_fields) of every known key of the entities;
    ``refreshes``: REFRESHES; ``records``: the records (a key that has a record from the refreshing
    message was contained in it). The fold applies these only to rows live at the refresh time.
    """
    r = refreshes.select(
        F.col("entity").alias("_re"),
        "scope",
        "effective_ts",
        "message_identifier",
        "priority",
        "dt",
    )
    candidates = keys.join(F.broadcast(r), F.col("entity") == F.col("_re")).where(
        F.forall(F.map_entries("scope"), lambda e: F.col("key_values")[e["key"]] == e["value"])
    )
    seen = records.select("guid", "message_identifier").distinct()
    generated = candidates.join(seen, ["guid", "message_identifier"], "left_anti")
    return generated.select(
        "entity",
        "guid",
        "key",
        "effective_ts",
        "message_identifier",
        F.lit(0).cast("int").alias("record_seq"),
        F.lit(REFRESH_DELETE).alias("op"),
        "priority",
        F.create_map().cast(RAW_VALUES).alias("fields"),
        F.create_map().cast(MapType(StringType(), IntegerType())).alias("field_priority"),
        "key_fields",
        "dt",
    )


# ---------------------------------------------------------------------------------------------------
# Step 4: the fold


def _map_column(column: pa.Array) -> list[dict]:
    """A map<string, *> Arrow column as one dict per row (a null map: empty), read through its flat
    keys and items: faster than ``to_pylist``, which builds a tuple per entry."""
    keys, items, offsets = column.keys.to_pylist(), column.items.to_pylist(), column.offsets.to_pylist()
    return [dict(zip(keys[a:b], items[a:b], strict=True)) for a, b in itertools.pairwise(offsets)]


def _map_array(rows: list[dict], type_: pa.MapType) -> pa.Array:
    """Dicts as a map Arrow column, built from flat keys and items (``_map_column``'s inverse)."""
    offsets, keys, items = [0], [], []
    for row in rows:
        keys += row.keys()
        items += row.values()
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, type_.key_type), pa.array(items, type_.item_type), type=type_
    )


class _ProvenanceText:
    """``provenance_json`` as compact JSON text (``json.dumps`` with no spaces, byte for byte), each
    field's entry encoded once: a key's versions repeat most entries of the version before."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, tuple[str, int]], str] = {}

    def _entry(self, name: str, entry: tuple[str, int]) -> str:
        key = (name, entry)
        text = self._entries.get(key)
        if text is None:
            if len(self._entries) > 262_144:
                self._entries.clear()
            message, priority = entry
            text = self._entries[key] = f'{json.dumps(name)}:{{"m":{json.dumps(message)},"p":{int(priority)}}}'
        return text

    def __call__(self, provenance: dict[str, tuple[str, int]]) -> str:
        return "{" + ",".join(self._entry(n, provenance[n]) for n in provenance_names(provenance)) + "}"


def _fold_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: rows sorted by (guid, effective order) within the partition -> versions.

    A row with op ``START`` (``fold_starts``) is a key's latest version, which the fold goes on from.
    Columns are read and written whole (not row by row), and times stay integers (microseconds):
    the fold only compares them."""
    out: dict[str, list] = {f.name: [] for f in _ARROW_VERSIONS}
    provenance_text = _ProvenanceText()
    group: list[Record] = []
    start: Version | None = None
    where: tuple[str, str, int] | None = None  # the key's (guid, entity, bucket)

    def flush() -> None:
        assert where is not None
        _, entity, bucket = where
        for v in fold_key(group, start):
            out["entity"].append(entity)
            out["guid"].append(v.guid)
            out["valid_from"].append(v.valid_from)
            out["valid_to"].append(v.valid_to)
            out["deleted"].append(v.deleted)
            out["fields"].append(v.fields)
            out["provenance"].append(provenance_text(v.provenance))
            out["source_message"].append(v.source_message)
            out["bucket"].append(bucket)

    def emit() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [
                _map_array(out[f.name], f.type) if f.name == "fields" else pa.array(out[f.name], type=f.type)
                for f in _ARROW_VERSIONS
            ],
            schema=_ARROW_VERSIONS,
        )
        for column in out.values():
            column.clear()
        return batch

    for batch in batches:
        col = batch.column
        guids, entities, buckets = col("guid").to_pylist(), col("entity").to_pylist(), col("bucket").to_pylist()
        effective = col("effective_ts").cast(_MICROS).cast(pa.int64()).to_pylist()
        messages, seqs = col("message_identifier").to_pylist(), col("record_seq").to_pylist()
        ops = col("op").to_pylist()
        priorities, key_fields = col("priority").to_pylist(), col("key_fields").to_pylist()
        fields, field_priority = _map_column(col("fields")), _map_column(col("field_priority"))
        starts = col("start_provenance")
        start_provenance = starts.to_pylist() if starts.null_count < len(starts) else None
        start_deleted = col("start_deleted").to_pylist() if start_provenance is not None else None
        for i, guid in enumerate(guids):
            if where is not None and guid != where[0]:
                flush()
                group, start = [], None
                if len(out["guid"]) >= 4096:
                    yield emit()
            where = (guid, entities[i], buckets[i])
            if ops[i] == START:
                assert start_provenance is not None and start_deleted is not None
                provenance = provenance_from_json(start_provenance[i])
                start = Version(
                    guid=guid,
                    valid_from=effective[i],
                    valid_to=None,
                    deleted=bool(start_deleted[i]),
                    fields={n: fields[i].get(n) for n in sorted(provenance) if n != GUID_FIELD},
                    provenance=provenance,
                    source_message=messages[i],
                )
                continue
            group.append(
                Record(
                    guid=guid,
                    effective=effective[i],
                    message=messages[i],
                    seq=seqs[i],
                    op=ops[i],
                    priority=priorities[i],
                    fields=fields[i],
                    field_priority=field_priority[i],
                    key_fields=key_fields[i] or (),
                )
            )
    if where is not None:
        flush()
    if out["guid"]:
        yield emit()


_MICROS = pa.timestamp("us", tz="UTC")
_ARROW_VERSIONS = pa.schema(
    [
        pa.field("entity", pa.string(), False),
        pa.field("guid", pa.string(), False),
        pa.field("valid_from", _MICROS, False),
        pa.field("valid_to", _MICROS),
        pa.field("deleted", pa.bool_(), False),
        pa.field("fields", pa.map_(pa.string(), pa.string())),
        pa.field("provenance", pa.string(), False),
        pa.field("source_message", pa.string(), False),
        pa.field("bucket", pa.int32(), False),
    ]
)


def fold_versions(records: DataFrame, starts: DataFrame | None = None) -> DataFrame:
    """VERSIONS, one row per version of each key, from ENTITY_RECORDS (all records of those keys).

    ``starts`` (FOLD_INPUT rows of ``fold_starts``): for some keys, their latest version, when the
    records given for them are only those after every record it was folded from; the fold goes on
    from it and gives that version again (closed if a record changes it), then the new ones.

    Rows are clustered by guid and sorted within each partition so one Python pass folds every key
    (no per-group overhead); the fold itself is ``ngsi_assets.ngsi.versioning``.
    """
    rows = (
        records.select(*ENTITY_RECORDS.fieldNames())
        .where(F.col("op") != SEEN)
        .withColumn("start_provenance", F.lit(None).cast("string"))
        .withColumn("start_deleted", F.lit(None).cast("boolean"))
    )
    if starts is not None:
        rows = rows.unionByName(starts.select(*FOLD_INPUT.fieldNames()))
    # A start sorts first in its key: every record given with it comes later.
    # Each key whole in one partition: a plain repartition("guid") can be lost (see ``cluster_by``).
    ordered = cluster_by(rows, "guid").sortWithinPartitions(
        "entity", "guid", "effective_ts", "message_identifier", "record_seq", "op"
    )
    return with_known_columns(ordered, FOLD_INPUT).mapInArrow(_fold_batches, VERSIONS)


# The fold's input: records, and (op START) the latest versions some keys are folded on from.
START = "start"
FOLD_INPUT = StructType(
    [
        *ENTITY_RECORDS.fields,
        StructField("start_provenance", StringType()),
        StructField("start_deleted", BooleanType()),
    ]
)


# The lake keeps each bucket's open rows (valid_to null: one per key) in files of their own, named so:
# what reads only the keys' current state (a batch going on from it, the transaction history) reads
# those files, not the bucket's history.
OPEN_PREFIX = "open-"

# Per key of a bucket, the effective time of its latest stored record that is folded (not ``seen``):
# what a batch compares its new records with (``keys_after_their_marks``), kept beside the records so
# that the comparison costs the bucket's keys, not their history.
LAST_RECORD_TS = "last_record_ts"
RECORD_MARKS = StructType(
    [
        StructField("guid", StringType(), False),
        StructField(LAST_RECORD_TS, TimestampType(), False),
        StructField("bucket", IntegerType(), False),
    ]
)


def record_marks(records: DataFrame) -> DataFrame:
    """RECORD_MARKS of ENTITY_RECORDS rows: per (guid, bucket), the latest ``effective_ts`` of its
    folded records; a key with ``seen`` records only has none."""
    return (
        records.where(F.col("op") != SEEN)
        .groupBy("guid", F.col("bucket").cast("int").alias("bucket"))
        .agg(F.max("effective_ts").alias(LAST_RECORD_TS))
        .select(*RECORD_MARKS.fieldNames())
    )


def merged_marks(frames: Sequence[DataFrame]) -> DataFrame:
    """RECORD_MARKS frames as one: per (guid, bucket), the latest of their times."""
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    return (
        rows.groupBy("guid", "bucket")
        .agg(F.max(LAST_RECORD_TS).alias(LAST_RECORD_TS))
        .select(*RECORD_MARKS.fieldNames())
    )


def keys_after_their_marks(marks: DataFrame, new: DataFrame, table: DataFrame) -> DataFrame:
    """(guid) of the keys whose ``new`` records (ENTITY_RECORDS) all come after their stored records'
    latest time in ``marks`` (``record_marks`` of the stored records, or later) and after the start of
    their open row in ``table`` (the typed table); keys with no mark are not among them.

    Such a key's fold goes on from its latest version (``fold_starts``) with only its new records,
    and gives what a fold of all its records gives. The test is against the stored *records*, not
    only the latest version's start: a stored record that changed nothing can change something once
    an earlier record arrives. A mark later than the records (written by a run killed before its
    records were) only keeps a key from going on top. The open row counts too: a run killed between
    its two writes leaves the table ahead of the records, with versions of some of the records given
    again as new.
    """
    folded = F.col("op") != SEEN
    times = marks.select("guid", F.col(LAST_RECORD_TS).alias("effective_ts"), F.lit(True).alias("_stored"))
    open_starts = table.where(F.col(VALID_TO).isNull()).select(
        F.col(GUID).alias("guid"), F.col(VALID_FROM).alias("effective_ts"), F.lit(False).alias("_stored")
    )
    last = (
        times.unionByName(open_starts)
        .groupBy("guid")
        .agg(F.max("effective_ts").alias("_last"), F.max("_stored").alias("_stored"))
        .where(F.col("_stored"))
    )
    first = new.where(folded).groupBy("guid").agg(F.min("effective_ts").alias("_first"))
    return first.join(last, "guid").where(F.col("_first") > F.col("_last")).select("guid")


def keys_never_stored(marks: DataFrame, new: DataFrame, table: DataFrame) -> DataFrame:
    """(guid) of the keys with records to fold in ``new`` (ENTITY_RECORDS) but no mark in ``marks``
    (``record_marks`` of every stored record) and no open row in ``table`` (the typed table): no
    record of theirs was ever stored, so a fold of their new records alone is the fold of all their
    records, and their versions can be added to their buckets (a new car in continuous traffic). A
    run killed after its marks leaves its keys marked, so they are not among them when it is redone.
    """
    stored = marks.select("guid").unionByName(table.where(F.col(VALID_TO).isNull()).select(F.col(GUID).alias("guid")))
    return new.where(F.col("op") != SEEN).select("guid").distinct().join(stored, "guid", "left_anti")


def fold_starts(table: DataFrame, entity: str, fields: Sequence[str]) -> DataFrame:
    """FOLD_INPUT rows (op START) of the open rows of a typed table of text fields (a default NGSI
    entity's): each key's latest version, for ``fold_versions`` to go on from."""
    values = F.map_from_arrays(
        F.array(*[F.lit(n) for n in fields]).cast("array<string>"),
        F.array(*[F.col(n).cast("string") for n in fields]).cast("array<string>"),
    )
    return table.where(F.col(VALID_TO).isNull()).select(
        F.lit(entity).alias("entity"),
        F.col(GUID).alias("guid"),
        F.col(GUID).alias("key"),
        F.col(VALID_FROM).alias("effective_ts"),
        F.col(SOURCE_MESSAGE).alias("message_identifier"),
        F.lit(0).alias("record_seq"),
        F.lit(START).alias("op"),
        F.lit(0).alias("priority"),
        values.cast(RAW_VALUES).alias("fields"),
        F.lit(None).cast(MapType(StringType(), IntegerType())).alias("field_priority"),
        F.lit(None).cast(ArrayType(StringType())).alias("key_fields"),
        F.lit("").alias("dt"),
        F.col("bucket").cast("int").alias("bucket"),
        F.col(FIELD_PROVENANCE).alias("start_provenance"),
        F.col(DELETED).alias("start_deleted"),
    )


def with_known_columns(df: DataFrame, schema: StructType) -> DataFrame:
    """``df``, telling a Spark Connect client that its columns are ``schema``'s (same names, same order).

    Through Spark Connect, ``mapInArrow`` asks the server for its input's columns before building the
    plan: an analysis of the whole input, file listings included (measured 0.8 s per fold over 64
    buckets of two datasets, against a few milliseconds of actual planning). Only the names are used,
    so the caller must have just selected exactly ``schema``'s columns. A classic (in-process) frame
    knows its schema already and is returned as it is.
    """
    if getattr(df, "_cached_schema", False) is None:  # pyspark.sql.connect.dataframe.DataFrame
        df._cached_schema = schema
    return df


# ---------------------------------------------------------------------------------------------------
# Step 5: typed tables


def canonical_text(column: Column, f: FieldDef) -> Column:
    """A typed column back to the canonical text the conversions produce (for key and link matching)."""
    if f.type == "timestamp":
        return F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
    if f.type == "boolean":
        return F.when(column, F.lit("true")).when(~column, F.lit("false"))
    return column.cast("string")


def typed_versions(versions: DataFrame, fields: dict[str, FieldDef | None]) -> DataFrame:
    """The target table's columns from VERSIONS: guid, valid_from_timestamp, valid_to_timestamp,
    deleted_indicator, one typed column per field (``None``: text), source_message, field_provenance.

    Also keeps ``bucket``, the storage bucket of the row.
    """
    business = [
        (typed_column(F.col("fields")[n], f) if f is not None else F.col("fields")[n]).alias(n)
        for n, f in fields.items()
    ]
    return versions.select(
        F.col("guid").alias(GUID),
        F.col("valid_from").alias(VALID_FROM),
        F.col("valid_to").alias(VALID_TO),
        F.col("deleted").alias(DELETED),
        *business,
        F.col("source_message").alias(SOURCE_MESSAGE),
        F.col("provenance").alias(FIELD_PROVENANCE),
        "bucket",
    )


def invariant_rows(table: DataFrame, entity_name: str, fields: Sequence[str]) -> DataFrame:
    """(entity, guid, gap, open, missing) per row of a typed table, for ``invariant_counts``.

    ``gap``: the row's valid_to is not the next version's valid_from (or the row is open while a
    later version exists); ``open``: the row is open; ``missing``: a populated business field has no
    field_provenance entry.
    """
    from pyspark.sql import Window

    by_key = Window.partitionBy(GUID).orderBy(VALID_FROM)
    prov = F.from_json(F.col(FIELD_PROVENANCE), "map<string,string>")
    missing = [F.when(F.col(n).isNotNull() & ~F.map_contains_key(prov, n), 1).otherwise(0) for n in fields]
    return table.select(
        F.lit(entity_name).alias("entity"),
        F.col(GUID).alias("guid"),
        (F.lead(VALID_FROM).over(by_key).eqNullSafe(F.col(VALID_TO)) == F.lit(False)).cast("int").alias("gap"),
        F.col(VALID_TO).isNull().cast("int").alias("open"),
        (sum(missing, F.lit(0)) > 0).cast("int").alias("missing"),
    )


INVARIANTS = ("rows_in_rewritten_buckets", "overlapping", "open_rows_not_one", "missing_provenance")


def invariants_per_entity(frames: Sequence[DataFrame]) -> DataFrame:
    """(entity, *INVARIANTS): a few rows of counts from ``invariant_rows`` frames of several entities."""
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    per_key = rows.groupBy("entity", "guid").agg(
        F.count("*").alias("n"), F.sum("gap").alias("gaps"), F.sum("open").alias("open"), F.sum("missing").alias("m")
    )
    return per_key.groupBy("entity").agg(
        F.sum("n").alias(INVARIANTS[0]),
        F.sum("gaps").alias(INVARIANTS[1]),
        F.sum((F.col("open") != 1).cast("int")).alias(INVARIANTS[2]),
        F.sum("m").alias(INVARIANTS[3]),
    )


def invariant_counts(frames: Sequence[DataFrame]) -> dict[str, dict[str, int]]:
    """Per entity, its rows and the rows (keys, for the open row) breaking each invariant; one job.

    ``frames`` are ``invariant_rows`` of several entities; the answer is a few numbers per entity.
    """
    return invariant_values(invariants_per_entity(frames).collect())


def invariant_values(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    """``invariants_per_entity`` rows, fetched, as {entity: {invariant: count}}."""
    return {r["entity"]: {k: int(r[k] or 0) for k in INVARIANTS} for r in rows}


def live_rows(table: DataFrame, fields: dict[str, FieldDef | None]) -> DataFrame:
    """(guid, values) of the open, not deleted rows of a typed table; values as canonical text."""
    values = F.create_map(
        *[
            x
            for n, f in fields.items()
            for x in (F.lit(n), canonical_text(F.col(n), f) if f is not None else F.col(n).cast("string"))
        ]
    )
    return table.where(F.col(VALID_TO).isNull() & ~F.col(DELETED)).select(
        F.col(GUID).alias("guid"), values.alias("values")
    )


def table_keys(
    table: DataFrame, entity_name: str, fields: dict[str, FieldDef | None], key_fields: Sequence[str]
) -> DataFrame:
    """(entity, guid, key, key_values, key_fields): the distinct keys of a typed table."""
    kv = [canonical_text(F.col(k), fields[k]) if fields.get(k) is not None else F.col(k) for k in key_fields]
    return table.select(
        F.lit(entity_name).alias("entity"),
        F.col(GUID).alias("guid"),
        F.to_json(F.array(*kv)).alias("key"),
        F.create_map(*[x for k, c in zip(key_fields, kv, strict=True) for x in (F.lit(k), c)]).alias("key_values"),
        _lits(key_fields).alias("key_fields"),
    ).dropDuplicates(["guid"])


def record_keys(records: DataFrame) -> DataFrame:
    """(entity, guid, key, key_values, key_fields) of the keys in ENTITY_RECORDS."""
    return records.select(
        "entity",
        "guid",
        "key",
        F.map_filter("fields", lambda k, _: F.array_contains(F.col("key_fields"), k)).alias("key_values"),
        "key_fields",
    ).dropDuplicates(["guid"])


def record_stats(records: DataFrame, bucket: str = "bucket") -> DataFrame:
    """(entity, bucket, records, keys, field_names) of bucketed ENTITY_RECORDS: per entity and bucket,
    how many records (not SEEN markers) there are, how many keys (guids, SEEN markers' too) and every
    field name they carry (sorted).

    Its size follows the entities and buckets, not the records: one small collect tells a run which
    buckets each entity touches and which columns its table needs.
    """
    return records.groupBy("entity", bucket).agg(
        F.sum((F.col("op") != SEEN).cast("int")).cast("int").alias("records"),
        F.count_distinct("guid").cast("int").alias("keys"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_set(F.map_keys("fields"))))).alias("field_names"),
    )


def message_log(messages: DataFrame, records: DataFrame, errors: DataFrame) -> DataFrame:
    """MESSAGE_LOG: per processed message, status 4 if a record failed, 1 if one awaits a link, else 3."""
    counts = records.groupBy("message_identifier").agg(F.count("*").cast("int").alias("records"))
    worst = errors.groupBy("message_identifier").agg(
        F.max(F.when(F.col("status") == int(MessageStatus.ERROR), 2).otherwise(1)).alias("_w"),
        _bounded(F.array_join(F.sort_array(F.collect_list("error_text")), " | ")).alias("error_text"),
    )
    return (
        messages.select("message_identifier", "dt")
        .join(counts, "message_identifier", "left")
        .join(worst, "message_identifier", "left")
        .select(
            "message_identifier",
            F.when(F.col("_w") == 2, F.lit(int(MessageStatus.ERROR)))
            .when(F.col("_w") == 1, F.lit(int(MessageStatus.REQUIRES_REPROCESSING)))
            .otherwise(F.lit(int(MessageStatus.PROCESSED)))
            .cast("int")
            .alias("status"),
            "error_text",
            F.coalesce("records", F.lit(0)).cast("int").alias("records"),
            "dt",
        )
    )
