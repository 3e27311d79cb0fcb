"""The Spark resource: one configured SparkSession per process, built on dagster-pyspark.

Locally this is ``local[*]``; at scale set ``spark.master`` (standalone, YARN, Kubernetes) through
``NGSI_SPARK_MASTER`` or the ``spark_config`` of the resource: the transforms do not change.
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


def default_spark_config(
    master: str | None = None,
    *,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    ui: bool | None = None,
) -> dict[str, Any]:
    """The Spark settings every session of the platform uses; arguments override the environment."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("NGSI_SPARK_MASTER", "local[*]")
    cores = os.cpu_count() or 2
    conf: dict[str, Any] = {
        "spark.master": master,
        "spark.app.name": "ngsi-assets",
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
        "spark.driver.memory": driver_memory or os.environ.get("NGSI_SPARK_DRIVER_MEMORY", "4g"),
        "spark.ui.enabled": "true" if (ui if ui is not None else os.environ.get("NGSI_SPARK_UI") == "1") else "false",
        "spark.ui.showConsoleProgress": "false",
        # Off: with it on, Spark splits one from_json into one parse per field it selects, so a
        # payload is parsed once per column derived from it (measured: 10x slower message_store).
        "spark.sql.optimizer.enableJsonExpressionOptimization": "false",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    }
    jars = [j for j in JDBC_JARS if Path(j).exists()]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


def spark_resource(**overrides: Any) -> LazyPySparkResource:
    """The platform's Spark resource: the session starts on first use, then is reused."""
    return LazyPySparkResource(spark_config=default_spark_config(**overrides))
