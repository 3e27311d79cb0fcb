"""SQL sink configuration: Cygnus's parameter names, defaults, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ngsi_assets.ngsi.sql_config import SqlSinkConfig, load_sink_configs
from ngsi_assets.ngsi.sql_naming import DataModel, Dialect


def test_defaults_are_cygnus_defaults() -> None:
    c = SqlSinkConfig(dialect="postgresql")
    assert (c.data_model, c.attr_persistence.value, c.enable_encoding, c.enable_lowercase) == (
        DataModel.BY_ENTITY,
        "row",
        False,
        False,
    )
    assert (c.last_data_mode.value, c.last_data_table_suffix, c.last_data_unique_key) == (
        "insert",
        "_last_data",
        ["entityId"],
    )
    assert c.timestamp_format == "YYYY-MM-DD HH24:MI:SS.MS"
    assert SqlSinkConfig(dialect="mysql").timestamp_format == "%Y-%m-%d %H:%i:%s.%f"
    assert (c.historic_enabled, c.last_data_enabled) == (True, False)


def test_cygnus_spellings_are_accepted() -> None:
    c = SqlSinkConfig(
        dialect="mysql",
        last_data_unique_key="entityId, entityType",
        batch_retry_intervals="100,200",
        batch_ttl=4,
        **{"persistence_policy.max_records": 5, "persistence_policy.expiration_time": 60},
    )
    assert c.last_data_unique_key == ["entityId", "entityType"]
    assert c.retry_delays_s() == [0.1, 0.2, 0.2, 0.2]
    assert (c.persistence_policy.max_records, c.persistence_policy.expiration_time) == (5, 60)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"data_model": "dm-by-attribute"}, "data_model"),
        ({"attr_persistence": "columns"}, "attr_persistence"),
        ({"last_data_mode": "upsertt"}, "last_data_mode"),
        ({"last_data_unique_key": "attrName"}, "last_data_unique_key"),
        ({"last_data_unique_key": ""}, "last_data_unique_key"),
        ({"last_data_timestamp_key": "entityId"}, "last_data_timestamp_key"),
        ({"last_data_timestamp_key": " "}, "last_data_timestamp_key"),
        (
            {"last_data_timestamp_key": "TimeInstant", "last_data_sql_timestamp_format": "%Y-%m-%d %h:%i"},
            "last_data_sql_timestamp_format",
        ),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_retry_intervals": [-1]}, "batch_retry_intervals"),
        ({"default_service_path": "nopath"}, "default_service_path"),
        ({"persistence_policy.max_records": -1}, "persistence_policy.max_records"),
        ({"enable_encodin": True}, "enable_encodin"),
    ],
)
def test_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        SqlSinkConfig(dialect="mysql", **kwargs)
    assert field in str(info.value)


def test_load_from_environment_and_file(tmp_path: Path) -> None:
    assert load_sink_configs({}) == {}
    got = load_sink_configs({"NGSI_MYSQL_URL": "mysql://u:p@h/db"})
    assert list(got) == [Dialect.MYSQL] and got[Dialect.MYSQL].url == "mysql://u:p@h/db"
    path = tmp_path / "sinks.yaml"
    path.write_text(
        "postgresql:\n  url: postgresql://u:p@h/db\n  data_model: dm-by-service-path\n  enable_encoding: true\n"
        "mysql:\n  attr_persistence: column\n"
    )
    got = load_sink_configs({"NGSI_SQL_SINKS_CONFIG": str(path)})
    assert list(got) == [Dialect.POSTGRESQL]  # mysql has no URL: off
    assert got[Dialect.POSTGRESQL].data_model is DataModel.BY_SERVICE_PATH
    path.write_text("oracle:\n  url: x\n")
    with pytest.raises(ValueError, match="unknown sections"):
        load_sink_configs({"NGSI_SQL_SINKS_CONFIG": str(path)})


@pytest.mark.parametrize(
    "model", ["dm-by-entity-database", "dm-by-entity-type-database", "dm-by-fixed-entity-type-database"]
)
def test_database_models_on_both_dialects(model: str) -> None:
    for dialect in Dialect:
        assert SqlSinkConfig(dialect=dialect, data_model=model).data_model.value == model


@pytest.mark.parametrize(
    "model",
    ["dm-by-entity-database-schema", "dm-by-entity-type-database-schema", "dm-by-fixed-entity-type-database-schema"],
)
def test_schema_per_service_path_models_are_postgresql_only(model: str) -> None:
    assert SqlSinkConfig(dialect=Dialect.POSTGRESQL, data_model=model).data_model.value == model
    with pytest.raises(ValueError, match=f"data_model {model} exists only for PostgreSQL"):
        SqlSinkConfig(dialect=Dialect.MYSQL, data_model=model)


def test_fixed_entity_type_model_on_both_dialects() -> None:
    for dialect in Dialect:
        assert SqlSinkConfig(dialect=dialect, data_model="dm-by-fixed-entity-type").data_model.value == (
            "dm-by-fixed-entity-type"
        )


def test_timestamp_key_recv_time_or_an_attribute() -> None:
    assert SqlSinkConfig(dialect="mysql", last_data_timestamp_key="recvtime").last_data_timestamp_key == "recvTime"
    c = SqlSinkConfig(dialect="postgresql", last_data_timestamp_key="TimeInstant",
                      last_data_sql_timestamp_format='YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')  # fmt: skip
    assert (c.timestamp_column, c.timestamp_pattern) == ("timeinstant", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
    assert SqlSinkConfig(dialect="mysql", last_data_timestamp_key="TimeInstant").timestamp_column == "TimeInstant"
    assert SqlSinkConfig(dialect="mysql").timestamp_column == "recvTime"


@pytest.mark.parametrize(
    ("key", "fmt", "by_instant"),
    [
        ("TimeInstant", None, True),
        ("TimeInstant", "iso8601", True),
        ("TimeInstant", " ISO8601 ", True),
        ("TimeInstant", "%Y-%m-%dT%H:%i:%s.%fZ", False),
        ("recvTime", None, False),
        ("recvTime", "iso8601", False),
    ],
)
def test_an_attribute_key_orders_by_its_iso8601_instant_unless_a_format_is_set(
    key: str, fmt: str | None, by_instant: bool
) -> None:
    c = SqlSinkConfig(dialect="mysql", last_data_timestamp_key=key, last_data_sql_timestamp_format=fmt)
    assert c.orders_by_instant is by_instant
    if fmt is not None and fmt.strip().lower() == "iso8601":
        assert c.last_data_sql_timestamp_format == "iso8601"


def test_one_retry_interval_as_a_yaml_number() -> None:
    # A Cygnus user's YAML: `batch_retry_intervals: 5000`, one number rather than a list or text.
    c = SqlSinkConfig.model_validate({"dialect": "mysql", "batch_retry_intervals": 5000})
    assert c.batch_retry_intervals == [5000]
    with pytest.raises(ValueError, match="batch_retry_intervals"):
        SqlSinkConfig.model_validate({"dialect": "mysql", "batch_retry_intervals": True})
