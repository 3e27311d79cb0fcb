"""Sensors: new landing data -> runs for exactly the hours it touches; hours with messages left in
status 1 (requires reprocessing) -> reruns of versioned_entities on a backoff schedule."""

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogRecord,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    sensor,
)
from dagster._core.storage.tags import MAX_RUNTIME_SECONDS_TAG
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ngsi_assets.assets.ingest import message_store
from ngsi_assets.freshness import FRESHNESS_CHECKS
from ngsi_assets.increments import (
    EXTENDS_TAG,
    INCREMENT_TAG,
    NEW_INCREMENTS_TAG,
    SIDE_BY_SIDE_TAG,
    Increment,
    segment_hour,
)
from ngsi_assets.ingest.landing import SegmentInfo
from ngsi_assets.settings import VariableSettings
from resources.landing import LandingZoneResource

# Hours newer than (newest hour seen - LOOKBACK_HOURS) are tracked one by one in the cursor; older
# hours are folded into one signature, so the cursor stays small however long the platform runs.
LOOKBACK_HOURS = 48

ingest_job = define_asset_job(
    "ngsi_ingest_job",
    # The message store and everything computed from it: the whole platform for the hours given.
    selection=AssetSelection.assets(message_store).downstream() - FRESHNESS_CHECKS,
    description="Landing zone -> message_store -> ngsi_events -> versioned entities and sinks, for the hours given.",
)


# Continuous runs: the landing sensor keeps the hot path (message store to last data, historic
# tables, raw history and STH aggregates) fed with increments, and brings the rest of the platform
# up to date hour by hour. Two lanes, one run at a time in each (dagster.yaml's
# tag_concurrency_limits): the ingest lane (increments, in order) and the derived lane (versioned
# entities, transaction history, and reprocessing). A whole-hour run writes everything, so it takes
# both lanes.
INGEST_LANE = "ngsi/ingest-lane"
DERIVED_LANE = "ngsi/derived-lane"
REPAIR_TAG = "ngsi/repair"
BASE_INCREMENT_ASSETS = ("message_store", "ngsi_events", "last_data", "historic_tables", "mongo_raw")
# The assets built from the versioned entities' fold: the derived runs' own, unless the increments take them.
FOLDED_ASSETS = ("versioned_entities", "transaction_history")


class ContinuousSettings(VariableSettings):
    """How often the derived assets of an hour are brought up to date, from ``NGSI_*`` variables."""

    what: ClassVar[str] = "continuous mode settings"

    # Derived runs as often as their cost allows: at least derived_interval_s apart, and each run's
    # duration at most derived_share of the time since the one before, so the derived lane takes a
    # bounded part of the machine whatever the traffic (a run of 15 s: every 60 s; of 40 s at a higher
    # rate: every 160 s), and the increments keep the rest.
    derived_interval_s: float = Field(
        60.0,
        gt=0,
        alias="NGSI_DERIVED_INTERVAL_S",
        description="Least seconds between derived runs (versioned entities, history) of an hour in progress.",
    )
    derived_share: float = Field(
        0.25,
        gt=0,
        le=1,
        alias="NGSI_DERIVED_SHARE",
        description="Part of the time the derived runs may take: the next one waits at least the last one's "
        "duration divided by this.",
    )
    # Entities and history spaces a derived run processes at once (the run tag ngsi/side-by-side):
    # one leaves the second core to the increments; a whole-hour run keeps the assets' default.
    derived_side_by_side: int = Field(
        1,
        ge=1,
        alias="NGSI_DERIVED_SIDE_BY_SIDE",
        description="Entities and history spaces a derived run does at once.",
    )
    hour_grace_s: float = Field(
        120.0,
        ge=0,
        alias="NGSI_HOUR_GRACE_S",
        description="Seconds after an hour ends before its closing derived run (late notifications).",
    )
    # A run whose process died (killed, machine lost) stays "started" and would hold its lane for
    # ever: Dagster's run monitoring (dagster.yaml) cancels a run older than this, and a canceled
    # increment gets its whole-hour repair. Well above what a run takes.
    increment_max_runtime_s: float = Field(
        900.0,
        gt=0,
        alias="NGSI_INCREMENT_MAX_RUNTIME_S",
        description="Seconds after which an increment run is canceled (and its hour repaired whole).",
    )
    hour_max_runtime_s: float = Field(
        3600.0, gt=0, alias="NGSI_HOUR_MAX_RUNTIME_S", description="Seconds after which a whole-hour run is canceled."
    )
    # Where the STH aggregates are brought up to date: in the increments (seconds behind, each
    # increment run longer by the sth step), or in the derived runs (a minute or more behind).
    # Read when the definitions load: the jobs' selections follow it.
    sth_in_increments: bool = Field(
        True,
        alias="NGSI_STH_IN_INCREMENTS",
        description="true: the increment runs add their samples to the STH aggregates (seconds behind); false: the "
        "derived runs do (shorter increment runs, fresher last data).",
    )

    # Where the versioned entities and the transaction history are brought up to date: in every
    # increment (an increment behind, each increment longer by those steps), or in the derived runs
    # (as often as their cost allows, a minute or more behind). Measured at 100 and 300 notifications/s
    # on two cores (BENCHMARKS.md, "Continuous operation"): the increments fresher for the same last
    # data, and nothing left unfolded when the traffic stops. Read when the definitions load.
    derived_in_increments: bool = Field(
        True,
        alias="NGSI_DERIVED_IN_INCREMENTS",
        description="true: every increment run also folds its notifications into the versioned entities and the "
        "transaction history (an increment behind, longer increments); false: the derived runs do (a minute or "
        "more behind).",
    )

    def derived_interval(self, last_run_s: float | None) -> float:
        """Seconds between two derived runs of an hour, after one that took ``last_run_s`` (None: none
        finished yet)."""
        return max(self.derived_interval_s, (last_run_s or 0.0) / self.derived_share)

    @property
    def increment_assets(self) -> tuple[str, ...]:
        """The assets of ``ngsi_increment_job``; the rest of the platform is the derived lane's."""
        return (
            *BASE_INCREMENT_ASSETS,
            *(("sth_aggregates",) if self.sth_in_increments else ()),
            *(FOLDED_ASSETS if self.derived_in_increments else ()),
        )

    @property
    def derived_assets(self) -> tuple[str, ...]:
        """The assets the derived runs bring up to date: those the increments leave (none when the
        increments take them all, and then the landing sensor asks for no derived run)."""
        return tuple(a for a in ("sth_aggregates", *FOLDED_ASSETS) if a not in self.increment_assets)

    def increment_tags(self) -> dict[str, str]:
        """The lanes an increment run holds: the ingest lane, and the derived lane too when it folds the
        versioned entities (a reprocessing run, which folds them as well, must not run beside it)."""
        return {INGEST_LANE: "1", **({DERIVED_LANE: "1"} if self.derived_in_increments else {})}


INCREMENT_ASSETS = ContinuousSettings.from_env(os.environ).increment_assets

increment_job = define_asset_job(
    "ngsi_increment_job",
    selection=AssetSelection.assets(*INCREMENT_ASSETS) - FRESHNESS_CHECKS,
    description="Continuous mode: what landed since the previous increment (run tag ngsi/increment) through the "
    "message store, the NGSI events, last data, historic tables, the raw MongoDB history, (unless "
    "NGSI_STH_IN_INCREMENTS=false) the STH aggregates and (with NGSI_DERIVED_IN_INCREMENTS=true) the versioned "
    "entities and the transaction history.",
)
derived_job = define_asset_job(
    "ngsi_derived_job",
    selection=AssetSelection.assets(message_store).downstream()
    - AssetSelection.assets(*INCREMENT_ASSETS)
    - FRESHNESS_CHECKS,
    description="Continuous mode: versioned entities and transaction history (and the STH aggregates with "
    "NGSI_STH_IN_INCREMENTS=false) of one hour, from what the increments stored so far.",
)


@dataclass(frozen=True)
class LandingCursor:
    """What the landing sensor has already asked for.

    ``positions``: per segment of a recent hour, the end of the last increment requested;
    ``derived``: per recent hour, the increments (a digest of its positions) its last derived run
    covers, and ``derived_at`` when that run was requested (epoch seconds). ``sealed_before`` is the
    oldest tracked hour and ``sealed`` the signature of everything older, so the cursor stays small
    however long the platform runs. ``hours`` is the whole-hour signature map of the cursor before
    increments existed: hours found there are recomputed whole once, then tracked by position.
    """

    positions: dict[str, int] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)
    derived_at: dict[str, float] = field(default_factory=dict)
    sealed_before: str | None = None
    sealed: str = "0:0"
    hours: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "positions": self.positions,
                "derived": self.derived,
                "derived_at": self.derived_at,
                "sealed_before": self.sealed_before,
                "sealed": self.sealed,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str | None) -> "LandingCursor":
        if not text:
            return LandingCursor()
        raw = json.loads(text)
        return LandingCursor(
            {k: int(v) for k, v in raw.get("positions", {}).items()},
            dict(raw.get("derived", {})),
            {k: float(v) for k, v in raw.get("derived_at", {}).items()},
            raw.get("sealed_before"),
            raw.get("sealed", "0:0"),
            dict(raw.get("hours", {})),
        )


@dataclass(frozen=True)
class OpenRuns:
    """What the instance holds of the landing sensor's runs that have not finished."""

    ingest_waiting: bool = False  # an ingest-lane run that has not started
    ingest_hours: frozenset[str] = frozenset()  # hours with an ingest-lane run queued or executing
    derived_waiting: bool = False
    # Seconds the newest finished derived run took (start to end), None when none has finished.
    last_derived_s: float | None = None


@dataclass(frozen=True)
class LandingRequest:
    job_name: str
    partition_key: str
    run_key: str
    tags: dict[str, str]


def _signature(segments: Iterable[SegmentInfo]) -> str:
    segs = list(segments)
    return f"{len(segs)}:{sum(s.size for s in segs)}"


def _hours_before(key: str, hours: int) -> str:
    t = datetime.strptime(key, "%Y-%m-%d-%H:%M") - timedelta(hours=hours)
    return t.strftime("%Y-%m-%d-%H:%M")


def _hour_end(key: str) -> datetime:
    return datetime.strptime(key, "%Y-%m-%d-%H:%M").replace(tzinfo=UTC) + timedelta(hours=1)


def _positions_digest(positions: Mapping[str, int], hour: str) -> str:
    mine = sorted((n, p) for n, p in positions.items() if segment_hour(n) == hour)
    return f"{len(mine)}:{sum(p for _, p in mine)}"


def max_runtime_s(job_name: str, settings: ContinuousSettings) -> float:
    """How long a sensor run of ``job_name`` may take before run monitoring cancels it."""
    return settings.increment_max_runtime_s if job_name == increment_job.name else settings.hour_max_runtime_s


def derived_run_tags(settings: ContinuousSettings) -> dict[str, str]:
    """The tags of a derived run: its lane, its width, and folding only what is new."""
    return {DERIVED_LANE: "1", SIDE_BY_SIDE_TAG: str(settings.derived_side_by_side), NEW_INCREMENTS_TAG: "1"}


def whole_hour_request(hour: str, run_key: str, **tags: str) -> LandingRequest:
    return LandingRequest(
        ingest_job.name, hour, run_key, {INGEST_LANE: "1", DERIVED_LANE: "1", "ngsi/landing": run_key, **tags}
    )


def plan_landing_runs(
    segments: Sequence[SegmentInfo],
    pending: Mapping[str, Sequence[int]],
    cursor: LandingCursor,
    now: datetime,
    open_runs: OpenRuns | None = None,
    settings: ContinuousSettings | None = None,
    lookback_hours: int = LOOKBACK_HOURS,
) -> tuple[list[LandingRequest], LandingCursor]:
    """The runs to request for new landing data, and the next cursor. Pure: no I/O.

    ``pending``: per segment, the complete-line byte range [from, to) past ``cursor.positions``.

    - The oldest hour with pending ranges gets an increment run of those ranges, growing to what
      lands in the hour until it starts (``EXTENDS_TAG``), unless an ingest-lane run is waiting
      already: then nothing (that run will take them). One run executes, one waits, at most.
    - An hour whose increments moved since its last derived run gets a derived run when it is
      closed (its end plus ``hour_grace_s`` has passed, nothing of it is pending or executing) or
      when ``settings.derived_interval(open_runs.last_derived_s)`` has passed since the last one (the
      least interval, longer after a long run); one waiting derived run at most.
      Hours are folded in order: a later hour gets none while an ended one waits for its closing run.
    - Hours older than the lookback are sealed into one signature; data appearing there (files
      restored by hand) gets whole-hour runs, as does an hour known only to a cursor from before
      increments.
    """
    open_runs = open_runs or OpenRuns()
    settings = settings or ContinuousSettings()
    by_hour: dict[str, list[SegmentInfo]] = {}
    for seg in segments:
        by_hour.setdefault(seg.partition_key, []).append(seg)
    if not by_hour:
        return [], cursor
    sealed_before = _hours_before(max(by_hour), lookback_hours)
    if cursor.sealed_before is not None:
        sealed_before = max(sealed_before, cursor.sealed_before)
    requests: list[LandingRequest] = []
    previously_sealed = [h for h in sorted(by_hour) if cursor.sealed_before is not None and h < cursor.sealed_before]
    if _signature(s for h in previously_sealed for s in by_hour[h]) != cursor.sealed:
        # Files restored or copied into long-past hours by hand: ask for all of them; run keys
        # make Dagster launch only the hours whose own data changed.
        requests.extend(whole_hour_request(h, f"{h}@{_signature(by_hour[h])}") for h in previously_sealed)
    positions = {n: p for n, p in cursor.positions.items() if segment_hour(n) >= sealed_before}
    todo: dict[str, dict[str, list[int]]] = {}
    leaving: set[str] = set()
    for name, r in pending.items():
        hour = segment_hour(name)
        if hour in previously_sealed:
            continue
        if hour >= sealed_before:
            todo.setdefault(hour, {})[name] = [int(r[0]), int(r[1])]
        else:
            leaving.add(hour)
    # Hours sealed with data no increment read (a landing zone older than the lookback when the
    # sensor first starts, or the sensor off for days) are recomputed whole.
    requests.extend(whole_hour_request(h, f"{h}@{_signature(by_hour[h])}") for h in sorted(leaving))
    # An hour the cursor before increments knew is recomputed whole once, then followed by position.
    migrated: set[str] = set()
    for hour in sorted(h for h in cursor.hours if h in todo and not any(segment_hour(n) == h for n in positions)):
        requests.append(whole_hour_request(hour, f"{hour}@migrate:{_signature(by_hour[hour])}"))
        for name, r in todo.pop(hour).items():
            positions[name] = r[1]
        migrated.add(hour)
    # Hours some increment was requested for before this tick: what a derived run could fold.
    requested_before = {segment_hour(n) for n in positions}
    # One increment executes, the next waits: it starts as soon as the lane is free (no sensor tick
    # in between) and, growing to what landed by then, leaves nothing that landed while it waited
    # to the run after it. Its ranges may overlap what the executing run grew to: it takes only
    # what is not stored when it starts (``ingest._claim``).
    if todo and not open_runs.ingest_waiting:
        increment_hour = min(todo)
        inc = Increment.of(todo[increment_hour])
        requests.append(
            LandingRequest(
                increment_job.name,
                increment_hour,
                f"{increment_hour}@{inc.id}",
                {INCREMENT_TAG: inc.to_tag(), EXTENDS_TAG: "1", **settings.increment_tags()},
            )
        )
        for name, (_, end) in inc.ranges.items():
            positions[name] = end
    derived = {h: d for h, d in cursor.derived.items() if h >= sealed_before}
    derived_at = {h: t for h, t in cursor.derived_at.items() if h >= sealed_before}
    for hour in migrated:  # the whole-hour run computes the derived assets too
        derived[hour] = _positions_digest(positions, hour)
        derived_at[hour] = now.timestamp()
    if settings.derived_assets and not open_runs.derived_waiting:
        interval = settings.derived_interval(open_runs.last_derived_s)
        for hour in sorted({segment_hour(n) for n in positions}):
            digest = _positions_digest(positions, hour)
            if derived.get(hour) == digest:
                continue
            closed = (
                now >= _hour_end(hour) + timedelta(seconds=settings.hour_grace_s)
                and hour not in todo
                and hour not in open_runs.ingest_hours
            )
            # An hour that has ended waits for its closing run rather than a periodic one.
            due = now < _hour_end(hour) and now.timestamp() - derived_at.get(hour, 0.0) >= interval
            # Not in the tick of an hour's first increment: the run would find nothing to fold. Any
            # later tick may ask for both; under steady traffic nearly every tick asks for an
            # increment, and a derived run that waited for a tick without one never came (measured:
            # 2 derived runs in 20 minutes at 100/s, at the start and after the traffic).
            if closed or (due and hour in requested_before):
                tags = derived_run_tags(settings)
                # A run requested while increments of the hour are still open may start before they
                # end: it covers them only partly ("~", and a run key of its own, so that the run asked
                # for once they have ended is not taken for it and dropped as a repeated run key).
                covers_all = closed or (hour not in todo and hour not in open_runs.ingest_hours)
                state = digest if covers_all else "~" + digest
                requests.append(LandingRequest(derived_job.name, hour, f"{hour}@derived:{state}", tags))
                derived[hour] = state
                derived_at[hour] = now.timestamp()
                break
            if now >= _hour_end(hour):
                # An ended hour's closing run comes before any run of a later hour. Folded after the
                # later hour, the tail of this one would be late for every key it touches, and the
                # versioned entities would rewrite all their buckets whole, history included.
                break
    sealed = _signature(s for h in by_hour if h < sealed_before for s in by_hour[h])
    return requests, LandingCursor(positions, derived, derived_at, sealed_before, sealed)


# Below the sensor daemon's loop (5 s, dagster/_daemon/sensor.py MIN_INTERVAL_LOOP_TIME), so every loop
# evaluates the sensor. At 5 s, a loop that reached the sensor a few milliseconds earlier than the
# previous one found "under the minimum interval" and skipped it: measured, 39 of 84 gaps between
# ticks were 10 s, and an increment waited on average 5.3 s instead of 2.5 s for its request.
LANDING_SENSOR_INTERVAL_S = 1


@sensor(
    jobs=[ingest_job, increment_job, derived_job],
    minimum_interval_seconds=LANDING_SENSOR_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Continuous mode: increments of new landing data through the message store to last data and "
    "historic tables, derived runs (versioned entities, history) per hour, and whole-hour repairs of "
    "failed increments.",
)
def landing_sensor(context: SensorEvaluationContext, landing: LandingZoneResource) -> Iterator[RunRequest | SkipReason]:
    cursor = LandingCursor.from_json(context.cursor)
    open_runs = open_landing_runs(context.instance)
    segments = landing.segments()
    # Only hours the cursor still tracks are read for new ranges: older ones are sealed.
    recent = [s for s in segments if cursor.sealed_before is None or s.partition_key >= cursor.sealed_before]
    pending = landing.complete_ranges(recent, cursor.positions)
    settings = ContinuousSettings.from_env(os.environ)
    requests, new_cursor = plan_landing_runs(segments, pending, cursor, utc_now(), open_runs, settings)
    requests += repair_requests(context.instance)
    for req in requests:
        yield RunRequest(
            run_key=req.run_key,
            job_name=req.job_name,
            partition_key=req.partition_key,
            tags={**req.tags, MAX_RUNTIME_SECONDS_TAG: str(int(max_runtime_s(req.job_name, settings)))},
        )
    if new_cursor != cursor:
        context.update_cursor(new_cursor.to_json())
    if not requests:
        if pending and open_runs.ingest_waiting:
            yield SkipReason("new landing data left to the increment waiting in the ingest lane")
        else:
            yield SkipReason("no new landing data")


# Runs that exist but have not begun executing steps.
_WAITING_RUN_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
# Runs that are not finished: waiting, executing or being canceled.
OPEN_RUN_STATUSES = [*_WAITING_RUN_STATUSES, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
PARTITION_TAG = "dagster/partition"
_OPEN_RUNS_LIMIT = 1000
# Failed runs older than this are not repaired by the sensor any more (the UI still shows them).
REPAIR_WINDOW = timedelta(days=2)


def open_landing_runs(instance: DagsterInstance) -> OpenRuns:
    """The landing sensor's unfinished runs, by lane."""
    runs = instance.get_runs(
        filters=RunsFilter(statuses=OPEN_RUN_STATUSES),
        limit=_OPEN_RUNS_LIMIT,
    )
    ingest = [r for r in runs if INGEST_LANE in r.tags]
    return OpenRuns(
        ingest_waiting=any(r.status in _WAITING_RUN_STATUSES for r in ingest),
        ingest_hours=frozenset(r.tags[PARTITION_TAG] for r in ingest if PARTITION_TAG in r.tags),
        # (An increment that also holds the derived lane is the ingest lane's: NGSI_DERIVED_IN_INCREMENTS.)
        derived_waiting=any(
            r.status in _WAITING_RUN_STATUSES for r in runs if DERIVED_LANE in r.tags and INCREMENT_TAG not in r.tags
        ),
        last_derived_s=last_derived_run_s(instance),
    )


def last_derived_run_s(instance: DagsterInstance) -> float | None:
    """Seconds the newest finished derived run took, from its start to its end; None when none has."""
    records = instance.get_run_records(
        filters=RunsFilter(
            job_name=derived_job.name,
            statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED],
        ),
        limit=1,
    )
    if not records or records[0].start_time is None or records[0].end_time is None:
        return None
    return max(0.0, records[0].end_time - records[0].start_time)


def repair_requests(instance: DagsterInstance, now: datetime | None = None) -> list[LandingRequest]:
    """A whole-hour ingest run for each increment run that failed for good.

    "For good": failed or canceled, not itself a repair, and not retried by Dagster (run retries
    make a child run, judged on its own). The run key names the failed run, so each gets one
    repair; a repair that fails is left to the user (the UI shows it), never retried in a loop.
    """
    now = now or utc_now()
    failed = instance.get_runs(
        filters=RunsFilter(
            job_name=increment_job.name,
            statuses=[DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED],
            updated_after=now - REPAIR_WINDOW,
        ),
        limit=_OPEN_RUNS_LIMIT,
    )
    out = []
    for run in failed:
        hour = run.tags.get(PARTITION_TAG)
        if hour is None or REPAIR_TAG in run.tags:
            continue
        if instance.get_runs(filters=RunsFilter(tags={"dagster/parent_run_id": run.run_id}), limit=1):
            continue
        out.append(whole_hour_request(hour, f"repair:{run.run_id}", **{REPAIR_TAG: run.run_id}))
    return out


# --- Reprocessing: seed 004 status 1 ("requires reprocessing") resubmitted on a backoff schedule ---

VERSIONED_ENTITIES = AssetKey("versioned_entities")
# Metadata the versioned_entities asset puts on every partition's materialization.
COUNT_METADATA = "messages_requiring_reprocessing"
EXAMPLES_METADATA = "reprocessing_examples"
ATTEMPT_TAG = "ngsi/reprocess_attempt"
REASON_TAG = "ngsi/reprocess_reason"
# Event-log reading per tick is bounded: a long history (first start, or a sensor off for weeks) is
# caught up over several ticks, and no run is requested until the sensor has seen the newest event.
EVENT_PAGE_SIZE = 1000
EVENT_PAGES_PER_TICK = 10
# Runs that have not finished yet: their own materialization will report the partition's new count.
_UNFINISHED_RUN_STATUSES = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
_UNFINISHED_RUNS_LIMIT = 1000

reprocess_job = define_asset_job(
    "ngsi_reprocess_job",
    # With the transaction history, so what the reprocessing changed is committed as a transaction.
    selection=AssetSelection.assets(VERSIONED_ENTITIES).downstream() - FRESHNESS_CHECKS,
    description="Reprocesses every message of one hour of versioned_entities (resolves late links), then "
    "records the changes in the transaction history.",
)


class ReprocessSettings(BaseModel):
    """The reprocessing schedule, one instance per sensor tick, read from the ``NGSI_REPROCESS_*`` variables.

    The delay after attempt n (attempt 0 is the run that first left messages in status 1) is
    ``min(initial_delay_s * backoff_factor**n, max_delay_s)``. Once it reaches ``max_delay_s`` the
    partition keeps being retried every ``max_delay_s`` for as long as messages need it, unless
    ``max_attempts`` is set.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    initial_delay_s: float = Field(
        60.0, gt=0, alias="NGSI_REPROCESS_INITIAL_DELAY_S", description="Seconds before the first reprocessing."
    )
    backoff_factor: float = Field(
        2.0, ge=1, alias="NGSI_REPROCESS_BACKOFF_FACTOR", description="Each delay is this times the one before."
    )
    max_delay_s: float = Field(
        3600.0, gt=0, alias="NGSI_REPROCESS_MAX_DELAY_S", description="Longest delay between reprocessings."
    )
    max_attempts: int | None = Field(
        None, ge=1, alias="NGSI_REPROCESS_MAX_ATTEMPTS", description="Reprocessings of an hour; unset: no limit."
    )
    max_runs_per_tick: int = Field(
        20, ge=1, alias="NGSI_REPROCESS_MAX_RUNS_PER_TICK", description="Runs one sensor tick may request."
    )

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> "ReprocessSettings":
        if self.max_delay_s < self.initial_delay_s:
            raise ValueError(
                f"NGSI_REPROCESS_MAX_DELAY_S ({self.max_delay_s:g}) is below "
                f"NGSI_REPROCESS_INITIAL_DELAY_S ({self.initial_delay_s:g})"
            )
        return self

    @staticmethod
    def from_env(env: Mapping[str, str]) -> "ReprocessSettings":
        """Settings from the environment; unset or empty variables take their defaults.

        Raises ``ValueError`` naming each offending variable and what is wrong with it.
        """
        names = [f.alias for f in ReprocessSettings.model_fields.values() if f.alias]
        given = {name: env[name].strip() for name in names if env.get(name, "").strip()}
        try:
            return ReprocessSettings.model_validate(given)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']} (got {err['input']!r})"
                if err["loc"]
                else err["msg"]
                for err in exc.errors()
            )
            raise ValueError(f"invalid reprocessing settings: {problems}") from None

    def delay(self, attempt: int) -> timedelta:
        """The wait after attempt ``attempt`` before the next one."""
        try:
            seconds = min(self.initial_delay_s * self.backoff_factor**attempt, self.max_delay_s)
        except OverflowError:  # factor**n beyond float range after years of hourly retries
            seconds = self.max_delay_s
        return timedelta(seconds=seconds)


@dataclass(frozen=True)
class Observation:
    """One materialization of a versioned_entities partition, keyed by its event-log storage id.

    ``count`` is None when the materialization carries no usable ``messages_requiring_reprocessing``.
    """

    storage_id: int
    partition_key: str
    count: int | None
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class Backlog:
    """One partition whose newest materialization left messages in status 1, and its schedule.

    ``episode`` is the storage id of the materialization that opened the backlog: it keeps run keys
    unique when a partition clears and later needs reprocessing again (Dagster launches a run key once).
    """

    attempts: int
    since: datetime
    due: datetime
    count: int
    episode: int
    gave_up: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "attempts": self.attempts,
            "since": self.since.isoformat(),
            "due": self.due.isoformat(),
            "count": self.count,
            "episode": self.episode,
            "gave_up": self.gave_up,
        }

    @staticmethod
    def from_dict(raw: Mapping[str, object]) -> "Backlog":
        return Backlog(
            attempts=int(raw["attempts"]),  # type: ignore[call-overload]
            since=datetime.fromisoformat(str(raw["since"])),
            due=datetime.fromisoformat(str(raw["due"])),
            count=int(raw["count"]),  # type: ignore[call-overload]
            episode=int(raw["episode"]),  # type: ignore[call-overload]
            gave_up=bool(raw["gave_up"]),
        )


@dataclass(frozen=True)
class ReprocessCursor:
    """The reprocessing sensor's state: the last event-log storage id read, and the partitions in backlog."""

    after: int | None = None
    partitions: dict[str, Backlog] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"after": self.after, "partitions": {k: v.to_dict() for k, v in sorted(self.partitions.items())}},
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str | None) -> "ReprocessCursor":
        if not text:
            return ReprocessCursor()
        raw = json.loads(text)
        return ReprocessCursor(raw["after"], {k: Backlog.from_dict(v) for k, v in raw["partitions"].items()})


@dataclass(frozen=True)
class ReprocessRequest:
    """One run to request: reprocess every message of ``partition_key`` (attempt ``attempt``)."""

    partition_key: str
    run_key: str
    tags: dict[str, str]


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_reprocessing(
    cursor_state: ReprocessCursor,
    new_observations: Sequence[Observation],
    now: datetime,
    settings: ReprocessSettings,
    busy: Sequence[tuple[str, str]] = (),
    caught_up: bool = True,
) -> tuple[list[ReprocessRequest], ReprocessCursor, str | None]:
    """Runs to request now, one per due partition, and the next cursor; or why none (the skip reason).

    Pure: no I/O, ``now`` passed in. ``new_observations`` are materializations read since
    ``cursor_state.after``; the newest one per partition decides. A zero count drops the partition;
    a partition's first non-zero count opens its backlog, due ``delay(0)`` from ``now``; any later
    non-zero count (our own retry's result, or a landing run) only updates the count and keeps the
    schedule, so frequent landing runs never postpone nor hasten a retry. Each request advances the
    attempt n -> n+1 and sets the next due time to ``now + delay(n+1)``: the delay grows up to
    ``max_delay_s`` and then stays there, retrying every ``max_delay_s`` until the count reaches 0
    or ``max_attempts`` runs have been tried (then the partition is marked given up, and stays so
    until a zero count clears it). ``busy`` holds (first, last) partition-key ranges of runs not yet
    finished: a due partition inside one waits for that run's result instead of racing it. While
    ``caught_up`` is False (more events to read) no run is requested.
    """
    after = cursor_state.after
    newest: dict[str, Observation] = {}
    for obs in sorted(new_observations, key=lambda o: o.storage_id):
        after = obs.storage_id if after is None else max(after, obs.storage_id)
        if obs.count is not None:
            newest[obs.partition_key] = obs
    partitions = dict(cursor_state.partitions)
    for key, obs in newest.items():
        count = obs.count or 0
        if count == 0:
            partitions.pop(key, None)
        elif key in partitions:
            partitions[key] = replace(partitions[key], count=count)
        else:
            partitions[key] = Backlog(0, now, now + settings.delay(0), count, obs.storage_id)

    def summary() -> str:
        waiting = {k: b for k, b in partitions.items() if not b.gave_up}
        if not waiting and not partitions:
            return "no partition of versioned_entities has messages requiring reprocessing"
        text = f"{len(waiting)} partitions awaiting reprocessing ({sum(b.count for b in waiting.values())} messages)"
        upcoming = [b.due for k, b in waiting.items() if b.due > now]
        if upcoming:
            text += f", next due at {_iso(min(upcoming))}"
        given_up = len(partitions) - len(waiting)
        if given_up:
            text += f"; {given_up} given up after {settings.max_attempts} attempts"
        return text

    if not caught_up:
        return [], ReprocessCursor(after, partitions), f"reading the event log (up to storage id {after}); {summary()}"

    requests: list[ReprocessRequest] = []
    waiting_on_runs = 0
    for _, key in sorted((b.due, k) for k, b in partitions.items() if not b.gave_up and b.due <= now):
        backlog = partitions[key]
        if any(first <= key <= last for first, last in busy):
            waiting_on_runs += 1
            continue
        if settings.max_attempts is not None and backlog.attempts >= settings.max_attempts:
            partitions[key] = replace(backlog, gave_up=True)
            continue
        if len(requests) >= settings.max_runs_per_tick:
            continue  # stays due: requested on a later tick, oldest due first
        attempt = backlog.attempts + 1
        requests.append(
            ReprocessRequest(
                partition_key=key,
                run_key=f"reprocess:{key}:{backlog.episode}:{attempt}",
                tags={
                    # The same lane as derived runs: both write versioned entities and the history.
                    DERIVED_LANE: "1",
                    ATTEMPT_TAG: str(attempt),
                    REASON_TAG: f"{backlog.count} messages in status 1 (requires reprocessing) "
                    f"since {_iso(backlog.since)}",
                },
            )
        )
        partitions[key] = replace(backlog, attempts=attempt, due=now + settings.delay(attempt))
    if requests:
        return requests, ReprocessCursor(after, partitions), None
    reason = summary()
    if waiting_on_runs:
        reason += f"; {waiting_on_runs} due but waiting for an unfinished run of the same hour"
    return [], ReprocessCursor(after, partitions), reason


def _metadata_value(value: object) -> object:
    return value.value if isinstance(value, MetadataValue) else value


def _observation(record: EventLogRecord, log: logging.Logger | None) -> Observation | None:
    mat = record.asset_materialization
    if mat is None or mat.partition is None:
        return None
    count = _metadata_value(mat.metadata.get(COUNT_METADATA))
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        if log is not None:
            log.warning(
                f"versioned_entities {mat.partition} (storage id {record.storage_id}): "
                f"{COUNT_METADATA} is {count!r}, not a count; ignoring this materialization"
            )
        count = None
    examples = _metadata_value(mat.metadata.get(EXAMPLES_METADATA))
    if isinstance(examples, str):
        try:
            examples = json.loads(examples)
        except ValueError:
            examples = [examples]
    return Observation(
        record.storage_id,
        mat.partition,
        count,
        tuple(str(e) for e in examples[:5]) if isinstance(examples, list) else (),
    )


def read_observations(
    instance: DagsterInstance, after: int | None, log: logging.Logger | None = None
) -> tuple[list[Observation], int | None, bool]:
    """versioned_entities materializations with storage id above ``after``, oldest first, bounded per tick.

    Returns the observations, the last storage id read, and whether the newest event was reached.
    """
    observations: list[Observation] = []
    for _ in range(EVENT_PAGES_PER_TICK):
        result = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=VERSIONED_ENTITIES, after_storage_id=after),
            limit=EVENT_PAGE_SIZE,
            ascending=True,
        )
        for record in result.records:
            after = record.storage_id
            obs = _observation(record, log)
            if obs is not None:
                observations.append(obs)
        if not result.has_more:
            return observations, after, True
    return observations, after, False


def busy_partition_ranges(instance: DagsterInstance) -> list[tuple[str, str]]:
    """(first, last) partition keys of every run not finished yet, whatever its job."""
    ranges: list[tuple[str, str]] = []
    runs = instance.get_runs(filters=RunsFilter(statuses=_UNFINISHED_RUN_STATUSES), limit=_UNFINISHED_RUNS_LIMIT)
    for run in runs:
        tags = run.tags
        if "dagster/partition" in tags:
            ranges.append((tags["dagster/partition"], tags["dagster/partition"]))
        elif "dagster/asset_partition_range_start" in tags and "dagster/asset_partition_range_end" in tags:
            ranges.append((tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]))
    return ranges


def utc_now() -> datetime:
    """The reprocessing sensor's one clock (tests replace it)."""
    return datetime.now(UTC)


@sensor(
    job=reprocess_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description=(
        "Reruns the hours of versioned_entities whose messages still need reprocessing (seed 004 "
        "status 1, e.g. a link whose parent had not arrived), with exponential backoff up to "
        "NGSI_REPROCESS_MAX_DELAY_S, then every NGSI_REPROCESS_MAX_DELAY_S."
    ),
)
def reprocessing_sensor(context: SensorEvaluationContext) -> Iterator[RunRequest | SkipReason]:
    """One run of ``ngsi_reprocess_job`` per versioned_entities hour whose retry is due.

    Reads the materializations recorded since the cursor's storage id (metadata
    ``messages_requiring_reprocessing``), plans with ``plan_reprocessing`` and keeps the schedule
    in the cursor. Retries back off from NGSI_REPROCESS_INITIAL_DELAY_S by
    NGSI_REPROCESS_BACKOFF_FACTOR up to NGSI_REPROCESS_MAX_DELAY_S, then repeat every
    NGSI_REPROCESS_MAX_DELAY_S until the hour's count is 0, or give up (logged) after
    NGSI_REPROCESS_MAX_ATTEMPTS if set.
    """
    settings = ReprocessSettings.from_env(os.environ)
    cursor = ReprocessCursor.from_json(context.cursor)
    observations, after, caught_up = read_observations(context.instance, cursor.after, context.log)
    if after is not None and (cursor.after is None or after > cursor.after):
        # Events without a usable count still move the cursor past them.
        cursor = replace(cursor, after=after)
    now = utc_now()
    busy = busy_partition_ranges(context.instance)
    requests, new_cursor, skip_reason = plan_reprocessing(cursor, observations, now, settings, busy, caught_up)
    newest = {o.partition_key: o for o in observations}
    for key, backlog in sorted(new_cursor.partitions.items()):
        if key not in cursor.partitions and key in newest:
            examples = f" (e.g. {', '.join(newest[key].examples)})" if newest[key].examples else ""
            context.log.info(
                f"versioned_entities {key}: {backlog.count} messages require reprocessing{examples}; "
                f"first retry at {_iso(backlog.due)}"
            )
        old = cursor.partitions.get(key)
        if backlog.gave_up and (old is None or not old.gave_up):
            context.log.warning(
                f"versioned_entities {key}: giving up after {backlog.attempts} reprocessing attempts "
                f"(NGSI_REPROCESS_MAX_ATTEMPTS); {backlog.count} messages remain in status 1 since "
                f"{_iso(backlog.since)}. Materialize the partition by hand once the missing parents are in."
            )
    due_left = sum(
        1
        for k, b in new_cursor.partitions.items()
        if not b.gave_up and b.due <= now and not any(first <= k <= last for first, last in busy)
    )
    if requests and due_left:
        context.log.info(f"{due_left} more due partitions wait for the next tick (NGSI_REPROCESS_MAX_RUNS_PER_TICK)")
    context.update_cursor(new_cursor.to_json())
    for req in requests:
        yield RunRequest(run_key=req.run_key, partition_key=req.partition_key, tags=req.tags)
    if skip_reason is not None:
        yield SkipReason(skip_reason)
