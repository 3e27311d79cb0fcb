"""STH documents written to the MongoDB-wire server of the test session (or $MONGO_URL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pymongo
import pytest
from bson.codec_options import CodecOptions
from pyspark.sql import SparkSession

from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sinks.sth_mongo import expire_documents, publish_documents
from ngsi_assets.transforms import sth
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from tests.transforms.test_sth import ev, ms

pytestmark = pytest.mark.integration

T = ms(2026, 3, 1, 10, 15, 30)


@pytest.fixture
def db_prefix(mongo_url: str) -> Iterator[str]:
    """A database prefix of this test's own; its databases are dropped afterwards."""
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    yield prefix
    with pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=10_000) as client:
        for name in client.list_database_names():
            if name.startswith(prefix):
                client.drop_database(name)


def _docs(spark: SparkSession, rows: list[tuple], cfg: STHConfig, now_ms: int = 0):
    classified = sth.classify_events(spark.createDataFrame(rows, NGSI_EVENTS), cfg)
    return sth.build_documents(sth.sth_partials(classified, cfg.resolutions), cfg, now_ms)


def _read(url: str, database: str, collection: str) -> list[dict[str, Any]]:
    with pymongo.MongoClient(url, tz_aware=True) as client:
        coll = client[database].get_collection(collection, codec_options=CodecOptions(tz_aware=True, tzinfo=UTC))
        return sorted(coll.find(), key=lambda d: (d["_id"]["attrName"], d["_id"]["resolution"]))


def test_publish_replace_and_delete(spark: SparkSession, mongo_url: str, db_prefix: str) -> None:
    cfg = STHConfig(db_prefix=db_prefix, resolutions="hour", data_model="dm-by-entity", batch_size=1)
    rows = [
        ev("car1", "speed", "-4.5", T, mid="a"),
        ev("car1", "speed", "0", T, mid="b"),
        ev("car1", "note", "a.b$", T, mid="c", attr_type="Text"),
    ]
    written = publish_documents(_docs(spark, rows, cfg), mongo_url, cfg)
    database, collection = f"{db_prefix}vehicles", "sth_/4wheels_car1_car.aggr"
    assert written == {(database, collection): (2, 0)}
    docs = _read(mongo_url, database, collection)
    origin = datetime(2026, 3, 1, tzinfo=UTC)
    empty_text = [{"offset": o, "samples": 0, "occur": {}} for o in range(24)]
    empty_num = [
        {"offset": o, "samples": 0, "sum": 0.0, "sum2": 0.0, "min": float("inf"), "max": float("-inf")}
        for o in range(24)
    ]
    note_points = [*empty_text[:10], {"offset": 10, "samples": 1, "occur": {"a\uff0eb\uff04": 1}}, *empty_text[11:]]
    speed_points = [
        *empty_num[:10],
        {"offset": 10, "samples": 2, "sum": -4.5, "sum2": 20.25, "min": -4.5, "max": 0.0},
        *empty_num[11:],
    ]
    assert docs == [
        {
            "_id": {"attrName": "note", "origin": origin, "resolution": "hour", "range": "day"},
            "attrType": "Text",
            "points": note_points,
        },
        {
            "_id": {"attrName": "speed", "origin": origin, "resolution": "hour", "range": "day"},
            "attrType": "Number",
            "points": speed_points,
        },
    ]
    # Publishing again changes nothing; a document whose samples are gone is deleted.
    assert publish_documents(_docs(spark, rows, cfg), mongo_url, cfg) == {(database, collection): (2, 0)}
    assert _read(mongo_url, database, collection) == docs
    gone = spark.createDataFrame(rows[2:], NGSI_EVENTS)
    old = sth.sth_partials(sth.classify_events(spark.createDataFrame(rows, NGSI_EVENTS), cfg), cfg.resolutions)
    new = sth.sth_partials(sth.classify_events(gone, cfg), cfg.resolutions)
    docs_after = sth.build_documents(sth.with_tombstones(new, old), cfg, 0)
    assert publish_documents(docs_after, mongo_url, cfg) == {(database, collection): (1, 1)}
    assert _read(mongo_url, database, collection) == docs[:1]


def test_service_path_model_and_new_encoding(spark: SparkSession, mongo_url: str, db_prefix: str) -> None:
    cfg = STHConfig(db_prefix=db_prefix, resolutions="month", data_model="dm-by-service-path", enable_encoding=True)
    rows = [ev("car$1", "speed", "7", T, service="Fleet")]
    publish_documents(_docs(spark, rows, cfg), mongo_url, cfg)
    (doc,) = _read(mongo_url, f"{db_prefix}x0046leet", "sth_x002f4wheels.aggr")
    assert doc["_id"] == {
        "entityId": "car$1", "entityType": "car", "attrName": "speed",
        "origin": datetime(2026, 1, 1, tzinfo=UTC), "resolution": "month", "range": "year",
    }  # fmt: skip
    assert [p["offset"] for p in doc["points"]] == list(range(12))
    assert doc["points"][2] == {"offset": 2, "samples": 1, "sum": 7.0, "sum2": 49.0, "min": 7.0, "max": 7.0}


def test_expiration(spark: SparkSession, mongo_url: str, db_prefix: str) -> None:
    keep = STHConfig(db_prefix=db_prefix, resolutions="hour,minute")
    publish_documents(_docs(spark, [ev("car1", "speed", "1", T)], keep), mongo_url, keep)
    database, collection = f"{db_prefix}vehicles", "sth_/4wheels_car1_car.aggr"
    assert len(_read(mongo_url, database, collection)) == 2
    expiring = keep.model_copy(update={"data_expiration": 3600})
    with pymongo.MongoClient(mongo_url, tz_aware=True) as client:
        client[f"{db_prefix}other"]["unrelated"].insert_one({"_id": {"origin": datetime(2000, 1, 1, tzinfo=UTC)}})
        deleted = expire_documents(client, expiring, datetime(2026, 3, 1, 10, 59, tzinfo=UTC))
        assert deleted == {(database, collection): 1}
        assert client[f"{db_prefix}other"]["unrelated"].count_documents({}) == 1
    (left,) = _read(mongo_url, database, collection)
    assert left["_id"]["resolution"] == "minute"
