"""sth_aggregates materialized through Dagster: lake datasets, MongoDB documents, reruns and backfill order."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.raw_bson import RawBSONDocument
from dagster import (
    DagsterInstance,
    Definitions,
    ExecuteInProcessResult,
    define_asset_job,
    in_process_executor,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.sth import PARTIALS, REJECTS, ROLLUPS, sth_aggregates
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.transforms import sth as sth_transforms
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from ngsi_assets.transforms.sth import STH_PARTIALS, STH_REJECTS, STH_ROLLUPS, rollup_rows
from resources.lake import LakeResource
from resources.sth_mongo import STHSinkResource
from tests.transforms.test_sth import ev, ms

H10 = "2026-03-01-10:00"
H11 = "2026-03-01-11:00"
T10 = ms(2026, 3, 1, 10, 20, 0)
T11 = ms(2026, 3, 1, 11, 5, 0)
TI_IN_10 = [{"name": "TimeInstant", "type": "DateTime", "value": "2026-03-01T10:59:00Z"}]

EVENTS = {
    H10: [
        ev("car1", "speed", "80.5", T10, mid="a1"),
        ev("car1", "speed", "-3", T10 + 1000, mid="a2"),
        ev("car1", "state", "on.line", T10, mid="a3", attr_type="Text"),
        ev("car1", "state", "\x00", T10, mid="a4", attr_type="Text"),  # rejected: NUL
        ev("car1", "state", "  ", T10, mid="a5", attr_type="Text"),  # skipped: white space
    ],
    H11: [
        ev("car1", "speed", "0.25", T11, mid="b1"),
        # received at 11:05 but measured at 10:59: lands in the 10:00 hour slot of the day document
        ev("car1", "speed", "7", T11, mid="b2", md=TI_IN_10),
        ev("car1", "state", "on.line", T11, mid="b3", attr_type="Text"),
        ev("car1", "state", "n/a", T11, mid="b4", attr_type="Text"),
    ],
}


def _write_events(spark: SparkSession, lake: Path, key: str, rows: list[tuple]) -> None:
    LakeResource(root=str(lake)).replace_partitions(spark.createDataFrame(rows, NGSI_EVENTS), "ngsi_events", [key])


def _materialize(lake: Path, key: str, sth: STHSinkResource) -> ExecuteInProcessResult:
    result = materialize(
        [sth_aggregates],
        partition_key=key,
        resources={"spark": LazyPySparkResource(spark_config={}), "lake": LakeResource(root=str(lake)), "sth": sth},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    return result


def _run(lake: Path, key: str, sth: STHSinkResource) -> tuple[dict[str, Any], dict[str, bool]]:
    result = _materialize(lake, key, sth)
    (mat,) = result.asset_materializations_for_node("sth_aggregates")
    metadata = {k: v.value for k, v in mat.metadata.items()}
    return metadata, {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


@pytest.fixture
def db_prefix(mongo_url: str) -> Iterator[str]:
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    yield prefix
    with pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=10_000) as client:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)


def test_without_mongodb_the_lake_is_computed_and_publishing_skipped(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _write_events(spark, lake, H10, EVENTS[H10])
    metadata, checks = _run(lake, H10, STHSinkResource(resolutions="hour"))
    assert metadata["published"] is False
    assert metadata["publish_skipped"] == "MongoDB not configured (set NGSI_MONGO_URL): lake aggregates only"
    assert (metadata["events"], metadata["samples"], metadata["skipped_null_or_white_space"], metadata["rejects"]) == (
        5, 3, 1, 1,
    )  # fmt: skip
    assert metadata["documents_by_action"] == {"upsert": 2}
    assert checks == {
        "day_samples_equal_hour_samples": True,
        "documents_within_mongodb_limits": True,
        "every_sample_in_aggregates_or_occur": True,
    }
    read = LakeResource(root=str(lake)).read
    partials = sorted(
        (r["idAttrName"], r["resolution"], r["offset"], r["samples"], r["sum"], r["occur"])
        for r in read(spark, PARTIALS, STH_PARTIALS).collect()
    )
    assert partials == [("speed", "hour", 10, 2, 77.5, None), ("state", "hour", 10, 1, None, {"on\uff0eline": 1})]
    rejects = [(r["messageId"], r["reason"], r["dt"]) for r in read(spark, REJECTS, STH_REJECTS).collect()]
    assert rejects == [
        ("a4", "string value contains a NUL character, which a MongoDB key (occur map) cannot hold", "2026-03-01-10")
    ]


def test_documents_over_mongodbs_limit_fail_their_check_with_examples(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a limit every document exceeds, each is counted as refused and the check lists them as
    examples (fetched only when the counts show some)."""
    monkeypatch.setattr(sth_transforms, "MAX_DOCUMENT_BYTES", 1)
    lake = tmp_path / "lake"
    _write_events(spark, lake, H10, EVENTS[H10])
    result = _materialize(lake, H10, STHSinkResource(resolutions="hour"))
    (mat,) = result.asset_materializations_for_node("sth_aggregates")
    assert mat.metadata["documents_by_action"].value == {"reject": 2}
    evaluations = {c.check_name: c for c in result.get_asset_check_evaluations()}
    limits = evaluations["documents_within_mongodb_limits"]
    assert not limits.passed
    assert limits.metadata["rejected_documents"].value == 2
    examples = limits.metadata["examples"].value
    assert sorted(e["collection"] for e in examples) == ["sth_/4wheels_car1_car.aggr"] * 2, examples
    assert all("exceeds MongoDB's 16 MiB limit" in e["reason"] for e in examples), examples
    # Nothing else is wrong with them: the other checks pass, with no example fetched.
    assert evaluations["every_sample_in_aggregates_or_occur"].passed
    assert evaluations["every_sample_in_aggregates_or_occur"].metadata["examples"].value == []


def _snapshot(url: str, prefix: str) -> list[tuple[str, str, bytes]]:
    """Every document under ``prefix`` as raw BSON bytes, database name without the prefix."""
    out = []
    with pymongo.MongoClient(url, document_class=RawBSONDocument) as client:
        for database in sorted(n for n in client.list_database_names() if n.startswith(prefix)):
            for collection in sorted(client[database].list_collection_names()):
                for doc in client[database][collection].find():
                    out.append((database[len(prefix) :], collection, doc.raw))
    return sorted(out)


@pytest.mark.integration
def test_reruns_and_backfill_order_give_byte_identical_documents(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    config = {"resolutions": "day,hour", "data_model": "dm-by-entity"}
    first, second = f"{db_prefix}a_", f"{db_prefix}b_"
    lake_a, lake_b = tmp_path / "a", tmp_path / "b"
    for lake in (lake_a, lake_b):
        for key, rows in EVENTS.items():
            _write_events(spark, lake, key, rows)

    # In order, once each.
    sth_a = STHSinkResource(mongo_url=mongo_url, db_prefix=first, **config)
    _run(lake_a, H10, sth_a)
    metadata, checks = _run(lake_a, H11, sth_a)
    assert all(checks.values()), checks
    # Reverse order, each hour twice.
    sth_b = STHSinkResource(mongo_url=mongo_url, db_prefix=second, **config)
    for key in (H11, H10, H10, H11):
        _run(lake_b, key, sth_b)
    a, b = _snapshot(mongo_url, first), _snapshot(mongo_url, second)
    assert len(a) == 4
    assert a == b

    with pymongo.MongoClient(mongo_url, tz_aware=True) as client:
        coll = client[f"{first}vehicles"]["sth_/4wheels_car1_car.aggr"]
        docs = {(d["_id"]["attrName"], d["_id"]["resolution"]): d for d in coll.find()}
    speed_hour = {p["offset"]: p for p in docs[("speed", "hour")]["points"] if p["samples"]}
    assert speed_hour == {
        10: {"offset": 10, "samples": 3, "sum": 84.5, "sum2": 80.5**2 + 9 + 49, "min": -3.0, "max": 80.5},
        11: {"offset": 11, "samples": 1, "sum": 0.25, "sum2": 0.0625, "min": 0.25, "max": 0.25},
    }
    state_day = {p["offset"]: p for p in docs[("state", "day")]["points"] if p["samples"]}
    assert state_day == {1: {"offset": 1, "samples": 3, "occur": {"n/a": 1, "on\uff0eline": 2}}}
    assert metadata["documents_written_per_collection"] == {
        f"{first}vehicles.sth_/4wheels_car1_car.aggr": {"replaced": 4, "deleted": 0}
    }


@pytest.mark.integration
def test_one_backfill_run_over_both_hours_equals_hour_by_hour(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    config = {"resolutions": "hour", "data_model": "dm-by-attribute", "enable_encoding": True}
    hourly, backfill = f"{db_prefix}h_", f"{db_prefix}b_"
    lake_h, lake_b = tmp_path / "h", tmp_path / "b"
    for lake in (lake_h, lake_b):
        for key, rows in EVENTS.items():
            _write_events(spark, lake, key, rows)
    for key in (H10, H11):
        _run(lake_h, key, STHSinkResource(mongo_url=mongo_url, db_prefix=hourly, **config))
    defs = Definitions(
        assets=[sth_aggregates],
        jobs=[define_asset_job("j", selection=[sth_aggregates], partitions_def=hourly_partitions)],
        resources={
            "spark": LazyPySparkResource(spark_config={}),
            "lake": LakeResource(root=str(lake_b)),
            "sth": STHSinkResource(mongo_url=mongo_url, db_prefix=backfill, **config),
        },
        executor=in_process_executor,
    )
    result = defs.resolve_job_def("j").execute_in_process(
        instance=DagsterInstance.ephemeral(),
        tags={ASSET_PARTITION_RANGE_START_TAG: H10, ASSET_PARTITION_RANGE_END_TAG: H11},
    )
    assert result.success
    by_hour, at_once = _snapshot(mongo_url, hourly), _snapshot(mongo_url, backfill)
    assert [(d, c) for d, c, _ in by_hour] == [
        ("vehicles", "sth_x002f4wheelsxffffcar1xffffcarxffffspeed.aggr"),
        ("vehicles", "sth_x002f4wheelsxffffcar1xffffcarxffffstate.aggr"),
    ]
    assert by_hour == at_once
    # every collection the sink created has the index the read API's queries use (dm-by-attribute keys)
    with pymongo.MongoClient(mongo_url) as client:
        for prefix in (hourly, backfill):
            for name in client[f"{prefix}vehicles"].list_collection_names():
                info = client[f"{prefix}vehicles"][name].index_information()
                assert info["cyg_agg_opt"]["key"] == [("_id.resolution", 1), ("_id.origin", 1)]


@pytest.mark.integration
def test_mixed_attribute_and_entity_delete_in_mongodb(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    """A numeric attribute that sometimes says "n/a" gives one document with both kinds; a delete adds nothing."""
    lake = tmp_path / "lake"
    rows = {
        H10: [
            ev("s1", "level", "n/a", T10, mid="m1", etype="sensor", path="/"),
            ev("s1", "level", "12", T10 + 1000, mid="m2", etype="sensor", path="/"),
            ev("s1", "level", "14", T10 + 2000, mid="m3", etype="sensor", path="/"),
        ],
        H11: [
            ev("s1", "level", "error", T11, mid="m4", etype="sensor", path="/"),
            # Orion's entityDelete notification carries the entity's last values: no sample.
            ev("s1", "level", "error", T11 + 1000, mid="m5", etype="sensor", path="/", alteration="entityDelete"),
        ],
    }
    for key, events in rows.items():
        _write_events(spark, lake, key, events)
    sth = STHSinkResource(mongo_url=mongo_url, db_prefix=db_prefix, resolutions="day,hour", data_model="dm-by-entity")
    _run(lake, H10, sth)
    metadata, checks = _run(lake, H11, sth)
    assert checks == {
        "day_samples_equal_hour_samples": True,
        "documents_within_mongodb_limits": True,
        "every_sample_in_aggregates_or_occur": True,
    }
    assert (metadata["samples"], metadata["skipped_entity_deletes"]) == (1, 1)
    assert metadata["documents_with_numbers_and_text"] == 2
    with pymongo.MongoClient(mongo_url, tz_aware=True) as client:
        # Root service path, old encoding: sth_/_<id>_<type> as Cygnus's code names it.
        coll = client[f"{db_prefix}vehicles"]["sth_/_s1_sensor.aggr"]
        docs = {d["_id"]["resolution"]: d for d in coll.find()}
    hour = {p["offset"]: p for p in docs["hour"]["points"] if p["samples"]}
    inf = float("inf")
    assert hour == {
        10: {"offset": 10, "samples": 3, "sum": 26.0, "sum2": 340.0, "min": 12.0, "max": 14.0, "occur": {"n/a": 1}},
        11: {"offset": 11, "samples": 1, "sum": 0.0, "sum2": 0.0, "min": inf, "max": -inf, "occur": {"error": 1}},
    }
    day = {p["offset"]: p for p in docs["day"]["points"] if p["samples"]}
    assert day == {
        1: {"offset": 1, "samples": 4, "sum": 26.0, "sum2": 340.0, "min": 12.0, "max": 14.0,
            "occur": {"error": 1, "n/a": 1}},
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Rollups: each document's rows in its own bucket, kept up to date hour by hour

ALL = STHSinkResource(resolutions="month,day,hour,minute,second", data_model="dm-by-entity")
D2 = "2026-03-02-09:00"
TI_FEB = [{"name": "TimeInstant", "type": "DateTime", "value": "2026-02-27T23:59:59Z"}]
D2_EVENTS = [
    ev("car1", "speed", "12", ms(2026, 3, 2, 9, 1), mid="c1", dt="2026-03-02-09"),
    ev("car1", "speed", "n/a", ms(2026, 3, 2, 9, 2), mid="c2", dt="2026-03-02-09"),
    ev("car2", "speed", "5", ms(2026, 3, 2, 9, 3), mid="c3", dt="2026-03-02-09", md=TI_FEB),
]


def _rollups(spark: SparkSession, lake: Path) -> list[tuple]:
    df = LakeResource(root=str(lake)).read_folders(spark, ROLLUPS, "bucket", None, schema=STH_ROLLUPS)
    return sorted((r["bucket"], r["part"], repr(r)) for r in df.collect()) if df is not None else []


def _rebuilt(spark: SparkSession, lake: Path) -> list[tuple]:
    """The rollups computed afresh from every hour's partials."""
    every = LakeResource(root=str(lake)).read(spark, PARTIALS, STH_PARTIALS)
    rows = rollup_rows(every, every).select(*STH_ROLLUPS.fieldNames()).collect()
    return sorted((r["bucket"], r["part"], repr(r)) for r in rows)


def test_rollups_kept_hour_by_hour_equal_a_rebuild_from_every_hour(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for key, rows in {**EVENTS, D2: D2_EVENTS}.items():
        _write_events(spark, lake, key, rows)
    for key in (H11, D2, H10, H11):
        _run(lake, key, ALL)
    got = _rollups(spark, lake)
    assert got == _rebuilt(spark, lake)
    buckets = {bucket for bucket, _, _ in got}
    assert {"month-2026", "day-2026-03", "day-2026-02", "hour-2026-03-02", "second-2026-03-01T10"} <= buckets
    # the hour loses an event: its slot's rows shrink in every bucket, still equal to a rebuild
    _write_events(spark, lake, H10, EVENTS[H10][1:])
    metadata, checks = _run(lake, H10, ALL)
    assert all(checks.values()), checks
    assert _rollups(spark, lake) == _rebuilt(spark, lake)
    assert metadata["samples"] == 2


def test_a_run_reads_no_partials_of_other_days(spark: SparkSession, tmp_path: Path) -> None:
    """A day's run rebuilds its month and year documents from the rollups, never from old hours' partials."""
    lake = tmp_path / "lake"
    for key, rows in {**EVENTS, D2: D2_EVENTS}.items():
        _write_events(spark, lake, key, rows)
    for key in (H10, H11):
        _run(lake, key, ALL)
    expected_after = tmp_path / "reference"
    for key, rows in {**EVENTS, D2: D2_EVENTS}.items():
        _write_events(spark, expected_after, key, rows)
    for key in (H10, H11, D2):
        _run(expected_after, key, ALL)
    # The first day's partials become unreadable: a run that opened them would fail.
    root = LakeResource(root=str(lake))
    for key in (H10, H11):
        folder = Path(root.partition_uri(PARTIALS, key))
        (folder / "part-99999-broken.parquet").write_bytes(b"not parquet")
    metadata, checks = _run(lake, D2, ALL)
    assert all(checks.values()), checks
    assert _rollups(spark, lake) == _rollups(spark, expected_after)
    assert {part for bucket, part, _ in _rollups(spark, lake) if bucket == "month-2026"} == {"2026-03-01", "2026-03-02"}


def test_rollups_of_a_lake_from_before_them_are_built_once_from_every_hour(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for key, rows in EVENTS.items():
        _write_events(spark, lake, key, rows)
    for key in (H10, H11):
        _run(lake, key, ALL)
    before = _rollups(spark, lake)
    shutil.rmtree(LakeResource(root=str(lake)).dataset_uri(ROLLUPS))
    _write_events(spark, lake, D2, D2_EVENTS)
    _run(lake, D2, ALL)
    after = _rollups(spark, lake)
    assert after == _rebuilt(spark, lake)
    assert set(before) < set(after)
