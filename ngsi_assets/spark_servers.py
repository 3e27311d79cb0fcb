"""The Spark servers the platform can run on, as they ship inside pyspark (nothing to download).

- a **Spark Connect server** (``sbin/start-connect-server.sh --wait``, in the foreground): one warm
  Spark driver that every Dagster run, sensor and CLI command reaches with
  ``NGSI_SPARK_REMOTE=sc://host:port``, instead of each starting a JVM of its own;
- a **standalone cluster**: a master (``bin/spark-class org.apache.spark.deploy.master.Master``) and
  workers (``...deploy.worker.Worker spark://host:port``), each its own JVM with its own Python
  workers, reached with ``NGSI_SPARK_MASTER=spark://host:port``.

These build the command lines (``ngsi-assets spark ...`` runs them); what each server needs to run the
platform's code is in docs/deployment.md ("Running on a Spark cluster or through Spark Connect").
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from resources.spark import SERVER_GC, SERVER_JIT, driver_config, scheduler_config, spark_home, sql_config

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_CONNECT_PORT = 15002


def server_env(
    log_dir: Path, python: str | None = None, base: Mapping[str, str] | None = None, *, host: str | None = None
) -> dict[str, str]:
    """The environment of a Spark server process: its logs and pid files under ``log_dir``, the Python
    its Python workers run (one where this project is installed: they import its code), and with
    ``host`` the address its JVM binds its own ports to (Spark otherwise picks the machine's name)."""
    env = dict(os.environ if base is None else base)
    python = python or sys.executable
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOG_DIR": str(log_dir),
            "SPARK_PID_DIR": str(log_dir),
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
        }
    )
    if host:
        env["SPARK_LOCAL_IP"] = host
    # A Connect server is a classic driver: a client's remote settings must not leak into it.
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "NGSI_SPARK_REMOTE"):
        env.pop(name, None)
    return env


def _conf_args(conf: Mapping[str, str]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


def connect_server_command(
    port: int = DEFAULT_CONNECT_PORT,
    *,
    host: str = "127.0.0.1",
    master: str = "local[*]",
    driver_memory: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> list[str]:
    """``start-connect-server.sh --wait``: a Spark Connect server in the foreground on ``host:port``.

    Its driver gets the platform's settings (UTC, ANSI, memory, the JDBC jars, C2 and the parallel
    collector for a JVM that serves many runs), and runs its work on
    ``master`` (``local[*]`` in the server's process, or a cluster's ``spark://...``). The clients'
    sessions set their own SQL settings too, so two platforms can share one server. Jobs are
    scheduled FAIR over the platform's pools, so an increment's jobs need not wait for a derived run's.
    """
    conf = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        **driver_config(driver_memory, jit_default=SERVER_JIT, gc_default=SERVER_GC, master=master),
        **scheduler_config(),
        **sql_config(),
        **(extra_conf or {}),
    }
    return [
        str(spark_home() / "sbin" / "start-connect-server.sh"),
        "--wait",
        "--master",
        master,
        "--name",
        f"ngsi-assets Spark Connect server on {host}:{port}",
        *_conf_args(conf),
    ]


def master_command(host: str = "127.0.0.1", port: int = 7077, webui_port: int = 8080) -> list[str]:
    """A standalone cluster's master, in the foreground: workers and drivers reach ``spark://host:port``."""
    return [
        str(spark_home() / "bin" / "spark-class"),
        MASTER_CLASS,
        "--host",
        host,
        "--port",
        str(port),
        "--webui-port",
        str(webui_port),
    ]


def master_port_taken(host: str, port: int) -> str | None:
    """Why a master could not have ``host:port``, or None when it is free.

    A standalone master whose port is taken does not fail: Spark binds the next free one
    (``spark.port.maxRetries``, 16 by default), and workers and drivers told ``spark://host:port`` find
    nothing there, or another master. ``ngsi-assets spark master`` refuses to start instead. The probe
    binds as the master does (``SO_REUSEADDR``), so a port left in TIME_WAIT by a stopped master is free.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"{host}:{port} is not free ({exc.strerror or exc})"
    return None


def worker_command(
    master_url: str,
    *,
    host: str = "127.0.0.1",
    cores: int = 1,
    memory: str = "2g",
    webui_port: int = 8081,
    work_dir: Path | None = None,
) -> list[str]:
    """A standalone worker in the foreground, offering ``cores`` and ``memory`` to the master's drivers."""
    cmd = [
        str(spark_home() / "bin" / "spark-class"),
        WORKER_CLASS,
        "--host",
        host,
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--webui-port",
        str(webui_port),
    ]
    if work_dir is not None:
        cmd += ["--work-dir", str(work_dir)]
    return [*cmd, master_url]
