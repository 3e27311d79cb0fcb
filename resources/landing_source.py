"""The Spark data source that reads byte ranges of landing segments.

Kept apart from ``resources.landing`` on purpose: Spark unpickles the source by reference in fresh
Python processes (the planner on the driver, then the executors' workers), and a module importing
dagster costs about 0.7 s there each time. Measured through Spark Connect on a 100-line segment: a
read and count took 3.7 s with the source in ``resources.landing``, 0.27 s from this module. Import
nothing here beyond the standard library, pyspark's datasource API and ``ngsi_assets.ingest.landing``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ngsi_assets.ingest.landing import iter_range_lines

# A landing range is read in pieces of at most this many bytes (one Spark task each), and of at least
# ``MIN_PIECE_BYTES`` when a read is split to keep every core busy (``piece_bytes``).
RANGE_PIECE_BYTES = 32 * 1024 * 1024
MIN_PIECE_BYTES = 1024 * 1024
RANGE_SOURCE = "ngsi_landing_ranges"


class LandingRangeSource(DataSource):
    """Spark data source reading byte ranges of landing segments as lines (one ``value`` column).

    Option ``ranges``: JSON ``[[path, start, end], ...]`` with ``end`` at a line boundary. Each range
    is read in pieces of ``piece_bytes`` (option; default ``RANGE_PIECE_BYTES``) on the executors,
    which must see the landing folder under the same path (as with ``spark.read.text``).
    """

    @classmethod
    def name(cls) -> str:
        return RANGE_SOURCE

    def schema(self) -> str:
        return "value string"

    def reader(self, schema: object) -> DataSourceReader:
        piece = int(self.options.get("piece_bytes", RANGE_PIECE_BYTES))
        return _LandingRangeReader(json.loads(self.options["ranges"]), piece)


def piece_bytes(ranges: list[list], tasks: int) -> int:
    """The piece size that reads ``ranges`` in about ``tasks`` tasks (the cores to keep busy), within
    [``MIN_PIECE_BYTES``, ``RANGE_PIECE_BYTES``]: a read of one 80 MB hour is four tasks of 20 MB on a
    2-core machine rather than 32 + 32 + 16 MB, whose last task runs alone; a 16 MB one four of 4 MB
    rather than one task on one core. Every task downstream follows: the message store is written a
    file per piece, and the events from each file."""
    total = sum(max(0, int(end) - int(start)) for _, start, end in ranges)
    wanted = -(-total // max(1, tasks))
    return max(MIN_PIECE_BYTES, min(RANGE_PIECE_BYTES, wanted))


class _LandingRangeReader(DataSourceReader):
    def __init__(self, ranges: list[list], piece: int = RANGE_PIECE_BYTES) -> None:
        if piece <= 0:
            raise ValueError(f"piece_bytes must be positive, got {piece}")
        self.ranges = ranges
        self.piece = piece

    def partitions(self) -> list[InputPartition]:
        pieces = []
        for path, start, end in self.ranges:
            for first in range(start, end, self.piece):
                pieces.append(InputPartition((path, start, end, first, min(end, first + self.piece))))
        return pieces or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        if partition.value is None:
            return
        path, start, end, first, last = partition.value
        for line in iter_range_lines(path, start, end, first, last):
            yield (line.decode("utf-8", errors="replace"),)
