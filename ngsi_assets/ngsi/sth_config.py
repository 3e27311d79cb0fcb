"""Configuration of the STH aggregates (Cygnus NGSISTHSink parameter names), validated with pydantic.

A Cygnus user carries ``resolutions``, ``db_prefix``, ``collection_prefix``, ``data_model``,
``enable_encoding``, ``data_expiration``, ``ignore_white_spaces`` and the batch settings over
unchanged. Errors name the offending field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Resolution(StrEnum):
    """An STH resolution; its document covers one ``range`` (see ``RANGES``)."""

    MONTH = "month"
    DAY = "day"
    HOUR = "hour"
    MINUTE = "minute"
    SECOND = "second"


class DataModel(StrEnum):
    BY_SERVICE_PATH = "dm-by-service-path"
    BY_ENTITY = "dm-by-entity"
    BY_ATTRIBUTE = "dm-by-attribute"


ALL_RESOLUTIONS: tuple[Resolution, ...] = (
    Resolution.MONTH,
    Resolution.DAY,
    Resolution.HOUR,
    Resolution.MINUTE,
    Resolution.SECOND,
)

# Environment variables read by ``STHConfig.from_env`` (one per parameter, upper-cased).
ENV_PREFIX = "NGSI_STH_"


class MongoSinkParameters(BaseModel):
    """What Cygnus's two MongoDB sinks share: prefix rules, the retry intervals, the environment.

    Subclasses declare their fields and ``env_prefix``; ``from_env`` reads ``<env_prefix><FIELD>``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    env_prefix: ClassVar[str]

    max_namespace_bytes: int | None = Field(
        default=None,
        ge=1,
        le=255,
        description="Longest database.collection name in UTF-8 bytes; unset: the server's (255 from MongoDB 4.4, "
        "113 before). 113 keeps every collection readable by an STH-Comet that enforces the old limit.",
    )

    @field_validator("batch_retry_intervals", mode="before", check_fields=False)
    @classmethod
    def _split_intervals(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, int):
            value = [value]
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("at least one interval is needed")
            ints = [int(v) for v in value]
            if any(v < 0 for v in ints):
                raise ValueError("intervals must be >= 0 milliseconds")
            return tuple(ints)
        return value

    @field_validator("collection_prefix", check_fields=False)
    @classmethod
    def _not_system(cls, value: str) -> str:
        if value.startswith("system."):
            raise ValueError("'system.' is reserved by MongoDB and cannot start a collection name")
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value

    @field_validator("db_prefix", check_fields=False)
    @classmethod
    def _db_prefix(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value

    def retry_interval_ms(self, attempt: int) -> int:
        """The wait before retry number ``attempt`` (1-based); the last interval repeats."""
        intervals: tuple[int, ...] = getattr(self, "batch_retry_intervals")  # noqa: B009
        return intervals[min(attempt, len(intervals)) - 1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read ``<env_prefix><PARAMETER>`` variables (e.g. ``NGSI_STH_RESOLUTIONS=hour,day``)."""
        return cls.model_validate(cls.env_values(environ))

    @classmethod
    def env_values(cls, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The parameters set in the environment, as text (``<env_prefix><PARAMETER>``)."""
        env = os.environ if environ is None else environ
        return {
            name: env[cls.env_prefix + name.upper()]
            for name in cls.model_fields
            if cls.env_prefix + name.upper() in env
        }


class STHConfig(MongoSinkParameters):
    """The NGSISTHSink parameters this platform honours (defaults are Cygnus's, but ``batch_size``)."""

    env_prefix: ClassVar[str] = ENV_PREFIX

    resolutions: tuple[Resolution, ...] = Field(
        default=ALL_RESOLUTIONS,
        description="Resolutions to aggregate: any of month, day, hour, minute, second (comma-separated text "
        "or a list).",
    )
    db_prefix: str = Field(default="sth_", description="Prepended to the service to name the database.")
    collection_prefix: str = Field(default="sth_", description="Prepended to every collection name.")
    data_model: DataModel = Field(
        default=DataModel.BY_ENTITY,
        description="dm-by-service-path, dm-by-entity or dm-by-attribute: one collection per service path, per "
        "entity or per attribute.",
    )
    enable_encoding: bool = Field(default=False, description="true: the new (x-hex) encoding; false: the old one.")
    data_expiration: int = Field(
        default=0, ge=0, description="Seconds; documents whose _id.origin is older are removed. 0: never."
    )
    ignore_white_spaces: bool = Field(default=True, description="Drop values made only of white space.")
    batch_size: int = Field(default=500, ge=1, le=100_000, description="Documents per MongoDB bulk write.")
    batch_timeout: int = Field(
        default=30, ge=0, description="Accepted for compatibility; runs are batch jobs, nothing waits."
    )
    batch_ttl: int = Field(default=10, ge=-1, description="Retries of a failed bulk write; -1: retry forever.")
    batch_retry_intervals: tuple[int, ...] = Field(
        default=(5000,), description="Milliseconds between retries; the last one repeats."
    )

    @field_validator("resolutions", mode="before")
    @classmethod
    def _split_resolutions(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            names = [str(v).strip() for v in value]
            unknown = [n for n in names if n not in {r.value for r in Resolution}]
            if unknown:
                raise ValueError(
                    f"unknown resolution(s) {unknown}; accepted values are month, day, hour, minute and second"
                )
            if not names:
                raise ValueError("at least one resolution is needed")
            # One canonical order, whatever order the user wrote: configurations that mean the same
            # compare equal.
            return tuple(r for r in ALL_RESOLUTIONS if r.value in names)
        return value
