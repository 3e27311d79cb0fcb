"""Derived runs of continuous mode fold only the increments the versioned entities have not folded:
whatever the batches, the versioned entities, their records, the message log, the record errors and
index equal one whole-hour run; a rerun changes nothing; a run killed part way, then followed by a
larger batch or rerun, equals an uninterrupted one; a batch that cannot be folded on top of its hour
(a refresh message, an hour rewritten whole) folds the hour whole."""

from __future__ import annotations

import copy
import json
import random
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, ExecuteInProcessResult, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.assets.versioned_entities import (
    ERRORS_DS,
    INDEX_DS,
    INDEX_DT,
    LOG_DS,
    MARKS_DS,
    RECORDS_DS,
    REFRESHES_DS,
    VERSIONS_DS,
    fold_hours,
    versioned_entities,
)
from ngsi_assets.increments import (
    FOLDED_FILE,
    INCREMENT_TAG,
    NEW_INCREMENTS_TAG,
    HourContent,
    Increment,
    batch_id,
)
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.ngsi.envelope import Envelope
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from ngsi_assets.transforms.versioned_entities import MESSAGE_LOG, RECORD_ERRORS
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.spark import default_spark_config
from resources.sth_mongo import STHSinkResource
from resources.versioning import VersioningResource
from tests.assets.test_increments import land, split_into_increments
from tests.assets.test_versioning_rules import ORDERS_SCHEMA
from tests.assets.versioning_support import Msg, schema_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOUR_KEY = "2026-03-01-10:00"
T0 = 1_772_359_200_000 + 60_000  # 10:01 UTC
CARS = 5


def _notification(i: int) -> Envelope:
    """Car i % CARS: speed always, fuel every third, a delete at 17, an attribute refused (its name
    clashes with a column) at 22; every seventh message is late (its TimeInstant before what earlier
    messages told)."""
    car = f"Car{i % CARS}"
    when = (T0 + i * 5_000 - (120_000 if i % 7 == 3 else 0)) / 1000
    stamp = {"type": "DateTime", "value": f"2026-03-01T10:{int(when % 3600) // 60:02d}:{when % 60:06.3f}Z"}
    entity: dict[str, Any]
    if i == 17:
        entity = {"id": car, "type": "Car", "alterationType": {"type": "Text", "value": "entityDelete"}}
    else:
        entity = {"id": car, "type": "Car", "speed": {"type": "Number", "value": i, "metadata": {}}}
        if i % 3 == 0:
            entity["fuel"] = {"type": "Number", "value": 100 - i, "metadata": {}}
        if i == 22:
            entity["guid"] = {"type": "Text", "value": "x", "metadata": {}}
    entity["TimeInstant"] = stamp
    body = json.dumps({"subscriptionId": "s1", "data": [entity]}).encode()
    return Envelope(f"m{i:04d}", T0 + i * 10, "ngsi-v2", "normalized", "vehicles", "/4wheels", None, None, None,
                    "test", body)  # fmt: skip


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_norm(v) for v in value)
    return value


class Lake:
    """A landing zone and a lake, with the assets run by hand as the sensors' runs would."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        sth: STHSinkResource | None = None,
        instance: DagsterInstance | None = None,
    ) -> None:
        self.landing = LandingZoneResource(root=str(tmp_path / "landing"))
        self.lake = LakeResource(root=str(tmp_path / f"lake-{name}"))
        self.sth = sth or STHSinkResource()
        self.instance = instance  # None: each run on an instance of its own
        self.from_latest = 0  # keys the derived runs folded on from their latest version
        self.appended = 0  # buckets the derived runs added versions to without rewriting them

    def run(
        self,
        assets: list[Any],
        increment: Increment | None = None,
        new_only: bool = False,
        node: str = "versioned_entities",
    ) -> dict[str, Any]:
        """Materialize ``assets`` (checks must pass); the metadata of ``node``'s materialization."""
        result = self.materialize(assets, increment, new_only)
        materialized = [m for m in result.asset_materializations_for_node(node)]
        return {k: v.value for k, v in materialized[0].metadata.items()} if materialized else {}

    def materialize(
        self, assets: list[Any], increment: Increment | None = None, new_only: bool = False
    ) -> ExecuteInProcessResult:
        """Materialize ``assets`` as an increment run, a derived run (``new_only``) or a whole-hour run."""
        tags = {INCREMENT_TAG: increment.to_tag()} if increment else {}
        if new_only:
            tags[NEW_INCREMENTS_TAG] = "1"
        result = materialize(
            assets,
            partition_key=HOUR_KEY,
            tags=tags,
            resources={
                "spark": LazyPySparkResource(
                    spark_config=default_spark_config("local[2]", shuffle_partitions=4, ui=False)
                ),
                "lake": self.lake,
                "landing": self.landing,
                "versioning": VersioningResource(buckets=4),
                "sth": self.sth,
            },
            instance=self.instance or DagsterInstance.ephemeral(),
        )
        assert result.success
        assert not [c.check_name for c in result.get_asset_check_evaluations() if not c.passed]
        return result

    def derived(self) -> str:
        meta = self.run([versioned_entities], new_only=True)
        self.from_latest += int(meta.get("keys_folded_from_latest_version", 0))
        self.appended += sum(int(e["buckets_appended"]) for e in meta.get("entities", {}).values())
        return str(meta["folded"])

    def tables(self, spark: SparkSession) -> dict[str, list]:
        return lake_tables(spark, self.lake)


def lake_tables(spark: SparkSession, lake: LakeResource) -> dict[str, list]:
    """Every table the versioned entities write, as sorted rows (the record index as a set: a batch
    may name a bucket an earlier batch named too), and the marks of their records' latest times."""
    out: dict[str, list] = {}
    for ds in (VERSIONS_DS, RECORDS_DS, MARKS_DS):
        for entity in lake.files().list_names(lake.dataset_uri(ds)):
            if entity.startswith(("_", ".")):
                continue
            df = lake.read_folders(spark, ds, "bucket", None, subfolder=entity)
            assert df is not None
            out[f"{ds}/{entity}"] = sorted((_norm(r.asDict()) for r in df.collect()), key=repr)
    for ds, schema in ((LOG_DS, MESSAGE_LOG), (ERRORS_DS, RECORD_ERRORS)):
        rows = lake.read(spark, ds, schema, [HOUR_KEY]).collect()
        out[ds] = sorted((_norm(r.asDict()) for r in rows), key=repr)
    index = lake.read(spark, INDEX_DS, INDEX_DT, [HOUR_KEY]).collect()
    out[INDEX_DS] = sorted({_norm(r.asDict()) for r in index}, key=repr)
    return out


def _whole(spark: SparkSession, tmp_path: Path) -> dict[str, list]:
    whole = Lake(tmp_path, "whole")
    assert whole.run([message_store, ngsi_events, versioned_entities])["folded"] == "whole"
    tables = whole.tables(spark)
    assert len(tables[LOG_DS]) == 40
    assert len(tables[ERRORS_DS]) == 1, "the attribute named guid makes a record error"
    assert sum(len(v) for k, v in tables.items() if k.startswith(VERSIONS_DS)) > CARS
    return tables


WholeHour = tuple[Path, dict[str, list]]


@pytest.fixture(scope="module")
def whole_hour(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> WholeHour:
    """The hour of ``_notification`` landed once and the tables of one whole-hour run of it, which
    most tests here compare with: one whole run for the module, not one per test."""
    root = tmp_path_factory.mktemp("whole-hour")
    land(root / "landing", 40, _notification)
    return root / "landing", _whole(spark, root)


def _landed(whole_hour: WholeHour, tmp_path: Path) -> dict[str, list]:
    """That landing copied (the same segment files) to ``tmp_path``; the whole-hour tables."""
    shutil.copytree(whole_hour[0], tmp_path / "landing")
    return copy.deepcopy(whole_hour[1])


def test_batches_of_increments_equal_the_whole_hour(spark: SparkSession, whole_hour: WholeHour, tmp_path: Path) -> None:
    """Random splits into increments, folded in random batches, give the tables of one whole-hour run;
    every batch, the hour's first too, is folded on top of the hour, not the hour again."""
    expected = _landed(whole_hour, tmp_path)
    for seed in (1, 2):
        rng = random.Random(seed)
        p = Lake(tmp_path, f"split{seed}")
        increments = split_into_increments(p.landing, rng, parts=6)
        folds = []
        for n, inc in enumerate(increments):
            p.run([message_store, ngsi_events], inc)
            if n == len(increments) - 1 or rng.random() < 0.5:
                folds.append(p.derived())
        assert all(f.endswith("increments") for f in folds), folds
        assert sum(int(f.split()[0]) for f in folds[1:]) > 1, folds
        assert p.from_latest > 0, "in-order keys of a batch go on from their latest version"
        assert p.appended > 0, "a bucket whose batch keys all go on from their latest version is added to"
        assert p.tables(spark) == expected, f"split {seed}: {folds}"
        # A derived run with nothing new, and an increment run again, change nothing.
        assert p.derived() == "nothing new"
        p.run([message_store, ngsi_events], increments[2])
        assert p.derived() == "nothing new"
        assert p.tables(spark) == expected


def test_increment_runs_that_fold_their_own_increment_equal_the_whole_hour(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path
) -> None:
    """With NGSI_DERIVED_IN_INCREMENTS the increment runs hold the versioned entities: each folds its
    own increment (tagged ngsi/increment, no derived run) and the tables equal one whole-hour run; an
    increment run again folds nothing new and changes nothing."""
    expected = _landed(whole_hour, tmp_path)
    p = Lake(tmp_path, "in-increments")
    increments = split_into_increments(p.landing, random.Random(3), parts=5)
    folded = [p.run([message_store, ngsi_events, versioned_entities], inc)["folded"] for inc in increments]
    assert folded == ["1 increments"] * len(increments)
    assert p.tables(spark) == expected
    assert p.run([message_store, ngsi_events, versioned_entities], increments[1])["folded"] == "nothing new"
    assert p.tables(spark) == expected


def _first_of_four_folded(whole_hour: WholeHour, tmp_path: Path, name: str) -> tuple[Lake, dict[str, list], list]:
    """The whole hour's tables; a lake with the first of four increments folded; the other three."""
    expected = _landed(whole_hour, tmp_path)
    p = Lake(tmp_path, name)
    a, *rest = split_into_increments(p.landing, random.Random(5), parts=4)
    p.run([message_store, ngsi_events], a)
    assert p.derived() == "1 increments"
    return p, expected, rest


def test_a_batch_killed_part_way_is_redone_by_the_next_run(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the versions and some of the batch's log rows were written: the next derived run
    (with one more increment) folds the unfinished increments again, with no row twice. Killed after
    every row but before the hour's record of them: the same batch again."""
    p, expected, (b, c, d) = _first_of_four_folded(whole_hour, tmp_path, "killed")
    p.run([message_store, ngsi_events], b)

    real_append = LakeResource.append_increment

    def dies_at_the_index(self: LakeResource, df: Any, dataset: str, *args: Any, **kwargs: Any) -> None:
        if dataset == INDEX_DS:
            raise RuntimeError("killed")
        real_append(self, df, dataset, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(LakeResource, "append_increment", dies_at_the_index)
        with pytest.raises(Exception, match="killed"):
            p.run([versioned_entities], new_only=True)
    assert p.lake.increment_ids(LOG_DS, HOUR_KEY), "the killed batch left log rows"
    p.run([message_store, ngsi_events], c)
    assert p.derived() == "2 increments"

    p.run([message_store, ngsi_events], d)
    real_write = LakeResource.write_hour_file

    def dies_at_the_record(self: LakeResource, dataset: str, key: str, name: str, text: str) -> None:
        if name == FOLDED_FILE:
            raise RuntimeError("killed")
        real_write(self, dataset, key, name, text)

    with monkeypatch.context() as m:
        m.setattr(LakeResource, "write_hour_file", dies_at_the_record)
        with pytest.raises(Exception, match="killed"):
            p.run([versioned_entities], new_only=True)
    assert p.derived() == "1 increments"
    assert p.tables(spark) == expected


def _delta_files(lake: LakeResource) -> list[str]:
    """``<dataset>/<bucket folder>/<batch>`` of every batch's file, once per batch and bucket."""
    return sorted(
        {
            f"{ds}/{p.parent.name}/{p.name.split('-')[1]}"
            for ds in (VERSIONS_DS, RECORDS_DS)
            for p in Path(lake.dataset_uri(ds)).rglob("delta-*.parquet")
        }
    )


def test_a_batch_killed_between_its_versions_and_its_records_is_redone_by_the_next_run(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch added its versions to some buckets and died before adding its records there: the next
    run (the same batch again, then one more increment) folds them again, and the tables equal one
    whole-hour run. So does a batch that dies after adding its records too."""
    p, expected, (b, c, d) = _first_of_four_folded(whole_hour, tmp_path, "between")
    real_add = LakeResource._add_in

    def dies_at(dataset: str) -> Any:
        def add_in(self: LakeResource, add: Any, *args: Any) -> None:
            real_add(self, add, *args)
            if add.dataset == dataset:
                raise RuntimeError("killed")

        return add_in

    for increment, dataset in ((b, VERSIONS_DS), (c, RECORDS_DS)):
        p.run([message_store, ngsi_events], increment)
        with monkeypatch.context() as m:
            m.setattr(LakeResource, "_add_in", dies_at(dataset))
            with pytest.raises(Exception, match="killed"):
                p.run([versioned_entities], new_only=True)
        assert any(f.startswith(VERSIONS_DS) for f in _delta_files(p.lake)), "the killed batch added versions"
        assert p.derived() == "1 increments"
    p.run([message_store, ngsi_events], d)
    assert p.derived() == "1 increments"
    assert p.tables(spark) == expected


def test_a_batch_killed_after_its_marks_is_redone_by_the_next_run(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch wrote its records' latest times (its first write) and died before its versions and
    records: the marks are later than the records, and the next run (the same batch again, with one
    more increment) equals one whole-hour run."""
    p, expected, (b, c, d) = _first_of_four_folded(whole_hour, tmp_path, "marked")
    real_swap = LakeResource._swap_in_subfolders

    def swap_in(self: LakeResource, dataset: str, *args: Any) -> None:
        # Every default entity's marks: one write, committed first (``process_together``).
        real_swap(self, dataset, *args)
        if dataset == MARKS_DS:
            raise RuntimeError("killed")

    p.run([message_store, ngsi_events], b)
    before = p.tables(spark)
    with monkeypatch.context() as m:
        m.setattr(LakeResource, "_swap_in_subfolders", swap_in)
        with pytest.raises(Exception, match="killed"):
            p.run([versioned_entities], new_only=True)
    after = p.tables(spark)
    changed = sorted(k for k in after if after[k] != before.get(k))
    assert changed and all(k.startswith(MARKS_DS) for k in changed), changed
    p.run([message_store, ngsi_events], c)
    assert p.derived() == "2 increments"
    p.run([message_store, ngsi_events], d)
    assert p.derived() == "1 increments"
    assert p.tables(spark) == expected


def test_a_lake_without_marks_is_folded_from_its_records(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path
) -> None:
    """Buckets written before marks were kept (no marks folder): a batch takes its keys' latest times
    from their records, still folds keys on from their latest version, and writes the marks."""
    p, expected, (b, c, d) = _first_of_four_folded(whole_hour, tmp_path, "unmarked")
    for increment in (b, c, d):
        p.lake.files().delete(p.lake.dataset_uri(MARKS_DS))
        p.run([message_store, ngsi_events], increment)
        assert p.derived() == "1 increments"
    assert p.from_latest > 0
    assert p.tables(spark) == expected


def test_a_batch_reads_no_stored_row_of_the_buckets_it_adds_to(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that adds to a bucket reads the bucket's marks and open rows, not its stored records or
    versions: its cost follows the bucket's keys, not their history."""
    p, expected, increments = _first_of_four_folded(whole_hour, tmp_path, "reads")
    real_read = LakeResource.read_folders
    read: list[tuple[str, str]] = []

    def read_folders(self: LakeResource, spark: SparkSession, dataset: str, column: str, values: Any, **kw: Any) -> Any:
        if values is not None:
            read.extend((dataset, f"bucket={v}") for v in values)
        return real_read(self, spark, dataset, column, values, **kw)

    added = 0
    for increment in increments:
        p.run([message_store, ngsi_events], increment)
        before = set(_delta_files(p.lake))
        read.clear()
        with monkeypatch.context() as m:
            m.setattr(LakeResource, "read_folders", read_folders)
            assert p.derived() == "1 increments"
        appended = {f.rsplit("/", 1)[0].split("/", 1)[1] for f in set(_delta_files(p.lake)) - before}
        added += len(appended)
        stored = {bucket for ds, bucket in read if ds in (VERSIONS_DS, RECORDS_DS)}
        assert not stored & appended, (sorted(stored), sorted(appended))
    assert added > 0, "some batch added to a bucket"
    assert p.tables(spark) == expected


def _old_then_new_cars(i: int) -> Envelope:
    """In-order speeds: the first 20 of Car0..Car4, the next 20 of New0..New9 (cars never seen before)."""
    car = f"Car{i % CARS}" if i < 20 else f"New{i % 10}"
    entity = {"id": car, "type": "Car", "speed": {"type": "Number", "value": i, "metadata": {}}}
    body = json.dumps({"subscriptionId": "s1", "data": [entity]}).encode()
    return Envelope(f"n{i:04d}", T0 + i * 1_000, "ngsi-v2", "normalized", "vehicles", "/4wheels", None, None, None,
                    "test", body)  # fmt: skip


def test_a_batch_of_new_keys_adds_them_to_their_buckets(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose keys were never stored folds only their records and adds them to their buckets:
    it reads no stored record or version of those buckets, and the tables equal one whole-hour run."""
    land(tmp_path / "landing", 40, _old_then_new_cars)
    whole = Lake(tmp_path, "whole")
    assert whole.run([message_store, ngsi_events, versioned_entities])["folded"] == "whole"
    expected = whole.tables(spark)
    p = Lake(tmp_path, "new-keys")
    ranges = p.landing.complete_ranges([HOUR_KEY])
    root = Path(p.landing.root)
    old_cars, new_cars = (
        Increment.of({n: r for n, r in ranges.items() if (b"New" in (root / n).read_bytes()) is new})
        for new in (False, True)
    )
    p.run([message_store, ngsi_events], old_cars)
    p.derived()
    p.run([message_store, ngsi_events], new_cars)
    real_read = LakeResource.read_folders
    read: list[str] = []

    def read_folders(self: LakeResource, spark: SparkSession, dataset: str, column: str, values: Any, **kw: Any) -> Any:
        if dataset in (VERSIONS_DS, RECORDS_DS) and values is not None:  # (None: the columns, ``fields_of``)
            read.extend(f"bucket={v}" for v in values)
        return real_read(self, spark, dataset, column, values, **kw)

    before = set(_delta_files(p.lake))
    with monkeypatch.context() as m:
        m.setattr(LakeResource, "read_folders", read_folders)
        meta = p.run([versioned_entities], new_only=True)
    assert meta["new_keys_added"] == 10 and meta["keys_folded_from_latest_version"] == 0, meta
    appended = {f.rsplit("/", 1)[0].split("/", 1)[1] for f in set(_delta_files(p.lake)) - before}
    assert appended, "the new cars' versions were added to buckets the old cars' are in"
    assert not set(read) & appended, (sorted(read), sorted(appended))
    assert p.tables(spark) == expected


def test_a_bucket_with_too_many_batches_files_merges_them(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one batch's files (and one merge's) in a bucket, the next batch that adds to it
    merges the earlier batch's files into one of the next level: no bucket ever holds two files' ids
    of a level, and the tables equal one whole-hour run."""
    monkeypatch.setattr("ngsi_assets.assets.versioned_entities.MAX_DELTAS", 1)
    expected = _landed(whole_hour, tmp_path)
    p = Lake(tmp_path, "compacted")
    increments = split_into_increments(p.landing, random.Random(3), parts=6)
    most, levels = 0, set()
    for inc in increments:
        p.run([message_store, ngsi_events], inc)
        p.derived()
        for ds in (VERSIONS_DS, RECORDS_DS):
            for bucket in Path(p.lake.dataset_uri(ds)).glob("*/bucket=*"):
                ids: dict[str, set[str]] = {}
                for f in bucket.glob("*.parquet"):
                    if f.name.startswith(("delta-", "merged")):
                        level, batch = f.name.split("-")[:2]
                        ids.setdefault(level, set()).add(batch)
                levels |= set(ids)
                most = max([most, *(len(b) for b in ids.values())])
    assert p.tables(spark) == expected
    assert p.appended > 0
    assert most == 1
    assert {"delta", "merged1"} <= levels, levels


def _first_half_folded(whole_hour: WholeHour, tmp_path: Path, seed: int) -> tuple[Lake, dict[str, list], Increment]:
    """The whole hour's tables; a lake with the first of two increments folded; the second increment."""
    expected = _landed(whole_hour, tmp_path)
    p = Lake(tmp_path, f"half{seed}")
    first, second = split_into_increments(p.landing, random.Random(seed), parts=2)
    p.run([message_store, ngsi_events], first)
    assert p.derived() == "1 increments"
    return p, expected, second


def test_an_hour_rewritten_whole_is_folded_whole_again(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path
) -> None:
    p, expected, second = _first_half_folded(whole_hour, tmp_path, 9)
    # A repair rewrites the hour's message store and events whole (its versioning step never ran).
    p.run([message_store, ngsi_events])
    p.run([message_store, ngsi_events], second)
    assert p.derived() == "whole"
    assert p.tables(spark) == expected


def test_an_hour_with_rows_but_no_ledger_is_folded_whole(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path
) -> None:
    """An hour's first derived run folds its increments as a batch only when nothing of the hour is
    stored: a whole fold or a first batch killed before writing the ledger left rows of the hour, and
    the next run folds the hour whole (a batch would keep them beside its own)."""
    p, expected, second = _first_half_folded(whole_hour, tmp_path, 6)
    ledger = f"{p.lake.partition_uri(LOG_DS, HOUR_KEY)}/{FOLDED_FILE}"
    p.lake.files().delete(ledger)  # the first batch, killed after its rows
    p.run([message_store, ngsi_events], second)
    assert p.derived() == "whole"
    assert p.tables(spark) == expected
    p.lake.files().delete(ledger)  # that whole fold, killed after its rows
    assert p.derived() == "whole"
    assert p.tables(spark) == expected


def test_an_increment_whose_events_are_not_all_in_waits_for_the_next_run(
    spark: SparkSession, whole_hour: WholeHour, tmp_path: Path
) -> None:
    """The message store has the increment's rows, its events are not marked done: neither a batch nor a
    whole-hour fold reads it (its messages would be logged with no records)."""
    p, expected, second = _first_half_folded(whole_hour, tmp_path, 4)
    p.run([message_store], second)  # the increment run is between its two steps
    assert p.derived() == "nothing new"
    assert p.run([versioned_entities])["folded"] == "whole"
    logged = p.tables(spark)[LOG_DS]
    assert 0 < len(logged) < 40
    p.run([message_store, ngsi_events], second)
    assert p.derived() == "1 increments"
    assert p.tables(spark) == expected


def add_increment(spark: SparkSession, lake: LakeResource, increment: str, msgs: list[Msg]) -> None:
    """Data-hub messages added to the hour as an increment's files, its events marked done."""
    rows = [m.row(minute=int(m.mid[1:]) % 60) for m in msgs]
    lake.append_increment(spark.createDataFrame(rows, MESSAGE_STORE), "message_store", HOUR_KEY, increment)
    lake.mark_increment_done("ngsi_events", HOUR_KEY, increment)


SHOP_DOC: dict[str, Any] = {
    "entities": {
        "customer": {"fields": {"customer_number": {"type": "text", "key": True}, "customer_name": {"type": "text"}}},
        "order": {
            "fields": {
                "order_number": {"type": "integer", "key": True},
                "order_customer": {"type": "link", "linkEntity": "customer", "linkKey": ["customer_number"]},
                "total": {"type": "decimal", "precision": 8, "scale": 2},
                "placed": {"type": "timestamp"},
            }
        },
    }
}


def _shop_messages(rng: random.Random) -> list[Msg]:
    """Customers first (an order's link resolves against the table when its batch is folded), then
    orders: inserts, updates of few fields, deletes, messages late by minutes, an unknown customer
    (status 1), a total that does not convert (status 4)."""
    msgs = [
        Msg(
            "m000",
            "customer",
            "2026-03-01T09:00:00",
            [{"customer_number": f"C{c}", "customer_name": f"n{c}"} for c in range(3)],
        )
    ]
    for i in range(1, 36):
        minute = i + (-15 if i % 6 == 5 else 0)
        order = rng.randrange(8)
        record: dict[str, Any] = {"order_number": order}
        if i % 9 == 4:
            record["deleted_indicator"] = True
        else:
            record["customer_number"] = f"C{rng.randrange(4)}"  # C3 does not exist
            record["total"] = "lots" if i == 17 else f"{rng.randrange(10000) / 100:.2f}"
            if i % 2:
                record["placed"] = f"2026-03-01T08:{i:02d}:00Z"
        msgs.append(Msg(f"m{i:03d}", "order", f"2026-03-01T10:{20 + minute:02d}:00", [record]))
    return msgs


def test_batches_of_schema_entities_equal_the_whole_hour(spark: SparkSession, tmp_path: Path) -> None:
    """Links, typed fields, deletes, late and failing messages of schema entities: folded in random
    batches of random increments, the tables equal one whole-hour fold of the same messages."""
    schema = schema_of(SHOP_DOC)
    msgs = _shop_messages(random.Random(11))
    whole = LakeResource(root=str(tmp_path / "whole"))
    add_increment(spark, whole, "00", msgs)
    assert fold_hours(spark, whole, schema, 4, [HOUR_KEY], new_only=False).how == "whole"
    expected = lake_tables(spark, whole)
    logged = {r[2][1]: r[4][1] for r in expected[LOG_DS]}  # message -> status
    assert sorted(set(logged.values())) == [1, 3, 4], logged
    for seed in (1, 2):
        rng = random.Random(seed)
        lake = LakeResource(root=str(tmp_path / f"split{seed}"))
        cuts = sorted(rng.sample(range(2, len(msgs)), 5))
        parts = [msgs[a:b] for a, b in zip([0, *cuts], [*cuts, len(msgs)], strict=True)]
        folds = []
        for n, part in enumerate(parts):
            add_increment(spark, lake, f"{n + 1:02d}", part)
            if n == 0 or n == len(parts) - 1 or rng.random() < 0.5:
                folds.append(fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True).how)
        assert all(f.endswith("increments") for f in folds), folds
        assert lake_tables(spark, lake) == expected, f"split {seed}: {folds}"


def test_a_batch_with_parents_of_children_folds_its_hour_whole(spark: SparkSession, tmp_path: Path) -> None:
    """A parent record replaces its children (a child refresh, stored with the hour's refreshes)."""
    schema = ORDERS_SCHEMA  # order_lines: children of order
    lake = LakeResource(root=str(tmp_path / "lake"))
    lines = [{"product": "a"}, {"product": "b"}]
    add_increment(
        spark, lake, "aa", [Msg("m001", "order", "2026-03-01T10:00:00", [{"order_number": 1, "order_lines": lines}])]
    )
    assert fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True).how.startswith("whole (records of order")
    add_increment(
        spark,
        lake,
        "bb",
        [Msg("m002", "order", "2026-03-01T10:05:00", [{"order_number": 1, "order_lines": lines[:1]}])],
    )
    folding = fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True)
    assert folding.how == "whole (records of order, whose children they replace)"
    table = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder("order_line"))
    assert table is not None
    live = table.where("valid_to_timestamp IS NULL AND NOT deleted_indicator").collect()
    # This failed in about 1 run in 15 (CI, 2026-11-26), b left live; what the fold saw, to find out why.
    assert [r["product"] for r in live] == ["a"], _folded_state(spark, lake, "order_line")


def _folded_state(spark: SparkSession, lake: LakeResource, entity: str) -> str:
    """An entity's versions, records and refresh events as stored, and the hour's files, for a failure message."""
    lines = []
    for ds, column in ((VERSIONS_DS, "bucket"), (RECORDS_DS, "bucket"), (REFRESHES_DS, "dt")):
        frame = lake.read_folders(spark, ds, column, None, subfolder=entity_folder(entity))
        rows = [] if frame is None else frame.collect()
        lines += [f"{ds}:", *(f"  {r.asDict()}" for r in rows)]
    for ds in ("message_store", "ngsi_events", LOG_DS):
        lines.append(f"{ds}: {lake.files().list_names(lake.partition_uri(ds, HOUR_KEY))}")
    return "\n".join(lines)


def test_a_batch_with_a_refresh_message_folds_its_hour_whole(spark: SparkSession, tmp_path: Path) -> None:
    """Data-hub messages added to the hour as increments; the second brings a refresh, which deletes
    every live key it does not name wherever stored: its hour is folded whole."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    fields = {
        "product_number": {"type": "integer", "key": True},
        "price": {"type": "decimal", "precision": 8, "scale": 2},
    }
    schema = schema_of({"entities": {"product": {"fields": fields}}})
    msgs = [
        Msg(
            "a1",
            "product",
            "2026-03-01T10:00:00",
            [{"product_number": 1, "price": 1}, {"product_number": 2, "price": 2}],
        ),
        Msg("a2", "product", "2026-03-01T10:05:00", [{"product_number": 3, "price": 3}]),
        Msg("b1", "product", "2026-03-01T10:10:00", [{"product_number": 1, "price": 5}], refresh=True),
    ]

    add_increment(spark, lake, "aa", msgs[:2])
    assert fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True).how == "1 increments"
    add_increment(spark, lake, "bb", msgs[2:])
    folding = fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True)
    assert folding.how == "whole (a refresh message is among the increments)"
    table = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder("product"))
    assert table is not None
    live = table.where("valid_to_timestamp IS NULL AND NOT deleted_indicator").collect()
    assert {r["product_number"]: r["price"] for r in live} == {1: Decimal("5.00")}
    folded = HourContent.from_text(lake.read_hour_file(LOG_DS, HOUR_KEY, FOLDED_FILE))
    assert folded is not None and folded.increments == {"aa", "bb"} and not folded.batches


def test_events_rewritten_whole_then_an_increment_fold_every_message(spark: SparkSession, tmp_path: Path) -> None:
    """The events of an hour rewritten whole (a backfill of ngsi_events alone) cover the message store's
    increments, whose own marks the rewrite drops; an increment after it must not hide them (here
    data-hub messages, which the versioning reads from the message store) from the next fold."""
    schema = schema_of(SHOP_DOC)
    msgs = _shop_messages(random.Random(3))
    whole = LakeResource(root=str(tmp_path / "whole"))
    add_increment(spark, whole, "00", msgs)
    fold_hours(spark, whole, schema, 4, [HOUR_KEY], new_only=False)
    lake = LakeResource(root=str(tmp_path / "lake"))
    add_increment(spark, lake, "01", msgs[:20])
    assert fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True).how == "1 increments"
    spark_resource = LazyPySparkResource(spark_config=default_spark_config("local[2]", shuffle_partitions=4, ui=False))
    resources = {"spark": spark_resource, "lake": lake}
    assert materialize([ngsi_events], partition_key=HOUR_KEY, resources=resources).success
    add_increment(spark, lake, "02", msgs[20:])
    # Data-hub messages give no events: the rewrite left the events' whole-hour files as they were.
    assert fold_hours(spark, lake, schema, 4, [HOUR_KEY], new_only=True).how == "1 increments"
    assert lake_tables(spark, lake) == lake_tables(spark, whole)


def test_hour_content_says_what_to_fold_on_top() -> None:
    whole = {"message_store": ["part-1.parquet"], "ngsi_events": ["part-2.parquet"]}
    folded = HourContent(whole, frozenset({"a1"}))
    assert folded.new_increments(HourContent(whole, frozenset({"a1", "b2", "c3"}))) == ["b2", "c3"]
    assert folded.new_increments(HourContent(whole, frozenset({"a1"}))) == []
    # Rewritten whole since: new whole-hour files, or an increment folded before is gone.
    assert folded.new_increments(HourContent({**whole, "ngsi_events": ["part-9.parquet"]}, frozenset({"a1"}))) is None
    assert folded.new_increments(HourContent(whole, frozenset({"b2"}))) is None
    after = folded.with_batch(["c3", "b2"])
    assert after.batches == {batch_id(["b2", "c3"])} and after.increments == {"a1", "b2", "c3"}
    assert HourContent.from_text(after.to_text()) == after
    for damaged in (None, "", "{", '{"whole": 3}', "[]"):
        assert HourContent.from_text(damaged) is None
