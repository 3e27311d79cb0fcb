"""STH aggregates: per-hour partial aggregates in the lake, whole STH-Comet documents in MongoDB."""

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

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
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.assets.ingest import ngsi_events
from ngsi_assets.freshness import hours_received, received_metadata
from ngsi_assets.increments import FoldPlan, folds_new_increments
from ngsi_assets.ngsi.sth_config import Resolution, STHConfig
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.sinks.mongo_bulk import existing_collections
from ngsi_assets.sinks.sth_mongo import (
    add_point_updates,
    ensure_aggregate_indexes,
    expire_documents,
    forget_hours,
    publish_documents,
    settle_rebuilt,
    stale_collections,
)
from ngsi_assets.transforms.plans import first_rows
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from ngsi_assets.transforms.sth import (
    ACTION_REBUILD,
    ACTION_REJECT,
    ACTION_UPDATE,
    DOC_COLUMNS,
    ID_COLUMNS,
    REASON_DELETE,
    ROLLUP_ORDER,
    SLOT_COLUMNS,
    STATUS_REJECTED,
    STATUS_SAMPLE,
    STATUS_SKIPPED,
    STH_PARTIALS,
    STH_REJECTS,
    STH_ROLLUPS,
    bucket_of,
    build_documents,
    classify_events,
    compact_rollups,
    day_hour_mismatches,
    documents_of,
    narrowing_filter,
    narrowing_values,
    point_updates,
    receive_parts,
    rollup_rows,
    sth_name_lookup,
    sth_partials,
    sth_rejects,
    unaccounted_points,
    unaccounted_samples,
    with_tombstones,
)
from resources.frames import empty_frame
from resources.lake import PARTITION_COLUMN, FolderAdd, FolderWrite, LakeResource, key_to_dt
from resources.mongo import MongoResource, with_server_limit
from resources.parallel import results, side_by_side
from resources.spark import collect_small, computed_once, row_count
from resources.sth_mongo import STHSinkResource

GROUP = "sth"
PARTIALS = "sth_partials"
ROLLUPS = "sth_rollups"
# Written once every hour's partials are in the rollups (see _update_rollups).
ROLLUPS_COMPLETE = "_complete.json"
# Continuous mode's batches add files of their own to the rollup buckets (see _add_batch_rollups);
# a bucket holding this many is compacted by the next batch that adds to it.
BATCH_ROLLUPS_PREFIX = "batch-"
MAX_BATCH_ROLLUPS = 24
# The rollups' row groups: a month row's `occur` map holds every distinct string value of its
# attribute that month, and Parquet's reader decodes a row group's maps in one batch; 2,430 month
# rows of 3,000,000 notifications (107 MB of keys in one 128 MB row group) made it ask a 4 GB
# driver for 67 MB of contiguous heap, which failed. 8 MB compressed came to 19-46 MB decoded there.
ROLLUP_ROW_GROUP_BYTES = 8 * 1024 * 1024
REJECTS = "sth_rejects"
EXAMPLES = 5
# Collections listed one by one in the metadata; the rest are summed up.
MAX_LISTED_COLLECTIONS = 50
# Naming lookups (one row per entity attribute of a run) up to this many rows are broadcast: about
# 300 bytes a row.
MAX_BROADCAST_NAMES = 200_000


def _update_rollups(
    session: SparkSession, lake: LakeResource, keys: list[str], run_partials: DataFrame
) -> tuple[list[str], bool]:
    """Bring the rollups of the run's hours up to date; the buckets written, and whether the rollups
    now hold the run's hours and nothing else (built anew from partials of those hours only).

    Each bucket the hours touch is rewritten with its rows of other receive hours and days kept
    and the run's own replaced (the partials' empty rows keep every slot an hour ever had among
    them, so a slot that lost its samples is zeroed, not left stale). Day and month rows are the
    merge of every hour of the receive day, so the day's other hours are read too (at most 24).
    A lake whose rollups were never completed (new, or from before rollups) has them built from
    every hour's partials once.
    """
    complete = lake.read_dataset_file(ROLLUPS, ROLLUPS_COMPLETE) is not None
    dts = sorted(key_to_dt(k) for k in keys)
    only_the_run = not complete and set(lake.folder_values(PARTIALS, PARTITION_COLUMN)) <= set(dts)
    if complete:
        day_keys = sorted({f"{dt[:10]}-{h:02d}:00" for dt in dts for h in range(24)})
        rows = rollup_rows(run_partials, lake.read(session, PARTIALS, STH_PARTIALS, day_keys))
    else:
        everything = lake.read(session, PARTIALS, STH_PARTIALS)
        rows = rollup_rows(everything, everything)
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        buckets = sorted(r["bucket"] for r in rows.select("bucket").distinct().collect())
        if buckets:
            merged = rows
            if complete:
                old = lake.read_folders(session, ROLLUPS, "bucket", buckets, schema=STH_ROLLUPS)
                if old is not None:
                    merged = old.where(~F.col("part").isin(*receive_parts(dts))).unionByName(rows)
            lake.replace_folders(
                merged, ROLLUPS, "bucket", buckets, sort_by=ROLLUP_ORDER, row_group_bytes=ROLLUP_ROW_GROUP_BYTES
            )
    finally:
        rows.unpersist()
    if not complete:
        lake.write_dataset_file(ROLLUPS, ROLLUPS_COMPLETE, json.dumps({"format": 1}))
    return buckets, only_the_run


def _batch_prefix(batch: str) -> str:
    """The rollup files a batch adds to each bucket it touches (see ``_add_batch_rollups``)."""
    return f"{BATCH_ROLLUPS_PREFIX}{batch}-"


def _add_batch_rollups(
    session: SparkSession, lake: LakeResource, batch: str, batch_partials: DataFrame
) -> tuple[list[str], Column | None]:
    """Add a batch's rollup rows to the buckets it touches, as files of its own; the buckets, and the
    filter that narrows a read of them to the documents the batch touched (``narrowing_filter``).

    The batch's second, minute and hour rows are its partials as they are, and its day and month
    rows its partials merged per slot and receive day: with the rows already in the buckets they
    give the documents a rewrite of the buckets would, so the run writes what the batch brings, not
    the hour, day or year its buckets hold. A rerun of the batch replaces its own files. A bucket
    that already holds ``MAX_BATCH_ROLLUPS`` batches' files is compacted first, in the same write:
    its rows merged per slot and part into one file (the same documents).
    """
    # Two consumers (the buckets, the write): computed once.
    (rows,) = computed_once(rollup_rows(batch_partials, batch_partials))
    buckets = sorted(r["bucket"] for r in collect_small(buckets=rows.select("bucket").distinct())["buckets"])
    if not buckets:
        return
    files = lake.folder_file_names(ROLLUPS, "bucket", buckets)
    full = [
        b for b, names in files.items() if sum(n.startswith(BATCH_ROLLUPS_PREFIX) for n in names) >= MAX_BATCH_ROLLUPS
    ]
    writes: list[FolderWrite | FolderAdd] = []
    if full:
        old = lake.read_folders(session, ROLLUPS, "bucket", full, schema=STH_ROLLUPS)
        assert old is not None, "buckets with files"
        writes.append(
            FolderWrite(
                compact_rollups(old),
                ROLLUPS,
                "bucket",
                full,
                sort_by=ROLLUP_ORDER,
                row_group_bytes=ROLLUP_ROW_GROUP_BYTES,
            )
        )
    prefix = _batch_prefix(batch)
    writes.append(
        FolderAdd(
            [(rows, prefix)],
            ROLLUPS,
            "bucket",
            buckets,
            remove_prefixes=(prefix,),
            sort_by=ROLLUP_ORDER,
            row_group_bytes=ROLLUP_ROW_GROUP_BYTES,
        )
    )
    lake.replace_together(writes)


def _drop_unfinished_rollups(session: SparkSession, lake: LakeResource, key: str, plan: FoldPlan) -> None:
    """Remove the rollup files of the hour's batches whose runs were killed before the ledger named
    them, before their partials go: the buckets they touched are found from those partials (a run
    killed after this and before the partials go does it again)."""
    stale = sorted(plan.unfinished_batches(lake, PARTIALS))
    if not stale:
        return
    partials = lake.read_hour_parts(session, PARTIALS, STH_PARTIALS, {key: stale}, whole=False)
    touched = partials.select(bucket_of().alias("bucket")).distinct()
    buckets = sorted(r["bucket"] for r in touched.collect())
    prefixes = tuple(_batch_prefix(b) for b in stale)
    lake.add_to_folders(FolderAdd((), ROLLUPS, "bucket", buckets, remove_prefixes=prefixes))


@asset(
    deps=[ngsi_events],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "parquet", "mongodb"},
    # One run at a time writes the rollups: a local lake is locked, an object store needs this pool's limit at 1.
    pool="sth_aggregates",
    check_specs=[
        AssetCheckSpec("day_samples_equal_hour_samples", asset="sth_aggregates"),
        AssetCheckSpec("documents_within_mongodb_limits", asset="sth_aggregates"),
        AssetCheckSpec("every_sample_in_aggregates_or_occur", asset="sth_aggregates"),
    ],
)
def sth_aggregates(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    sth: STHSinkResource,
) -> MaterializeResult:
    """One STH-Comet document per (database, collection, _id: entity/attribute, origin, resolution).

    Seed 002 (Cygnus NGSISTHSink): samples, sum, sum2, min, max per slot for numeric values, an
    occur map for strings, for each configured resolution. The lake keeps per-hour partial
    aggregates (`sth_partials`, replaced per run), the same re-keyed by document bucket
    (`sth_rollups`: a document's rows, whatever hour they came from, in one folder) and the events
    that cannot be written (`sth_rejects`, with the reason). Every document an hour touches is
    rebuilt from its own bucket alone, whatever the history's age, and written whole to MongoDB
    (when `NGSI_MONGO_URL` is set), so reruns and backfills in any order leave the same documents.

    Continuous mode's increment runs (tagged `ngsi/increment`, or `ngsi/new-increments`) aggregate
    only the hour's increments not aggregated yet, as partials of their own beside the hour's, and
    add their samples to the documents in place as Cygnus does (`$inc` of samples, sum, sum2 and
    occur counts, `$min`, `$max`), exactly once: each collection records the batches it received,
    and one a dead run left half-updated is rebuilt whole from the rollups by the next batch.
    """
    config = sth.sth_config()
    if sth.mongo_url:
        # Names follow the server's limits (255-byte namespaces from MongoDB 4.4): one buildInfo.
        config = with_server_limit(config, sth.mongo_url)
    keys = context.partition_keys
    session = spark.spark_session
    now = datetime.now(UTC)
    # Continuous mode's increment runs (and derived runs) aggregate what the hour's ledger does not
    # name yet: the run's own increment, and any an earlier run did not get to.
    new_only = folds_new_increments(context.run.tags)

    # Runs of different hours share rollup buckets (a month's, a year's) and documents: one at a time.
    with lake.exclusive(ROLLUPS):
        plan = FoldPlan.of(lake, keys, PARTIALS, new_only=new_only, outputs=(PARTIALS, REJECTS))
        received = received_metadata(hours_received(lake, plan.contents))
        if plan.todo == []:
            return _nothing_new(config, received)
        result = _materialize(session, lake, sth, config, keys, now, plan, received)
        plan.record(lake, PARTIALS)
        return result


def _nothing_new(config: STHConfig, received: Mapping[str, MetadataValue]) -> MaterializeResult:
    """A derived run after which no increment of the hour is left to aggregate: nothing is rebuilt."""
    metadata = {"events": 0, "samples": 0, "documents_touched": 0, "folded": "nothing new", **received}
    both = Resolution.DAY in config.resolutions and Resolution.HOUR in config.resolutions
    return MaterializeResult(metadata=metadata, check_results=_Checks().results(both))


@dataclass
class _Checks:
    """What the checks found in the rebuilt documents (none rebuilt: nothing found)."""

    mismatch_count: int = 0
    mismatch_examples: list[dict] = field(default_factory=list)
    rejected_documents: int = 0
    rejected_examples: list[dict] = field(default_factory=list)
    unaccounted_count: int = 0
    unaccounted_examples: list[dict] = field(default_factory=list)
    mixed_count: int = 0

    def results(self, both: bool) -> list[AssetCheckResult]:
        return [
            AssetCheckResult(
                check_name="day_samples_equal_hour_samples",
                passed=self.mismatch_count == 0,
                severity=AssetCheckSeverity.ERROR,
                description="For every day whose hour document was rebuilt (or updated), the day document's "
                "slot counts (or gains) as many samples as the hour document's slots together."
                + ("" if both else " Not applicable: day and hour are not both configured."),
                metadata={"mismatches": self.mismatch_count, "examples": MetadataValue.json(self.mismatch_examples)},
            ),
            AssetCheckResult(
                check_name="documents_within_mongodb_limits",
                passed=not self.rejected_examples,
                severity=AssetCheckSeverity.WARN,
                description="No rebuilt document exceeds MongoDB's 16 MiB limit (such documents are not written).",
                metadata={
                    "rejected_documents": self.rejected_documents,
                    "examples": MetadataValue.json(self.rejected_examples),
                },
            ),
            AssetCheckResult(
                check_name="every_sample_in_aggregates_or_occur",
                passed=self.unaccounted_count == 0,
                severity=AssetCheckSeverity.ERROR,
                description="In every point of every rebuilt document (or update), samples = the numbers "
                "aggregated in sum, sum2, min and max + the text counted in occur (documents may hold both kinds).",
                metadata={
                    "points_not_accounted": self.unaccounted_count,
                    "documents_with_numbers_and_text": self.mixed_count,
                    "examples": MetadataValue.json(self.unaccounted_examples),
                },
            ),
        ]


def _materialize(
    session: SparkSession,
    lake: LakeResource,
    sth: STHSinkResource,
    config: STHConfig,
    keys: list[str],
    now: datetime,
    plan: FoldPlan,
    received: Mapping[str, MetadataValue],
) -> MaterializeResult:
    """Aggregate the events ``plan`` says (the hours whole, or a batch of increments of one hour) into
    the lake's partials and rollups, then bring MongoDB up to date: the documents the hours touch
    rebuilt whole, or the batch's samples added to the documents in place."""
    batch = plan.batch
    if batch is not None:
        _drop_unfinished_rollups(session, lake, keys[0], plan)
        plan.drop_unfinished_batches(lake, (PARTIALS, REJECTS))
    events = plan.read(lake, session, "ngsi_events", NGSI_EVENTS)
    # The naming lookup first: one row per entity attribute, sent whole to the tasks that read the
    # events when small (else the events would be shuffled and sorted to meet it, every one of them).
    (names,) = computed_once(sth_name_lookup(events, config))
    small = int(collect_small(n=row_count(names))["n"][0]["n"]) <= MAX_BROADCAST_NAMES
    # Three consumers (rejects, partials, counts): classify (and name) each event once.
    (classified,) = computed_once(classify_events(events, config, F.broadcast(names) if small else names))
    deletes = F.when(F.col("reason") == REASON_DELETE, F.lit("delete")).otherwise(F.col("status"))
    by_status = {r["fate"]: int(r["count"]) for r in classified.groupBy(deletes.alias("fate")).count().collect()}
    partials = sth_partials(classified, config.resolutions)
    both = Resolution.DAY in config.resolutions and Resolution.HOUR in config.resolutions
    if batch is not None:
        key = keys[0]
        # The batch's own files beside the hour's: partials of one slot from several batches are
        # merged wherever partials are read (``merge_partials``); a rerun replaces exactly them.
        no_rejects = not by_status.get(STATUS_REJECTED)
        results(
            side_by_side(
                [
                    functools.partial(
                        lake.append_increment, sth_rejects(classified), REJECTS, key, batch, empty=no_rejects
                    ),
                    functools.partial(lake.append_increment, partials, PARTIALS, key, batch),
                ],
                name="lake-append",
                workers=2,
            )
        )
        new_partials = lake.read_increment(session, PARTIALS, STH_PARTIALS, key, batch)
        if lake.read_dataset_file(ROLLUPS, ROLLUPS_COMPLETE) is not None:
            _add_batch_rollups(session, lake, batch, new_partials)
        else:
            _update_rollups(session, lake, keys, lake.read(session, PARTIALS, STH_PARTIALS, keys))
        # What the batch adds to each document it touches: checked, then added in place.
        (updates,) = computed_once(point_updates(new_partials, config, int(now.timestamp() * 1000)))
        by_database_action, checks = _find(updates, both)
        publish = _add_batch(session, lake, sth, config, key, now, plan, updates, by_database_action)
        folded = f"{len(plan.todo or [])} increments"
    else:
        # Hours that hold no partials yet (a new lake, new hours) leave no slot to tombstone: finding
        # the slots that went would aggregate the events a second time, for nothing.
        if lake.hours_hold_rows(PARTIALS, keys):
            partials = with_tombstones(partials, lake.read(session, PARTIALS, STH_PARTIALS, keys))
        lake.replace_together(
            [
                FolderWrite.hours(sth_rejects(classified), REJECTS, keys),
                FolderWrite.hours(partials, PARTIALS, keys),
            ]
        )
        run_partials = lake.read(session, PARTIALS, STH_PARTIALS, keys)
        rollups_built, only_the_run = _update_rollups(session, lake, keys, run_partials)
        # Rollups of the run's hours alone (a first build, a rebuild from scratch): every document in
        # them is one the run touched, and no join is needed to find them.
        keys_touched = None if only_the_run else run_partials.select(*DOC_COLUMNS).distinct()
        (documents,) = computed_once(_rebuilt_documents(session, lake, config, now, rollups_built, keys_touched))
        by_database_action, checks = _find(documents, both)
        publish = _replace_whole(sth, config, keys, now, documents, by_database_action)
        folded = "whole"
    by_action: dict[str, int] = {}
    for r in by_database_action:
        by_action[r["action"]] = by_action.get(r["action"], 0) + int(r["count"])
    return MaterializeResult(
        metadata={
            "events": sum(by_status.values()),
            "samples": by_status.get(STATUS_SAMPLE, 0),
            "skipped_null_or_white_space": by_status.get(STATUS_SKIPPED, 0),
            "skipped_entity_deletes": by_status.get("delete", 0),
            "rejects": by_status.get(STATUS_REJECTED, 0),
            "documents_touched": sum(by_action.values()),
            "documents_by_action": MetadataValue.json(by_action),
            "documents_with_numbers_and_text": checks.mixed_count,
            "resolutions": ",".join(r.value for r in config.resolutions),
            "data_model": config.data_model.value,
            "folded": folded,
            **received,
            **publish,
        },
        check_results=checks.results(both),
    )


def _not_published() -> dict[str, object]:
    return {"published": False, "publish_skipped": "MongoDB not configured (set NGSI_MONGO_URL): lake aggregates only"}


def _replace_whole(
    sth: STHSinkResource,
    config: STHConfig,
    keys: list[str],
    now: datetime,
    documents: DataFrame,
    by_database_action: list[Row],
) -> dict[str, object]:
    """Replace (or delete) the rebuilt documents in MongoDB and expire the old ones; the hours' ledger
    entries of batches go (the documents now hold every sample of the hours)."""
    if not sth.mongo_url:
        return _not_published()
    # Ping first: an unreachable server fails the run with a clear message before Spark starts writing.
    # Collections that exist already have their index: only new ones get it (one call each).
    databases = {r["database"] for r in by_database_action}
    with MongoResource(url=sth.mongo_url).client() as client:
        before = existing_collections(client, databases)
    written = publish_documents(documents, sth.mongo_url, config)
    with MongoResource(url=sth.mongo_url).client() as client:
        ensure_aggregate_indexes(client, set(written) - before, config)
        forget_hours(client, databases, keys)
        expired = expire_documents(client, config, now)
    per_collection = {
        f"{db}.{coll}": {"replaced": rep, "deleted": dele}
        for (db, coll), (rep, dele) in sorted(written.items())[:MAX_LISTED_COLLECTIONS]
    }
    return {
        "published": True,
        "collections_written": len(written),
        "documents_replaced": sum(v[0] for v in written.values()),
        "documents_deleted": sum(v[1] for v in written.values()),
        "documents_written_per_collection": MetadataValue.json(per_collection),
        "documents_expired": sum(expired.values()),
    }


def _add_batch(
    session: SparkSession,
    lake: LakeResource,
    sth: STHSinkResource,
    config: STHConfig,
    key: str,
    now: datetime,
    plan: FoldPlan,
    updates: DataFrame,
    by_database_action: list[Row],
) -> dict[str, object]:
    """Add the batch's samples to the documents in MongoDB (``add_point_updates``), exactly once.

    First the collections a dead run left unfinished (``stale_collections``) and those holding a
    document that point updates cannot express (``ACTION_REBUILD``) have the hour's documents rebuilt
    whole from the rollups, which already hold the batch: they are marked as having it, and its
    updates skip them. The hour's first batch also expires the documents past ``data_expiration``.
    """
    if not sth.mongo_url:
        return _not_published()
    assert plan.folded is not None and plan.batch is not None
    batch = plan.batch
    databases = {r["database"] for r in by_database_action}
    with MongoResource(url=sth.mongo_url).client() as client:
        before = existing_collections(client, databases)
        stale = stale_collections(client, databases, key, plan.folded.batches)
    whole: set[tuple[str, str]] = set()
    if any(r["action"] == ACTION_REBUILD for r in by_database_action):
        rebuilt_rows = updates.where(F.col("action") == ACTION_REBUILD).select("database", "collection").distinct()
        whole = {(r["database"], r["collection"]) for r in collect_small(whole=rebuilt_rows)["whole"]}
    rebuild = {**{c: [] for c in whole}, **stale}
    rebuilt = _rebuild_collections(session, lake, sth.mongo_url, config, key, now, sorted(rebuild)) if rebuild else 0
    if rebuild:
        with MongoResource(url=sth.mongo_url).client() as client:
            settle_rebuilt(client, rebuild, key, batch)
    added = add_point_updates(updates.where(F.col("action") == ACTION_UPDATE), sth.mongo_url, config, key, batch)
    with MongoResource(url=sth.mongo_url).client() as client:
        ensure_aggregate_indexes(client, (set(added) | set(rebuild)) - before, config)
        expired = expire_documents(client, config, now) if not plan.folded.batches else {}
    per_collection = {f"{db}.{coll}": counts for (db, coll), counts in sorted(added.items())[:MAX_LISTED_COLLECTIONS]}
    return {
        "published": True,
        "collections_written": len(set(added) | set(rebuild)),
        "documents_updated": sum(c.get("updated", 0) for c in added.values()),
        "documents_rejected_by_mongodb": sum(c.get("rejected", 0) for c in added.values()),
        "collections_already_holding_the_batch": sum(1 for c in added.values() if "already" in c),
        "collections_rebuilt_whole": len(rebuild),
        "documents_rebuilt_whole": rebuilt,
        "documents_updated_per_collection": MetadataValue.json(per_collection),
        "documents_expired": sum(expired.values()),
    }


def _rebuild_collections(
    session: SparkSession,
    lake: LakeResource,
    url: str,
    config: STHConfig,
    key: str,
    now: datetime,
    collections: list[tuple[str, str]],
) -> int:
    """Replace the hour's documents of ``collections`` with their whole rebuild from the rollups; how
    many were written."""
    wanted = functools.reduce(
        Column.__or__, [(F.col("database") == db) & (F.col("collection") == coll) for db, coll in collections]
    )
    keys = lake.read(session, PARTIALS, STH_PARTIALS, [key]).where(wanted).select(*DOC_COLUMNS).distinct()
    found = collect_small(buckets=keys.select(bucket_of().alias("bucket")).distinct(), **narrowing_values(keys))
    buckets = sorted(r["bucket"] for r in found["buckets"])
    documents = _rebuilt_documents(session, lake, config, now, buckets, keys, narrowing_filter(found))
    written = publish_documents(documents, url, config)
    return sum(replaced + deleted for replaced, deleted in written.values())


def _rebuilt_documents(
    session: SparkSession,
    lake: LakeResource,
    config: STHConfig,
    now: datetime,
    buckets: list[str],
    keys: DataFrame | None,
    narrowing: Column | None = None,
) -> DataFrame:
    """The documents of ``keys`` (DOC_COLUMNS; None: every document of the buckets) rebuilt whole from
    their rollup ``buckets``, read through ``narrowing`` when given."""
    stored = lake.read_folders(session, ROLLUPS, "bucket", buckets, schema=STH_ROLLUPS)
    if stored is None:
        stored = empty_frame(session, STH_ROLLUPS)
    else:
        if narrowing is not None:
            stored = stored.where(narrowing)
        if keys is not None:
            stored = documents_of(stored, keys)
    return build_documents(stored, config, int(now.timestamp() * 1000), order="part")


def _find(documents: DataFrame, both: bool) -> tuple[list[Row], _Checks]:
    """The rebuilt documents' counts per database and action (``count``), and what the checks found.

    One job for the counts (per database and action: documents, documents with numbers and text,
    points not accounted for; and the day/hour mismatches when ``both``), and a second only for the
    examples of the counts that show some (usually none: each example query is a shuffle and a job
    of its own)."""
    counts = {
        "by_database_action": documents.groupBy("database", "action").agg(
            F.count("*").alias("count"),
            F.sum((F.col("numeric") & F.col("text")).cast("long")).alias("mixed"),
            F.sum(unaccounted_points()).alias("unaccounted"),
        )
    }
    mismatches = day_hour_mismatches(documents) if both else None
    if mismatches is not None:
        counts["mismatches"] = row_count(mismatches)
    found = collect_small(**counts)
    by_database_action = found["by_database_action"]
    checks = _Checks(
        mismatch_count=found["mismatches"][0]["n"] if mismatches is not None else 0,
        rejected_documents=sum(int(r["count"]) for r in by_database_action if r["action"] == ACTION_REJECT),
        unaccounted_count=sum(int(r["unaccounted"]) for r in by_database_action),
        mixed_count=sum(int(r["mixed"]) for r in by_database_action),
    )
    examples: dict[str, DataFrame] = {}
    if checks.rejected_documents:
        rejected = documents.where(F.col("action") == ACTION_REJECT).select("database", "collection", "reason")
        examples["rejected"] = first_rows(rejected, EXAMPLES, "database", "collection", "reason")
    if checks.unaccounted_count:
        examples["unaccounted"] = first_rows(unaccounted_samples(documents), EXAMPLES, *SLOT_COLUMNS)
    if mismatches is not None and checks.mismatch_count:
        examples["mismatches"] = first_rows(mismatches, EXAMPLES, *ID_COLUMNS, "day")
    rows = collect_small(**examples)
    checks.rejected_examples = [r.asDict() for r in rows.get("rejected", [])]
    checks.unaccounted_examples = [
        {
            "collection": r["collection"],
            "resolution": r["resolution"],
            "origin": r["origin"],
            "offset": r["offset"],
            "samples": r["samples"],
            "numbers": r["numSamples"],
            "occurrences": r["occurrences"],
        }
        for r in rows.get("unaccounted", [])
    ]
    checks.mismatch_examples = [
        {"collection": r["collection"], "day": str(r["day"]), "hour": r["hourSamples"], "day_doc": r["daySamples"]}
        for r in rows.get("mismatches", [])
    ]
    return by_database_action, checks


__all__ = ["sth_aggregates", "PARTIALS", "REJECTS", "ROLLUPS", "STH_REJECTS"]
