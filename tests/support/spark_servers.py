"""Throwaway Spark servers for the tests: a standalone master with workers, and a Spark Connect server.

Each runs from the pyspark package itself (``ngsi_assets.spark_servers`` builds the command lines, the
same ones ``ngsi-assets spark ...`` runs), on free loopback ports, with its logs in a temp folder, and
is stopped (with every process of its group) when the fixture ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ngsi_assets.spark_servers import connect_server_command, master_command, server_env, worker_command
from tests.support.servers import ServerProcess, _make_workdir, _ready_or_stop, _start_with_port_retries, free_port

HOST = "127.0.0.1"
WORKERS = 2
WORKER_MEMORY = "2g"


def _spawn(name: str, cmd: list[str], workdir: Path, port: int, log_name: str) -> ServerProcess:
    log_path = workdir / log_name
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=server_env(workdir, python=sys.executable, host=HOST),
            process_group=0,
        )
    return ServerProcess(name, process, port, workdir, log_path, signal_group=True)


@dataclass
class StandaloneCluster:
    master_url: str
    master: ServerProcess
    workers: list[ServerProcess]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()


def _master_state(webui_port: int) -> dict:
    """The master's state as its web UI gives it (``/json/``)."""
    with urllib.request.urlopen(f"http://{HOST}:{webui_port}/json/", timeout=2) as resp:
        return json.load(resp)


def _alive_workers(webui_port: int) -> int:
    return int(_master_state(webui_port).get("aliveworkers", 0))


def start_standalone_cluster(workers: int = WORKERS, memory: str = WORKER_MEMORY) -> StandaloneCluster:
    """A master and ``workers`` workers of one core each; ready once the master counts them all alive."""
    webui = free_port()

    def start_master(port: int) -> ServerProcess:
        workdir = _make_workdir("spark-master", None)
        server = _spawn("Spark master", master_command(HOST, port, webui), workdir, port, "master.log")
        return _ready_or_stop(server, lambda: _alive_workers(webui))

    master = _start_with_port_retries(start_master)
    # The URL the master serves: Spark moves to the next port when the one asked for is taken
    # (``spark.port.maxRetries``), and workers pointed at the one asked for never register.
    url = str(_master_state(webui)["url"])
    started: list[ServerProcess] = []
    try:
        for i in range(workers):
            workdir = _make_workdir(f"spark-worker{i}", None)
            cmd = worker_command(url, host=HOST, cores=1, memory=memory, webui_port=free_port(), work_dir=workdir)
            started.append(_spawn(f"Spark worker {i}", cmd, workdir, 0, "worker.log"))

        def all_alive() -> None:
            alive = _alive_workers(webui)
            if alive < workers:
                raise RuntimeError(f"{alive} of {workers} workers registered")

        master.wait_ready(all_alive)
    except BaseException:
        for s in [*started, master]:
            s.stop()
        raise
    return StandaloneCluster(url, master, started)


def start_connect_server(master: str = "local[2]") -> ServerProcess:
    """A Spark Connect server (its own JVM, running its work on ``master``); ready when a client answers."""

    def start(port: int) -> ServerProcess:
        workdir = _make_workdir("spark-connect", None)
        cmd = connect_server_command(
            port, host=HOST, master=master, driver_memory="2g", extra_conf={"spark.sql.shuffle.partitions": "4"}
        )
        server = _spawn("Spark Connect server", cmd, workdir, port, "connect.log")

        def probe() -> None:
            import socket

            with socket.create_connection((HOST, port), timeout=1):
                pass

        return _ready_or_stop(server, probe)

    return _start_with_port_retries(start)


def _serve(start: Callable[[], object], stop: Callable[[object], None]) -> Iterator[object]:
    server = start()
    try:
        yield server
    finally:
        stop(server)


@pytest.fixture(scope="session")
def standalone_cluster() -> Iterator[StandaloneCluster]:
    yield from _serve(start_standalone_cluster, lambda c: c.stop())  # type: ignore[misc]


@pytest.fixture(scope="session")
def connect_url() -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a throwaway Spark Connect server."""
    for server in _serve(start_connect_server, lambda s: s.stop()):  # type: ignore[misc]
        yield f"sc://{HOST}:{server.port}"  # type: ignore[attr-defined]
