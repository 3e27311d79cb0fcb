"""The configuration reference, generated from the settings models so that it cannot drift.

Every ``NGSI_*`` variable and every sink parameter comes from a pydantic model's fields: its name
(the alias, or the sink's prefix + the parameter upper-cased), its default and its description. The
documentation site renders ``reference_markdown()`` as its configuration reference page
(``docs/hooks.py``); ``python -m ngsi_assets.config_reference`` prints it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ngsi_assets.freshness import FreshnessSettings
from ngsi_assets.ngsi.mongo_raw_config import ENV_PREFIX as RAW_PREFIX
from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sql_config import PersistencePolicy, SqlSinkConfig
from ngsi_assets.ngsi.sth_config import ENV_PREFIX as STH_PREFIX
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sensors import ContinuousSettings, ReprocessSettings
from ngsi_assets.settings import EnvironmentVariables

# The sections of EnvironmentVariables, in the order the reference shows them.
GROUPS = {
    "storage": "Where data lives",
    "servers": "Servers that `make dev` starts",
    "spark": "Spark",
    "entities": "Versioned entities and the transaction history",
    "sql": "SQL sinks",
    "mongo": "MongoDB: STH aggregates, raw history, STH API",
}


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        value = str(value).lower()
    if isinstance(value, list | tuple):
        value = ",".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value)
    return f"`{value}`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _table(rows: Iterator[tuple[str, FieldInfo]], first: str) -> list[str]:
    lines = [f"| {first} | default | what it does |", "|---|---|---|"]
    lines += [f"| `{name}` | {_cell(_default(f))} | {_cell(f.description)} |" for name, f in rows]
    return lines + [""]


def _aliased(model: type[BaseModel], group: str | None = None) -> Iterator[tuple[str, FieldInfo]]:
    for field in model.model_fields.values():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if group is None or extra.get("group") == group:
            assert field.alias is not None
            yield field.alias, field


def _prefixed(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        yield prefix + name.upper(), field


def _parameters(model: type[BaseModel], skip: tuple[str, ...] = ()) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        if name not in skip:
            yield name, field


def variables() -> list[str]:
    """Every environment variable the reference documents."""
    names = [
        alias
        for m in (EnvironmentVariables, ContinuousSettings, FreshnessSettings, ReprocessSettings)
        for alias, _ in _aliased(m)
    ]
    names += [n for n, _ in _prefixed(STHConfig, STH_PREFIX)]
    names += [n for n, _ in _prefixed(MongoRawConfig, RAW_PREFIX)]
    return names


def reference_markdown() -> str:
    """The configuration reference page, in Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the platform's settings models: every variable and parameter the code reads,",
        "with its default. Unset variables take the default shown.",
        "",
        "## Environment variables",
        "",
    ]
    for group, title in GROUPS.items():
        out += [f"### {title}", "", *_table(_aliased(EnvironmentVariables, group), "variable")]
        if group == "mongo":
            out += [
                "#### STH aggregates (Cygnus NGSISTHSink parameters)",
                "",
                f"Each parameter of Cygnus's STH sink is a variable `{STH_PREFIX}<PARAMETER>`.",
                "",
                *_table(_prefixed(STHConfig, STH_PREFIX), "variable"),
                "#### Raw history (Cygnus NGSIMongoSink parameters)",
                "",
                f"Each parameter of Cygnus's MongoDB sink is a variable `{RAW_PREFIX}<PARAMETER>`.",
                "",
                *_table(_prefixed(MongoRawConfig, RAW_PREFIX), "variable"),
            ]
    out += [
        "### Continuous mode",
        "",
        *_table(_aliased(ContinuousSettings), "variable"),
        "### Freshness checks",
        "",
        *_table(_aliased(FreshnessSettings), "variable"),
        "### Reprocessing",
        "",
        *_table(_aliased(ReprocessSettings), "variable"),
        "### Tests",
        "",
        *_table(_aliased(EnvironmentVariables, "tests"), "variable"),
        "## SQL sink parameters",
        "",
        "The sections `postgresql:` and `mysql:` of the file named by `NGSI_SQL_SINKS_CONFIG` take these",
        "parameters, with Cygnus's names (see [SQL sinks](../features/sql-sinks.md)).",
        "",
        *_table(_parameters(SqlSinkConfig, skip=("dialect",)), "parameter"),
        *_table(((f"persistence_policy.{n}", f) for n, f in _parameters(PersistencePolicy)), "parameter"),
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(reference_markdown())
