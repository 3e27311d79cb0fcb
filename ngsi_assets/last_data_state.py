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

The ``ngsi_last_data_compaction_job`` (``ngsi_assets.compaction``, on a schedule) folds the deltas
into the base buckets they touch and removes them, outside the runs that bring new data. A run folds
them itself only when ``compact_after`` deltas are there (the schedule stopped, or slower than the
increments). Killed in between, the next compaction folds them again, which changes nothing.

One run per state folder at a time (an exclusive lock; on object storage, the ``last_data`` Dagster
pool at 1): a compaction removes deltas another run might be reading.
"""

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.transforms.sql_sinks import LAST_DATA_STATE, LAST_DATA_STATE_BUCKETS, merge_last_data_state
from resources.lake import LakeResource
from resources.spark import computed_once

STATE_DATASET = "last_data_state"
DELTAS_DATASET = "last_data_state_deltas"
DELTA_COLUMN = "delta"
COMPACT_AFTER_ENV = "NGSI_LAST_DATA_COMPACT_AFTER"
COMPACT_AFTER_DEFAULT = 16
_OWN = "_own"
_DELTA_SCHEMA = StructType([*LAST_DATA_STATE.fields, StructField(DELTA_COLUMN, StringType())])


def state_folder(cfg: SqlSinkConfig) -> str:
    """The ``last_data_state`` subfolder of a sink: its dialect and a fingerprint of what shapes the state.

    A change of naming, unique key, timestamp key or its format starts a new state (the old one stays,
    unused).
    """
    shape = {
        "version": 1,
        "buckets": LAST_DATA_STATE_BUCKETS,
        "naming": {k: str(v) for k, v in dataclasses.asdict(cfg.naming).items()},
        "suffix": cfg.last_data_table_suffix,
        "unique_key": cfg.last_data_unique_key,
        "timestamp_key": cfg.last_data_timestamp_key,
        "timestamp_format": cfg.timestamp_format,
    }
    if cfg.orders_by_instant:
        shape["timestamp_format"] = "iso8601 (ns)"  # its orders are nanoseconds, not a format's ms
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    return f"{cfg.dialect.value}-{digest}"


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

    @staticmethod
    def of(lake: LakeResource, session: SparkSession, cfg: SqlSinkConfig) -> "LastDataState":
        return LastDataState(lake, session, cfg, state_folder(cfg))

    def lock(self):  # noqa: ANN201 - a context manager
        return self.lake.exclusive(DELTAS_DATASET, subfolder=self.folder)

    def merge_in(self, records: DataFrame, touched: Sequence[int], delta: str) -> StateWrite:
        """Write the run's records (``LAST_DATA_STATE`` rows of the ``touched`` buckets) as its delta;
        the merged state of the run's keys, computed (``computed_once``); then compact when due. Call
        it under ``lock``.

        The stored rows of the touched buckets are merged in one aggregation that keeps the keys the
        run's own delta holds. They are computed before a compaction folds that delta away.
        """
        cfg = self.cfg
        if not touched:
            return StateWrite(merge_last_data_state(records.limit(0), cfg), 0, 0, 0)
        self.lake.replace_folders(
            merge_last_data_state(records, cfg).withColumn(DELTA_COLUMN, F.lit(delta)),
            DELTAS_DATASET,
            DELTA_COLUMN,
            [delta],
            subfolder=self.folder,
        )
        deltas = self.lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, self.folder)
        stored = self.stored(touched, deltas, flag=delta)
        if stored is None:  # unreachable: the run's own delta was just written
            raise RuntimeError(f"last-data state {self.folder}: neither base nor deltas after writing {delta}")
        (merged,) = computed_once(merge_last_data_state(stored, cfg, wanted=F.col(_OWN)))
        compacted = buckets = 0
        if len(deltas) >= compact_after():
            buckets = self.compact(deltas)
            compacted, deltas = len(deltas), []
        return StateWrite(merged, len(deltas), compacted, buckets)

    def stored(self, buckets: Sequence[int] | None, deltas: Sequence[str], flag: str | None = None) -> DataFrame | None:
        """The unmerged state rows of the base ``buckets`` (all for None) and of the ``deltas`` (their
        rows of those buckets); None when there are none. With ``flag`` (a delta), a boolean column
        ``_own`` says which rows are that delta's."""
        base = self.lake.read_folders(
            self.session, STATE_DATASET, "bucket", buckets, subfolder=self.folder, schema=LAST_DATA_STATE
        )
        added = self.lake.read_folders(
            self.session, DELTAS_DATASET, DELTA_COLUMN, deltas, subfolder=self.folder, schema=_DELTA_SCHEMA
        )
        columns = LAST_DATA_STATE.fieldNames()
        if added is not None:
            if buckets is not None:
                added = added.where(F.col("bucket").isin(list(buckets)))
            added = added.select(*columns, *([(F.col(DELTA_COLUMN) == flag).alias(_OWN)] if flag else []))
        if base is not None and flag:
            base = base.select(*columns, F.lit(False).alias(_OWN))
        parts = [p for p in (base, added) if p is not None]
        return reduce(DataFrame.unionByName, parts) if parts else None

    def compact_pending(self) -> tuple[int, int]:
        """Fold every delta there is into the base (the scheduled compaction): (deltas, buckets) folded.
        Call it under ``lock``."""
        deltas = self.lake.folder_values(DELTAS_DATASET, DELTA_COLUMN, self.folder)
        return (len(deltas), self.compact(deltas)) if deltas else (0, 0)

    def compact(self, deltas: Sequence[str]) -> int:
        """Fold ``deltas`` into the base buckets they touch, then remove them; the number of buckets."""
        added = self.lake.read_folders(
            self.session, DELTAS_DATASET, DELTA_COLUMN, deltas, subfolder=self.folder, schema=_DELTA_SCHEMA
        )
        if added is None:
            return 0
        # At most LAST_DATA_STATE_BUCKETS rows.
        buckets = sorted(int(r["bucket"]) for r in added.select("bucket").distinct().collect())
        stored = self.stored(buckets, deltas)
        if stored is None:  # unreachable: the deltas were just read
            raise RuntimeError(f"last-data state {self.folder}: deltas {list(deltas)} vanished under the lock")
        merged = merge_last_data_state(stored, self.cfg)
        self.lake.replace_folders(merged, STATE_DATASET, "bucket", buckets, subfolder=self.folder)
        self.lake.remove_folders(DELTAS_DATASET, DELTA_COLUMN, deltas, subfolder=self.folder)
        return len(buckets)
