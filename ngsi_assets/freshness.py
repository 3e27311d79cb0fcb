"""Freshness: how far behind what the receiver acknowledged each asset is.

Every materialization of an hourly asset records ``ngsi/received_until`` (``RECEIVED_UNTIL``): the
newest receive time among the messages it holds of the run's hours. Increments are stored and folded
in landing order, so everything received up to that time is in the asset, for those hours. The
message store keeps the newest receive time of each hour's whole-hour rows and of each increment in
``_received.json`` beside the hour's rows; the other assets take theirs from it: an increment run's
assets the increment's, a derived run's assets the increments and whole-hour rows they folded.

``freshness_sensor`` compares that time with the landing zone: an asset that holds everything that
landed is fresh; one whose hour has newer lines is behind by the age of the oldest line it lacks, at
most ``now - received_until``. It reports the ``freshness`` check of each asset (an asset check with
the lag in seconds as metadata, so the UI shows an asset that fell behind and by how much) when its
result changes, and otherwise every ``NGSI_FRESHNESS_REPORT_S`` seconds.
"""

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    DefaultSensorStatus,
    MetadataValue,
    SensorEvaluationContext,
    SkipReason,
    multi_asset_check,
    sensor,
)
from pydantic import Field

from ngsi_assets.increments import FOLDED_FILE, HourContent, Increment
from ngsi_assets.ingest.landing import SegmentInfo, iter_complete_lines
from ngsi_assets.settings import VariableSettings
from resources.lake import LakeResource
from resources.landing import LandingZoneResource

RECEIVED_FILE = "_received.json"
RECEIVED_UNTIL = "ngsi/received_until"
CHECK_NAME = "freshness"
# The assets whose freshness is followed: every hourly asset computed from the landing zone.
FOLLOWED = (
    "message_store",
    "ngsi_events",
    "last_data",
    "historic_tables",
    "mongo_raw",
    "versioned_entities",
    "transaction_history",
    "sth_aggregates",
)
# A segment written this long after an asset's newest receive time holds newer lines: a line is
# written a few milliseconds after it is received (the receiver answers once it is written).
WRITE_SLACK_S = 1.0
# Hours examined: the newest hours of the landing zone (an hour that closed long ago and was never
# processed is the landing sensor's and the repair's business, not a lag).
RECENT_HOURS = 3


# ---- the message store's record of receive times ----------------------------------------------


@dataclass(frozen=True)
class Received:
    """An hour's newest receive times (epoch ms): of its whole-hour rows, and of each increment."""

    whole: int | None = None
    increments: Mapping[str, int] = field(default_factory=dict)

    def to_text(self) -> str:
        return json.dumps({"whole": self.whole, "increments": dict(sorted(self.increments.items()))})

    @staticmethod
    def from_text(text: str | None) -> "Received":
        """Nothing known for no text or damaged text (freshness is then unknown, nothing else)."""
        if not text:
            return Received()
        try:
            raw = json.loads(text)
            whole = raw.get("whole")
            incs = {str(k): int(v) for k, v in (raw.get("increments") or {}).items()}
            return Received(None if whole is None else int(whole), incs)
        except (ValueError, TypeError, AttributeError):
            return Received()

    def of(self, content: HourContent) -> int | None:
        """The newest receive time among what ``content`` names (its whole-hour rows, its increments)."""
        found = [self.whole] if self.whole is not None and content.whole.get("message_store") else []
        found += [self.increments[i] for i in content.increments if i in self.increments]
        return max(found) if found else None

    def newest(self) -> int | None:
        """The newest receive time of the hour, whatever holds it."""
        found = [ms for ms in [self.whole, *self.increments.values()] if ms is not None]
        return max(found) if found else None


def record_whole_hours(lake: LakeResource, newest: Mapping[str, int | None]) -> None:
    """After a whole-hour message store write: each hour's newest receive time ({key: ms})."""
    for key, ms in newest.items():
        lake.write_hour_file("message_store", key, RECEIVED_FILE, Received(ms).to_text())


def record_increment(lake: LakeResource, key: str, increment_id: str, ms: int | None) -> None:
    """After an increment's rows are stored: its newest receive time, beside the hour's others."""
    if ms is None:
        return
    old = Received.from_text(lake.read_hour_file("message_store", key, RECEIVED_FILE))
    lake.write_hour_file(
        "message_store", key, RECEIVED_FILE, Received(old.whole, {**old.increments, increment_id: ms}).to_text()
    )


def _received(lake: LakeResource, key: str) -> Received:
    return Received.from_text(lake.read_hour_file("message_store", key, RECEIVED_FILE))


def hours_received(lake: LakeResource, contents: Mapping[str, HourContent]) -> int | None:
    """The newest receive time among what ``contents`` names, over its hours."""
    found = [ms for key, content in contents.items() if (ms := _received(lake, key).of(content)) is not None]
    return max(found) if found else None


def ledger_received(lake: LakeResource, ledger: str, keys: Sequence[str]) -> int | None:
    """The newest receive time among what a derived asset's ledger (``FOLDED_FILE``) says it folded."""
    contents = {}
    for key in keys:
        content = HourContent.from_text(lake.read_hour_file(ledger, key, FOLDED_FILE))
        if content is not None:
            contents[key] = content
    return hours_received(lake, contents)


def run_received(lake: LakeResource, keys: Sequence[str], tags: Mapping[str, str]) -> int | None:
    """For the assets of the ingest lane: the run's increment's newest receive time, or (a whole-hour
    run) the newest of its hours'."""
    inc = Increment.from_tags(tags)
    if inc is not None:
        return _received(lake, inc.hour_of(keys)).increments.get(inc.id)
    found = [ms for key in keys if (ms := _received(lake, key).newest()) is not None]
    return max(found) if found else None


def received_metadata(ms: int | None) -> dict[str, MetadataValue]:
    """The materialization metadata entry for a newest receive time (none when unknown)."""
    return {} if ms is None else {RECEIVED_UNTIL: MetadataValue.timestamp(ms / 1000.0)}


# ---- the lag ----------------------------------------------------------------------------------


class FreshnessSettings(VariableSettings):
    """The freshness checks' limit and reporting, from ``NGSI_*`` variables."""

    what: ClassVar[str] = "freshness settings"

    limit_s: float = Field(
        60.0,
        gt=0,
        alias="NGSI_FRESHNESS_LIMIT_S",
        description="Seconds an asset may lag behind what the receiver acknowledged before its freshness check "
        "fails (the derived lane's assets: plus the time between two derived runs and a derived run).",
    )
    report_s: float = Field(
        300.0,
        gt=0,
        alias="NGSI_FRESHNESS_REPORT_S",
        description="Seconds between freshness reports of an asset whose result has not changed.",
    )


def asset_limits(env: Mapping[str, str], last_derived_s: float | None = None) -> dict[str, float]:
    """The freshness limit of each followed asset, from the ``NGSI_*`` variables in ``env``: the
    assets outside the increments (the derived lane's) are brought up to date by derived runs, by
    design as often as their cost allows (``ContinuousSettings.derived_interval`` after a run of
    ``last_derived_s``, the newest finished derived run's seconds), so they get that interval and
    that run's duration on top."""
    from ngsi_assets.sensors import ContinuousSettings  # the sensors module imports this one

    limit_s = FreshnessSettings.from_env(env).limit_s
    continuous = ContinuousSettings.from_env(env)
    increments = continuous.increment_assets
    derived = continuous.derived_interval(last_derived_s) + (last_derived_s or 0.0)
    return {a: limit_s + (0.0 if a in increments else derived) for a in FOLLOWED}


def instance_limits(instance: DagsterInstance) -> dict[str, float]:
    """``asset_limits`` of this process's environment, after the instance's newest finished derived run."""
    from ngsi_assets.sensors import last_derived_run_s  # the sensors module imports this one

    return asset_limits(os.environ, last_derived_run_s(instance))


@dataclass(frozen=True)
class HourLanded:
    """An hour of the landing zone: when its newest line was written and its first line received (s)."""

    key: str
    newest_write_s: float
    first_received_s: float | None


@dataclass(frozen=True)
class Lag:
    """How far behind an asset is: ``lag_s`` (0: it holds everything that landed), the hour where it is
    worst, and the asset's newest receive time there (None: never materialized with one)."""

    lag_s: float
    hour: str | None
    received_until_s: float | None


def lag_of(now_s: float, hours: Sequence[HourLanded], received: Mapping[str, float | None]) -> Lag:
    """The lag of an asset from its newest receive time per hour (``received``). Pure.

    An hour it holds up to time R is behind when a segment of it was written after R (plus
    ``WRITE_SLACK_S``): by the age of its oldest missing line, at most ``now - R``; an hour it never
    recorded is behind by the age of the hour's first line.
    """
    worst = Lag(0.0, None, None)
    for h in hours:
        r = received.get(h.key)
        if r is not None and h.newest_write_s <= r + WRITE_SLACK_S:
            continue
        since = r if r is not None else h.first_received_s
        if since is None:
            continue
        lag = max(0.0, now_s - since)
        if lag > worst.lag_s:
            worst = Lag(lag, h.key, r)
    return worst


def landed_hours(landing: LandingZoneResource, recent: int = RECENT_HOURS) -> list[HourLanded]:
    """The newest ``recent`` hours of the landing zone, from their segments' write times."""
    by_hour: dict[str, list[SegmentInfo]] = {}
    for seg in landing.segments():
        by_hour.setdefault(seg.partition_key, []).append(seg)
    out = []
    for key in sorted(by_hour)[-recent:]:
        segs = by_hour[key]
        newest = 0.0
        for seg in segs:
            try:
                newest = max(newest, seg.path.stat().st_mtime)
            except FileNotFoundError:
                continue
        out.append(HourLanded(key, newest, _first_received_s(segs)))
    return out


def _first_received_s(segments: Sequence[SegmentInfo]) -> float | None:
    """The receive time of an hour's earliest first line (a line is an envelope with ``recv_ms``)."""
    found = []
    for seg in segments:
        try:
            first = next(iter_complete_lines(seg.path), None)
            if first is not None:
                found.append(int(json.loads(first)["recv_ms"]) / 1000.0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return min(found) if found else None


def asset_received(instance: DagsterInstance, asset: str, keys: Sequence[str]) -> dict[str, float | None]:
    """Per hour, the newest receive time of the asset's latest materialization of it that has one."""
    out: dict[str, float | None] = {}
    for key in keys:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[key]), limit=1
        ).records
        value = None
        if records and records[0].asset_materialization is not None:
            entry = records[0].asset_materialization.metadata.get(RECEIVED_UNTIL)
            value = getattr(entry, "value", None)
        out[key] = float(value) if value is not None else None
    return out


def lags(instance: DagsterInstance, landing: LandingZoneResource, now_s: float) -> dict[str, Lag]:
    """Every followed asset's lag now."""
    hours = landed_hours(landing)
    keys = [h.key for h in hours]
    return {a: lag_of(now_s, hours, asset_received(instance, a, keys)) for a in FOLLOWED}


def evaluation_metadata(lag: Lag, limit_s: float) -> dict[str, MetadataValue]:
    meta: dict[str, MetadataValue] = {
        "lag_s": MetadataValue.float(round(lag.lag_s, 1)),
        "limit_s": MetadataValue.float(limit_s),
    }
    if lag.hour is not None:
        meta["behind_in_hour"] = MetadataValue.text(lag.hour)
    if lag.received_until_s is not None:
        meta["received_until"] = MetadataValue.timestamp(lag.received_until_s)
    return meta


def outcome(asset: str, lag: Lag, limit_s: float) -> dict[str, object]:
    """The fields of the asset's ``freshness`` check result, run or reported."""
    passed = lag.lag_s <= limit_s
    if passed:
        text = f"{asset} holds everything acknowledged more than {limit_s:g} s ago (lag {lag.lag_s:.1f} s)."
    else:
        text = (
            f"{asset} lags {lag.lag_s:.1f} s behind what the receiver acknowledged (limit {limit_s:g} s), in hour "
            f"{lag.hour}: its runs are not keeping up, or none ran."
        )
    return {
        "asset_key": AssetKey(asset),
        "check_name": CHECK_NAME,
        "passed": passed,
        "severity": AssetCheckSeverity.WARN,
        "description": text,
        "metadata": evaluation_metadata(lag, limit_s),
    }


# ---- the check and the sensor that reports it ---------------------------------------------------


@multi_asset_check(
    specs=[
        AssetCheckSpec(
            CHECK_NAME,
            asset=a,
            description="Everything the receiver acknowledged more than NGSI_FRESHNESS_LIMIT_S seconds ago (plus "
            "the time between two derived runs and a derived run, for the derived lane's assets) is in the asset "
            "(reported by freshness_sensor; metadata lag_s: seconds behind).",
        )
        for a in FOLLOWED
    ],
    can_subset=True,
)
def freshness_checks(context: AssetCheckExecutionContext, landing: LandingZoneResource) -> Iterator[AssetCheckResult]:
    """The freshness of each asset now, as the sensor reports it."""
    limits = instance_limits(context.instance)
    found = lags(context.instance, landing, datetime.now(UTC).timestamp())
    for key in context.selected_asset_check_keys:
        asset = key.asset_key.to_user_string()
        yield AssetCheckResult(**outcome(asset, found[asset], limits[asset]))  # type: ignore[arg-type]


# The jobs leave the freshness checks out: the sensor reports them without a run.
FRESHNESS_CHECKS = AssetSelection.checks(freshness_checks)


@dataclass(frozen=True)
class Report:
    asset: str
    lag: Lag
    passed: bool


def due_reports(
    found: Mapping[str, Lag],
    last: Mapping[str, Sequence[object]],
    now_s: float,
    limits: Mapping[str, float],
    report_s: float,
) -> list[Report]:
    """The checks to report: those whose result (lag within the asset's limit) changed since
    ``last`` ({asset: [passed, at]}), and the others every ``report_s``. Pure."""
    out = []
    for asset, lag in found.items():
        passed = lag.lag_s <= limits[asset]
        before = last.get(asset)
        if before is None or bool(before[0]) != passed or now_s - float(before[1]) >= report_s:  # type: ignore[arg-type]
            out.append(Report(asset, lag, passed))
    return out


FRESHNESS_SENSOR_INTERVAL_S = 10


@sensor(
    minimum_interval_seconds=FRESHNESS_SENSOR_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Reports each asset's freshness check: how far behind what the receiver acknowledged it is.",
)
def freshness_sensor(context: SensorEvaluationContext, landing: LandingZoneResource) -> Iterator[SkipReason]:
    settings = FreshnessSettings.from_env(os.environ)
    limits = instance_limits(context.instance)
    now_s = datetime.now(UTC).timestamp()
    try:
        last = json.loads(context.cursor) if context.cursor else {}
    except ValueError:
        last = {}
    found = lags(context.instance, landing, now_s)
    reports = due_reports(found, last, now_s, limits, settings.report_s)
    for r in reports:
        context.instance.report_runless_asset_event(
            AssetCheckEvaluation(**outcome(r.asset, r.lag, limits[r.asset]))  # type: ignore[arg-type]
        )
        last[r.asset] = [r.passed, now_s]
    if reports:
        context.update_cursor(json.dumps(last, sort_keys=True))
    behind = {a: round(v.lag_s, 1) for a, v in found.items() if v.lag_s > limits[a]}
    yield SkipReason(f"behind their limits (s): {behind}" if behind else "every asset within its limit")
