"""Raw MongoDB history (Cygnus NGSIMongoSink): the collections STH-Comet's raw queries read."""

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

from ngsi_assets.assets.ingest import events_of_run, ngsi_events
from ngsi_assets.freshness import received_metadata, run_received
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.sinks.mongo_raw import write_raw
from ngsi_assets.transforms.mongo_raw import MONGO_RAW_REJECTS, classify_raw, raw_rejects, raw_rows
from ngsi_assets.transforms.plans import most_frequent
from resources.lake import LakeResource
from resources.mongo import with_server_limit
from resources.mongo_raw import ENABLED_ENV, MongoRawSinkResource
from resources.spark import collect_small, row_count

REJECTS = "mongo_raw_rejects"
# Collections listed one by one in the metadata; the rest are summed up.
MAX_LISTED_COLLECTIONS = 50
NOT_ENABLED = f"raw MongoDB sink not enabled (set {ENABLED_ENV}=true and NGSI_MONGO_URL)"


@asset(
    deps=[ngsi_events],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name="mongodb",
    kinds={"spark", "mongodb"},
    check_specs=[AssetCheckSpec("every_raw_document_acknowledged", asset="mongo_raw")],
)
def mongo_raw(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    mongo_raw_sink: MongoRawSinkResource,
) -> MaterializeResult:
    """Cygnus NGSIMongoSink's raw collections: a document per attribute update (row mode) or per
    notified entity (column mode), in a database per fiware-service and a collection per data model
    (`sth_<service>` / `sth_<service path>_<entity>_<type>` by default), with `recvTime` a BSON date.

    Off unless `NGSI_MONGO_RAW_ENABLED=true`. Every document has a deterministic `_id`, so a rerun
    (of an hour or of an increment) inserts only what is missing and never a document twice.
    Events that cannot be written (names MongoDB refuses, NUL characters) go to the lake dataset
    `mongo_raw_rejects` with the reason.
    """
    keys = context.partition_keys
    if not mongo_raw_sink.enabled:
        return MaterializeResult(
            metadata={"skipped": NOT_ENABLED, **received_metadata(run_received(lake, keys, context.run.tags))},
            check_results=[
                AssetCheckResult(
                    check_name="every_raw_document_acknowledged", passed=True, metadata={"skipped": NOT_ENABLED}
                )
            ],
        )
    config = mongo_raw_sink.raw_config()
    url = mongo_raw_sink.mongo_url
    assert url is not None  # the resource refuses enabled without a URL
    # Ping first (an unreachable server fails the run with a clear message before Spark starts
    # writing), and name collections within the server's limits.
    config = with_server_limit(config, url)
    session = spark.spark_session
    events, inc = events_of_run(context, lake, session)
    classified = classify_raw(events, config).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rejects = raw_rejects(classified).select(*MONGO_RAW_REJECTS.fieldNames())
        if inc is None:
            lake.replace_partitions(rejects, REJECTS, keys)
            stored_rejects = lake.read(session, REJECTS, MONGO_RAW_REJECTS, keys)
        else:
            hour = inc.hour_of(keys)
            lake.append_increment(rejects, REJECTS, hour, inc.id)
            stored_rejects = lake.read_increment(session, REJECTS, MONGO_RAW_REJECTS, hour, inc.id)
        rows = raw_rows(classified, config).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            reasons = most_frequent(stored_rejects, "reason", 50)
            found = collect_small(reasons=reasons, shaped=row_count(rows))
            by_reason = {r["reason"]: int(r["count"]) for r in found["reasons"]}
            shaped = found["shaped"][0]["n"]
            written = write_raw(rows, url, config)
        finally:
            rows.unpersist()
    finally:
        classified.unpersist()
    acknowledged = sum(total for total, _ in written.values())
    inserted = sum(new for _, new in written.values())
    per_collection = {
        f"{db}.{coll}": {"documents": total, "inserted": new}
        for (db, coll), (total, new) in sorted(written.items())[:MAX_LISTED_COLLECTIONS]
    }
    metadata = {
        "documents": shaped,
        "documents_inserted": inserted,
        "documents_already_stored": acknowledged - inserted,
        "collections_written": len(written),
        "documents_per_collection": MetadataValue.json(per_collection),
        "rejects": sum(by_reason.values()),
        "rejects_by_reason": MetadataValue.json(by_reason),
        "attr_persistence": config.attr_persistence.value,
        "data_model": config.data_model.value,
        "capped": config.capped,
        "dagster/row_count": shaped,
        **received_metadata(run_received(lake, keys, context.run.tags)),
    }
    if inc is not None:
        metadata["increment"] = inc.id
    return MaterializeResult(
        metadata=metadata,
        check_results=[
            AssetCheckResult(
                check_name="every_raw_document_acknowledged",
                passed=acknowledged == shaped,
                severity=AssetCheckSeverity.ERROR,
                description="Every raw document shaped from the events was acknowledged by MongoDB "
                "(inserted now, or already stored by an earlier run).",
                metadata={"shaped": shaped, "acknowledged": acknowledged},
            )
        ],
    )


__all__ = ["mongo_raw", "REJECTS"]
