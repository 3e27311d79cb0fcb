"""``NGSI_SPARK_JIT`` and ``NGSI_SPARK_GC``: the JIT and collector options of the drivers the platform
starts, and that they reach the JVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ngsi_assets.spark_servers import connect_server_command
from resources.spark import EXECUTOR_JIT, LOG4J2, default_spark_config
from tests.support.spark import connect_server_conf

LOGGING = f"-Dlog4j2.configurationFile={LOG4J2}"

REPO = Path(__file__).resolve().parents[2]
QUICK = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]
PARALLEL = ["-XX:+UseParallelGC"]


@pytest.fixture(autouse=True)
def _no_gc_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the collector variable it means; the session's own stays out."""
    monkeypatch.delenv("NGSI_SPARK_GC", raising=False)


def _run_driver_options() -> list[str]:
    return default_spark_config("local[1]")["spark.driver.extraJavaOptions"].split()


def _server_conf(key: str) -> list[str] | None:
    """The options ``key`` of the Connect server's command (on a cluster), split; None if not set."""
    value = connect_server_conf(key, master="spark://127.0.0.1:7077")
    return None if value is None else value.split()


def _server_options() -> list[str] | None:
    return _server_conf("spark.driver.extraJavaOptions")


def _run_executor_options() -> list[str] | None:
    option = default_spark_config("spark://127.0.0.1:7077").get(EXECUTOR_JIT)
    return None if option is None else option.split()


def _server_executor_options() -> list[str] | None:
    return _server_conf(EXECUTOR_JIT)


def test_a_run_driver_stops_at_c1_and_a_server_keeps_c2_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NGSI_SPARK_JIT", raising=False)
    assert _run_driver_options() == [LOGGING, *QUICK]
    assert _server_options() == [LOGGING, *PARALLEL]
    # A cluster's executors live as long as their driver: they get its mode (none to add for full).
    assert _run_executor_options() == QUICK
    assert _server_executor_options() is None


@pytest.mark.parametrize(("mode", "expected"), [("full", []), ("quick", QUICK)])
def test_the_variable_sets_both(monkeypatch: pytest.MonkeyPatch, mode: str, expected: list[str]) -> None:
    monkeypatch.setenv("NGSI_SPARK_JIT", mode)
    assert _run_driver_options() == [LOGGING, *expected]
    assert _server_options() == [LOGGING, *expected, *PARALLEL]
    assert _run_executor_options() == (expected or None)
    assert _server_executor_options() == (expected or None)


def test_an_unknown_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGSI_SPARK_JIT", "fast")
    with pytest.raises(ValueError, match=r"NGSI_SPARK_JIT must be one of quick, full, not 'fast'"):
        default_spark_config("local[1]")


def test_a_server_collects_in_parallel_and_a_run_driver_keeps_the_jvm_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NGSI_SPARK_JIT", raising=False)
    assert _server_options() == [LOGGING, *PARALLEL]
    assert _run_driver_options() == [LOGGING, *QUICK]
    # The collector is the driver's alone: a cluster's executors keep their own.
    assert _server_executor_options() is None


@pytest.mark.parametrize(("mode", "expected"), [("parallel", PARALLEL), ("g1", [])])
def test_the_gc_variable_sets_both(monkeypatch: pytest.MonkeyPatch, mode: str, expected: list[str]) -> None:
    monkeypatch.setenv("NGSI_SPARK_JIT", "full")
    monkeypatch.setenv("NGSI_SPARK_GC", mode)
    assert _run_driver_options() == [LOGGING, *expected]
    assert _server_options() == [LOGGING, *expected]


def test_an_unknown_collector_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGSI_SPARK_GC", "zgc")
    with pytest.raises(ValueError, match=r"NGSI_SPARK_GC must be one of parallel, g1, not 'zgc'"):
        connect_server_command(15002)


PROBE = """
from dagster_pyspark.resources import spark_session_from_config
from resources.spark import default_spark_config
jvm = spark_session_from_config(default_spark_config("local[1]", ui=False)).sparkContext._jvm
bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
print("options", bean.getVMOption("TieredStopAtLevel").getValue(), bean.getVMOption("ReservedCodeCacheSize").getValue(),
      bean.getVMOption("UseParallelGC").getValue())
"""


@pytest.mark.spark
def test_a_run_drivers_jvm_gets_the_options() -> None:
    """A driver started as a run starts one, in a process of its own with the default environment:
    its JVM compiles with C1 only, with the full code cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("NGSI_SPARK_JIT", "NGSI_SPARK_GC")}
    assert _probe(env) == [f"options 1 {240 * 2**20} false"]


@pytest.mark.spark
def test_the_parallel_collector_reaches_the_drivers_jvm() -> None:
    """With ``NGSI_SPARK_GC=parallel`` (a Connect server's default) the JVM runs the parallel collector."""
    env = {k: v for k, v in os.environ.items() if k != "NGSI_SPARK_JIT"}
    env["NGSI_SPARK_GC"] = "parallel"
    assert _probe(env) == [f"options 1 {240 * 2**20} true"]


def _probe(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("options ")]
    assert lines, out.stderr[-3000:]
    return lines


def test_the_drivers_logging_file_exists_and_silences_only_known_warnings() -> None:
    text = LOG4J2.read_text()
    assert "rootLogger.level = warn" in text
    silenced = [
        line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("logger.") and ".name" in line
    ]
    assert silenced == [
        "org.apache.hadoop.util.NativeCodeLoader",
        "org.apache.spark.util.SparkStringUtils",
        "org.apache.spark.sql.catalyst.util.StringUtils",
    ]
