"""``one_of`` and ``first_rows`` give the rows ``isin`` and an ordered ``limit`` give, with generated code
that does not change with the run's values: the next run reuses the compiled classes."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterator

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.transforms.plans import first_rows, most_frequent, one_of
from tests.support.spark import session_settings

pytestmark = pytest.mark.spark

# Static planning: ``explain("codegen")`` shows the generated code only of a plan planned up front.
_PLANNING = {"spark.sql.adaptive.enabled": "false"}


@pytest.fixture
def static_planning(spark: SparkSession) -> Iterator[SparkSession]:
    with session_settings(spark, _PLANNING) as session:
        yield session


def _frame(spark: SparkSession) -> DataFrame:
    rows = [(1, "a"), (5, "b"), (-3, "c"), (None, "d"), (64, "e"), (5, "f")]
    return spark.createDataFrame(rows, "bucket int, name string")


def _generated_code(df: DataFrame) -> str:
    """The Java of every whole-stage-codegen stage of ``df``, without its comments (which hold the plan,
    with its expression ids): the text Spark's class cache is keyed by."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain("codegen")
    lines = [re.sub(r"/\*.*?\*/", "", ln) for ln in out.getvalue().splitlines() if re.match(r"^/\* \d+ \*/", ln)]
    assert lines, "no generated code found in the plan"
    return "\n".join(lines)


def _same_code(build: Callable[[list[int]], DataFrame]) -> bool:
    return _generated_code(build([1, 5, 9])) == _generated_code(build([2, 64, 7]))


@pytest.mark.parametrize("values", [[5], [1, 5, 64], [-3, 2, 99], list(range(0, 40, 3)), []])
def test_one_of_keeps_the_rows_isin_keeps(spark: SparkSession, values: list[int]) -> None:
    df = _frame(spark)
    got = sorted(r["name"] for r in df.where(one_of("bucket", values)).collect())
    expected = sorted(r["name"] for r in df.where(F.col("bucket").isin(values)).collect()) if values else []
    assert got == expected


def test_one_of_takes_a_column_and_any_iterable(spark: SparkSession) -> None:
    df = _frame(spark)
    got = sorted(r["name"] for r in df.where(one_of(F.col("bucket") + 1, (v for v in (2, 65)))).collect())
    assert got == ["a", "e"]


def test_one_of_compiles_one_class_for_any_values(static_planning: SparkSession) -> None:
    df = _frame(static_planning).groupBy("bucket").count()
    assert _same_code(lambda values: df.where(one_of("bucket", values)))
    # What it avoids: isin of integers writes them into the code.
    assert not _same_code(lambda values: df.where(F.col("bucket").isin(values)))


def test_first_rows_are_the_first_in_the_order(spark: SparkSession) -> None:
    df = _frame(spark)
    assert [r["name"] for r in first_rows(df, 3, "bucket", "name").collect()] == ["d", "c", "a"]
    assert [r["name"] for r in first_rows(df, 2, F.desc("bucket"), "name").collect()] == ["e", "b"]
    assert first_rows(df, 0, "name").collect() == []
    assert len(first_rows(df, 100, "name").collect()) == 6


def test_first_rows_needs_an_order_and_a_count(spark: SparkSession) -> None:
    df = _frame(spark)
    with pytest.raises(ValueError, match="needs an order"):
        first_rows(df, 3)
    with pytest.raises(ValueError, match="n >= 0"):
        first_rows(df, -1, "name")


def test_first_rows_inside_a_plan_compiles_one_class_for_every_query(static_planning: SparkSession) -> None:
    """Examples beside counts in one collect (``collect_small``): the same code query after query."""
    df = _frame(static_planning)
    counts = df.groupBy("bucket").count().select(F.col("bucket").cast("string").alias("x"))

    def with_examples(bound: Callable[[DataFrame], DataFrame]) -> Callable[[list[int]], DataFrame]:
        return lambda _: counts.unionByName(bound(df.select("name").withColumnRenamed("name", "x")))

    assert _same_code(with_examples(lambda d: first_rows(d, 3, "x")))
    # What it avoids: a limit inside a plan names its counter from a count global to the server.
    assert not _same_code(with_examples(lambda d: d.limit(3)))


def test_most_frequent_values_first_ties_by_value(spark: SparkSession) -> None:
    df = spark.createDataFrame([("b",), ("a",), ("c",), ("b",), ("a",), ("d",)], "reason string")
    got = [(r["reason"], r["count"]) for r in most_frequent(df, "reason", 3).collect()]
    assert got == [("a", 2), ("b", 2), ("c", 1)]
