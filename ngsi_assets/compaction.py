"""The compaction of the last-data state: its own job, on a schedule, visible in the Dagster UI.

Each ``last_data`` run writes what it brings as a small delta beside the state's base buckets
(``ngsi_assets.last_data_state``), and every later run reads the deltas of its buckets. The
``ngsi_last_data_compaction_job`` folds every delta of each configured SQL sink into the base buckets
they touch, then removes them. It runs outside the runs that bring new data, so the increments that
keep last data fresh do not pay for it.

- Schedule: ``NGSI_LAST_DATA_COMPACT_CRON`` (default every 5 minutes). A tick is skipped while a
  compaction run is still queued or running, so compaction runs never pile up. It is also skipped
  when no sink keeps last data or no delta is waiting: no empty runs when traffic stops.
- Lane: the derived lane (``ngsi/derived-lane``). Compaction waits for a derived run, never for an
  increment, and never takes a run slot from the increments. Against a ``last_data`` run it takes the
  state's lock: one of the two waits for the other.
- Safe to interrupt: the base buckets are replaced before the deltas are removed. The merge is
  idempotent, so a delta folded twice changes nothing. A killed compaction is finished by the next
  one, or by a ``last_data`` run that finds ``NGSI_LAST_DATA_COMPACT_AFTER`` deltas.
- What it did shows on the run page (one output per sink) and on the ``last_data`` asset, as an
  observation.
"""

import os

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultScheduleStatus,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    job,
    op,
    schedule,
)
from dagster._utils.schedules import is_valid_cron_string
from dagster_pyspark import LazyPySparkResource

from ngsi_assets.last_data_state import DELTA_COLUMN, DELTAS_DATASET, LastDataState, state_folder
from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.sensors import DERIVED_LANE, OPEN_RUN_STATUSES
from resources.lake import LakeResource
from resources.sql_sinks import SqlSinksResource

COMPACT_CRON_ENV = "NGSI_LAST_DATA_COMPACT_CRON"
COMPACT_CRON_DEFAULT = "*/5 * * * *"
JOB_NAME = "ngsi_last_data_compaction_job"


def compact_cron() -> str:
    """The compaction schedule's cron (``NGSI_LAST_DATA_COMPACT_CRON``)."""
    value = os.environ.get(COMPACT_CRON_ENV, "").strip() or COMPACT_CRON_DEFAULT
    if not is_valid_cron_string(value):
        raise ValueError(f"{COMPACT_CRON_ENV} must be a cron expression like {COMPACT_CRON_DEFAULT!r}, got {value!r}")
    return value


def last_data_sinks(sql_sinks: SqlSinksResource) -> list[SqlSinkConfig]:
    """The configured SQL sinks that keep last data, by dialect."""
    return sorted((c for c in sql_sinks.configs().values() if c.last_data_enabled), key=lambda c: c.dialect.value)


@op(description="Fold the deltas of each SQL sink's last-data state into its base buckets, then remove them.")
def compact_last_data_state(
    context: OpExecutionContext, spark: LazyPySparkResource, lake: LakeResource, sql_sinks: SqlSinksResource
) -> dict[str, dict[str, int]]:
    configs = last_data_sinks(sql_sinks)
    if not configs:
        context.log.info("no SQL sink keeps last data: nothing to compact")
        return {}
    session = spark.spark_session
    done: dict[str, dict[str, int]] = {}
    for cfg in configs:
        dialect = cfg.dialect
        state = LastDataState.of(lake, session, cfg)
        with state.lock():
            deltas, buckets = state.compact_pending()
        done[dialect.value] = {"deltas": deltas, "buckets": buckets}
        context.log.info(f"{dialect.value} ({state.folder}): {deltas} deltas folded into {buckets} base buckets")
        if deltas:
            context.log_event(
                AssetObservation(
                    asset_key=AssetKey("last_data"),
                    metadata={
                        f"{dialect.value}_state_deltas_compacted": deltas,
                        f"{dialect.value}_state_buckets_compacted": buckets,
                        f"{dialect.value}_state_folder": state.folder,
                    },
                )
            )
    context.add_output_metadata({f"{d}_{k}": v for d, counts in done.items() for k, v in counts.items()})
    return done


@job(
    name=JOB_NAME,
    tags={DERIVED_LANE: "1"},
    description="Compaction of the last-data state (the deltas last_data runs write), outside those runs. "
    "Safe to interrupt; on the schedule ngsi_last_data_compaction_schedule.",
)
def last_data_compaction_job() -> None:
    compact_last_data_state()


def open_compaction_runs(context: ScheduleEvaluationContext) -> int:
    return len(context.instance.get_run_ids(filters=RunsFilter(job_name=JOB_NAME, statuses=OPEN_RUN_STATUSES), limit=1))


def pending_deltas(lake: LakeResource, sql_sinks: SqlSinksResource) -> dict[str, int] | None:
    """Per SQL sink keeping last data, how many deltas its state holds (a listing, nothing written);
    None when no sink keeps last data."""
    configs = last_data_sinks(sql_sinks)
    if not configs:
        return None
    files = lake.files()
    return {
        c.dialect.value: len(
            files.list_partition_values(lake.folder_uri(DELTAS_DATASET, state_folder(c)), DELTA_COLUMN)
        )
        for c in configs
    }


@schedule(
    name="ngsi_last_data_compaction_schedule",
    job=last_data_compaction_job,
    cron_schedule=compact_cron(),
    default_status=DefaultScheduleStatus.RUNNING,
    description="Runs the last-data state compaction when there are deltas; skips a tick while the previous "
    "one is queued or running.",
)
def last_data_compaction_schedule(
    context: ScheduleEvaluationContext, lake: LakeResource, sql_sinks: SqlSinksResource
) -> RunRequest | SkipReason:
    if open_compaction_runs(context):
        return SkipReason("the previous compaction is still queued or running")
    pending = pending_deltas(lake, sql_sinks)
    if pending is None:
        return SkipReason("no SQL sink keeps last data")
    if not any(pending.values()):
        return SkipReason("no last-data delta to compact")
    return RunRequest(tags={f"ngsi/deltas-{d}": str(n) for d, n in sorted(pending.items())})
