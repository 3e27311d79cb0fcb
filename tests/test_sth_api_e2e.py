"""End to end: notifications posted to the receiver, the main job materialized, then read through the STH API."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pymongo
import pytest
from dagster import DagsterInstance

from ngsi_assets.definitions import build_definitions, build_resources
from ngsi_assets.materialize import landed_hours, run_ingest
from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sth_api import ApiSettings
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.mongo_raw import MongoRawSinkResource
from resources.sth_mongo import STHSinkResource
from tests.ingest.harness import run_receiver
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
