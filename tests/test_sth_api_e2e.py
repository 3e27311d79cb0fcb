"""End to end: notifications posted to the receiver, the main job materialized, then read through the STH API."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pymongo
import pytest
from dagster import AssetKey, DagsterInstance
from pyspark.sql import SparkSession

from ngsi_assets.assets.sth import REJECTS as STH_REJECTS_DATASET
from ngsi_assets.definitions import build_definitions, build_resources
from ngsi_assets.materialize import landed_hours, run_ingest
from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sql_naming import Dialect, fixed_column
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sth_api import ApiSettings
from ngsi_assets.transforms.sth import STH_REJECTS
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.mongo_raw import MongoRawSinkResource
from resources.sql_sinks import SqlSinksResource
from resources.sth_mongo import STHSinkResource
from tests.ingest.harness import run_receiver
from tests.sinks.support import Sink
from tests.test_sth_api import _serve

pytestmark = pytest.mark.integration

HEADERS = {"Fiware-Service": "city", "Fiware-ServicePath": "/parking"}


def _notification(seconds: int, occupancy: float, status: str) -> dict[str, Any]:
    stamp = f"2026-03-01T10:00:{seconds:02d}.000Z"
    md = {"TimeInstant": {"type": "DateTime", "value": stamp}}
    return {
        "subscriptionId": "sub1",
        "data": [
            {
                "id": "spot1",
                "type": "Spot",
                "occupancy": {"type": "Number", "value": occupancy, "metadata": md},
                "status": {"type": "Text", "value": status, "metadata": md},
            }
        ],
    }


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        url + "/notify",
        data=json.dumps(body).encode(),
        headers={**HEADERS, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def _get(base: str, path: str, params: dict[str, str]) -> Any:
    request = urllib.request.Request(f"{base}{path}?{urlencode(params)}", headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture
def prefix(mongo_url: str) -> Iterator[str]:
    name = f"e{uuid.uuid4().hex[:6]}_"
    yield name
    with pymongo.MongoClient(mongo_url) as client:
        for db in client.list_database_names():
            if db.startswith(name):
                client.drop_database(db)


def test_posted_notifications_come_back_through_the_sth_api(tmp_path: Path, mongo_url: str, prefix: str) -> None:
    landing = tmp_path / "landing"
    with run_receiver(landing) as receiver:
        for seconds, occupancy, status in [(1, 10.0, "free"), (2, 30.5, "busy"), (3, 20.0, "busy")]:
            assert _post(receiver.url, _notification(seconds, occupancy, status)) in (200, 201, 204)
    resources = build_resources()
    resources.update(
        lake=LakeResource(root=str(tmp_path / "lake")),
        landing=LandingZoneResource(root=str(landing)),
        sth=STHSinkResource(mongo_url=mongo_url, db_prefix=prefix, resolutions="hour,minute"),
        mongo_raw_sink=MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=prefix),
    )
    hours = landed_hours(resources["landing"])
    outcome = run_ingest(build_definitions(resources), hours[0], hours[-1], DagsterInstance.ephemeral())
    assert outcome.success, outcome

    settings = ApiSettings(
        mongo_url=mongo_url,
        sth=STHConfig(db_prefix=prefix, resolutions="hour,minute"),
        raw=MongoRawConfig(db_prefix=prefix),
    )
    for base in _serve(settings):
        path = "/STH/v2/entities/spot1/attrs/occupancy"
        assert _get(base, path, {"type": "Spot", "lastN": "2"}) == {
            "type": "StructuredValue",
            "value": [
                {"attrType": "Number", "attrValue": 30.5, "recvTime": "2026-03-01T10:00:02.000Z"},
                {"attrType": "Number", "attrValue": 20, "recvTime": "2026-03-01T10:00:03.000Z"},
            ],
        }
        aggregated = _get(base, path, {"type": "Spot", "aggrMethod": "sum,min,max", "aggrPeriod": "minute"})
        assert aggregated == {
            "type": "StructuredValue",
            "value": [
                {
                    "_id": {"attrName": "occupancy", "origin": "2026-03-01T10:00:00.000Z", "resolution": "minute"},
                    "points": [{"offset": 0, "samples": 3, "sum": 60.5, "min": 10, "max": 30.5}],
                }
            ],
        }
        occur = _get(
            base, "/STH/v2/entities/spot1/attrs/status", {"type": "Spot", "aggrMethod": "occur", "aggrPeriod": "hour"}
        )
        assert occur["value"][0]["points"] == [{"offset": 10, "samples": 3, "occur": {"busy": 2, "free": 1}}]
        raw_status = _get(base, "/STH/v2/entities/spot1/attrs/status", {"type": "Spot", "hLimit": "5", "hOffset": "0"})
        assert [v["attrValue"] for v in raw_status["value"]] == ["free", "busy", "busy"]


@contextlib.contextmanager
def _sth_api_command(env: dict[str, str]) -> Iterator[str]:
    """``ngsi-assets sth-api`` as a user runs it, on a free port; its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngsi_assets.cli", "sth-api", "--host", "127.0.0.1", "--port", "0"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on" in line:
                yield line.rsplit(" ", 1)[1].strip()
                break
        else:
            raise AssertionError(f"ngsi-assets sth-api exited with {proc.wait()}")
    finally:
        proc.terminate()
        proc.wait(30)


def _long_entity(prefix: str, namespace_bytes: int) -> str:
    """An entity id whose STH collection namespace (dm-by-entity, old encoding) has this many bytes."""
    # "<prefix>city" "." "sth_/parking_" <id> "_Spot" ".aggr"
    fixed = len(f"{prefix}city.sth_/parking__Spot.aggr")
    return "spot-" + "x" * (namespace_bytes - fixed - len("spot-"))


@pytest.mark.parametrize("limit", [None, 113], ids=["server-limit", "old-limit-setting"])
def test_a_200_byte_namespace_is_written_and_read_back_unless_the_old_limit_is_set(
    spark: SparkSession, tmp_path: Path, mongo_url: str, prefix: str, limit: int | None
) -> None:
    entity = _long_entity(prefix, 200)
    namespace = f"{prefix}city.sth_/parking_{entity}_Spot.aggr"
    assert len(namespace.encode()) == 200
    landing = tmp_path / "landing"
    body = _notification(1, 12.5, "busy")
    body["data"][0]["id"] = entity
    with run_receiver(landing) as receiver:
        assert _post(receiver.url, body) in (200, 201, 204)
    resources = build_resources()
    resources.update(
        lake=LakeResource(root=str(tmp_path / "lake")),
        landing=LandingZoneResource(root=str(landing)),
        sth=STHSinkResource(mongo_url=mongo_url, db_prefix=prefix, resolutions="minute", max_namespace_bytes=limit),
        mongo_raw_sink=MongoRawSinkResource(
            enabled=True, mongo_url=mongo_url, db_prefix=prefix, max_namespace_bytes=limit
        ),
    )
    hours = landed_hours(resources["landing"])
    outcome = run_ingest(build_definitions(resources), hours[0], hours[-1], DagsterInstance.ephemeral())
    assert outcome.success, outcome

    with pymongo.MongoClient(mongo_url) as client:
        collections = set(client[f"{prefix}city"].list_collection_names())
    env = {"NGSI_MONGO_URL": mongo_url, "NGSI_STH_DB_PREFIX": prefix, "NGSI_MONGO_RAW_DB_PREFIX": prefix}
    if limit is not None:
        env |= {"NGSI_STH_MAX_NAMESPACE_BYTES": str(limit), "NGSI_MONGO_RAW_MAX_NAMESPACE_BYTES": str(limit)}
    with _sth_api_command(env) as base:
        path = f"/STH/v2/entities/{entity}/attrs/occupancy"
        if limit is None:
            assert namespace.split(".", 1)[1] in collections
            aggregated = _get(base, path, {"type": "Spot", "aggrMethod": "sum", "aggrPeriod": "minute"})
            assert aggregated["value"][0]["points"] == [{"offset": 0, "samples": 1, "sum": 12.5}]
            raw = _get(base, path, {"type": "Spot", "lastN": "1"})
            assert [v["attrValue"] for v in raw["value"]] == [12.5]
        else:
            # Quarantined: nothing written under the name, and the API names the limit.
            assert not any(entity in c for c in collections)
            with pytest.raises(urllib.error.HTTPError) as refused:
                _get(base, path, {"type": "Spot", "lastN": "1"})
            assert refused.value.code == 400
            assert "the limit is 113" in json.loads(refused.value.read())["description"]
    if limit is not None:
        lake = LakeResource(root=str(tmp_path / "lake"))
        reasons = [r["reason"] for r in lake.read(spark, STH_REJECTS_DATASET, STH_REJECTS).collect()]
        assert reasons and all("is 200 bytes in UTF-8; the limit is 113" in r for r in reasons)


def test_a_metadata_time_instant_in_epoch_milliseconds_is_accepted_and_lands_everywhere(
    tmp_path: Path, mongo_url: str, prefix: str, postgres_db_url: str, mysql_db_url: str
) -> None:
    epoch_ms = 1772359203123  # 2026-03-01T10:00:03.123Z
    landing = tmp_path / "landing"
    with run_receiver(landing) as receiver:
        for entity, stamp in [("spot-ms", epoch_ms), ("spot-s", epoch_ms // 1000), ("spot-bad", "yesterday")]:
            body = _notification(1, 7.0, "free")
            body["data"][0]["id"] = entity
            for attr in ("occupancy", "status"):
                body["data"][0][attr]["metadata"]["TimeInstant"]["value"] = stamp
            # Orion does not retry a 400: an unreadable metadata value must not cost the notification.
            assert _post(receiver.url, body) in (200, 201, 204)
    sql = {"last_data_mode": "both", "attr_persistence": "row"}
    sinks = [Sink(Dialect.POSTGRESQL, postgres_db_url, []), Sink(Dialect.MYSQL, mysql_db_url, ["city"])]
    resources = build_resources()
    resources.update(
        lake=LakeResource(root=str(tmp_path / "lake")),
        landing=LandingZoneResource(root=str(landing)),
        sth=STHSinkResource(mongo_url=mongo_url, db_prefix=prefix, resolutions="second"),
        mongo_raw_sink=MongoRawSinkResource(enabled=True, mongo_url=mongo_url, db_prefix=prefix),
        sql_sinks=SqlSinksResource(sinks={s.dialect.value: {"url": s.url, **sql} for s in sinks}),
    )
    instance = DagsterInstance.ephemeral()
    try:
        hours = landed_hours(resources["landing"])
        outcome = run_ingest(build_definitions(resources), hours[0], hours[-1], instance)
        assert outcome.success, outcome
        event = instance.get_latest_materialization_event(AssetKey("ngsi_events"))
        assert event is not None and event.asset_materialization is not None
        # Only spot-bad's two attributes: epoch milliseconds and seconds are instants.
        assert event.asset_materialization.metadata["time_instant_fallbacks"].value == 2

        for s in sinks:
            tables = s.tables("city")
            for entity in ("spot-ms", "spot-s", "spot-bad"):
                mine = [t for t in tables if entity.replace("-", "_") in t.lower().replace("-", "_")]
                historic = [t for t in mine if not t.endswith("_last_data")]
                last = [t for t in mine if t.endswith("_last_data")]
                assert len(historic) == len(last) == 1, (s.dialect, tables)
                names = s.rows("city", historic[0], [fixed_column("attrName", s.dialect)])
                assert sorted(r[0] for r in names) == ["occupancy", "status"]
                assert len(s.rows("city", last[0])) == 1
        with pymongo.MongoClient(mongo_url) as client:
            db = client[f"{prefix}city"]
            # STH: the second documents of spot-ms and spot-s sit at 10:00:03 (their metadata), spot-bad's at
            # its receive time; raw documents carry the same times.
            for entity, at in [("spot-ms", 3), ("spot-s", 3)]:
                (doc,) = db[f"sth_/parking_{entity}_Spot.aggr"].find({"_id.attrName": "occupancy"})
                assert [p["offset"] for p in doc["points"] if p["samples"]] == [at], entity
                (raw,) = db[f"sth_/parking_{entity}_Spot"].find({"attrName": "occupancy"})
                expected_ms = epoch_ms if entity == "spot-ms" else epoch_ms // 1000 * 1000
                assert round(raw["recvTime"].timestamp() * 1000) == expected_ms
            assert db["sth_/parking_spot-bad_Spot.aggr"].count_documents({}) == 2
            assert db["sth_/parking_spot-bad_Spot"].count_documents({}) == 2
    finally:
        for s in sinks:
            s.drop_created()
