"""One local Spark session for the whole test run (starting one costs several seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from resources.spark import default_spark_config


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    builder = SparkSession.builder
    for key, value in default_spark_config("local[2]", shuffle_partitions=4, driver_memory="2g", ui=False).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
