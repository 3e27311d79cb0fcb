"""The last-data state compaction job: it folds every delta into the base and leaves the state as readers
saw it; a rerun finds nothing; a compaction killed part way is finished by the next; its schedule never
queues a second run; a bad cron is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_schedule_context
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.compaction import (
    COMPACT_CRON_ENV,
    compact_cron,
    last_data_compaction_job,
    last_data_compaction_schedule,
)
from ngsi_assets.last_data_state import COMPACT_AFTER_ENV, DELTA_COLUMN, DELTAS_DATASET, STATE_DATASET, LastDataState
from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.transforms.sql_sinks import LAST_DATA_STATE, last_data_records, merge_last_data_state
from resources.lake import LakeResource
from resources.sql_sinks import SqlSinksResource
from tests.assets.test_last_data_state import _run
from tests.transforms.test_sql_sinks import T0, _state_rows, ev, events

SINKS = SqlSinksResource(sinks={"postgresql": {"url": "postgresql://u@127.0.0.1:9/db", "last_data_mode": "upsert"}})
BATCHES = [
    [ev("m00", "car1", "speed", "10", T0), ev("m00", "car1", "fuel", "90", T0)],
    [ev("m01", "car2", "speed", "20", T0 + 1)],
    [ev("m02", "car1", "speed", "11", T0 + 2), ev("m02", "car3", "speed", "5", T0 + 2, idx=1)],
]


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LakeResource:
    """An empty lake, with runs that never compact by themselves."""
    monkeypatch.setenv(COMPACT_AFTER_ENV, "100")
    return LakeResource(root=str(tmp_path / "lake"))


def _state(spark: SparkSession, lake: LakeResource) -> LastDataState:
    return LastDataState.of(lake, spark, SINKS.configs()[Dialect.POSTGRESQL])


def _deltas(state: LastDataState) -> list[str]:
    return state.lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder)


def _merged(state: LastDataState) -> list[tuple]:
    stored = state.stored(None, _deltas(state))
    assert stored is not None
    return _state_rows(merge_last_data_state(stored, state.cfg))


def _with_deltas(spark: SparkSession, lake: LakeResource) -> LastDataState:
    state = _state(spark, lake)
    for i, batch in enumerate(BATCHES):
        records, _ = last_data_records(events(spark, batch), state.cfg)
        _run(state, records.select(*LAST_DATA_STATE.fieldNames()), f"r{i}")
    return state


def _compact(lake: LakeResource, sinks: SqlSinksResource = SINKS) -> Any:
    resources = {"spark": LazyPySparkResource(spark_config={}), "lake": lake, "sql_sinks": sinks}
    return last_data_compaction_job.execute_in_process(resources=resources, instance=DagsterInstance.ephemeral())


@pytest.mark.spark
def test_the_job_folds_every_delta_and_leaves_the_state_as_it_was(spark: SparkSession, lake: LakeResource) -> None:
    state = _with_deltas(spark, lake)
    assert _deltas(state) == ["ir0", "ir1", "ir2"]
    before = _merged(state)
    assert len(before) == 3

    result = _compact(lake)
    assert result.success
    base = lake.folder_values(STATE_DATASET, "bucket", state.folder)
    assert result.output_for_node("compact_last_data_state") == {"postgresql": {"deltas": 3, "buckets": len(base)}}
    assert _deltas(state) == []
    assert base
    assert _merged(state) == before
    observed = [
        e.asset_observation_data.asset_observation
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert [o.asset_key.path for o in observed] == [["last_data"]]
    assert observed[0].metadata["postgresql_state_deltas_compacted"].value == 3

    again = _compact(lake)
    assert again.output_for_node("compact_last_data_state") == {"postgresql": {"deltas": 0, "buckets": 0}}
    assert _merged(state) == before


@pytest.mark.spark
def test_a_compaction_killed_part_way_is_finished_by_the_next(
    spark: SparkSession, lake: LakeResource, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _with_deltas(spark, lake)
    before = _merged(state)

    def killed(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt("killed after the base buckets were replaced")

    with monkeypatch.context() as mp:
        mp.setattr(LakeResource, "remove_folders", killed)
        with pytest.raises(KeyboardInterrupt):
            _compact(lake)
    assert _deltas(state) == ["ir0", "ir1", "ir2"]  # folded into the base, and still there
    assert _merged(state) == before
    done = _compact(lake).output_for_node("compact_last_data_state")
    base = lake.folder_values(STATE_DATASET, "bucket", state.folder)
    assert done == {"postgresql": {"deltas": 3, "buckets": len(base)}}
    assert _deltas(state) == []
    assert _merged(state) == before


def test_without_a_last_data_sink_the_job_does_nothing(lake: LakeResource) -> None:
    result = _compact(lake, SqlSinksResource(sinks={}))
    assert result.success
    assert result.output_for_node("compact_last_data_state") == {}


def _tick(instance: DagsterInstance, lake: LakeResource, sinks: SqlSinksResource = SINKS) -> RunRequest | SkipReason:
    # Closed here: the context enters an instance of its own, which must be left before the test's is.
    with build_schedule_context(instance=instance, resources={"lake": lake, "sql_sinks": sinks}) as context:
        return last_data_compaction_schedule(context)


@pytest.mark.spark
def test_the_schedule_asks_for_a_run_only_when_deltas_wait_and_never_queues_two(
    spark: SparkSession, lake: LakeResource, tmp_path: Path
) -> None:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        none = _tick(instance, lake, SqlSinksResource(sinks={}))
        assert isinstance(none, SkipReason) and none.skip_message == "no SQL sink keeps last data"
        idle = _tick(instance, lake)
        assert isinstance(idle, SkipReason) and idle.skip_message == "no last-data delta to compact"
        _with_deltas(spark, lake)
        request = _tick(instance, lake)
        assert isinstance(request, RunRequest)
        assert request.tags == {"ngsi/deltas-postgresql": "3"}
        instance.create_run_for_job(job_def=last_data_compaction_job)  # not started yet: open
        skipped = _tick(instance, lake)
        assert isinstance(skipped, SkipReason)
        assert skipped.skip_message == "the previous compaction is still queued or running"


def test_the_cron_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPACT_CRON_ENV, raising=False)
    assert compact_cron() == "*/5 * * * *"
    monkeypatch.setenv(COMPACT_CRON_ENV, "*/2 * * * *")
    assert compact_cron() == "*/2 * * * *"
    monkeypatch.setenv(COMPACT_CRON_ENV, "every minute")
    with pytest.raises(ValueError, match=f"{COMPACT_CRON_ENV} must be a cron expression.*'every minute'"):
        compact_cron()
