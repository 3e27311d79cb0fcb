"""A run's executors on a standalone cluster get the JIT mode of its driver (``NGSI_SPARK_JIT``).

An executor of a standalone cluster is a JVM of its own, started for the application and stopped with
it: for a run's own driver it lives as long as the run, like the driver, and gets the same ``quick``
options, before any executor options of the cluster's or the user's own (which keep the last word).
Read from the executor JVM's command line, through the Python worker it forked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spark_servers import StandaloneCluster, standalone_cluster  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]

# In a process as a run starts it (the platform's settings, the cluster in NGSI_SPARK_MASTER): a Python
# UDF over four partitions, spread over the two executors, reports the JVM options of the executor it
# runs in; the distinct answers are printed (one, when every executor got the same).
PROBE = """
import os
from dagster_pyspark.resources import spark_session_from_config
from pyspark.sql import functions as F
from resources.spark import default_spark_config

def executor_jvm(_):
    daemon = os.getppid()  # the worker was forked by pyspark's daemon, which the executor JVM started
    with open(f"/proc/{daemon}/stat") as f:
        jvm = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{jvm}/cmdline") as f:
        args = f.read().split("\\0")
    main = "executor" if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in args else "other"
    flags = [a for a in args if a.startswith(("-XX:TieredStopAtLevel", "-XX:ReservedCode", "-Dngsi."))]
    return " ".join([main, *flags])

# With an executor option of the user's own, which must stay and come after the platform's.
conf = {**default_spark_config(ui=False), "spark.executor.extraJavaOptions": "-Dngsi.own.option=kept"}
spark = spark_session_from_config(conf)
seen = spark.range(0, 8, 1, 4).select(F.udf(executor_jvm, "string")("id").alias("jvm")).distinct().collect()
for row in sorted(r.jvm for r in seen):
    print("jvm", row)
spark.stop()
"""


def _executor_jvms(cluster: StandaloneCluster) -> list[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NGSI_", "SPARK_REMOTE", "SPARK_CONNECT"))}
    base.update({"NGSI_SPARK_MASTER": cluster.master_url, "SPARK_LOCAL_IP": "127.0.0.1"})
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=base, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [ln.split(" ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("jvm ")]


def test_a_runs_executors_get_the_drivers_jit_mode(standalone_cluster: StandaloneCluster) -> None:  # noqa: F811
    # (With ``full`` the platform adds no executor option: tests/resources/test_spark_jit.py.)
    assert _executor_jvms(standalone_cluster) == [
        "executor -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -Dngsi.own.option=kept"
    ]
