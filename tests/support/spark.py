"""One local Spark session for the whole test run (starting one costs several seconds)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import pytest
from pyspark.sql import SparkSession

from resources.spark import default_spark_config


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
