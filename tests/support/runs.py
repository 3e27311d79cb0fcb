"""Runs put on a Dagster instance by hand, with the start and end times the run storage records."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from dagster import DagsterInstance
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

START = datetime(2026, 3, 1, 0, 10, tzinfo=UTC)


def finished_run(
    instance: DagsterInstance,
    run_id: str,
    job_name: str,
    seconds: float,
    *,
    success: bool = True,
    tags: Mapping[str, str] | None = None,
) -> DagsterRun:
    """A run of ``job_name`` that started at ``START`` and ended ``seconds`` later (succeeded or failed)."""
    run = DagsterRun(job_name=job_name, run_id=run_id, status=DagsterRunStatus.STARTING, tags=dict(tags or {}))
    instance.add_run(run)
    end = DagsterEventType.RUN_SUCCESS if success else DagsterEventType.RUN_FAILURE
    for event_type, at in ((DagsterEventType.RUN_START, START), (end, START + timedelta(seconds=seconds))):
        instance.run_storage.handle_run_event(
            run_id, DagsterEvent(event_type.value, job_name=job_name), update_timestamp=at
        )
    return run
