"""The versioned entities (seed 004): read the run's messages and events, fold, rewrite touched buckets.

Lake layout, per target entity folder (``entity_folder(name)``):
- ``versioned_entities/<entity>/bucket=N``: the target table (guid, valid_from_timestamp,
  valid_to_timestamp, deleted_indicator, business fields, source_message, field_provenance);
- ``entity_records/<entity>/bucket=N``: every record ever mapped to the entity (the fold's input);
- ``entity_record_marks/<entity>/bucket=N``: per key of a default NGSI entity, the time of its
  latest folded record (what a batch compares its new records with, without reading the records);
- ``entity_refreshes/<entity>/dt=H``: refresh events (message and child refreshes);
- ``entity_exports/<entity>/bucket=N``: for export entities, the live rows as an export store sees them;
and per hour: ``entity_record_index/dt=H`` (which buckets each hour wrote), ``entity_record_errors``
and ``message_log`` (each processed message's status and error text), whose hour folder also keeps
``_folded.json``: what of the hour the versioned entities hold (``FoldPlan``).

A run re-folds only the keys its hours touch, and rewrites only the buckets they fall in. A run
tagged ``ngsi/new-increments`` (continuous mode's derived runs) folds only the hour's increments not
folded yet, on top of the rest (``fold_hours``); in a bucket whose touched keys all go on from their
latest version it adds its closed versions and records as its own files and writes the bucket's open
rows again, rather than rewriting the bucket (``OPEN_PREFIX``, ``DELTA_PREFIX``, ``MERGE_LEVELS``).
"""

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.freshness import hours_received, received_metadata
from ngsi_assets.increments import FoldPlan, folds_new_increments, side_by_side_width
from ngsi_assets.ngsi.constants import MessageStatus
from ngsi_assets.ngsi.entity_schema import (
    DELETED,
    FIELD_PROVENANCE,
    GUID,
    NGSI_ENTITY_TYPE,
    NGSI_KEYS,
    NGSI_SOURCE_SYSTEM,
    SOURCE_MESSAGE,
    STANDARD_FIELDS,
    VALID_FROM,
    VALID_TO,
    EntityMapping,
    EntitySchema,
    FieldDef,
    TargetEntity,
    entity_folder,
)
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.transforms.conversions import spark_type
from ngsi_assets.transforms.plans import one_of
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENTS
from ngsi_assets.transforms.versioned_entities import (
    ENTITY_RECORDS,
    MESSAGE_LOG,
    OPEN_PREFIX,
    RECORD_ERRORS,
    RECORD_MARKS,
    REFRESHES,
    SEEN,
    MappedRecords,
    bucket_column,
    csv_source_records,
    datahub_source_records,
    fold_starts,
    fold_versions,
    invariant_rows,
    invariant_values,
    invariants_per_entity,
    keys_after_their_marks,
    keys_never_stored,
    live_rows,
    map_ngsi_default,
    map_to_target,
    merged_marks,
    message_log,
    message_refreshes,
    ngsi_source_records,
    record_keys,
    record_marks,
    record_stats,
    refresh_deletes,
    refresh_messages,
    table_keys,
    typed_versions,
    union_all,
)
from resources.frames import empty_frame
from resources.lake import (
    PARTITION_COLUMN,
    FileSplit,
    FolderAdd,
    FolderWrite,
    LakeResource,
    SubfoldersWrite,
    key_to_dt,
)
from resources.parallel import DEFAULT_WORKERS, results, side_by_side
from resources.spark import collect_small, computed_once
from resources.versioning import (
    BUCKETS_FILE,
    VERSIONS_DS,
    VersioningResource,
    store_table_schema,
    stored_bucket_count,
    stored_table_schema,
)

GROUP = "entities"
RECORDS_DS = "entity_records"
REFRESHES_DS = "entity_refreshes"
EXPORTS_DS = "entity_exports"
INDEX_DS = "entity_record_index"
MARKS_DS = "entity_record_marks"
ERRORS_DS = "entity_record_errors"
LOG_DS = "message_log"
BUCKET = "bucket"
# A bucket of versioned_entities keeps its open rows (one per key) in files named ``open-...``; a batch
# whose keys all go on from their latest version adds its closed versions as ``delta-<batch>-...``
# files and writes the open ones again, and ``entity_records`` gets its records the same way. A batch
# that finds ``MAX_DELTAS`` batches' files of one level in a bucket (``MERGE_LEVELS``: its batches',
# then merges of them) also merges them into one file of the next level, ``merged<n>-<batch>-...``:
# the merge reads those files only, and a bucket holds at most ``MAX_DELTAS`` files of each level.
DELTA_PREFIX = "delta-"
MERGE_LEVELS = (DELTA_PREFIX, "merged1-", "merged2-", "merged3-", "merged4-")
MAX_DELTAS = 24
_OPEN = "_open"
INDEX = StructType([StructField("entity", StringType(), False), StructField(BUCKET, IntegerType(), False)])

Fields = dict[str, FieldDef | None]  # a table's business fields; None: text of a default NGSI entity


class BucketCountChanged(ValueError):
    """NGSI_ENTITY_BUCKETS is not the count the lake's entity tables were written with."""


def check_bucket_count(lake: LakeResource, buckets: int) -> None:
    """Refuse to fold with another bucket count than the lake's entity tables were written with.

    A key's bucket is its guid's hash modulo the count: with another count its new rows would go to
    another bucket than its stored ones, and the key would have two open rows in two buckets. The
    count is kept in ``versioned_entities/_buckets.json``, written by the first run. A lake written
    before that file gets it now, unless some entity already has a bucket folder the count cannot
    have made (``bucket=N``, N >= the count). What this cannot see: a lake written with more buckets
    whose every key fell below the new count (only possible with a handful of keys).
    """
    stored = stored_bucket_count(lake)
    rebuild = (
        "; set it back, or rebuild the entity tables with the new count "
        '(docs/features/versioned-entities.md, "Storage and cost")'
    )
    if stored is not None:
        if stored != buckets:
            raise BucketCountChanged(
                f"NGSI_ENTITY_BUCKETS is {buckets}, but the lake's versioned entities were written with "
                f"{stored} buckets{rebuild}"
            )
        return
    highest = max(
        (
            (int(v), folder)
            for folder in lake.subfolders(VERSIONS_DS)
            for v in lake.folder_values(VERSIONS_DS, BUCKET, folder)
        ),
        default=None,
    )
    if highest is not None and highest[0] >= buckets:
        raise BucketCountChanged(
            f"NGSI_ENTITY_BUCKETS is {buckets}, but the lake's versioned entities were written with more "
            f"buckets (versioned_entities/{highest[1]}/bucket={highest[0]} exists){rebuild}"
        )
    lake.write_dataset_file(VERSIONS_DS, BUCKETS_FILE, json.dumps({"buckets": buckets}))


class BucketStats(NamedTuple):
    """What a run's records of one entity bring to one bucket (``record_stats``)."""

    records: int
    keys: int
    field_names: list[str]

    @staticmethod
    def of(row: Row) -> "BucketStats":
        """From a row of ``record_stats``."""
        return BucketStats(int(row["records"] or 0), int(row["keys"]), list(row["field_names"]))


@dataclass
class EntityWork:
    """What one target entity gets from a run."""

    name: str
    definition: TargetEntity | None  # None: a default NGSI entity (text fields, NGSI keys)
    records: list[DataFrame] = field(default_factory=list)
    refreshes: list[DataFrame] = field(default_factory=list)
    # Set by ``VersioningRun.plan`` (default NGSI entities) or ``_cache_records`` (schema entities): the
    # run's bucketed records (for a default NGSI entity, a filter of the cached frame every one of them
    # shares), and per bucket how many records and keys, and which field names.
    new: DataFrame | None = None
    stats: dict[int, BucketStats] = field(default_factory=dict)


@dataclass
class EntityOutcome:
    name: str
    records: int
    buckets_rewritten: int
    buckets_appended: int = 0  # buckets the run added its versions to, without rewriting their history
    rows_in_rewritten_buckets: int = 0
    overlapping: int = 0
    open_rows_not_one: int = 0
    missing_provenance: int = 0
    from_latest: int = 0  # keys folded on from their latest version, with only their new records
    new_keys: int = 0  # keys never stored before, folded from their new records and added to their buckets


class RunOutput(NamedTuple):
    outcomes: list[EntityOutcome]
    log: DataFrame  # the message log rows the run wrote (MESSAGE_LOG)
    statuses: dict[str, int]  # the log's messages per status (as text)


def _key_fields(work: EntityWork) -> tuple[str, ...]:
    return work.definition.key_fields if work.definition else NGSI_KEYS


def _table_schema(fields: Fields) -> StructType:
    from pyspark.sql.types import BooleanType, TimestampType

    return StructType(
        [
            StructField(GUID, StringType(), False),
            StructField(VALID_FROM, TimestampType(), False),
            StructField(VALID_TO, TimestampType()),
            StructField(DELETED, BooleanType(), False),
            *[StructField(n, spark_type(f) if f is not None else StringType()) for n, f in fields.items()],
            StructField(SOURCE_MESSAGE, StringType(), False),
            StructField(FIELD_PROVENANCE, StringType(), False),
            StructField(BUCKET, IntegerType(), False),
        ]
    )


class VersioningRun:
    """One materialization: the I/O around the pure transforms, entity by entity in link order."""

    def __init__(
        self,
        spark: SparkSession,
        lake: LakeResource,
        schema: EntitySchema,
        buckets: int,
        keys: Sequence[str],
        workers: int = DEFAULT_WORKERS,
        batch: str | None = None,
    ) -> None:
        """``batch``: the run folds only some increments of its one hour (the messages and events given
        to ``run``) on top of what earlier runs folded; its id names the rows it adds to the hour's
        message log, errors and record index. None: the run's hours are folded whole."""
        if batch is not None and len(keys) != 1:
            raise ValueError(f"a run folding increments is for one hour, not {len(keys)}")
        self.batch = batch
        self.spark = spark
        self.workers = workers
        self.lake = lake
        self.schema = schema
        self.buckets = buckets
        self.dts = sorted({key_to_dt(k) for k in keys})
        self.keys = list(keys)

    # -- reads ----------------------------------------------------------------------------------

    def fields_of(self, work: EntityWork) -> Fields:
        if work.definition is not None:
            return dict(work.definition.stored_fields)
        # A default NGSI entity's columns grow with the attributes notified: those its files have (kept
        # beside them; a lake from before they were kept merges the files' schemas) and the run's.
        folder = entity_folder(work.name)
        kept = stored_table_schema(self.lake, folder)
        if kept is not None:
            columns = kept.fieldNames()
        else:
            existing = self.lake.read_folders(self.spark, VERSIONS_DS, BUCKET, None, subfolder=folder)
            columns = existing.columns if existing is not None else []
        names = {c for c in columns if c not in STANDARD_FIELDS and c != BUCKET}
        names |= {n for s in work.stats.values() for n in s.field_names}
        ordered = [*NGSI_KEYS, NGSI_ENTITY_TYPE]
        return {n: None for n in ordered + sorted(names - set(ordered))}

    def table(self, work: EntityWork, fields: Fields, buckets: Sequence[int] | None = None) -> DataFrame | None:
        return self.lake.read_folders(
            self.spark,
            VERSIONS_DS,
            BUCKET,
            buckets,
            subfolder=entity_folder(work.name),
            schema=_table_schema(fields),
        )

    def link_lookup(self, entity_name: str) -> DataFrame:
        definition = self.schema.entities[entity_name]
        fields: Fields = dict(definition.stored_fields)
        table = self.table(EntityWork(entity_name, definition), fields)
        if table is None:
            return empty_frame(self.spark, "guid string, values map<string,string>")
        return live_rows(table, fields)

    # -- the run --------------------------------------------------------------------------------

    def plan(
        self, combos: Sequence[Row], source: DataFrame, refreshing: DataFrame, default_stats: Sequence[Row]
    ) -> tuple[list[EntityWork], list[DataFrame]]:
        """Map every (source system, source entity) of the run to target entities, in link order.

        ``combos``: the run's distinct (source_system, source_entity, refresh) rows; ``default_stats``:
        ``record_stats`` of the default NGSI entities' records (``self._default_records``), which name
        those entities. Both come from one job (``run``)."""
        self._any_refresh = any(r["refresh"] for r in combos)
        if self.batch and self._any_refresh:
            # A refresh deletes every live key it did not name, wherever stored: its hour is folded whole.
            raise WholeHourNeeded("a refresh message is among the increments")
        order = self.schema.processing_order()
        works: dict[str, EntityWork] = {n: EntityWork(n, self.schema.entities[n]) for n in order}
        errors: list[DataFrame] = []
        pending: dict[str, list[tuple[DataFrame, EntityMapping]]] = {n: [] for n in order}
        for system, entity in sorted(
            {(r["source_system"], r["source_entity"]) for r in combos}, key=lambda c: (c[0] or "", c[1] or "")
        ):
            of_combo = (F.col("source_entity").eqNullSafe(F.lit(entity))) & (
                F.col("source_system").eqNullSafe(F.lit(system))
            )
            mappings = self.schema.mappings_for(system, entity) if entity is not None else None
            if mappings is not None:
                for m in mappings:
                    pending[m.reference].append((source.where(of_combo), m))
                    if self._any_refresh:
                        works[m.reference].refreshes.append(
                            message_refreshes(refreshing.where(of_combo), m.reference, m)
                        )
            elif system != NGSI_SOURCE_SYSTEM:  # (NGSI types the schema does not map: default entities)
                errors.append(
                    source.where(of_combo).select(
                        "message_identifier",
                        "record_seq",
                        F.lit(None).cast("string").alias("entity"),
                        F.lit(int(MessageStatus.ERROR)).alias("status"),
                        F.lit(f"no target entity {entity!r} in the schema and no mapping for it").alias("error_text"),
                        "dt",
                    )
                )
        self._pending = pending
        self._works = works
        # The default NGSI entities the run's records name, and those the run's hours wrote before (a
        # changed mapping: reprocessed too; ``run`` read the index once, before the plan; increments
        # only add to what the hour holds).
        stats: dict[str, dict[int, BucketStats]] = {}
        for r in default_stats:
            stats.setdefault(r["entity"], {})[int(r[BUCKET])] = BucketStats.of(r)
        names = sorted(set(stats) | {n for n in self._old_buckets if n not in works})
        defaults = [EntityWork(n, None) for n in names]
        for work in defaults:
            work.new = self._default_records.where(F.col("entity") == work.name)
            work.stats = stats.get(work.name, {})
        return [*[works[n] for n in order], *defaults], errors

    def _bucketed(self, records: DataFrame) -> DataFrame:
        """The run's records of some entities with their bucket, computed once and kept to the run's end
        (the message log and the record index read them again)."""
        (bucketed,) = computed_once(records.withColumn(BUCKET, bucket_column(F.col("guid"), self.buckets)))
        self._new_records.append(bucketed)
        self._index_rows.append(bucketed.select("entity", BUCKET, PARTITION_COLUMN).distinct())
        return bucketed

    def _cache_records(self, records: DataFrame, work: EntityWork) -> None:
        """Bucket and cache a schema entity's records of the run (mapped just before its fold), and give
        its work the buckets they touch with their record counts and field names (one job)."""
        work.new = self._bucketed(records)
        work.stats = {int(r[BUCKET]): BucketStats.of(r) for r in record_stats(work.new, BUCKET).collect()}

    def _indexed(self) -> DataFrame:
        return self.lake.read(self.spark, INDEX_DS, INDEX, self.keys)

    def map_defined(self, work: EntityWork, errors: list[DataFrame]) -> None:
        """Map the pending sources (and children) of a schema entity; children go to their entities."""
        definition = work.definition
        assert definition is not None
        lookups = {
            f.linkEntity: self.link_lookup(f.linkEntity)
            for f in definition.fields.values()
            if f.type == "link" and f.linkEntity
        }
        link_keys = {name: self.schema.entities[name].key_fields for name in lookups}
        link_fields = {name: self.schema.entities[name].stored_fields for name in lookups}
        outcomes: list[MappedRecords] = []
        for src, mapping in self._pending.get(work.name, []):
            outcomes.append(
                map_to_target(src, work.name, definition, mapping, lookups, link_keys, link_fields=link_fields)
            )
        for src, parent_field, mapping in self._children.get(work.name, []):
            outcomes.append(
                map_to_target(
                    src,
                    work.name,
                    definition,
                    mapping,
                    lookups,
                    link_keys,
                    child_of=parent_field,
                    link_fields=link_fields,
                )
            )
        for out in outcomes:
            work.records.append(out.records)
            errors.append(out.errors)
            for child, frame in out.children.items():
                # A child refresh deletes rows of the child entity: it belongs to the child's work
                # (processed after its parent, which it links to).
                self._works[child].refreshes.append(out.refreshes.where(F.col("entity") == child))
                parent_field = next(
                    f.parentIdentifier
                    for f in definition.fields.values()
                    if f.type == "children" and f.childEntity == child
                )
                self._children.setdefault(child, []).append((frame, parent_field, EntityMapping(reference=child)))

    def process(self, work: EntityWork) -> EntityOutcome | None:
        """Fold the keys this run touches for one entity and rewrite their buckets."""
        prepared = self._prepare(work)
        if prepared is None:
            return None
        # Side by side: the fold reads the records that are replaced beside it, and nothing is swapped
        # in before every write is staged.
        self.lake.replace_together([*prepared.marks, *prepared.versions, *prepared.records])
        return self._finish(prepared)

    def process_together(self, works: Sequence[EntityWork]) -> list[EntityOutcome | None]:
        """``process`` of default NGSI entities, whose writes are staged and committed together: the
        marks of every entity in one Spark write, then each entity's versions (their columns differ),
        then every entity's rewritten records in one write (``SubfoldersWrite``). So each entity's
        marks are committed before its versions and its records, as ``process`` commits them."""
        prepared = results(
            side_by_side([functools.partial(self._prepare, w) for w in works], name="entity", workers=self.workers)
        )
        ready = [p for p in prepared if p is not None]
        marks = [w for p in ready for w in p.marks]
        records = [w for p in ready for w in p.records if isinstance(w, FolderWrite)]
        self.lake.replace_together(
            [
                *([SubfoldersWrite(marks)] if marks else []),
                *(w for p in ready for w in p.versions),
                *([SubfoldersWrite(records)] if records else []),
                *(w for p in ready for w in p.records if not isinstance(w, FolderWrite)),
            ]
        )
        return [None if p is None else self._finish(p) for p in prepared]

    def _prepare(self, work: EntityWork) -> "_Prepared | None":
        """What ``process`` writes for one entity, staged by its caller: None when the run leaves every
        bucket of the entity as it was (its refresh events are stored then)."""
        folder = entity_folder(work.name)
        if work.new is None:  # a schema entity, whose records were mapped just before
            self._cache_records(union_all(work.records, _RECORDS_NO_BUCKET, self.spark), work)
        new = work.new
        assert new is not None
        refreshes_new = union_all(work.refreshes, REFRESHES, self.spark)
        fields = self.fields_of(work)

        history = self.lake.read_folders(
            self.spark, REFRESHES_DS, PARTITION_COLUMN, None, subfolder=folder, schema=REFRESHES
        )
        refreshes = refreshes_new
        if history is not None:
            if not self.batch:  # the run's hours are replaced; a batch brings no refresh (see ``run``)
                history = history.where(~F.col(PARTITION_COLUMN).isin(self.dts))
            refreshes = history.select(*REFRESHES.fieldNames()).unionByName(refreshes_new)

        new_buckets = set(work.stats)
        record_count = sum(s.records for s in work.stats.values())
        old_buckets = self._old_buckets.get(work.name, set())
        # A refresh touches every live key in its scope, wherever it is stored.
        refresh_targets = None
        has_refreshes = bool(work.refreshes) and bool(refreshes_new.limit(1).count())
        if has_refreshes:
            table = self.table(work, fields)
            known = record_keys(new)
            if table is not None:
                known = known.unionByName(table_keys(table, work.name, fields, _key_fields(work))).dropDuplicates(
                    ["guid"]
                )
            refresh_targets = refresh_deletes(known, refreshes_new, new).select("guid").distinct()
            refresh_targets = refresh_targets.withColumn(BUCKET, bucket_column(F.col("guid"), self.buckets))
            new_buckets |= {r[0] for r in refresh_targets.select(BUCKET).distinct().collect()}
        affected = sorted(new_buckets | old_buckets)
        if not affected:
            # Stored even when no row changes now (a parent delete with no children yet): a late
            # child record must still meet it.
            self._store_refreshes(refreshes_new, folder, has_refreshes)
            return None

        # Every key's latest folded record time, as a batch compares its records with (``_marks``).
        marks = self._marks(work, affected)
        on_top, latest, from_latest, new_keys, appendable = None, None, 0, 0, []
        if self.batch and work.definition is None and history is None:
            # Keys whose new records all come after their stored ones (in-order traffic: nearly all) go
            # on from their latest version with only the new records, not their whole history. Only
            # default NGSI entities (text fields, exact in the table) with no refresh ever.
            files = self.lake.folder_file_names(VERSIONS_DS, BUCKET, affected, subfolder=folder)
            latest, appendable = self._latest_versions(work, fields, files)
            if latest is not None and marks is not None:
                # With them, keys never stored (new cars): their new records are all their records.
                after = keys_after_their_marks(marks, new, latest).withColumn("_new", F.lit(False))
                never = keys_never_stored(marks, new, latest).withColumn("_new", F.lit(True))
                (both,) = computed_once(after.unionByName(never))
                counts = {r["_new"]: int(r["count"]) for r in both.groupBy("_new").count().collect()}
                from_latest, new_keys = counts.get(False, 0), counts.get(True, 0)
                on_top = both.select("guid")
            if not from_latest and not new_keys:  # late records only: the plain fold, with fewer joins
                on_top, appendable = None, []
        all_on_top = on_top is not None and from_latest + new_keys == sum(s.keys for s in work.stats.values())
        if on_top is not None and not all_on_top:
            # A bucket whose keys all go on from their latest version (or have none) keeps its stored
            # rows and records; when every key of the batch does (the counts say so), no job asks which.
            # (A key with records of the batch's messages stored by an earlier attempt is not among them:
            # its mark is at least their time.)
            behind = (
                new.select("guid").join(on_top, "guid", "left_anti").select(bucket_column(F.col("guid"), self.buckets))
            )
            appendable = sorted(set(appendable) - {int(r[0]) for r in behind.distinct().collect()})
        rewritten = sorted(set(affected) - set(appendable))
        if all_on_top and not rewritten and refresh_targets is None:
            # Every key of the batch goes on from its latest version or is new, in buckets it adds to: no
            # stored record is read or replaced, and the fold is of the batch's records alone.
            records, touched = None, on_top
            to_fold = new.select(*ENTITY_RECORDS.fieldNames())
        else:
            records, touched, to_fold = self._records_to_fold(new, rewritten, folder, refresh_targets, on_top)
        starts = None
        if on_top is not None:
            assert latest is not None
            starts = fold_starts(latest.join(on_top, GUID, "left_semi"), work.name, list(fields))
        if has_refreshes or history is not None:
            deletes = refresh_deletes(record_keys(to_fold), refreshes, to_fold).withColumn(
                BUCKET, bucket_column(F.col("guid"), self.buckets)
            )
            to_fold = to_fold.unionByName(deletes)
        # (No refresh stored or brought: no delete to generate, and a smaller plan to analyse.)
        versions = typed_versions(fold_versions(to_fold, starts), fields)
        if appendable:
            # Written as two adds (closed versions, open rows) and maybe a rewrite: folded once.
            (versions,) = computed_once(versions)
        marks_writes, writes, records_writes = [], [], []
        if marks is not None:  # the first write: committed before the records
            new_marks = merged_marks([marks, record_marks(new.select(*ENTITY_RECORDS.fieldNames()))])
            marks_writes.append(FolderWrite(new_marks, MARKS_DS, BUCKET, affected, subfolder=folder))
        if rewritten:
            assert records is not None
            whole = versions.where(one_of(BUCKET, rewritten))
            existing = self.table(work, fields, rewritten)
            if existing is not None:
                untouched = existing.join(touched, GUID, "left_anti")
                if on_top is not None:  # their earlier versions stay; the fold gave their latest one again
                    earlier = existing.where(F.col(VALID_TO).isNotNull()).join(on_top, GUID, "left_semi")
                    untouched = untouched.unionByName(earlier)
                whole = whole.unionByName(untouched)
            writes.append(
                FolderWrite(
                    whole.withColumn(_OPEN, F.col(VALID_TO).isNull()),
                    VERSIONS_DS,
                    BUCKET,
                    rewritten,
                    subfolder=folder,
                    split=FileSplit(_OPEN, OPEN_PREFIX),
                )
            )
            records_writes.append(
                FolderWrite(records.where(one_of(BUCKET, rewritten)), RECORDS_DS, BUCKET, rewritten, subfolder=folder)
            )
        batch_prefix = f"{DELTA_PREFIX}{self.batch}-"
        if appendable:
            assert on_top is not None and latest is not None and self.batch
            # The batch's versions of these buckets: the closed ones are added as its own files, and the
            # buckets' open rows are written again (the batch's keys' new ones, the others' as they were).
            added = versions.where(one_of(BUCKET, appendable))
            open_rows = added.where(F.col(VALID_TO).isNull()).unionByName(
                latest.where(one_of(BUCKET, appendable)).join(touched, GUID, "left_anti")
            )
            records_files = self.lake.folder_file_names(RECORDS_DS, BUCKET, appendable, subfolder=folder)
            writes += self._adds(
                [(added.where(F.col(VALID_TO).isNotNull()), batch_prefix), (open_rows, OPEN_PREFIX)],
                VERSIONS_DS,
                folder,
                {b: files[str(b)] for b in appendable},
                _table_schema(fields),
                remove_prefixes=(OPEN_PREFIX, batch_prefix),
            )
            records_writes += self._adds(
                [(new.select(*ENTITY_RECORDS.fieldNames()), batch_prefix)],
                RECORDS_DS,
                folder,
                {b: records_files[str(b)] for b in appendable},
                ENTITY_RECORDS,
                remove_prefixes=(batch_prefix,),
            )
        # The table's columns are kept before its files are written, so they always cover its files'
        # (``_open_versions`` of the transaction history reads with them).
        store_table_schema(self.lake, folder, _table_schema(fields))
        return _Prepared(
            work=work,
            fields=fields,
            new=new,
            refreshes_new=refreshes_new,
            has_refreshes=has_refreshes,
            affected=affected,
            rewritten=rewritten,
            appendable=appendable,
            record_count=record_count,
            from_latest=from_latest,
            new_keys=new_keys,
            marks=marks_writes,
            versions=writes,
            records=records_writes,
        )

    def _finish(self, prepared: "_Prepared") -> EntityOutcome:
        """After an entity's writes are committed: its exports and refresh events, and its written rows
        for the run's invariants."""
        work, fields, new, rewritten, appendable = (
            prepared.work,
            prepared.fields,
            prepared.new,
            prepared.rewritten,
            prepared.appendable,
        )
        folder, batch_prefix = entity_folder(work.name), f"{DELTA_PREFIX}{self.batch}-"
        # What the invariants check: the rewritten buckets, and of the appended ones the batch's files
        # and the open rows of its keys (their earlier versions, in earlier files, did not change).
        parts = [self.table(work, fields, rewritten)] if rewritten else []
        if appendable:
            names = self.lake.folder_file_names(VERSIONS_DS, BUCKET, appendable, subfolder=folder)
            added_files = {b: [n for n in ns if n.startswith((OPEN_PREFIX, batch_prefix))] for b, ns in names.items()}
            added_rows = self.lake.read_folder_files(
                self.spark, VERSIONS_DS, BUCKET, added_files, _table_schema(fields), subfolder=folder
            )
            if added_rows is not None:
                keys = new.select(F.col("guid").alias(GUID)).distinct()
                parts.append(added_rows.join(keys, GUID, "left_semi"))
        # No rows at all (say, only deletes of keys never inserted): an empty table of the right shape.
        written = union_all([p for p in parts if p is not None], _table_schema(fields), self.spark)
        if work.definition is not None and work.definition.export:
            self.lake.replace_folders(
                export_rows(written, work.definition), EXPORTS_DS, BUCKET, prepared.affected, subfolder=folder
            )
        self._store_refreshes(prepared.refreshes_new, folder, prepared.has_refreshes)
        # Checked with every other entity's rewritten buckets in one aggregation at the end of the run.
        self._invariants.append(invariant_rows(written, work.name, list(fields)))
        return EntityOutcome(
            name=work.name,
            records=prepared.record_count,
            buckets_rewritten=len(rewritten),
            buckets_appended=len(appendable),
            from_latest=prepared.from_latest,
            new_keys=prepared.new_keys,
        )

    def _records_to_fold(
        self,
        new: DataFrame,
        rewritten: Sequence[int],
        folder: str,
        refresh_targets: DataFrame | None,
        on_top: DataFrame | None,
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        """The records of the ``rewritten`` buckets once the run's own replace theirs (what those buckets
        hold next), the keys the run touches, and the records to fold: every record of a touched key,
        except the stored ones of the keys ``on_top`` (which go on from their latest version)."""
        # The stored records of the rewritten buckets only: the appended ones are not read.
        old = (
            self.lake.read_folders(self.spark, RECORDS_DS, BUCKET, rewritten, subfolder=folder, schema=ENTITY_RECORDS)
            if rewritten
            else None
        )
        old = old or empty_frame(self.spark, ENTITY_RECORDS)
        # What the run replaces: its hours' records, or the records of its batch's messages (stored by an
        # earlier attempt of the same batch).
        if self.batch:
            replaced = old.join(self._batch_messages, "message_identifier", "left_semi")
            kept = old.join(self._batch_messages, "message_identifier", "left_anti")
        else:
            replaced = old.where(F.col(PARTITION_COLUMN).isin(self.dts))
            kept = old.where(~F.col(PARTITION_COLUMN).isin(self.dts))
        new_records = new.select(*ENTITY_RECORDS.fieldNames())
        records = kept.unionByName(new_records)
        touched = new.select("guid").union(replaced.select("guid"))
        if refresh_targets is not None:
            touched = touched.union(refresh_targets.select("guid"))
        touched = touched.distinct()
        # Every new record's key is touched, and a key ``on_top`` folds its new records only: of the
        # records, only the kept ones are joined (none in a bucket with no stored records: no join).
        folded = touched if on_top is None else touched.join(on_top, "guid", "left_anti")
        return records, touched, kept.join(folded, "guid", "left_semi").unionByName(new_records)

    def _latest_versions(
        self, work: EntityWork, fields: Fields, files: dict[str, list[str]]
    ) -> tuple[DataFrame | None, list[int]]:
        """The open rows of the buckets ``files`` lists (their stored files), and the buckets a batch may
        add to rather than rewrite: those that keep their open rows in files of their own (every bucket
        written since that layout). Reading the open files of those buckets costs their keys, not their
        history."""
        appendable = sorted(int(b) for b, names in files.items() if any(n.startswith(OPEN_PREFIX) for n in names))
        others = sorted(int(b) for b, names in files.items() if names and int(b) not in appendable)
        schema = _table_schema(fields)
        opened = self.lake.read_folder_files(
            self.spark,
            VERSIONS_DS,
            BUCKET,
            {str(b): [n for n in files[str(b)] if n.startswith(OPEN_PREFIX)] for b in appendable},
            schema,
            subfolder=entity_folder(work.name),
        )
        rest = self.table(work, fields, others) if others else None
        parts = [p.where(F.col(VALID_TO).isNull()) for p in (opened, rest) if p is not None]
        if not parts:
            return None, []
        return functools.reduce(DataFrame.unionByName, parts), appendable

    def _adds(
        self,
        adds: Sequence[tuple[DataFrame, str]],
        dataset: str,
        folder: str,
        files: dict[int, list[str]],
        schema: StructType,
        remove_prefixes: Sequence[str],
    ) -> list[FolderAdd]:
        """The batch's ``adds`` to the buckets ``files`` lists (each bucket's files before the batch), and
        in a bucket holding ``MAX_DELTAS`` files' ids of a level (the batch's own left out) their merge
        into one file of the next level: one ``FolderAdd`` per set of buckets merging the same levels."""
        own = f"{DELTA_PREFIX}{self.batch}-"
        groups: dict[tuple[int, ...], list[int]] = {}
        for bucket, names in sorted(files.items()):
            full = tuple(
                level
                for level, prefix in enumerate(MERGE_LEVELS[:-1])
                if len({n.split("-")[1] for n in names if n.startswith(prefix) and not n.startswith(own)}) >= MAX_DELTAS
            )
            groups.setdefault(full, []).append(bucket)
        out = []
        for levels, buckets in sorted(groups.items()):
            merged: list[tuple[DataFrame, str]] = []
            removed: list[str] = []
            for level in levels:
                prefix = MERGE_LEVELS[level]
                chosen = {
                    str(b): [n for n in files[b] if n.startswith(prefix) and not n.startswith(own)] for b in buckets
                }
                rows = self.lake.read_folder_files(self.spark, dataset, BUCKET, chosen, schema, subfolder=folder)
                assert rows is not None
                merged.append((rows, f"{MERGE_LEVELS[level + 1]}{self.batch}-"))
                removed += sorted({f"{prefix}{n.split('-')[1]}-" for names in chosen.values() for n in names})
            out.append(
                FolderAdd(
                    [*((df.where(one_of(BUCKET, buckets)), p) for df, p in adds), *merged],
                    dataset,
                    BUCKET,
                    buckets,
                    subfolder=folder,
                    remove_prefixes=(*remove_prefixes, *removed),
                )
            )
        return out

    def _marks(self, work: EntityWork, buckets: Sequence[int]) -> DataFrame | None:
        """RECORD_MARKS of ``buckets`` of a default NGSI entity (the only ones a batch folds on top):
        as stored, or from their records for a bucket with records and no marks (a lake written before
        marks were kept). A run writes its buckets' marks before their records (the first of its
        writes), merged with its new records' times, so a run killed between them leaves marks later
        than the records, never earlier: a key then folds its whole history.

        None for a schema entity, whose records are written with no marks: marks it kept as a default
        entity (before the schema defined it) are removed from ``buckets`` first."""
        folder = entity_folder(work.name)
        if work.definition is not None:
            kept = set(self.lake.folder_values(MARKS_DS, BUCKET, folder)) & {str(b) for b in buckets}
            if kept:
                self.lake.remove_folders(MARKS_DS, BUCKET, sorted(kept), subfolder=folder)
            return None
        files = self.lake.folder_file_names(MARKS_DS, BUCKET, buckets, subfolder=folder)
        stored = self.lake.read_folder_files(
            self.spark, MARKS_DS, BUCKET, {b: ns for b, ns in files.items() if ns}, RECORD_MARKS, subfolder=folder
        )
        parts = [stored] if stored is not None else []
        unmarked = [b for b in buckets if not files[str(b)]]
        records = (
            self.lake.read_folders(self.spark, RECORDS_DS, BUCKET, unmarked, subfolder=folder, schema=ENTITY_RECORDS)
            if unmarked
            else None
        )
        if records is not None:
            parts.append(record_marks(records))
        return merged_marks(parts) if parts else empty_frame(self.spark, RECORD_MARKS)

    def _store_refreshes(self, refreshes_new: DataFrame, folder: str, any_new: bool) -> None:
        """Replace the run's hours of the entity's refresh events (skipped when there were and are none,
        and for a batch, which brings none)."""
        if self.batch:
            return
        if not any_new and (
            self.lake.read_folders(self.spark, REFRESHES_DS, PARTITION_COLUMN, self.dts, subfolder=folder) is None
        ):
            return
        self.lake.replace_folders(
            refreshes_new.where(F.col(PARTITION_COLUMN).isin(self.dts)),
            REFRESHES_DS,
            PARTITION_COLUMN,
            self.dts,
            subfolder=folder,
        )

    def run(self, messages: DataFrame, events: DataFrame) -> RunOutput:
        """Process the run's hours; returns each entity's outcome, the message log written and its
        messages per status."""
        check_bucket_count(self.lake, self.buckets)
        self._new_records: list[DataFrame] = []
        self._index_rows: list[DataFrame] = []
        self._invariants: list[DataFrame] = []
        # Child source records, by child entity, produced while mapping their parents.
        self._children: dict[str, list[tuple[DataFrame, str | None, EntityMapping]]] = {}
        no_clashes = F.array().cast("array<string>")
        datahub = datahub_source_records(messages).withColumn("clashes", no_clashes)
        csv_records, csv_errors = csv_source_records(messages, self.schema.csv_systems())
        # The source records and the refresh messages: one job.
        source, refreshing = computed_once(
            datahub.unionByName(csv_records.withColumn("clashes", no_clashes)).unionByName(ngsi_source_records(events)),
            refresh_messages(messages),
        )
        if self.batch:  # the messages whose earlier records a batch replaces
            self._batch_messages = source.select("message_identifier").distinct()
        # The buckets each entity's records of the run's hours were in (one small read for all
        # entities); a batch only adds to the hour.
        self._old_buckets: dict[str, set[int]] = {}
        for r in [] if self.batch else self._indexed().select("entity", BUCKET).distinct().collect():
            self._old_buckets.setdefault(r["entity"], set()).add(r[BUCKET])
        # The default NGSI entities' records (every NGSI type the schema does not map, in one pass),
        # kept; the run's (source system, source entity) pairs and those records' counts per entity
        # and bucket come from one job: which entities the run touches, and where.
        mapped = self.schema.mapped_source_entities(NGSI_SOURCE_SYSTEM)
        unmapped = F.col("source_entity").isNull() | (~F.col("source_entity").isin(mapped) if mapped else F.lit(True))
        defaults = map_ngsi_default(source.where((F.col("source_system") == NGSI_SOURCE_SYSTEM) & unmapped))
        self._default_records = self._bucketed(union_all([defaults.records], _RECORDS_NO_BUCKET, self.spark))
        found = collect_small(
            combos=source.select("source_system", "source_entity", F.lit(False).alias("refresh"))
            .union(refreshing.select("source_system", "source_entity", F.lit(True).alias("refresh")))
            .distinct(),
            stats=record_stats(self._default_records, BUCKET),
        )
        works, errors = self.plan(found["combos"], source, refreshing, found["stats"])
        errors.append(defaults.errors)
        if self.batch:
            parents = sorted(
                name
                for name, pending in self._pending.items()
                if pending and any(f.type == "children" for f in self.schema.entities[name].fields.values())
            )
            if parents:
                # Each parent record replaces its children (a child refresh, kept with the hour's refreshes).
                raise WholeHourNeeded(f"records of {', '.join(parents)}, whose children they replace")
        errors.append(csv_errors)
        defined = [w for w in works if w.definition is not None]

        def in_link_order() -> list[EntityOutcome | None]:
            # A schema entity reads the tables of the entities it links to, and its children come
            # from its parent's mapping: one after the other.
            out = []
            for work in defined:
                self.map_defined(work, errors)
                out.append(self.process(work))
            return out

        # Default NGSI entities depend on nothing but their own records: each beside the others and
        # beside the schema's chain (their small jobs overlap rather than queue).
        defaults = [w for w in works if w.definition is None]
        done = results(
            side_by_side(
                [in_link_order, functools.partial(self.process_together, defaults)], name="entities", workers=2
            )
        )
        outcomes = [o for o in [*done[0], *done[1]] if o is not None]
        all_records = [r.where(F.col("op") != SEEN).select("message_identifier") for r in self._new_records]

        (errors_df,) = computed_once(union_all(errors, RECORD_ERRORS, self.spark))
        processed = (
            source.select("message_identifier", PARTITION_COLUMN)
            .union(csv_errors.select("message_identifier", PARTITION_COLUMN))
            .union(refreshing.select("message_identifier", PARTITION_COLUMN))
            .distinct()
        )
        records_df = union_all(all_records, _MESSAGE_IDS, self.spark)
        log = message_log(processed, records_df, errors_df)
        index = union_all(self._index_rows, INDEX_DT, self.spark)
        if self.batch:
            # Added to the hour as the batch's files: a rerun of the batch replaces exactly them.
            key, batch = self.keys[0], self.batch
            results(
                side_by_side(
                    [
                        functools.partial(self.lake.append_increment, df, ds, key, batch)
                        for df, ds in ((errors_df, ERRORS_DS), (log, LOG_DS), (index, INDEX_DS))
                    ],
                    name="lake-append",
                    workers=3,
                )
            )
            written = self.lake.read_increment(self.spark, LOG_DS, MESSAGE_LOG, key, batch)
        else:
            # Three small writes, latency rather than work: side by side.
            self.lake.replace_together(
                [
                    FolderWrite.hours(errors_df, ERRORS_DS, self.keys),
                    FolderWrite.hours(log, LOG_DS, self.keys),
                    FolderWrite.hours(index, INDEX_DS, self.keys),
                ]
            )
            written = self.lake.read(self.spark, LOG_DS, MESSAGE_LOG, self.keys)
        # The rewritten buckets' invariants (every entity's) and the log's statuses: one job.
        found = collect_small(
            statuses=written.groupBy("status").count(),
            **({"invariants": invariants_per_entity(self._invariants)} if self._invariants else {}),
        )
        counts = invariant_values(found.get("invariants", []))
        outcomes = [replace(o, **counts.get(o.name, {})) for o in outcomes]
        return RunOutput(outcomes, written, {str(r["status"]): int(r["count"]) for r in found["statuses"]})


@dataclass(frozen=True)
class _Prepared:
    """An entity's fold, staged but not committed (``VersioningRun._prepare``): its writes in the order
    they are committed (the marks first) and what ``VersioningRun._finish`` needs after them."""

    work: EntityWork
    fields: Fields
    new: DataFrame
    refreshes_new: DataFrame
    has_refreshes: bool
    affected: Sequence[int]
    rewritten: Sequence[int]
    appendable: Sequence[int]
    record_count: int
    from_latest: int
    new_keys: int
    marks: Sequence[FolderWrite]
    versions: Sequence[FolderWrite | FolderAdd]
    records: Sequence[FolderWrite | FolderAdd]


class WholeHourNeeded(Exception):
    """A batch of increments that cannot be folded on top of its hour: fold the hour whole."""


_MESSAGE_IDS = StructType([StructField("message_identifier", StringType())])
_RECORDS_NO_BUCKET = StructType([f for f in ENTITY_RECORDS.fields if f.name != BUCKET])
INDEX_DT = StructType([*INDEX.fields, StructField(PARTITION_COLUMN, StringType(), False)])


@dataclass
class Folding:
    """What a materialization folded (``how``: whole, some increments, nothing new), and its outcome."""

    outcomes: list[EntityOutcome]
    log: DataFrame
    how: str
    statuses: dict[str, int] = field(default_factory=dict)  # the log's messages per status (as text)
    # The newest receive time among the messages the hours now hold folded (``freshness``).
    received_ms: int | None = None


def fold_hours(
    spark: SparkSession,
    lake: LakeResource,
    schema: EntitySchema,
    buckets: int,
    keys: Sequence[str],
    *,
    new_only: bool,
    workers: int = DEFAULT_WORKERS,
) -> Folding:
    """Fold the run's hours whole or (``new_only``, one hour) only the increments not folded yet.

    Each hour's message log is the ledger (``FOLDED_FILE``, written after the rows): a run killed
    before it is redone by the next run (a whole hour again, or a batch of increments that includes
    the unfinished one, whose partial log rows are removed first).
    """
    plan = FoldPlan.of(lake, keys, LOG_DS, new_only=new_only, outputs=(LOG_DS, ERRORS_DS, INDEX_DS))
    received = hours_received(lake, plan.contents)
    how = "whole"
    if plan.todo == []:
        return Folding([], empty_frame(spark, MESSAGE_LOG), "nothing new", received_ms=received)
    if plan.todo:
        plan.drop_unfinished_batches(lake, (ERRORS_DS, LOG_DS, INDEX_DS))
        messages = plan.read(lake, spark, "message_store", MESSAGE_STORE)
        events = plan.read(lake, spark, "ngsi_events", NGSI_EVENTS)
        run = VersioningRun(spark, lake, schema, buckets, keys, workers=workers, batch=plan.batch)
        try:
            out = run.run(messages, events)
        except WholeHourNeeded as exc:
            how = f"whole ({exc})"
        else:
            plan.record(lake, LOG_DS)
            return Folding(out.outcomes, out.log, f"{len(plan.todo)} increments", out.statuses, received)
        plan = replace(plan, todo=None)
    messages = plan.read(lake, spark, "message_store", MESSAGE_STORE)
    events = plan.read(lake, spark, "ngsi_events", NGSI_EVENTS)
    out = VersioningRun(spark, lake, schema, buckets, keys, workers=workers).run(messages, events)
    plan.record(lake, LOG_DS)
    return Folding(out.outcomes, out.log, how, out.statuses, received)


def export_rows(table: DataFrame, definition: TargetEntity) -> DataFrame:
    """The live rows of an export entity as the export store holds them (one per key, no history).

    ``export_id`` is the ``exportIdentifier`` field's value (else the guid); the standard fields are
    kept only with ``exportStandardFields``.
    """
    business = list(definition.stored_fields)
    standard = [GUID, VALID_FROM, DELETED, SOURCE_MESSAGE] if definition.exportStandardFields else []
    ident = F.col(definition.exportIdentifier).cast("string") if definition.exportIdentifier else F.col(GUID)
    return table.where(F.col(VALID_TO).isNull() & ~F.col(DELETED)).select(
        ident.alias("export_id"), *standard, *business, BUCKET
    )


@asset(
    deps=[message_store, ngsi_events],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "parquet"},
    check_specs=[
        AssetCheckSpec("no_overlapping_validity", asset="versioned_entities"),
        AssetCheckSpec("one_open_row_per_key", asset="versioned_entities"),
        AssetCheckSpec("provenance_for_populated_fields", asset="versioned_entities"),
    ],
)
def versioned_entities(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    versioning: VersioningResource,
) -> MaterializeResult:
    """One row per version of each target-entity key: guid, valid_from/valid_to, deleted_indicator,
    business fields, source_message and field_provenance (seed 004), keyed by (guid, valid_from).

    Records from the run's hours are applied as if every message had arrived in effective-timestamp
    order; messages that fail get status 4 (error) or 1 (requires reprocessing: an unresolved link)
    in the message log, which the reprocessing sensor retries.
    """
    keys = context.partition_keys
    session = spark.spark_session
    schema = versioning.load_schema()
    folding = fold_hours(
        session,
        lake,
        schema,
        versioning.bucket_count(lake),
        keys,
        # A derived run, or an increment run that folds its own increment (NGSI_DERIVED_IN_INCREMENTS).
        new_only=folds_new_increments(context.run.tags),
        workers=side_by_side_width(context.run.tags),
    )
    outcomes, log = folding.outcomes, folding.log
    context.log.info(f"versioned entities of {keys[0]}..{keys[-1]}: folded {folding.how}")

    statuses = folding.statuses
    # Examples only where the counts show some (usually none: two Spark jobs fewer).
    examples: list[str] = []
    if statuses.get(str(int(MessageStatus.REQUIRES_REPROCESSING))):
        waiting = log.where(F.col("status") == int(MessageStatus.REQUIRES_REPROCESSING))
        examples = [r[0] for r in waiting.select("message_identifier").limit(5).collect()]
    error_examples: list[dict[str, str]] = []
    if statuses.get(str(int(MessageStatus.ERROR))):
        errors = log.where(F.col("status") == int(MessageStatus.ERROR)).select("message_identifier", "error_text")
        error_examples = [{"message": r[0], "error": r[1]} for r in errors.limit(5).collect()]
    per_entity = {
        o.name: {
            "records": o.records,
            "buckets_rewritten": o.buckets_rewritten,
            "buckets_appended": o.buckets_appended,
            "rows": o.rows_in_rewritten_buckets,
            "keys_from_latest_version": o.from_latest,
            "new_keys_added": o.new_keys,
        }
        for o in outcomes
    }
    overlapping = sum(o.overlapping for o in outcomes)
    open_bad = sum(o.open_rows_not_one for o in outcomes)
    missing = sum(o.missing_provenance for o in outcomes)
    return MaterializeResult(
        metadata={
            "dagster/row_count": sum(o.rows_in_rewritten_buckets for o in outcomes),
            "records": sum(o.records for o in outcomes),
            "folded": folding.how,
            **received_metadata(folding.received_ms),
            "keys_folded_from_latest_version": sum(o.from_latest for o in outcomes),
            "new_keys_added": sum(o.new_keys for o in outcomes),
            "entities": MetadataValue.json(per_entity),
            "messages_by_status": MetadataValue.json(statuses),
            "messages_requiring_reprocessing": int(statuses.get(str(int(MessageStatus.REQUIRES_REPROCESSING)), 0)),
            "reprocessing_examples": MetadataValue.json(examples),
            "error_examples": MetadataValue.json(error_examples),
        },
        check_results=[
            AssetCheckResult(
                check_name="no_overlapping_validity",
                passed=overlapping == 0,
                description="Per key, each version ends exactly where the next begins (rewritten buckets).",
                metadata={"rows_not_meeting_the_next": overlapping},
            ),
            AssetCheckResult(
                check_name="one_open_row_per_key",
                passed=open_bad == 0,
                description="Every key has exactly one open row (valid_to_timestamp null).",
                metadata={"keys_without_exactly_one_open_row": open_bad},
            ),
            AssetCheckResult(
                check_name="provenance_for_populated_fields",
                passed=missing == 0,
                description="Every non-null business field has an entry in field_provenance.",
                metadata={"rows_missing_provenance": missing},
            ),
        ],
    )
