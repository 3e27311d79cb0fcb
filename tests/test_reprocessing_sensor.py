"""The reprocessing sensor: backoff schedule per versioned_entities hour, cursor progress over ticks."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import (
    AssetMaterialization,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    Definitions,
    MetadataValue,
    RunRequest,
    SkipReason,
    build_sensor_context,
)

from ngsi_assets import sensors
from ngsi_assets.definitions import defs as project_defs
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.sensors import (
    ATTEMPT_TAG,
    REASON_TAG,
    Backlog,
    Observation,
    ReprocessCursor,
    ReprocessSettings,
    plan_reprocessing,
    reprocessing_sensor,
)

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DEFAULTS = ReprocessSettings()
P1, P2, P3 = "2026-03-01-09:00", "2026-03-01-10:00", "2026-03-01-11:00"


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the NGSI_REPROCESS_* variables they need; none leak in from the environment."""
    for field in ReprocessSettings.model_fields.values():
        monkeypatch.delenv(str(field.alias), raising=False)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _obs(storage_id: int, key: str, count: int | None) -> Observation:
    return Observation(storage_id, key, count)


# --- settings ---


def test_settings_defaults_and_environment() -> None:
    assert ReprocessSettings.from_env({}) == ReprocessSettings(
        initial_delay_s=60, backoff_factor=2, max_delay_s=3600, max_attempts=None, max_runs_per_tick=20
    )
    env = {
        "NGSI_REPROCESS_INITIAL_DELAY_S": "5",
        "NGSI_REPROCESS_BACKOFF_FACTOR": "3",
        "NGSI_REPROCESS_MAX_DELAY_S": " 100 ",
        "NGSI_REPROCESS_MAX_ATTEMPTS": "4",
        "NGSI_REPROCESS_MAX_RUNS_PER_TICK": "2",
        "NGSI_OTHER": "x",
    }
    assert ReprocessSettings.from_env(env) == ReprocessSettings(
        initial_delay_s=5, backoff_factor=3, max_delay_s=100, max_attempts=4, max_runs_per_tick=2
    )
    # An empty variable means "unset" (docker-compose passes FOO= through as empty).
    assert ReprocessSettings.from_env({"NGSI_REPROCESS_MAX_ATTEMPTS": ""}).max_attempts is None


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"NGSI_REPROCESS_INITIAL_DELAY_S": "0"}, "NGSI_REPROCESS_INITIAL_DELAY_S: Input should be greater than 0"),
        ({"NGSI_REPROCESS_INITIAL_DELAY_S": "soon"}, "NGSI_REPROCESS_INITIAL_DELAY_S: Input should be a valid number"),
        ({"NGSI_REPROCESS_BACKOFF_FACTOR": "0.5"}, "NGSI_REPROCESS_BACKOFF_FACTOR: Input should be greater than or"),
        ({"NGSI_REPROCESS_MAX_DELAY_S": "-1"}, "NGSI_REPROCESS_MAX_DELAY_S: Input should be greater than 0"),
        ({"NGSI_REPROCESS_MAX_ATTEMPTS": "0"}, "NGSI_REPROCESS_MAX_ATTEMPTS: Input should be greater than or equal"),
        ({"NGSI_REPROCESS_MAX_ATTEMPTS": "2.5"}, "NGSI_REPROCESS_MAX_ATTEMPTS: Input should be a valid integer"),
        ({"NGSI_REPROCESS_MAX_RUNS_PER_TICK": "0"}, "NGSI_REPROCESS_MAX_RUNS_PER_TICK: Input should be greater than"),
        (
            {"NGSI_REPROCESS_INITIAL_DELAY_S": "120", "NGSI_REPROCESS_MAX_DELAY_S": "60"},
            "NGSI_REPROCESS_MAX_DELAY_S (60) is below NGSI_REPROCESS_INITIAL_DELAY_S (120)",
        ),
    ],
)
def test_invalid_settings_name_the_variable(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match="invalid reprocessing settings") as err:
        ReprocessSettings.from_env(env)
    assert problem in str(err.value)


def test_delay_grows_then_stays_at_the_maximum() -> None:
    assert [DEFAULTS.delay(n).total_seconds() for n in range(9)] == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
    # Years of hourly retries: factor**n leaves float range, the delay stays at the maximum.
    assert DEFAULTS.delay(5000) == timedelta(seconds=3600)
    flat = ReprocessSettings(initial_delay_s=30, backoff_factor=1, max_delay_s=30)
    assert [flat.delay(n).total_seconds() for n in range(3)] == [30, 30, 30]


# --- the pure planner ---


def test_backoff_sequence_is_exact_and_capped() -> None:
    _, cursor, reason = plan_reprocessing(ReprocessCursor(), [_obs(7, P1, 3)], T0, DEFAULTS)
    assert cursor == ReprocessCursor(7, {P1: Backlog(0, T0, _at(60), 3, 7)})
    assert reason == "1 partitions awaiting reprocessing (3 messages), next due at 2026-03-01T12:01:00Z"
    now = T0
    gaps: list[float] = []
    run_keys: list[str] = []
    for attempt in range(1, 10):
        due = cursor.partitions[P1].due
        # One second early: nothing.
        early, same, _ = plan_reprocessing(cursor, [], due - timedelta(seconds=1), DEFAULTS)
        assert early == [] and same == cursor
        requests, cursor, reason = plan_reprocessing(cursor, [], due, DEFAULTS)
        assert reason is None
        assert [(r.partition_key, r.tags[ATTEMPT_TAG]) for r in requests] == [(P1, str(attempt))]
        assert (
            requests[0].tags[REASON_TAG] == "3 messages in status 1 (requires reprocessing) since 2026-03-01T12:00:00Z"
        )
        run_keys.append(requests[0].run_key)
        gaps.append((due - now).total_seconds())
        now = due
        assert cursor.partitions[P1].attempts == attempt
    assert gaps == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
    assert run_keys == [f"reprocess:{P1}:7:{n}" for n in range(1, 10)]
    assert cursor.partitions[P1].since == T0 and cursor.after == 7


def test_zero_drops_the_partition_and_a_new_episode_gets_new_run_keys() -> None:
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 2), _obs(2, P2, 1)], T0, DEFAULTS)
    requests, cursor, _ = plan_reprocessing(cursor, [], _at(60), DEFAULTS)
    assert [r.run_key for r in requests] == [f"reprocess:{P1}:1:1", f"reprocess:{P2}:2:1"]
    # The retry of P1 resolved every link; P2 still has one message waiting.
    requests, cursor, reason = plan_reprocessing(cursor, [_obs(3, P1, 0), _obs(4, P2, 1)], _at(90), DEFAULTS)
    assert requests == [] and sorted(cursor.partitions) == [P2] and cursor.after == 4
    assert reason == "1 partitions awaiting reprocessing (1 messages), next due at 2026-03-01T12:03:00Z"
    # Later, new messages of P1 miss a parent again: a fresh schedule, and run keys Dagster has not seen.
    requests, cursor, _ = plan_reprocessing(cursor, [_obs(9, P1, 4)], _at(1000), DEFAULTS)
    assert [r.run_key for r in requests] == [f"reprocess:{P2}:2:2"]  # due since 12:03
    assert cursor.partitions[P1] == Backlog(0, _at(1000), _at(1060), 4, 9)
    requests, cursor, _ = plan_reprocessing(cursor, [], _at(1060), DEFAULTS)
    assert [r.run_key for r in requests] == [f"reprocess:{P1}:9:1"]
    # All clear.
    _, cursor, reason = plan_reprocessing(cursor, [_obs(10, P2, 0), _obs(11, P1, 0)], _at(1100), DEFAULTS)
    assert cursor == ReprocessCursor(11, {})
    assert reason == "no partition of versioned_entities has messages requiring reprocessing"


def test_newest_observation_of_a_partition_wins() -> None:
    # A backfill run and a landing run both reported P1 since the last tick: storage order decides.
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(5, P1, 0), _obs(3, P1, 6), _obs(4, P2, 2)], T0, DEFAULTS)
    assert sorted(cursor.partitions) == [P2] and cursor.after == 5
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(5, P1, 6), _obs(3, P1, 0)], T0, DEFAULTS)
    assert cursor.partitions[P1] == Backlog(0, T0, _at(60), 6, 5)


def test_other_materializations_keep_the_schedule() -> None:
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 3)], T0, DEFAULTS)
    _, cursor, _ = plan_reprocessing(cursor, [], _at(60), DEFAULTS)
    assert cursor.partitions[P1].due == _at(180)
    # Landing runs rematerialize P1 every 30 s with more unresolved messages: no hot loop, no postponing.
    for i, t in enumerate(range(90, 180, 30)):
        requests, cursor, _ = plan_reprocessing(cursor, [_obs(10 + i, P1, 4 + i)], _at(t), DEFAULTS)
        assert requests == []
        assert cursor.partitions[P1] == Backlog(1, T0, _at(180), 4 + i, 1)
    requests, cursor, _ = plan_reprocessing(cursor, [], _at(180), DEFAULTS)
    assert [r.run_key for r in requests] == [f"reprocess:{P1}:1:2"]
    assert requests[0].tags[REASON_TAG].startswith("6 messages in status 1")


def test_max_attempts_gives_up_until_the_partition_clears() -> None:
    settings = ReprocessSettings(max_attempts=2)
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 3), _obs(2, P2, 1)], T0, settings)
    assert len(plan_reprocessing(cursor, [], _at(60), settings)[0]) == 2
    _, cursor, _ = plan_reprocessing(cursor, [], _at(60), settings)
    requests, cursor, _ = plan_reprocessing(cursor, [], _at(180), settings)
    assert [r.tags[ATTEMPT_TAG] for r in requests] == ["2", "2"]
    # P2's second attempt resolved it; P1's did not, and it has had its two attempts.
    requests, cursor, reason = plan_reprocessing(cursor, [_obs(3, P2, 0), _obs(4, P1, 3)], _at(420), settings)
    assert requests == []
    assert cursor.partitions == {P1: Backlog(2, T0, _at(420), 3, 1, gave_up=True)}
    assert reason == "0 partitions awaiting reprocessing (0 messages); 1 given up after 2 attempts"
    assert plan_reprocessing(cursor, [_obs(5, P1, 2)], _at(10_000), settings)[0] == []
    _, cursor, _ = plan_reprocessing(cursor, [_obs(6, P1, 0)], _at(10_001), settings)
    assert cursor.partitions == {}


def test_runs_per_tick_are_capped_oldest_due_first() -> None:
    settings = ReprocessSettings(max_runs_per_tick=20)
    keys = [(datetime(2026, 3, 1, tzinfo=UTC) + timedelta(hours=h)).strftime("%Y-%m-%d-%H:00") for h in range(25)]
    cursor = ReprocessCursor()
    # Partitions seen in reverse order: the later-seen (older hours) are due later.
    for i, key in enumerate(reversed(keys)):
        _, cursor, _ = plan_reprocessing(cursor, [_obs(i + 1, key, 1)], _at(i), settings)
    requests, cursor, reason = plan_reprocessing(cursor, [], _at(3600), settings)
    assert reason is None
    assert [r.partition_key for r in requests] == list(reversed(keys))[:20]
    requests, cursor, _ = plan_reprocessing(cursor, [], _at(3630), settings)
    assert [r.partition_key for r in requests] == list(reversed(keys))[20:]
    assert {b.attempts for b in cursor.partitions.values()} == {1}


def test_unfinished_runs_of_the_same_hour_are_waited_for() -> None:
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 3), _obs(2, P2, 1), _obs(3, P3, 1)], T0, DEFAULTS)
    busy = [(P1, P1), ("2026-03-01-10:00", "2026-03-01-10:00")]
    requests, waiting, reason = plan_reprocessing(cursor, [], _at(60), DEFAULTS, busy=busy)
    assert [r.partition_key for r in requests] == [P3]
    assert waiting.partitions[P1] == cursor.partitions[P1] and waiting.partitions[P2] == cursor.partitions[P2]
    # A backfill over a range of hours covers P1 and P2, and P3's retry is already queued.
    requests, _, reason = plan_reprocessing(
        waiting, [], _at(70), DEFAULTS, busy=[("2026-03-01-08:00", "2026-03-01-10:00"), (P3, P3)]
    )
    assert requests == []
    assert reason == (
        "3 partitions awaiting reprocessing (5 messages), next due at 2026-03-01T12:03:00Z; "
        "2 due but waiting for an unfinished run of the same hour"
    )


def test_no_runs_while_the_event_log_is_being_caught_up() -> None:
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 3)], T0, DEFAULTS)
    # The next page holds an older P1 report and a P2 report; more pages follow.
    requests, cursor, reason = plan_reprocessing(cursor, [_obs(2, P2, 1)], _at(600), DEFAULTS, caught_up=False)
    assert requests == [] and cursor.after == 2 and sorted(cursor.partitions) == [P1, P2]
    assert reason == (
        "reading the event log (up to storage id 2); 2 partitions awaiting reprocessing (4 messages), "
        "next due at 2026-03-01T12:11:00Z"
    )
    requests, _, _ = plan_reprocessing(cursor, [_obs(3, P2, 0)], _at(600), DEFAULTS)
    assert [r.partition_key for r in requests] == [P1]


def test_materializations_without_a_count_only_move_the_cursor() -> None:
    _, cursor, _ = plan_reprocessing(ReprocessCursor(), [_obs(1, P1, 3)], T0, DEFAULTS)
    _, after, _ = plan_reprocessing(cursor, [_obs(2, P1, None), _obs(3, P2, None)], _at(10), DEFAULTS)
    assert after == ReprocessCursor(3, cursor.partitions)


def test_the_cursor_round_trips_through_json_and_planning_resumes_identically() -> None:
    settings = ReprocessSettings(max_attempts=3)
    obs_by_tick: list[Sequence[Observation]] = [
        [_obs(1, P1, 3), _obs(2, P2, 2)],
        [],
        [_obs(3, P2, 0), _obs(4, P3, 1)],
        [_obs(5, P1, 3)],
        [],
        [],
    ]
    live = restarted = ReprocessCursor()
    for tick, observations in enumerate(obs_by_tick):
        now = _at(tick * 200)
        live_out = plan_reprocessing(live, observations, now, settings)
        text = restarted.to_json()
        json.loads(text)  # valid JSON, nothing but plain values
        restarted_out = plan_reprocessing(ReprocessCursor.from_json(text), observations, now, settings)
        assert restarted_out == live_out
        live, restarted = live_out[1], ReprocessCursor.from_json(restarted_out[1].to_json())
        assert restarted == live
    assert live.partitions[P1].attempts == 3 and P2 not in live.partitions
    assert ReprocessCursor.from_json(None) == ReprocessCursor.from_json("") == ReprocessCursor()


# --- the sensor against a real Dagster instance ---


def _defs() -> Definitions:
    """The project's definitions: the real versioned_entities asset, the job and the sensor."""
    return project_defs


def test_definitions_load_with_the_job_and_sensor() -> None:
    defs = _defs()
    Definitions.validate_loadable(defs)
    job = defs.resolve_job_def("ngsi_reprocess_job")
    assert job.partitions_def == hourly_partitions
    assert sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys) == [
        "transaction_history",
        "versioned_entities",
    ]
    sensor = defs.resolve_sensor_def("reprocessing_sensor")
    assert sensor.job_name == "ngsi_reprocess_job" and sensor.minimum_interval_seconds == 30


def _report(instance: DagsterInstance, key: str, count: object, examples: list[str] | None = None) -> None:
    metadata: dict[str, object] = {"messages_requiring_reprocessing": count}
    if examples is not None:
        metadata["reprocessing_examples"] = MetadataValue.json(examples)
    instance.report_runless_asset_event(
        AssetMaterialization(asset_key="versioned_entities", partition=key, metadata=metadata)  # type: ignore[arg-type]
    )


class Ticker:
    """Evaluates the sensor as the daemon would, carrying the cursor from tick to tick."""

    def __init__(self, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
        self.instance = instance
        self.cursor: str | None = None
        self.now = T0
        monkeypatch.setattr(sensors, "utc_now", lambda: self.now)

    def tick(self, at: float) -> tuple[list[RunRequest], str | None]:
        self.now = _at(at)
        ctx = build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=_defs())
        data = reprocessing_sensor.evaluate_tick(ctx)
        self.cursor = data.cursor
        return list(data.run_requests or []), data.skip_message


def _scenario(instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Ticker(instance, monkeypatch)
    assert clock.tick(0) == ([], "no partition of versioned_entities has messages requiring reprocessing")
    # A backfill materializes three hours at once: two leave messages waiting for their parent.
    _report(instance, P1, 2, ["m1", "m2"])
    _report(instance, P2, 0, [])
    _report(instance, P3, MetadataValue.int(1), ["m9"])
    runs, skip = clock.tick(1)
    assert runs == [] and skip == "2 partitions awaiting reprocessing (3 messages), next due at 2026-03-01T12:01:01Z"
    assert clock.tick(30)[0] == []
    runs, skip = clock.tick(61)
    assert skip is None
    assert [(r.partition_key, r.run_key, r.tags[ATTEMPT_TAG]) for r in runs] == [
        (P1, f"reprocess:{P1}:1:1", "1"),
        (P3, f"reprocess:{P3}:3:1", "1"),
    ]
    assert runs[0].tags[REASON_TAG] == "2 messages in status 1 (requires reprocessing) since 2026-03-01T12:00:01Z"
    # The retry of P3 is still running when it is due again: the sensor waits for it.
    queued = DagsterRun(
        job_name="ngsi_reprocess_job", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": P3},
    )  # fmt: skip
    instance.add_run(queued)
    # The retries ran: P1's parent arrived meanwhile, P3's did not.
    _report(instance, P1, 0, [])
    runs, skip = clock.tick(400)
    assert runs == [] and skip == (
        "1 partitions awaiting reprocessing (1 messages); 1 due but waiting for an unfinished run of the same hour"
    )
    instance.report_run_failed(queued)  # ...and then fails: no materialization from it
    _report(instance, P3, 1, ["m9"])
    runs, _ = clock.tick(401)
    assert [(r.partition_key, r.run_key) for r in runs] == [(P3, f"reprocess:{P3}:3:2")]
    state = json.loads(clock.cursor or "")
    assert sorted(state["partitions"]) == [P3]
    assert state["partitions"][P3]["attempts"] == 2 and state["partitions"][P3]["due"] == _at(401 + 240).isoformat()
    # A materialization with no usable count is passed over; the cursor still moves past it.
    _report(instance, P2, "many")
    runs, skip = clock.tick(402)
    assert runs == [] and skip == "1 partitions awaiting reprocessing (1 messages), next due at 2026-03-01T12:10:41Z"
    after = json.loads(clock.cursor or "")["after"]
    assert after > state["after"]
    # No new events: the next tick reads nothing and changes nothing (restart-safe: only the cursor).
    cursor_before = clock.cursor
    assert clock.tick(403)[0] == [] and clock.cursor == cursor_before
    _report(instance, P3, 0)
    assert clock.tick(404) == ([], "no partition of versioned_entities has messages requiring reprocessing")
    assert json.loads(clock.cursor or "")["partitions"] == {}


def test_sensor_ticks_on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        _scenario(instance, monkeypatch)


@pytest.mark.integration
def test_sensor_ticks_on_dagster_postgres(
    tmp_path: Path, postgres_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-postgres.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_PG_URL", postgres_db_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with DagsterInstance.from_config(str(home)) as instance:
        _scenario(instance, monkeypatch)


def test_sensor_reads_a_long_history_over_several_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sensors, "EVENT_PAGE_SIZE", 2)
    monkeypatch.setattr(sensors, "EVENT_PAGES_PER_TICK", 2)
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        for key, count in [(P1, 1), (P2, 2), (P1, 0), (P3, 1), (P2, 5), (P3, 3)]:
            _report(instance, key, count)
        clock = Ticker(instance, monkeypatch)
        runs, skip = clock.tick(1000)
        assert runs == [] and (skip or "").startswith("reading the event log")
        runs, skip = clock.tick(1001)  # the last two events, and nothing after them
        assert (
            runs == [] and skip == "2 partitions awaiting reprocessing (8 messages), next due at 2026-03-01T12:17:40Z"
        )
        assert clock.tick(1059)[0] == []
        runs, _ = clock.tick(1060)
        assert [(r.partition_key, r.run_key) for r in runs] == [
            (P2, f"reprocess:{P2}:2:1"),
            (P3, f"reprocess:{P3}:4:1"),
        ]


def test_invalid_settings_fail_the_tick_with_the_variable_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NGSI_REPROCESS_BACKOFF_FACTOR", "fast")
    with (
        DagsterInstance.local_temp(str(tmp_path)) as instance,
        pytest.raises(Exception, match="NGSI_REPROCESS_BACKOFF_FACTOR: Input should be a valid number"),
    ):
        Ticker(instance, monkeypatch).tick(0)


def test_sensor_settings_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGSI_REPROCESS_INITIAL_DELAY_S", "5")
    monkeypatch.setenv("NGSI_REPROCESS_MAX_RUNS_PER_TICK", "1")
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        _report(instance, P1, 1)
        _report(instance, P2, 1)
        clock = Ticker(instance, monkeypatch)
        clock.tick(0)
        assert [r.partition_key for r in clock.tick(5)[0]] == [P1]
        assert [r.partition_key for r in clock.tick(6)[0]] == [P2]
        assert clock.tick(7) == (
            [],
            "2 partitions awaiting reprocessing (2 messages), next due at 2026-03-01T12:00:15Z",
        )


def test_sensor_yields_a_skip_reason_when_called_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        Ticker(instance, monkeypatch)
        ctx = build_sensor_context(instance=instance)
        out = list(reprocessing_sensor(ctx))
        assert len(out) == 1 and isinstance(out[0], SkipReason)
        assert ctx.cursor == ReprocessCursor().to_json()
