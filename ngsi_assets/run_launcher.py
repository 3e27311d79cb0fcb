"""A run launcher that starts each run's process from a warm one: what an increment's cycle waits on.

Dagster's ``DefaultRunLauncher`` asks the code location's gRPC server to start a run, and the server
starts a fresh interpreter for it (``multiprocessing`` ``spawn``): Python, then Dagster, PySpark,
PyArrow and the SQL and MongoDB drivers imported again for every run. In continuous mode that is
every few seconds, on the critical path of freshness: an increment's process is not running its
first step until about 1.1 s after the daemon launched it on a fast two-core host, and more on a
slower one, while the run itself takes 4-6 s.

``WarmRunLauncher`` launches each run in a process forked from a **warm** one (Python's
``forkserver``: a single-threaded process that imported those libraries once, and forks a child per
run). The child imports the project's own code afresh (a fraction of a second), so code changes
reach the next run as they do with the default launcher; it then executes the run exactly as
Dagster's own run worker does (``core_execute_run``). Nothing is shared between runs but the
imported libraries' code, copied on write.

Cancellation works from any process (the UI, the daemon's run monitoring): ``terminate`` marks the
run canceling, and the run's process, which watches its run's status every
``run_monitoring.cancellation_thread_poll_interval_seconds`` (``dagster.yaml``), interrupts itself
as Dagster's own workers do.

A run's process is a child of the warm process, which is the daemon's: stopping the daemon's
process group (a restart, an upgrade, ``systemctl stop``) ends its runs too. Run monitoring asks
``check_run_worker_health`` about every started run: a run whose process is gone is marked failed
(with the reason), so it does not hold its lane for ever, and the landing sensor repairs what it
left undone.

The default launcher is used instead for a run whose code location runs another Python (its
``executable_path`` is not this process's) or has no Python origin.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DefaultRunLauncher
from dagster._config.config_schema import UserConfigSchema
from dagster._core.launcher.base import LaunchRunContext
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value

log = logging.getLogger(__name__)

# What every run's process imports, imported once by the warm process: the heavy third-party
# libraries, and Dagster's own modules a run's process needs before its first step (the instance's
# storage, with SQLAlchemy and Alembic, 0.5 s alone; the run worker's; the daemon's command line,
# which a forked child imports again as its ``__main__``). Never the project's own modules: a child
# imports those, so a code change is seen by the next run. A module not installed is skipped.
DEFAULT_PRELOAD = (
    "dagster",
    "dagster._core.instance.factory",
    "dagster._core.storage.root",
    "dagster._core.storage.sqlite_storage",
    "dagster._core.storage.runs.sqlite",
    "dagster._core.storage.event_log.sqlite",
    "dagster._core.storage.schedules.sqlite",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.execution.run_cancellation_thread",
    "dagster._grpc.impl",
    "dagster._daemon.cli",
    "dagster_postgres",
    "dagster_pyspark",
    "pyspark.sql",
    "pyspark.sql.connect.session",
    "pyarrow",
    "pyarrow.dataset",
    "pydantic",
    "psycopg2",
    "pymysql",
    "pymongo",
    "upath",
)
# The run tag naming the process a run runs in (host and pid), for the UI and the operators.
WORKER_TAG = "ngsi/run-worker"
# When that process started (clock ticks since boot, /proc/<pid>/stat): a pid reused later is not it.
WORKER_START_TAG = "ngsi/run-worker-start"

_FORKSERVER_LOCK = threading.Lock()


def _warm_context(preload: Sequence[str]) -> Any:
    """The process-wide ``forkserver`` context, with ``preload`` set before its server starts."""
    ctx = multiprocessing.get_context("forkserver")
    with _FORKSERVER_LOCK:
        ctx.set_forkserver_preload(list(preload))
    return ctx


def run_worker(serialized_args: str) -> None:
    """A run's process, forked from the warm one: execute the run as ``dagster api execute_run`` does.

    Whatever fails before the run's execution starts (its job cannot be loaded, say) fails the run
    with the error, rather than leaving it starting until run monitoring gives up on it.
    """
    from dagster._core.events import EngineEventData
    from dagster._core.execution.run_cancellation_thread import start_run_cancellation_thread
    from dagster._grpc.impl import core_execute_run
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._utils.error import serializable_error_info_from_exc_info
    from dagster._utils.hosted_user_process import recon_job_from_origin
    from dagster._utils.interrupts import capture_interrupts

    args = deserialize_value(serialized_args, ExecuteRunArgs)
    with capture_interrupts(), DagsterInstance.from_ref(args.instance_ref) as instance:
        run = instance.get_run_by_id(args.run_id)
        if run is None:
            raise RuntimeError(f"run {args.run_id} not found in the instance's run storage")
        watcher, stop_watching = start_run_cancellation_thread(instance, run.run_id)
        try:
            try:
                recon_job = recon_job_from_origin(run.job_code_origin)  # type: ignore[arg-type]
                instance.report_engine_event(
                    f"Started process for run (pid: {os.getpid()}), forked from a warm process.",
                    run,
                    EngineEventData.in_process(os.getpid()),
                )
            except Exception:
                error = serializable_error_info_from_exc_info(sys.exc_info())
                instance.report_run_failed(run, f"The run's process could not start the run: {error.message}")
                return
            for _ in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                pass
        except BaseException:  # noqa: BLE001 - reported in the run's event log (by core_execute_run or above)
            log.debug("run %s ended with an error (in its event log)", run.run_id, exc_info=True)
        finally:
            stop_watching.set()
            watcher.join()
    # A forked process ends with os._exit, which skips the exit handlers: flush the logs.
    logging.shutdown()


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is no such live process
    (a zombie, one that ended but was not reaped yet, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command (in parentheses, which may hold spaces): state is the first, start time the 20th.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_python(executable_path: str | None) -> bool:
    """Whether a code location's Python is this process's (then its runs can fork from here)."""
    if not executable_path:
        return True
    return os.path.abspath(executable_path) == os.path.abspath(sys.executable)


class WarmRunLauncher(DefaultRunLauncher):
    """Each run in a process forked from a warm one (see the module's docstring)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, preload: Sequence[str] = DEFAULT_PRELOAD):
        super().__init__(inst_data=inst_data)
        self._preload = tuple(preload)
        self._processes: dict[str, Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        from dagster import Array, Field

        return {
            "preload": Field(
                Array(str),
                is_required=False,
                default_value=list(DEFAULT_PRELOAD),
                description="Modules the warm process imports once for every run.",
            )
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data, preload=config_value.get("preload", DEFAULT_PRELOAD))

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._core.origin import JobPythonOrigin
        from dagster._grpc.types import ExecuteRunArgs

        run = context.dagster_run
        origin = run.job_code_origin
        if not isinstance(origin, JobPythonOrigin) or not same_python(origin.repository_origin.executable_path):
            super().launch_run(context)
            return
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref())
        process = _warm_context(self._preload).Process(
            target=run_worker, args=(serialize_value(args),), name=f"dagster-run-{run.run_id}"
        )
        process.start()
        tags = {WORKER_TAG: f"{os.uname().nodename}:{process.pid}"}
        started = process_start_ticks(process.pid)
        if started is not None:
            tags[WORKER_START_TAG] = str(started)
        self._instance.add_run_tags(run.run_id, tags)
        with self._lock:
            self._forget_finished()
            # Only live processes are kept (the daemon launches thousands of runs a day).
            self._processes[run.run_id] = process

    def _forget_finished(self) -> None:
        """Release the handles of run processes that ended (their exit was reaped by the warm process)."""
        for run_id, process in list(self._processes.items()):
            if not process.is_alive():
                process.join(0)
                process.close()
                del self._processes[run_id]

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished:
            return False
        if WORKER_TAG not in run.tags:  # launched by the default launcher
            return super().terminate(run_id)
        # The run's process sees the status and interrupts itself, wherever this is called from.
        self._instance.report_run_canceling(run)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> Any:
        """Whether a started run's process is still there; a run of this host whose process is gone
        has failed (run monitoring then marks it so). Runs this launcher cannot see count as running."""
        from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

        worker = run.tags.get(WORKER_TAG)
        if worker is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "launched by Dagster's default launcher")
        host, _, pid_text = worker.rpartition(":")
        if host != os.uname().nodename or not pid_text.isdigit():
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"the run's process is on {host}, not here")
        pid = int(pid_text)
        started = process_start_ticks(pid)
        expected = run.tags.get(WORKER_START_TAG)
        if started is not None and (expected is None or expected == str(started)):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=worker)
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the run's process {pid} on {host} is gone (stopped with the daemon, or killed): the run did not finish",
            run_worker_id=worker,
        )

    def dispose(self) -> None:
        with self._lock:
            self._forget_finished()
        super().dispose()
