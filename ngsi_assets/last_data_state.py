"""The merged last-data state of one SQL sink in the lake: base buckets, plus a small delta per run.

Layout, one subfolder per sink (``state_folder``: its dialect and a fingerprint of what shapes it):

- ``last_data_state/<folder>/bucket=N``: the base, each key's merged state, hashed into
  ``LAST_DATA_STATE_BUCKETS`` buckets by key;
- ``last_data_state_deltas/<folder>/delta=<id>``: what one run brought, merged per key (a file of one
  row per key the run touched). ``id`` is the increment's, or a digest of a whole run's hours, so a
  rerun replaces its own delta.

``merge_last_data_state`` is associative, commutative and idempotent: a key's state is the merge of its
base row and of every delta holding it, in any order, and a delta merged twice (rewritten by a rerun,
or folded into the base and still present) changes nothing. So a run writes its delta, then reads the
state of its keys from the base and every delta. It does not rewrite the base: before deltas, every
increment rewrote each bucket it touched (with 50 cars, 35 of 64 folders per increment and sink).

When ``compact_after`` deltas are there, the run folds them into the base buckets they touch and
removes them. Killed in between, the next run folds them again, which changes nothing.

One run per state folder at a time (an exclusive lock; on object storage, the ``last_data`` Dagster
pool at 1): a compaction removes deltas another run might be reading.
"""

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.transforms.sql_sinks import LAST_DATA_STATE, merge_last_data_state
from resources.lake import LakeResource

STATE_DATASET = "last_data_state"
DELTAS_DATASET = "last_data_state_deltas"
DELTA_COLUMN = "delta"
COMPACT_AFTER_ENV = "NGSI_LAST_DATA_COMPACT_AFTER"
COMPACT_AFTER_DEFAULT = 16
_DELTA_SCHEMA = StructType([*LAST_DATA_STATE.fields, StructField(DELTA_COLUMN, StringType())])


def compact_after() -> int:
    """How many deltas a state folder holds before a run folds them into the base
    (``NGSI_LAST_DATA_COMPACT_AFTER``)."""
    raw = os.environ.get(COMPACT_AFTER_ENV, str(COMPACT_AFTER_DEFAULT))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{COMPACT_AFTER_ENV} must be a whole number of deltas, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{COMPACT_AFTER_ENV} must be at least 1, got {value}")
    return value


def delta_id(partition_keys: Sequence[str], increment_id: str | None) -> str:
    """The delta of a run: its increment's, or for a whole run a digest of its hours."""
    if increment_id is not None:
        return f"i{increment_id}"
    return "h" + hashlib.sha256(",".join(sorted(partition_keys)).encode()).hexdigest()[:20]


def keys_of(cfg: SqlSinkConfig) -> list[str]:
    return ["database", "db", "table", *cfg.last_data_unique_key]


def only_keys(state: DataFrame, wanted: DataFrame, cfg: SqlSinkConfig) -> DataFrame:
    """The rows of ``state`` whose key is in ``wanted`` (key columns prefixed ``_k_``; keys may be null)."""
    keys = keys_of(cfg)
    return state.join(wanted, [state[k].eqNullSafe(wanted["_k_" + k]) for k in keys], "left_semi")


@dataclass(frozen=True)
class StateWrite:
    """What a run did to the state: its keys' merged state, and the numbers for the metadata."""

    state: DataFrame
    deltas: int
    compacted: int
    buckets_compacted: int


@dataclass(frozen=True)
class LastDataState:
    lake: LakeResource
    session: SparkSession
    cfg: SqlSinkConfig
    folder: str

    def lock(self):  # noqa: ANN201 - a context manager
        return self.lake.exclusive(DELTAS_DATASET, subfolder=self.folder)

    def merge_in(self, records: DataFrame, touched: Sequence[int], delta: str) -> StateWrite:
        """Write the run's records (``LAST_DATA_STATE`` rows of the ``touched`` buckets) as its delta;
        compact when due; the merged state of the run's keys. Call it under ``lock``."""
        cfg = self.cfg
        empty = StateWrite(merge_last_data_state(records.limit(0), cfg), 0, 0, 0)
        if not touched:
            return empty
        self.lake.replace_folders(
            merge_last_data_state(records, cfg).withColumn(DELTA_COLUMN, F.lit(delta)),
            DELTAS_DATASET,
            DELTA_COLUMN,
            [delta],
            subfolder=self.folder,
        )
        deltas = self.lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, self.folder)
        compacted = buckets = 0
        if len(deltas) >= compact_after():
            buckets = self.compact(deltas)
            compacted, deltas = len(deltas), []
        wanted = records.select(*[F.col(k).alias("_k_" + k) for k in keys_of(cfg)]).distinct()
        parts = [
            p
            for p in (
                self.lake.read_folders(
                    self.session, STATE_DATASET, "bucket", touched, subfolder=self.folder, schema=LAST_DATA_STATE
                ),
                self._read_deltas(deltas, touched),
            )
            if p is not None
        ]
        if not parts:  # unreachable: the run's own delta was just written
            raise RuntimeError(f"last-data state {self.folder}: neither base nor deltas after writing {delta}")
        state = only_keys(reduce(DataFrame.unionByName, parts), wanted, cfg)
        return StateWrite(merge_last_data_state(state, cfg), len(deltas), compacted, buckets)

    def _read_deltas(self, deltas: Sequence[str], buckets: Sequence[int] | None = None) -> DataFrame | None:
        df = self.lake.read_folders(
            self.session, DELTAS_DATASET, DELTA_COLUMN, deltas, subfolder=self.folder, schema=_DELTA_SCHEMA
        )
        if df is None:
            return None
        if buckets is not None:
            df = df.where(F.col("bucket").isin(list(buckets)))
        return df.select(*LAST_DATA_STATE.fieldNames())

    def compact(self, deltas: Sequence[str]) -> int:
        """Fold ``deltas`` into the base buckets they touch, then remove them; the number of buckets."""
        rows = self._read_deltas(deltas)
        if rows is None:
            return 0
        buckets = sorted(int(r["bucket"]) for r in rows.select("bucket").distinct().collect())
        base = self.lake.read_folders(
            self.session, STATE_DATASET, "bucket", buckets, subfolder=self.folder, schema=LAST_DATA_STATE
        )
        merged = merge_last_data_state(rows if base is None else base.unionByName(rows), self.cfg)
        self.lake.replace_folders(merged, STATE_DATASET, "bucket", buckets, subfolder=self.folder)
        self.lake.remove_folders(DELTAS_DATASET, DELTA_COLUMN, deltas, subfolder=self.folder)
        return len(buckets)
