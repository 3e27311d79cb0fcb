"""The landing sensor in continuous mode: increments that cover every landed byte exactly once, a
bounded queue, derived runs per hour, sealed hours, and repairs of failed increments."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

from ngsi_assets.increments import (
    EXTENDS_TAG,
    INCREMENT_TAG,
    NEW_INCREMENTS_TAG,
    SIDE_BY_SIDE_TAG,
    Increment,
    side_by_side_width,
)
from ngsi_assets.ingest.landing import LandingWriter, SegmentInfo
from ngsi_assets.ngsi.envelope import Envelope, hour_dir, partition_key
from ngsi_assets.sensors import (
    DERIVED_LANE,
    INGEST_LANE,
    REPAIR_TAG,
    ContinuousSettings,
    LandingCursor,
    OpenRuns,
    landing_sensor,
    open_landing_runs,
    plan_landing_runs,
    repair_requests,
)
from resources.landing import LandingZoneResource
from tests.support.runs import finished_run

BASE = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
# The derived runs' cadence, with the versioned entities left to them (NGSI_DERIVED_IN_INCREMENTS=false).
SETTINGS = ContinuousSettings(derived_interval_s=300, hour_grace_s=120, derived_in_increments=False)


def _seg(hour: int, name: str, size: int) -> SegmentInfo:
    ms = int((BASE + timedelta(hours=hour)).timestamp() * 1000)
    return SegmentInfo(Path(f"/l/{hour_dir(ms)}/{name}.jsonl"), hour_dir(ms), partition_key(ms), size)


def _name(seg: SegmentInfo) -> str:
    return f"{seg.hour_dir}/{seg.path.name}"


def _key(hour: int) -> str:
    return (BASE + timedelta(hours=hour)).strftime("%Y-%m-%d-%H:00")


def _pending(segs: list[SegmentInfo], cursor: LandingCursor) -> dict[str, list[int]]:
    """What complete_ranges returns when every segment ends at a line boundary."""
    out = {}
    for s in segs:
        start = cursor.positions.get(_name(s), 0)
        if s.size > start and (cursor.sealed_before is None or s.partition_key >= cursor.sealed_before):
            out[_name(s)] = [start, s.size]
    return out


def _plan(segs, cursor=None, now=None, open_runs=None, settings=SETTINGS, **kw):  # noqa: ANN001, ANN202
    cursor = cursor or LandingCursor()
    now = now or BASE + timedelta(hours=max(int(s.hour_dir[-2:]) for s in segs), minutes=30)
    return plan_landing_runs(segs, _pending(segs, cursor), cursor, now, open_runs, settings, **kw)


def _increments(requests) -> list[tuple[str, dict]]:  # noqa: ANN001
    return [
        (r.partition_key, Increment.from_tags(r.tags).ranges) for r in requests if r.job_name == "ngsi_increment_job"
    ]


def test_increments_cover_each_hour_once_oldest_first() -> None:
    a, b, c = _seg(0, "a", 10), _seg(0, "b", 5), _seg(1, "c", 7)
    requests, cursor = _plan([a, b, c])
    assert _increments(requests) == [(_key(0), {_name(a): (0, 10), _name(b): (0, 5)})]
    assert INGEST_LANE in requests[0].tags and DERIVED_LANE not in requests[0].tags
    assert requests[0].run_key == f"{_key(0)}@{Increment.from_tags(requests[0].tags).id}"
    requests, cursor = _plan([a, b, c], LandingCursor.from_json(cursor.to_json()))
    assert _increments(requests) == [(_key(1), {_name(c): (0, 7)})]
    grown = [a, _seg(0, "b", 9), _seg(1, "c", 12)]
    requests, cursor = _plan(grown, cursor)
    assert _increments(requests) == [(_key(0), {_name(b): (5, 9)})]
    requests, cursor = _plan(grown, cursor)
    assert _increments(requests) == [(_key(1), {_name(c): (7, 12)})]
    assert _increments(_plan(grown, cursor)[0]) == []


def test_one_increment_waits_while_one_executes_and_nothing_is_skipped_after() -> None:
    a = _seg(0, "a", 10)
    _, cursor = _plan([a])
    grown = [_seg(0, "a", 30)]
    # A waiting run will take what landed (it grows to what lands until it starts): no other.
    for busy in (OpenRuns(ingest_waiting=True), OpenRuns(ingest_waiting=True, ingest_hours=frozenset({_key(0)}))):
        requests, after = _plan(grown, cursor, open_runs=busy)
        assert _increments(requests) == [] and after.positions == cursor.positions
    # One executing, none waiting: the next is asked for now, to start as soon as the lane is free.
    executing = OpenRuns(ingest_hours=frozenset({_key(0)}))
    for open_runs in (executing, OpenRuns()):
        requests, _ = _plan(grown, cursor, open_runs=open_runs)
        assert _increments(requests) == [(_key(0), {_name(a): (10, 30)})]
        assert requests[0].tags[EXTENDS_TAG] == "1" and INGEST_LANE in requests[0].tags


def test_old_hours_are_sealed_and_the_cursor_stays_small() -> None:
    segs = [_seg(h, f"s{h}", 100 + h) for h in range(60)]
    requests, cursor = _plan(segs, lookback_hours=48)
    # Hours already past the lookback when first seen are recomputed whole, one run each.
    whole = [r.partition_key for r in requests if r.job_name == "ngsi_ingest_job"]
    assert whole == [_key(h) for h in range(11)]
    seen = [k for k, _ in _increments(requests)]
    for _ in range(60):
        requests, cursor = _plan(segs, cursor, lookback_hours=48)
        seen += [k for k, _ in _increments(requests)]
        assert not [r for r in requests if r.job_name == "ngsi_ingest_job"]
    assert seen == [_key(h) for h in range(11, 60)]  # every tracked hour by increments, once
    assert len(cursor.positions) == 49
    assert cursor.sealed_before == _key(11)
    assert cursor.sealed == f"11:{sum(100 + h for h in range(11))}"


def test_an_hour_leaving_the_window_with_unread_data_is_recomputed_whole() -> None:
    a = _seg(0, "a", 10)
    _, cursor = _plan([a], lookback_hours=2)
    # Hour 0 grows and, in the same tick, hour 5 appears and pushes it out of the window.
    requests, cursor = _plan([_seg(0, "a", 20), _seg(5, "b", 1)], cursor, lookback_hours=2)
    assert [(r.job_name, r.partition_key) for r in requests if r.job_name != "ngsi_derived_job"] == [
        ("ngsi_ingest_job", _key(0)),
        ("ngsi_increment_job", _key(5)),
    ]
    assert not [
        r
        for r in _plan([_seg(0, "a", 20), _seg(5, "b", 1)], cursor, lookback_hours=2)[0]
        if r.job_name != "ngsi_derived_job"
    ]


def test_data_appearing_in_a_sealed_hour_gets_a_whole_hour_run() -> None:
    segs = [_seg(h, f"s{h}", 100) for h in range(20)]
    cursor = LandingCursor()
    for _ in range(12):
        _, cursor = _plan(segs, cursor, lookback_hours=10)
    restored = [*segs, _seg(3, "restored", 50)]
    requests, cursor2 = _plan(restored, cursor, lookback_hours=10)
    whole = {r.run_key for r in requests if r.job_name == "ngsi_ingest_job"}
    assert f"{_key(3)}@2:150" in whole  # run keys: only hour 3's is new, so only hour 3 runs
    # A whole-hour run writes every asset: it takes both lanes.
    assert all({INGEST_LANE, DERIVED_LANE} <= set(r.tags) for r in requests if r.job_name == "ngsi_ingest_job")
    assert not [r for r in _plan(restored, cursor2, lookback_hours=10)[0] if r.job_name == "ngsi_ingest_job"]


def test_derived_runs_when_due_and_once_more_when_the_hour_closes() -> None:
    a = _seg(0, "a", 10)
    t = BASE + timedelta(minutes=10)
    requests, cursor = _plan([a], now=t)
    assert [r.job_name for r in requests] == ["ngsi_increment_job"]  # not in the tick of its increment
    requests, cursor = _plan(
        [a], cursor, now=t + timedelta(seconds=10), open_runs=OpenRuns(ingest_hours=frozenset({_key(0)}))
    )
    (derived,) = requests
    assert derived.job_name == "ngsi_derived_job" and DERIVED_LANE in derived.tags
    assert side_by_side_width(derived.tags, 4) == SETTINGS.derived_side_by_side == 1
    # More data, but the interval has not passed: no derived run.
    grown = [_seg(0, "a", 20)]
    requests, cursor = _plan(grown, cursor, now=t + timedelta(seconds=20))
    assert [r.job_name for r in requests] == ["ngsi_increment_job"]
    assert _plan(grown, cursor, now=t + timedelta(seconds=100))[0] == []
    # The hour ends; within the grace period nothing, after it (increments done) the closing run.
    end = BASE + timedelta(hours=1)
    assert _plan(grown, cursor, now=end + timedelta(seconds=60))[0] == []
    busy = OpenRuns(ingest_hours=frozenset({_key(0)}))
    assert _plan(grown, cursor, now=end + timedelta(seconds=130), open_runs=busy)[0] == []
    requests, cursor = _plan(grown, cursor, now=end + timedelta(seconds=130))
    assert [r.job_name for r in requests] == ["ngsi_derived_job"]
    # Nothing changed since the closing run: no more runs, ever.
    assert _plan(grown, cursor, now=end + timedelta(hours=3))[0] == []
    # A waiting derived run holds back the next one.
    assert (
        _plan(grown, LandingCursor(), now=end + timedelta(seconds=130), open_runs=OpenRuns(derived_waiting=True))[0][
            0
        ].job_name
        == "ngsi_increment_job"
    )


def test_a_derived_run_asked_for_while_its_increment_runs_is_followed_by_one_covering_it() -> None:
    """Traffic stops while an increment of the hour executes: the derived run asked for then covers it
    only partly. Once the increment has ended, the next due tick asks for a run under another run key
    (Dagster drops a request whose run key it has launched before), and after that nothing more."""
    a = _seg(0, "a", 10)
    t = BASE + timedelta(minutes=10)
    _, cursor = _plan([a], now=t)  # the increment
    busy = OpenRuns(ingest_hours=frozenset({_key(0)}))
    (partial,), cursor = _plan([a], cursor, now=t + timedelta(seconds=10), open_runs=busy)
    assert partial.job_name == "ngsi_derived_job"
    (full,), cursor = _plan([a], cursor, now=t + timedelta(seconds=10 + SETTINGS.derived_interval_s))
    assert full.job_name == "ngsi_derived_job"
    assert full.run_key != partial.run_key
    assert _plan([a], cursor, now=t + timedelta(minutes=40))[0] == []
    assert _plan([a], cursor, now=BASE + timedelta(hours=3))[0] == []


def test_steady_traffic_gets_its_derived_runs_beside_the_increments() -> None:
    """Every tick has new data and asks for an increment (each one done before the next tick): the
    hour's derived runs still come, once per interval, in the ticks of later increments."""
    t = BASE + timedelta(minutes=10)
    cursor = LandingCursor()
    asked: list[tuple[int, list[str]]] = []
    for tick in range(0, 700, 5):  # 5 s ticks for 700 s, the segment growing every tick
        requests, cursor = _plan([_seg(0, "a", 10 + tick)], cursor, now=t + timedelta(seconds=tick))
        asked.append((tick, sorted(r.job_name for r in requests)))
    assert all("ngsi_increment_job" in jobs for _, jobs in asked)
    derived_ticks = [tick for tick, jobs in asked if "ngsi_derived_job" in jobs]
    # Not in the first tick (nothing to fold yet), then every 300 s.
    assert derived_ticks == [5, 305, 605]


def test_increments_that_fold_the_versioned_entities_hold_both_lanes_and_no_derived_run_is_asked_for() -> None:
    """NGSI_DERIVED_IN_INCREMENTS (the default, with the STH aggregates in the increments): the
    increments take every asset, so no derived run is asked for, under traffic or when the hour
    closes; each increment holds the derived lane too (a reprocessing run must not fold beside it)."""
    settings = ContinuousSettings(derived_interval_s=60, hour_grace_s=120)
    assert settings.derived_in_increments and settings.derived_assets == ()
    assert {"versioned_entities", "transaction_history"} <= set(settings.increment_assets)
    t = BASE + timedelta(minutes=10)
    cursor = LandingCursor()
    asked = []
    for tick in range(0, 700, 5):
        requests, cursor = _plan([_seg(0, "a", 10 + tick)], cursor, now=t + timedelta(seconds=tick), settings=settings)
        asked += requests
    requests, cursor = _plan([_seg(0, "a", 705)], cursor, now=BASE + timedelta(hours=1, minutes=5), settings=settings)
    asked += requests
    assert {r.job_name for r in asked} == {"ngsi_increment_job"} and len(asked) == 140
    assert all({INGEST_LANE, DERIVED_LANE, INCREMENT_TAG} <= set(r.tags) for r in asked)
    # With the STH aggregates left to the derived runs, those still come (every interval).
    sth_derived = ContinuousSettings(derived_interval_s=60, derived_in_increments=True, sth_in_increments=False)
    assert sth_derived.derived_assets == ("sth_aggregates",)
    cursor = LandingCursor()
    derived_ticks = []
    for tick in range(0, 200, 5):
        now = t + timedelta(seconds=tick)
        requests, cursor = _plan([_seg(0, "a", 10 + tick)], cursor, now=now, settings=sth_derived)
        derived_ticks += [tick for r in requests if r.job_name == "ngsi_derived_job"]
    assert derived_ticks == [5, 65, 125, 185]


def test_a_waiting_increment_holding_the_derived_lane_does_not_hold_back_derived_runs(tmp_path: Path) -> None:
    """An increment that holds the derived lane (NGSI_DERIVED_IN_INCREMENTS) is the ingest lane's run:
    waiting, it is not a waiting derived run (under steady traffic one increment nearly always waits)."""
    t = Ticks(tmp_path)
    tags = {INCREMENT_TAG: "{}", INGEST_LANE: "1", DERIVED_LANE: "1"}
    t.put(RunRequest(run_key="i", job_name="ngsi_increment_job", partition_key=_key(0), tags=tags),
          DagsterRunStatus.NOT_STARTED)  # fmt: skip
    runs = open_landing_runs(t.instance)
    assert runs.ingest_waiting and not runs.derived_waiting
    t.put(RunRequest(run_key="d", job_name="ngsi_derived_job", partition_key=_key(0), tags={DERIVED_LANE: "1"}),
          DagsterRunStatus.NOT_STARTED)  # fmt: skip
    assert open_landing_runs(t.instance).derived_waiting


def test_a_long_derived_run_spaces_out_the_next_ones_to_its_share_of_the_time() -> None:
    """Derived runs are at least the least interval apart, and a run that took long makes the next one
    wait its duration over ``derived_share``: the derived lane keeps to its part of the machine."""
    settings = ContinuousSettings(
        derived_interval_s=60, derived_share=0.25, hour_grace_s=120, derived_in_increments=False
    )
    assert settings.derived_interval(None) == 60
    assert settings.derived_interval(10.0) == 60
    assert settings.derived_interval(40.0) == 160

    def derived_ticks(last_derived_s: float | None) -> list[int]:
        t = BASE + timedelta(minutes=10)
        cursor, ticks = LandingCursor(), []
        for tick in range(0, 400, 5):
            requests, cursor = _plan(
                [_seg(0, "a", 10 + tick)],
                cursor,
                now=t + timedelta(seconds=tick),
                open_runs=OpenRuns(last_derived_s=last_derived_s),
                settings=settings,
            )
            ticks += [tick for r in requests if r.job_name == "ngsi_derived_job"]
        return ticks

    assert derived_ticks(None) == [5, 65, 125, 185, 245, 305, 365]
    assert derived_ticks(12.0) == [5, 65, 125, 185, 245, 305, 365]
    assert derived_ticks(50.0) == [5, 205]


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_derived_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="NGSI_DERIVED_SHARE"):
        ContinuousSettings.from_env({"NGSI_DERIVED_SHARE": str(share)})


def test_the_sensor_reads_how_long_the_last_finished_derived_run_took(tmp_path: Path) -> None:
    from ngsi_assets.sensors import last_derived_run_s, open_landing_runs

    t = Ticks(tmp_path)
    assert last_derived_run_s(t.instance) is None
    finished_run(t.instance, "derived-1", "ngsi_derived_job", 12.5, tags={DERIVED_LANE: "1"})
    assert last_derived_run_s(t.instance) == pytest.approx(12.5)
    # The newest one counts, failed or not; other jobs' runs and a derived run still executing do not.
    finished_run(t.instance, "derived-2", "ngsi_derived_job", 48.0, success=False, tags={DERIVED_LANE: "1"})
    finished_run(t.instance, "increment-1", "ngsi_increment_job", 300.0)
    t.put(RunRequest(run_key="d3", job_name="ngsi_derived_job", partition_key=_key(0), tags={DERIVED_LANE: "1"}),
          DagsterRunStatus.STARTED, run_id="derived-3")  # fmt: skip
    assert last_derived_run_s(t.instance) == pytest.approx(48.0)
    assert open_landing_runs(t.instance).last_derived_s == pytest.approx(48.0)


def test_a_new_hour_gets_no_derived_run_before_the_closing_run_of_the_hour_before() -> None:
    """In continuous mode the first derived run of hour 1 waits for hour 0's closing run, whose tail
    folded after hour 1 would come late for every key."""
    t = BASE + timedelta(minutes=58)
    requests, cursor = _plan([_seg(0, "a", 10)], now=t)
    requests, cursor = _plan([_seg(0, "a", 10)], cursor, now=t + timedelta(seconds=10))
    assert [r.job_name for r in requests] == ["ngsi_derived_job"]
    # Hour 0's tail and hour 1's first data land; hour 0 is not closed yet (grace, then its increment).
    segs = [_seg(0, "a", 20), _seg(1, "b", 10)]
    after = BASE + timedelta(hours=1, minutes=1)
    requests, cursor = _plan(segs, cursor, now=after)
    assert [(r.job_name, r.partition_key) for r in requests] == [("ngsi_increment_job", _key(0))]
    requests, cursor = _plan(segs, cursor, now=after + timedelta(seconds=5))
    assert [(r.job_name, r.partition_key) for r in requests] == [("ngsi_increment_job", _key(1))]
    # Hour 1 is due (never derived) but hour 0 still waits for its grace: nothing derived yet.
    assert _plan(segs, cursor, now=after + timedelta(seconds=30))[0] == []
    requests, cursor = _plan(segs, cursor, now=after + timedelta(seconds=70))
    assert [(r.job_name, r.partition_key) for r in requests] == [("ngsi_derived_job", _key(0))]
    requests, cursor = _plan(segs, cursor, now=after + timedelta(seconds=80))
    assert [(r.job_name, r.partition_key) for r in requests] == [("ngsi_derived_job", _key(1))]


def test_a_cursor_from_before_increments_recomputes_its_hours_whole_once() -> None:
    a, b = _seg(0, "a", 10), _seg(1, "b", 5)
    legacy = LandingCursor.from_json(json.dumps({"hours": {_key(0): "1:10"}, "sealed_before": None, "sealed": "0:0"}))
    requests, cursor = _plan([a, b], legacy)
    assert [(r.job_name, r.partition_key) for r in requests] == [
        ("ngsi_ingest_job", _key(0)),
        ("ngsi_increment_job", _key(1)),
    ]
    assert cursor.positions == {_name(a): 10, _name(b): 5}
    assert not [r for r in _plan([a, b], cursor)[0] if r.job_name != "ngsi_derived_job"]


def _write(writer: LandingWriter, hour: int, n: int, start: int) -> None:
    ms = int((BASE + timedelta(hours=hour, minutes=1)).timestamp() * 1000)
    writer.append_many_blocking(
        Envelope(f"m{start + i}", ms + i, "message", "datahub", "default", "/", None, None, None, "test",
                 json.dumps({"entity": "e", "timestamp": "2026-03-01T00:00:00", "data": [{"i": start + i}]}).encode())
        for i in range(n)
    )  # fmt: skip


class Ticks:
    """The real sensor over a real landing folder, on an instance where runs can be put by hand."""

    def __init__(self, tmp_path: Path) -> None:
        self.landing = LandingZoneResource(root=str(tmp_path))
        self.instance = DagsterInstance.ephemeral()
        self.cursor: str | None = None

    def tick(self) -> list[RunRequest | SkipReason]:
        ctx = build_sensor_context(cursor=self.cursor, instance=self.instance, resources={"landing": self.landing})
        out = list(landing_sensor(ctx))
        self.cursor = ctx.cursor
        return out

    def runs(self) -> list[RunRequest]:
        return [r for r in self.tick() if isinstance(r, RunRequest) and r.job_name == "ngsi_increment_job"]

    def put(self, request: RunRequest, status: DagsterRunStatus, run_id: str | None = None) -> DagsterRun:
        run = DagsterRun(
            job_name=request.job_name,
            run_id=run_id or f"r{len(self.instance.get_runs())}",
            status=status,
            tags={**request.tags, "dagster/partition": request.partition_key},
        )
        self.instance.add_run(run)
        return run


def test_sensor_ticks_with_live_writers_cover_every_byte_once(tmp_path: Path) -> None:
    t = Ticks(tmp_path)
    assert t.runs() == []
    covered: dict[str, list[tuple[int, int]]] = {}

    def take() -> None:
        for r in t.runs():
            for name, rng in Increment.from_tags(r.tags).ranges.items():
                covered.setdefault(name, []).append(rng)

    with LandingWriter(tmp_path) as w1:
        _write(w1, 0, 5, 0)
        _write(w1, 1, 3, 100)
        take()
        _write(w1, 1, 4, 110)
        take()
        take()
    with LandingWriter(tmp_path) as w2:  # a restarted receiver writes a new segment
        _write(w2, 1, 2, 200)
        _write(w2, 2, 1, 300)
    for _ in range(4):
        take()
    assert t.runs() == []
    # Each segment is covered from 0 to its size by contiguous, non-overlapping ranges.
    segs = t.landing.segments()
    assert sorted(covered) == sorted(_name(s) for s in segs)
    for s in segs:
        ranges = covered[_name(s)]
        assert ranges[0][0] == 0 and ranges[-1][1] == s.size
        assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:], strict=False))


def test_a_partial_line_is_left_for_the_next_increment(tmp_path: Path) -> None:
    t = Ticks(tmp_path)
    with LandingWriter(tmp_path) as w:
        _write(w, 0, 2, 0)
    (seg,) = t.landing.segments()
    size = seg.size
    with open(seg.path, "ab") as f:  # a batch being written: half a line so far
        f.write(b'{"message_id":"half')
    (run,) = t.runs()
    assert Increment.from_tags(run.tags).ranges == {_name(seg): (0, size)}
    assert t.runs() == []


def test_steady_traffic_keeps_one_increment_executing_and_one_waiting(tmp_path: Path) -> None:
    t = Ticks(tmp_path)

    def increment_runs(out: list[RunRequest | SkipReason]) -> list[RunRequest]:
        return [r for r in out if isinstance(r, RunRequest) and r.job_name == "ngsi_increment_job"]

    with LandingWriter(tmp_path) as w:
        _write(w, 0, 5, 0)
        (first,) = t.runs()
        waiting = t.put(first, DagsterRunStatus.NOT_STARTED)  # QUEUED needs a code location
        for i in range(2):
            _write(w, 0, 2, 100 + 10 * i)  # traffic keeps coming while it waits: it will take that too
            out = t.tick()
            assert not increment_runs(out)
            assert "left to the increment waiting in the ingest lane" in out[-1].skip_message
        t.instance.delete_run(waiting.run_id)
        t.put(first, DagsterRunStatus.STARTED)  # it executes: the next is asked for, and waits
        (second,) = t.runs()
        (seg,) = t.landing.segments()
        start = Increment.from_tags(first.tags).ranges[_name(seg)][1]
        assert Increment.from_tags(second.tags).ranges == {_name(seg): (start, seg.size)}
        t.put(second, DagsterRunStatus.NOT_STARTED)
        _write(w, 0, 2, 200)
        assert not increment_runs(t.tick())  # one executing, one waiting: never more
        assert len(t.instance.get_runs()) == 2


def test_a_failed_increment_gets_one_whole_hour_repair(tmp_path: Path) -> None:
    t = Ticks(tmp_path)
    with LandingWriter(tmp_path) as w:
        _write(w, 0, 3, 0)
    (run,) = t.runs()
    failed = t.put(run, DagsterRunStatus.FAILURE, run_id="failed-1")
    (repair,) = repair_requests(t.instance, now=datetime.now(UTC))
    assert repair.job_name == "ngsi_ingest_job" and repair.partition_key == run.partition_key
    assert repair.run_key == f"repair:{failed.run_id}" and INCREMENT_TAG not in repair.tags
    assert {INGEST_LANE, DERIVED_LANE} <= set(repair.tags)
    # The sensor asks for it (Dagster launches a run key once).
    assert [r.run_key for r in t.tick() if isinstance(r, RunRequest) and r.job_name == "ngsi_ingest_job"] == [
        repair.run_key
    ]
    # A failed repair is not repaired again; a run Dagster retried is judged by its retry.
    t.put(RunRequest(run_key="x", job_name="ngsi_increment_job", partition_key=run.partition_key,
                     tags={**repair.tags}), DagsterRunStatus.FAILURE, run_id="failed-repair")  # fmt: skip
    t.put(RunRequest(run_key="y", job_name="ngsi_increment_job", partition_key=run.partition_key,
                     tags={**run.tags, "dagster/parent_run_id": failed.run_id}), DagsterRunStatus.STARTED)  # fmt: skip
    assert repair_requests(t.instance, now=datetime.now(UTC)) == []
    assert REPAIR_TAG in repair.tags


def _step_order(job_name: str) -> list[str]:
    """The order the in-process executor (the platform's) starts the job's steps in, each succeeding."""
    from dagster._core.execution.api import create_execution_plan
    from dagster._core.execution.plan.active import ActiveExecution
    from dagster._core.execution.plan.outputs import StepOutputHandle
    from dagster._core.execution.retries import RetryMode

    from ngsi_assets.definitions import defs

    order: list[str] = []
    with ActiveExecution(create_execution_plan(defs.resolve_job_def(job_name)), RetryMode.DISABLED) as active:
        while not active.is_complete:
            for step in active.get_steps_to_execute(limit=1):
                order.append(step.key)
                for out in step.step_outputs:
                    active.mark_step_produced_output(StepOutputHandle(step.key, out.name))
                active.mark_success(step.key)
    return order


def test_last_data_is_written_first_once_the_events_are_in() -> None:
    """Freshness is the last-data tables': in an increment, and in a whole-hour run, no other sink and
    no derived asset runs between the events and last data."""
    for job in ("ngsi_increment_job", "ngsi_ingest_job"):
        order = _step_order(job)
        assert order[:3] == ["message_store", "ngsi_events", "last_data"], (job, order)
        assert set(order[3:]) >= {"historic_tables", "mongo_raw"}, (job, order)


def test_a_run_whose_process_died_is_canceled_and_its_increment_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed increment run stays "started" and would hold the ingest lane for ever: the sensor's runs
    carry a max runtime, Dagster's run monitoring (on in the shipped dagster.yaml) cancels the run past
    it, and the canceled increment gets its whole-hour repair."""
    import shutil
    import time

    import yaml
    from dagster._core.storage.tags import MAX_RUNTIME_SECONDS_TAG
    from dagster._daemon.monitoring.run_monitoring import check_run_timeout, monitor_canceling_run

    repo = Path(__file__).resolve().parents[1]
    shipped = yaml.safe_load((repo / "dagster.yaml").read_text())
    assert shipped["run_monitoring"]["enabled"] is True
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(repo / "dagster.yaml", home / "dagster.yaml")
    instance = DagsterInstance.from_config(str(home))
    assert instance.run_monitoring_enabled

    t = Ticks(tmp_path / "landing")
    t.instance = instance
    with LandingWriter(tmp_path / "landing") as w:
        _write(w, 0, 3, 0)
    (request,) = t.runs()
    assert float(request.tags[MAX_RUNTIME_SECONDS_TAG]) == ContinuousSettings().increment_max_runtime_s
    # The run starts, then its process is killed: nothing ever reports its end.
    short = {**request.tags, MAX_RUNTIME_SECONDS_TAG: "1"}
    run = t.put(
        RunRequest(run_key=request.run_key, job_name=request.job_name, partition_key=request.partition_key, tags=short),
        DagsterRunStatus.NOT_STARTED,
    )
    from dagster._core.events import DagsterEvent, DagsterEventType

    instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_START.value, job_name=run.job_name), run_id=run.run_id
    )
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED
    assert t.runs() == []  # the lane is held
    time.sleep(1.5)
    log = logging.getLogger("test")
    check_run_timeout(instance, instance.get_run_record_by_id(run.run_id), log, 0.0)
    assert instance.get_run_by_id(run.run_id).status in (DagsterRunStatus.CANCELING, DagsterRunStatus.FAILURE)
    if instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELING:
        # Nobody acknowledges the cancel (the process is gone): past the cancel timeout it is canceled.
        # (the shipped cancel timeout, shortened for the test)
        assert instance.run_monitoring_cancel_timeout_seconds == shipped["run_monitoring"]["cancel_timeout_seconds"]
        monkeypatch.setattr(type(instance), "run_monitoring_cancel_timeout_seconds", property(lambda _self: 0.5))
        time.sleep(1)
        monitor_canceling_run(instance, instance.get_run_record_by_id(run.run_id), log)
    assert instance.get_run_by_id(run.run_id).status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
    repairs = [r for r in t.tick() if isinstance(r, RunRequest) and r.job_name == "ngsi_ingest_job"]
    assert [r.run_key for r in repairs] == [f"repair:{run.run_id}"]
    assert float(repairs[0].tags[MAX_RUNTIME_SECONDS_TAG]) == ContinuousSettings().hour_max_runtime_s
    assert NEW_INCREMENTS_TAG not in repairs[0].tags  # a repair folds its hour whole


def test_derived_runs_fold_new_increments_at_the_configured_width_and_bad_widths_are_refused() -> None:
    a = _seg(0, "a", 10)
    t = BASE + timedelta(minutes=10)
    wide = ContinuousSettings.from_env({"NGSI_DERIVED_SIDE_BY_SIDE": "3", "NGSI_DERIVED_IN_INCREMENTS": "false"})
    busy = OpenRuns(ingest_hours=frozenset({_key(0)}))
    _, cursor = _plan([a], now=t, settings=wide)
    (derived,) = _plan([a], cursor, now=t + timedelta(seconds=10), open_runs=busy, settings=wide)[0]
    assert derived.tags[SIDE_BY_SIDE_TAG] == "3"
    # A derived run folds only what the versioned entities have not folded yet.
    assert derived.tags[NEW_INCREMENTS_TAG] == "1"
    # Whole-hour runs (backfills, repairs, the UI) keep the assets' default.
    assert side_by_side_width({}, 4) == 4
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(ValueError, match="NGSI_DERIVED_SIDE_BY_SIDE"):
            ContinuousSettings.from_env({"NGSI_DERIVED_SIDE_BY_SIDE": bad})
        with pytest.raises(ValueError, match=f"run tag {SIDE_BY_SIDE_TAG}={bad!r}"):
            side_by_side_width({SIDE_BY_SIDE_TAG: bad}, 4)


def test_the_daemon_evaluates_the_landing_sensor_on_every_loop() -> None:
    """The daemon loops every MIN_INTERVAL_LOOP_TIME (5 s) and skips a sensor whose previous tick started
    less than its minimum interval ago. Loops drift by milliseconds: with a 5 s interval, a loop that
    came 4.99 s after the previous tick skipped it, and the increment's request waited 10 s."""
    from types import SimpleNamespace

    from dagster._core.definitions.sensor_definition import SensorType
    from dagster._core.scheduler.instigation import SensorInstigatorData
    from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME, is_under_min_interval
    from dagster._time import get_current_timestamp

    from ngsi_assets.sensors import landing_sensor

    def skipped(seconds_since_last_tick: float) -> bool:
        started = get_current_timestamp() - seconds_since_last_tick
        data = SensorInstigatorData(last_tick_start_timestamp=started, sensor_type=SensorType.STANDARD)
        sensor = SimpleNamespace(min_interval_seconds=landing_sensor.minimum_interval_seconds)
        return is_under_min_interval(SimpleNamespace(instigator_data=data), sensor)  # type: ignore[arg-type]

    assert not skipped(MIN_INTERVAL_LOOP_TIME - 0.05)
    assert not skipped(MIN_INTERVAL_LOOP_TIME - 1.5)  # a loop that ran long, then a short sleep


_JOB_ASSETS = """
import json
from ngsi_assets.definitions import defs
print(json.dumps({n: sorted(k.to_user_string() for k in defs.resolve_job_def(n).asset_layer.executable_asset_keys)
                  for n in ("ngsi_increment_job", "ngsi_derived_job")}))
"""


@pytest.mark.parametrize(
    ("sth", "derived"), [("true", "false"), ("false", "false"), ("true", "true"), ("false", "true")]
)
def test_the_sth_aggregates_and_the_folded_assets_go_with_the_increments_or_the_derived_runs(
    sth: str, derived: str
) -> None:
    """NGSI_STH_IN_INCREMENTS and NGSI_DERIVED_IN_INCREMENTS, read when the definitions load, put
    sth_aggregates, and the versioned entities with the transaction history, in one job or the other."""
    env = {**os.environ, "NGSI_STH_IN_INCREMENTS": sth, "NGSI_DERIVED_IN_INCREMENTS": derived}
    out = subprocess.run([sys.executable, "-c", _JOB_ASSETS], env=env, capture_output=True, text=True, check=True)
    jobs = json.loads(out.stdout.strip().splitlines()[-1])
    increments = ["historic_tables", "last_data", "message_store", "mongo_raw", "ngsi_events"]
    derived_runs = []
    (increments if sth == "true" else derived_runs).append("sth_aggregates")
    (increments if derived == "true" else derived_runs).extend(["transaction_history", "versioned_entities"])
    assert jobs == {"ngsi_increment_job": sorted(increments), "ngsi_derived_job": sorted(derived_runs)}
