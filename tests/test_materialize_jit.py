"""``ngsi-assets materialize`` gives a run's own Spark driver the full JIT when its hours hold a bulk of
landed data (``BULK_JIT_BYTES``), and leaves the quick one, or what ``NGSI_SPARK_JIT`` says, otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ngsi_assets.materialize import BULK_JIT_BYTES, bulk_jit, landed_bytes
from resources.landing import LandingZoneResource
from resources.spark import JIT_OPTIONS, default_spark_config

HOUR = "2026-01-05-10:00"
HOUR_DIR = "dt=2026-01-05-10"


def _landing(tmp_path: Path, sizes: list[int]) -> LandingZoneResource:
    folder = tmp_path / HOUR_DIR
    folder.mkdir(parents=True)
    for i, size in enumerate(sizes):
        with open(folder / f"{i:013d}-w-{i:05d}.jsonl", "wb") as f:
            f.truncate(size)  # sparse: the size is listed, no disk is used
    return LandingZoneResource(root=str(tmp_path))


@pytest.fixture(autouse=True)
def _no_jit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set, then removed: so the variables are restored after the test even when ``bulk_jit`` sets one
    # (a variable absent before is otherwise not recorded by ``delenv``).
    for name in ("NGSI_SPARK_JIT", "NGSI_SPARK_REMOTE"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _driver_options() -> str:
    return default_spark_config("local[1]")["spark.driver.extraJavaOptions"]


def test_a_bulk_of_landed_data_gets_the_full_jit(tmp_path: Path) -> None:
    landing = _landing(tmp_path, [BULK_JIT_BYTES // 2, BULK_JIT_BYTES // 2])
    assert landed_bytes(landing, [HOUR]) == BULK_JIT_BYTES
    assert JIT_OPTIONS["quick"][0] in _driver_options()
    bulk_jit(landing, [HOUR])
    assert os.environ["NGSI_SPARK_JIT"] == "full"
    assert not any(option in _driver_options() for option in JIT_OPTIONS["quick"])


def test_a_small_run_keeps_the_quick_jit(tmp_path: Path) -> None:
    bulk_jit(_landing(tmp_path, [BULK_JIT_BYTES - 1]), [HOUR])
    assert "NGSI_SPARK_JIT" not in os.environ
    # Only the run's hours count.
    bulk_jit(_landing(tmp_path / "other", [BULK_JIT_BYTES]), ["2026-01-05-11:00"])
    assert "NGSI_SPARK_JIT" not in os.environ


def test_the_setting_and_a_connect_server_keep_their_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landing = _landing(tmp_path, [BULK_JIT_BYTES])
    monkeypatch.setenv("NGSI_SPARK_JIT", "quick")
    bulk_jit(landing, [HOUR])
    assert os.environ["NGSI_SPARK_JIT"] == "quick"
    monkeypatch.delenv("NGSI_SPARK_JIT")
    monkeypatch.setenv("NGSI_SPARK_REMOTE", "sc://127.0.0.1:15002")
    bulk_jit(landing, [HOUR])
    assert "NGSI_SPARK_JIT" not in os.environ
