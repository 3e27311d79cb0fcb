"""``NGSI_SPARK_DATAFRAME_DEBUGGING``: pyspark's per-call call-site capture is off in the drivers and
Connect servers the platform starts, unless the variable turns it on."""

from __future__ import annotations

import pytest
from pyspark.errors import utils as pyspark_error_utils
from pyspark.sql import SparkSession

from resources.spark import DATAFRAME_DEBUGGING, default_spark_config
from tests.support.spark import connect_server_conf


def _server_setting() -> str | None:
    return connect_server_conf(DATAFRAME_DEBUGGING)


def test_off_by_default_in_a_run_driver_and_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NGSI_SPARK_DATAFRAME_DEBUGGING", raising=False)
    assert default_spark_config("local[1]")[DATAFRAME_DEBUGGING] == "false"
    assert _server_setting() == "false"
    # A static setting: a Connect client must not send it (the server refuses to change it).
    assert DATAFRAME_DEBUGGING not in default_spark_config(remote="sc://127.0.0.1:15002")


def test_the_variable_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGSI_SPARK_DATAFRAME_DEBUGGING", "1")
    assert default_spark_config("local[1]")[DATAFRAME_DEBUGGING] == "true"
    assert _server_setting() == "true"


def test_the_platform_session_records_no_call_sites(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark reads the setting from the session (once per process): building columns never walks
    the stack to record where they were built."""
    monkeypatch.setattr(pyspark_error_utils, "_enable_debugging_cache", None)
    assert spark.conf.get(DATAFRAME_DEBUGGING) == "false"
    assert pyspark_error_utils.is_debugging_enabled() is False
