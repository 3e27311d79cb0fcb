"""One local Spark session for the whole test run (starting one costs several seconds)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping

import pytest
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.spark_servers import connect_server_command
from resources.spark import default_spark_config


def connect_server_conf(key: str, **command: str) -> str | None:
    """The value of setting ``key`` in the Connect server's command (``command``: its arguments beside
    the port); None if it sets none."""
    cmd = connect_server_command(15002, **command)
    confs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    values = [c.split("=", 1)[1] for c in confs if c.startswith(f"{key}=")]
    assert len(values) <= 1, confs
    return values[0] if values else None


@contextlib.contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[SparkSession]:
    """``spark`` with ``settings`` (runtime SQL settings) for the block, as they were after it."""
    before = {k: spark.conf.get(k) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield spark
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


def physical_plan(df: DataFrame) -> str:
    """``df``'s physical plan as ``explain()`` prints it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain()
    return out.getvalue()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    builder = SparkSession.builder
    for key, value in default_spark_config("local[2]", shuffle_partitions=4, driver_memory="3g", ui=False).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(autouse=True, scope="module")
def _release_cached_frames() -> Iterator[None]:
    """Drop what a test module cached: the one session lives for the whole run, and cached blocks
    within the protected storage fraction would otherwise starve later modules' aggregations."""
    yield
    session = SparkSession.getActiveSession()
    if session is not None:
        session.catalog.clearCache()
