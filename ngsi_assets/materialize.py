"""Run the main job from the command line: ``ngsi-assets materialize``.

The job (``ngsi_ingest_job``: the message store and everything downstream of it) runs in this process
for a range of hours, as one run on the Dagster instance of ``DAGSTER_HOME``, exactly as a backfill from
the UI would. With ``NGSI_SPARK_REMOTE`` set its Spark work goes to that Spark Connect server, with
``NGSI_SPARK_MASTER`` to that cluster; otherwise a ``local[*]`` session starts in this process.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

INGEST_JOB = "ngsi_ingest_job"


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    success: bool
    first: str
    last: str
    seconds: float
    failed_checks: tuple[str, ...]


def landed_hours(landing: Any) -> list[str]:  # noqa: ANN401 (LandingZoneResource)
    """The hourly partition keys that have landing segments, in order."""
    return sorted({s.partition_key for s in landing.segments()})


def run_ingest(
    defs: Any,  # noqa: ANN401 (dagster Definitions)
    first: str,
    last: str,
    instance: Any = None,  # noqa: ANN401 (DagsterInstance)
    *,
    log_level: str = "WARNING",
    job_name: str = INGEST_JOB,
    tags: dict[str, str] | None = None,
) -> RunOutcome:
    """Run ``job_name`` (default ``ngsi_ingest_job``) over every hour from ``first`` to ``last`` (one
    run, with ``tags`` added) and report it."""
    from dagster import DagsterInstance
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    started = time.monotonic()
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance or DagsterInstance.get(),
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
        tags={ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last, **(tags or {})},
        raise_on_error=False,
    )
    failed = tuple(
        f"{c.asset_key.to_user_string()}.{c.check_name}" for c in result.get_asset_check_evaluations() if not c.passed
    )
    return RunOutcome(result.run_id, result.success, first, last, time.monotonic() - started, failed)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="first", help="first hour (YYYY-MM-DD-HH:00); default: the first landed")
    parser.add_argument("--to", dest="last", help="last hour (YYYY-MM-DD-HH:00); default: the last landed")
    parser.add_argument("--log-level", default="WARNING", help="Dagster console log level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    from ngsi_assets.definitions import defs

    hours = landed_hours(defs.resources["landing"])
    if args.first:
        hours = [h for h in hours if h >= args.first] or [args.first]
    if args.last:
        hours = [h for h in hours if h <= args.last] or [args.last]
    if not hours:
        print("nothing landed: no hours to materialize")
        return 1
    outcome = run_ingest(defs, hours[0], hours[-1], log_level=args.log_level)
    print(
        f"run {outcome.run_id} {'succeeded' if outcome.success else 'FAILED'} in {outcome.seconds:.1f} s "
        f"for the hours {outcome.first} .. {outcome.last}"
    )
    for check in outcome.failed_checks:
        print(f"  check failed: {check}")
    return 0 if outcome.success and not outcome.failed_checks else 1
