"""``ngsi-assets spark warm-up``: what its runs are given, and the errors it names."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ngsi_assets.cli import main
from ngsi_assets.spark_warmup import DEMO_SCHEMA, WarmUpError, server_address, warm_up, warm_up_env


@pytest.fixture
def listener() -> Iterator[str]:
    """A loopback port that accepts connections (and is no Spark server): ``sc://127.0.0.1:PORT``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"sc://127.0.0.1:{s.getsockname()[1]}"


def test_the_runs_get_a_throwaway_lake_and_no_database(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "DAGSTER_HOME": "/srv/dagster",
        "NGSI_LAKE_ROOT": "/srv/lake",
        "NGSI_LANDING_ROOT": "/srv/landing",
        "NGSI_DATA_ROOT": "/srv",
        "NGSI_SQL_SINKS_CONFIG": "/etc/ngsi/sinks.yaml",
        "NGSI_MONGO_URL": "mongodb://db:27017",
        "NGSI_MONGO_RAW_ENABLED": "true",
        "NGSI_HISTORY_POSTGRES_URL": "postgresql://db/history",
        "NGSI_SPARK_MASTER": "spark://cluster:7077",
        "NGSI_SPARK_REMOTE": "sc://elsewhere:15002",
        "NGSI_STH_RESOLUTIONS": "minute,hour",
        "NGSI_SPARK_SHUFFLE_PARTITIONS": "8",
    }
    env = warm_up_env("sc://127.0.0.1:15002", tmp_path, base)
    assert env == {
        "PATH": "/usr/bin",
        "NGSI_STH_RESOLUTIONS": "minute,hour",
        "NGSI_SPARK_SHUFFLE_PARTITIONS": "8",
        "NGSI_SPARK_REMOTE": "sc://127.0.0.1:15002",
        "NGSI_LANDING_ROOT": str(tmp_path / "landing"),
        "NGSI_LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "NGSI_ENTITY_SCHEMA": str(DEMO_SCHEMA),
    }
    assert DEMO_SCHEMA.is_file()


def test_the_platform_entity_schema_is_kept(tmp_path: Path) -> None:
    env = warm_up_env("sc://h:1", tmp_path, {"NGSI_ENTITY_SCHEMA": "/etc/ngsi/entities.yaml"})
    assert env["NGSI_ENTITY_SCHEMA"] == "/etc/ngsi/entities.yaml"


@pytest.mark.parametrize(
    "remote", ["http://h:15002", "sc://h", "sc://:15002", "sc://h:port", "h:15002", "sc://h:99999", ""]
)
def test_a_server_that_is_not_sc_host_port_is_refused_by_name(remote: str) -> None:
    with pytest.raises(ValueError, match="a Spark Connect server is named sc://host:port, not"):
        server_address(remote)


def test_server_address_takes_parameters() -> None:
    assert server_address("sc://spark.example:15002/;token=abc") == ("spark.example", 15002)


def test_no_server_answering_is_an_error_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(WarmUpError, match=f"no Spark Connect server answers at sc://127.0.0.1:{port}"):
            warm_up(f"sc://127.0.0.1:{port}", 1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("runs", "notifications", "refusal"),
    [(0, 500, "runs must be at least 1, not 0"), (1, 499, "notifications must be at least 500 .*, not 499")],
)
def test_too_few_runs_or_notifications_are_refused(listener: str, runs: int, notifications: int, refusal: str) -> None:
    with pytest.raises(ValueError, match=f"warm-up {refusal}"):
        warm_up(listener, runs, notifications)


def test_a_failed_run_is_an_error_with_its_output_and_leaves_nothing(
    listener: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    env = {**os.environ, "NGSI_STH_RESOLUTIONS": "fortnight"}
    with pytest.raises(WarmUpError, match="warm-up run 1 of 2 through sc://127.0.0.1:[0-9]+ failed") as failed:
        warm_up(listener, 2, 500, base_env=env)
    assert "unknown resolution(s) ['fortnight']" in str(failed.value)
    assert list(tmp_path.iterdir()) == []


def test_a_port_that_never_answers_as_a_server_is_an_error_in_time(
    listener: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(WarmUpError, match="did not finish within 20 s: is that port a Spark Connect server's"):
        warm_up(listener, 1, 500, run_timeout_s=20)
    assert list(tmp_path.iterdir()) == []


def test_the_command_needs_a_server(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NGSI_SPARK_REMOTE", raising=False)
    assert main(["spark", "warm-up"]) == 2
    assert "name the server with --remote sc://host:port or NGSI_SPARK_REMOTE" in capsys.readouterr().err


def test_the_command_names_a_bad_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark", "warm-up", "--remote", "http://h:1"]) == 1
    assert "ngsi-assets spark warm-up: a Spark Connect server is named sc://host:port, not 'http://h:1'" in (
        capsys.readouterr().err
    )


def test_a_stopped_warm_up_deletes_what_it_made(listener: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ngsi-assets")), "spark", "warm-up", "--remote", listener],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        # Its run is under way (it never ends: the port is no Spark server) once the sample has landed.
        while not list(tmp_path.glob("ngsi-warm-up-*/home")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert list(tmp_path.glob("ngsi-warm-up-*/home")), "the warm-up run did not start within 60 s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.communicate()
    assert list(tmp_path.iterdir()) == []
