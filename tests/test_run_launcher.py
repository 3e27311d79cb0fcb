"""WarmRunLauncher: runs launched from a warm process, through a real instance, with real processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin

from ngsi_assets.run_launcher import DEFAULT_PRELOAD, WORKER_TAG, WarmRunLauncher, same_python
from tests.fixtures.launcher import jobs
from tests.support.processes import alive

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


@pytest.fixture
def instance(tmp_path: Path):
    """An instance configured as the platform's ``dagster.yaml`` configures it (its launcher, run
    monitoring's settings), on SQLite in a fresh home."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        yaml.safe_dump({"run_launcher": config["run_launcher"], "run_monitoring": config["run_monitoring"]})
    )
    with DagsterInstance.from_config(str(home)) as inst:
        yield inst


def _origin(job_name: str) -> JobPythonOrigin:
    repo = ReconstructableRepository.for_module("tests.fixtures.launcher.jobs", "defs", working_directory=str(REPO))
    return repo.get_reconstructable_job(job_name).get_python_origin()


def _launch(instance: DagsterInstance, job, run_config: dict, origin: JobPythonOrigin | None = None) -> str:
    run = instance.create_run_for_job(job_def=job, run_config=run_config, job_code_origin=origin or _origin(job.name))
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    return run.run_id


def _wait(instance: DagsterInstance, run_id: str, timeout: float = TIMEOUT_S) -> DagsterRunStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run.status
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} not finished after {timeout} s: {instance.get_run_by_id(run_id).status}")


def _sleeping_run(instance: DagsterInstance, tmp_path: Path) -> tuple[str, int]:
    """A run of ``sleep_job`` (300 s) that has started its op: (its id, its process's pid)."""
    started = tmp_path / "started"
    run_id = _launch(
        instance, jobs.sleep_job, {"ops": {"sleep_op": {"config": {"seconds": 300, "started": str(started)}}}}
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not started.exists():
        assert time.monotonic() < deadline, "the run never started its op"
        time.sleep(0.2)
    return run_id, int(started.read_text())


def _engine_messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [r.message or "" for r in instance.all_logs(run_id)]


def test_the_platform_instance_uses_the_warm_launcher(instance: DagsterInstance) -> None:
    assert isinstance(instance.run_launcher, WarmRunLauncher)
    assert instance.run_launcher._preload == DEFAULT_PRELOAD
    assert instance.cancellation_thread_poll_interval_seconds == 1


def test_a_run_succeeds_in_a_process_forked_from_the_warm_one(instance: DagsterInstance, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    run_id = _launch(instance, jobs.write_job, {"ops": {"write_pid": {"config": {"path": str(out)}}}})
    assert _wait(instance, run_id) == DagsterRunStatus.SUCCESS
    pid, preloaded = out.read_text().split()
    # Its own process, which found the warm process's imports already there.
    assert int(pid) != os.getpid()
    assert preloaded == "1"
    run = instance.get_run_by_id(run_id)
    assert run.tags[WORKER_TAG] == f"{os.uname().nodename}:{pid}"
    assert any("forked from a warm process" in m for m in _engine_messages(instance, run_id))


def test_two_runs_get_two_processes(instance: DagsterInstance, tmp_path: Path) -> None:
    outs = [tmp_path / f"out{i}.txt" for i in range(2)]
    run_ids = [_launch(instance, jobs.write_job, {"ops": {"write_pid": {"config": {"path": str(o)}}}}) for o in outs]
    assert [_wait(instance, r) for r in run_ids] == [DagsterRunStatus.SUCCESS] * 2
    assert len({o.read_text().split()[0] for o in outs}) == 2
    # The launcher keeps handles on live processes only: a third launch releases the two ended ones.
    third = _launch(instance, jobs.write_job, {"ops": {"write_pid": {"config": {"path": str(tmp_path / "3")}}}})
    assert set(instance.run_launcher._processes) <= {third}
    assert _wait(instance, third) == DagsterRunStatus.SUCCESS


def test_a_failing_op_fails_the_run_with_its_error(instance: DagsterInstance) -> None:
    run_id = _launch(instance, jobs.fail_job, {})
    assert _wait(instance, run_id) == DagsterRunStatus.FAILURE
    errors = [
        r.dagster_event.event_specific_data.error.to_string()
        for r in instance.all_logs(run_id)
        if r.dagster_event is not None and r.dagster_event.is_step_failure
    ]
    assert any("this op fails on purpose" in e for e in errors)


def test_a_job_that_cannot_be_loaded_fails_the_run(instance: DagsterInstance) -> None:
    good = _origin("write_job")
    missing = good._replace(job_name="no_such_job")
    run_id = _launch(instance, jobs.write_job, {"ops": {"write_pid": {"config": {"path": "/dev/null"}}}}, missing)
    assert _wait(instance, run_id) == DagsterRunStatus.FAILURE
    assert any("Could not load job definition" in m for m in _engine_messages(instance, run_id))


def test_terminate_cancels_a_running_run_from_another_launcher(instance: DagsterInstance, tmp_path: Path) -> None:
    run_id, pid = _sleeping_run(instance, tmp_path)
    # Another process's launcher (the UI's, run monitoring's): no handle on the run's process.
    other = WarmRunLauncher()
    other.register_instance(instance)
    assert other.terminate(run_id) is True
    assert _wait(instance, run_id, timeout=60) == DagsterRunStatus.CANCELED
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, f"the run's process {pid} is still alive"
        time.sleep(0.2)
    # A finished run is not terminated again.
    assert other.terminate(run_id) is False


_VERSIONED_JOB = """
from pathlib import Path

from dagster import Definitions, in_process_executor, job, op


@op
def write_version() -> None:
    Path({out!r}).write_text({version!r})


@job(executor_def=in_process_executor)
def versioned_job() -> None:
    write_version()


defs = Definitions(jobs=[versioned_job])
"""


def test_a_code_change_reaches_the_next_run(instance: DagsterInstance, tmp_path: Path) -> None:
    """The warm process never imports the project's code: each run's process loads its job afresh."""
    import importlib.util

    code, out = tmp_path / "code", tmp_path / "version.txt"
    code.mkdir()
    source = code / "launcher_versioned_jobs.py"
    origin = (
        ReconstructableRepository.for_module("launcher_versioned_jobs", "defs", working_directory=str(code))
        .get_reconstructable_job("versioned_job")
        .get_python_origin()
    )
    for version in ("v1", "v2"):
        source.write_text(_VERSIONED_JOB.format(out=str(out), version=version))
        spec = importlib.util.spec_from_file_location(f"versioned_{version}", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        run_id = _launch(instance, module.versioned_job, {}, origin)
        assert _wait(instance, run_id) == DagsterRunStatus.SUCCESS
        assert out.read_text() == version


def test_a_run_of_another_python_goes_to_the_default_launcher(instance: DagsterInstance) -> None:
    origin = _origin("write_job")
    repo = origin.repository_origin
    other = origin._replace(
        repository_origin=RepositoryPythonOrigin(
            executable_path="/usr/bin/some-other-python",
            code_pointer=repo.code_pointer,
            container_image=repo.container_image,
            entry_point=repo.entry_point,
            container_context=repo.container_context,
        )
    )
    run = instance.create_run_for_job(
        job_def=jobs.write_job,
        run_config={"ops": {"write_pid": {"config": {"path": "/dev/null"}}}},
        job_code_origin=other,
    )
    # The default launcher needs the code location's gRPC server, which this launch has not: it
    # fails at launch, and no process was forked for it.
    with pytest.raises(DagsterInvariantViolationError, match="DefaultRunLauncher requires a workspace"):
        instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    run = instance.get_run_by_id(run.run_id)
    assert run.status == DagsterRunStatus.FAILURE
    assert WORKER_TAG not in run.tags


def test_same_python() -> None:
    assert same_python(sys.executable)
    assert same_python(None)
    assert not same_python("/usr/bin/some-other-python")


def test_run_monitoring_fails_a_run_whose_process_is_gone(instance: DagsterInstance, tmp_path: Path) -> None:
    """The daemon stopped with its runs (a restart, an upgrade): the run's process is gone, the run
    still says STARTED. The health check run monitoring asks must say it failed, so the run does not
    hold its lane for ever."""
    from dagster._core.launcher.base import WorkerStatus

    run_id, pid = _sleeping_run(instance, tmp_path)
    other = WarmRunLauncher()  # run monitoring's, in another process: no handle on the run's process
    other.register_instance(instance)
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.tags[WORKER_TAG].endswith(f":{pid}")
    assert other.check_run_worker_health(run).status == WorkerStatus.RUNNING
    os.kill(pid, 9)
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, f"the run's process {pid} is still alive"
        time.sleep(0.2)
    health = other.check_run_worker_health(instance.get_run_by_id(run_id))
    assert health.status == WorkerStatus.FAILED
    assert f"process {pid}" in (health.msg or "")
    # A run another launcher started (no worker tag) is not judged by this one.
    assert other.check_run_worker_health(run.with_tags({})).status == WorkerStatus.RUNNING
