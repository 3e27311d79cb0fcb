"""Filters and bounded samples whose generated code does not change with the run's values.

Spark compiles the Java of each whole-stage-codegen stage and caches the class by its source text
(``spark.sql.codegen.cache.maxEntries``). Two things write run-specific text into that source:

- an integer or long literal is inlined: ``bucket IN (18, 31, 35)`` becomes ``value == 18 || ...``
  (and, over a cached frame, ``18 <= upper && ...`` for the batch statistics), so the next run's
  buckets are a new class. String, array and map literals are passed by reference and are not;
- a ``limit`` inside a plan (not at its top) names its row counter from a counter global to the
  server (``_limit_counter_21``), so every query holding one is a new class, whatever its values.

A new class costs its Janino compilation, then runs interpreted until the JIT catches up. Measured on
a warm Spark Connect server (BENCHMARKS.md, "Findings behind the defaults"): a settled derived run of
continuous mode compiled 17 to 28 classes, 1.6 to 2.9 s of compilation.
"""

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F


def one_of(column: Column | str, values: Iterable[int]) -> Column:
    """``column IN values`` for integer values, with the values out of the generated code (an array
    literal is passed by reference; ``isin`` of integers is inlined, see the module). Not for a
    filter that must prune partitions or files: only ``isin`` does. False for no values."""
    wanted = sorted({int(v) for v in values})
    if not wanted:
        return F.lit(False)
    col = F.col(column) if isinstance(column, str) else column
    return F.array_contains(F.lit(wanted), col)


def first_rows(df: DataFrame, n: int, *order: Column | str) -> DataFrame:
    """The first ``n`` rows of ``df`` in ``order`` (examples for a check, a bounded sample): a top-n
    that each partition keeps as it goes (``TakeOrderedAndProject``), not a ``limit``, whose counter
    makes a new class of every query (see the module). The order makes the rows the same every run."""
    if n < 0:
        raise ValueError(f"first_rows needs n >= 0, not {n}")
    if not order:
        raise ValueError("first_rows needs an order (a limit without one is the case it avoids)")
    return df.orderBy(*order).limit(n)


def most_frequent(df: DataFrame, column: str, n: int) -> DataFrame:
    """The ``n`` most frequent values of ``column`` with their ``count`` (ties by value), as ``first_rows``."""
    return first_rows(df.groupBy(column).count(), n, F.desc("count"), column)
