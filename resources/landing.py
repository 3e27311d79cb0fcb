"""The landing zone as a Dagster resource: what the receiver has made durable, read by Spark."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.ingest.landing import SegmentInfo, complete_prefix, list_segments
from resources.frames import empty_frame
from resources.landing_source import RANGE_SOURCE, LandingRangeSource, piece_bytes

# Ranges of landing segments: {"dt=YYYY-MM-DD-HH/<segment>.jsonl": [start, end], ...}, byte offsets.
Ranges = Mapping[str, Sequence[int]]


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

    def complete_ranges(
        self, segments: Sequence[str] | Sequence[SegmentInfo] | None, positions: Mapping[str, int] | None = None
    ) -> dict[str, list[int]]:
        """Per segment: [from, to) with ``to`` just past its last complete line.

        ``segments``: hourly partition keys (their segments), listed segments, or None (every
        segment). ``from`` is the segment's offset in ``positions`` (0 when absent); segments with
        nothing new are left out. A segment's name is relative to the root (``dt=.../<name>.jsonl``).
        """
        positions = positions or {}
        out: dict[str, list[int]] = {}
        listed = (
            list(segments) if segments and isinstance(segments[0], SegmentInfo) else self.segments(segments)  # type: ignore[arg-type]
        )
        for seg in listed:
            name = f"{seg.hour_dir}/{seg.path.name}"
            start = int(positions.get(name, 0))
            if seg.size <= start:
                continue
            end = complete_prefix(seg.path, start, seg.size)
            if end > start:
                out[name] = [start, end]
        return out

    def read_ranges(self, spark: SparkSession, ranges: Ranges | Sequence[tuple[str, int, int]]) -> DataFrame:
        """The complete lines of segment byte ranges as a one-column (``value``) DataFrame.

        ``ranges``: {segment name: [start, end]} or (segment name, start, end) triples.
        """
        triples = [(n, r[0], r[1]) for n, r in ranges.items()] if isinstance(ranges, Mapping) else list(ranges)
        root = Path(self.root).resolve()
        spec = [[str(root / name), int(start), int(end)] for name, start, end in sorted(triples) if end > start]
        if not spec:
            return empty_frame(spark, "value string")
        spark.dataSource.register(LandingRangeSource)
        # As many pieces as the session's shuffles have partitions (twice the cores by default).
        tasks = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
        return (
            spark.read.format(RANGE_SOURCE)
            .option("ranges", json.dumps(spec))
            .option("piece_bytes", str(piece_bytes(spec, tasks)))
            .load()
        )

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
