"""Where the platform keeps its data: the one place that reads the environment for it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class VariableSettings(BaseModel):
    """Settings read from ``NGSI_*`` variables: each field's alias names its variable."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")
    # What the settings are, in the error that names a bad variable.
    what: ClassVar[str] = "settings"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """The settings the variables in ``env`` give (the others take their defaults); a bad value
        raises ``ValueError`` naming its variable."""
        names = {f.alias for f in cls.model_fields.values()}
        try:
            return cls.model_validate({k: v for k, v in env.items() if k in names})
        except ValidationError as exc:
            raise ValueError(f"{cls.what}: {exc}") from exc


def data_root() -> Path:
    """NGSI_DATA_ROOT, default ``.data`` under the working folder."""
    return Path(os.environ.get("NGSI_DATA_ROOT", ".data")).resolve()


def landing_root() -> str:
    """NGSI_LANDING_ROOT, default ``<data root>/landing``: a local folder the receiver appends to."""
    return os.environ.get("NGSI_LANDING_ROOT") or str(data_root() / "landing")


def lake_root() -> str:
    """NGSI_LAKE_ROOT, default ``<data root>/lake``: a local folder or a Hadoop URI (s3a://...)."""
    return os.environ.get("NGSI_LAKE_ROOT") or str(data_root() / "lake")


def entity_schema_path() -> str | None:
    """NGSI_ENTITY_SCHEMA: the YAML schema of the versioned entities (unset: default mappings only)."""
    return os.environ.get("NGSI_ENTITY_SCHEMA") or None


def entity_buckets() -> int | None:
    """NGSI_ENTITY_BUCKETS: hash buckets per versioned entity; None when unset (the lake's own count,
    64 for a new lake: ``VersioningResource.bucket_count``)."""
    value = os.environ.get("NGSI_ENTITY_BUCKETS", "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"NGSI_ENTITY_BUCKETS must be an integer, not {value!r}") from None


def _var(default: Any, name: str, group: str, description: str) -> Any:
    """A field of ``EnvironmentVariables``: the variable ``name``, in a section of the reference."""
    return Field(default, alias=name, description=description, json_schema_extra={"group": group})


class EnvironmentVariables(BaseModel):
    """The ``NGSI_*`` variables read outside the sinks' and sensors' own settings models.

    Each field is one variable (its alias), with the default that applies when it is unset; the
    configuration reference (``ngsi_assets.config_reference``) is generated from this model and the
    others, and a test checks that every variable the code reads is in it.
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    # Where data lives
    data_root: str = _var(
        ".data",
        "NGSI_DATA_ROOT",
        "storage",
        "Folder holding the landing zone and the lake when their own variables are unset.",
    )
    landing_root: str = _var(
        "<data root>/landing",
        "NGSI_LANDING_ROOT",
        "storage",
        "Local folder the receiver appends notifications to (the landing zone).",
    )
    lake_root: str = _var(
        "<data root>/lake",
        "NGSI_LAKE_ROOT",
        "storage",
        "The lake: a local folder or a Hadoop URI such as s3a://bucket/lake.",
    )
    partitions_start: str = _var(
        "2024-01-01-00:00",
        "NGSI_PARTITIONS_START",
        "storage",
        "First hour of the hourly partitions (UTC, YYYY-MM-DD-HH:MM).",
    )
    # Servers that make dev starts
    receiver_host: str = _var("127.0.0.1", "NGSI_RECEIVER_HOST", "servers", "Address the receiver binds (make dev).")
    receiver_port: int = _var(
        5050,
        "NGSI_RECEIVER_PORT",
        "servers",
        "Port of the receiver (make dev); point Orion subscriptions at http://<host>:<port>/notify.",
    )
    spark_connect_port: int = _var(
        15002,
        "NGSI_SPARK_CONNECT_PORT",
        "servers",
        "Port of the Spark Connect server make dev starts when NGSI_SPARK_REMOTE is unset.",
    )
    spark_warm_up_runs: int = _var(
        3,
        "NGSI_SPARK_WARM_UP_RUNS",
        "servers",
        "Main-job runs on a throwaway sample that warm the Spark Connect server make dev starts, beside the "
        "first real runs (ngsi-assets spark warm-up; its first runs are otherwise several times slower); 0: none.",
    )
    sth_api_host: str = _var(
        "127.0.0.1", "NGSI_STH_API_HOST", "servers", "Address the STH API binds (make dev, with NGSI_MONGO_URL set)."
    )
    sth_api_port: int = _var(8666, "NGSI_STH_API_PORT", "servers", "Port of the STH API (make dev; STH-Comet's port).")
    # Spark
    spark_master: str = _var(
        "local[*]",
        "NGSI_SPARK_MASTER",
        "spark",
        "Spark master of the run drivers: local[*] (the embedded default) or spark://host:7077.",
    )
    spark_remote: str | None = _var(
        None,
        "NGSI_SPARK_REMOTE",
        "spark",
        "A Spark Connect server (sc://host:15002): runs send their plans there instead of starting a driver.",
    )
    spark_driver_memory: str = _var("4g", "NGSI_SPARK_DRIVER_MEMORY", "spark", "Heap of a run's own Spark driver.")
    spark_shuffle_partitions: int | None = _var(
        None, "NGSI_SPARK_SHUFFLE_PARTITIONS", "spark", "Shuffle partitions; unset: twice the cores, at least 4."
    )
    spark_max_partition_bytes: int = _var(
        16 * 2**20,
        "NGSI_SPARK_MAX_PARTITION_BYTES",
        "spark",
        "Bytes of files one read task takes (spark.sql.files.maxPartitionBytes).",
    )
    spark_jit: str | None = _var(
        None,
        "NGSI_SPARK_JIT",
        "spark",
        "quick or full: the JVM's JIT for a run's driver. Unset: quick for small runs, full when the run's "
        "hours hold 256 MB or more of landed data.",
    )
    spark_gc: str | None = _var(
        None,
        "NGSI_SPARK_GC",
        "spark",
        "g1 or parallel: the JVM's garbage collector. Unset: g1 for run drivers, parallel for servers.",
    )
    spark_ui: str = _var("0", "NGSI_SPARK_UI", "spark", "1: start the Spark UI of a run's driver.")
    spark_dataframe_debugging: str = _var(
        "0", "NGSI_SPARK_DATAFRAME_DEBUGGING", "spark", "1: Spark Connect's DataFrame debugging (slower planning)."
    )
    spark_shared_session: str = _var(
        "1",
        "NGSI_SPARK_SHARED_SESSION",
        "spark",
        "0: every run opens its own Spark Connect session instead of sharing one.",
    )
    spark_process_free_fs: str = _var(
        "1",
        "NGSI_SPARK_PROCESS_FREE_FS",
        "spark",
        "0: local lakes use Hadoop's default file system, which forks a chmod per file.",
    )
    steps_side_by_side: int = _var(
        1,
        "NGSI_STEPS_SIDE_BY_SIDE",
        "spark",
        "Ready steps of a run that run at once, each in a thread of the run's process.",
    )
    # Versioned entities and the transaction history
    entity_schema: str | None = _var(
        None, "NGSI_ENTITY_SCHEMA", "entities", "YAML schema of the versioned entities (unset: default mappings only)."
    )
    entity_buckets: int | None = _var(
        None,
        "NGSI_ENTITY_BUCKETS",
        "entities",
        "Hash buckets per versioned entity; unset: the lake's own count, 64 for a new lake.",
    )
    history_postgres_url: str | None = _var(
        None,
        "NGSI_HISTORY_POSTGRES_URL",
        "entities",
        "PostgreSQL the transaction history is published to; unset: NGSI_POSTGRES_URL.",
    )
    history_schema: str = _var(
        "ngsi_history", "NGSI_HISTORY_SCHEMA", "entities", "Schema of the published transaction history."
    )
    # SQL sinks
    postgres_url: str | None = _var(
        None,
        "NGSI_POSTGRES_URL",
        "sql",
        "PostgreSQL sink with every parameter at its default (without NGSI_SQL_SINKS_CONFIG).",
    )
    mysql_url: str | None = _var(
        None,
        "NGSI_MYSQL_URL",
        "sql",
        "MySQL/MariaDB sink with every parameter at its default (without NGSI_SQL_SINKS_CONFIG).",
    )
    sql_sinks_config: str | None = _var(
        None,
        "NGSI_SQL_SINKS_CONFIG",
        "sql",
        "YAML (or JSON) file with postgresql: and mysql: sections of the parameters below.",
    )
    last_data_compact_after: int = _var(
        16,
        "NGSI_LAST_DATA_COMPACT_AFTER",
        "sql",
        "Deltas a last-data state folder holds before a run folds them into its base.",
    )
    last_data_compact_cron: str = _var(
        "*/5 * * * *", "NGSI_LAST_DATA_COMPACT_CRON", "sql", "Schedule of the last-data state compaction."
    )
    # MongoDB
    mongo_url: str | None = _var(
        None,
        "NGSI_MONGO_URL",
        "mongo",
        "MongoDB the STH aggregates (and the raw history, when enabled) are written to and the STH API reads.",
    )
    mongo_raw_enabled: bool = _var(
        False, "NGSI_MONGO_RAW_ENABLED", "mongo", "true: write the raw history (Cygnus NGSIMongoSink's collections)."
    )
    sth_api_max_page_size: int = _var(
        100, "NGSI_STH_API_MAX_PAGE_SIZE", "mongo", "Largest hLimit of the STH API (STH-Comet's DEFAULT_MAX_PAGE_SIZE)."
    )
    sth_api_filter_out_empty: bool = _var(
        True,
        "NGSI_STH_API_FILTER_OUT_EMPTY",
        "mongo",
        "Drop empty points from aggregated answers (STH-Comet's FILTER_OUT_EMPTY).",
    )
    # Tests
    test_workers: int = _var(
        2, "NGSI_TEST_WORKERS", "tests", "Processes make test runs the suite in (0: pytest's own)."
    )
