"""Settings of the versioned entities: the schema file and the number of storage buckets."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from ngsi_assets.ngsi.entity_schema import EntitySchema, load_schema


class VersioningResource(ConfigurableResource):
    """Where the entity schema is (none: default mappings only) and how the history is bucketed."""

    schema_path: str | None = Field(
        default=None, description="YAML file of target entities and source-system mappings (NGSI_ENTITY_SCHEMA)."
    )
    buckets: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Hash buckets per entity (NGSI_ENTITY_BUCKETS). A run rewrites only the buckets its keys "
        "fall in. Changing it needs a full rebuild of the versioned entities.",
    )

    def load_schema(self) -> EntitySchema:
        return load_schema(self.schema_path)
