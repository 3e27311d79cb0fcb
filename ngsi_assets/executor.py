"""An executor that runs a run's independent steps side by side, in threads of the run's process.

Dagster's in-process executor runs one step at a time, so a derived run waits for ``sth_aggregates``
before it starts ``versioned_entities``, though neither reads the other. Its multiprocess executor
would start a Python process and a Spark session for every step. This one keeps what the in-process
executor gives the platform (one process, one Spark session, resources initialized once) and runs
up to ``max_concurrent`` ready steps at a time, each in a thread of its own. Spark schedules their
jobs side by side. Each asset's Spark jobs are mostly small and latency-bound, so two steps on two
cores overlap rather than queue.

The step machinery is Dagster's own (``ActiveExecution``, ``dagster_event_sequence_for_step``, the
hooks and the process-wide compute-log capture of ``inner_plan_execution_iterator``). Only the loop
that starts steps and relays their events differs: events are yielded and handled in the run's
main thread, in each step's order. These are private Dagster modules, which is why ``pyproject.toml``
pins Dagster to one minor version; ``tests/test_executor.py`` runs jobs through this loop.

Interrupts (a run cancelled, or its process told to stop) reach the main thread only. It stops
starting steps and raises ``DagsterExecutionInterruptedError``, and the process's end stops the
steps' threads. Each asset's writes are already safe to kill at any point.

With ``max_concurrent`` 1 this is Dagster's in-process executor, unchanged.
"""

import os
import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from dagster import Field, Int, executor
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.compute_logs import create_compute_log_file_key
from dagster._core.execution.context.system import (
    PlanExecutionContext,
    PlanOrchestrationContext,
    StepExecutionContext,
)
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import (
    _handle_compute_log_setup_error,
    _handle_compute_log_teardown_error,
    _trigger_hook,
    dagster_event_sequence_for_step,
)
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.executor.in_process import InProcessExecutor

# How often the main thread, waiting for the steps' events, looks for an interrupt.
_POLL_S = 0.5


@dataclass
class _Running:
    """A step started in a thread: its context and the events it has sent so far (for its hooks)."""

    context: StepExecutionContext
    events: list[DagsterEvent] = field(default_factory=list)


class _Finished:
    """Sent by a step's thread after its last event (``error``: what escaped Dagster's own handling)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def _relay(key: str, context: StepExecutionContext, out: "queue.Queue[tuple[str, Any]]") -> None:
    """Run one step in this thread, sending each of its events to ``out``, then a ``_Finished``.

    ``dagster_event_sequence_for_step`` turns the step's own failures into failure events; only an
    error of Dagster itself gets past it, and is re-raised in the main thread."""
    try:
        for event in dagster_event_sequence_for_step(context):
            out.put((key, event))
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
        out.put((key, _Finished(exc)))
        return
    out.put((key, _Finished()))


def side_by_side_iterator(
    job_context: PlanExecutionContext, execution_plan: ExecutionPlan, max_concurrent: int
) -> Iterator[DagsterEvent]:
    """``inner_plan_execution_iterator`` with up to ``max_concurrent`` steps running at once."""
    compute_log_manager = job_context.instance.compute_log_manager
    step_keys = [step.key for step in execution_plan.get_steps_to_execute_in_topo_order()]
    with ExitStack() as stack:
        concurrency = stack.enter_context(InstanceConcurrencyContext(job_context.instance, job_context.dagster_run))
        active = stack.enter_context(
            execution_plan.start(
                retry_mode=job_context.retry_mode,
                max_concurrent=max_concurrent,
                instance_concurrency_context=concurrency,
                step_dependency_config=job_context.step_dependency_config,
            )
        )
        capture = stack.enter_context(ExitStack())
        log_key = compute_log_manager.build_log_key_for_run(job_context.run_id, create_compute_log_file_key())
        try:
            log_context = capture.enter_context(compute_log_manager.capture_logs(log_key))
            yield DagsterEvent.capture_logs(job_context, step_keys, log_key, log_context)
        except Exception:
            yield from _handle_compute_log_setup_error(job_context, sys.exc_info())

        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        running: dict[str, _Running] = {}
        while running or not active.is_complete:
            if active.check_for_interrupts():
                active.mark_interrupted()
                raise DagsterExecutionInterruptedError(
                    f"interrupted with {len(running)} step(s) running: {', '.join(sorted(running))}"
                )
            if not active.is_complete:
                steps = active.get_steps_to_execute(limit=max_concurrent - len(running))
                yield from active.concurrency_event_iterator(job_context)
                for step in steps:
                    context = job_context.for_step(step, active.get_known_state())
                    missing = [k for k in context.required_resource_keys if not hasattr(context.resources, k)]
                    if missing:
                        raise RuntimeError(f"step {step.key} is missing the resources {missing}")
                    running[step.key] = _Running(context)
                    threading.Thread(
                        target=_relay, args=(step.key, context, events), name=f"step {step.key}", daemon=True
                    ).start()
                if not running:
                    active.sleep_til_ready()
                    continue
            try:
                key, item = events.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            step = running[key]
            if isinstance(item, _Finished):
                if item.error is not None:
                    raise item.error
                del running[key]
                active.verify_complete(job_context, key)
                for event in active.plan_events_iterator(job_context):
                    step.events.append(event)
                    yield event
                yield from _trigger_hook(step.context, step.events)
                continue
            step.events.append(item)
            yield item
            active.handle_event(item)

        try:
            capture.close()
        except Exception:
            yield from _handle_compute_log_teardown_error(job_context, sys.exc_info())


class SideBySideExecutor(InProcessExecutor):
    """Dagster's in-process executor, with up to ``max_concurrent`` ready steps at a time (see the module)."""

    def __init__(self, retries: RetryMode, max_concurrent: int) -> None:
        super().__init__(retries=retries)
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, not {max_concurrent}")
        self.max_concurrent = max_concurrent

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        if self.max_concurrent == 1:
            yield from super().execute(plan_context, execution_plan)
            return
        keys = execution_plan.step_keys_to_execute
        pid = os.getpid()
        yield DagsterEvent.engine_event(
            plan_context,
            f"Executing steps in process (pid: {pid}), up to {self.max_concurrent} side by side",
            event_specific_data=EngineEventData.in_process(pid, keys),
        )

        def iterator(job_context: PlanExecutionContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
            return side_by_side_iterator(job_context, execution_plan, self.max_concurrent)

        yield from iter(
            ExecuteRunWithPlanIterable(
                execution_plan=plan_context.execution_plan,
                iterator=iterator,
                execution_context_manager=PlanExecutionContextManager(
                    job=plan_context.job,
                    retry_mode=plan_context.retry_mode,
                    execution_plan=plan_context.execution_plan,
                    run_config=plan_context.run_config,
                    dagster_run=plan_context.dagster_run,
                    instance=plan_context.instance,
                    raise_on_error=plan_context.raise_on_error,
                    output_capture=plan_context.output_capture,
                    step_dependency_config=self.step_dependency_config,
                ),
            )
        )
        yield DagsterEvent.engine_event(
            plan_context,
            f"Finished steps in process (pid: {pid})",
            event_specific_data=EngineEventData.in_process(pid, keys),
        )


@executor(
    name="in_process_side_by_side",
    config_schema={
        "retries": get_retries_config(),
        "max_concurrent": Field(
            Int,
            is_required=False,
            description="Ready steps run at once, each in a thread of the run's process (1: one at a time). "
            "Default: NGSI_STEPS_SIDE_BY_SIDE, else 1.",
        ),
    },
)
def side_by_side_executor(init_context: Any) -> SideBySideExecutor:
    """Every step in the run's process (one Spark session); up to ``max_concurrent`` at a time."""
    config = init_context.executor_config
    default = int(os.environ.get("NGSI_STEPS_SIDE_BY_SIDE", "1"))
    return SideBySideExecutor(
        retries=RetryMode.from_config(config["retries"]) or RetryMode.ENABLED,
        max_concurrent=int(config.get("max_concurrent") or default),
    )
