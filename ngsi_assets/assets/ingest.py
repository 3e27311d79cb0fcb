"""The message store and the NGSI events: thin shells around the pure transforms."""

from collections.abc import Sequence

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.freshness import received_metadata, record_increment, record_whole_hours, run_received
from ngsi_assets.increments import (
    EXTENDS_TAG,
    POSITIONS_FILE,
    Increment,
    Positions,
    advanced,
    claim_file,
    claim_text,
    extended,
    parse_claim,
    parse_positions,
    positions_text,
    reach,
    segment_hour,
    unread_ranges,
)
from ngsi_assets.ngsi.constants import MessageStatus
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.transforms.instants import time_instant_fallback
from ngsi_assets.transforms.message_store import (
    build_message_store,
    duplicate_guids,
    guid_heads,
    head_scan,
    head_totals,
)
from ngsi_assets.transforms.ngsi_events import ngsi_event_rejects, ngsi_messages, to_ngsi_events
from ngsi_assets.transforms.plans import first_rows
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENT_REJECTS, NGSI_EVENTS
from resources.frames import empty_frame
from resources.lake import PARTITION_COLUMN, FolderWrite, LakeResource, key_to_dt
from resources.landing import LandingZoneResource
from resources.spark import collect_small, computed_once, row_count

GROUP = "ingest"
PREVIEW_ROWS = 10
# Up to this many duplicate ids (about 40 bytes each) are broadcast to the tasks that write the message
# store, rather than joined by shuffling every message body (see ``_stored_rows``).
MAX_BROADCAST_DUPLICATES = 1_000_000


def _preview_rows(df: DataFrame, columns: Sequence[str]) -> DataFrame:
    """A few rows for the asset's preview (bounded: never grows with the data), the first in the order
    of ``columns``."""
    return first_rows(df.select(*columns), PREVIEW_ROWS, *columns)


def _preview(rows: Sequence[Row], columns: Sequence[str]) -> MetadataValue:
    """A small markdown table of the preview's rows."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(str(r[c]).replace("|", "\\|")[:60] for c in columns) + " |\n" for r in rows)
    return MetadataValue.md(head + body)


def _breakdown(counts: Sequence[Row], *columns: str) -> dict[str, dict[str, int]]:
    """Row counts per value of each low-cardinality column, from ``df.groupBy(*columns).count()``'s rows.

    The grouped result has one row per combination of values, small by construction.
    """
    out: dict[str, dict[str, int]] = {c: {} for c in columns}
    for row in counts:
        for c in columns:
            key = str(row[c])
            out[c][key] = out[c].get(key, 0) + int(row["count"])
    return out


def _scan_heads(lines: DataFrame) -> tuple[int, DataFrame | None]:
    """How many landing lines, and the heads of those that carry a guid (kept; None when none does, as
    for most notifications): one pass over the lines, one job for the totals."""
    (scan,) = computed_once(head_scan(lines))
    totals = collect_small(t=head_totals(scan))["t"][0]
    return int(totals["n"]), guid_heads(scan) if totals["guids"] else None


def _stored_rows(lines: DataFrame, earlier_guids: DataFrame, heads: DataFrame | None) -> DataFrame:
    """The message store rows of ``lines``, duplicates marked (``heads``: ``_scan_heads``'s).

    Without guids there is nothing to mark. Otherwise the duplicates are found first, from the kept
    heads alone, and kept: a run's duplicates are few, so they are broadcast to the tasks writing the
    rows (a join would shuffle every message body, the largest part of the store, to mark a few).
    """
    if heads is None:
        return build_message_store(lines)
    (duplicates,) = computed_once(duplicate_guids(heads, earlier_guids))
    found = int(collect_small(n=row_count(duplicates))["n"][0]["n"])
    return build_message_store(lines, duplicates, broadcast_duplicates=found <= MAX_BROADCAST_DUPLICATES)


def _store_hours(
    session: SparkSession, lake: LakeResource, landing: LandingZoneResource, keys: Sequence[str]
) -> tuple[DataFrame, int, int, bool]:
    """Recompute whole hours: every complete landing line of them, with their read positions.

    Returns the stored rows, the lines read, the torn tails seen and whether guids were checked.
    """
    ranges = landing.complete_ranges(keys)
    lines = landing.read_ranges(session, ranges)
    line_count, heads = _scan_heads(lines)
    has_guids = heads is not None
    # Guids are deduplicated against every earlier hour; hours whose lines carry none (most
    # notifications) skip that read, so their cost does not grow with the history's age.
    if has_guids:
        first_dt = min(key_to_dt(k) for k in keys)
        earlier = lake.read(session, "message_store", MESSAGE_STORE).where(F.col(PARTITION_COLUMN) < first_dt)
        earlier_guids = earlier.where(F.col("guid").isNotNull()).select("guid")
    else:
        earlier_guids = empty_frame(session, "guid string")
    positions = {k: {n: [(0, r[1])] for n, r in ranges.items() if segment_hour(n) == k} for k in keys}
    lake.replace_partitions(
        _stored_rows(lines, earlier_guids, heads),
        "message_store",
        keys,
        no_dictionary=["data"],
        hour_files={k: {POSITIONS_FILE: positions_text(p)} for k, p in positions.items()},
        # Each landing piece a task reads is of one segment, hence one hour: no shuffle of the bodies.
        clustered=True,
    )
    stored = lake.read(session, "message_store", MESSAGE_STORE, keys)
    return stored, line_count, landing.torn_tails(keys), has_guids


def _claim(
    lake: LakeResource, landing: LandingZoneResource, key: str, inc: Increment, positions: Positions
) -> list[tuple[str, int, int]]:
    """What an extending increment takes: its ranges, grown by what landed in the hour since it was
    asked for, less what is stored. Written once, before any row, so a rerun takes exactly the same
    (a rerun that grew again could replace the increment's stored rows with only the newest lines).

    An earlier increment killed after its rows were in but before its positions were written may
    have taken some of the same lines: its retry then stores only what is still unread, so a line is
    stored twice only until that retry (or the hour's repair) runs.
    """
    name = claim_file(inc.id)
    text = lake.read_hour_file("message_store", key, name)
    if text is not None:
        return parse_claim(text)
    claim = unread_ranges(extended(inc.ranges, landing.complete_ranges([key], reach(positions, inc.ranges))), positions)
    lake.write_hour_file("message_store", key, name, claim_text(claim))
    return claim


def _store_increment(
    session: SparkSession, lake: LakeResource, landing: LandingZoneResource, key: str, inc: Increment, extends: bool
) -> tuple[DataFrame, int | None, bool, list[tuple[str, int, int]]]:
    """Add the increment's lines not yet stored to the hour; the increment's rows, lines read, guids,
    and the ranges it took (``extends``: grown to what landed since it was asked for, see ``_claim``).

    Lines read None: everything was stored before (a rerun, or a whole-hour run came first).
    """
    text = lake.read_hour_file("message_store", key, POSITIONS_FILE)
    if text is None and lake.whole_hour_files("message_store", key):
        raise ValueError(
            f"message_store {key} holds rows but no record of the landing ranges they came from (written by an "
            "earlier version): run ngsi_ingest_job for this hour once, then its increments can follow"
        )
    positions = parse_positions(text)
    taken = _claim(lake, landing, key, inc, positions) if extends else [(n, s, e) for n, (s, e) in inc.ranges.items()]
    todo = [t for n, s, e in taken for t in unread_ranges({n: (s, e)}, positions)]
    line_count: int | None = None
    has_guids = False
    if todo:
        lake.delete_increment("message_store", key, inc.id)
        lines = landing.read_ranges(session, todo).persist()
        line_count, heads = _scan_heads(lines)
        has_guids = heads is not None
        # Guids are deduplicated against every message stored before; skipped when the increment
        # has none, so a run does not read the whole history's guids for nothing.
        earlier = lake.read(session, "message_store", MESSAGE_STORE).where(F.col(PARTITION_COLUMN) <= key_to_dt(key))
        earlier_guids = earlier.select("guid") if has_guids else empty_frame(session, "guid string")
        lake.append_increment(
            _stored_rows(lines, earlier_guids, heads), "message_store", key, inc.id, no_dictionary=["data"]
        )
        lake.write_hour_file("message_store", key, POSITIONS_FILE, positions_text(advanced(positions, todo)))
        lines.unpersist()
    stored = lake.read_increment(session, "message_store", MESSAGE_STORE, key, inc.id)
    return stored, line_count, has_guids, taken


@asset(
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "parquet"},
    check_specs=[
        AssetCheckSpec("every_landed_line_stored", asset="message_store"),
        AssetCheckSpec("message_identifiers_unique", asset="message_store"),
        AssetCheckSpec("guids_processed_once", asset="message_store"),
    ],
)
def message_store(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    landing: LandingZoneResource,
) -> MaterializeResult:
    """One row per acknowledged message, keyed by message_identifier (seed 004 message store).

    Read from the landing zone for the hours of the run. A message whose guid was received before
    gets status 5 (previously received) and is not processed further.
    """
    keys = context.partition_keys
    session = spark.spark_session
    inc = Increment.from_tags(context.run.tags)
    taken: list[tuple[str, int, int]] = []
    if inc is None:
        stored, line_count, torn, has_guids = _store_hours(session, lake, landing, keys)
    else:
        extends = bool(context.run.tags.get(EXTENDS_TAG))
        stored, line_count, has_guids, taken = _store_increment(session, lake, landing, inc.hour_of(keys), inc, extends)
        torn = 0  # an increment ends at a line boundary: a torn tail is never in it
    preview_columns = ["message_identifier", "source_entity", "effective_timestamp", "status", "service", "format"]
    summary_frames = {
        "counts": stored.groupBy("status", "format").count(),
        # The newest receive time of each hour's rows (freshness.py): everything received before is in.
        "received": stored.groupBy(PARTITION_COLUMN).agg(F.max("recv_ms").alias("ms")),
        "ids": row_count(stored.select("message_identifier").distinct()),
        "preview": _preview_rows(stored, preview_columns),
    }
    if has_guids:
        # A guid may be processed (status other than 5) in one message only, across every hour: hours
        # materialized out of order (a later hour before an earlier one) would break that.
        summary_frames["twice"] = first_rows(
            lake.read(session, "message_store", MESSAGE_STORE)
            .where(F.col("guid").isNotNull() & (F.col("status") != int(MessageStatus.PREVIOUSLY_RECEIVED)))
            .groupBy("guid")
            .agg(F.count("*").alias("n"), F.sort_array(F.collect_set(PARTITION_COLUMN)).alias("hours"))
            .where(F.col("n") > 1)
            .join(stored.select("guid").distinct(), "guid", "left_semi"),
            5,
            "guid",
        )
    # Metadata and checks in one Spark job: each collect of its own costs a round trip and a planning.
    summary = collect_small(**summary_frames)
    counts = _breakdown(summary["counts"], "status", "format")
    rows = sum(counts["status"].values())
    if line_count is None:  # the increment's rows were stored by an earlier attempt of this run
        line_count = rows
    unreadable = line_count - rows
    distinct_ids = summary["ids"][0]["n"]
    twice_examples = [(r["guid"], r["hours"]) for r in summary.get("twice", [])]
    newest = {r[PARTITION_COLUMN]: int(r["ms"]) for r in summary["received"] if r["ms"] is not None}
    received_ms = max(newest.values(), default=None)
    if inc is None:
        record_whole_hours(lake, {k: newest.get(key_to_dt(k)) for k in keys})
    else:
        record_increment(lake, inc.hour_of(keys), inc.id, received_ms)
    return MaterializeResult(
        metadata={
            "dagster/row_count": rows,
            "landing_lines": line_count,
            "unreadable_lines": unreadable,
            "torn_tails": torn,
            **received_metadata(received_ms),
            **(
                {
                    "increment": inc.id,
                    "increment_ranges": MetadataValue.json(inc.ranges),
                    "increment_ranges_taken": MetadataValue.json([list(t) for t in taken]),
                }
                if inc
                else {}
            ),
            "by_status": MetadataValue.json(counts["status"]),
            "by_format": MetadataValue.json(counts["format"]),
            "preview": _preview(summary["preview"], preview_columns),
        },
        check_results=[
            AssetCheckResult(
                check_name="every_landed_line_stored",
                passed=unreadable == 0,
                description="Every complete landing line read is a message store row (torn tails, writes a "
                "crash cut short and never acknowledged, are not lines and are never read).",
                metadata={"landing_lines": line_count, "stored": rows, "torn_tails": torn},
            ),
            AssetCheckResult(
                check_name="guids_processed_once",
                passed=not twice_examples,
                description="No guid is processed in two messages; if hours were materialized out of "
                "order, rematerialize the later hours listed.",
                metadata={"examples": MetadataValue.json([{"guid": g, "hours": h} for g, h in twice_examples])},
            ),
            AssetCheckResult(
                check_name="message_identifiers_unique",
                passed=distinct_ids == rows,
                severity=AssetCheckSeverity.ERROR,
                metadata={"rows": rows, "distinct_message_identifiers": distinct_ids},
            ),
        ],
    )


@asset(
    deps=[message_store],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "parquet"},
    check_specs=[
        AssetCheckSpec("every_message_accounted_for", asset="ngsi_events"),
        AssetCheckSpec("keys_and_time_index_present", asset="ngsi_events"),
    ],
)
def ngsi_events(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
) -> MaterializeResult:
    """One row per entity attribute update, keyed by (messageId, entityIndex, attrName, datasetId).

    Cygnus/Draco NGSIEvent columns (recvTimeTs in ms, recvTime, fiwareService, fiwareServicePath,
    entityId, entityType, attrName, attrType, attrValue, attrMd) plus the QuantumLeap time index,
    alterationType and the message identifier. NGSI messages, or entities, that yield no event are
    written to `ngsi_event_rejects` with the reason.
    """
    keys = context.partition_keys
    session = spark.spark_session
    inc = Increment.from_tags(context.run.tags)
    if inc is None:
        # The message store's increments these hours' events now cover (the whole-hour write drops the
        # increments' own marks): the derived runs' versioning must still count them done.
        covered = {k: lake.increment_ids("message_store", k) for k in keys}
        messages = lake.read(session, "message_store", MESSAGE_STORE, keys)
        lake.replace_together(
            [
                # Read from the message store's hour files: a task's rows are of one hour (or of a few
                # small files packed together), so they are not shuffled to gather each hour.
                FolderWrite.hours(to_ngsi_events(messages), "ngsi_events", keys, clustered=True),
                FolderWrite.hours(ngsi_event_rejects(messages), "ngsi_event_rejects", keys, clustered=True),
            ]
        )
        for k, ids in covered.items():
            lake.mark_increments_covered("ngsi_events", k, ids)
        events = lake.read(session, "ngsi_events", NGSI_EVENTS, keys)
        rejects = lake.read(session, "ngsi_event_rejects", NGSI_EVENT_REJECTS, keys)
    else:
        key = inc.hour_of(keys)
        messages = lake.read_increment(session, "message_store", MESSAGE_STORE, key, inc.id)
        lake.append_increment(to_ngsi_events(messages), "ngsi_events", key, inc.id)
        new_rejects = ngsi_event_rejects(messages)
        lake.append_increment(new_rejects, "ngsi_event_rejects", key, inc.id, empty=new_rejects.isEmpty())
        # The derived runs fold only the increments whose events are all in (even when there are none).
        lake.mark_increment_done("ngsi_events", key, inc.id)
        events = lake.read_increment(session, "ngsi_events", NGSI_EVENTS, key, inc.id)
        rejects = lake.read_increment(session, "ngsi_event_rejects", NGSI_EVENT_REJECTS, key, inc.id)
    null_key = F.col("entityId").isNull() | F.col("attrName").isNull() | F.col("timeIndex").isNull()
    accounted = events.select("messageId").union(rejects.select("messageId")).distinct()
    unaccounted = (
        ngsi_messages(messages)
        .select(F.col("message_identifier").alias("messageId"))
        .join(accounted, "messageId", "left_anti")
    )
    preview_columns = ["recvTime", "fiwareService", "entityId", "entityType", "attrName", "attrValue", "timeIndex"]
    # Metadata and checks in one Spark job: each collect of its own costs a round trip and a planning.
    summary = collect_small(
        counts=events.withColumn("_null_keys", null_key.cast("int"))
        .withColumn("_md_fallback", time_instant_fallback().cast("int"))
        .groupBy("timeIndexSource", "fiwareService", "_null_keys", "_md_fallback")
        .count(),
        rejects=row_count(rejects),
        unaccounted=row_count(unaccounted),
        examples=first_rows(unaccounted, 5, "messageId"),
        preview=_preview_rows(events, preview_columns),
    )
    counts = _breakdown(summary["counts"], "timeIndexSource", "fiwareService", "_null_keys", "_md_fallback")
    rows = sum(counts["timeIndexSource"].values())
    null_keys = counts["_null_keys"].get("1", 0)
    reject_rows = summary["rejects"][0]["n"]
    missing = summary["unaccounted"][0]["n"]
    return MaterializeResult(
        metadata={
            "dagster/row_count": rows,
            "rejects": reject_rows,
            **received_metadata(run_received(lake, keys, context.run.tags)),
            "by_time_index_source": MetadataValue.json(counts["timeIndexSource"]),
            "by_service": MetadataValue.json(counts["fiwareService"]),
            # Events whose TimeInstant metadata is not an instant: kept as given, timed by receive time.
            "time_instant_fallbacks": counts["_md_fallback"].get("1", 0),
            "preview": _preview(summary["preview"], preview_columns),
        },
        check_results=[
            AssetCheckResult(
                check_name="every_message_accounted_for",
                passed=missing == 0,
                description="Every NGSI message with status 0 has events or a reject row with its reason.",
                metadata={
                    "unaccounted_messages": missing,
                    "examples": MetadataValue.json([r["messageId"] for r in summary["examples"]]),
                },
            ),
            AssetCheckResult(
                check_name="keys_and_time_index_present",
                passed=null_keys == 0,
                metadata={"rows_with_null_entityId_attrName_or_timeIndex": null_keys},
            ),
        ],
    )


def events_of_run(
    context: AssetExecutionContext, lake: LakeResource, session: SparkSession
) -> tuple[DataFrame, Increment | None]:
    """The ``ngsi_events`` a sink run reads: its increment's rows (run tag ``ngsi/increment``), else its hours'."""
    inc = Increment.from_tags(context.run.tags)
    if inc is None:
        return lake.read(session, "ngsi_events", NGSI_EVENTS, context.partition_keys), None
    hour = inc.hour_of(context.partition_keys)
    return lake.read_increment(session, "ngsi_events", NGSI_EVENTS, hour, inc.id), inc
