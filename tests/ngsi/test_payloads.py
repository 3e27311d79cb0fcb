"""validate_request over real payload shapes: every format accepted, every refusal precise."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ngsi_assets.ngsi.constants import ALTERATION_TYPES, Format, Kind
from ngsi_assets.ngsi.payloads import (
    Endpoint,
    IngestSettings,
    PayloadError,
    ValidatedMessage,
    validate_request,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "payloads"
JSON = {"Content-Type": "application/json"}
LD_JSON = {"Content-Type": "application/ld+json"}
DEFAULTS = IngestSettings()


def fixture(name: str) -> dict[str, Any]:
    return orjson.loads((FIXTURES / name).read_bytes())


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def changed(name: str, change: Callable[[dict[str, Any]], object]) -> bytes:
    """The fixture with one change applied, serialised."""
    doc = copy.deepcopy(fixture(name))
    change(doc)
    return orjson.dumps(doc)


def v2_entity(**attrs: Any) -> dict[str, Any]:
    entity: dict[str, Any] = {"id": "car1", "type": "car"}
    entity.update(attrs)
    return entity


def v2(*entities: dict[str, Any]) -> bytes:
    return orjson.dumps({"subscriptionId": "sub1", "data": list(entities) or [v2_entity()]})


def speed(**extra: Any) -> dict[str, Any]:
    return {"type": "Float", "value": 12.5, "metadata": {}, **extra}


DROP = object()  # leave the field out


def message(**fields: Any) -> bytes:
    doc: dict[str, Any] = {"entity": "product", "timestamp": "2019-06-05T09:31:17.000", "data": [{"n": 1}]}
    doc.update(fields)
    return orjson.dumps({k: v for k, v in doc.items() if v is not DROP})


def check(
    body: bytes,
    headers: dict[str, str] | None = None,
    endpoint: Endpoint = Endpoint.NOTIFY,
    settings_: IngestSettings = DEFAULTS,
) -> ValidatedMessage:
    return validate_request(endpoint, JSON if headers is None else headers, body, settings_)


# ---------------------------------------------------------------------------------------------
# Accepted


def test_orion_normalized_notification() -> None:
    body = raw("v2_normalized.json")
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Fiware-Service": "vehicles",
        "Fiware-ServicePath": "/4wheels",
        "Fiware-Correlator": "9f3c5a2e-0d9b-11ef-8a3e-0242ac120003; cbnotif=1",
    }
    msg = check(body, headers)
    assert msg == ValidatedMessage(
        kind=Kind.NGSI_V2,
        format=Format.NORMALIZED,
        service="vehicles",
        service_path="/4wheels",
        correlator="9f3c5a2e-0d9b-11ef-8a3e-0242ac120003",
        cbnotif=1,
        guid=None,
        body=body,
        entity_count=2,
    )
    assert msg.body is body


@pytest.mark.parametrize(
    ("name", "attrs_format", "expected", "count"),
    [
        ("v2_key_values.json", "keyValues", Format.KEY_VALUES, 1),
        ("v2_simplified_normalized.json", "simplifiedNormalized", Format.SIMPLIFIED_NORMALIZED, 1),
        ("v2_simplified_key_values.json", "simplifiedKeyValues", Format.SIMPLIFIED_KEY_VALUES, 1),
        ("v2_normalized.json", "normalized", Format.NORMALIZED, 2),
    ],
)
def test_each_v2_format_by_header(name: str, attrs_format: str, expected: Format, count: int) -> None:
    msg = check(raw(name), {**JSON, "Ngsiv2-AttrsFormat": attrs_format})
    assert (msg.kind, msg.format, msg.entity_count) == (Kind.NGSI_V2, expected, count)


def test_names_that_sql_sinks_must_quote_pass_through() -> None:
    body = raw("v2_awkward_names.json")
    msg = check(body, {**JSON, "Fiware-Service": "t`en'ant;", "Fiware-ServicePath": '/a\'b/"c"; DROP'})
    assert msg.service == "t`en'ant;"
    assert msg.service_path == '/a\'b/"c"; DROP'
    assert msg.body == body


def test_null_value_and_any_json_value_in_normalized_attributes() -> None:
    entity = v2_entity(
        a={"type": "Text", "value": None},
        b={"value": [1, {"x": None}]},
        c={"type": "StructuredValue", "value": {"nested": {"deep": True}}, "metadata": {"m": {"value": None}}},
    )
    assert check(v2(entity)).entity_count == 1


@pytest.mark.parametrize("alteration", ALTERATION_TYPES)
def test_every_alteration_type(alteration: str) -> None:
    normalized = v2_entity(alterationType={"type": "Text", "value": alteration})
    assert check(v2(normalized)).format is Format.NORMALIZED
    key_values = orjson.dumps({"subscriptionId": "s", "data": [v2_entity(alterationType=alteration)]})
    assert check(key_values, {**JSON, "Ngsiv2-AttrsFormat": "keyValues"}).format is Format.KEY_VALUES


@pytest.mark.parametrize(
    "stamp",
    ["2015-04-20T12:13:22.410Z", "2015-04-20T12:13:22+02:00", "2015-04-20T12:13:22", "2015-04-20", "2015-04-20T12:13Z"],
)
def test_time_instant_forms(stamp: str) -> None:
    entity = v2_entity(
        TimeInstant={"type": "DateTime", "value": stamp},
        speed=speed(metadata={"TimeInstant": {"type": "DateTime", "value": stamp}}),
    )
    assert check(v2(entity)).entity_count == 1


@pytest.mark.parametrize("value", [1483228801123, 1483228801, "1483228801123", "yesterday", "", None, {"at": 1}])
def test_time_instant_metadata_of_any_value_is_accepted(value: object) -> None:
    # Orion does not retry a 400: a metadata value never costs the notification its other attributes.
    entity = v2_entity(speed=speed(metadata={"TimeInstant": {"type": "DateTime", "value": value}}))
    assert check(v2(entity)).entity_count == 1


def test_ngsi_ld_on_notify_by_content_type() -> None:
    body = raw("ld_notification.json")
    msg = check(body, {"content-type": "application/ld+json", "NGSILD-Tenant": "openiot"})
    assert (msg.kind, msg.format, msg.entity_count) == (Kind.NGSI_LD, Format.LD_NORMALIZED, 2)
    assert msg.service == "openiot"


@pytest.mark.parametrize("headers", [JSON, LD_JSON])
def test_ngsi_ld_endpoint_takes_both_json_types(headers: dict[str, str]) -> None:
    msg = check(raw("ld_notification.json"), headers, Endpoint.NGSI_LD)
    assert (msg.kind, msg.format, msg.service, msg.service_path) == (
        Kind.NGSI_LD,
        Format.LD_NORMALIZED,
        "default",
        "/",
    )


def test_fiware_service_wins_over_ngsild_tenant() -> None:
    msg = check(raw("ld_notification.json"), {**LD_JSON, "Fiware-Service": "a", "NGSILD-Tenant": "b"})
    assert msg.service == "a"


def test_datahub_message_with_guid_refresh_source_user() -> None:
    body = raw("datahub_message.json")
    msg = check(body, {**JSON, "X-Message-Guid": "ignored-for-messages"}, Endpoint.MESSAGES)
    assert msg == ValidatedMessage(
        kind=Kind.MESSAGE,
        format=Format.DATAHUB,
        service="default",
        service_path="/",
        correlator=None,
        cbnotif=None,
        guid="6f1c1a1e-9d2b-5c3a-8f4e-2b7d9e0a1c3f",
        body=body,
        entity_count=2,
    )


def test_datahub_message_with_csv_text_is_accepted_for_its_reader() -> None:
    msg = check(message(data="product_number,product_description\n1,Toaster\n"), endpoint=Endpoint.MESSAGES)
    assert msg.kind == "message" and msg.entity_count == 1


def test_datahub_message_minimal_has_no_guid() -> None:
    msg = check(raw("datahub_message_minimal.json"), endpoint=Endpoint.MESSAGES)
    assert (msg.guid, msg.entity_count) == (None, 3)


def test_datahub_refresh_may_be_empty_and_extra_keys_are_ignored() -> None:
    msg = check(message(data=[], refresh=True, priority=7, comment="x"), endpoint=Endpoint.MESSAGES)
    assert msg.entity_count == 0


def test_header_names_are_case_insensitive_and_defaults_come_from_settings() -> None:
    custom = IngestSettings(default_service="tenant0", default_service_path="/root")
    msg = check(v2(), {"CONTENT-TYPE": "Application/JSON;Charset=UTF-8"}, settings_=custom)
    assert (msg.service, msg.service_path) == ("tenant0", "/root")
    msg = check(v2(), {"content-type": "application/json", "FIWARE-SERVICE": "vehicles", "fiware-SERVICEPATH": "/x"})
    assert (msg.service, msg.service_path) == ("vehicles", "/x")


def test_comma_separated_service_paths_one_per_entity() -> None:
    body = raw("v2_normalized.json")
    msg = check(body, {**JSON, "Fiware-ServicePath": " /4wheels , /2wheels/sub/"})
    assert msg.service_path == "/4wheels,/2wheels/sub/"


def test_ten_service_path_levels_are_allowed() -> None:
    path = "/" + "/".join(f"l{i}" for i in range(10))
    assert check(v2(), {**JSON, "Fiware-ServicePath": path}).service_path == path


@pytest.mark.parametrize(
    ("header", "correlator", "cbnotif"),
    [
        ("9f3c5a2e-0d9b-11ef; cbnotif=2", "9f3c5a2e-0d9b-11ef", 2),
        ("9f3c5a2e-0d9b-11ef;cbnotif=12", "9f3c5a2e-0d9b-11ef", 12),
        ("9f3c5a2e-0d9b-11ef ; cbnotif= 3 ", "9f3c5a2e-0d9b-11ef", 3),
        ("9f3c5a2e-0d9b-11ef", "9f3c5a2e-0d9b-11ef", None),
        ("a;b; cbnotif=1", "a;b", 1),
        ("a; other=1", "a; other=1", None),
    ],
)
def test_correlator_suffix_is_stripped(header: str, correlator: str, cbnotif: int | None) -> None:
    msg = check(v2(), {**JSON, "Fiware-Correlator": header})
    assert (msg.correlator, msg.cbnotif) == (correlator, cbnotif)


def test_no_correlator() -> None:
    msg = check(v2())
    assert (msg.correlator, msg.cbnotif, msg.guid) == (None, None, None)


@pytest.mark.parametrize(
    ("headers", "from_correlator", "guid"),
    [
        ({"Fiware-Correlator": "c1; cbnotif=4"}, False, None),
        ({"Fiware-Correlator": "c1; cbnotif=4"}, True, "c1;cbnotif=4"),
        ({"Fiware-Correlator": "c1"}, True, None),
        ({"Fiware-Correlator": "c1; cbnotif=4", "X-Message-Guid": "g-7"}, True, "g-7"),
        ({"x-message-guid": " g-8 "}, False, "g-8"),
    ],
)
def test_guid_rules_for_ngsi(headers: dict[str, str], from_correlator: bool, guid: str | None) -> None:
    msg = check(v2(), {**JSON, **headers}, settings_=IngestSettings(guid_from_correlator=from_correlator))
    assert msg.guid == guid


def test_body_of_exactly_the_limit_is_accepted() -> None:
    body = v2()
    assert check(body, settings_=IngestSettings(max_body_bytes=len(body))).body == body


@pytest.mark.parametrize(
    ("status", "name"), [(400, "BadRequest"), (413, "PayloadTooLarge"), (415, "UnsupportedMediaType")]
)
def test_error_body(status: int, name: str) -> None:
    error = PayloadError(status, "data[0].id", "must be a string, got number")
    assert error.to_dict() == {"error": name, "field": "data[0].id", "description": "must be a string, got number"}
    assert (error.status, error.field, error.problem) == (status, "data[0].id", "must be a string, got number")


# ---------------------------------------------------------------------------------------------
# Refused: (status, field, problem substring)


def _del(key: str) -> Callable[[dict[str, Any]], object]:
    return lambda doc: doc.pop(key)


def _ld(change: Callable[[dict[str, Any]], object]) -> bytes:
    return changed("ld_notification.json", change)


def _ld_entity(change: Callable[[dict[str, Any]], object]) -> bytes:
    return _ld(lambda doc: change(doc["data"][0]))


LONG = "a" * 257
KV = {**JSON, "Ngsiv2-AttrsFormat": "keyValues"}
SN = {**JSON, "Ngsiv2-AttrsFormat": "simplifiedNormalized"}
SKV = {**JSON, "Ngsiv2-AttrsFormat": "simplifiedKeyValues"}
N = Endpoint.NOTIFY
LD = Endpoint.NGSI_LD
M = Endpoint.MESSAGES

MALFORMED: list[Any] = [
    # body syntax
    pytest.param(N, JSON, b'{"subscriptionId": "s", "data": [}', 400, "body", "invalid JSON", id="broken-json"),
    pytest.param(N, JSON, raw("v2_normalized.json")[:-40], 400, "body", "invalid JSON", id="truncated-json"),
    pytest.param(N, JSON, b"", 400, "body", "empty body", id="empty-body"),
    pytest.param(N, JSON, b" \r\n\t", 400, "body", "empty body", id="blank-body"),
    pytest.param(N, JSON, b'"car1"', 400, "body", "must be a JSON object, got string", id="string-body"),
    pytest.param(N, JSON, b"[" + v2() + b"]", 400, "body", "must be a JSON object, got array", id="array-body"),
    pytest.param(N, JSON, b"null", 400, "body", "got null", id="null-body"),
    pytest.param(N, JSON, b'{"subscriptionId": "\xff\xfe"}', 400, "body", "not valid UTF-8", id="bad-utf8"),
    pytest.param(N, JSON, b'{"a": "\\ud800"}', 400, "body", "invalid JSON", id="lone-surrogate"),
    pytest.param(
        N,
        JSON,
        b'{"subscriptionId": "s", "data": [{"id": "a", "type": "b", "x": {"value": 1e400}}]}',
        400,
        "body",
        "infinity",
        id="number-overflow",
    ),
    # NGSI v2 notification shape
    pytest.param(N, JSON, b'{"subscriptionId": "s"}', 400, "data", "required key 'data' is missing", id="no-data"),
    pytest.param(N, JSON, b'{"subscriptionId": "s", "data": []}', 400, "data", "must not be empty", id="empty-data"),
    pytest.param(N, JSON, b'{"subscriptionId": "s", "data": {}}', 400, "data", "JSON array, got object", id="data-obj"),
    pytest.param(N, JSON, b'{"data": [{"id": "a", "type": "b"}]}', 400, "subscriptionId", "missing", id="no-sub-id"),
    pytest.param(
        N, JSON, b'{"subscriptionId": "s", "data": [7]}', 400, "data[0]", "JSON object, got number", id="ent-num"
    ),
    pytest.param(N, JSON, v2({"type": "car"}), 400, "data[0].id", "required key 'id' is missing", id="no-id"),
    pytest.param(
        N, JSON, v2({"id": 42, "type": "car"}), 400, "data[0].id", "must be a string, got number", id="id-int"
    ),
    pytest.param(N, JSON, v2({"id": "a", "type": ""}), 400, "data[0].type", "must not be empty", id="empty-type"),
    pytest.param(N, JSON, v2(v2_entity(), {"id": "a\nb", "type": "t"}), 400, "data[1].id", "control char", id="id-ctl"),
    pytest.param(N, JSON, v2({"id": LONG, "type": "t"}), 400, "data[0].id", "longer than 256", id="id-too-long"),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(**{LONG: speed()})),
        400,
        f"data[0].{LONG}",
        "name longer than 256",
        id="attr-name-too-long",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(**{"sp\x00eed": speed()})),
        400,
        "data[0].sp\x00eed",
        "name contains control",
        id="attr-name-control",
    ),
    pytest.param(
        N, JSON, v2(v2_entity(**{"": speed()})), 400, "data[0].", "name must not be empty", id="attr-name-empty"
    ),
    pytest.param(N, JSON, v2(v2_entity(speed=12.5)), 400, "data[0].speed", "JSON object, got number", id="attr-bare"),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed={"type": "Float"})),
        400,
        "data[0].speed.value",
        "'value' is missing",
        id="attr-no-value",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed={"type": 1, "value": 2})),
        400,
        "data[0].speed.type",
        "must be a string",
        id="attr-type-int",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed=speed(metadata=[]))),
        400,
        "data[0].speed.metadata",
        "JSON object, got array",
        id="metadata-list",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed=speed(metadata={"accuracy": 0.5}))),
        400,
        "data[0].speed.metadata.accuracy",
        "JSON object, got number",
        id="metadata-item-bare",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed=speed(metadata={"accuracy": {"type": "Float"}}))),
        400,
        "data[0].speed.metadata.accuracy.value",
        "'value' is missing",
        id="metadata-no-value",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(speed=speed(metadata={"\x07": {"value": 1}}))),
        400,
        "data[0].speed.metadata.\x07",
        "name contains control",
        id="metadata-name-control",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(TimeInstant={"type": "DateTime", "value": "2015-13-40T00:00:00Z"})),
        400,
        "data[0].TimeInstant.value",
        "not an ISO 8601",
        id="attr-timeinstant-bad",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(alterationType={"type": "Text", "value": "entityMoved"})),
        400,
        "data[0].alterationType.value",
        "entityDelete",
        id="alteration-bad",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(alterationType=None)),
        400,
        "data[0].alterationType",
        "JSON object, got null",
        id="alteration-null",
    ),
    pytest.param(
        N,
        JSON,
        v2(v2_entity(dateCreated={"type": "DateTime", "value": "20 April"})),
        400,
        "data[0].dateCreated.value",
        "not an ISO 8601",
        id="date-created-bad",
    ),
    pytest.param(
        N,
        KV,
        v2(v2_entity(alterationType="entityMoved")),
        400,
        "data[0].alterationType",
        "entityCreate",
        id="kv-alteration-bad",
    ),
    pytest.param(
        N,
        KV,
        v2(v2_entity(dateModified="tomorrow")),
        400,
        "data[0].dateModified",
        "not an ISO 8601",
        id="kv-date-modified-bad",
    ),
    pytest.param(N, KV, v2(v2_entity(**{LONG: 1})), 400, f"data[0].{LONG}", "name longer than 256", id="kv-name-long"),
    pytest.param(N, SN, orjson.dumps({"type": "Room"}), 400, "id", "required key 'id' is missing", id="sn-no-id"),
    pytest.param(
        N,
        SN,
        orjson.dumps(v2_entity(temperature={"type": "Number"})),
        400,
        "temperature.value",
        "missing",
        id="sn-no-value",
    ),
    pytest.param(
        N,
        SKV,
        orjson.dumps({"id": "r", "type": ["Room"]}),
        400,
        "type",
        "must be a string, got array",
        id="skv-type-list",
    ),
    # headers
    pytest.param(
        N,
        {**JSON, "Ngsiv2-AttrsFormat": "values"},
        v2(),
        400,
        "header Ngsiv2-AttrsFormat",
        "supported: normalized, keyValues, simplifiedNormalized, simplifiedKeyValues",
        id="format-values",
    ),
    pytest.param(
        N,
        {**JSON, "ngsiv2-attrsformat": "legacy"},
        v2(),
        400,
        "header Ngsiv2-AttrsFormat",
        "unsupported format 'legacy'",
        id="format-legacy",
    ),
    pytest.param(
        N,
        {"Content-Type": "text/plain"},
        v2(),
        415,
        "header Content-Type",
        "unsupported media type 'text/plain'",
        id="content-type-text",
    ),
    pytest.param(N, {"Fiware-Service": "x"}, v2(), 415, "header Content-Type", "missing", id="content-type-missing"),
    pytest.param(N, {"Content-Type": ""}, v2(), 415, "header Content-Type", "missing", id="content-type-empty"),
    pytest.param(M, LD_JSON, message(), 415, "header Content-Type", "'application/ld+json'", id="messages-ld-json"),
    pytest.param(
        N,
        {"Content-Type": "application/json; charset=ISO-8859-1"},
        v2(),
        415,
        "header Content-Type",
        "charset 'iso-8859-1'",
        id="charset-latin1",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-ServicePath": "4wheels"},
        v2(),
        400,
        "header Fiware-ServicePath",
        "'4wheels' does not start with '/'",
        id="path-no-slash",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-ServicePath": "/a,,/b"},
        v2(),
        400,
        "header Fiware-ServicePath",
        "entry 2: '' does not start with '/'",
        id="path-empty-entry",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-ServicePath": "/a/b/c/d/e/f/g/h/i/j/k"},
        v2(),
        400,
        "header Fiware-ServicePath",
        "11 levels; at most 10",
        id="path-too-deep",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-ServicePath": "/a, /b, /c"},
        raw("v2_normalized.json"),
        400,
        "header Fiware-ServicePath",
        "3 comma-separated paths for 2 entities",
        id="path-count-mismatch",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-ServicePath": "/a,/b"},
        v2(),
        400,
        "header Fiware-ServicePath",
        "2 comma-separated paths for 1 entity;",
        id="path-list-one-entity",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-Service": "s" * 51},
        v2(),
        400,
        "header Fiware-Service",
        "longer than 50",
        id="service-too-long",
    ),
    pytest.param(
        N, {**JSON, "Fiware-Service": "  "}, v2(), 400, "header Fiware-Service", "must not be empty", id="service-empty"
    ),
    pytest.param(
        LD,
        {**LD_JSON, "NGSILD-Tenant": ""},
        raw("ld_notification.json"),
        400,
        "header NGSILD-Tenant",
        "must not be empty",
        id="ld-tenant-empty",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-Correlator": "abc; cbnotif=x"},
        v2(),
        400,
        "header Fiware-Correlator",
        "cbnotif must be a non-negative integer, got 'x'",
        id="cbnotif-not-int",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-Correlator": "abc; cbnotif=-1"},
        v2(),
        400,
        "header Fiware-Correlator",
        "got '-1'",
        id="cbnotif-negative",
    ),
    pytest.param(
        N,
        {**JSON, "Fiware-Correlator": "abc;cbnotif="},
        v2(),
        400,
        "header Fiware-Correlator",
        "got ''",
        id="cbnotif-empty",
    ),
    pytest.param(
        N,
        {**JSON, "X-Message-Guid": " "},
        v2(),
        400,
        "header X-Message-Guid",
        "must not be empty",
        id="guid-header-empty",
    ),
    # NGSI-LD
    pytest.param(
        LD,
        LD_JSON,
        _ld(lambda d: d.update(type="Notif")),
        400,
        "type",
        "must be 'Notification'; got 'Notif'",
        id="ld-wrong-type",
    ),
    pytest.param(LD, LD_JSON, _ld(_del("notifiedAt")), 400, "notifiedAt", "missing", id="ld-no-notified-at"),
    pytest.param(
        LD,
        LD_JSON,
        _ld(lambda d: d.update(notifiedAt="now")),
        400,
        "notifiedAt",
        "not an ISO 8601",
        id="ld-bad-notified-at",
    ),
    pytest.param(LD, LD_JSON, _ld(lambda d: d.update(data=[])), 400, "data", "must not be empty", id="ld-empty-data"),
    pytest.param(
        LD, LD_JSON, _ld_entity(lambda e: e.update(id="A4567")), 400, "data[0].id", "not a URI", id="ld-id-uri"
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e.update(type=["Vehicle", 3])),
        400,
        "data[0].type[1]",
        "must be a string, got number",
        id="ld-type-list-int",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["brandName"].pop("value")),
        400,
        "data[0].brandName.value",
        "required key 'value' is missing",
        id="ld-property-no-value",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["isParked"].pop("object")),
        400,
        "data[0].isParked.object",
        "required key 'object' is missing",
        id="ld-relationship-no-object",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["isParked"].update(object=[])),
        400,
        "data[0].isParked.object",
        "must be a URI string or a non-empty array",
        id="ld-relationship-empty-object",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["location"].update(observedAt="12:00")),
        400,
        "data[0].location.observedAt",
        "not an ISO 8601",
        id="ld-bad-observed-at",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["speed"][1].update(datasetId="urn:ngsi-ld:Property:speedometer")),
        400,
        "data[0].speed[1].datasetId",
        "duplicate datasetId 'urn:ngsi-ld:Property:speedometer'",
        id="ld-duplicate-dataset-id",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["speed"][1].pop("datasetId")),
        400,
        "data[0].speed[2].datasetId",
        "duplicate default instance",
        id="ld-two-default-instances",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["speed"].append([])),
        400,
        "data[0].speed[3]",
        "must be a JSON object, got array",
        id="ld-nested-list",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e.update(speed=[])),
        400,
        "data[0].speed",
        "must not be empty",
        id="ld-empty-multi-attribute",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["brandName"].update(type="Propertyy")),
        400,
        "data[0].brandName.type",
        "Property, Relationship, GeoProperty, LanguageProperty; got 'Propertyy'",
        id="ld-attribute-type-unknown",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["brandName"].pop("type")),
        400,
        "data[0].brandName.type",
        "required key 'type' is missing",
        id="ld-attribute-no-type",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e.update(brandName="Mercedes")),
        400,
        "data[0].brandName",
        "must be a JSON object, got string",
        id="ld-attribute-key-value",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["location"]["value"].pop("type")),
        400,
        "data[0].location.value.type",
        "required key 'type' is missing",
        id="ld-geo-no-geometry-type",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["location"].update(value="POINT (1 2)")),
        400,
        "data[0].location.value",
        "JSON object, got string",
        id="ld-geo-wkt",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["name"].pop("languageMap")),
        400,
        "data[0].name.languageMap",
        "missing",
        id="ld-language-no-map",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e["speed"][0].update(datasetId=7)),
        400,
        "data[0].speed[0].datasetId",
        "must be a string, got number",
        id="ld-dataset-id-int",
    ),
    pytest.param(
        LD,
        LD_JSON,
        _ld_entity(lambda e: e.update(createdAt="once")),
        400,
        "data[0].createdAt",
        "not an ISO 8601",
        id="ld-created-at-bad",
    ),
    # generic messages (seed 004)
    pytest.param(M, JSON, message(entity=DROP), 400, "entity", "required key 'entity' is missing", id="msg-no-entity"),
    pytest.param(M, JSON, message(entity=""), 400, "entity", "must not be empty", id="msg-empty-entity"),
    pytest.param(
        M, JSON, message(timestamp="05/06/2019 09:31"), 400, "timestamp", "not an ISO 8601", id="msg-timestamp-not-iso"
    ),
    pytest.param(
        M,
        JSON,
        message(timestamp=1559727077),
        400,
        "timestamp",
        "must be a string, got number",
        id="msg-timestamp-number",
    ),
    pytest.param(
        M,
        JSON,
        message(data=[{"n": 1}, 2]),
        400,
        "data[1]",
        "must be a JSON object, got number",
        id="msg-data-item-not-object",
    ),
    pytest.param(M, JSON, message(data={"n": 1}), 400, "data", "must be a JSON array, got object", id="msg-data-obj"),
    pytest.param(M, JSON, message(data=[]), 400, "data", "must not be empty unless refresh is true", id="msg-no-rows"),
    pytest.param(M, JSON, message(data=" \n "), 400, "data", "must not be empty", id="msg-data-blank-text"),
    pytest.param(M, JSON, message(data=12), 400, "data", "must be a JSON array, got number", id="msg-data-number"),
    pytest.param(M, JSON, message(guid=""), 400, "guid", "must not be empty", id="msg-guid-empty"),
    pytest.param(M, JSON, message(guid=12), 400, "guid", "must be a string, got number", id="msg-guid-int"),
    pytest.param(
        M, JSON, message(refresh="true"), 400, "refresh", "must be true or false, got string", id="msg-refresh-string"
    ),
    pytest.param(
        M, JSON, message(refresh=1), 400, "refresh", "must be true or false, got number", id="msg-refresh-int"
    ),
    pytest.param(M, JSON, message(source=["erp"]), 400, "source", "must be a string, got array", id="msg-source-list"),
    pytest.param(M, JSON, message(user=None), 400, "user", "must be a string, got null", id="msg-user-null"),
    # size
    pytest.param(N, JSON, b" " * 101, 413, "body", "101 bytes; at most 100", id="too-large"),
]


@pytest.mark.parametrize(("endpoint", "headers", "body", "status", "field", "problem"), MALFORMED)
def test_refused(
    endpoint: Endpoint, headers: dict[str, str], body: bytes, status: int, field: str, problem: str
) -> None:
    limits = IngestSettings(max_body_bytes=100) if status == 413 else DEFAULTS
    with pytest.raises(PayloadError) as caught:
        validate_request(endpoint, headers, body, limits)
    error = caught.value
    assert (error.status, error.field) == (status, field), error.problem
    assert problem in error.problem
    assert error.to_dict()["description"] == error.problem


def test_content_type_is_checked_before_size_and_size_before_body() -> None:
    with pytest.raises(PayloadError) as caught:
        validate_request(Endpoint.NOTIFY, {"Content-Type": "text/xml"}, b"x" * 200, IngestSettings(max_body_bytes=10))
    assert caught.value.status == 415
    with pytest.raises(PayloadError) as caught:
        validate_request(Endpoint.NOTIFY, JSON, b"x" * 200, IngestSettings(max_body_bytes=10))
    assert caught.value.status == 413


# ---------------------------------------------------------------------------------------------
# Nothing but PayloadError, whatever arrives

HEADER_CHOICES = st.sampled_from([JSON, LD_JSON, KV, SN, SKV, {"Content-Type": "application/json; charset=utf-8"}])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _outcome(endpoint: Endpoint, headers: dict[str, str], body: bytes) -> None:
    try:
        msg = validate_request(endpoint, headers, body, DEFAULTS)
    except PayloadError as error:
        assert error.status in (400, 413, 415)
        assert error.field and error.problem
        assert set(error.to_dict()) == {"error", "field", "description"}
    else:
        assert msg.body is body
        assert msg.entity_count >= 0


@settings(max_examples=300, deadline=None)
@given(endpoint=st.sampled_from(Endpoint), headers=HEADER_CHOICES, body=st.binary(max_size=300))
def test_random_bytes_raise_only_payload_error(endpoint: Endpoint, headers: dict[str, str], body: bytes) -> None:
    _outcome(endpoint, headers, body)


@settings(max_examples=300, deadline=None)
@given(endpoint=st.sampled_from(Endpoint), headers=HEADER_CHOICES, value=json_values)
def test_random_json_raises_only_payload_error(endpoint: Endpoint, headers: dict[str, str], value: Any) -> None:
    _outcome(endpoint, headers, orjson.dumps(value))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, (*prefix, i))
    return found


FIXTURE_CASES = [
    ("v2_normalized.json", JSON, Endpoint.NOTIFY),
    ("v2_key_values.json", KV, Endpoint.NOTIFY),
    ("v2_simplified_normalized.json", SN, Endpoint.NOTIFY),
    ("ld_notification.json", LD_JSON, Endpoint.NGSI_LD),
    ("datahub_message.json", JSON, Endpoint.MESSAGES),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(FIXTURE_CASES), data=st.data())
def test_fixture_with_one_value_replaced_raises_only_payload_error(case: Any, data: st.DataObject) -> None:
    name, headers, endpoint = case
    doc = fixture(name)
    path = data.draw(st.sampled_from(_paths(doc)[1:]))
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = data.draw(json_values)
    _outcome(endpoint, headers, orjson.dumps(doc))
