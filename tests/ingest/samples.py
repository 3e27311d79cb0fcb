"""Notification bodies and headers for the ingest tests, shaped like what Orion and Orion-LD send."""

from __future__ import annotations

from typing import Any

import orjson

JSON = {"Content-Type": "application/json"}
LD_JSON = {"Content-Type": "application/ld+json"}


def v2_normalized(entity_id: str = "Car1", speed: float = 12.5) -> dict[str, Any]:
    return {
        "subscriptionId": "5f3c2c1e9d1b2a0001a1b2c3",
        "data": [
            {
                "id": entity_id,
                "type": "Car",
                "speed": {
                    "type": "Number",
                    "value": speed,
                    "metadata": {"TimeInstant": {"type": "DateTime", "value": "2026-11-22T14:30:00.000Z"}},
                },
                "location": {"type": "geo:json", "value": {"type": "Point", "coordinates": [-3.7, 40.4]}},
                "TimeInstant": {"type": "DateTime", "value": "2026-11-22T14:30:00.000Z", "metadata": {}},
            }
        ],
    }


def v2_key_values(entity_id: str = "Car1") -> dict[str, Any]:
    return {
        "subscriptionId": "5f3c2c1e9d1b2a0001a1b2c3",
        "data": [{"id": entity_id, "type": "Car", "speed": 80, "name": 'Ünïcode "quoted" name'}],
    }


def ld_notification(entity_id: str = "urn:ngsi-ld:Vehicle:A4567") -> dict[str, Any]:
    return {
        "id": "urn:ngsi-ld:Notification:1",
        "type": "Notification",
        "subscriptionId": "urn:ngsi-ld:Subscription:1",
        "notifiedAt": "2026-11-22T14:30:00.000Z",
        "data": [
            {
                "id": entity_id,
                "type": "Vehicle",
                "speed": {"type": "Property", "value": 55, "observedAt": "2026-11-22T14:29:59.000Z"},
                "isParked": {"type": "Relationship", "object": "urn:ngsi-ld:OffStreetParking:Downtown1"},
            }
        ],
    }


def datahub_message(guid: str | None = "guid-0001") -> dict[str, Any]:
    message: dict[str, Any] = {
        "entity": "sensors",
        "timestamp": "2026-11-22T14:30:00",
        "data": [{"id": "s1", "temperature": 21.5}, {"id": "s2", "temperature": 19.0}],
    }
    if guid is not None:
        message["guid"] = guid
    return message


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def pretty(value: Any) -> bytes:
    """Indented JSON with CRLF line ends: the receiver must turn them into spaces and keep the rest."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).replace(b"\n", b"\r\n")
