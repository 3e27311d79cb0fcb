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
from ngsi_assets.sinks.sth_mongo import (
    APPLYING,
    DONE,
    INCREMENTS_LEDGER,
    add_point_updates,
    document_id,
    expire_documents,
    forget_hours,
    ledger_id,
    publish_documents,
    settle_rebuilt,
    stale_collections,
)
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


def _updates(spark: SparkSession, rows: list[tuple], cfg: STHConfig, now_ms: int = 0):
    classified = sth.classify_events(spark.createDataFrame(rows, NGSI_EVENTS), cfg)
    return sth.point_updates(sth.sth_partials(classified, cfg.resolutions), cfg, now_ms)


def _all(url: str, prefix: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every STH document of the databases named with ``prefix`` (the ledgers left out), by
    (database less prefix, collection, _id)."""
    out = {}
    with pymongo.MongoClient(url, tz_aware=True) as client:
        for db in client.list_database_names():
            if db.startswith(prefix):
                for coll in client[db].list_collection_names():
                    if coll.endswith(".aggr"):
                        for doc in client[db][coll].find():
                            out[(db[len(prefix) :], coll, repr(sorted(doc["_id"].items())))] = doc
    return out


# Numbers whose sums and squares are exact in binary (quarters), so the batches' additions in any
# order give the bits one fold gives; text, and an attribute with both (a sensor's "n/a").
_BATCHES = [
    [
        ev("car1", "speed", "1.25", T, mid="a"),
        ev("car1", "state", "ok", T, mid="a", attr_type="Text"),
        ev("car1", "level", "n/a", T, mid="a"),
        ev("car2", "speed", "-3", T + 61_000, mid="b"),
    ],
    [
        ev("car1", "speed", "0.5", T + 1_000, mid="c"),
        ev("car1", "state", "ok", T + 1_000, mid="c", attr_type="Text"),
        ev("car1", "level", "7.75", T + 2_000, mid="c"),
    ],
    [
        ev("car1", "speed", "-2.25", T + 3_600_000, mid="d"),
        ev("car1", "state", "a.b$", T + 2_000, mid="d", attr_type="Text"),
        ev("car2", "speed", "4", T + 61_000, mid="e"),
        ev("car1", "level", "n/a", T + 5_000, mid="e"),
    ],
]


def test_point_updates_of_batches_equal_the_whole_documents(
    spark: SparkSession, mongo_url: str, db_prefix: str
) -> None:
    """Batches added in place with $inc/$min/$max give the documents one whole rebuild writes: a
    document that had text only gets the numbers' fields in every point when a number comes (and
    the reverse); a batch sent again adds nothing (its collections' ledger says they have it)."""
    whole_cfg = STHConfig(db_prefix=db_prefix + "w_", data_model="dm-by-entity")
    cfg = STHConfig(db_prefix=db_prefix + "s_", data_model="dm-by-entity", batch_size=2)
    publish_documents(_docs(spark, [r for b in _BATCHES for r in b], whole_cfg), mongo_url, whole_cfg)
    for n, rows in enumerate(_BATCHES):
        added = add_point_updates(_updates(spark, rows, cfg), mongo_url, cfg, "2026-03-01-10:00", f"b{n}")
        assert added and all(c.get("updated", 0) > 0 and "already" not in c for c in added.values()), added
    expected = _all(mongo_url, db_prefix + "w_")
    # 4 attributes x 5 resolutions, and car1's speed an hour later in a second and a minute document.
    assert len(expected) == 4 * 5 + 2
    assert _all(mongo_url, db_prefix + "s_") == expected
    level = next(d for k, d in expected.items() if "level" in k[2] and "'hour'" in k[2])
    assert all({"sum", "occur"} <= set(p) for p in level["points"]), "numbers and text: both in every point"

    again = add_point_updates(_updates(spark, _BATCHES[1], cfg), mongo_url, cfg, "2026-03-01-10:00", "b1")
    assert again and all(set(c) == {"already"} for c in again.values()), again
    assert _all(mongo_url, db_prefix + "s_") == expected


def test_the_ledger_names_what_a_dead_run_left_and_forgets_what_is_finished(mongo_url: str, db_prefix: str) -> None:
    """Entries marked applying, or done for a batch the lake's ledger does not name, are stale; done
    entries of finished batches go; a rebuild marks the collection as having the batch."""
    db, hour = f"{db_prefix}vehicles", "2026-03-01-10:00"
    with pymongo.MongoClient(mongo_url) as client:
        ledger = client[db][INCREMENTS_LEDGER]
        for coll, batch, state in (("c1", "b1", DONE), ("c2", "b1", DONE), ("c2", "b2", APPLYING), ("c3", "b3", DONE)):
            ledger.insert_one({"_id": ledger_id(coll, hour, batch), "collection": coll, "hour": hour, "batch": batch,
                               "state": state})  # fmt: skip
        ledger.insert_one({"_id": ledger_id("c1", "other", "b9"), "collection": "c1", "hour": "other", "batch": "b9",
                           "state": APPLYING})  # fmt: skip
        stale = stale_collections(client, [db], hour, finished=["b1", "b2"])
        assert stale == {(db, "c2"): [ledger_id("c2", hour, "b2")], (db, "c3"): [ledger_id("c3", hour, "b3")]}
        assert sorted(e["_id"] for e in ledger.find()) == sorted(
            [ledger_id("c2", hour, "b2"), ledger_id("c3", hour, "b3"), ledger_id("c1", "other", "b9")]
        ), "the finished batches' done entries are gone"
        settle_rebuilt(client, stale, hour, "b4")
        assert stale_collections(client, [db], hour, finished=["b1", "b2"]) == {
            (db, "c2"): [ledger_id("c2", hour, "b4")],
            (db, "c3"): [ledger_id("c3", hour, "b4")],
        }, "until the lake names b4, its entries are those of an unfinished batch"
        assert stale_collections(client, [db], hour, finished=["b4"]) == {}
        forget_hours(client, [db], ["other"])
        assert ledger.count_documents({}) == 0


def test_a_collection_killed_part_way_through_its_updates_is_left_applying(
    spark: SparkSession, mongo_url: str, db_prefix: str
) -> None:
    """A batch's additions fail after the server took some of them: the collection stays marked
    applying (the next batch rebuilds it) and the error names it."""
    cfg = STHConfig(db_prefix=db_prefix, data_model="dm-by-entity", batch_size=1, batch_ttl=0)
    updates = _updates(spark, _BATCHES[0], cfg)
    with pymongo.MongoClient(mongo_url) as client:
        # A document in the way of car1's speed: its points are text, so $inc of a number into occur... fails.
        db, coll = f"{db_prefix}vehicles", "sth_/4wheels_car1_car.aggr"
        row = next(r.asDict(recursive=True) for r in updates.collect() if r["idAttrName"] == "speed" and
                   r["collection"] == coll and r["resolution"] == "second")  # fmt: skip
        client[db][coll].insert_one({"_id": document_id(row, cfg.data_model), "attrType": "Number", "points": "x"})
    with pytest.raises(Exception, match="sth_/4wheels_car1_car.aggr"):
        add_point_updates(updates, mongo_url, cfg, "2026-03-01-10:00", "b0")
    with pymongo.MongoClient(mongo_url) as client:
        stale = stale_collections(client, [db], "2026-03-01-10:00", finished=[])
    assert (db, coll) in stale
