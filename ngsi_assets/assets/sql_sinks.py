"""Historic tables and last-data tables in PostgreSQL and MySQL: thin shells around the transforms and the writer."""

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster._core.storage.tags import PRIORITY_TAG
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from ngsi_assets.assets.ingest import events_of_run, ngsi_events
from ngsi_assets.freshness import received_metadata, run_received
from ngsi_assets.last_data_state import LastDataState, delta_id
from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import Dialect, fixed_column, quote_ident
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.sinks.sql_writer import HISTORIC, LAST_DATA, WriteJob, rows_by_table, write_dataframe
from ngsi_assets.transforms.plans import most_frequent
from ngsi_assets.transforms.sql_sinks import (
    LAST_DATA_STATE,
    SQL_SINK_REJECTS,
    TS_FALLBACK,
    last_data_output,
    last_data_records,
    sink_rows,
    writer_order,
)
from resources.lake import LakeResource, key_to_dt
from resources.spark import collect_small, computed_once, row_count
from resources.sql_sinks import SqlSinksResource

GROUP = "sql_sinks"
# Dagster runs the ready step of highest priority first (in process, the platform's executor).
LAST_DATA_PRIORITY = 10
NOT_CONFIGURED = "no SQL sink configured: set NGSI_POSTGRES_URL / NGSI_MYSQL_URL or NGSI_SQL_SINKS_CONFIG"
CHECK_SAMPLE_KEYS = 20
# Reject reasons listed in the metadata per dialect: the most frequent.
MAX_REASONS = 50
_HOUR_MS = 3_600_000


def hour_ranges(partition_keys: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """[start_ms, end_ms) of each hourly partition key (receive time, UTC)."""
    out = []
    for key in sorted(partition_keys):
        start = int(datetime.strptime(key_to_dt(key), "%Y-%m-%d-%H").replace(tzinfo=UTC).timestamp()) * 1000
        out.append((start, start + _HOUR_MS))
    return tuple(out)


def _merge_last_data(
    state: LastDataState, events: DataFrame, delta: str
) -> tuple[DataFrame, DataFrame, dict[str, Any]]:
    """Merge the run's records into the stored state (as the run's delta, see ``last_data_state``); the
    touched keys' rows and the rejects, both computed (``computed_once``). Call it under the state's lock.

    The state is written before any row reaches the server, so a run killed after it is rerun from
    the same state (the merge is idempotent) and writes the same rows. The rows are computed under
    the lock, before a compaction may remove the deltas they were read from.
    """
    cfg = state.cfg
    records, rejects = computed_once(*last_data_records(events, cfg))
    per_bucket = (
        records.groupBy("bucket")
        .agg(F.count("*").alias("n"), F.sum(F.col(TS_FALLBACK).cast("int")).alias("fallbacks"))
        .collect()
    )
    touched = sorted(int(r["bucket"]) for r in per_bucket)
    written = state.merge_in(records.select(*LAST_DATA_STATE.fieldNames()), touched, delta)
    return (
        last_data_output(written.state, cfg),
        rejects,
        {
            "timestamp_key": cfg.last_data_timestamp_key,
            "timestamp_fallbacks": sum(int(r["fallbacks"] or 0) for r in per_bucket),
            "state_buckets_touched": len(touched),
            "state_deltas": written.deltas,
            "state_deltas_compacted": written.compacted,
            "state_buckets_compacted": written.buckets_compacted,
            "state_folder": state.folder,
        },
    )


def _run_sink(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    sql_sinks: SqlSinksResource,
    sink: str,
    check_rows: Callable[[SqlSinkConfig, DataFrame], DataFrame],
    read_back: Callable[[SqlSinkConfig, list[Row]], Any] = lambda _cfg, rows: rows,
) -> tuple[dict[str, Any], list[tuple[SqlSinkConfig, Any, list[dict]]], str | None]:
    """Write one sink for every configured dialect; returns metadata, per-dialect results, a skip reason.

    ``check_rows``: the few rows (a bounded frame of the dialect's written rows) the asset's check
    needs, fetched beside the rejects' counts in the dialect's own thread: one Spark job for both.
    ``read_back``: what the check compares them with, read from the dialect's server in its thread
    too (beside the other dialect's Spark jobs); by default the rows themselves.
    """
    keys = context.partition_keys
    configs = sql_sinks.configs()
    enabled = {d: c for d, c in configs.items() if (c.last_data_enabled if sink == LAST_DATA else c.historic_enabled)}
    if not enabled:
        reason = NOT_CONFIGURED if not configs else f"last_data_mode of every configured sink excludes {sink}"
        return {"skipped": reason, **received_metadata(run_received(lake, keys, context.run.tags))}, [], reason
    session = spark.spark_session
    events, inc = events_of_run(context, lake, session)
    now_ms = int(time.time() * 1000)

    def write_dialect(
        cfg: SqlSinkConfig,
    ) -> tuple[SqlSinkConfig, Any, list[dict], DataFrame, dict[str, Any], dict[str, int]]:
        own: dict[str, Any] = {}
        with contextlib.ExitStack() as stack:
            if sink == LAST_DATA:
                state = LastDataState.of(lake, session, cfg)
                stack.enter_context(state.lock())
                delta = delta_id(keys, None if inc is None else inc.id)
                rows, rejects, state_metadata = _merge_last_data(state, events, delta)
                own.update({f"{cfg.dialect.value}_{k}": v for k, v in state_metadata.items()})
            else:
                rows, rejects = computed_once(*sink_rows(events, cfg, sink))
            job = WriteJob(
                config=cfg,
                connect_kwargs=SqlSinksResource.connect_kwargs(cfg),
                sink=sink,
                hours=hour_ranges(keys),
                now_ms=now_ms,
                increment=None if inc is None else inc.id,
            )
            stats = write_dataframe(rows, job, writer_order(cfg, sink))
        own[f"{cfg.dialect.value}_rows_by_table"] = MetadataValue.json(rows_by_table(stats))
        own[f"{cfg.dialect.value}_rows"] = sum(s["rows"] for s in stats)
        # Counted here, beside the other dialect's jobs, rather than after both.
        reasons = most_frequent(rejects, "reason", MAX_REASONS)
        found = collect_small(reasons=reasons, check=check_rows(cfg, rows))
        counted = {f"{cfg.dialect.value}: {r['reason']}": int(r["count"]) for r in found["reasons"]}
        return cfg, read_back(cfg, found["check"]), stats, rejects, own, counted

    # The dialects are independent (own state folder, own server): their Spark jobs, mostly small
    # and latency-bound, run side by side on the one session.
    with ThreadPoolExecutor(max_workers=len(enabled), thread_name_prefix=f"{sink}-dialect") as pool:
        done = list(pool.map(write_dialect, [cfg for _, cfg in sorted(enabled.items())]))
    metadata: dict[str, Any] = {}
    results = []
    all_rejects: DataFrame | None = None
    by_reason: dict[str, int] = {}
    for cfg, checked, stats, rejects, own, counted in done:
        metadata.update(own)
        results.append((cfg, checked, stats))
        all_rejects = rejects if all_rejects is None else all_rejects.unionByName(rejects)
        by_reason.update(counted)
    dataset = f"{sink}_rejects" if sink == LAST_DATA else "historic_table_rejects"
    if all_rejects is None:  # unreachable: enabled is not empty
        raise RuntimeError("no sink was written")
    all_rejects = all_rejects.select(*SQL_SINK_REJECTS.fieldNames())
    if inc is None:
        lake.replace_partitions(all_rejects, dataset, keys)
    else:
        hour = inc.hour_of(keys)
        # Nothing rejected (the usual case): no write, only the files of an earlier attempt go.
        lake.append_increment(all_rejects, dataset, hour, inc.id, empty=not by_reason)
        metadata["increment"] = inc.id
    metadata["rejects"] = sum(by_reason.values())
    metadata["rejects_by_reason"] = MetadataValue.json(by_reason)
    metadata["dagster/row_count"] = sum(int(metadata[f"{c.dialect.value}_rows"]) for c, _, _ in results)
    metadata.update(received_metadata(run_received(lake, keys, context.run.tags)))
    return metadata, results, None


@asset(
    deps=[ngsi_events],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "postgres", "mysql"},
    check_specs=[AssetCheckSpec("every_shaped_row_written", asset="historic_tables")],
)
def historic_tables(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    sql_sinks: SqlSinksResource,
) -> MaterializeResult:
    """Cygnus NGSIToMySQL / NGSIToPostgreSQL historic tables: one row per attribute update (row mode,
    keyed by recvTimeTs, entityId, attrName) or per notified entity (column mode), in a database
    (MySQL) or schema (PostgreSQL) per fiware-service and a table per data model.

    Each table's rows of the run's hours are replaced in one transaction, so reruns change nothing.
    Records that cannot be written (bad or over-long names, NUL characters for PostgreSQL) go to the
    lake dataset `historic_table_rejects` with the reason.
    """
    metadata, results, skipped = _run_sink(
        context, spark, lake, sql_sinks, HISTORIC, lambda _cfg, rows: row_count(rows)
    )
    if skipped:
        return MaterializeResult(
            metadata=metadata,
            check_results=[
                AssetCheckResult(check_name="every_shaped_row_written", passed=True, metadata={"skipped": skipped})
            ],
        )
    shaped = {c.dialect.value: counted[0]["n"] for c, counted, _ in results}
    written = {c.dialect.value: sum(s["rows"] for s in stats) for c, _, stats in results}
    return MaterializeResult(
        metadata=metadata,
        check_results=[
            AssetCheckResult(
                check_name="every_shaped_row_written",
                passed=shaped == written,
                description="Every row shaped from the events was written in a committed table batch.",
                metadata={"shaped": MetadataValue.json(shaped), "written": MetadataValue.json(written)},
            )
        ],
    )


def _stored_last_rows(cfg: SqlSinkConfig, sample: list[Any]) -> dict[tuple, tuple]:
    """(db, table, key...) -> (recvTime, {column: value}) for the sampled keys, read back from the server."""
    out: dict[tuple, tuple] = {}
    for database in sorted({r["database"] for r in sample}, key=lambda d: d or ""):
        out.update(_stored_rows_in(cfg, database, [r for r in sample if r["database"] == database]))
    return out


def _stored_rows_in(cfg: SqlSinkConfig, database: str | None, sample: list[Any]) -> dict[tuple, tuple]:
    import psycopg2
    import pymysql

    kwargs = SqlSinksResource.connect_kwargs(cfg)
    if database is not None:  # a PostgreSQL database per service
        kwargs["dbname"] = database
    conn = psycopg2.connect(**kwargs) if cfg.dialect is Dialect.POSTGRESQL else pymysql.connect(**kwargs)
    keys = list(cfg.last_data_unique_key)
    out: dict[tuple, tuple] = {}
    try:
        with conn.cursor() as cur:
            for r in sample:
                q = lambda n: quote_ident(n, cfg.dialect)  # noqa: E731
                cols = [fixed_column("recvTime", cfg.dialect), *sorted(r["attrs"] or {})]
                where = " AND ".join(f"{q(fixed_column(k, cfg.dialect))} = %s" for k in keys)
                cur.execute(
                    f"SELECT {', '.join(q(c) for c in cols)} FROM {q(r['db'])}.{q(r['table'])} WHERE {where}",
                    [r[k] for k in keys],
                )
                got = cur.fetchone()
                out[(r["database"], r["db"], r["table"], *[r[k] for k in keys])] = (
                    None if got is None else (got[0], dict(zip(cols[1:], got[1:], strict=True)))
                )
    finally:
        conn.close()
    return out


def _check_sample(cfg: SqlSinkConfig, rows: DataFrame) -> DataFrame:
    """A bounded sample of the run's upserted keys: the stored row must be this run's newest record,
    or a newer one a later hour wrote."""
    return (
        rows.where(F.col("op") == "u")
        .orderBy("database", "db", "table", *cfg.last_data_unique_key)
        .limit(CHECK_SAMPLE_KEYS)
    )


@asset(
    deps=[ngsi_events],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "postgres", "mysql"},
    check_specs=[AssetCheckSpec("last_data_row_equals_newest_event", asset="last_data")],
    # First of the steps ready after the events: freshness is measured in the last-data tables.
    op_tags={PRIORITY_TAG: str(LAST_DATA_PRIORITY)},
    # One run at a time writes a sink's state: a local lake is locked, an object store needs this pool's limit at 1.
    pool="last_data",
)
def last_data(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    sql_sinks: SqlSinksResource,
) -> MaterializeResult:
    """Cygnus last-data tables (seed 000): one row per last_data_unique_key (default entityId) in
    `<table><last_data_table_suffix>`, each attribute column holding its newest value by
    last_data_timestamp_key (recvTime, or an attribute such as TimeInstant), across runs in any order;
    an entityDelete removes the row and leaves a tombstone that older updates cannot undo.

    The merged state of every key is kept in the lake (`last_data_state`, plus a small delta per run
    in `last_data_state_deltas`, folded into the state every NGSI_LAST_DATA_COMPACT_AFTER runs); a run
    upserts only the keys it touched. Records that cannot be written go to
    the lake dataset `last_data_rejects` with the reason.
    """
    metadata, results, skipped = _run_sink(
        context,
        spark,
        lake,
        sql_sinks,
        LAST_DATA,
        _check_sample,
        lambda cfg, sample: (sample, _stored_last_rows(cfg, sample)),
    )
    check = "last_data_row_equals_newest_event"
    if skipped:
        return MaterializeResult(
            metadata=metadata,
            check_results=[AssetCheckResult(check_name=check, passed=True, metadata={"skipped": skipped})],
        )
    mismatches: list[str] = []
    checked = 0
    for cfg, (sample, stored), _ in results:
        for r in sample:
            key = (r["database"], r["db"], r["table"], *[r[k] for k in cfg.last_data_unique_key])
            got = stored[key]
            checked += 1
            if got is None:
                mismatches.append(f"{cfg.dialect.value} {key}: no row")
            elif got[0] == r["recvTime"]:
                want = {c: v["value"] for c, v in (r["attrs"] or {}).items()}
                if got[1] != want:
                    mismatches.append(f"{cfg.dialect.value} {key}: stored {got[1]} != newest event {want}")
            elif str(got[0]) < r["recvTime"]:
                mismatches.append(f"{cfg.dialect.value} {key}: stored recvTime {got[0]} older than {r['recvTime']}")
    return MaterializeResult(
        metadata=metadata,
        check_results=[
            AssetCheckResult(
                check_name=check,
                passed=not mismatches,
                description=f"For up to {CHECK_SAMPLE_KEYS} keys per sink, the last-data row holds the batch's "
                "newest record (or a newer one).",
                metadata={"keys_checked": checked, "mismatches": MetadataValue.json(mismatches[:10])},
            )
        ],
    )
