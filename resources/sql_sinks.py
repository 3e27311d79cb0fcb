"""The SQL sinks resource: which PostgreSQL / MySQL sinks are configured, with Cygnus's parameters.

Configured from ``NGSI_SQL_SINKS_CONFIG`` (a YAML or JSON file with ``postgresql:`` and ``mysql:``
sections) or ``NGSI_POSTGRES_URL`` / ``NGSI_MYSQL_URL``; a sink with no URL is off and its assets
skip with metadata saying so. The parameters are validated (pydantic) when the resource is used, and
an error names the offending field.
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field

from ngsi_assets.ngsi.sql_config import SqlSinkConfig, load_sink_configs
from ngsi_assets.ngsi.sql_naming import Dialect
from resources.sql import MySQLResource, PostgresResource


class SqlSinksResource(ConfigurableResource):
    """The configured SQL sinks; ``sinks`` given explicitly win over the environment."""

    model_config = ConfigDict(hide_input_in_errors=True)

    sinks: dict[str, dict[str, Any]] | None = Field(
        default=None,
        repr=False,
        description="Per dialect (postgresql, mysql): url and Cygnus parameters. None reads the environment.",
    )

    def configs(self) -> dict[Dialect, SqlSinkConfig]:
        """The sinks that have a URL, validated."""
        if self.sinks is None:
            return load_sink_configs()
        out: dict[Dialect, SqlSinkConfig] = {}
        for name, section in self.sinks.items():
            cfg = SqlSinkConfig(dialect=Dialect(name), **{k: v for k, v in section.items() if k != "dialect"})
            if cfg.url:
                out[cfg.dialect] = cfg
        return out

    @staticmethod
    def connect_kwargs(cfg: SqlSinkConfig) -> dict[str, Any]:
        """Plain driver keyword arguments (shipped to the Spark executors)."""
        if cfg.dialect is Dialect.POSTGRESQL:
            return PostgresResource(url=cfg.url).connect_kwargs()
        return MySQLResource(url=cfg.url).connect_kwargs()
