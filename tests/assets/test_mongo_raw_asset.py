"""mongo_raw materialized through Dagster against a real MongoDB-wire server: Cygnus NGSIMongoSink documents."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import ObjectId
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.mongo_raw import NOT_ENABLED, REJECTS, mongo_raw
from ngsi_assets.transforms.mongo_raw import MONGO_RAW_REJECTS
from resources.lake import LakeResource
from resources.mongo_raw import MongoRawSinkResource
from tests.assets.test_sth_assets import H10, H11, T10, T11, _write_events
from tests.transforms.test_sth import ev

TI = [{"name": "TimeInstant", "type": "DateTime", "value": "2026-03-01T10:19:58.250Z"}]
ROWS = [
    ev("car1", "speed", "80.5", T10, mid="a1", md=TI),
    ev("car1", "state", "on", T10, mid="a1", attr_type="Text"),
    ev("car1", "code", "42", T10, mid="a1", attr_type="Text"),
    ev("car1", "count", "7", T10, mid="a1", attr_type="Integer"),
    ev("car1", "ok", "true", T10, mid="a1", attr_type="Boolean"),
    ev("car1", "where", '{"type":"Point","coordinates":[1.5,2]}', T10, mid="a1", attr_type="geo:json"),
    ev("car1", "seen", "2026-03-01T10:00:00Z", T10, mid="a1", attr_type="DateTime"),
    ev("car1", "gone", None, T10, mid="a1", attr_type="Number"),
    ev("car2", "speed", "12", T10 + 1500, mid="a2"),
    # an entityDelete repeats the last values: no raw document
    ev("car2", "speed", "12", T10 + 2000, mid="a3", alteration="entityDelete"),
]
RECV = datetime.fromtimestamp(T10 / 1000, UTC)


def _run(lake: Path, sink: MongoRawSinkResource, key: str = H10) -> tuple[dict[str, Any], dict[str, bool]]:
    result = materialize(
        [mongo_raw],
        partition_key=key,
        resources={
            "spark": LazyPySparkResource(spark_config={}),
            "lake": LakeResource(root=str(lake)),
            "mongo_raw_sink": sink,
        },
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("mongo_raw")
    return {k: v.value for k, v in mat.metadata.items()}, {
        c.check_name: c.passed for c in result.get_asset_check_evaluations()
    }


@pytest.fixture
def db_prefix(mongo_url: str) -> Iterator[str]:
    prefix = f"r{uuid.uuid4().hex[:8]}_"
    yield prefix
    with pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=10_000) as client:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)


def _collections(url: str, prefix: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    with pymongo.MongoClient(url, tz_aware=True) as client:
        for database in sorted(n for n in client.list_database_names() if n.startswith(prefix)):
            for collection in sorted(client[database].list_collection_names()):
                out[f"{database}.{collection}"] = list(client[database][collection].find().sort("_id", 1))
    return out


def test_off_unless_enabled(spark: SparkSession, tmp_path: Path) -> None:
    metadata, checks = _run(tmp_path / "lake", MongoRawSinkResource())
    assert metadata == {"skipped": NOT_ENABLED}
    assert checks == {"every_raw_document_acknowledged": True}


def test_enabled_without_a_server_is_refused() -> None:
    with pytest.raises(ValueError, match="enabled but no MongoDB URL is set"):
        MongoRawSinkResource(enabled=True)
    with pytest.raises(ValueError, match="NGSI_MONGO_RAW_ENABLED='maybe': expected true or false"):
        MongoRawSinkResource.from_env({"NGSI_MONGO_RAW_ENABLED": "maybe"})


@pytest.mark.integration
def test_row_mode_documents_as_cygnus_writes_them(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    lake = tmp_path / "lake"
    _write_events(spark, lake, H10, ROWS)
    sink = MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=db_prefix)
    metadata, checks = _run(lake, sink)
    assert checks == {"every_raw_document_acknowledged": True}
    assert (metadata["documents"], metadata["documents_inserted"], metadata["documents_already_stored"]) == (9, 9, 0)
    stored = _collections(mongo_url, db_prefix)
    assert sorted(stored) == [
        f"{db_prefix}vehicles.sth_/4wheels_car1_car",
        f"{db_prefix}vehicles.sth_/4wheels_car2_car",
    ]
    car1 = {d["attrName"]: d for d in stored[f"{db_prefix}vehicles.sth_/4wheels_car1_car"]}
    # dm-by-entity, row mode: attrName, attrType, attrValue, recvTime (no entity fields, no metadata)
    assert list(car1["speed"]) == ["_id", "attrName", "attrType", "attrValue", "recvTime"]
    assert car1["speed"]["attrValue"] == 80.5
    # recvTime is the attribute's TimeInstant when it has one, else the receive time
    assert car1["speed"]["recvTime"] == datetime(2026, 3, 1, 10, 19, 58, 250000, tzinfo=UTC)
    assert car1["state"]["recvTime"] == RECV
    assert car1["state"]["attrValue"] == "on"
    assert car1["code"]["attrValue"] == "42"  # Text stays text even when it looks like a number
    assert car1["count"]["attrValue"] == 7 and isinstance(car1["count"]["attrValue"], int)
    assert car1["ok"]["attrValue"] is True
    assert car1["where"]["attrValue"] == {"type": "Point", "coordinates": [1.5, 2]}
    assert car1["seen"]["attrValue"] == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)  # Cygnus's castDate
    assert "attrValue" not in car1["gone"]  # Cygnus leaves out null fields
    # the _id is an ObjectId of the receive second: what MongoDB would have given it, but repeatable
    assert isinstance(car1["speed"]["_id"], ObjectId)
    assert car1["speed"]["_id"].generation_time == RECV.replace(microsecond=0)

    again, _ = _run(lake, sink)
    assert (again["documents"], again["documents_inserted"], again["documents_already_stored"]) == (9, 0, 9)
    assert _collections(mongo_url, db_prefix) == stored


@pytest.mark.integration
def test_column_mode_by_service_path_with_metadata(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    lake = tmp_path / "lake"
    _write_events(spark, lake, H10, ROWS)
    sink = MongoRawSinkResource(
        enabled=True,
        mongo_url=mongo_url,
        db_prefix=db_prefix,
        data_model="dm-by-service-path",
        attr_persistence="column",
        attr_metadata_store=True,
    )
    metadata, checks = _run(lake, sink)
    assert checks == {"every_raw_document_acknowledged": True}
    assert metadata["documents"] == 2
    (docs,) = _collections(mongo_url, db_prefix).values()
    car1, car2 = sorted(docs, key=lambda d: d["entityId"])
    assert list(car2) == ["_id", "entityId", "entityType", "speed", "speed_md", "recvTime"]
    assert (car2["entityId"], car2["entityType"], car2["speed"], car2["speed_md"]) == ("car2", "car", 12, [])
    assert car2["recvTime"] == datetime.fromtimestamp((T10 + 1500) / 1000, UTC)
    # attributes sorted by name; null values left out; metadata kept
    assert [k for k in car1 if not k.endswith("_md")] == [
        "_id", "entityId", "entityType", "code", "count", "ok", "seen", "speed", "state", "where", "recvTime",
    ]  # fmt: skip
    assert car1["speed_md"] == [{"name": "TimeInstant", "type": "DateTime", "value": "2026-03-01T10:19:58.250Z"}]
    assert car1["gone_md"] == []
    # column mode uses the receive time, not TimeInstant (NGSIMongoSink's recvTimeTsC)
    assert car1["recvTime"] == RECV


@pytest.mark.integration
def test_capped_collections_indexes_and_expiration(
    mongo_url: str, db_prefix: str, spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    _write_events(spark, lake, H10, ROWS)
    capped = MongoRawSinkResource(
        enabled=True, mongo_url=mongo_url, db_prefix=db_prefix, collections_size=8192, max_documents=3
    )
    metadata, _ = _run(lake, capped)
    assert metadata["capped"] is True
    # a later hour: the server drops the oldest documents to keep 3 (SecantusDB enforces the cap per
    # insert command, MongoDB per document: after this second insert both hold the newest 3)
    _write_events(spark, lake, H11, [ev("car1", "speed", str(v), T11 + v, mid=f"b{v}") for v in (1, 2)])
    _run(lake, capped, H11)
    uncapped = MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=db_prefix + "u")
    for key in (H10, H11):
        _run(lake, uncapped, key)
    with pymongo.MongoClient(mongo_url, tz_aware=True) as client:
        coll = client[f"{db_prefix}vehicles"]["sth_/4wheels_car1_car"]
        options = coll.options()
        assert (options.get("capped"), options.get("size"), options.get("max")) == (True, 8192, 3)
        every = sorted(
            (d["recvTime"], d["_id"])
            for d in _collections(mongo_url, db_prefix + "u")[f"{db_prefix}uvehicles.sth_/4wheels_car1_car"]
        )
        assert len(every) == 10
        assert sorted((d["recvTime"], d["_id"]) for d in coll.find()) == every[-3:]
        indexes = {name: info["key"] for name, info in coll.index_information().items()}
        assert indexes["cyg_raw_opt"] == [("recvTime", 1), ("attrName", 1), ("attrType", 1), ("attrValue", 1)]
        assert indexes["sth_raw_query"] == [("attrName", 1), ("recvTime", 1)]

    expiring = MongoRawSinkResource(
        enabled=True,
        mongo_url=mongo_url,
        db_prefix=db_prefix + "e",
        data_model="dm-by-attribute",
        data_expiration=3600,
        enable_encoding=True,
    )
    _run(lake, expiring)
    with pymongo.MongoClient(mongo_url) as client:
        # the new encoding, as for the STH collections, without ".aggr"
        coll = client[f"{db_prefix}evehicles"]["sth_x002f4wheelsxffffcar1xffffcarxffffspeed"]
        info = coll.index_information()
        assert info["cyg_raw_exp"]["key"] == [("recvTime", 1)]
        assert info["cyg_raw_exp"]["expireAfterSeconds"] == 3600
        assert "sth_raw_query" not in info  # dm-by-attribute: cyg_raw_opt starts with recvTime
        (doc,) = coll.find()
        assert list(doc) == ["_id", "attrType", "attrValue", "recvTime"]


@pytest.mark.integration
def test_unwritable_events_go_to_rejects_with_the_reason(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    lake = tmp_path / "lake"
    rows = [
        ev("car1", "speed", "1", T10, mid="ok"),
        ev("x" * 250, "speed", "1", T10, mid="long"),  # namespace over 255 bytes
        ev("car1", "state", "a\x00b", T10, mid="nul", attr_type="Text"),
        ev("car1", "a.b", "1", T10, mid="dot"),  # fine in row mode; not a field name in column mode
    ]
    _write_events(spark, lake, H10, rows)
    row_metadata, _ = _run(lake, MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=db_prefix))
    assert row_metadata["documents"] == 2
    assert row_metadata["rejects"] == 2
    read = LakeResource(root=str(lake)).read
    reasons = {r["messageId"]: r["reason"] for r in read(spark, REJECTS, MONGO_RAW_REJECTS).collect()}
    assert set(reasons) == {"long", "nul"}
    assert "the limit is 255" in reasons["long"]
    assert "NUL character" in reasons["nul"]

    column = MongoRawSinkResource(
        enabled=True, mongo_url=mongo_url, db_prefix=db_prefix + "c", attr_persistence="column"
    )
    col_metadata, checks = _run(lake, column)
    assert checks == {"every_raw_document_acknowledged": True}
    reasons = {r["messageId"]: r["reason"] for r in read(spark, REJECTS, MONGO_RAW_REJECTS).collect()}
    assert set(reasons) == {"long", "nul", "dot"}
    assert "column mode" in reasons["dot"]
    (docs,) = _collections(mongo_url, db_prefix + "c").values()
    assert [sorted(k for k in d if k not in ("_id", "recvTime")) for d in docs] == [["speed"]]


@pytest.mark.integration
def test_increments_equal_the_whole_hour_and_reruns_restore_lost_documents(
    spark: SparkSession, tmp_path: Path, mongo_url: str, db_prefix: str
) -> None:
    """The same landed hour as one run, and as random increments in order (then the derived run of
    the hour, as the landing sensor asks for), gives the same raw documents (the same _ids) and the
    same STH documents; rerunning an increment, or finishing a write that was cut short, changes
    nothing."""
    import random

    from ngsi_assets.assets.ingest import message_store, ngsi_events
    from ngsi_assets.assets.sth import sth_aggregates
    from ngsi_assets.increments import INCREMENT_TAG
    from resources.landing import LandingZoneResource
    from resources.sth_mongo import STHSinkResource
    from tests.assets.test_increments import HOUR_KEY, land, split_into_increments

    land(tmp_path / "landing", 30)
    landing = LandingZoneResource(root=str(tmp_path / "landing"))

    def run(lake: str, prefix: str, tag: str | None = None, assets: list[Any] | None = None) -> None:
        result = materialize(
            assets or [message_store, ngsi_events, mongo_raw],
            partition_key=HOUR_KEY,
            tags={INCREMENT_TAG: tag} if tag else None,
            resources={
                "spark": LazyPySparkResource(spark_config={}),
                "lake": LakeResource(root=str(tmp_path / lake)),
                "landing": landing,
                "mongo_raw_sink": MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=prefix),
                "sth": STHSinkResource(mongo_url=mongo_url, db_prefix=prefix, resolutions="hour,minute,second"),
            },
            instance=DagsterInstance.ephemeral(),
        )
        assert result.success
        assert all(c.passed for c in result.get_asset_check_evaluations())

    def stored(prefix: str) -> dict[str, list[dict[str, Any]]]:
        return {k.removeprefix(prefix): v for k, v in _collections(mongo_url, prefix).items()}

    run("whole", db_prefix + "w", assets=[message_store, ngsi_events, mongo_raw, sth_aggregates])
    whole = stored(db_prefix + "w")
    raw = {k: v for k, v in whole.items() if not k.endswith(".aggr")}
    assert sum(len(v) for v in raw.values()) == 29 + 10  # speed but in the delete, fuel every third
    assert len(whole) == 2 * len(raw)  # an STH collection beside each raw one
    increments = split_into_increments(landing, random.Random(3), parts=4)
    for inc in increments:
        run("split", db_prefix + "s", inc.to_tag())
    run("split", db_prefix + "s", assets=[sth_aggregates])  # the derived run of the hour
    assert stored(db_prefix + "s") == whole
    run("split", db_prefix + "s", increments[2].to_tag())
    # a write cut short: some documents of an increment never reached MongoDB
    with pymongo.MongoClient(mongo_url) as client:
        for name in client[db_prefix + "svehicles"].list_collection_names():
            client[db_prefix + "svehicles"][name].delete_many({"attrName": "speed"})
    run("split", db_prefix + "s", increments[1].to_tag())
    after = stored(db_prefix + "s")
    missing = sum(len(v) for v in whole.values()) - sum(len(v) for v in after.values())
    assert missing > 0  # only the rerun increment's documents came back
    for inc in increments:
        run("split", db_prefix + "s", inc.to_tag())
    assert {k: v for k, v in stored(db_prefix + "s").items() if not k.endswith(".aggr")} == raw
