# ruff: noqa: E501  (expected bodies are kept one per line, as STH-Comet documents them)
"""The STH-Comet read API over real HTTP against a real MongoDB-wire server (SecantusDB, or $MONGO_URL).

Expected bodies are written from telefonicaid/fiware-sth-comet: ``lib/server/sthServer.js`` (routes,
joi query schema), ``lib/server/validators/sthHeaderValidator.js``, ``lib/server/handlers/
sthGetDataHandler.js`` (raw/aggregated rule, page rule), ``lib/database/sthDatabase.js``
(``getRawData``, ``getAggregatedData``, ``filterResults``), ``lib/server/utils/sthServerUtils.js``
(v1 ``contextResponses``, v2 ``{type, value}``) and ``lib/server/handlers/sthNotFoundHandler.js``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import pymongo
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sinks.mongo_raw import ensure_collection
from ngsi_assets.sinks.sth_mongo import AGGREGATE_INDEX, ensure_aggregate_indexes
from ngsi_assets.sth_api import ApiSettings, build_app

pytestmark = pytest.mark.integration

SERVICE, PATH = "city", "/parking"
HEADERS = {"Fiware-Service": SERVICE, "Fiware-ServicePath": PATH}
INF = float("inf")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@dataclass
class Api:
    base: str
    prefix: str
    mongo_url: str

    def get(
        self,
        path: str,
        params: dict[str, Any] | list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        method: str = "GET",
    ) -> tuple[int, dict[str, str], bytes]:
        url = self.base + path + ("?" + urlencode(params) if params else "")
        request = urllib.request.Request(url, headers=HEADERS if headers is None else headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        status, _, body = self.get(*args, **kwargs)
        return status, json.loads(body)


def _serve(settings: ApiSettings) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(build_app(settings))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["port"] = runner.addresses[0][1]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30), "the STH API did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def _agg(
    attr: str, origin: datetime, resolution: str, rng: str, points: list[dict[str, Any]], attr_type: str = "Number"
) -> dict[str, Any]:
    return {
        "_id": {"attrName": attr, "origin": origin, "resolution": resolution, "range": rng},
        "attrType": attr_type,
        "points": points,
    }


def num(offset: int, samples: int, total: float, sum2: float, lo: float, hi: float) -> dict[str, Any]:
    return {"offset": offset, "samples": samples, "sum": total, "sum2": sum2, "min": lo, "max": hi}


def empty(offset: int) -> dict[str, Any]:
    return {"offset": offset, "samples": 0, "sum": 0.0, "sum2": 0.0, "min": INF, "max": -INF}


AGGREGATES = [
    # day documents of March and April 2026 at hour resolution (range "day" per STH-Comet)
    _agg("speed", utc(2026, 3, 1), "hour", "day", [empty(0), num(10, 2, 77.5, 6489.25, -3.0, 80.5), num(11, 1, 7.0, 49.0, 7.0, 7.0), empty(12)]),
    _agg("speed", utc(2026, 3, 2), "hour", "day", [num(0, 1, 1.0, 1.0, 1.0, 1.0), num(23, 1, 2.0, 4.0, 2.0, 2.0)]),
    _agg("speed", utc(2026, 3, 3), "hour", "day", [num(5, 1, 5.0, 25.0, 5.0, 5.0)]),
    _agg("state", utc(2026, 3, 1), "hour", "day", [{"offset": 10, "samples": 3, "occur": {"on": 2, "off": 1}}, {"offset": 11, "samples": 0, "occur": {}}], "Text"),
    _agg("speed", utc(2026, 1, 1), "month", "year", [num(2, 4, 10.0, 30.0, 1.0, 4.0)]),
]  # fmt: skip
T0 = utc(2026, 3, 1, 10, 0, 0)
RAW = [
    {"attrName": "speed", "attrType": "Number", "attrValue": float(i) + 0.5, "recvTime": utc(2026, 3, 1, 10, 0, i)}
    for i in range(6)
] + [{"attrName": "state", "attrType": "Text", "attrValue": "on, off", "recvTime": utc(2026, 3, 1, 10, 0, 0)}]


@pytest.fixture(scope="module")
def api(mongo_url: str) -> Iterator[Api]:
    prefix = f"a{uuid.uuid4().hex[:6]}_"
    sth = STHConfig(db_prefix=prefix)
    raw = MongoRawConfig(db_prefix=prefix)
    by_path = STHConfig(db_prefix=prefix + "p", data_model="dm-by-service-path")
    with pymongo.MongoClient(mongo_url, tz_aware=True) as client:
        db = client[prefix + SERVICE]
        db["sth_/parking_spot1_Spot.aggr"].insert_many([dict(d) for d in AGGREGATES])
        ensure_aggregate_indexes(client, [(prefix + SERVICE, "sth_/parking_spot1_Spot.aggr")], sth)
        ensure_collection(client, prefix + SERVICE, "sth_/parking_spot1_Spot", raw)
        db["sth_/parking_spot1_Spot"].insert_many([dict(d) for d in RAW])
        path_docs = [{**d, "_id": {"entityId": "spot1", "entityType": "Spot", **d["_id"]}} for d in AGGREGATES[:1]] + [
            {**AGGREGATES[0], "_id": {"entityId": "spot2", "entityType": "Spot", **AGGREGATES[0]["_id"]}}
        ]
        client[prefix + "p" + SERVICE]["sth_/parking.aggr"].insert_many(path_docs)
    settings = ApiSettings(mongo_url=mongo_url, sth=sth, raw=raw)
    try:
        for base in _serve(settings):
            for by_path_base in _serve(ApiSettings(mongo_url=mongo_url, sth=by_path, raw=raw)):
                api = Api(base, prefix, mongo_url)
                api.by_path = by_path_base  # type: ignore[attr-defined]
                yield api
    finally:
        with pymongo.MongoClient(mongo_url) as client:
            for name in client.list_database_names():
                if name.startswith(prefix):
                    client.drop_database(name)


V2 = "/STH/v2/entities/spot1/attrs/speed"
V1 = "/STH/v1/contextEntities/type/Spot/id/spot1/attributes/speed"


# ---- aggregated -----------------------------------------------------------------------------------


def test_v2_aggregated_sum_per_hour_drops_empty_points(api: Api) -> None:
    status, body = api.json(V2, {"type": "Spot", "aggrMethod": "sum", "aggrPeriod": "hour"})
    assert status == 200
    assert body == {
        "type": "StructuredValue",
        "value": [
            {"_id": {"attrName": "speed", "origin": "2026-03-01T00:00:00.000Z", "resolution": "hour"},
             "points": [{"offset": 10, "samples": 2, "sum": 77.5}, {"offset": 11, "samples": 1, "sum": 7}]},
            {"_id": {"attrName": "speed", "origin": "2026-03-02T00:00:00.000Z", "resolution": "hour"},
             "points": [{"offset": 0, "samples": 1, "sum": 1}, {"offset": 23, "samples": 1, "sum": 2}]},
            {"_id": {"attrName": "speed", "origin": "2026-03-03T00:00:00.000Z", "resolution": "hour"},
             "points": [{"offset": 5, "samples": 1, "sum": 5}]},
        ],
    }  # fmt: skip


def test_aggregated_methods_in_the_order_asked_and_all(api: Api) -> None:
    _, body = api.json(V2, {"type": "Spot", "aggrMethod": "max,min", "aggrPeriod": "month"})
    assert body["value"] == [
        {"_id": {"attrName": "speed", "origin": "2026-01-01T00:00:00.000Z", "resolution": "month"},
         "points": [{"offset": 2, "samples": 4, "max": 4, "min": 1}]}
    ]  # fmt: skip
    _, body = api.json(V2, {"type": "Spot", "aggrMethod": "all", "aggrPeriod": "month"})
    assert body["value"][0]["points"] == [{"offset": 2, "samples": 4, "min": 1, "max": 4, "sum": 10, "sum2": 30}]
    _, body = api.json(
        "/STH/v2/entities/spot1/attrs/state", {"type": "Spot", "aggrMethod": "occur", "aggrPeriod": "hour"}
    )
    assert body["value"] == [
        {"_id": {"attrName": "state", "origin": "2026-03-01T00:00:00.000Z", "resolution": "hour"},
         "points": [{"offset": 10, "samples": 3, "occur": {"on": 2, "off": 1}}]}
    ]  # fmt: skip


def test_aggregated_dates_select_documents_and_trim_the_first_and_last(api: Api) -> None:
    params = {
        "type": "Spot", "aggrMethod": "sum", "aggrPeriod": "hour",
        "dateFrom": "2026-03-01T11:30:00.000Z", "dateTo": "2026-03-02T22:00:00Z",
    }  # fmt: skip
    _, body = api.json(V2, params)
    # March 1st keeps offsets >= 11; March 2nd keeps offsets <= 22; March 3rd is after dateTo's origin
    assert [(v["_id"]["origin"], [p["offset"] for p in v["points"]]) for v in body["value"]] == [
        ("2026-03-01T00:00:00.000Z", [11]),
        ("2026-03-02T00:00:00.000Z", [0]),
    ]
    # a first document left with no point is dropped
    _, body = api.json(V2, {**params, "dateFrom": "2026-03-01T12:00:00Z"})
    assert [v["_id"]["origin"] for v in body["value"]] == ["2026-03-02T00:00:00.000Z"]
    # epoch milliseconds are dates too (joi.date())
    _, body = api.json(V2, {**params, "dateFrom": str(int(utc(2026, 3, 3).timestamp() * 1000)), "dateTo": "2026-12-31"})
    assert [v["_id"]["origin"] for v in body["value"]] == ["2026-03-03T00:00:00.000Z"]


def test_v1_aggregated_body(api: Api) -> None:
    status, body = api.json(V1, {"aggrMethod": "sum", "aggrPeriod": "hour", "dateTo": "2026-03-01T10:59:59Z"})
    assert status == 200
    assert body == {
        "contextResponses": [
            {
                "contextElement": {
                    "attributes": [{"name": "speed", "values": [
                        {"_id": {"attrName": "speed", "origin": "2026-03-01T00:00:00.000Z", "resolution": "hour"},
                         "points": [{"offset": 10, "samples": 2, "sum": 77.5}]}]}],
                    "id": "spot1",
                    "isPattern": False,
                    "type": "Spot",
                },
                "statusCode": {"code": "200", "reasonPhrase": "OK"},
            }
        ]
    }  # fmt: skip


def test_by_service_path_groups_by_entity_fields(api: Api) -> None:
    base = api.by_path  # type: ignore[attr-defined]
    other = Api(base, api.prefix, api.mongo_url)
    _, body = other.json(V2, {"type": "Spot", "aggrMethod": "sum", "aggrPeriod": "hour"})
    assert [v["_id"] for v in body["value"]] == [
        {
            "entityId": "spot1",
            "entityType": "Spot",
            "attrName": "speed",
            "origin": "2026-03-01T00:00:00.000Z",
            "resolution": "hour",
        }
    ]


def test_nothing_stored_is_an_empty_200(api: Api) -> None:
    status, body = api.json(
        "/STH/v2/entities/nobody/attrs/speed", {"type": "Spot", "aggrMethod": "sum", "aggrPeriod": "hour"}
    )
    assert (status, body) == (200, {"type": "StructuredValue", "value": []})
    status, body = api.json("/STH/v2/entities/nobody/attrs/speed", {"type": "Spot", "lastN": "3"})
    assert (status, body) == (200, {"type": "StructuredValue", "value": []})


# ---- raw ------------------------------------------------------------------------------------------------


def test_last_n_returns_the_newest_oldest_first(api: Api) -> None:
    status, headers, raw = api.get(V2, {"type": "Spot", "lastN": "2"})
    assert status == 200
    assert json.loads(raw) == {
        "type": "StructuredValue",
        "value": [
            {"attrType": "Number", "attrValue": 4.5, "recvTime": "2026-03-01T10:00:04.000Z"},
            {"attrType": "Number", "attrValue": 5.5, "recvTime": "2026-03-01T10:00:05.000Z"},
        ],
    }
    assert "Fiware-Total-Count" not in headers


def test_pages_dates_and_total_count(api: Api) -> None:
    _, body = api.json(V2, {"type": "Spot", "hLimit": "2", "hOffset": "1"})
    assert [v["attrValue"] for v in body["value"]] == [1.5, 2.5]
    status, headers, raw = api.get(
        V2,
        {
            "type": "Spot",
            "hLimit": "10",
            "hOffset": "0",
            "dateFrom": "2026-03-01T10:00:02Z",
            "dateTo": "2026-03-01T10:00:03.000Z",
            "count": "true",
        },
    )
    assert [v["attrValue"] for v in json.loads(raw)["value"]] == [2.5, 3.5]
    assert headers["Fiware-Total-Count"] == "2"  # of the filter, not of the page
    _, headers, raw = api.get(V2, {"type": "Spot", "lastN": "1", "count": "true"})
    assert headers["Fiware-Total-Count"] == "6"
    assert [v["attrValue"] for v in json.loads(raw)["value"]] == [5.5]


def test_v1_raw_body(api: Api) -> None:
    _, body = api.json("/STH/v1/contextEntities/type/Spot/id/spot1/attributes/state", {"lastN": "5"})
    assert body["contextResponses"][0]["contextElement"] == {
        "attributes": [
            {
                "name": "state",
                "values": [{"attrType": "Text", "attrValue": "on, off", "recvTime": "2026-03-01T10:00:00.000Z"}],
            }
        ],
        "id": "spot1",
        "isPattern": False,
        "type": "Spot",
    }


def test_csv_file(api: Api) -> None:
    status, headers, raw = api.get("/STH/v2/entities/spot1/attrs/state", {"type": "Spot", "filetype": "csv"})
    assert status == 200
    assert headers["Content-Disposition"].startswith("attachment; filename*=utf-8''state-")
    assert raw.decode() == 'attrName,attrType,attrValue,recvTime\nstate,Text,"on, off",2026-03-01T10:00:00.000Z\n'
    _, _, raw = api.get(V2, {"type": "Spot", "filetype": "csv", "lastN": "2"})
    assert raw.decode().splitlines()[1:] == [
        "speed,Number,4.5,2026-03-01T10:00:04.000Z",
        "speed,Number,5.5,2026-03-01T10:00:05.000Z",
    ]


def test_raw_queries_use_an_index(api: Api) -> None:
    with pymongo.MongoClient(api.mongo_url) as client:
        coll = client[api.prefix + SERVICE]["sth_/parking_spot1_Spot"]
        plan = coll.find({"attrName": "speed"}).sort("recvTime", -1).limit(2).explain()["queryPlanner"]["winningPlan"]
        assert "IXSCAN" in json.dumps(plan) and "COLLSCAN" not in json.dumps(plan)
        agg = client[api.prefix + SERVICE]["sth_/parking_spot1_Spot.aggr"]
        assert AGGREGATE_INDEX in agg.index_information()
        plan = (
            agg.find({"_id.attrName": "speed", "_id.resolution": "hour"})
            .sort("_id.origin", 1)
            .explain()["queryPlanner"]["winningPlan"]
        )
        assert "IXSCAN" in json.dumps(plan) and "COLLSCAN" not in json.dumps(plan)


# ---- errors --------------------------------------------------------------------------------------------


def _v1_error(message: str, keys: list[str], source: str = "query") -> dict[str, Any]:
    return {
        "statusCode": 400,
        "error": "Bad Request",
        "message": message,
        "validation": {"source": source, "keys": keys},
    }


@pytest.mark.parametrize(
    ("params", "message", "keys"),
    [
        ({"lastN": "abc"}, 'child "lastN" fails because ["lastN" must be a number]', ["lastN"]),
        ({"lastN": "1.5"}, 'child "lastN" fails because ["lastN" must be an integer]', ["lastN"]),
        ({"lastN": "1e400"}, 'child "lastN" fails because ["lastN" must be a number]', ["lastN"]),
        ({"hLimit": "1", "hOffset": "1e30"}, 'child "hOffset" fails because ["hOffset" must be a safe number]', ["hOffset"]),
        ({"hOffset": "-1", "hLimit": "1"}, 'child "hOffset" fails because ["hOffset" must be greater than -1]', ["hOffset"]),
        ({"aggrMethod": "avg", "aggrPeriod": "hour"},
         'child "aggrMethod" fails because ["aggrMethod" with value "avg" fails to match the required pattern: '
         '/^(min|max|sum|sum2|occur|all)(,(min|max|sum|sum2|occur|all))*$/]', ["aggrMethod"]),
        ({"aggrMethod": "sum", "aggrPeriod": "week"},
         'child "aggrPeriod" fails because ["aggrPeriod" must be one of [month, day, hour, minute, second]]', ["aggrPeriod"]),
        ({"lastN": "1", "dateFrom": "yesterday"},
         'child "dateFrom" fails because ["dateFrom" must be a number of milliseconds or valid date string]', ["dateFrom"]),
        ({"lastN": "1", "count": "maybe"}, 'child "count" fails because ["count" must be a boolean]', ["count"]),
        ({"lastN": "1", "foo": "bar"}, '"foo" is not allowed', ["foo"]),
        ({"lastN": "101"}, "hLimit <= lastN <= config.maxPageSize",
         ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]),
        ({"lastN": "2", "hLimit": "3", "hOffset": "0"}, "hLimit <= lastN <= config.maxPageSize",
         ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]),
        ({"aggrMethod": "sum"},
         "A combination of the following query params is required: lastN, hLimit and hOffset, filetype, or "
         "aggrMethod and aggrPeriod", ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]),
        ({"hLimit": "3"},
         "A combination of the following query params is required: lastN, hLimit and hOffset, filetype, or "
         "aggrMethod and aggrPeriod", ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]),
    ],
)  # fmt: skip
def test_bad_query_parameters_are_400_with_sth_comets_bodies(
    api: Api, params: dict[str, str], message: str, keys: list[str]
) -> None:
    assert api.json(V1, params) == (400, _v1_error(message, keys))
    assert api.json(V2, {"type": "Spot", **params}) == (400, {"error": "BadRequest", "description": message})


def test_repeated_parameter_and_missing_type(api: Api) -> None:
    status, body = api.json(V1, [("lastN", "1"), ("lastN", "2")])
    assert (status, body["message"]) == (400, 'child "lastN" fails because ["lastN" must be a number]')
    assert api.json(V2, {"lastN": "1"}) == (
        400,
        {"error": "BadRequest", "description": 'child "type" fails because ["type" is required]'},
    )
    # type is not a v1 parameter
    assert api.json(V1, {"lastN": "1", "type": "Spot"})[1]["message"] == '"type" is not allowed'


def test_missing_headers(api: Api) -> None:
    message = 'child "fiware-service" fails because [fiware-service is required]'
    assert api.json(V1, {"lastN": "1"}, headers={"Fiware-ServicePath": PATH}) == (
        400,
        _v1_error(message, [], "headers"),
    )
    assert api.json(V2, {"lastN": "1", "type": "Spot"}, headers={"Fiware-ServicePath": PATH}) == (
        400, {"error": "BadRequest", "description": message},
    )  # fmt: skip
    message = 'child "fiware-servicepath" fails because [fiware-servicepath is required]'
    assert api.json(V1, {"lastN": "1"}, headers={"Fiware-Service": SERVICE}) == (400, _v1_error(message, [], "headers"))


def test_a_name_mongodb_cannot_hold_is_a_400_naming_it(api: Api) -> None:
    status, body = api.json("/STH/v2/entities/" + quote("x" * 250) + "/attrs/speed", {"type": "Spot", "lastN": "1"})
    assert status == 400
    assert body["error"] == "BadRequest"
    assert "the limit is 255" in body["description"]


def test_not_found_version_and_correlator(api: Api) -> None:
    assert api.json("/STH/v2/entities/spot1") == (404, {"error": "NotFound", "description": "invalid path"})
    assert api.json("/nothing/here") == (404, {"statusCode": 404, "error": "Not Found"})
    assert api.json(V2, {"type": "Spot", "lastN": "1"}, method="POST") == (
        404,
        {"error": "NotFound", "description": "invalid path"},
    )
    status, body = api.json("/version")
    assert status == 200 and isinstance(body["version"], str) and body["version"]
    _, headers, _ = api.get(V2, {"type": "Spot", "lastN": "1"}, headers={**HEADERS, "Fiware-Correlator": "corr-1"})
    assert headers["Fiware-Correlator"] == "corr-1"
    _, headers, _ = api.get(V2, {"type": "Spot", "lastN": "1"})
    assert uuid.UUID(headers["Fiware-Correlator"])


KEYS = [
    "lastN",
    "hLimit",
    "hOffset",
    "aggrMethod",
    "aggrPeriod",
    "dateFrom",
    "dateTo",
    "filetype",
    "count",
    "type",
    "x",
]
VALUES = st.one_of(
    st.sampled_from(
        ["0", "1", "-1", "100", "101", "1.5", "1e3", "sum", "all", "hour", "csv", "true", "2026-03-01T10:00:00Z"]
    ),
    st.text(max_size=12),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    params=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=5),
    entity=st.text(min_size=1, max_size=20).filter(lambda t: t not in (".", "..")),
    service=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10),  # valid in a header
    version=st.sampled_from([1, 2]),
)
def test_no_client_input_gets_a_5xx(
    api: Api, params: list[tuple[str, str]], entity: str, service: str, version: int
) -> None:
    """Whatever the query, path and headers, the answer is 200, 400 or 404 with a JSON or CSV body."""
    segment = quote(entity, safe="")
    path = (
        f"/STH/v2/entities/{segment}/attrs/speed"
        if version == 2
        else f"/STH/v1/contextEntities/type/Spot/id/{segment}/attributes/speed"
    )
    headers = {"Fiware-Service": service or "x", "Fiware-ServicePath": PATH}
    status, response_headers, body = api.get(path, params, headers=headers)
    assert status in (200, 400, 404), (status, body)
    if "csv" not in response_headers.get("Content-Type", ""):
        json.loads(body)
