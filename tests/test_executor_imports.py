"""Modules whose code Spark runs in Python workers import nothing heavy.

Spark unpickles UDFs, ``mapInArrow`` bodies and data sources by reference in fresh Python processes:
the data source planner on the driver for every read, and every new Python worker of a session's
executors (Spark Connect starts new workers per session, so per Dagster run). A module that imports
dagster there costs about 0.7 s per process: measured through Spark Connect, reading a 100-line
landing range took 3.7 s while the data source lived beside the Dagster resource, 0.27 s after.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Whatever Spark ships to Python workers lives in these modules.
WORKER_MODULES = sorted(
    [
        "resources.landing_source",
        *(
            f"ngsi_assets.{p.parent.name}.{p.stem}"
            for folder in ("transforms", "sinks")
            for p in (REPO / "ngsi_assets" / folder).glob("*.py")
            if p.stem != "__init__"
        ),
    ]
)
HEAVY = ("dagster", "dagster_pyspark", "pandas", "aiohttp")


def heavy_imports(module: str) -> list[str]:
    """The heavy packages a fresh interpreter has loaded after importing ``module``."""
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_worker_modules_are_found() -> None:
    assert {"resources.landing_source", "ngsi_assets.sinks.sql_writer", "ngsi_assets.transforms.sql_sinks"} <= set(
        WORKER_MODULES
    )


def test_the_check_sees_a_heavy_import() -> None:
    assert heavy_imports("resources.landing") == ["dagster"]


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_worker_module_imports_nothing_heavy(module: str) -> None:
    assert heavy_imports(module) == []


def test_the_landing_reader_is_the_light_one() -> None:
    from resources.landing import LandingRangeSource

    assert LandingRangeSource.__module__ == "resources.landing_source"
