"""The raw MongoDB sink resource (Cygnus NGSIMongoSink): off unless enabled, plus the MongoDB to write to.

Environment (``from_env``): ``NGSI_MONGO_RAW_ENABLED=true`` turns it on, ``NGSI_MONGO_URL`` is the
server (shared with the STH aggregates), and one ``NGSI_MONGO_RAW_<PARAMETER>`` per Cygnus parameter,
e.g. ``NGSI_MONGO_RAW_ATTR_PERSISTENCE=column``, ``NGSI_MONGO_RAW_DATA_MODEL=dm-by-service-path``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, model_validator

from ngsi_assets.ngsi.mongo_raw_config import ENV_PREFIX, MongoRawConfig
from resources.mongo import check_mongo_url
from resources.sth_mongo import MONGO_URL_ENV

ENABLED_ENV = ENV_PREFIX + "ENABLED"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class MongoRawSinkResource(ConfigurableResource):
    """NGSIMongoSink configuration (Cygnus names), whether it is on, and the MongoDB URL."""

    model_config = ConfigDict(hide_input_in_errors=True)

    enabled: bool = Field(default=False, description="Write the raw collections (needs mongo_url).")
    mongo_url: str | None = Field(default=None, repr=False, description="mongodb:// URL.")
    db_prefix: str = "sth_"
    collection_prefix: str = "sth_"
    data_model: str = "dm-by-entity"
    enable_encoding: bool = False
    attr_persistence: str = "row"
    attr_metadata_store: bool = False
    collections_size: int = 0
    max_documents: int = 0
    data_expiration: int = 0
    max_namespace_bytes: int | None = None
    batch_size: int = 1000
    batch_timeout: int = 30
    batch_ttl: int = 10
    batch_retry_intervals: str = "5000"

    @model_validator(mode="after")
    def _validate(self) -> MongoRawSinkResource:
        if isinstance(self.mongo_url, str):
            check_mongo_url(self.mongo_url)
        if self.enabled and not self.mongo_url:
            raise ValueError(f"the raw MongoDB sink is enabled but no MongoDB URL is set ({MONGO_URL_ENV})")
        self.raw_config()  # fail at load time, naming the offending parameter
        return self

    def raw_config(self) -> MongoRawConfig:
        return MongoRawConfig.model_validate(
            {name: getattr(self, name) for name in MongoRawConfig.model_fields if name in type(self).model_fields}
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MongoRawSinkResource:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        flag = env.get(ENABLED_ENV, "").strip().lower()
        if flag not in _TRUE | _FALSE:
            raise ValueError(f"{ENABLED_ENV}={env[ENABLED_ENV]!r}: expected true or false")
        values["enabled"] = flag in _TRUE
        url = env.get(MONGO_URL_ENV)
        if url:
            values["mongo_url"] = url
        values.update(MongoRawConfig.env_values(env))
        return cls(**values)
