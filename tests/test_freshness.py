"""Freshness: each materialization records the newest receive time it holds (increments, whole hours,
derived batches), and the freshness sensor reports how far behind the landing zone each asset is."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    build_sensor_context,
)

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.assets.sth import sth_aggregates
from ngsi_assets.assets.versioned_entities import versioned_entities
from ngsi_assets.freshness import (
    CHECK_NAME,
    FOLLOWED,
    RECEIVED_UNTIL,
    WRITE_SLACK_S,
    FreshnessSettings,
    HourContent,
    HourLanded,
    Lag,
    Received,
    asset_limits,
    due_reports,
    freshness_sensor,
    instance_limits,
    lag_of,
)
from ngsi_assets.increments import INCREMENT_TAG, NEW_INCREMENTS_TAG, Increment
from ngsi_assets.ingest.landing import iter_complete_lines
from ngsi_assets.ngsi.envelope import Envelope
from resources.landing import LandingZoneResource
from tests.assets.test_derived_increments import Lake
from tests.assets.test_increments import T0, _notification, land, split_into_increments
from tests.support.runs import finished_run

# ---- pure ---------------------------------------------------------------------------------------

NOW = 10_000.0


def test_an_asset_holding_every_landed_line_has_no_lag() -> None:
    hours = [HourLanded("h1", newest_write_s=900.0, first_received_s=100.0)]
    assert lag_of(NOW, hours, {"h1": 900.0 - WRITE_SLACK_S / 2}) == Lag(0.0, None, None)


def test_an_asset_behind_lags_by_the_age_of_its_newest_receive_time() -> None:
    hours = [HourLanded("h1", 900.0, 100.0), HourLanded("h2", 9_990.0, 9_000.0)]
    lag = lag_of(NOW, hours, {"h1": 900.0, "h2": 9_500.0})
    assert lag == Lag(500.0, "h2", 9_500.0)


def test_an_hour_never_recorded_lags_by_the_age_of_its_first_line() -> None:
    hours = [HourLanded("h1", 900.0, 100.0), HourLanded("h2", 9_990.0, 9_000.0)]
    assert lag_of(NOW, hours, {"h1": 900.0}) == Lag(1_000.0, "h2", None)
    # The worst hour counts: an older hour left behind outweighs a newer one that is nearly current.
    assert lag_of(NOW, hours, {"h1": 300.0, "h2": 9_980.0}) == Lag(9_700.0, "h1", 300.0)


def test_an_hour_without_a_readable_line_is_not_a_lag() -> None:
    assert lag_of(NOW, [HourLanded("h1", 900.0, None)], {}) == Lag(0.0, None, None)


def test_reports_are_made_on_change_and_every_report_interval() -> None:
    found = {"a": Lag(10.0, None, None), "b": Lag(40.0, "h", 1.0), "c": Lag(0.0, None, None)}
    limits = {"a": 30.0, "b": 30.0, "c": 30.0}
    last = {"a": [True, NOW - 10], "b": [True, NOW - 10], "c": [True, NOW - 300]}
    reports = {r.asset: r.passed for r in due_reports(found, last, NOW, limits, 300)}
    # a: unchanged and reported 10 s ago; b: turned failing; c: unchanged but due again.
    assert reports == {"b": False, "c": True}
    assert {r.asset for r in due_reports(found, {}, NOW, limits, 300)} == {"a", "b", "c"}


def test_the_derived_lanes_assets_get_the_derived_interval_on_top_of_the_limit() -> None:
    # By default the increments hold every followed asset: one limit for all.
    default = asset_limits({"NGSI_FRESHNESS_LIMIT_S": "45", "NGSI_DERIVED_INTERVAL_S": "30"})
    assert set(default.values()) == {45} and set(default) == set(FOLLOWED)
    derived_runs = {
        "NGSI_FRESHNESS_LIMIT_S": "45",
        "NGSI_DERIVED_INTERVAL_S": "30",
        "NGSI_DERIVED_IN_INCREMENTS": "false",
    }
    limits = asset_limits(derived_runs)
    assert limits["last_data"] == limits["message_store"] == limits["sth_aggregates"] == 45
    assert limits["versioned_entities"] == limits["transaction_history"] == 75
    back = asset_limits({**derived_runs, "NGSI_STH_IN_INCREMENTS": "false"})
    assert back["sth_aggregates"] == 75 and back["last_data"] == 45, "STH aggregates in the derived runs"
    assert set(limits) == set(FOLLOWED)
    # After a derived run of 20 s: it waits 80 s (a quarter of the time), and the run itself is on top.
    after = asset_limits(derived_runs, last_derived_s=20.0)
    assert after["versioned_entities"] == 45 + 80 + 20 and after["last_data"] == 45
    # A lag of 60 s fails last data's check and passes the versioned entities'.
    found = {"last_data": Lag(60.0, "h", 1.0), "versioned_entities": Lag(60.0, "h", 1.0)}
    assert {r.asset: r.passed for r in due_reports(found, {}, NOW, limits, 300)} == {
        "last_data": False,
        "versioned_entities": True,
    }


def test_the_checks_take_the_derived_cadence_from_the_newest_finished_derived_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NGSI_FRESHNESS_LIMIT_S", "NGSI_DERIVED_INTERVAL_S", "NGSI_DERIVED_SHARE", "NGSI_STH_IN_INCREMENTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NGSI_DERIVED_IN_INCREMENTS", "false")
    instance = DagsterInstance.ephemeral()
    assert instance_limits(instance)["versioned_entities"] == 60 + 60
    finished_run(instance, "derived-1", "ngsi_derived_job", 40.0)
    # A run of 40 s: the next one 160 s later (a quarter of the time), and its own 40 s on top.
    limits = instance_limits(instance)
    assert limits["versioned_entities"] == limits["transaction_history"] == 60 + 160 + 40
    assert limits["last_data"] == 60


def test_settings_refuse_a_limit_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="NGSI_FRESHNESS_LIMIT_S"):
        FreshnessSettings.from_env({"NGSI_FRESHNESS_LIMIT_S": "0"})
    with pytest.raises(ValueError, match="NGSI_FRESHNESS_REPORT_S"):
        FreshnessSettings.from_env({"NGSI_FRESHNESS_REPORT_S": "soon"})


def test_received_times_of_what_a_content_names() -> None:
    rec = Received(whole=50, increments={"i1": 70, "i2": 90})
    assert rec.of(HourContent({"message_store": ["part-0"]}, frozenset({"i1"}))) == 70
    assert rec.of(HourContent({"message_store": ["part-0"]}, frozenset())) == 50
    # No whole-hour rows in the content: the whole-hour time is not the content's.
    assert rec.of(HourContent({"message_store": []}, frozenset({"i2", "gone"}))) == 90
    assert rec.of(HourContent({}, frozenset())) is None
    assert Received.from_text(rec.to_text()) == rec
    # Damaged text: nothing known (freshness unknown), never an error that fails a run.
    assert Received.from_text("{not json") == Received()
    assert Received.from_text('{"whole": "x"}') == Received()


# ---- the assets and the sensor ------------------------------------------------------------------


def _spaced(i: int) -> Envelope:
    """The increments' test notifications, received 10 s apart (further apart than a write's slack)."""
    return dataclasses.replace(_notification(i), recv_ms=T0 + i * 10_000)


def _recv_ms(landing: LandingZoneResource, inc: Increment) -> list[int]:
    """The receive times of the lines an increment's ranges hold."""
    out = []
    for name, (start, end) in inc.ranges.items():
        data = (Path(landing.root) / name).read_bytes()[start:end]
        out += [int(json.loads(line)["recv_ms"]) for line in data.splitlines() if line]
    return out


class Platform(Lake):
    """A landing zone and a lake, every run recorded on one instance (the sensor reads it)."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, "freshness", instance=DagsterInstance.ephemeral())
        self._cursor: str | None = None

    def received(self, assets: list[Any], tags: dict[str, str]) -> dict[str, float | None]:
        """Materialize ``assets``; each asset's recorded newest receive time (epoch s)."""
        inc = Increment.from_tags(tags)
        result = self.materialize(assets, inc, new_only=NEW_INCREMENTS_TAG in tags)
        out: dict[str, float | None] = {}
        for m in result.get_asset_materialization_events():
            meta = m.materialization.metadata
            out[m.asset_key.to_user_string()] = meta[RECEIVED_UNTIL].value if RECEIVED_UNTIL in meta else None
        return out

    def tick(self) -> dict[str, tuple[bool, float]]:
        """One sensor evaluation; the latest reported result and lag of every followed asset."""
        context = build_sensor_context(instance=self.instance, resources={"landing": self.landing}, cursor=self._cursor)
        list(freshness_sensor(context))
        self._cursor = context.cursor
        keys = [AssetCheckKey(AssetKey(a), CHECK_NAME) for a in ("message_store", "ngsi_events", "versioned_entities")]
        latest = self.instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
        out = {}
        for key, record in latest.items():
            evaluation = record.event.dagster_event.event_specific_data  # type: ignore[union-attr]
            out[key.asset_key.to_user_string()] = (evaluation.passed, evaluation.metadata["lag_s"].value)
        return out

    def reports(self) -> int:
        key = AssetCheckKey(AssetKey("versioned_entities"), CHECK_NAME)
        return len(self.instance.event_log_storage.get_asset_check_execution_history(key, limit=100))


@pytest.mark.integration
@pytest.mark.spark
def test_assets_record_what_they_hold_and_the_sensor_reports_who_is_behind(tmp_path: Path) -> None:
    import random

    p = Platform(tmp_path)
    land(tmp_path / "landing", 24, _spaced)
    increments = split_into_increments(p.landing, random.Random(3), parts=3)
    # Segments written when their newest line was received, as the receiver writes them (the
    # lines here were received in the past).
    for seg in p.landing.segments():
        newest = max(int(json.loads(line)["recv_ms"]) for line in iter_complete_lines(seg.path)) / 1000
        os.utime(seg.path, (newest, newest))

    first = p.received([message_store, ngsi_events], {INCREMENT_TAG: increments[0].to_tag()})
    want = max(_recv_ms(p.landing, increments[0])) / 1000
    assert first == {"message_store": want, "ngsi_events": want}
    # The versioned entities were never materialized, and the hour holds lines past the increment.
    tick = p.tick()
    assert tick["message_store"][0] is False and tick["message_store"][1] > 0
    assert tick["versioned_entities"][0] is False

    second = p.received([message_store, ngsi_events], {INCREMENT_TAG: increments[1].to_tag()})
    want2 = max(_recv_ms(p.landing, increments[1])) / 1000
    assert second == {"message_store": want2, "ngsi_events": want2}
    # A derived batch holds both increments: the newest receive time of the two.
    derived = p.received([versioned_entities, sth_aggregates], {NEW_INCREMENTS_TAG: "1"})
    assert derived == {"versioned_entities": max(want, want2), "sth_aggregates": max(want, want2)}

    third = p.received([message_store, ngsi_events], {INCREMENT_TAG: increments[2].to_tag()})
    newest = max(_recv_ms(p.landing, increments[2])) / 1000
    assert third == {"message_store": newest, "ngsi_events": newest}
    before = p.reports()
    tick = p.tick()
    # The ingest lane holds every landed line; the versioned entities lack the last increment.
    assert tick["message_store"] == (True, 0.0)
    assert tick["ngsi_events"] == (True, 0.0)
    assert tick["versioned_entities"][0] is False
    assert p.reports() == before, "an unchanged result is not reported again before the report interval"

    assert p.received([versioned_entities], {NEW_INCREMENTS_TAG: "1"}) == {"versioned_entities": newest}
    assert p.tick()["versioned_entities"] == (True, 0.0)
    assert p.reports() == before + 1

    # A whole-hour run records its hour's newest receive time too.
    whole = p.received([message_store, ngsi_events], {})
    assert whole == {"message_store": newest, "ngsi_events": newest}
