"""The side-by-side executor runs a run's independent steps at once, in threads of the run's process,
and otherwise as Dagster's in-process executor does: dependencies wait, a failed step skips what
depends on it, every event reaches the run's event log, and with ``max_concurrent`` 1 one step runs
at a time.

The jobs run through ``execute_job`` (``execute_in_process`` would replace any job's executor with
Dagster's in-process one). Two steps meet at a ``threading.Barrier``, which only steps running at
the same time can pass: no test here depends on how long anything takes."""

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    asset,
    asset_check,
    build_reconstructable_job,
    define_asset_job,
    execute_job,
)

from ngsi_assets.executor import SideBySideExecutor, side_by_side_executor
from ngsi_assets.materialize import run_ingest

# Set per test; read by the assets, which run in this process (the executor's threads).
_BARRIER: threading.Barrier | None = None
_HOLD: threading.Event | None = None  # set: steps go on; unset: they wait for it
_FAIL: set[str] = set()
_RUNNING = {"now": 0, "most": 0}
_LOCK = threading.Lock()
_WAIT_S = 60  # how long a step waits at the barrier for the other one before it gives up


def _step(name: str) -> str:
    with _LOCK:
        _RUNNING["now"] += 1
        _RUNNING["most"] = max(_RUNNING["most"], _RUNNING["now"])
    try:
        if name in _FAIL:
            raise RuntimeError(f"{name} fails on purpose")
        if _BARRIER is not None and name in ("left", "right"):
            _BARRIER.wait(timeout=_WAIT_S)
        if _HOLD is not None:
            _HOLD.wait(timeout=_WAIT_S)
        return name
    finally:
        with _LOCK:
            _RUNNING["now"] -= 1


@asset
def left(context: AssetExecutionContext) -> None:
    context.log.info(f"{_step('left')} in thread {threading.current_thread().name}")


@asset
def right(context: AssetExecutionContext) -> None:
    context.log.info(f"{_step('right')} in thread {threading.current_thread().name}")


@asset(deps=[left, right])
def after() -> None:
    _step("after")


def toy_job(max_concurrent: int | None):  # noqa: ANN201 (a JobDefinition; module-level for build_reconstructable_job)
    """None: the executor as the platform's jobs have it, configured by the environment."""
    executor_def = (
        side_by_side_executor
        if max_concurrent is None
        else side_by_side_executor.configured({"max_concurrent": max_concurrent})
    )
    job = define_asset_job("toy", selection=[left, right, after], executor_def=executor_def)
    return Definitions(assets=[left, right, after], jobs=[job]).resolve_job_def("toy")


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    global _BARRIER, _HOLD
    _FAIL.clear()
    _RUNNING.update(now=0, most=0)
    with DagsterInstance.local_temp(str(tmp_path)) as inst:
        yield inst
    _BARRIER = None
    _HOLD = None


def _run(instance: DagsterInstance, max_concurrent: int | None):  # noqa: ANN202
    job = build_reconstructable_job(__name__, "toy_job", reconstructable_args=(max_concurrent,))
    return execute_job(job, instance=instance)


def _steps_with(result, event_type: DagsterEventType) -> set[str]:  # noqa: ANN001
    return {e.step_key for e in result.all_events if e.event_type == event_type}


def test_independent_steps_run_at_the_same_time(instance: DagsterInstance) -> None:
    global _BARRIER
    _BARRIER = threading.Barrier(2)  # ``left`` and ``right`` pass it only together
    result = _run(instance, 2)
    assert result.success
    assert _steps_with(result, DagsterEventType.STEP_SUCCESS) == {"left", "right", "after"}
    assert _RUNNING["most"] == 2
    # Every event is in the run's event log, the materializations included.
    logged = instance.all_logs(result.run_id)
    materialized = {
        e.dagster_event.step_key for e in logged if e.dagster_event and e.dagster_event.is_step_materialization
    }
    assert materialized == {"left", "right", "after"}
    threads = [e.user_message for e in logged if "in thread step" in (e.user_message or "")]
    assert len(threads) == 2


def test_a_step_waits_for_what_it_depends_on(instance: DagsterInstance) -> None:
    result = _run(instance, 3)
    assert result.success
    starts = [e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_START]
    ends = {e.step_key: i for i, e in enumerate(result.all_events) if e.event_type == DagsterEventType.STEP_SUCCESS}
    begins = {e.step_key: i for i, e in enumerate(result.all_events) if e.event_type == DagsterEventType.STEP_START}
    assert starts[-1] == "after"
    assert begins["after"] > max(ends["left"], ends["right"])


def test_a_failed_step_skips_what_depends_on_it_and_fails_the_run(instance: DagsterInstance) -> None:
    _FAIL.add("right")
    result = _run(instance, 2)
    assert not result.success
    assert _steps_with(result, DagsterEventType.STEP_FAILURE) == {"right"}
    assert _steps_with(result, DagsterEventType.STEP_SUCCESS) == {"left"}
    assert "after" not in _steps_with(result, DagsterEventType.STEP_START)
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
    assert "right fails on purpose" in str(failure.step_failure_data.error)


def test_one_at_a_time_with_max_concurrent_1(instance: DagsterInstance) -> None:
    result = _run(instance, 1)
    assert result.success
    assert _steps_with(result, DagsterEventType.STEP_SUCCESS) == {"left", "right", "after"}
    assert _RUNNING["most"] == 1


def test_max_concurrent_comes_from_the_environment_unless_configured(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    global _BARRIER
    monkeypatch.setenv("NGSI_STEPS_SIDE_BY_SIDE", "2")
    _BARRIER = threading.Barrier(2)
    assert _run(instance, None).success
    assert _RUNNING["most"] == 2
    _BARRIER = None
    _RUNNING.update(most=0)
    assert _run(instance, 1).success  # configured: the environment's 2 does not apply
    assert _RUNNING["most"] == 1
    monkeypatch.delenv("NGSI_STEPS_SIDE_BY_SIDE")
    _RUNNING.update(most=0)
    assert _run(instance, None).success
    assert _RUNNING["most"] == 1


def test_max_concurrent_below_1_is_refused() -> None:
    from dagster._core.execution.retries import RetryMode

    with pytest.raises(ValueError, match="at least 1"):
        SideBySideExecutor(RetryMode.ENABLED, 0)


def test_the_platform_jobs_run_on_it() -> None:
    from ngsi_assets.definitions import defs

    for name in ("ngsi_ingest_job", "ngsi_increment_job", "ngsi_derived_job"):
        assert defs.resolve_job_def(name).executor_def.name == "in_process_side_by_side"


def test_an_interrupt_ends_the_run_while_its_steps_run(instance: DagsterInstance) -> None:
    """A run told to stop (cancelled, or its process signalled) while steps run in their threads: the
    main thread stops the run, which ends as failed, and nothing after the running steps starts."""
    global _HOLD
    _HOLD = threading.Event()

    def interrupt_once_both_run() -> None:
        assert _HOLD is not None
        while _RUNNING["now"] < 2:
            if _HOLD.wait(0.05):  # the run ended first: no signal outside it
                return
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_both_run, daemon=True).start()
    try:
        result = _run(instance, 2)
    finally:
        _HOLD.set()
        # The steps' threads outlive the run here (a run's process would end): let them finish first.
        for _ in range(600):
            if _RUNNING["now"] == 0:
                break
            time.sleep(0.05)
    assert not result.success
    assert "after" not in _steps_with(result, DagsterEventType.STEP_START)
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


@asset_check(asset=after)
def after_is_late() -> AssetCheckResult:
    return AssetCheckResult(passed=False, description="fails on purpose, for run_ingest's outcome")


def _toy_definitions(**executor: object) -> Definitions:
    job = define_asset_job("toy", selection=[left, right, after])
    return Definitions(assets=[left, right, after], asset_checks=[after_is_late], jobs=[job], **executor)  # type: ignore[arg-type]


def test_run_ingest_runs_steps_side_by_side_through_the_jobs_executor(instance: DagsterInstance) -> None:
    """``ngsi-assets materialize`` (``run_ingest``) runs in its own process like ``execute_in_process``,
    but with the job's executor: with 2, ``left`` and ``right`` meet at the barrier."""
    global _BARRIER
    _BARRIER = threading.Barrier(2)
    defs = _toy_definitions(executor=side_by_side_executor)
    outcome = run_ingest(defs, "2026-01-01-00:00", "2026-01-01-00:00", instance, job_name="toy", steps_side_by_side=2)
    assert outcome.success
    assert _RUNNING["most"] == 2
    run = instance.get_run_by_id(outcome.run_id)
    assert run is not None and run.tags["dagster/asset_partition_range_start"] == "2026-01-01-00:00"
    logged = instance.all_logs(outcome.run_id)
    succeeded = {
        e.step_key for e in logged if e.dagster_event and e.dagster_event.event_type == DagsterEventType.STEP_SUCCESS
    }
    assert succeeded == {"left", "right", "after", "after_after_is_late"}  # the check is a step of its own
    assert outcome.checks == (("after.after_is_late", False),)
    assert outcome.failed_checks == ("after.after_is_late",)


def test_run_ingest_one_step_at_a_time(instance: DagsterInstance) -> None:
    defs = _toy_definitions(executor=side_by_side_executor)
    outcome = run_ingest(defs, "2026-01-01-00:00", "2026-01-01-00:00", instance, job_name="toy", steps_side_by_side=1)
    assert outcome.success
    assert _RUNNING["most"] == 1


def test_run_ingest_side_by_side_needs_the_platforms_executor(instance: DagsterInstance) -> None:
    defs = _toy_definitions()  # Dagster's default executor
    with pytest.raises(ValueError, match="runs with the executor 'multi_or_in_process_executor'"):
        run_ingest(defs, "2026-01-01-00:00", "2026-01-01-00:00", instance, job_name="toy", steps_side_by_side=2)
    with pytest.raises(ValueError, match="at least 1"):
        run_ingest(
            _toy_definitions(executor=side_by_side_executor),
            "2026-01-01-00:00",
            "2026-01-01-00:00",
            instance,
            job_name="toy",
            steps_side_by_side=0,
        )
