"""Where the platform keeps its data: the one place that reads the environment for it."""

from __future__ import annotations

import os
from pathlib import Path


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
