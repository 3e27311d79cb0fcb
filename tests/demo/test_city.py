"""The smart-city sample generator and the poster.

The generator's claims (malformed, duplicate and out-of-order requests) are checked against oracles
written here from the request bytes alone, not against the generator's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from ngsi_assets.demo.city import (
    ENDPOINT_PATHS,
    MALFORMED_REASONS,
    CitySummary,
    Request,
    generate_city,
    read_jsonl,
    write_jsonl,
)
from ngsi_assets.demo.post import PostReport, main, post_requests, rejection_reason
from ngsi_assets.ngsi.constants import Format

V2_FORMATS = {"normalized", "keyValues", "simplifiedNormalized", "simplifiedKeyValues"}
SIMPLIFIED = {"simplifiedNormalized", "simplifiedKeyValues"}
JSON_TYPES = {"application/json", "application/ld+json"}


@pytest.fixture(scope="module")
def city() -> tuple[list[Request], CitySummary]:
    return generate_city()


@pytest.fixture(scope="module")
def lines(city: tuple[list[Request], CitySummary]) -> list[bytes]:
    return [r.to_line() for r in city[0]]


# --- oracles -------------------------------------------------------------------------------------


def _ts(value: Any) -> datetime:
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?", value):
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}")
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _v2_entities(request: Request) -> list[dict[str, Any]]:
    if request.headers["Ngsiv2-AttrsFormat"] in SIMPLIFIED:
        return [request.body]
    return request.body["data"]


def _v2_stamp(entity: dict[str, Any]) -> datetime:
    """TimeInstant attribute, else the newest TimeInstant metadata of the entity's attributes."""
    ti = entity.get("TimeInstant")
    if ti is not None:
        return _ts(ti["value"] if isinstance(ti, dict) else ti)
    return max(
        _ts(attr["metadata"]["TimeInstant"]["value"])
        for attr in entity.values()
        if isinstance(attr, dict) and "TimeInstant" in attr.get("metadata", {})
    )


def _problem(request: Request) -> str | None:
    """Why a receiver should refuse this request, or None; independent of the generator's labels."""
    if request.body_text is not None:
        try:
            json.loads(request.body_text)
        except ValueError:
            return "body is not JSON"
        return "body_text holds valid JSON"
    if request.headers.get("Content-Type", "").split(";")[0].strip() not in JSON_TYPES:
        return "content type"
    body = request.body
    if not isinstance(body, dict):
        return "body is not an object"
    if request.endpoint == "messages":
        if not isinstance(body.get("entity"), str) or not isinstance(body.get("data"), list):
            return "message shape"
        return None
    if request.endpoint == "notify":
        if any(not p.startswith("/") for p in request.headers.get("Fiware-ServicePath", "/").split(",")):
            return "service path"
        if request.headers.get("Ngsiv2-AttrsFormat") not in V2_FORMATS:
            return "attrs format"
        if request.headers["Ngsiv2-AttrsFormat"] not in SIMPLIFIED and not isinstance(body.get("data"), list):
            return "data"
        for entity in _v2_entities(request):
            if not isinstance(entity, dict) or not entity.get("id") or not entity.get("type"):
                return "entity id/type"
            if "" in entity:
                return "empty attribute name"
            try:
                _v2_stamp(entity)
            except ValueError:
                return "TimeInstant"
        return None
    if not isinstance(body.get("data"), list):
        return "data"
    for entity in body["data"]:
        if not entity.get("id") or not entity.get("type"):
            return "entity id/type"
        for name, attr in entity.items():
            if name in ("id", "type", "@context"):
                continue
            for instance in attr if isinstance(attr, list) else [attr]:
                need = "object" if instance.get("type") == "Relationship" else "value"
                if need not in instance:
                    return f"LD attribute without {need}"
    return None


def _stamps(request: Request) -> list[tuple[tuple[str, ...], datetime]]:
    """(entity key, payload timestamp) pairs of a well-formed request."""
    if request.endpoint == "messages":
        body = request.body
        when = _ts(body["timestamp"])
        keys = [
            str(rec["product_number"]) if body["entity"] == "product" else f"{rec['route_id']}/{rec['container_id']}"
            for rec in body["data"]
        ]
        return [(("message", body["entity"], k), when) for k in keys]
    service = request.headers.get("Fiware-Service", "default")
    if request.endpoint == "notify":
        return [((service, e["type"], e["id"]), _v2_stamp(e)) for e in _v2_entities(request)]
    out = []
    for e in request.body["data"]:
        status = e["status"] if isinstance(e["status"], list) else [e["status"]]
        out.append(((service, e["type"], e["id"]), max(_ts(s["observedAt"]) for s in status)))
    return out


def _attribute_count(request: Request) -> int:
    entities = _v2_entities(request) if request.endpoint == "notify" else request.body["data"]
    return sum(
        len(v) if isinstance(v, list) and v and isinstance(v[0], dict) else 1
        for e in entities
        for k, v in e.items()
        if k not in ("id", "type", "@context")
    )


# --- the generator -------------------------------------------------------------------------------


def test_same_seed_gives_the_same_bytes(city: tuple[list[Request], CitySummary], tmp_path: Path) -> None:
    again, summary = generate_city(seed=42)
    write_jsonl(city[0], tmp_path / "a.jsonl")
    write_jsonl(again, tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert summary == city[1]
    other, _ = generate_city(seed=43, target_notifications=1_000)
    assert [r.to_line() for r in other] != [r.to_line() for r in city[0][:1_000]]


def test_file_round_trip(city: tuple[list[Request], CitySummary], tmp_path: Path) -> None:
    path = tmp_path / "sample.jsonl"
    assert write_jsonl(city[0], path) == len(city[0])
    assert read_jsonl(path) == city[0]
    for line in path.read_bytes().splitlines()[:50]:
        record = orjson.loads(line)
        assert list(record)[:2] == ["endpoint", "headers"]
        assert ("body" in record) != ("body_text" in record)


def test_size(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    assert len(requests) == summary.requests == 12_000
    assert len(generate_city(seed=1, hours=2, target_notifications=10_000)[0]) == 10_000


def test_every_kind_format_and_service_is_present(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    assert set(summary.by_endpoint) == set(ENDPOINT_PATHS)
    assert set(summary.by_format) == {f.value for f in Format}
    assert set(summary.by_service) == {"default", "environment", "parking", "vehicles", "waste"}
    assert set(summary.malformed_by_reason) == set(MALFORMED_REASONS)
    assert summary.entities_by_type == {
        "AirQualityObserved": 40,
        "ParkingSpot": 250,
        "WasteContainer": 150,
        "car": 210,
    }
    assert 200 <= summary.by_endpoint["messages"] <= 500

    good = [r for i, r in enumerate(requests) if i not in set(summary.malformed_indices)]
    notify = [r for r in good if r.endpoint == "notify"]
    assert any("Fiware-Service" not in r.headers for r in notify)  # Orion's default tenant
    assert any("X-Message-Guid" in r.headers for r in good if r.endpoint == "notify")
    assert any("X-Message-Guid" in r.headers for r in good if r.endpoint == "ngsi-ld")
    correlators = [r.headers["Fiware-Correlator"] for r in notify]
    assert all(re.fullmatch(r"[0-9a-f-]{36}(; cbnotif=\d+)?", c) for c in correlators)
    assert sum("cbnotif=" in c for c in correlators) > 0.9 * len(correlators)

    multi = [r for r in notify if r.headers.get("Fiware-Service") == "environment" and len(r.body.get("data", [])) > 1]
    listed = [r for r in multi if "," in r.headers["Fiware-ServicePath"]]
    assert listed and len(listed) < len(multi)
    assert all(len(r.headers["Fiware-ServicePath"].split(",")) == len(r.body["data"]) for r in listed)

    bodies = [r.data() for r in good]
    assert any(b'"alterationType":"entityDelete"' in b for b in bodies)
    assert any(b'"alterationType":{"type":"Text","value":"entityDelete"' in b for b in bodies)
    assert any(b'"dateModified":{"type":"DateTime"' in b for b in bodies)
    assert any(b'"speed":{"type":"Number","value":0.0' in b for b in bodies)
    assert any(b'"datasetId":"urn:ngsi-ld:Dataset:camera"' in b for b in bodies)
    assert any(b'"type":"Relationship","object":"urn:ngsi-ld:ParkingSite:' in b for b in bodies)
    assert any(b'"type":"GeoProperty"' in b for b in bodies)
    assert summary.entity_deletes > 0
    assert {r.body["entity"] for r in good if r.endpoint == "messages"} == {"product", "container_route"}
    assert all(r.headers["Content-Type"] == "application/ld+json" for r in good if r.endpoint == "ngsi-ld")


def test_malformed_requests_match_the_summary(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    flagged = tuple(i for i, r in enumerate(requests) if _problem(r) is not None)
    assert flagged == summary.malformed_indices
    assert summary.malformed == len(flagged) == sum(summary.malformed_by_reason.values())
    assert 0.005 * len(requests) <= summary.malformed <= 0.015 * len(requests)
    assert len({_problem(requests[i]) for i in flagged}) >= 9  # varied, not one fault repeated


def test_duplicates_are_exact_resends(city: tuple[list[Request], CitySummary], lines: list[bytes]) -> None:
    _, summary = city
    seen: set[bytes] = set()
    repeats = []
    for i, line in enumerate(lines):
        if line in seen:
            repeats.append(i)
        seen.add(line)
    assert tuple(repeats) == summary.duplicate_indices
    assert summary.duplicates == len(repeats)
    assert 0.005 * len(lines) <= len(repeats) <= 0.015 * len(lines)
    requests = city[0]
    assert any(requests[i].endpoint == "messages" and "guid" in requests[i].body for i in repeats)
    assert summary.duplicates_with_guid_header == sum("X-Message-Guid" in requests[i].headers for i in repeats) > 0


def test_out_of_order_notifications_match_the_summary(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    skip = set(summary.malformed_indices) | set(summary.duplicate_indices)
    newest: dict[tuple[str, ...], datetime] = {}
    late = []
    for i, request in enumerate(requests):
        if i in skip:
            continue
        stamps = _stamps(request)
        if any(when < newest.get(key, when) for key, when in stamps):
            late.append(i)
        for key, when in stamps:
            newest[key] = max(when, newest.get(key, when))
    assert tuple(late) == summary.out_of_order_indices
    notifications = len(requests) - len(skip)
    assert 0.02 * notifications <= len(late) <= 0.04 * notifications


def test_well_formed_bodies_are_json_with_ids(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    bad = set(summary.malformed_indices)
    first = [r for i, r in enumerate(requests) if i not in bad and i not in set(summary.duplicate_indices)]
    entities: set[tuple[str, ...]] = set()
    for request in (r for i, r in enumerate(requests) if i not in bad):
        assert request.body_text is None
        assert isinstance(orjson.loads(request.data()), dict)
        if request.endpoint == "messages":
            assert request.body["data"] and all(isinstance(rec, dict) for rec in request.body["data"])
            continue
        data = _v2_entities(request) if request.endpoint == "notify" else request.body["data"]
        for entity in data:
            assert isinstance(entity["id"], str) and entity["id"]
            assert isinstance(entity["type"], str) and entity["type"]
    for request in first:
        entities.update(key for key, _ in _stamps(request) if key[0] != "message")
    assert summary.distinct_entities == len(entities)
    assert summary.attribute_updates == sum(_attribute_count(r) for r in first if r.endpoint != "messages")
    assert summary.message_records == sum(len(r.body["data"]) for r in first if r.endpoint == "messages")


def test_payload_times_stay_inside_the_window(city: tuple[list[Request], CitySummary]) -> None:
    requests, summary = city
    lo, hi = _ts(summary.start), _ts(summary.end)
    bad = set(summary.malformed_indices)
    for request in (r for i, r in enumerate(requests) if i not in bad):
        for _, when in _stamps(request):
            assert lo <= when < hi


# --- the poster ----------------------------------------------------------------------------------


def _answer(request: web.Request, body: bytes) -> tuple[int, dict[str, str]]:
    """The tiny server's rule: 201 for a JSON object sent as JSON, else 400 naming the problem."""
    if request.content_type not in JSON_TYPES:
        return 400, {"error": "BadRequest", "description": f"unsupported content type {request.content_type}"}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 400, {"error": "ParseError", "description": "body is not valid JSON"}
    if not isinstance(parsed, dict):
        return 400, {"error": "BadRequest", "description": "body is not a JSON object"}
    return 201, {}


@pytest.fixture
def tiny_server() -> Iterator[tuple[str, list[tuple[str, dict[str, str], bytes]]]]:
    """An aiohttp server on a free 127.0.0.1 port, in its own thread; yields (url, what it received)."""
    received: list[tuple[str, dict[str, str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        received.append((request.path, dict(request.headers), body))
        status, error = _answer(request, body)
        return web.json_response(error, status=status) if error else web.Response(status=status)

    app = web.Application()
    for path in ENDPOINT_PATHS.values():
        app.router.add_post(path, handle)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def small_sample() -> list[Request]:
    return generate_city(seed=7, hours=1, target_notifications=600)[0]


def _expected_status(request: Request) -> int:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
    if content_type not in JSON_TYPES:
        return 400
    try:
        return 201 if isinstance(orjson.loads(request.data()), dict) else 400
    except orjson.JSONDecodeError:
        return 400


def test_post_requests_reports_what_the_server_answered(
    tiny_server: tuple[str, list[tuple[str, dict[str, str], bytes]]], small_sample: list[Request]
) -> None:
    url, received = tiny_server
    expected = Counter(_expected_status(r) for r in small_sample)
    assert expected[400] > 0

    report = post_requests(url, small_sample, concurrency=8)

    assert isinstance(report, PostReport)
    assert report.sent == len(small_sample) == len(received)
    assert report.failed == 0
    assert report.accepted == expected[201]
    assert report.rejected == {400: expected[400]}
    assert 0 < len(report.rejection_samples) <= 5
    assert all(s.startswith("400 /") for s in report.rejection_samples)
    assert report.elapsed_s > 0 and report.requests_per_s > 0

    # Each request arrived on its endpoint with its headers and its exact body bytes.
    sent = Counter(
        (r.path, r.data(), r.headers.get("Fiware-Service"), r.headers.get("Content-Type")) for r in small_sample
    )
    got = Counter(
        (path, body, headers.get("Fiware-Service"), headers.get("Content-Type")) for path, headers, body in received
    )
    assert got == sent


def test_post_cli_reads_a_file(
    tiny_server: tuple[str, list[tuple[str, dict[str, str], bytes]]],
    small_sample: list[Request],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, received = tiny_server
    path = tmp_path / "sample.jsonl"
    write_jsonl(small_sample[:100], path)
    assert main(["--url", url, "--file", str(path), "--concurrency", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sent"] == len(received) == 100
    assert report["accepted"] + report["rejected_total"] == 100


def test_post_counts_unreachable_server_as_failed(small_sample: list[Request]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    report = post_requests(f"http://127.0.0.1:{port}", small_sample[:5], concurrency=2, timeout_s=5)
    assert report.failed == 5 and report.accepted == 0 and report.failure_samples


def test_rejection_reason_reads_json_errors() -> None:
    body = b'{"error":"BadRequest","description":"entity without id"}'
    assert rejection_reason(400, "/notify", body) == "400 /notify: BadRequest: entity without id"
    with_field = b'{"error":"BadRequest","field":"data[0].id","description":"required key \'id\' is missing"}'
    assert (
        rejection_reason(400, "/notify", with_field)
        == "400 /notify: BadRequest: data[0].id: required key 'id' is missing"
    )
    assert rejection_reason(415, "/notify", b"nope") == "415 /notify: nope"
    assert rejection_reason(500, "/messages", b"") == "500 /messages"
