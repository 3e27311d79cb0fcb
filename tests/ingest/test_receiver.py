"""The receiver over real HTTP: what it accepts lands verbatim, what it refuses lands nothing."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import requests

from ngsi_assets.ingest.landing import list_segments
from ngsi_assets.ngsi.envelope import hour_dir
from ngsi_assets.ngsi.payloads import IngestSettings
from tests.ingest import samples
from tests.ingest.harness import ThreadReceiver, landed, landed_lines, raw_body, run_receiver, snapshot

NOW = datetime(2026, 11, 22, 14, 30, 15, 123000, tzinfo=UTC).timestamp()
NOW_MS = int(NOW * 1000)
MAX_BODY = 64 * 1024


def fixed_clock() -> float:
    return NOW


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[ThreadReceiver]:
    with run_receiver(tmp_path / "landing", IngestSettings(max_body_bytes=MAX_BODY), clock=fixed_clock) as r:
        yield r


# ---- accepted requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class Good:
    path: str
    headers: dict[str, str]
    body: bytes
    expect: dict[str, Any]  # envelope fields besides message_id, recv_ms, origin, body


GOOD = {
    "v2-normalized": Good(
        "/notify",
        {
            **samples.JSON,
            "Fiware-Service": "vehicles",
            "Fiware-ServicePath": "/4wheels",
            "Fiware-Correlator": "3e1b2c7a-1f00-11ef-9a3b-0242ac120003; cbnotif=2",
        },
        samples.pretty(samples.v2_normalized()),
        {
            "kind": "ngsi-v2",
            "format": "normalized",
            "service": "vehicles",
            "service_path": "/4wheels",
            "correlator": "3e1b2c7a-1f00-11ef-9a3b-0242ac120003",
            "cbnotif": 2,
            "guid": None,
        },
    ),
    "v2-key-values-defaults": Good(
        "/notify",
        {"content-type": "application/json; charset=utf-8", "ngsiv2-attrsformat": "keyValues"},
        samples.dumps(samples.v2_key_values()),
        {
            "kind": "ngsi-v2",
            "format": "keyValues",
            "service": "default",
            "service_path": "/",
            "correlator": None,
            "cbnotif": None,
            "guid": None,
        },
    ),
    "v2-guid-header": Good(
        "/notify",
        {**samples.JSON, "X-Message-Guid": "g-42", "Fiware-ServicePath": "/a"},
        samples.dumps(samples.v2_normalized()),
        {"kind": "ngsi-v2", "format": "normalized", "service": "default", "service_path": "/a", "guid": "g-42"},
    ),
    "ld-on-notify": Good(
        "/notify",
        {**samples.LD_JSON, "NGSILD-Tenant": "city"},
        samples.pretty(samples.ld_notification()),
        {"kind": "ngsi-ld", "format": "ld-normalized", "service": "city", "service_path": "/"},
    ),
    "ld-endpoint": Good(
        "/ngsi-ld/notify",
        {**samples.JSON, "Fiware-Service": "city"},
        samples.dumps(samples.ld_notification()),
        {"kind": "ngsi-ld", "format": "ld-normalized", "service": "city", "service_path": "/"},
    ),
    "datahub-message": Good(
        "/messages",
        {**samples.JSON, "Fiware-Service": "hub"},
        samples.pretty(samples.datahub_message("guid-7")),
        {"kind": "message", "format": "datahub", "service": "hub", "guid": "guid-7"},
    ),
}


@pytest.mark.parametrize("case", GOOD.values(), ids=GOOD.keys())
def test_valid_request_lands_verbatim(receiver: ThreadReceiver, case: Good) -> None:
    response = requests.post(receiver.url + case.path, data=case.body, headers=case.headers, timeout=10)
    assert response.status_code == 201, response.text
    ack = response.json()
    assert ack["recv_ms"] == NOW_MS

    (segment,) = list_segments(receiver.root)
    assert segment.hour_dir == hour_dir(NOW_MS) == "dt=2026-11-22-14"
    (line,) = landed_lines(receiver.root)
    record = orjson.loads(line)
    assert list(record) == [
        "message_id",
        "recv_ms",
        "kind",
        "format",
        "service",
        "service_path",
        "correlator",
        "cbnotif",
        "guid",
        "origin",
        "body",
    ]
    assert record["message_id"] == ack["message_id"]
    assert record["recv_ms"] == NOW_MS
    assert record["origin"] == "http"
    for key, value in case.expect.items():
        assert record[key] == value, key
    assert raw_body(line) == case.body.replace(b"\r", b" ").replace(b"\n", b" ")
    assert record["body"] == orjson.loads(case.body)


def test_message_ids_are_unique_and_time_ordered(receiver: ThreadReceiver) -> None:
    acks = [
        requests.post(
            receiver.url + "/notify", data=samples.dumps(samples.v2_normalized(f"E{i}")), headers=samples.JSON
        ).json()["message_id"]
        for i in range(20)
    ]
    assert len(set(acks)) == 20 and acks == sorted(acks)
    assert [r["message_id"] for r in landed(receiver.root)] == acks


def test_many_concurrent_clients_share_group_commits(tmp_path: Path) -> None:
    count, concurrency = 600, 100

    async def drive(url: str) -> list[tuple[int, dict[str, Any]]]:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post(i: int) -> tuple[int, dict[str, Any]]:
                body = samples.dumps(samples.v2_normalized(f"Car{i}"))
                async with session.post(url + "/notify", data=body, headers=samples.JSON) as resp:
                    return resp.status, await resp.json()

            return await asyncio.gather(*(post(i) for i in range(count)))

    with run_receiver(tmp_path) as receiver:
        results = asyncio.run(drive(receiver.url))
        stats = receiver.writer.stats()
        health = requests.get(receiver.url + "/health", timeout=10).json()
    assert {status for status, _ in results} == {201}
    acked = [ack["message_id"] for _, ack in results]
    records = landed(tmp_path)
    assert sorted(r["message_id"] for r in records) == sorted(acked)
    assert sorted(r["body"]["data"][0]["id"] for r in records) == sorted(f"Car{i}" for i in range(count))
    assert stats.lines == count
    assert stats.batches <= count * 0.8, stats  # group commit: many waiters share an fsync
    assert health["accepted"] == count and health["rejected"] == 0


def test_health_and_version(receiver: ThreadReceiver) -> None:
    requests.post(receiver.url + "/notify", data=samples.dumps(samples.v2_normalized()), headers=samples.JSON)
    requests.post(receiver.url + "/notify", data=b"{", headers=samples.JSON)
    health = requests.get(receiver.url + "/health", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert body["landing_root"] == str(receiver.root)
    assert (body["accepted"], body["rejected"], body["failed"]) == (1, 1, 0)
    assert body["rejected_by_status"] == {"400": 1}
    assert isinstance(body["last_fsync_ms"], float)
    version = requests.get(receiver.url + "/version", timeout=10).json()
    assert version["name"] == "ngsi-assets" and version["version"]


# ---- refused requests ------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    path: str
    headers: dict[str, str | bytes]
    body: bytes | Callable[[], Iterator[bytes]]
    status: int
    field: str | None
    method: str = "POST"


def v2_with(change: Callable[[dict[str, Any]], Any]) -> bytes:
    body = samples.v2_normalized()
    change(body)
    return samples.dumps(body)


def ld_with(change: Callable[[dict[str, Any]], Any]) -> bytes:
    body = copy.deepcopy(samples.ld_notification())
    change(body)
    return samples.dumps(body)


def message_with(change: Callable[[dict[str, Any]], Any]) -> bytes:
    body = samples.datahub_message()
    change(body)
    return samples.dumps(body)


def chunks(total: int) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        yield b'{"subscriptionId": "s", "data": [], "pad": "'
        sent = 0
        while sent < total:
            yield b"x" * 8192
            sent += 8192
        yield b'"}'

    return gen


V2 = samples.dumps(samples.v2_normalized())
BAD = {
    "no-content-type": Bad("/notify", {}, V2, 415, "header Content-Type"),
    "text-plain": Bad("/notify", {"Content-Type": "text/plain"}, V2, 415, "header Content-Type"),
    "latin1-charset": Bad(
        "/notify", {"Content-Type": "application/json; charset=iso-8859-1"}, V2, 415, "header Content-Type"
    ),
    "ld-json-on-messages": Bad(
        "/messages", samples.LD_JSON, samples.dumps(samples.datahub_message()), 415, "header Content-Type"
    ),
    "too-large-content-length": Bad("/notify", samples.JSON, b" " * (MAX_BODY + 1) + V2, 413, "body"),
    "too-large-chunked": Bad("/notify", samples.JSON, chunks(MAX_BODY * 2), 413, "body"),
    "empty-body": Bad("/notify", samples.JSON, b"", 400, "body"),
    "invalid-json": Bad("/notify", samples.JSON, b'{"subscriptionId": ', 400, "body"),
    "trailing-garbage": Bad("/notify", samples.JSON, V2 + b"}", 400, "body"),
    "nan": Bad("/notify", samples.JSON, b'{"subscriptionId":"s","data":[{"id":"a","type":"T","x":NaN}]}', 400, "body"),
    "top-level-array": Bad("/notify", samples.JSON, b"[" + V2 + b"]", 400, "body"),
    "not-utf8": Bad("/notify", samples.JSON, V2.replace(b"Car", b"C\xffr"), 400, "body"),
    "missing-subscription-id": Bad(
        "/notify", samples.JSON, v2_with(lambda b: b.pop("subscriptionId")), 400, "subscriptionId"
    ),
    "empty-data": Bad("/notify", samples.JSON, v2_with(lambda b: b.update(data=[])), 400, "data"),
    "entity-without-id": Bad("/notify", samples.JSON, v2_with(lambda b: b["data"][0].pop("id")), 400, "data[0].id"),
    "attribute-not-object": Bad(
        "/notify", samples.JSON, v2_with(lambda b: b["data"][0].update(speed=5)), 400, "data[0].speed"
    ),
    "bad-time-instant": Bad(
        "/notify",
        samples.JSON,
        v2_with(lambda b: b["data"][0]["TimeInstant"].update(value="yesterday")),
        400,
        "data[0].TimeInstant.value",
    ),
    "unknown-attrs-format": Bad(
        "/notify", {**samples.JSON, "Ngsiv2-AttrsFormat": "legacy"}, V2, 400, "header Ngsiv2-AttrsFormat"
    ),
    "relative-service-path": Bad(
        "/notify", {**samples.JSON, "Fiware-ServicePath": "rel"}, V2, 400, "header Fiware-ServicePath"
    ),
    "service-path-list-mismatch": Bad(
        "/notify", {**samples.JSON, "Fiware-ServicePath": "/a,/b"}, V2, 400, "header Fiware-ServicePath"
    ),
    "service-too-long": Bad("/notify", {**samples.JSON, "Fiware-Service": "s" * 51}, V2, 400, "header Fiware-Service"),
    "bad-cbnotif": Bad(
        "/notify", {**samples.JSON, "Fiware-Correlator": "c; cbnotif=two"}, V2, 400, "header Fiware-Correlator"
    ),
    "ld-wrong-type": Bad("/ngsi-ld/notify", samples.LD_JSON, ld_with(lambda b: b.update(type="Note")), 400, "type"),
    "ld-entity-id-not-uri": Bad(
        "/ngsi-ld/notify", samples.LD_JSON, ld_with(lambda b: b["data"][0].update(id="car 1")), 400, "data[0].id"
    ),
    "ld-bad-attribute-type": Bad(
        "/ngsi-ld/notify",
        samples.LD_JSON,
        ld_with(lambda b: b["data"][0]["speed"].update(type="Prop")),
        400,
        "data[0].speed.type",
    ),
    "message-without-timestamp": Bad(
        "/messages", samples.JSON, message_with(lambda b: b.pop("timestamp")), 400, "timestamp"
    ),
    "message-empty-data": Bad("/messages", samples.JSON, message_with(lambda b: b.update(data=[])), 400, "data"),
    "service-not-utf8": Bad(
        "/notify", {**samples.JSON, "Fiware-Service": b"caf\xe9"}, V2, 400, "header Fiware-Service"
    ),
    "correlator-not-utf8": Bad(
        "/notify", {**samples.JSON, "Fiware-Correlator": b"c\xff\xfe"}, V2, 400, "header Fiware-Correlator"
    ),
    "unknown-path": Bad("/notify/extra", samples.JSON, V2, 404, "path"),
    "get-on-notify": Bad("/notify", {}, b"", 405, "method", method="GET"),
}


@pytest.fixture(scope="module")
def bad_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadReceiver]:
    root = tmp_path_factory.mktemp("bad") / "landing"
    with run_receiver(root, IngestSettings(max_body_bytes=MAX_BODY), clock=fixed_clock) as r:
        # One accepted message first, so "unchanged" is checked against a non-empty tree.
        ok = requests.post(r.url + "/notify", data=V2, headers=samples.JSON, timeout=10)
        assert ok.status_code == 201
        yield r


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_refused_request_names_the_problem_and_lands_nothing(bad_receiver: ThreadReceiver, case: Bad) -> None:
    before = snapshot(bad_receiver.root)
    body = case.body() if callable(case.body) else case.body
    response = requests.request(case.method, bad_receiver.url + case.path, data=body, headers=case.headers, timeout=30)
    assert response.status_code == case.status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()
    assert set(error) == {"error", "field", "description"}
    assert error["field"] == case.field
    assert error["description"]
    assert snapshot(bad_receiver.root) == before
    # The connection may be closed (413) but the server keeps serving.
    assert requests.get(bad_receiver.url + "/health", timeout=10).status_code == 200


def test_bad_request_list_is_broad() -> None:
    assert len(BAD) >= 20
    assert {c.status for c in BAD.values()} >= {400, 404, 405, 413, 415}


def test_expect_100_continue_too_large_is_refused_before_the_body(bad_receiver: ThreadReceiver) -> None:
    async def scenario() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            headers = {**samples.JSON, "Content-Length": str(MAX_BODY * 10)}
            async with session.post(
                bad_receiver.url + "/notify", data=b" " * (MAX_BODY * 10), headers=headers, expect100=True
            ) as resp:
                return resp.status, await resp.json()

    before = snapshot(bad_receiver.root)
    status, error = asyncio.run(scenario())
    assert status == 413 and error["field"] == "body" and error["error"] == "PayloadTooLarge"
    assert snapshot(bad_receiver.root) == before


def test_body_at_the_limit_is_accepted(tmp_path: Path) -> None:
    body = V2[:-1] + b',"pad":"' + b"x" * 100 + b'"}'
    padding = MAX_BODY - len(body)
    body = body[:-2] + b"x" * padding + b'"}'
    assert len(body) == MAX_BODY
    with run_receiver(tmp_path, IngestSettings(max_body_bytes=MAX_BODY)) as receiver:
        ok = requests.post(receiver.url + "/notify", data=body, headers=samples.JSON, timeout=10)
        over = requests.post(receiver.url + "/notify", data=body + b" ", headers=samples.JSON, timeout=10)
    assert ok.status_code == 201
    assert over.status_code == 413
    assert len(landed(tmp_path)) == 1


# ---- server-side trouble ---------------------------------------------------------------------


def test_landing_failure_is_a_503_and_recovers(tmp_path: Path) -> None:
    root = tmp_path / "landing"
    root.mkdir()
    blocker = root / hour_dir(NOW_MS)
    blocker.write_bytes(b"")  # a file where the hour folder must go: a real write failure
    with run_receiver(root, clock=fixed_clock) as receiver:
        failed = requests.post(receiver.url + "/notify", data=V2, headers=samples.JSON, timeout=10)
        assert failed.status_code == 503
        assert failed.headers["Retry-After"]
        assert failed.json()["error"] == "ServiceUnavailable"
        health = requests.get(receiver.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert health.json()["failed"] == 1
        blocker.unlink()
        ok = requests.post(receiver.url + "/notify", data=V2, headers=samples.JSON, timeout=10)
        assert ok.status_code == 201
        assert requests.get(receiver.url + "/health", timeout=10).json()["status"] == "ok"
    assert [r["message_id"] for r in landed(root)] == [ok.json()["message_id"]]
