"""Run the main job from the command line: ``ngsi-assets materialize``.

The job (``ngsi_ingest_job``: the message store and everything downstream of it) runs in this process
for a range of hours, as one run on the Dagster instance of ``DAGSTER_HOME``, exactly as a backfill from
the UI would. With ``NGSI_SPARK_REMOTE`` set its Spark work goes to that Spark Connect server, with
``NGSI_SPARK_MASTER`` to that cluster; otherwise a ``local[*]`` session starts in this process.

Independent steps run side by side (``--steps-side-by-side``, default 2: ``sth_aggregates`` beside
``versioned_entities``), in threads of this process on its one Spark session, through the job's own
executor (``ngsi_assets.executor``), as the daemon's runs do with ``NGSI_STEPS_SIDE_BY_SIDE``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

INGEST_JOB = "ngsi_ingest_job"
# A run started by hand is the machine's one job: its steps overlap (BENCHMARKS.md, "Findings behind the defaults").
CLI_STEPS_SIDE_BY_SIDE = 2
# From this many landed bytes in the run's hours (about 300,000 notifications), a run's own driver gets
# HotSpot's full JIT (``NGSI_SPARK_JIT=full``) unless the variable says otherwise: parsing the landing
# lines is per-row work, which C2's code does in 0.55x the time of C1's once compiled (1,000,000
# lines' envelopes: 8.1 s against 14.3 s warm, 11.1 against 15.4 s cold), and a long run pays C2's
# compilations back. A small run keeps the quick JIT (see ``resources.spark.JIT_OPTIONS``).
BULK_JIT_BYTES = 256 * 2**20


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    success: bool
    first: str
    last: str
    seconds: float
    failed_checks: tuple[str, ...]
    # Every asset check the run evaluated: (asset.check, passed), in the order they were evaluated.
    checks: tuple[tuple[str, bool], ...] = ()


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
    steps_side_by_side: int = 1,
) -> RunOutcome:
    """Run ``job_name`` (default ``ngsi_ingest_job``) over every hour from ``first`` to ``last`` (one
    run, with ``tags`` added) and report it.

    ``steps_side_by_side``: 1 runs one step at a time (Dagster's ``execute_in_process``); more runs up
    to that many independent steps at once through the job's own executor, which must be
    ``ngsi_assets.executor.side_by_side_executor`` (the platform's definitions use it)."""
    from dagster import DagsterInstance
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    started = time.monotonic()
    job = defs.resolve_job_def(job_name)
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    run_tags = {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last, **(tags or {})}
    instance = instance or DagsterInstance.get()
    if steps_side_by_side == 1:
        result = job.execute_in_process(instance=instance, run_config=run_config, tags=run_tags, raise_on_error=False)
    else:
        result = _execute_side_by_side(job, instance, run_config, run_tags, steps_side_by_side)
    checks = tuple(
        (f"{c.asset_key.to_user_string()}.{c.check_name}", c.passed) for c in result.get_asset_check_evaluations()
    )
    failed = tuple(name for name, passed in checks if not passed)
    return RunOutcome(result.run_id, result.success, first, last, time.monotonic() - started, failed, checks)


def _execute_side_by_side(
    job: Any,  # noqa: ANN401 (dagster JobDefinition)
    instance: Any,  # noqa: ANN401 (DagsterInstance)
    run_config: dict[str, Any],
    tags: dict[str, str],
    max_concurrent: int,
) -> Any:  # noqa: ANN401 (dagster ExecuteInProcessResult)
    """``execute_in_process`` with the job's own executor (which that method replaces with Dagster's
    one-step-at-a-time executor) configured for ``max_concurrent`` steps: the same run, events and
    result, in this process."""
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.execution.execute_in_process import core_execute_in_process

    from ngsi_assets.executor import side_by_side_executor

    if max_concurrent < 1:
        raise ValueError(f"steps side by side must be at least 1, not {max_concurrent}")
    if job.executor_def.name != side_by_side_executor.name:
        raise ValueError(
            f"job {job.name} runs with the executor {job.executor_def.name!r}, not {side_by_side_executor.name!r}: "
            "its steps cannot run side by side in this process"
        )
    return core_execute_in_process(
        run_config={**run_config, "execution": {"config": {"max_concurrent": max_concurrent}}},
        job=InMemoryJob(job),
        instance=instance,
        output_capturing_enabled=False,
        raise_on_error=False,
        run_tags={**job.run_tags, **tags},
    )


def _selected_hours(hours: list[str], args: argparse.Namespace) -> list[str]:
    """The landed ``hours`` within the command's ``--from`` / ``--to``."""
    if args.first:
        hours = [h for h in hours if h >= args.first] or [args.first]
    if args.last:
        hours = [h for h in hours if h <= args.last] or [args.last]
    return hours


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="first", help="first hour (YYYY-MM-DD-HH:00); default: the first landed")
    parser.add_argument("--to", dest="last", help="last hour (YYYY-MM-DD-HH:00); default: the last landed")
    parser.add_argument("--log-level", default="WARNING", help="Dagster console log level (default WARNING)")
    parser.add_argument(
        "--steps-side-by-side",
        type=_positive,
        default=CLI_STEPS_SIDE_BY_SIDE,
        help=f"independent steps run at once, in threads of this process (default {CLI_STEPS_SIDE_BY_SIDE}; "
        "1: one at a time)",
    )


def landed_bytes(landing: Any, hours: list[str]) -> int:  # noqa: ANN401 (LandingZoneResource)
    """The bytes landed in ``hours`` (the segments' sizes, from a listing: nothing is read)."""
    return sum(s.size for s in landing.segments(hours))


def bulk_jit(landing: Any, hours: list[str]) -> None:  # noqa: ANN401 (LandingZoneResource)
    """Have the run's own Spark driver use the full JIT when ``hours`` hold a bulk of data (see
    ``BULK_JIT_BYTES``) and ``NGSI_SPARK_JIT`` is not set. Before the definitions are imported: their
    Spark resource reads the variable then."""
    if os.environ.get("NGSI_SPARK_JIT") or os.environ.get("NGSI_SPARK_REMOTE"):
        return
    if landed_bytes(landing, hours) >= BULK_JIT_BYTES:
        os.environ["NGSI_SPARK_JIT"] = "full"


def run(args: argparse.Namespace) -> int:
    from ngsi_assets import settings
    from resources.landing import LandingZoneResource

    # The landing zone the definitions' resource reads (NGSI_LANDING_ROOT), listed before they are
    # imported: the JIT of the run's driver follows the data (``bulk_jit``).
    landing = LandingZoneResource(root=settings.landing_root())
    hours = _selected_hours(landed_hours(landing), args)
    bulk_jit(landing, hours)
    from ngsi_assets.definitions import defs

    if not hours:
        print("nothing landed: no hours to materialize")
        return 1
    outcome = run_ingest(
        defs, hours[0], hours[-1], log_level=args.log_level, steps_side_by_side=args.steps_side_by_side
    )
    print(
        f"run {outcome.run_id} {'succeeded' if outcome.success else 'FAILED'} in {outcome.seconds:.1f} s "
        f"for the hours {outcome.first} .. {outcome.last}"
    )
    for check in outcome.failed_checks:
        print(f"  check failed: {check}")
    return 0 if outcome.success and not outcome.failed_checks else 1
