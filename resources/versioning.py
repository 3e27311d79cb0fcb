"""Settings of the versioned entities: the schema file and the number of storage buckets."""

from __future__ import annotations

import json

from dagster import ConfigurableResource
from pydantic import Field

from ngsi_assets.ngsi.entity_schema import EntitySchema, load_schema
from resources.lake import LakeResource

VERSIONS_DS = "versioned_entities"
# Hash buckets per entity of a new lake when NGSI_ENTITY_BUCKETS is not set.
DEFAULT_BUCKETS = 64
# The bucket count the lake's entity tables were written with, written by their first fold.
BUCKETS_FILE = "_buckets.json"


def stored_bucket_count(lake: LakeResource) -> int | None:
    """The bucket count the lake's versioned entities were written with, or None before their first fold
    (and in a lake written before the count was kept). ValueError naming the file if it is unreadable."""
    text = lake.read_dataset_file(VERSIONS_DS, BUCKETS_FILE)
    if text is None:
        return None
    try:
        return int(json.loads(text)["buckets"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{VERSIONS_DS}/{BUCKETS_FILE} does not hold a bucket count ({text[:80]!r}): it should be "
            '{"buckets": N}, N the count the entity tables were written with'
        ) from exc


class VersioningResource(ConfigurableResource):
    """Where the entity schema is (none: default mappings only) and how the history is bucketed."""

    schema_path: str | None = Field(
        default=None, description="YAML file of target entities and source-system mappings (NGSI_ENTITY_SCHEMA)."
    )
    buckets: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Hash buckets per entity (NGSI_ENTITY_BUCKETS). A run rewrites only the buckets its keys "
        "fall in. Unset: the count the lake's entity tables were written with, and 64 for a new "
        "lake. Changing it needs a full rebuild of the versioned entities.",
    )

    def bucket_count(self, lake: LakeResource) -> int:
        """The count to fold with: the one set, else the one the lake's tables were written with, else
        ``DEFAULT_BUCKETS``. A set count the tables were not written with is refused by the fold
        (``check_bucket_count``), not here."""
        if self.buckets is not None:
            return self.buckets
        stored = stored_bucket_count(lake)
        return stored if stored is not None else DEFAULT_BUCKETS

    def load_schema(self) -> EntitySchema:
        return load_schema(self.schema_path)
