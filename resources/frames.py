"""Frames with no rows that Spark's optimizer knows are empty.

``spark.createDataFrame([], schema)`` in a classic session is a scan of an (empty) RDD: the optimizer
cannot see it has no rows, so a union with it keeps a branch, and a join with it keeps both sides'
shuffles and a sort-merge join, each a stage (and a Spark job under adaptive execution) of its own.
``limit(0)`` turns it into an empty local relation (``OptimizeLimitZero``), which
``PropagateEmptyRelation`` then removes: a union drops the branch, a semi join becomes empty, an
anti join becomes its left side. Through Spark Connect the frame already is a local relation.
"""

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType


def empty_frame(spark: SparkSession, schema: StructType | str) -> DataFrame:
    """A frame of ``schema`` with no rows, which plans that use it are optimized without."""
    return spark.createDataFrame([], schema).limit(0)
