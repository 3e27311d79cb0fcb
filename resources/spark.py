"""The Spark resource: one configured SparkSession per process, built on dagster-pyspark.

Locally this is ``local[*]`` in the run's process; at scale set ``spark.master`` (standalone, YARN,
Kubernetes) through ``NGSI_SPARK_MASTER``, or connect to a Spark Connect server with
``NGSI_SPARK_REMOTE=sc://host:port`` (a warm Spark shared by every run): the transforms do not change.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from dagster_pyspark import LazyPySparkResource

# JDBC drivers from Debian's libpostgresql-jdbc-java and libmariadb-java, put on the classpath
# when present so SQL sinks can use Spark JDBC as well as the Python drivers.
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/mariadb-java-client.jar")


def sql_config(shuffle_partitions: int | None = None) -> dict[str, str]:
    """The session (runtime SQL) settings every session of the platform uses, local or remote."""
    cores = os.cpu_count() or 2
    return {
        # All timestamps are UTC: NGSI times without a zone are UTC, and Cygnus writes UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "true",
        # Small shuffles by default: hourly partitions are modest, and local[*] has few cores.
        "spark.sql.shuffle.partitions": str(
            shuffle_partitions or int(os.environ.get("NGSI_SPARK_SHUFFLE_PARTITIONS", max(4, cores * 2)))
        ),
        "spark.sql.adaptive.enabled": "true",
        # Landing segments are large single files; smaller splits keep every core busy.
        "spark.sql.files.maxPartitionBytes": os.environ.get("NGSI_SPARK_MAX_PARTITION_BYTES", str(16 * 2**20)),
        # Off: with it on, Spark splits one from_json into one parse per field it selects, so a
        # payload is parsed once per column derived from it (measured: 10x slower message_store).
        "spark.sql.optimizer.enableJsonExpressionOptimization": "false",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
    }


def driver_config(driver_memory: str | None = None, *, ui: bool | None = None) -> dict[str, str]:
    """The settings of a Spark driver the platform starts itself (in process, or a Connect server)."""
    conf = {
        "spark.driver.memory": driver_memory or os.environ.get("NGSI_SPARK_DRIVER_MEMORY", "4g"),
        "spark.ui.enabled": "true" if (ui if ui is not None else os.environ.get("NGSI_SPARK_UI") == "1") else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    }
    jars = [j for j in JDBC_JARS if Path(j).exists()]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


def default_spark_config(
    master: str | None = None,
    *,
    remote: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    ui: bool | None = None,
) -> dict[str, Any]:
    """The settings of the platform's Spark session; arguments override the environment.

    ``remote`` (else ``NGSI_SPARK_REMOTE``), a Spark Connect URL ``sc://host:port``, makes the session a
    client of that server: only the session's SQL settings are sent, the server owns the rest. Otherwise
    the session is a driver in this process on ``master`` (else ``NGSI_SPARK_MASTER``, default
    ``local[*]``): ``spark://...`` for a standalone cluster, ``yarn``, ``k8s://...``.
    """
    # An explicit master (tests, benchmarks) wins over the environment's remote.
    remote = remote or (None if master else os.environ.get("NGSI_SPARK_REMOTE") or None)
    if remote:
        if not remote.startswith("sc://"):
            raise ValueError(f"NGSI_SPARK_REMOTE must be a Spark Connect URL sc://host:port, not {remote!r}")
        return {"spark.remote": remote, **sql_config(shuffle_partitions)}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return {
        "spark.master": master or os.environ.get("NGSI_SPARK_MASTER", "local[*]"),
        "spark.app.name": "ngsi-assets",
        **sql_config(shuffle_partitions),
        **driver_config(driver_memory, ui=ui),
    }


def spark_resource(**overrides: Any) -> LazyPySparkResource:
    """The platform's Spark resource: the session starts (or connects) on first use, then is reused."""
    return LazyPySparkResource(spark_config=default_spark_config(**overrides))
