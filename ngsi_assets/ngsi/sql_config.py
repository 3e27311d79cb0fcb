"""Configuration of the PostgreSQL and MySQL sinks, with Cygnus's parameter names, validated by pydantic.

One ``SqlSinkConfig`` per sink (dialect). It is loaded from a YAML (or JSON) file named by
``NGSI_SQL_SINKS_CONFIG``, whose top level has ``postgresql:`` and/or ``mysql:`` sections holding
these parameters plus ``url``; or, without a file, from ``NGSI_POSTGRES_URL`` / ``NGSI_MYSQL_URL``
with every parameter at its default. A sink with no URL is not configured (its assets skip).
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ngsi_assets.ngsi.sql_naming import (
    COLUMN_FIXED,
    DEFAULT_SERVICE,
    DEFAULT_SERVICE_PATH,
    SCHEMA_PER_PATH,
    DataModel,
    Dialect,
    NamingConfig,
    attribute_column,
    fixed_column,
)
from ngsi_assets.ngsi.sql_timestamp import TimestampFormatError, spark_pattern

CONFIG_ENV = "NGSI_SQL_SINKS_CONFIG"
URL_ENV = {Dialect.POSTGRESQL: "NGSI_POSTGRES_URL", Dialect.MYSQL: "NGSI_MYSQL_URL"}
RECV_TIME = "recvTime"
# last_data_sql_timestamp_format that orders by the ISO 8601 instant, whatever form each value has.
ISO8601 = "iso8601"
DEFAULT_TIMESTAMP_FORMAT = {Dialect.POSTGRESQL: "YYYY-MM-DD HH24:MI:SS.MS", Dialect.MYSQL: "%Y-%m-%d %H:%i:%s.%f"}


class AttrPersistence(StrEnum):
    ROW = "row"
    COLUMN = "column"


class LastDataMode(StrEnum):
    INSERT = "insert"
    UPSERT = "upsert"
    BOTH = "both"


class PersistencePolicy(BaseModel):
    """Capping and expiration of the historic tables (both off by default, as in Cygnus)."""

    model_config = ConfigDict(extra="forbid")

    max_records: int = Field(default=0, ge=0, description="Keep the newest N rows per table; 0 = no capping.")
    expiration_time: int = Field(default=0, ge=0, description="Drop rows older than this many seconds; 0 = never.")


class SqlSinkConfig(BaseModel):
    """One SQL sink: where it writes, how it names and lays out tables, last data, batching."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    dialect: Dialect = Field(description="postgresql or mysql: the section the parameters sit in.")
    url: str | None = Field(
        default=None, repr=False, description="postgresql://user:password@host:5432/db or mysql://...; unset: off."
    )
    data_model: DataModel = Field(
        default=DataModel.BY_ENTITY,
        description="dm-by-service-path, dm-by-entity-type, dm-by-entity or dm-by-fixed-entity-type: a table per "
        "service path, entity type or entity; their -database variants (a database per service) and, on "
        "PostgreSQL, -database-schema variants.",
    )
    attr_persistence: AttrPersistence = Field(
        default=AttrPersistence.ROW,
        description="row: a historic row per attribute update; column: a row per notified entity.",
    )
    enable_encoding: bool = Field(default=False, description="true: the new (x-hex) encoding of names.")
    enable_lowercase: bool = Field(default=False, description="true: names in lower case.")
    default_service: str = Field(default=DEFAULT_SERVICE, description="Service of notifications without one.")
    default_service_path: str = Field(
        default=DEFAULT_SERVICE_PATH, description="Service path of notifications without one."
    )
    last_data_mode: LastDataMode = Field(
        default=LastDataMode.INSERT,
        description="insert: historic tables only; upsert: last data only; both.",
    )
    last_data_table_suffix: str = Field(default="_last_data", description="Appended to a last-data table's name.")
    last_data_unique_key: list[str] = Field(
        default_factory=lambda: ["entityId"],
        description="Columns that identify a last-data row, among entityId, entityType, fiwareServicePath, "
        "recvTime (comma-separated).",
    )
    last_data_timestamp_key: str = Field(
        default="recvTime",
        description="What decides which record is newest: recvTime, or an attribute such as TimeInstant.",
    )
    last_data_sql_timestamp_format: str | None = Field(
        default=None,
        description="How the timestamp attribute is read: unset or iso8601, its ISO 8601 instant in any form; "
        "or a server format (PostgreSQL to_timestamp, MySQL STR_TO_DATE), Cygnus's rule.",
    )
    batch_size: int = Field(default=1000, ge=1, le=100_000, description="Rows per INSERT statement.")
    batch_ttl: int = Field(default=10, ge=0, description="Retries of a failed batch before the run fails.")
    batch_retry_intervals: list[int] = Field(default_factory=lambda: [5000], description="Milliseconds.")
    persistence_policy: PersistencePolicy = Field(
        default_factory=PersistencePolicy,
        description="Capping and expiration of the historic tables (persistence_policy.max_records, "
        "persistence_policy.expiration_time).",
    )

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, data: Any) -> Any:
        # Cygnus writes persistence_policy.max_records as a flat dotted key; accept both spellings.
        if isinstance(data, dict):
            data = dict(data)
            policy = dict(data.get("persistence_policy") or {})
            for key in list(data):
                if key.startswith("persistence_policy."):
                    policy[key.split(".", 1)[1]] = data.pop(key)
            if policy:
                data["persistence_policy"] = policy
        return data

    @field_validator("last_data_unique_key", "batch_retry_intervals", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, int) and not isinstance(value, bool):  # a YAML `batch_retry_intervals: 5000`
            return [value]
        return value

    @field_validator("last_data_unique_key")
    @classmethod
    def _unique_key(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("last_data_unique_key needs at least one column")
        bad = [c for c in value if c not in COLUMN_FIXED]
        if bad:
            raise ValueError(f"last_data_unique_key columns must be among {', '.join(COLUMN_FIXED)}; got {bad}")
        if len(set(value)) != len(value):
            raise ValueError("last_data_unique_key names a column twice")
        return value

    @model_validator(mode="after")
    def _data_model_of_dialect(self) -> SqlSinkConfig:
        if self.dialect is Dialect.MYSQL and self.data_model in SCHEMA_PER_PATH:
            raise ValueError(
                f"data_model {self.data_model.value} exists only for PostgreSQL (a schema per service path); "
                "Cygnus's MySQL sink has no schemas"
            )
        return self

    @field_validator("last_data_timestamp_key")
    @classmethod
    def _timestamp_key(cls, value: str) -> str:
        # Cygnus compares the key case-insensitively (NGSIGenericColumnAggregator.aggregate).
        if value.lower() == RECV_TIME.lower():
            return RECV_TIME
        if not value.strip():
            raise ValueError("last_data_timestamp_key is empty: use recvTime or an attribute such as TimeInstant")
        if value.lower() in {c.lower() for c in COLUMN_FIXED}:
            raise ValueError(
                f"last_data_timestamp_key {value!r} is not a time: use recvTime or an attribute such as TimeInstant"
            )
        return value

    @field_validator("last_data_sql_timestamp_format")
    @classmethod
    def _timestamp_format(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Declared after dialect and last_data_timestamp_key, so both are in info.data when valid.
        dialect, key = info.data.get("dialect"), info.data.get("last_data_timestamp_key")
        if value is not None and value.strip().lower() == ISO8601:
            return ISO8601
        if value is not None and dialect is not None and key not in (None, RECV_TIME):
            try:
                spark_pattern(value, dialect)
            except TimestampFormatError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def timestamp_pattern(self) -> str:
        """The Spark pattern that reads the timestamp key as the server's format does."""
        return spark_pattern(self.timestamp_format, self.dialect)

    @property
    def timestamp_is_recv_time(self) -> bool:
        return self.last_data_timestamp_key == RECV_TIME

    @property
    def orders_by_instant(self) -> bool:
        """Whether last data orders by the ISO 8601 instant of an attribute (``iso8601``, or no format set).

        The attribute's values are read as ISO 8601 in any form (offsets, with or without fraction,
        milliseconds to nanoseconds, a space for the ``T``): ``ngsi_assets.transforms.instants``. The
        instant, in epoch nanoseconds, is stored beside the row in ``INSTANT_COLUMN``, which the
        servers' upsert guard compares; the attribute keeps the text the device sent. A format set to
        anything else is Cygnus's rule: the server parses the column with that format.
        """
        if self.timestamp_is_recv_time:
            return False
        return self.last_data_sql_timestamp_format in (None, ISO8601)

    @property
    def timestamp_column(self) -> str:
        """The last-data column the guard compares: recvTime's, or the timestamp attribute's column."""
        if self.timestamp_is_recv_time:
            return fixed_column(RECV_TIME, self.dialect)
        return attribute_column(self.last_data_timestamp_key, self.dialect)

    @field_validator("batch_retry_intervals")
    @classmethod
    def _intervals(cls, value: list[int]) -> list[int]:
        if not value or any(v < 0 for v in value):
            raise ValueError("batch_retry_intervals must be a non-empty list of milliseconds >= 0")
        return value

    @field_validator("default_service_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("default_service_path must start with '/'")
        return value

    @property
    def timestamp_format(self) -> str:
        return self.last_data_sql_timestamp_format or DEFAULT_TIMESTAMP_FORMAT[self.dialect]

    @property
    def naming(self) -> NamingConfig:
        return NamingConfig(
            dialect=self.dialect,
            data_model=self.data_model,
            enable_encoding=self.enable_encoding,
            enable_lowercase=self.enable_lowercase,
            default_service=self.default_service,
            default_service_path=self.default_service_path,
        )

    @property
    def last_data_enabled(self) -> bool:
        return self.last_data_mode in (LastDataMode.UPSERT, LastDataMode.BOTH)

    @property
    def historic_enabled(self) -> bool:
        return self.last_data_mode in (LastDataMode.INSERT, LastDataMode.BOTH)

    def retry_delays_s(self) -> list[float]:
        """The waits before each retry: the intervals in order, the last repeated up to batch_ttl retries."""
        ivs = self.batch_retry_intervals
        return [ivs[min(i, len(ivs) - 1)] / 1000.0 for i in range(self.batch_ttl)]


def load_sink_configs(environ: dict[str, str] | None = None) -> dict[Dialect, SqlSinkConfig]:
    """The configured sinks (those with a URL), from NGSI_SQL_SINKS_CONFIG or the URL variables."""
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    path = env.get(CONFIG_ENV)
    if path:
        text = Path(path).read_text()
        if path.endswith(".json"):
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text) or {}
        unknown = set(raw) - {d.value for d in Dialect}
        if unknown:
            raise ValueError(f"{CONFIG_ENV} {path}: unknown sections {sorted(unknown)}; use postgresql and mysql")
    out: dict[Dialect, SqlSinkConfig] = {}
    for dialect in Dialect:
        section = dict(raw.get(dialect.value) or {})
        section.setdefault("url", env.get(URL_ENV[dialect]) or None)
        cfg = SqlSinkConfig(dialect=dialect, **section)
        if cfg.url:
            out[dialect] = cfg
    return out
