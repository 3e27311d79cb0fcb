"""STH-Comet's read API, without I/O: query validation, MongoDB filters, and the response bodies.

Everything here follows telefonicaid/fiware-sth-comet (tag 2.11), file by file:

- ``lib/server/sthServer.js``: the routes and the joi (14) schema of the query: ``lastN``, ``hLimit``,
  ``hOffset`` (integers > -1), ``aggrMethod`` (``min|max|sum|sum2|occur|all``, comma-separated),
  ``aggrPeriod`` (``month|day|hour|minute|second``), ``dateFrom``/``dateTo`` (dates), ``filetype``,
  ``count`` (boolean), and ``type`` (required, v2 only); any other key is refused. A failure answers
  400 with hapi's body in v1 (``statusCode``, ``error``, ``message``, ``validation``) and
  ``{"error": "BadRequest", "description": ...}`` in v2 (``failActionHandler``);
- ``lib/server/validators/sthHeaderValidator.js``: ``Fiware-Service`` and ``Fiware-ServicePath``
  are required, checked before the query;
- ``lib/server/handlers/sthGetDataHandler.js``: raw data is asked for by ``lastN``, by ``hLimit`` and
  ``hOffset`` together, or by ``filetype=csv``; else aggregated data by ``aggrMethod`` and
  ``aggrPeriod``; else 400. ``hLimit <= lastN <= maxPageSize`` (100 by default);
- ``lib/database/sthDatabase.js``: ``getRawData`` (newest ``lastN`` returned oldest first, or a page
  by ``recvTime`` ascending; ``attrType``, ``attrValue``, ``recvTime`` of each document; the total
  count of the filter for ``count=true``) and ``getAggregatedData`` with ``filterResults`` (documents
  whose origin lies between the origins of ``dateFrom`` and ``dateTo``, points with samples only,
  grouped by the data model's ``_id`` fields, origin and resolution, and the first and last
  documents trimmed to the offsets of ``dateFrom`` and ``dateTo``);
- ``lib/server/utils/sthServerUtils.js``: the body, ``contextResponses`` in v1 and
  ``{"type": "StructuredValue", "value": [...]}`` in v2 (the code and its tests say ``value``; the
  manual's examples say ``values``);
- ``lib/server/handlers/sthNotFoundHandler.js``: 404 bodies.

Where this differs: ``lastN=0`` and ``hLimit=0`` mean "no limit" in STH-Comet (MongoDB's
``limit(0)``), which loads a whole history; here they return at most ``maxPageSize`` values.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from ngsi_assets.ngsi.sth_config import DataModel, Resolution
from ngsi_assets.ngsi.sth_naming import id_fields

AGGREGATION_METHODS = ("min", "max", "sum", "sum2", "occur")
_METHOD = "(min|max|sum|sum2|occur|all)"
AGGR_METHOD_PATTERN = f"^{_METHOD}(,{_METHOD})*$"
RESOLUTIONS = ("month", "day", "hour", "minute", "second")
DEFAULT_MAX_PAGE_SIZE = 100
MAX_SAFE_INTEGER = 2**53 - 1  # JavaScript's Number.MAX_SAFE_INTEGER: joi refuses larger numbers
VALIDATION_KEYS = ["lastN", "hLimit", "hOffset", "filetype", "aggrMethod", "aggrPeriod", "count"]
MISSING_COMBINATION = (
    "A combination of the following query params is required: lastN, hLimit and hOffset, "
    "filetype, or aggrMethod and aggrPeriod"
)
PAGE_RULE = "hLimit <= lastN <= config.maxPageSize"
HEADER_SERVICE = "fiware-service"
HEADER_SERVICE_PATH = "fiware-servicepath"

_INTEGER_KEYS = ("lastN", "hLimit", "hOffset")
_DATE_KEYS = ("dateFrom", "dateTo")
_QUERY_KEYS = (*_INTEGER_KEYS, "aggrMethod", "aggrPeriod", *_DATE_KEYS, "filetype", "count")
_JS_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_TYPE_REASON = {
    **{k: "must be a number" for k in ("lastN", "hLimit", "hOffset")},
    **{k: "must be a number of milliseconds or valid date string" for k in ("dateFrom", "dateTo")},
    "count": "must be a boolean",
}


class QueryError(ValueError):
    """A request STH-Comet answers with 400; ``source``/``keys`` fill hapi's ``validation`` object."""

    def __init__(self, message: str, source: str | None = "query", keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.keys = list(keys)


@dataclass(frozen=True)
class Query:
    """A validated request: the path's entity and attribute, the headers and the query parameters."""

    version: int
    service: str
    service_path: str
    entity_id: str
    entity_type: str
    attr_name: str
    last_n: int | None = None
    h_limit: int | None = None
    h_offset: int | None = None
    aggr_methods: tuple[str, ...] = ()
    aggr_method_text: str | None = None
    aggr_period: str | None = None
    date_from: datetime | None = None
    date_to: datetime | None = None
    filetype: str | None = None
    count: bool = False
    raw: bool = field(default=False)


def _child(key: str, reason: str) -> QueryError:
    return QueryError(f'child "{key}" fails because ["{key}" {reason}]', "query", [key])


def _js_number(text: str) -> float | None:
    """A query value as joi.number() converts it (JavaScript's Number of a non-empty string)."""
    if not _JS_NUMBER.match(text):
        return None
    return float(text.strip())


def parse_date(text: str) -> datetime | None:
    """joi.date(): epoch milliseconds, or a date string (ISO 8601; a time without zone is UTC)."""
    body = text.strip()
    number = _js_number(body) if body else None
    if number is not None:
        try:
            return datetime.fromtimestamp(number / 1000, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if not body:
        return None
    try:
        parsed = datetime.fromisoformat(body.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_query(
    version: int,
    headers: Mapping[str, str],
    entity_id: str,
    entity_type: str | None,
    attr_name: str,
    params: Sequence[tuple[str, str]],
    max_page_size: int = DEFAULT_MAX_PAGE_SIZE,
) -> Query:
    """Validate a request as STH-Comet does (headers, then the query, then the raw/aggregated rule)."""
    service = headers.get(HEADER_SERVICE)
    if not service:
        raise QueryError(f'child "{HEADER_SERVICE}" fails because [{HEADER_SERVICE} is required]', "headers")
    service_path = headers.get(HEADER_SERVICE_PATH)
    if not service_path:
        raise QueryError(f'child "{HEADER_SERVICE_PATH}" fails because [{HEADER_SERVICE_PATH} is required]', "headers")
    allowed = (*_QUERY_KEYS, "type") if version == 2 else _QUERY_KEYS
    values: dict[str, str] = {}
    for key, value in params:
        if key not in allowed:
            raise QueryError(f'"{key}" is not allowed', "query", [key])
        if key in values:  # a repeated key is an array for hapi, which no rule accepts
            raise _child(key, _TYPE_REASON.get(key, "must be a string"))
        values[key] = value
    ints: dict[str, int] = {}
    for key in _INTEGER_KEYS:
        if key in values:
            number = _js_number(values[key])
            if number is None or not math.isfinite(number):
                raise _child(key, "must be a number")
            if abs(number) > MAX_SAFE_INTEGER:
                raise _child(key, "must be a safe number")
            if not number.is_integer():
                raise _child(key, "must be an integer")
            if number <= -1:
                raise _child(key, "must be greater than -1")
            ints[key] = int(number)
    methods: tuple[str, ...] = ()
    if "aggrMethod" in values:
        text = values["aggrMethod"]
        if not re.match(AGGR_METHOD_PATTERN, text):
            raise _child(
                "aggrMethod", f'with value "{text}" fails to match the required pattern: /{AGGR_METHOD_PATTERN}/'
            )
        methods = AGGREGATION_METHODS if "all" in text.split(",") else tuple(text.split(","))
    if "aggrPeriod" in values and values["aggrPeriod"] not in RESOLUTIONS:
        raise _child("aggrPeriod", f"must be one of [{', '.join(RESOLUTIONS)}]")
    dates: dict[str, datetime] = {}
    for key in _DATE_KEYS:
        if key in values:
            parsed = parse_date(values[key])
            if parsed is None:
                raise _child(key, "must be a number of milliseconds or valid date string")
            dates[key] = parsed
    count = False
    if "count" in values:
        flag = values["count"].strip().lower()
        if flag not in ("true", "false"):
            raise _child("count", "must be a boolean")
        count = flag == "true"
    if version == 2:
        if "type" not in values:
            raise _child("type", "is required")
        entity_type = values["type"]
    filetype = values.get("filetype")
    last_n, h_limit, h_offset = ints.get("lastN"), ints.get("hLimit"), ints.get("hOffset")
    raw = (
        last_n is not None
        or (h_limit is not None and h_offset is not None)
        or (filetype is not None and filetype.lower() == "csv")
    )
    if raw:
        if (
            (last_n and last_n > max_page_size)
            or (h_limit and h_limit > max_page_size)
            or (h_limit and last_n and h_limit > last_n)
        ):
            raise QueryError(PAGE_RULE, "query", VALIDATION_KEYS)
    elif not (methods and values.get("aggrPeriod")):
        raise QueryError(MISSING_COMBINATION, "query", VALIDATION_KEYS)
    return Query(
        version=version,
        service=service,
        service_path=service_path,
        entity_id=entity_id,
        entity_type=entity_type or "",
        attr_name=attr_name,
        last_n=last_n,
        h_limit=h_limit,
        h_offset=h_offset,
        aggr_methods=methods,
        aggr_method_text=values.get("aggrMethod"),
        aggr_period=values.get("aggrPeriod"),
        date_from=dates.get("dateFrom"),
        date_to=dates.get("dateTo"),
        filetype=filetype,
        count=count,
        raw=raw,
    )


# ---- time slots (lib/utils/sthUtils.js getOrigin, filterResults' offsets) ------------------------


def origin_of(moment: datetime, resolution: str) -> datetime:
    """The origin of the document holding ``moment`` at ``resolution`` (``sthUtils.getOrigin``)."""
    t = moment.astimezone(UTC)
    if resolution == Resolution.SECOND:
        return t.replace(second=0, microsecond=0)
    if resolution == Resolution.MINUTE:
        return t.replace(minute=0, second=0, microsecond=0)
    if resolution == Resolution.HOUR:
        return t.replace(hour=0, minute=0, second=0, microsecond=0)
    if resolution == Resolution.DAY:
        return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return t.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)


def offset_of(moment: datetime, resolution: str) -> int:
    """The slot of ``moment`` inside its document, as ``filterResults`` computes it (month 0-11)."""
    t = moment.astimezone(UTC)
    return {
        Resolution.SECOND: t.second,
        Resolution.MINUTE: t.minute,
        Resolution.HOUR: t.hour,
        Resolution.DAY: t.day,
        Resolution.MONTH: t.month - 1,
    }[Resolution(resolution)]


# ---- MongoDB filters ---------------------------------------------------------------------------------


def _model_match(query: Query, data_model: DataModel, prefix: str) -> dict[str, Any]:
    values = {"entityId": query.entity_id, "entityType": query.entity_type, "attrName": query.attr_name}
    if data_model is DataModel.BY_SERVICE_PATH:
        names = ("entityId", "entityType", "attrName")
    elif data_model is DataModel.BY_ENTITY:
        names = ("attrName",)
    else:
        names = ()
    return {prefix + name: values[name] for name in names}


def _range(low: Any, high: Any) -> dict[str, Any] | None:
    cond: dict[str, Any] = {}
    if low is not None:
        cond["$gte"] = low
    if high is not None:
        cond["$lte"] = high
    return cond or None


def raw_filter(query: Query, data_model: DataModel) -> dict[str, Any]:
    """``getRawData``'s find condition: the data model's fields and ``recvTime`` between the dates."""
    cond = _model_match(query, data_model, "")
    times = _range(query.date_from, query.date_to)
    if times:
        cond["recvTime"] = times
    return cond


RAW_PROJECTION = {"_id": 0, "attrType": 1, "attrValue": 1, "recvTime": 1}


def raw_plan(query: Query, max_page_size: int = DEFAULT_MAX_PAGE_SIZE) -> tuple[int, int, int]:
    """(sort direction of recvTime, skip, limit) of a raw query; limit 0 is "all" (CSV only).

    ``lastN`` reads the newest first (the caller reverses them); a page reads oldest first.
    """
    if query.last_n is not None:
        return -1, 0, query.last_n or max_page_size
    if query.h_limit is not None or query.h_offset is not None:
        return 1, query.h_offset or 0, query.h_limit or max_page_size
    return 1, 0, 0


def aggregated_filter(query: Query, data_model: DataModel) -> dict[str, Any]:
    """``getAggregatedData``'s match: ``_id`` fields, resolution, origins of ``dateFrom``/``dateTo``."""
    assert query.aggr_period is not None
    cond = _model_match(query, data_model, "_id.")
    cond["_id.resolution"] = query.aggr_period
    origins = _range(
        None if query.date_from is None else origin_of(query.date_from, query.aggr_period),
        None if query.date_to is None else origin_of(query.date_to, query.aggr_period),
    )
    if origins:
        cond["_id.origin"] = origins
    return cond


def aggregated_projection(query: Query) -> dict[str, int]:
    projection = {"points.offset": 1, "points.samples": 1}
    for method in query.aggr_methods:
        projection[f"points.{method}"] = 1
    return projection


# ---- response bodies ----------------------------------------------------------------------------------


def aggregated_values(
    documents: Iterable[Mapping[str, Any]], query: Query, data_model: DataModel, filter_out_empty: bool = True
) -> list[dict[str, Any]]:
    """The ``values`` of an aggregated answer, from the documents sorted by ``_id.origin``.

    With ``filter_out_empty`` (STH-Comet's default), what its aggregation pipeline returns: per
    document, ``_id`` holding the data model's fields, origin and resolution, and the points with
    samples, each with offset, samples and the methods asked for (in the order asked). The first and
    last documents lose the points before ``dateFrom``'s and after ``dateTo``'s offset.
    """
    assert query.aggr_period is not None
    keys = id_fields(data_model)
    methods = query.aggr_methods
    results: list[dict[str, Any]] = []
    for doc in documents:
        doc_id = doc["_id"]
        if filter_out_empty:
            group_id = {k: doc_id.get(k) for k in keys}
            group_id["origin"] = doc_id["origin"]
            group_id["resolution"] = doc_id["resolution"]
            points = []
            for p in doc.get("points", []):
                if not p.get("samples"):
                    continue
                point = {"offset": p.get("offset"), "samples": p.get("samples")}
                for m in methods:
                    if m in p:
                        point[m] = p[m]
                points.append(point)
            if points:
                results.append({"_id": group_id, "points": points})
        else:
            points = []
            for p in doc.get("points", []):
                point = {k: p[k] for k in ("offset", "samples", *methods) if k in p}
                points.append(point)
            results.append({"_id": dict(doc_id), "points": points})
    _trim(results, query, filter_out_empty)
    return results


def _emptied(point: dict[str, Any], methods: Sequence[str]) -> None:
    # filterPointFromBeginning/End with filtering off: the point stays, zeroed.
    point["samples"] = 0
    for m in methods:
        point[m] = {} if m == "occur" else math.inf if m == "min" else -math.inf if m == "max" else 0


def _trim(results: list[dict[str, Any]], query: Query, filter_out_empty: bool) -> None:
    """``filterResults``: the first document loses its points before ``dateFrom``'s offset, the last
    its points after ``dateTo``'s, when those documents are the dates' own; emptied documents go."""
    _trim_edge(results, 0, query.date_from, lambda offset, edge: offset < edge, query, filter_out_empty)
    _trim_edge(results, -1, query.date_to, lambda offset, edge: offset > edge, query, filter_out_empty)


def _trim_edge(
    results: list[dict[str, Any]],
    index: int,
    moment: datetime | None,
    outside: Callable[[int, int], bool],
    query: Query,
    filter_out_empty: bool,
) -> None:
    period = query.aggr_period
    assert period is not None
    if not results or moment is None or results[index]["_id"]["origin"] != origin_of(moment, period):
        return
    edge = offset_of(moment, period)
    kept = []
    for p in results[index]["points"]:
        if outside(p["offset"], edge) and p.get("samples"):
            if filter_out_empty:
                continue
            _emptied(p, query.aggr_methods)
        kept.append(p)
    results[index]["points"] = kept
    if not kept:
        results.pop(index)


def raw_values(documents: Iterable[Mapping[str, Any]], query: Query) -> list[dict[str, Any]]:
    """The ``values`` of a raw answer, oldest first (``lastN`` reads newest first: reversed here)."""
    values = [dict(d) for d in documents]
    if query.last_n is not None:
        values.reverse()
    return values


def ngsi_payload(query: Query, values: list[Any]) -> dict[str, Any]:
    """``sthServerUtils.getNGSIPayload``: v2 ``{type, value}``, v1 ``contextResponses``."""
    if query.version == 2:
        return {"type": "StructuredValue", "value": values}
    return {
        "contextResponses": [
            {
                "contextElement": {
                    "attributes": [{"name": query.attr_name, "values": values}],
                    "id": query.entity_id,
                    "isPattern": False,
                    "type": query.entity_type,
                },
                "statusCode": {"code": "200", "reasonPhrase": "OK"},
            }
        ]
    }


def error_body(version: int, error: QueryError) -> dict[str, Any]:
    """A 400 body: hapi's (v1) or ``failActionHandler``'s (v2)."""
    if version == 2:
        return {"error": "BadRequest", "description": error.message}
    body: dict[str, Any] = {"statusCode": 400, "error": "Bad Request", "message": error.message}
    if error.source is not None:
        body["validation"] = {"source": error.source, "keys": error.keys}
    return body


def not_found_body(path: str) -> dict[str, Any]:
    """``sthNotFoundHandler``: v2 paths get NGSIv2's error shape."""
    if path.startswith("/STH/v2"):
        return {"error": "NotFound", "description": "invalid path"}
    return {"statusCode": 404, "error": "Not Found"}


def _js_default(value: Any) -> Any:
    if isinstance(value, datetime):
        t = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    raise TypeError(f"cannot encode {type(value).__name__}")


def _js_numbers(value: Any) -> Any:
    """Numbers as JavaScript's JSON.stringify writes them: 21.0 -> 21, infinities -> null."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _js_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_js_numbers(v) for v in value]
    return value


def to_json(body: Any) -> bytes:
    """``body`` as STH-Comet (Node.js) serializes it: dates as ISO 8601 with ms and ``Z``."""
    return orjson.dumps(_js_numbers(body), default=_js_default, option=orjson.OPT_PASSTHROUGH_DATETIME)


CSV_FIELDS = ("attrName", "attrType", "attrValue", "recvTime")


def csv_header() -> str:
    return ",".join(CSV_FIELDS) + "\n"


def csv_line(attr_name: str, document: Mapping[str, Any]) -> str:
    """One CSV line of a raw document (``getJSONCSVOptions``: attrName, attrType, attrValue, recvTime)."""
    value = document.get("attrValue")
    if isinstance(value, dict | list):
        value = orjson.dumps(_js_numbers(value)).decode()
    elif isinstance(value, datetime):
        value = _js_default(value)
    elif isinstance(value, float):
        value = _js_numbers(value)
    recv = document.get("recvTime")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(
        [
            attr_name,
            document.get("attrType", ""),
            "" if value is None else value,
            _js_default(recv) if isinstance(recv, datetime) else recv or "",
        ]
    )
    return out.getvalue()
