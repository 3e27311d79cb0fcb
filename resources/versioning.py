"""Settings of the versioned entities: the schema file and the number of storage buckets."""

from __future__ import annotations

import json

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql.types import StructField, StructType

from ngsi_assets.ngsi.entity_schema import EntitySchema, load_schema
from resources.lake import LakeResource

VERSIONS_DS = "versioned_entities"
# Hash buckets per entity of a new lake when NGSI_ENTITY_BUCKETS is not set.
DEFAULT_BUCKETS = 64
# The bucket count the lake's entity tables were written with, written by their first fold.
BUCKETS_FILE = "_buckets.json"
# An entity table's columns (``versioned_entities/<entity>/_schema.json``): every column any of its files
# has, kept by the fold before it writes a file. Readers that do not know the entity's fields (the
# transaction history) read with it instead of merging the files' Parquet schemas, which is a Spark job
# reading every file's footer.
SCHEMA_FILE = "_schema.json"


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


def stored_table_schema(lake: LakeResource, folder: str) -> StructType | None:
    """The columns of the entity table in ``folder`` (``store_table_schema``), or None when they were
    never kept (a lake written before they were, or no table yet): then read the files' own schemas.
    ValueError naming the file if it is unreadable."""
    text = lake.read_dataset_file(VERSIONS_DS, SCHEMA_FILE, subfolder=folder)
    if text is None:
        return None
    try:
        return StructType.fromJson(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{VERSIONS_DS}/{folder}/{SCHEMA_FILE} does not hold a table schema ({text[:80]!r}); delete it: "
            "the table is then read by merging its files' schemas until the entity's next fold writes it again"
        ) from exc


def store_table_schema(lake: LakeResource, folder: str, schema: StructType) -> StructType:
    """Keep ``schema`` as the columns of the entity table in ``folder``, with every column kept before
    that it lacks (as nullable, after its own): files written before still have them, as a merge of the
    files' schemas would find. Call it before writing files of that schema; returns what was kept. A
    column's type is the newest one's."""
    stored = stored_table_schema(lake, folder)
    names = set(schema.fieldNames())
    kept = StructType(
        [
            *schema.fields,
            *[StructField(f.name, f.dataType, True) for f in (stored.fields if stored else []) if f.name not in names],
        ]
    )
    if stored is None or kept.json() != stored.json():
        lake.write_dataset_file(VERSIONS_DS, SCHEMA_FILE, kept.json(), subfolder=folder)
    return kept


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
