"""Sensors: new landing data -> runs for exactly the hours it touches."""

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, define_asset_job, sensor

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.ingest.landing import SegmentInfo
from ngsi_assets.partitions import hourly_partitions
from resources.landing import LandingZoneResource

# Hours newer than (newest hour seen - LOOKBACK_HOURS) are tracked one by one in the cursor; older
# hours are folded into one signature, so the cursor stays small however long the platform runs.
LOOKBACK_HOURS = 48

ingest_job = define_asset_job(
    "ngsi_ingest_job",
    selection=[message_store, ngsi_events],
    partitions_def=hourly_partitions,
    description="Landing zone -> message_store -> ngsi_events for the hours given.",
)


@dataclass(frozen=True)
class LandingCursor:
    """What the sensor has already requested runs for.

    ``hours`` maps a recent hour's partition key to its signature (segment count and total bytes);
    ``sealed_before`` is the oldest tracked hour, and ``sealed`` the signature of everything older.
    """

    hours: dict[str, str] = field(default_factory=dict)
    sealed_before: str | None = None
    sealed: str = "0:0"

    def to_json(self) -> str:
        return json.dumps({"hours": self.hours, "sealed_before": self.sealed_before, "sealed": self.sealed})

    @staticmethod
    def from_json(text: str | None) -> "LandingCursor":
        if not text:
            return LandingCursor()
        raw = json.loads(text)
        return LandingCursor(dict(raw["hours"]), raw["sealed_before"], raw["sealed"])


def _signature(segments: Iterable[SegmentInfo]) -> str:
    segs = list(segments)
    return f"{len(segs)}:{sum(s.size for s in segs)}"


def _hours_before(key: str, hours: int) -> str:
    t = datetime.strptime(key, "%Y-%m-%d-%H:%M") - timedelta(hours=hours)
    return t.strftime("%Y-%m-%d-%H:%M")


def plan_landing_runs(
    segments: Sequence[SegmentInfo], cursor: LandingCursor, lookback_hours: int = LOOKBACK_HOURS
) -> tuple[list[tuple[str, str]], LandingCursor]:
    """(partition key, run key) for every hour whose landing data changed, and the next cursor.

    An hour's run key carries its signature, so the same data never gets two runs (Dagster
    launches a run key once per sensor) and any growth of an hour gets a new run. Pure: no I/O.
    """
    by_hour: dict[str, list[SegmentInfo]] = {}
    for seg in segments:
        by_hour.setdefault(seg.partition_key, []).append(seg)
    if not by_hour:
        return [], cursor
    sealed_before = _hours_before(max(by_hour), lookback_hours)
    if cursor.sealed_before is not None:
        sealed_before = max(sealed_before, cursor.sealed_before)

    def request(hour: str) -> tuple[str, str]:
        return hour, f"{hour}@{_signature(by_hour[hour])}"

    requests: list[tuple[str, str]] = []
    previously_sealed = [h for h in sorted(by_hour) if cursor.sealed_before is not None and h < cursor.sealed_before]
    if _signature(s for h in previously_sealed for s in by_hour[h]) != cursor.sealed:
        # Files restored or copied into long-past hours by hand: ask for all of them; run keys
        # make Dagster launch only the hours whose own data changed.
        requests.extend(request(h) for h in previously_sealed)
    tracked: dict[str, str] = {}
    for hour in sorted(by_hour):
        if hour in previously_sealed:
            continue
        sig = _signature(by_hour[hour])
        if cursor.hours.get(hour) != sig:
            requests.append(request(hour))
        if hour >= sealed_before:
            tracked[hour] = sig
    sealed = _signature(s for h in by_hour if h < sealed_before for s in by_hour[h])
    return requests, LandingCursor(tracked, sealed_before, sealed)


@sensor(
    job=ingest_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Runs the hours that new landing data touches.",
)
def landing_sensor(context: SensorEvaluationContext, landing: LandingZoneResource) -> Iterator[RunRequest | SkipReason]:
    cursor = LandingCursor.from_json(context.cursor)
    requests, new_cursor = plan_landing_runs(landing.segments(), cursor)
    if not requests:
        yield SkipReason("no new landing data")
        return
    for partition_key, run_key in requests:
        yield RunRequest(run_key=run_key, partition_key=partition_key, tags={"ngsi/landing": run_key})
    context.update_cursor(new_cursor.to_json())
