"""The STH sink resource: the NGSISTHSink parameters and, optionally, the MongoDB to publish to.

With no ``mongo_url`` the ``sth_aggregates`` asset still computes its lake datasets and says in its
metadata that publishing was skipped (``make demo`` runs with no servers).

Environment (``from_env``): ``NGSI_MONGO_URL`` and one ``NGSI_STH_<PARAMETER>`` per Cygnus parameter,
e.g. ``NGSI_STH_RESOLUTIONS=month,day,hour``, ``NGSI_STH_DATA_MODEL=dm-by-service-path``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, model_validator

from ngsi_assets.ngsi.sth_config import STHConfig
from resources.mongo import check_mongo_url

MONGO_URL_ENV = "NGSI_MONGO_URL"


class STHSinkResource(ConfigurableResource):
    """NGSISTHSink configuration (Cygnus names) plus the MongoDB URL; None publishes nothing."""

    model_config = ConfigDict(hide_input_in_errors=True)

    mongo_url: str | None = Field(default=None, repr=False, description="mongodb:// URL; unset: no publishing.")
    resolutions: str = "month,day,hour,minute,second"
    db_prefix: str = "sth_"
    collection_prefix: str = "sth_"
    data_model: str = "dm-by-entity"
    enable_encoding: bool = False
    data_expiration: int = 0
    ignore_white_spaces: bool = True
    max_namespace_bytes: int | None = None
    batch_size: int = 500
    batch_timeout: int = 30
    batch_ttl: int = 10
    batch_retry_intervals: str = "5000"

    @model_validator(mode="after")
    def _validate(self) -> STHSinkResource:
        if isinstance(self.mongo_url, str):
            check_mongo_url(self.mongo_url)
        self.sth_config()  # fail at load time, naming the offending parameter
        return self

    def sth_config(self) -> STHConfig:
        return STHConfig.model_validate(
            {name: getattr(self, name) for name in STHConfig.model_fields if name in type(self).model_fields}
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> STHSinkResource:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        url = env.get(MONGO_URL_ENV)
        if url:
            values["mongo_url"] = url
        values.update(STHConfig.env_values(env))
        return cls(**values)
