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
