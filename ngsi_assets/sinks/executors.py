"""Writers that run on the executors, partition by partition, through the DataFrame API only.

The sinks (SQL tables, MongoDB documents, the history publication) write from the executors so no data
reaches the driver. ``RDD.mapPartitions`` did that in a local session only: an RDD does not exist
through Spark Connect. ``mapInArrow`` does the same everywhere (local, a cluster, Spark Connect), and
Spark's own Arrow-to-Row conversion (the one ``collect`` uses) gives the writer the same Row values in
every mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql.types import StringType, StructField, StructType

_RESULT = StructType([StructField("result", StringType(), nullable=False)])


def on_each_partition(df: DataFrame, write: Callable[[Iterator[Row]], Iterable[Any]]) -> list[Any]:
    """Call ``write`` on the rows of every partition of ``df`` on the executors; return what it yields.

    ``write`` runs in an executor's Python worker: everything it needs (URLs, configuration) must be in
    its closure, never a driver global. It gets the partition's rows in order, as pyspark Rows, and
    yields small JSON-serializable results (a stats dict per table, say): those, and only those, come
    back to the driver, so their number must follow the partitions and tables, never the rows.
    """
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    schema = df.schema

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def rows() -> Iterator[Row]:
            for batch in batches:
                yield from ArrowTableToRowsConversion.convert(pa.Table.from_batches([batch]), schema)

        results = [json.dumps(r, default=str) for r in write(rows())]
        if results:
            yield pa.RecordBatch.from_arrays([pa.array(results, pa.string())], names=["result"])

    return [json.loads(r["result"]) for r in df.mapInArrow(body, _RESULT).collect()]
