"""The last-data state as base buckets plus a delta per run: whatever runs come in whatever order, with
reruns and compactions at any point, every run sees its keys' state as one merge of everything so far,
and the state ends as one merge of all the records. A compaction killed part way is finished by the
next run."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.last_data_state import (
    COMPACT_AFTER_ENV,
    DELTA_COLUMN,
    DELTAS_DATASET,
    STATE_DATASET,
    LastDataState,
    compact_after,
    delta_id,
)
from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.transforms.sql_sinks import LAST_DATA_STATE, last_data_records, merge_last_data_state
from resources.lake import LakeResource
from tests.transforms.test_sql_sinks import _record_sets, _state_rows, cfg, events

pytestmark = pytest.mark.spark

CFG = cfg(Dialect.POSTGRESQL, last_data_mode="upsert")


def _records(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    records, _ = last_data_records(events(spark, rows), CFG)
    return records.select(*LAST_DATA_STATE.fieldNames())


def _run(state: LastDataState, records: DataFrame, name: str) -> DataFrame:
    """What the last_data asset does with one run's records: its delta, then its keys' state."""
    touched = sorted(int(r["bucket"]) for r in records.select("bucket").distinct().collect())
    with state.lock():
        return state.merge_in(records, touched, delta_id(["2026-03-01-10:00"], name)).state


def _everything(state: LastDataState) -> DataFrame:
    """The whole state as a reader sees it: the base and every delta, merged."""
    stored = state.stored(None, state.lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder))
    assert stored is not None
    return merge_last_data_state(stored, CFG)


def _key(row: tuple) -> tuple:
    d = dict(row)
    return d["database"], d["db"], d["table"], d["entityId"]


def _message_part(rows: list[tuple[Any, ...]], parts: list[int], p: int) -> list[tuple[Any, ...]]:
    return [r for r in rows if parts[int(r[14][1:])] == p]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_record_sets(), seed=st.integers(0, 2**16), threshold=st.sampled_from([1, 2, 3, 16]))
def test_runs_in_any_order_with_reruns_and_compactions_equal_one_merge(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, data: tuple, seed: int, threshold: int
) -> None:
    rows, parts = data
    rng = random.Random(seed)
    lake = LakeResource(root=str(tmp_path_factory.mktemp("lake")))
    state = LastDataState(lake, spark, CFG, "postgresql-test")
    runs = sorted(set(parts))
    rng.shuffle(runs)
    runs += rng.sample(runs, k=min(2, len(runs)))  # reruns of earlier runs, later on
    seen: list[tuple[Any, ...]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(COMPACT_AFTER_ENV, str(threshold))
        for p in runs:
            mine = _message_part(rows, parts, p)
            seen += [r for r in mine if r not in seen]
            got = _run(state, _records(spark, mine), f"run{p}")
            # The run's keys, as one merge of every record so far of those keys.
            expected = merge_last_data_state(_records(spark, seen), CFG)
            keys = {_key(r) for r in _state_rows(_records(spark, mine))}
            expected_rows = [r for r in _state_rows(expected) if _key(r) in keys]
            assert _state_rows(got) == expected_rows
            assert len(lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder)) < threshold
    assert _state_rows(_everything(state)) == _state_rows(merge_last_data_state(_records(spark, rows), CFG))


def test_a_compaction_killed_before_its_deltas_are_removed_is_finished_by_the_next_run(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.transforms.test_sql_sinks import T0, ev

    monkeypatch.setenv(COMPACT_AFTER_ENV, "3")
    assert compact_after() == 3
    lake = LakeResource(root=str(tmp_path / "lake"))
    state = LastDataState(lake, spark, CFG, "postgresql-test")
    batches = [
        [ev("m00", "car1", "speed", "10", T0), ev("m00", "car1", "fuel", "90", T0)],
        [ev("m01", "car2", "speed", "20", T0 + 1)],
        [ev("m02", "car1", "speed", "11", T0 + 2)],
        [ev("m03", "car2", "speed", "21", T0 + 3, alteration="entityDelete")],
    ]
    _run(state, _records(spark, batches[0]), "a")
    _run(state, _records(spark, batches[1]), "b")
    assert lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder) == ["ia", "ib"]
    assert lake.folder_values(STATE_DATASET, "bucket", state.folder) == []

    def killed(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt("killed after the base buckets were replaced")

    with monkeypatch.context() as mp:
        mp.setattr(LakeResource, "remove_folders", killed)
        with pytest.raises(KeyboardInterrupt):
            _run(state, _records(spark, batches[2]), "c")
    # The base holds the three deltas, which are all still there.
    assert lake.folder_values(STATE_DATASET, "bucket", state.folder) != []
    assert lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder) == ["ia", "ib", "ic"]
    got = _run(state, _records(spark, batches[3]), "d")
    assert lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, state.folder) == []
    everything = [r for b in batches for r in b]
    whole = merge_last_data_state(_records(spark, everything), CFG)
    assert _state_rows(_everything(state)) == _state_rows(whole)
    car2 = [r for r in _state_rows(whole) if dict(r)["entityId"] == "car2"]
    assert _state_rows(got) == car2
    # Deleted: its tombstone is the newest record, and no attribute survives it.
    assert dict(car2[0])["attrs"] == []
