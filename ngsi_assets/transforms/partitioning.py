"""Rows of one key in one partition, guaranteed: for per-partition code that must see a key whole.

``df.repartition("guid")`` does not guarantee it. When the input is already hash-partitioned by the same
columns (the output of a join or an aggregation on them), Spark's ``EnsureRequirements`` drops the
repartition as redundant. Adaptive execution may then turn that join into a broadcast join whose
probe side is read locally (``AQEShuffleRead local``): the rows of one key end up in several
partitions. Nothing downstream states that it needs them together (``sortWithinPartitions`` and
``mapInArrow`` have no distribution requirement), so no shuffle is added back. Whether adaptive
execution converts the join depends on which stage finishes first.

The fold of the versioned entities hit this about once in 15 runs of one test. A key's refresh delete
and its upsert were folded in different partitions, and a child the refresh had deleted stayed live.

``cluster_by`` partitions by a hash of the columns salted with a constant. No join or aggregation
is keyed on that expression, so the exchange is never judged redundant. An exchange the user asked
for is never read locally or split for skew, only coalesced, and coalescing keeps keys together.
"""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

_SALT = "ngsi-cluster-by"


def cluster_by(df: DataFrame, *columns: str, partitions: int | None = None) -> DataFrame:
    """``df`` with all rows of equal ``columns`` in one partition (``partitions`` of them, default the
    session's shuffle partitions, which adaptive execution may coalesce)."""
    if not columns:
        raise ValueError("cluster_by needs at least one column")
    key = F.xxhash64(F.lit(_SALT), *[F.col(c) for c in columns])
    return df.repartition(partitions, key) if partitions else df.repartition(key)
