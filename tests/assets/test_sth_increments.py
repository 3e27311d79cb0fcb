"""Derived runs of continuous mode aggregate only the increments ``sth_aggregates`` has not aggregated:
whatever the batches, the rejects, the hour's partials (merged per slot), the documents built from the
rollups and the documents in MongoDB equal one whole-hour run; every event is aggregated once; a rerun
changes nothing; a run killed part way, then followed by a larger batch or rerun, equals an
uninterrupted one."""

from __future__ import annotations

import json
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.assets import sth as sth_module
from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.assets.sth import BATCH_ROLLUPS_PREFIX, PARTIALS, REJECTS, ROLLUPS, sth_aggregates
from ngsi_assets.increments import FOLDED_FILE
from ngsi_assets.ngsi.envelope import Envelope
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sinks import sth_mongo
from ngsi_assets.transforms.sth import STH_PARTIALS, STH_REJECTS, STH_ROLLUPS, build_documents, merge_partials
from resources.lake import LakeResource
from resources.sth_mongo import STHSinkResource
from tests.assets.test_derived_increments import HOUR_KEY, T0, Lake, _norm, _notification
from tests.assets.test_increments import land, split_into_increments

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NOW_MS = 1_800_000_000_000


def sth_tables(spark: SparkSession, lake: LakeResource, db_prefix: str = "sth_") -> dict[str, list]:
    """The hour's rejects, its partials merged per slot (batches add rows of their own) and every
    document the rollups give, as sorted rows, with the databases' prefix left out."""

    def unprefixed(df: DataFrame) -> DataFrame:
        assert df.where(~F.col("database").startswith(db_prefix)).isEmpty()
        return df.withColumn("database", F.expr(f"substring(database, {len(db_prefix) + 1})"))

    rejects = lake.read(spark, REJECTS, STH_REJECTS, [HOUR_KEY])
    partials = merge_partials(unprefixed(lake.read(spark, PARTIALS, STH_PARTIALS, [HOUR_KEY])), by=("dt",))
    rollups = lake.read_folders(spark, ROLLUPS, "bucket", None, schema=STH_ROLLUPS)
    assert rollups is not None
    rollups = unprefixed(rollups)
    documents = build_documents(rollups, STHConfig(), NOW_MS, order="part")
    return {
        name: sorted((_norm(r.asDict(recursive=True)) for r in df.collect()), key=repr)
        for name, df in (("rejects", rejects), ("partials", partials), ("documents", documents))
    }


def batch_rollup_files(lake: LakeResource) -> dict[str, int]:
    """The number of files batches added to each rollup bucket."""
    buckets = [n.removeprefix("bucket=") for n in lake.files().list_names(lake.dataset_uri(ROLLUPS)) if "=" in n]
    files = lake.folder_file_names(ROLLUPS, "bucket", buckets)
    return {b: sum(n.startswith(BATCH_ROLLUPS_PREFIX) for n in names) for b, names in files.items()}


def _derived(p: Lake) -> dict[str, Any]:
    return p.run([sth_aggregates], new_only=True, node="sth_aggregates")


def _whole(spark: SparkSession, tmp_path: Path, sth: STHSinkResource | None = None) -> tuple[dict[str, list], int]:
    whole = Lake(tmp_path, "whole", sth)
    meta = whole.run([message_store, ngsi_events, sth_aggregates], node="sth_aggregates")
    assert meta["folded"] == "whole"
    tables = sth_tables(spark, whole.lake, whole.sth.db_prefix)
    assert len(tables["documents"]) > 20 and tables["partials"]
    return tables, int(meta["events"])


def test_batches_of_increments_equal_the_whole_hour(spark: SparkSession, tmp_path: Path) -> None:
    """Random splits into increments, aggregated in random batches: the tables of one whole-hour run,
    and each event aggregated by exactly one run (the batches read only their increments' events)."""
    land(tmp_path / "landing", 40, _notification)
    expected, events = _whole(spark, tmp_path)
    for seed in (1, 2):
        rng = random.Random(seed)
        p = Lake(tmp_path, f"split{seed}")
        increments = split_into_increments(p.landing, rng, parts=6)
        runs = []
        for n, inc in enumerate(increments):
            p.run([message_store, ngsi_events], inc)
            if n == len(increments) - 1 or rng.random() < 0.5:
                runs.append(_derived(p))
        folds = [r["folded"] for r in runs]
        # The hour's first batch too (on top of an hour nothing was aggregated of).
        assert all(f.endswith("increments") for f in folds), folds
        assert len(folds) > 1, folds
        assert sum(int(r["events"]) for r in runs) == events, folds
        assert sth_tables(spark, p.lake) == expected, f"split {seed}: {folds}"
        if len(folds) > 2:
            assert max(batch_rollup_files(p.lake).values()) >= 2, "batches add files to the buckets, not rewrite them"
        # A derived run with nothing new, and an increment run again, change nothing.
        assert _derived(p)["folded"] == "nothing new"
        p.run([message_store, ngsi_events], increments[2])
        assert _derived(p)["folded"] == "nothing new"
        assert sth_tables(spark, p.lake) == expected


def test_buckets_with_too_many_batches_files_are_compacted(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one batch's files a bucket, every batch that adds to a bucket compacts it first:
    no bucket holds two batches' files, and the documents are the whole hour's."""
    monkeypatch.setattr(sth_module, "MAX_BATCH_ROLLUPS", 1)
    land(tmp_path / "landing", 40, _notification)
    expected, _ = _whole(spark, tmp_path)
    p = Lake(tmp_path, "compacted")
    folds = []
    for inc in split_into_increments(p.landing, random.Random(3), parts=5):
        p.run([message_store, ngsi_events], inc)
        folds.append(_derived(p)["folded"])
        assert max(batch_rollup_files(p.lake).values(), default=0) <= 1, folds
    assert folds == ["1 increments"] * 5, folds
    assert sth_tables(spark, p.lake) == expected


def test_an_hour_rewritten_whole_after_batches_is_aggregated_whole(spark: SparkSession, tmp_path: Path) -> None:
    """A repair rewrites the hour's events whole: the next derived run aggregates the hour whole,
    replacing the batches' files, and gives the whole run's tables."""
    land(tmp_path / "landing", 40, _notification)
    expected, _ = _whole(spark, tmp_path)
    p = Lake(tmp_path, "repaired")
    first, second, third = split_into_increments(p.landing, random.Random(7), parts=3)
    for inc in (first, second):
        p.run([message_store, ngsi_events], inc)
        _derived(p)
    assert p.lake.increment_ids(PARTIALS, HOUR_KEY), "the second run added a batch of its own"
    p.run([message_store, ngsi_events])
    p.run([message_store, ngsi_events], third)
    assert _derived(p)["folded"] == "whole"
    assert not p.lake.increment_ids(PARTIALS, HOUR_KEY)
    assert sth_tables(spark, p.lake) == expected


@pytest.fixture
def db_prefixes(mongo_url: str) -> Iterator[tuple[str, str]]:
    prefixes = (f"w{uuid.uuid4().hex[:6]}_", f"s{uuid.uuid4().hex[:6]}_")
    yield prefixes
    with pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=10_000) as client:
        for name in client.list_database_names():
            if name.startswith(prefixes):
                client.drop_database(name)


def _documents(url: str, prefix: str) -> dict[tuple[str, str, str], dict]:
    """Every STH document of the databases named with ``prefix``, by (database less prefix, collection, _id)."""
    out = {}
    with pymongo.MongoClient(url, serverSelectionTimeoutMS=10_000) as client:
        for db in client.list_database_names():
            if not db.startswith(prefix):
                continue
            for coll in client[db].list_collection_names():
                if not coll.endswith(".aggr"):
                    continue  # the ledger of the batches each collection received
                for doc in client[db][coll].find():
                    out[(db[len(prefix) :], coll, repr(_norm(doc["_id"])))] = _norm(doc)
    return out


def test_killed_batches_are_redone_and_mongodb_holds_the_whole_hours_documents(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefixes: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the batch's partials were in but before the rollups, then after the documents
    were published but before the hour's ledger: the next derived runs redo the batch with one more
    increment, or the same; the files a batch killed so left in the rollups go. The lake and MongoDB
    hold what one whole-hour run gives."""
    whole_prefix, split_prefix = db_prefixes
    land(tmp_path / "landing", 40, _notification)
    expected, events = _whole(spark, tmp_path, STHSinkResource(mongo_url=mongo_url, db_prefix=whole_prefix))
    p = Lake(tmp_path, "killed", STHSinkResource(mongo_url=mongo_url, db_prefix=split_prefix))
    a, b, c, d, e, f = split_into_increments(p.landing, random.Random(5), parts=6)
    p.run([message_store, ngsi_events], a)
    assert _derived(p)["folded"] == "1 increments"
    p.run([message_store, ngsi_events], b)

    real_together = LakeResource.replace_together

    def dies_at_the_rollups(self: LakeResource, writes: Any) -> None:
        if any(w.dataset == ROLLUPS for w in writes):
            raise RuntimeError("killed")
        real_together(self, writes)

    with monkeypatch.context() as m:
        m.setattr(LakeResource, "replace_together", dies_at_the_rollups)
        with pytest.raises(Exception, match="killed"):
            _derived(p)
    assert p.lake.increment_ids(PARTIALS, HOUR_KEY), "the killed batch left its partials"
    p.run([message_store, ngsi_events], c)
    redone = _derived(p)
    assert redone["folded"] == "2 increments"

    p.run([message_store, ngsi_events], d)
    real_write = LakeResource.write_hour_file

    def dies_at_the_ledger(self: LakeResource, dataset: str, key: str, name: str, text: str) -> None:
        if dataset == PARTIALS and name == FOLDED_FILE:
            raise RuntimeError("killed")
        real_write(self, dataset, key, name, text)

    def killed_at_the_ledger() -> None:
        with monkeypatch.context() as m:
            m.setattr(LakeResource, "write_hour_file", dies_at_the_ledger)
            with pytest.raises(Exception, match="killed"):
                _derived(p)

    killed_at_the_ledger()
    same = _derived(p)
    assert same["folded"] == "1 increments" and same["published"] is True
    p.run([message_store, ngsi_events], e)
    before = sum(batch_rollup_files(p.lake).values())
    killed_at_the_ledger()
    assert sum(batch_rollup_files(p.lake).values()) > before, "the killed batch left its rollup files"
    p.run([message_store, ngsi_events], f)
    bigger = _derived(p)
    assert bigger["folded"] == "2 increments" and bigger["published"] is True
    assert sth_tables(spark, p.lake, split_prefix) == expected
    whole_docs, split_docs = _documents(mongo_url, whole_prefix), _documents(mongo_url, split_prefix)
    assert len(whole_docs) > 20
    assert split_docs == whole_docs


def _mixed(i: int) -> Envelope:
    """Car i % 4: a speed in quarters (its sums and squares exact in binary, so additions in any
    order give the same bits), a state as text ("a.b$" every fifth: escaped keys), a level that is
    sometimes "n/a" (a document with numbers and text); every seventh message late by 2 minutes
    (its TimeInstant), and some in the next minute's slot."""
    car = f"Car{i % 4}"
    when = (T0 + i * 5_000 - (120_000 if i % 7 == 3 else 0)) / 1000
    stamp = {"type": "DateTime", "value": f"2026-03-01T10:{int(when % 3600) // 60:02d}:{when % 60:06.3f}Z"}
    level: Any = "n/a" if i % 4 == 1 else i * 0.5
    entity = {
        "id": car,
        "type": "Car",
        "speed": {"type": "Number", "value": (i % 13) * 0.25 - 1, "metadata": {}},
        "state": {"type": "Text", "value": "a.b$" if i % 5 == 0 else ("ok" if i % 2 else "stop"), "metadata": {}},
        "level": {"type": "Number", "value": level, "metadata": {}},
        "TimeInstant": stamp,
    }
    body = json.dumps({"subscriptionId": "s1", "data": [entity]}).encode()
    return Envelope(f"m{i:04d}", T0 + i * 10, "ngsi-v2", "normalized", "vehicles", "/4wheels", None, None, None,
                    "test", body)  # fmt: skip


@pytest.fixture(scope="module")
def mixed_hour(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, mongo_url: str) -> Iterator[dict]:
    """The hour of ``_mixed`` landed once, one whole-hour run of it (lake and MongoDB), and the
    documents that run wrote."""
    root = tmp_path_factory.mktemp("sth-mixed")
    land(root / "landing", 48, _mixed)
    prefix = f"w{uuid.uuid4().hex[:6]}_"
    expected, _ = _whole(spark, root, STHSinkResource(mongo_url=mongo_url, db_prefix=prefix))
    documents = _documents(mongo_url, prefix)
    assert len(documents) > 40
    yield {"root": root, "tables": expected, "documents": documents}
    _drop(mongo_url, prefix)


def _drop(url: str, prefix: str) -> None:
    with pymongo.MongoClient(url, serverSelectionTimeoutMS=10_000) as client:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)


def _dies_part_way(url: str, part_way: bool, reached: list[tuple[str, str]] | None = None) -> Any:  # noqa: ANN401
    """``add_point_updates`` that adds the batch to half its collections, then (``part_way``) some of
    one more collection's documents with the collection marked applying, and dies. The collections it
    wrote to are appended to ``reached``."""
    real = sth_module.add_point_updates
    reached = [] if reached is None else reached

    def add(updates: DataFrame, url_: str, config: STHConfig, hour: str, batch: str) -> Any:  # noqa: ANN401
        names = sorted({(r["database"], r["collection"]) for r in updates.select("database", "collection").collect()})
        half = names[: len(names) // 2]
        chosen = F.lit(False)
        for db, coll in half:
            chosen = chosen | ((F.col("database") == db) & (F.col("collection") == coll))
        real(updates.where(chosen), url_, config, hour, batch)
        reached.extend(half)
        if part_way and len(names) > len(half):
            db, coll = names[len(half)]
            reached.append((db, coll))
            rows = [r.asDict(recursive=True) for r in updates.where(
                (F.col("database") == db) & (F.col("collection") == coll)).collect()]  # fmt: skip
            with pymongo.MongoClient(url) as client:
                client[db][sth_mongo.INCREMENTS_LEDGER].replace_one(
                    {"_id": sth_mongo.ledger_id(coll, hour, batch)},
                    {"collection": coll, "hour": hour, "batch": batch, "state": sth_mongo.APPLYING},
                    upsert=True,
                )
                first = rows[: max(1, len(rows) // 2)]
                sth_mongo._add_points(client[db][coll], first, f"{db}.{coll}", config)
        raise RuntimeError("killed")

    return add


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    parts=st.integers(3, 6),
    retried=st.integers(0, 5),
    killed=st.integers(0, 5),
    part_way=st.booleans(),
)
def test_any_split_with_retries_and_a_kill_gives_the_whole_hours_documents(
    spark: SparkSession,
    mongo_url: str,
    mixed_hour: dict,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    parts: int,
    retried: int,
    killed: int,
    part_way: bool,
) -> None:
    """Continuous mode's increment runs add each batch's samples to the documents in MongoDB in place:
    whatever the split of the hour into increments, with one increment run twice and one run killed
    after MongoDB took part of its batch (some collections whole, one part way), the lake and the
    documents in MongoDB equal one whole-hour run's."""
    prefix = f"s{uuid.uuid4().hex[:6]}_"
    p = Lake(mixed_hour["root"], f"split-{prefix}", STHSinkResource(mongo_url=mongo_url, db_prefix=prefix))
    try:
        increments = split_into_increments(p.landing, random.Random(seed), parts=parts)
        retried, killed = retried % parts, killed % parts
        runs, reached = [], []
        for n, inc in enumerate(increments):
            if n == killed:
                with monkeypatch.context() as m:
                    m.setattr(sth_module, "add_point_updates", _dies_part_way(mongo_url, part_way, reached))
                    with pytest.raises(Exception, match="killed"):
                        p.run([message_store, ngsi_events, sth_aggregates], inc, node="sth_aggregates")
                if n == parts - 1:  # the last increment: its run is retried
                    runs.append(p.run([message_store, ngsi_events, sth_aggregates], inc, node="sth_aggregates"))
                continue
            runs.append(p.run([message_store, ngsi_events, sth_aggregates], inc, node="sth_aggregates"))
            if n == retried:
                again = p.run([message_store, ngsi_events, sth_aggregates], inc, node="sth_aggregates")
                assert again["folded"] == "nothing new"
        # The collections the killed batch reached in MongoDB (half of those it touched, one more part
        # way): the next batch rebuilt them, or (the hour's first batch killed: its files are the hour's
        # only ones, and no ledger says what they hold) the next run aggregated the hour whole. (A small
        # increment may touch one collection only, and reach none.)
        assert not reached or any(
            int(r.get("collections_rebuilt_whole", 0)) >= len(reached) or r["folded"] == "whole" for r in runs
        ), (reached, [(r.get("folded"), r.get("collections_rebuilt_whole")) for r in runs])
        assert any(r.get("documents_updated", 0) for r in runs), "batches were added in place"
        assert sth_tables(spark, p.lake, prefix) == mixed_hour["tables"]
        assert _documents(mongo_url, prefix) == mixed_hour["documents"]
    finally:
        _drop(mongo_url, prefix)
        shutil.rmtree(p.lake.root, ignore_errors=True)
