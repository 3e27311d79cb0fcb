"""The landing zone as a Dagster resource: what the receiver has made durable, read by Spark."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.ingest.landing import SegmentInfo, list_segments


class LandingZoneResource(ConfigurableResource):
    """The folder of JSON-lines segments the receiver and the file loader append to."""

    root: str = Field(description="Landing folder (the receiver's --landing-root).")

    def segments(self, partition_keys: Sequence[str] | None = None) -> list[SegmentInfo]:
        """Segments of the given hours (all hours when None), in hour then creation order."""
        found = list_segments(Path(self.root).resolve())  # absolute: Spark may run in another folder
        if partition_keys is None:
            return found
        wanted = set(partition_keys)
        return [s for s in found if s.partition_key in wanted]

    def read_lines(self, spark: SparkSession, partition_keys: Sequence[str]) -> DataFrame:
        """The lines of the given hours as a one-column (``value``) DataFrame."""
        paths = [str(s.path) for s in self.segments(partition_keys)]
        if not paths:
            return spark.createDataFrame([], "value string")
        return spark.read.text(paths)

    def torn_tails(self, partition_keys: Sequence[str]) -> int:
        """How many segments of these hours end in a partial line (a crash mid-write).

        Reads one byte per segment, so it costs what the file count costs, not the data size.
        """
        torn = 0
        for seg in self.segments(partition_keys):
            if seg.size == 0:
                continue
            with open(seg.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    torn += 1
        return torn
