"""The landing sensor: cursor progress, no missed and no repeated data across ticks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

from ngsi_assets.ingest.landing import LandingWriter, SegmentInfo
from ngsi_assets.ngsi.envelope import Envelope, hour_dir, partition_key
from ngsi_assets.sensors import LandingCursor, landing_sensor, plan_landing_runs
from resources.landing import LandingZoneResource

BASE = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)


def _seg(hour: int, name: str, size: int) -> SegmentInfo:
    ms = int((BASE + timedelta(hours=hour)).timestamp() * 1000)
    return SegmentInfo(Path(f"/l/{hour_dir(ms)}/{name}.jsonl"), hour_dir(ms), partition_key(ms), size)


def _key(hour: int) -> str:
    return (BASE + timedelta(hours=hour)).strftime("%Y-%m-%d-%H:00")


def test_first_tick_requests_every_hour_then_nothing() -> None:
    segs = [_seg(0, "a", 10), _seg(0, "b", 5), _seg(1, "c", 7)]
    requests, cursor = plan_landing_runs(segs, LandingCursor())
    assert requests == [(_key(0), f"{_key(0)}@2:15"), (_key(1), f"{_key(1)}@1:7")]
    again, cursor2 = plan_landing_runs(segs, LandingCursor.from_json(cursor.to_json()))
    assert again == [] and cursor2 == cursor


def test_growth_and_new_segments_request_only_their_hour() -> None:
    _, cursor = plan_landing_runs([_seg(0, "a", 10), _seg(1, "c", 7)], LandingCursor())
    requests, cursor = plan_landing_runs([_seg(0, "a", 10), _seg(1, "c", 9)], cursor)
    assert requests == [(_key(1), f"{_key(1)}@1:9")]
    requests, cursor = plan_landing_runs([_seg(0, "a", 10), _seg(1, "c", 9), _seg(1, "d", 1)], cursor)
    assert requests == [(_key(1), f"{_key(1)}@2:10")]
    requests, _ = plan_landing_runs([_seg(0, "a", 10), _seg(1, "c", 9), _seg(1, "d", 1), _seg(2, "e", 3)], cursor)
    assert requests == [(_key(2), f"{_key(2)}@1:3")]


def test_old_hours_are_sealed_and_the_cursor_stays_small() -> None:
    segs = [_seg(h, f"s{h}", 100 + h) for h in range(200)]
    requests, cursor = plan_landing_runs(segs, LandingCursor(), lookback_hours=48)
    assert len(requests) == 200
    assert len(cursor.hours) == 49  # hours 151..199
    assert cursor.sealed_before == _key(151)
    assert cursor.sealed == f"151:{sum(100 + h for h in range(151))}"
    assert plan_landing_runs(segs, cursor, lookback_hours=48)[0] == []


def test_data_appearing_in_a_sealed_hour_is_not_missed() -> None:
    segs = [_seg(h, f"s{h}", 100) for h in range(100)]
    _, cursor = plan_landing_runs(segs, LandingCursor(), lookback_hours=10)
    restored = [*segs, _seg(3, "restored", 50)]
    requests, cursor2 = plan_landing_runs(restored, cursor, lookback_hours=10)
    # Every sealed hour is asked for again, but only hour 3's run key is new: Dagster launches
    # a run key once, so only hour 3 runs.
    assert (_key(3), f"{_key(3)}@2:150") in requests
    unchanged = {rk for _, rk in requests} - {f"{_key(3)}@2:150"}
    assert unchanged == {f"{_key(h)}@1:100" for h in range(89) if h != 3}
    assert plan_landing_runs(restored, cursor2, lookback_hours=10)[0] == []


def test_hours_leaving_the_window_between_ticks_are_not_missed() -> None:
    _, cursor = plan_landing_runs([_seg(0, "a", 10)], LandingCursor(), lookback_hours=2)
    # Hour 0 grows, and in the same tick hour 5 appears, pushing hour 0 out of the window.
    requests, cursor = plan_landing_runs([_seg(0, "a", 20), _seg(5, "b", 1)], cursor, lookback_hours=2)
    assert requests == [(_key(0), f"{_key(0)}@1:20"), (_key(5), f"{_key(5)}@1:1")]
    assert plan_landing_runs([_seg(0, "a", 20), _seg(5, "b", 1)], cursor, lookback_hours=2)[0] == []


def _write(writer: LandingWriter, hour: int, n: int, start: int) -> None:
    ms = int((BASE + timedelta(hours=hour, minutes=1)).timestamp() * 1000)
    writer.append_many_blocking(
        Envelope(f"m{start + i}", ms + i, "message", "datahub", "default", "/", None, None, None, "test",
                 json.dumps({"entity": "e", "timestamp": "2026-03-01T00:00:00", "data": [{"i": start + i}]}).encode())
        for i in range(n)
    )  # fmt: skip


def test_sensor_ticks_with_a_live_writer(tmp_path: Path) -> None:
    landing = LandingZoneResource(root=str(tmp_path))
    instance = DagsterInstance.ephemeral()
    cursor: str | None = None
    seen_run_keys: list[str] = []
    requested_hours: set[str] = set()

    def tick() -> list[RunRequest]:
        nonlocal cursor
        ctx = build_sensor_context(cursor=cursor, instance=instance, resources={"landing": landing})
        out = list(landing_sensor(ctx))
        cursor = ctx.cursor
        runs = [r for r in out if isinstance(r, RunRequest)]
        assert runs or any(isinstance(r, SkipReason) for r in out)
        return runs

    assert tick() == []
    with LandingWriter(tmp_path) as w1:
        _write(w1, 0, 5, 0)
        _write(w1, 1, 3, 100)
    runs = tick()
    assert sorted(r.partition_key for r in runs) == [_key(0), _key(1)]
    seen_run_keys += [r.run_key for r in runs]
    requested_hours |= {r.partition_key for r in runs}
    assert tick() == []  # nothing new: no repeated runs
    with LandingWriter(tmp_path) as w2:  # a restarted receiver writes a new segment
        _write(w2, 1, 2, 200)
        _write(w2, 2, 1, 300)
    runs = tick()
    assert sorted(r.partition_key for r in runs) == [_key(1), _key(2)]
    seen_run_keys += [r.run_key for r in runs]
    requested_hours |= {r.partition_key for r in runs}
    assert tick() == []
    assert len(seen_run_keys) == len(set(seen_run_keys))
    # Every hour that holds data was requested, and its last request saw all of its bytes.
    segs = landing.segments()
    assert requested_hours == {s.partition_key for s in segs}
    state = json.loads(cursor)
    for hour in requested_hours:
        mine = [s for s in segs if s.partition_key == hour]
        assert state["hours"][hour] == f"{len(mine)}:{sum(s.size for s in mine)}"


def test_an_hour_with_a_waiting_run_gets_no_second_run() -> None:
    _, cursor = plan_landing_runs([_seg(0, "a", 10), _seg(1, "c", 7)], LandingCursor())
    grown = [_seg(0, "a", 10), _seg(1, "c", 9), _seg(2, "d", 1)]
    requests, after = plan_landing_runs(grown, cursor, waiting={_key(1)})
    # Hour 1's waiting run will read the grown hour when it starts; hour 2 is new.
    assert requests == [(_key(2), f"{_key(2)}@1:1")]
    assert after.hours[_key(1)] == "1:9"
    # Once that run is executing, growth gets one new run again.
    requests, _ = plan_landing_runs([*grown[:1], _seg(1, "c", 12), grown[2]], after)
    assert requests == [(_key(1), f"{_key(1)}@1:12")]


def test_sensor_under_steady_traffic_keeps_one_waiting_run_per_hour(tmp_path: Path) -> None:
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    landing = LandingZoneResource(root=str(tmp_path))
    instance = DagsterInstance.ephemeral()
    cursor: str | None = None

    def tick() -> list[RunRequest | SkipReason]:
        nonlocal cursor
        ctx = build_sensor_context(cursor=cursor, instance=instance, resources={"landing": landing})
        out = list(landing_sensor(ctx))
        cursor = ctx.cursor
        return out

    def queue(run_request: RunRequest, status: DagsterRunStatus) -> DagsterRun:
        run = DagsterRun(job_name="ngsi_ingest_job", run_id=f"r{len(instance.get_runs())}", status=status,
                         tags={"dagster/partition": run_request.partition_key})  # fmt: skip
        instance.add_run(run)
        return run

    with LandingWriter(tmp_path) as w:
        _write(w, 0, 5, 0)
        (first,) = [r for r in tick() if isinstance(r, RunRequest)]
        run = queue(first, DagsterRunStatus.NOT_STARTED)  # QUEUED needs a code location
        for i in range(3):  # traffic keeps coming while the run waits: no new run, the cursor moves on
            _write(w, 0, 2, 100 + 10 * i)
            out = tick()
            assert not [r for r in out if isinstance(r, RunRequest)]
            assert "left to the runs waiting" in out[0].skip_message
        instance.delete_run(run.run_id)  # the run starts executing
        queue(first, DagsterRunStatus.STARTED)
        assert tick()[0].skip_message == "no new landing data"  # the started run read all of it
        _write(w, 0, 1, 200)
        (second,) = [r for r in tick() if isinstance(r, RunRequest)]
        assert second.partition_key == first.partition_key
