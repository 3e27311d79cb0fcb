"""A seeded smart-city sample: the HTTP requests Orion, Orion-LD and a data-hub loader would send.

One JSON line per HTTP request, read by the file loader and by the poster (``demo/post.py``)::

    {"endpoint": "notify", "headers": {"Content-Type": "application/json", ...}, "body": {...}}
    {"endpoint": "notify", "headers": {...}, "body_text": "{\\"subscriptionId\\": \\"5f3"}

``endpoint`` is ``notify`` (POST /notify, NGSI v2), ``ngsi-ld`` (POST /ngsi-ld/notify) or
``messages`` (POST /messages, the seed 004 message). ``body`` is a JSON value; a body that is not
valid JSON is carried verbatim in ``body_text`` instead.

The city, over ``hours`` simulated hours from ``start``:

- cars (service ``vehicles``, paths ``/4wheels`` and ``/2wheels``, plus some on the default tenant,
  which Orion notifies without a ``Fiware-Service`` header), NGSI v2 normalized with TimeInstant
  metadata, some with the ``dateModified``/``alterationType`` built-ins;
- air-quality stations (``environment`` ``/airquality``), keyValues and normalized, with a
  TimeInstant attribute, some notifications carrying several entities;
- waste containers (``waste`` ``/containers``), simplifiedNormalized and simplifiedKeyValues, some
  ending their life with ``alterationType`` ``entityDelete``;
- parking spots (``parking``), NGSI-LD with ``observedAt``, a Relationship and a GeoProperty, a few
  with several ``datasetId`` instances of one attribute;
- generic data-hub messages (``product``, ``container_route``).

Mixed in, as in real traffic: about 3% of notifications arrive after a newer notification of the
same entity, about 1% are exact re-sends, and about 1% are malformed in varied ways. Everything is
drawn from one ``random.Random(seed)``, so one seed always gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from ngsi_assets.ngsi.constants import (
    ALTERATION_TYPES,
    ATTR_ALTERATION_TYPE,
    ATTR_DATE_MODIFIED,
    ATTR_TIME_INSTANT,
    DEFAULT_SERVICE,
    LD_CONTEXT,
    LD_DATASET_ID,
    LD_GEOPROPERTY,
    LD_NOTIFICATION,
    LD_OBSERVED_AT,
    LD_PROPERTY,
    LD_RELATIONSHIP,
    MD_TIME_INSTANT,
    Format,
    Kind,
)

DEFAULT_START = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)

ENDPOINT_PATHS: dict[str, str] = {
    "notify": "/notify",
    "ngsi-ld": "/ngsi-ld/notify",
    "messages": "/messages",
}
ENDPOINT_KINDS: dict[str, Kind] = {
    "notify": Kind.NGSI_V2,
    "ngsi-ld": Kind.NGSI_LD,
    "messages": Kind.MESSAGE,
}

# Header names as Orion writes them on the wire.
H_CONTENT_TYPE = "Content-Type"
H_SERVICE = "Fiware-Service"
H_SERVICE_PATH = "Fiware-ServicePath"
H_CORRELATOR = "Fiware-Correlator"
H_ATTRS_FORMAT = "Ngsiv2-AttrsFormat"
H_MESSAGE_GUID = "X-Message-Guid"

JSON = "application/json"
LD_JSON = "application/ld+json"
LD_CORE_CONTEXT = "https://uri.etsi.org/ngsi-ld/v1/ngsi-ld-core-context.jsonld"
PARKING_CONTEXT = "https://smartdatamodels.org/context.jsonld"

# The kinds of malformed request the sample contains, one name per way of being wrong.
MALFORMED_REASONS = (
    "truncated_json",
    "not_json",
    "entity_without_id",
    "empty_attribute_name",
    "wrong_content_type",
    "unsupported_attrs_format",
    "service_path_without_slash",
    "bad_time_instant",
    "data_not_array",
    "ld_property_without_value",
    "ld_relationship_without_object",
    "message_without_entity",
)

# Share of the requests, by what they are; the NGSI streams split what remains after these.
DUPLICATE_SHARE = 0.01
MALFORMED_SHARE = 0.01
OUT_OF_ORDER_SHARE = 0.03
MESSAGE_SHARE = 0.025
STREAM_SHARES = {"cars": 0.36, "default_cars": 0.06, "air": 0.16, "waste": 0.17, "parking": 0.25}

# Santander, where FIWARE's smart-city deployments started.
CITY_LON = -3.8044
CITY_LAT = 43.4623
_GUID_NAMESPACE = uuid.UUID("6f1c2a52-8d0e-5b7e-9a43-1d2f8c3b7e10")

ENTITY_CREATE, ENTITY_UPDATE, ENTITY_DELETE, ENTITY_CHANGE = ALTERATION_TYPES

_MAX_LATENCY_MS = 2_000  # Orion's notify latency in the sample; out-of-order delays exceed it


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request of the sample: endpoint, headers, and a JSON body or a raw text body."""

    endpoint: str
    headers: dict[str, str]
    body: Any = None
    body_text: str | None = None

    @property
    def path(self) -> str:
        """The URL path the request is POSTed to."""
        return ENDPOINT_PATHS[self.endpoint]

    def data(self) -> bytes:
        """The bytes sent as the HTTP body."""
        if self.body_text is not None:
            return self.body_text.encode("utf-8")
        return orjson.dumps(self.body)

    def to_line(self) -> bytes:
        """Serialise as one JSON line (ends with a newline)."""
        record: dict[str, Any] = {"endpoint": self.endpoint, "headers": self.headers}
        if self.body_text is not None:
            record["body_text"] = self.body_text
        else:
            record["body"] = self.body
        return orjson.dumps(record) + b"\n"

    @classmethod
    def from_line(cls, line: str | bytes) -> Request:
        """Parse one JSON line written by :meth:`to_line`."""
        record = orjson.loads(line)
        endpoint = record["endpoint"]
        if endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        headers = {str(k): str(v) for k, v in record.get("headers", {}).items()}
        if "body_text" in record:
            return cls(endpoint, headers, body_text=str(record["body_text"]))
        if "body" not in record:
            raise ValueError("a request line needs 'body' or 'body_text'")
        return cls(endpoint, headers, body=record["body"])


@dataclass(frozen=True)
class CitySummary:
    """What a generated sample contains, so tests and benchmarks know what to expect downstream.

    ``by_kind``, ``by_format`` and ``by_service`` count the well-formed requests (exact re-sends
    included, since a receiver accepts them too); ``malformed`` requests are counted apart, by reason.
    ``out_of_order``, ``distinct_entities``, ``attribute_updates``, ``entity_deletes`` and
    ``message_records`` count well-formed requests that are not re-sends. A request is out of order
    when one of its entities (for a message: one of its records' keys) already arrived, earlier in
    the file, with a strictly newer payload timestamp. An attribute update is one attribute of one
    notified entity (built-ins such as ``TimeInstant``, ``dateModified`` and ``alterationType``
    included, each ``datasetId`` instance of an NGSI-LD attribute counted once); ``id``, ``type``
    and ``@context`` are not attributes. Indices are 0-based positions in the request list.
    """

    seed: int
    start: str
    end: str
    requests: int
    by_endpoint: dict[str, int]
    by_kind: dict[str, int]
    by_format: dict[str, int]
    by_service: dict[str, int]
    malformed: int
    malformed_by_reason: dict[str, int]
    duplicates: int
    duplicates_with_guid_header: int
    out_of_order: int
    distinct_entities: int
    entities_by_type: dict[str, int]
    attribute_updates: int
    entity_deletes: int
    message_records: int
    malformed_indices: tuple[int, ...] = field(repr=False)
    duplicate_indices: tuple[int, ...] = field(repr=False)
    out_of_order_indices: tuple[int, ...] = field(repr=False)

    def counts(self) -> dict[str, Any]:
        """The summary without the index lists, JSON-ready."""
        out = asdict(self)
        for key in ("malformed_indices", "duplicate_indices", "out_of_order_indices"):
            out.pop(key)
        return out


# Entity key for ordering checks: (service, entity type, entity id) for NGSI, or
# ("message", source entity, record key) for a data-hub record.
_Key = tuple[str, str, str]


@dataclass(slots=True)
class _Draft:
    """A request on its way into the sample, with what the generator knows about it."""

    request: Request
    emitted_ms: int
    send_ms: int
    kind: Kind
    format: Format | None
    service: str | None
    stamps: tuple[tuple[_Key, int], ...] = ()
    attribute_updates: int = 0
    entity_deletes: int = 0
    message_records: int = 0
    malformed: str | None = None
    duplicate_of: _Draft | None = None
    delayed: bool = False
    seq: int = 0


# --- small helpers -------------------------------------------------------------------------------


def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _iso(ms: int) -> str:
    """ISO 8601 UTC with milliseconds, as Orion writes DateTime values."""
    return f"{_second(ms // 1000)}.{ms % 1000:03d}Z"


def _hub_timestamp(ms: int) -> str:
    """The data hub's message timestamp: local-style, seconds and ``.000`` (seed 004)."""
    return f"{_second(ms // 1000)}.000"


def _uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _object_id(rng: random.Random) -> str:
    """A MongoDB ObjectId-like hex string, as Orion's subscription ids are."""
    return f"{rng.getrandbits(96):024x}"


def _correlator(rng: random.Random) -> str:
    """``<uuid>; cbnotif=<n>``; n is the notification's number within the triggering update."""
    base = _uuid4(rng)
    if rng.random() < 0.05:
        return base  # older Orion releases send no suffix
    n = rng.choices((1, 2, 3), weights=(85, 12, 3))[0]
    return f"{base}; cbnotif={n}"


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """``total`` split into ``parts`` near-equal whole numbers, the remainder placed at random."""
    base, rest = divmod(total, parts)
    counts = [base] * parts
    for i in rng.sample(range(parts), rest):
        counts[i] += 1
    return counts


def _times(rng: random.Random, n: int, lo_ms: int, hi_ms: int) -> list[int]:
    """``n`` increasing emission times in [lo, hi): periodic with jitter, like a sensor's reports."""
    if n <= 0:
        return []
    period = (hi_ms - lo_ms) / n
    # offset and jitter together stay inside (0.05, 0.95) of a period, so no time is clamped
    offset = rng.uniform(0.35, 0.65) * period
    out: list[int] = []
    last = lo_ms - 1
    for j in range(n):
        t = int(lo_ms + offset + j * period + rng.uniform(-0.3, 0.3) * period)
        t = min(max(t, last + 1), hi_ms - 1)
        out.append(t)
        last = t
    return out


def _walk(rng: random.Random, lon: float, lat: float, metres: float) -> tuple[float, float]:
    """Move a point about ``metres`` in a random direction, kept inside the city box."""
    dx = rng.uniform(-1.0, 1.0) * metres / 80_000
    dy = rng.uniform(-1.0, 1.0) * metres / 111_000
    lon = min(max(lon + dx, CITY_LON - 0.05), CITY_LON + 0.05)
    lat = min(max(lat + dy, CITY_LAT - 0.03), CITY_LAT + 0.03)
    return round(lon, 6), round(lat, 6)


def _point(lon: float, lat: float) -> dict[str, Any]:
    return {"type": "Point", "coordinates": [lon, lat]}


def _diurnal(ms: int) -> float:
    """A traffic-shaped factor in [0.6, 1.4] over the UTC hour of day."""
    hour = datetime.fromtimestamp(ms // 1000, UTC).hour
    return 0.6 + 0.8 * (1.0 if 7 <= hour <= 9 or 17 <= hour <= 19 else 0.5 if 10 <= hour <= 16 else 0.1)


def _v2_headers(
    rng: random.Random,
    service: str | None,
    service_path: str,
    attrs_format: str,
    content_type: str = JSON,
) -> dict[str, str]:
    headers = {H_CONTENT_TYPE: content_type}
    if service is not None:
        headers[H_SERVICE] = service
    headers[H_SERVICE_PATH] = service_path
    headers[H_CORRELATOR] = _correlator(rng)
    headers[H_ATTRS_FORMAT] = attrs_format
    return headers


def _count_attrs(entity: dict[str, Any]) -> int:
    n = 0
    for name, value in entity.items():
        if name in ("id", "type", LD_CONTEXT):
            continue
        n += len(value) if isinstance(value, list) and value and isinstance(value[0], dict) else 1
    return n


# --- the city's entities -------------------------------------------------------------------------


@dataclass(slots=True)
class _Car:
    entity_id: str
    lon: float
    lat: float
    speed: float = 0.0
    oil: float = 0.0


def _car_entity(rng: random.Random, car: _Car, ms: int, builtins: bool) -> dict[str, Any]:
    """Advance a car to ``ms`` and return its NGSI v2 normalized entity."""
    previous = car.speed
    parked = rng.random() < 0.15
    car.speed = 0.0 if parked else round(max(3.0, rng.gauss(38.0, 16.0) * _diurnal(ms)), 1)
    car.oil = round(max(0.05, car.oil - rng.uniform(0.0, 0.004)), 3)
    if not parked:
        car.lon, car.lat = _walk(rng, car.lon, car.lat, car.speed * 40)
    stamp = {MD_TIME_INSTANT: {"type": "DateTime", "value": _iso(ms)}}
    entity: dict[str, Any] = {
        "id": car.entity_id,
        "type": "car",
        "speed": {"type": "Number", "value": car.speed, "metadata": stamp},
        "oil_level": {"type": "Number", "value": car.oil, "metadata": stamp},
        "location": {"type": "geo:json", "value": _point(car.lon, car.lat), "metadata": stamp},
    }
    if builtins:
        alteration = ENTITY_UPDATE if car.speed == previous else ENTITY_CHANGE
        entity[ATTR_DATE_MODIFIED] = {"type": "DateTime", "value": _iso(ms), "metadata": {}}
        entity[ATTR_ALTERATION_TYPE] = {"type": "Text", "value": alteration, "metadata": {}}
    return entity


def _air_values(rng: random.Random, ms: int, base: float) -> dict[str, float]:
    f = _diurnal(ms) * base
    return {
        "NO2": round(max(2.0, rng.gauss(38.0 * f, 8.0)), 1),
        "PM10": round(max(1.0, rng.gauss(22.0 * f, 5.0)), 1),
        "PM2_5": round(max(0.5, rng.gauss(11.0 * f, 3.0)), 1),
        "O3": round(max(5.0, rng.gauss(70.0 / f, 12.0)), 1),
        "temperature": round(rng.gauss(12.5, 1.5), 1),
    }


def _air_entity(entity_id: str, values: dict[str, float], ms: int, key_values: bool) -> dict[str, Any]:
    entity: dict[str, Any] = {"id": entity_id, "type": "AirQualityObserved"}
    if key_values:
        entity.update(values)
        entity[ATTR_TIME_INSTANT] = _iso(ms)
    else:
        for name, value in values.items():
            entity[name] = {"type": "Number", "value": value, "metadata": {}}
        entity[ATTR_TIME_INSTANT] = {"type": "DateTime", "value": _iso(ms), "metadata": {}}
    return entity


@dataclass(slots=True)
class _Container:
    entity_id: str
    key_values: bool
    lifecycle: bool
    born_ms: int
    dies_ms: int | None
    filling: float
    temperature: float


def _container_entity(rng: random.Random, box: _Container, ms: int, alteration: str | None) -> dict[str, Any]:
    """Advance a container to ``ms`` and return its simplified entity."""
    box.filling = round(box.filling + rng.uniform(0.0, 0.09), 2)
    if box.filling > 1.0 or (box.filling > 0.85 and rng.random() < 0.3):
        box.filling = round(rng.uniform(0.0, 0.08), 2)  # collected
    box.temperature = round(box.temperature + rng.uniform(-0.4, 0.4), 1)
    status = "full" if box.filling >= 0.9 else "lidOpen" if rng.random() < 0.03 else "ok"
    values: dict[str, Any] = {
        "fillingLevel": box.filling,
        "temperature": box.temperature,
        "status": status,
    }
    types = {"fillingLevel": "Number", "temperature": "Number", "status": "Text"}
    entity: dict[str, Any] = {"id": box.entity_id, "type": "WasteContainer"}
    if box.key_values:
        entity.update(values)
        entity[ATTR_TIME_INSTANT] = _iso(ms)
        if alteration is not None:
            entity[ATTR_ALTERATION_TYPE] = alteration
    else:
        for name, value in values.items():
            entity[name] = {"type": types[name], "value": value, "metadata": {}}
        entity[ATTR_TIME_INSTANT] = {"type": "DateTime", "value": _iso(ms), "metadata": {}}
        if alteration is not None:
            entity[ATTR_ALTERATION_TYPE] = {"type": "Text", "value": alteration, "metadata": {}}
    return entity


@dataclass(slots=True)
class _Spot:
    entity_id: str
    site: str
    lon: float
    lat: float
    sensors: tuple[str, ...]
    status: str = "free"


def _spot_entity(rng: random.Random, spot: _Spot, ms: int, full: bool) -> dict[str, Any]:
    """Advance a parking spot to ``ms`` and return its NGSI-LD entity.

    ``full`` notifications carry the Relationship and GeoProperty too; the others only the status.
    """
    roll = rng.random()
    if roll < 0.01:
        spot.status = "closed"
    elif roll < 0.02:
        spot.status = "unknown"
    else:
        spot.status = "occupied" if rng.random() < 0.55 else "free"
    entity: dict[str, Any] = {"id": spot.entity_id, "type": "ParkingSpot"}
    if len(spot.sensors) > 1:
        entity["status"] = [
            {
                "type": LD_PROPERTY,
                "value": spot.status if i == 0 or rng.random() < 0.9 else "unknown",
                LD_OBSERVED_AT: _iso(ms - 250 * i),
                LD_DATASET_ID: sensor,
            }
            for i, sensor in enumerate(spot.sensors)
        ]
    else:
        entity["status"] = {"type": LD_PROPERTY, "value": spot.status, LD_OBSERVED_AT: _iso(ms)}
    if full:
        entity["refParkingSite"] = {"type": LD_RELATIONSHIP, "object": spot.site}
        entity["location"] = {"type": LD_GEOPROPERTY, "value": _point(spot.lon, spot.lat)}
    return entity


def _ld_notification(rng: random.Random, subscription: str, ms: int, data: list[Any]) -> dict[str, Any]:
    return {
        "id": f"urn:ngsi-ld:Notification:{_uuid4(rng)}",
        "type": LD_NOTIFICATION,
        "subscriptionId": subscription,
        "notifiedAt": _iso(ms + rng.randint(1, 40)),
        "data": data,
        LD_CONTEXT: [PARKING_CONTEXT, LD_CORE_CONTEXT],
    }


def _ld_headers(rng: random.Random) -> dict[str, str]:
    return {H_CONTENT_TYPE: LD_JSON, H_SERVICE: "parking", H_CORRELATOR: _uuid4(rng)}


# --- the streams ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _City:
    rng: random.Random
    start_ms: int
    end_ms: int
    subscriptions: dict[str, str]
    cars: dict[str, list[_Car]]
    stations: list[list[str]]
    containers: list[_Container]
    spots: list[list[_Spot]]
    products: list[tuple[int, str, float]]


def _build_city(rng: random.Random, start_ms: int, end_ms: int) -> _City:
    def cars(prefix: str, n: int) -> list[_Car]:
        return [
            _Car(f"{prefix}{i:04d}", *_walk(rng, CITY_LON, CITY_LAT, 3000), oil=round(rng.uniform(0.4, 1.0), 3))
            for i in range(1, n + 1)
        ]

    span = end_ms - start_ms
    containers: list[_Container] = []
    for i in range(1, 151):
        lifecycle = rng.random() < 0.3
        born = start_ms
        dies: int | None = None
        if lifecycle and rng.random() < 0.35:
            born = start_ms + int(rng.uniform(0.05, 0.4) * span)
        if lifecycle and rng.random() < 0.4:
            dies = start_ms + int(rng.uniform(0.55, 0.95) * span)
        containers.append(
            _Container(
                f"wastecontainer-{i:04d}",
                key_values=rng.random() < 0.5,
                lifecycle=lifecycle,
                born_ms=born,
                dies_ms=dies,
                filling=round(rng.uniform(0.0, 0.7), 2),
                temperature=round(rng.gauss(11.0, 2.0), 1),
            )
        )

    sites = ("centro", "sardinero", "puertochico", "castilla-hermida", "cuatro-caminos")
    spots: list[list[_Spot]] = []
    for s, site in enumerate(sites):
        site_id = f"urn:ngsi-ld:ParkingSite:santander:{site}"
        lon, lat = _walk(rng, CITY_LON, CITY_LAT, 2500)
        group = []
        for i in range(1, 51):
            multi = (s * 50 + i) % 25 == 0  # ten spots with two sensors each
            sensors = ("urn:ngsi-ld:Dataset:magnetometer", "urn:ngsi-ld:Dataset:camera") if multi else ("",)
            group.append(
                _Spot(
                    f"urn:ngsi-ld:ParkingSpot:santander:{site}:{i:03d}",
                    site_id,
                    *_walk(rng, lon, lat, 150),
                    sensors=sensors,
                )
            )
        spots.append(group)

    catalogue = ("Toaster", "Kettle", "Microwave", "Blender", "Fridge", "Iron", "Fan", "Heater")
    brands = ("Breville", "Kenwood", "Panasonic", "Bosch", "Philips", "Tefal")
    products = [
        (1_000_000 + i * 7919, f"{rng.choice(brands)} {rng.choice(catalogue)}", round(rng.uniform(9, 400), 2))
        for i in range(400)
    ]

    return _City(
        rng=rng,
        start_ms=start_ms,
        end_ms=end_ms,
        subscriptions={name: _object_id(rng) for name in ("cars", "2wheels", "default", "air_kv", "air_n")}
        | {"parking": f"urn:ngsi-ld:Subscription:{_uuid4(rng)}"},
        cars={"/4wheels": cars("car-4w-", 120), "/2wheels": cars("car-2w-", 60), "/": cars("car-", 30)},
        stations=[[f"AirQualityObserved:Santander:D{d}S{s}" for s in range(1, 6)] for d in range(1, 9)],
        containers=containers,
        spots=spots,
        products=products,
    )


def _message_guid(kind: str, text: str) -> str:
    """A type 5 UUID from the data that identifies a message, as seed 004 recommends."""
    return str(uuid.uuid5(_GUID_NAMESPACE, f"{kind}|{text}"))


def _car_drafts(city: _City, count: int, default_tenant: bool) -> list[_Draft]:
    rng = city.rng
    if default_tenant:
        fleets = [("/", city.cars["/"], None, city.subscriptions["default"])]
        counts = [count]
    else:
        fleets = [
            ("/4wheels", city.cars["/4wheels"], "vehicles", city.subscriptions["cars"]),
            ("/2wheels", city.cars["/2wheels"], "vehicles", city.subscriptions["2wheels"]),
        ]
        counts = [count * 2 // 3, count - count * 2 // 3]
    drafts: list[_Draft] = []
    for (path, cars, service, subscription), fleet_count in zip(fleets, counts, strict=True):
        for car, n in zip(cars, _split(fleet_count, len(cars), rng), strict=True):
            for ms in _times(rng, n, city.start_ms, city.end_ms):
                entity = _car_entity(rng, car, ms, builtins=rng.random() < 0.25)
                headers = _v2_headers(rng, service, path, Format.NORMALIZED.value)
                body = {"subscriptionId": subscription, "data": [entity]}
                if path == "/2wheels":
                    # this fleet's gateway stamps its own message id on every notification
                    headers[H_MESSAGE_GUID] = _message_guid("ngsi", headers[H_CORRELATOR])
                drafts.append(
                    _Draft(
                        Request("notify", headers, body),
                        emitted_ms=ms,
                        send_ms=0,
                        kind=Kind.NGSI_V2,
                        format=Format.NORMALIZED,
                        service=service or DEFAULT_SERVICE,
                        stamps=(((service or DEFAULT_SERVICE, "car", car.entity_id), ms),),
                        attribute_updates=_count_attrs(entity),
                    )
                )
    return drafts


def _ticks(rng: random.Random, groups: int, count: int, lo: int, hi: int) -> list[list[int]]:
    return [_times(rng, n, lo, hi) for n in _split(count, groups, rng)]


def _air_drafts(city: _City, count: int) -> list[_Draft]:
    rng = city.rng
    drafts: list[_Draft] = []
    for district, times in zip(
        city.stations, _ticks(rng, len(city.stations), count, city.start_ms, city.end_ms), strict=True
    ):
        base = rng.uniform(0.7, 1.3)
        turn = 0
        for ms in times:
            if rng.random() < 0.3:
                members = sorted(rng.sample(district, rng.randint(2, len(district))))
            else:
                members = [district[turn % len(district)]]
                turn += 1
            key_values = rng.random() < 0.5
            fmt = Format.KEY_VALUES if key_values else Format.NORMALIZED
            # several entities changed by one update, stamped a few milliseconds apart
            stamped = [(station, ms + 3 * i) for i, station in enumerate(members)]
            entities = [_air_entity(s, _air_values(rng, t, base), t, key_values) for s, t in stamped]
            path = "/airquality"
            if len(members) > 1 and rng.random() < 0.5:
                path = ",".join(["/airquality"] * len(members))
            sub = city.subscriptions["air_kv" if key_values else "air_n"]
            drafts.append(
                _Draft(
                    Request(
                        "notify",
                        _v2_headers(rng, "environment", path, fmt.value),
                        {"subscriptionId": sub, "data": entities},
                    ),
                    emitted_ms=stamped[-1][1],
                    send_ms=0,
                    kind=Kind.NGSI_V2,
                    format=fmt,
                    service="environment",
                    stamps=tuple((("environment", "AirQualityObserved", s), t) for s, t in stamped),
                    attribute_updates=sum(_count_attrs(e) for e in entities),
                )
            )
    return drafts


def _waste_drafts(city: _City, count: int) -> list[_Draft]:
    rng = city.rng
    boxes = city.containers
    lives = [(box.dies_ms or city.end_ms) - box.born_ms for box in boxes]
    total_life = sum(lives)
    # Share the notifications out by lifetime, so every container reports at a similar rate.
    counts = [max(2, count * life // total_life) for life in lives]
    while sum(counts) > count:
        counts[max(range(len(counts)), key=counts.__getitem__)] -= 1
    shortfall = count - sum(counts)
    if shortfall > 0:
        for i in rng.sample(range(len(counts)), shortfall):
            counts[i] += 1
    drafts: list[_Draft] = []
    for box, n in zip(boxes, counts, strict=True):
        times = _times(rng, n, box.born_ms, box.dies_ms or city.end_ms)
        fmt = Format.SIMPLIFIED_KEY_VALUES if box.key_values else Format.SIMPLIFIED_NORMALIZED
        for j, ms in enumerate(times):
            alteration: str | None = None
            if box.lifecycle:
                alteration = ENTITY_UPDATE
                if j == 0 and box.born_ms > city.start_ms:
                    alteration = ENTITY_CREATE
                elif j == len(times) - 1 and box.dies_ms is not None:
                    alteration = ENTITY_DELETE
            entity = _container_entity(rng, box, ms, alteration)
            drafts.append(
                _Draft(
                    Request("notify", _v2_headers(rng, "waste", "/containers", fmt.value), entity),
                    emitted_ms=ms,
                    send_ms=0,
                    kind=Kind.NGSI_V2,
                    format=fmt,
                    service="waste",
                    stamps=((("waste", "WasteContainer", box.entity_id), ms),),
                    attribute_updates=_count_attrs(entity),
                    entity_deletes=int(alteration == ENTITY_DELETE),
                )
            )
    return drafts


def _parking_drafts(city: _City, count: int) -> list[_Draft]:
    rng = city.rng
    drafts: list[_Draft] = []
    for site, times in zip(city.spots, _ticks(rng, len(city.spots), count, city.start_ms, city.end_ms), strict=True):
        for ms in times:
            members = rng.sample(site, rng.randint(2, 3)) if rng.random() < 0.15 else [rng.choice(site)]
            members.sort(key=lambda spot: spot.entity_id)
            entities = [_spot_entity(rng, spot, ms, full=rng.random() < 0.3) for spot in members]
            headers = _ld_headers(rng)
            if rng.random() < 0.2:
                headers[H_MESSAGE_GUID] = _message_guid("ngsi-ld", headers[H_CORRELATOR])
            drafts.append(
                _Draft(
                    Request("ngsi-ld", headers, _ld_notification(rng, city.subscriptions["parking"], ms, entities)),
                    emitted_ms=ms,
                    send_ms=0,
                    kind=Kind.NGSI_LD,
                    format=Format.LD_NORMALIZED,
                    service="parking",
                    stamps=tuple((("parking", "ParkingSpot", spot.entity_id), ms) for spot in members),
                    attribute_updates=sum(_count_attrs(e) for e in entities),
                )
            )
    return drafts


def _message_drafts(city: _City, count: int) -> list[_Draft]:
    rng = city.rng
    drafts: list[_Draft] = []
    routes = [f"R-{i:02d}" for i in range(1, 13)]
    for n, ms in enumerate(_times(rng, count, city.start_ms, city.end_ms)):
        ms -= ms % 1000  # the hub's timestamps have whole seconds
        stamp = _hub_timestamp(ms)
        if rng.random() < 0.7:
            entity, source, user = "product", "erp", rng.choice(("svc-erp", "jdoe", "asmith"))
            data: list[dict[str, Any]] = []
            keys = []
            for number, description, price in sorted(rng.sample(city.products, rng.randint(1, 6))):
                if rng.random() < 0.05:
                    data.append({"product_number": number, "deleted_indicator": True})
                else:
                    new_price = round(price * rng.uniform(0.9, 1.1), 2)
                    data.append(
                        {
                            "product_number": number,
                            "product_description": description,
                            "unit_price": new_price,
                            "stock": rng.randint(0, 250),
                        }
                    )
                keys.append(str(number))
        else:
            entity, source, user = "container_route", "fleet-manager", "svc-fleet"
            route = rng.choice(routes)
            chosen = sorted(rng.sample(city.containers, rng.randint(2, 8)), key=lambda box: box.entity_id)
            data = [
                {
                    "route_id": route,
                    "container_id": box.entity_id,
                    "sequence": seq,
                    "truck": f"TRK-{routes.index(route) % 5 + 1:02d}",
                    "collected": rng.random() < 0.8,
                    "weight_kg": round(rng.uniform(5, 180), 1),
                }
                for seq, box in enumerate(chosen, start=1)
            ]
            keys = [f"{route}/{box.entity_id}" for box in chosen]
        body: dict[str, Any] = {"entity": entity, "timestamp": stamp, "data": data}
        if rng.random() < 0.85:
            body["guid"] = _message_guid(entity, f"{source}|{stamp}|{n}")
        body["source"] = source
        body["user"] = user
        drafts.append(
            _Draft(
                Request("messages", {H_CONTENT_TYPE: JSON}, body),
                emitted_ms=ms,
                send_ms=0,
                kind=Kind.MESSAGE,
                format=Format.DATAHUB,
                service=None,
                stamps=tuple((("message", entity, key), ms) for key in keys),
                message_records=len(data),
            )
        )
    return drafts


# --- malformed requests --------------------------------------------------------------------------


def _malformed(city: _City, reason: str, ms: int) -> _Draft:
    """One request that is wrong in the way ``reason`` names."""
    rng = city.rng
    car = rng.choice(city.cars["/4wheels"])
    car_body: dict[str, Any] = {
        "subscriptionId": city.subscriptions["cars"],
        "data": [_car_entity(rng, replace(car), ms, builtins=False)],
    }
    station = rng.choice(rng.choice(city.stations))
    air = _air_entity(station, _air_values(rng, ms, 1.0), ms, key_values=False)
    spot = replace(rng.choice(rng.choice(city.spots)))
    ld_entity = _spot_entity(rng, spot, ms, full=True)
    endpoint = "notify"
    body: Any = car_body
    body_text: str | None = None
    headers = _v2_headers(rng, "vehicles", "/4wheels", Format.NORMALIZED.value)
    kind = Kind.NGSI_V2

    if reason == "truncated_json":
        text = orjson.dumps(car_body).decode()
        body, body_text = None, text[: rng.randint(10, len(text) - 5)]
    elif reason == "not_json":
        body = None
        body_text = rng.choice(
            (
                "<html><body><h1>502 Bad Gateway</h1></body></html>",
                "subscriptionId=" + city.subscriptions["cars"] + "&data=speed%3D42",
                "OK",
                "",
                "{'id': 'car-4w-0001', 'type': 'car'}",
            )
        )
    elif reason == "entity_without_id":
        del car_body["data"][0]["id"]
    elif reason == "empty_attribute_name":
        headers = _v2_headers(rng, "environment", "/airquality", Format.NORMALIZED.value)
        air[""] = {"type": "Number", "value": round(rng.uniform(0, 50), 1), "metadata": {}}
        body = {"subscriptionId": city.subscriptions["air_n"], "data": [air]}
    elif reason == "wrong_content_type":
        headers[H_CONTENT_TYPE] = "text/plain; charset=utf-8"
    elif reason == "unsupported_attrs_format":
        headers[H_ATTRS_FORMAT] = "values"
        entity = car_body["data"][0]
        body = {
            "subscriptionId": city.subscriptions["cars"],
            "data": [[entity["speed"]["value"], entity["oil_level"]["value"], entity["location"]["value"]]],
        }
    elif reason == "service_path_without_slash":
        headers[H_SERVICE_PATH] = "4wheels"
    elif reason == "bad_time_instant":
        headers = _v2_headers(rng, "environment", "/airquality", Format.NORMALIZED.value)
        air[ATTR_TIME_INSTANT]["value"] = rng.choice(("2026-11-31T25:61:00Z", "yesterday at noon", "1763805600"))
        body = {"subscriptionId": city.subscriptions["air_n"], "data": [air]}
    elif reason == "data_not_array":
        body = {"subscriptionId": city.subscriptions["cars"], "data": car_body["data"][0]}
    elif reason in ("ld_property_without_value", "ld_relationship_without_object"):
        endpoint, kind, headers = "ngsi-ld", Kind.NGSI_LD, _ld_headers(rng)
        if reason == "ld_property_without_value":
            ld_entity["status"] = {"type": LD_PROPERTY, LD_OBSERVED_AT: _iso(ms)}
        else:
            ld_entity["refParkingSite"] = {"type": LD_RELATIONSHIP}
        body = _ld_notification(rng, city.subscriptions["parking"], ms, [ld_entity])
    elif reason == "message_without_entity":
        endpoint, kind, headers = "messages", Kind.MESSAGE, {H_CONTENT_TYPE: JSON}
        number, description, price = rng.choice(city.products)
        body = {
            "timestamp": _hub_timestamp(ms - ms % 1000),
            "data": [{"product_number": number, "product_description": description, "unit_price": price}],
            "guid": _uuid4(rng),
            "source": "erp",
            "user": "svc-erp",
        }
    else:
        raise ValueError(f"unknown malformed reason {reason!r}")

    return _Draft(
        Request(endpoint, headers, body, body_text),
        emitted_ms=ms,
        send_ms=0,
        kind=kind,
        format=None,
        service=None,
        malformed=reason,
    )


# --- assembling the sample -----------------------------------------------------------------------


def _delay_some(rng: random.Random, drafts: list[_Draft], n: int) -> None:
    """Hold back ``n`` drafts until after the next notification of one of their entities."""
    by_key: dict[_Key, list[tuple[int, int]]] = {}
    for i, d in enumerate(drafts):
        for key, ms in d.stamps:
            by_key.setdefault(key, []).append((ms, i))
    following: dict[int, tuple[int, set[int]]] = {}  # draft -> (earliest next stamp, next drafts)
    for series in by_key.values():
        series.sort()
        for (ms, i), (ms_next, j) in zip(series, series[1:], strict=False):
            if ms_next <= ms:
                continue  # same stamp: arriving after it would not be out of order
            first, nexts = following.get(i, (ms_next, set()))
            following[i] = (min(first, ms_next), nexts | {j})
    candidates = sorted(following)
    rng.shuffle(candidates)
    blocked: set[int] = set()
    chosen = 0
    for i in candidates:
        if chosen == n:
            break
        first, nexts = following[i]
        if i in blocked or nexts & blocked:
            continue
        d = drafts[i]
        d.delayed = True
        d.send_ms = first + _MAX_LATENCY_MS + rng.randint(1_000, 240_000)
        blocked |= {i} | nexts
        chosen += 1


def _out_of_order(drafts: Sequence[_Draft]) -> list[int]:
    """Positions of first-time, well-formed drafts that carry a stamp older than one already seen."""
    newest: dict[_Key, int] = {}
    late: list[int] = []
    for pos, d in enumerate(drafts):
        if d.malformed is not None or d.duplicate_of is not None:
            continue
        if any(ms < newest.get(key, ms) for key, ms in d.stamps):
            late.append(pos)
        for key, ms in d.stamps:
            newest[key] = max(ms, newest.get(key, ms))
    return late


def _summarise(drafts: Sequence[_Draft], seed: int, start_ms: int, end_ms: int) -> CitySummary:
    good = [d for d in drafts if d.malformed is None]
    first = [d for d in good if d.duplicate_of is None]
    late = _out_of_order(drafts)
    entities: set[tuple[str, str]] = set()
    for d in first:
        for (service, etype, eid), _ in d.stamps:
            if service != "message":
                entities.add((etype, f"{service}|{eid}"))
    return CitySummary(
        seed=seed,
        start=_iso(start_ms),
        end=_iso(end_ms),
        requests=len(drafts),
        by_endpoint=dict(sorted(Counter(d.request.endpoint for d in drafts).items())),
        by_kind=dict(sorted(Counter(d.kind.value for d in good).items())),
        by_format=dict(sorted(Counter(d.format.value for d in good if d.format is not None).items())),
        by_service=dict(sorted(Counter(d.service for d in good if d.service is not None).items())),
        malformed=len(drafts) - len(good),
        malformed_by_reason=dict(sorted(Counter(d.malformed for d in drafts if d.malformed).items())),
        duplicates=len(good) - len(first),
        duplicates_with_guid_header=sum(
            1 for d in good if d.duplicate_of is not None and H_MESSAGE_GUID in d.request.headers
        ),
        out_of_order=len(late),
        distinct_entities=len(entities),
        entities_by_type=dict(sorted(Counter(etype for etype, _ in entities).items())),
        attribute_updates=sum(d.attribute_updates for d in first),
        entity_deletes=sum(d.entity_deletes for d in first),
        message_records=sum(d.message_records for d in first),
        malformed_indices=tuple(i for i, d in enumerate(drafts) if d.malformed is not None),
        duplicate_indices=tuple(i for i, d in enumerate(drafts) if d.duplicate_of is not None),
        out_of_order_indices=tuple(late),
    )


def generate_city(
    seed: int = 42,
    hours: int = 4,
    start: datetime = DEFAULT_START,
    target_notifications: int = 12_000,
) -> tuple[list[Request], CitySummary]:
    """The sample's requests in file (send) order, and what they contain.

    Exactly ``target_notifications`` requests; the same arguments always give the same requests.
    """
    if hours <= 0:
        raise ValueError("hours must be positive")
    if target_notifications < 500:
        raise ValueError("target_notifications must be at least 500 for every stream to appear")
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware")
    rng = random.Random(seed)
    start_ms = int(start.timestamp() * 1000)
    end_ms = int((start + timedelta(hours=hours)).timestamp() * 1000)
    city = _build_city(rng, start_ms, end_ms)

    n_dup = round(target_notifications * DUPLICATE_SHARE)
    n_bad = max(len(MALFORMED_REASONS), round(target_notifications * MALFORMED_SHARE))
    n_msg = round(target_notifications * MESSAGE_SHARE)
    n_ngsi = target_notifications - n_dup - n_bad - n_msg
    shares = {name: round(n_ngsi * share) for name, share in STREAM_SHARES.items()}
    shares["parking"] = n_ngsi - sum(v for k, v in shares.items() if k != "parking")

    drafts = (
        _car_drafts(city, shares["cars"], default_tenant=False)
        + _car_drafts(city, shares["default_cars"], default_tenant=True)
        + _air_drafts(city, shares["air"])
        + _waste_drafts(city, shares["waste"])
        + _parking_drafts(city, shares["parking"])
        + _message_drafts(city, n_msg)
    )
    for d in drafts:
        d.send_ms = d.emitted_ms + rng.randint(5, _MAX_LATENCY_MS)
    n_late = round((target_notifications - n_dup - n_bad) * OUT_OF_ORDER_SHARE)
    _delay_some(rng, drafts, n_late)

    # Exact re-sends (Orion retrying after a timeout, a loader re-reading a file): same headers,
    # same body; data-hub re-sends are chosen among messages with a guid.
    resendable = [d for d in drafts if not d.delayed and (d.kind != Kind.MESSAGE or "guid" in d.request.body)]
    for original in rng.sample(resendable, n_dup):
        copy = _Draft(
            original.request,
            emitted_ms=original.emitted_ms,
            send_ms=original.send_ms + rng.randint(500, 300_000),
            kind=original.kind,
            format=original.format,
            service=original.service,
            stamps=original.stamps,
            duplicate_of=original,
        )
        drafts.append(copy)

    reasons = [MALFORMED_REASONS[i % len(MALFORMED_REASONS)] for i in range(n_bad)]
    rng.shuffle(reasons)
    for reason in reasons:
        ms = rng.randint(start_ms, end_ms - 1)
        bad = _malformed(city, reason, ms)
        bad.send_ms = ms + rng.randint(5, _MAX_LATENCY_MS)
        drafts.append(bad)

    for seq, d in enumerate(drafts):
        d.seq = seq
    drafts.sort(key=lambda d: (d.send_ms, d.seq))
    return [d.request for d in drafts], _summarise(drafts, seed, start_ms, end_ms)


def write_jsonl(requests: Iterable[Request], path: str | Path) -> int:
    """Write requests as JSON lines; returns the number written."""
    n = 0
    with open(path, "wb") as out:
        for request in requests:
            out.write(request.to_line())
            n += 1
    return n


def read_jsonl(path: str | Path) -> list[Request]:
    """Read a JSON-lines request file written by :func:`write_jsonl` (blank lines are skipped)."""
    with open(path, "rb") as f:
        return [Request.from_line(line) for line in f if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ngsi_assets.demo.city", description="Write a seeded smart-city request sample."
    )
    parser.add_argument("--out", required=True, help="JSON-lines file to write")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--hours", type=int, default=4)
    parser.add_argument("--start", default=DEFAULT_START.isoformat(), help="ISO 8601 UTC start")
    parser.add_argument("--target", type=int, default=12_000, help="number of requests")
    parser.add_argument("--summary", help="also write the summary (with index lists) as JSON here")
    args = parser.parse_args(argv)

    start = datetime.fromisoformat(args.start)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    began = time.perf_counter()
    requests, summary = generate_city(args.seed, args.hours, start, args.target)
    written = write_jsonl(requests, args.out)
    elapsed = time.perf_counter() - began
    if args.summary:
        Path(args.summary).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    print(json.dumps({"file": args.out, "written": written, "seconds": round(elapsed, 3)} | summary.counts(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
