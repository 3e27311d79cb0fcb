"""Validation of incoming notification requests: one HTTP request or file in, one ValidatedMessage out.

Three endpoints accept three protocols:

- ``POST /notify``: an NGSI v2 notification from Orion in the format named by the
  ``Ngsiv2-AttrsFormat`` header (``normalized`` when absent, ``keyValues``,
  ``simplifiedNormalized``, ``simplifiedKeyValues``), or an NGSI-LD notification when the
  Content-Type is ``application/ld+json``;
- ``POST /ngsi-ld/notify``: an NGSI-LD notification (``application/json`` or ``application/ld+json``);
- ``POST /messages``: the generic data-hub message of seed 004.

Validation is pure: the body is parsed once with orjson and checked by pydantic models built at
import time; nothing is kept but the verdict, because the raw bytes are what lands. Every refusal
is a :class:`PayloadError` naming the HTTP status, the place (``data[0].speed.value``,
``header Fiware-ServicePath``, ``body``) and the problem.

Identifiers, types, attribute names and service paths may hold quotes, backticks, semicolons and
any Unicode except control characters: the SQL sinks encode and quote names themselves, and
tests of injection need such names to reach them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Any, Final, Literal, NotRequired

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    with_config,
)
from pydantic_core import CoreSchema, PydanticCustomError, core_schema
from typing_extensions import TypedDict

from ngsi_assets.ngsi.constants import (
    ALTERATION_TYPES,
    ATTR_ALTERATION_TYPE,
    ATTR_DATE_CREATED,
    ATTR_DATE_MODIFIED,
    ATTR_TIME_INSTANT,
    DEFAULT_SERVICE,
    DEFAULT_SERVICE_PATH,
    HEADER_ATTRS_FORMAT,
    HEADER_CORRELATOR,
    HEADER_MESSAGE_GUID,
    HEADER_SERVICE,
    HEADER_SERVICE_PATH,
    LD_CONTEXT,
    LD_DATASET_ID,
    LD_GEOPROPERTY,
    LD_LANGUAGE_PROPERTY,
    LD_NOTIFICATION,
    LD_PROPERTY,
    LD_RELATIONSHIP,
    Format,
    Kind,
)
from ngsi_assets.ngsi.envelope import Envelope

__all__ = [
    "Endpoint",
    "IngestSettings",
    "PayloadError",
    "ValidatedMessage",
    "validate_request",
]

# Orion's limits: 50 characters for a tenant, 256 for ids, types and names, 10 service path levels.
MAX_SERVICE_LENGTH: Final = 50
MAX_NAME_LENGTH: Final = 256
MAX_SERVICE_PATH_LEVELS: Final = 10

# Orion-LD names the tenant in this header; it is read when Fiware-Service is absent.
HEADER_LD_TENANT: Final = "ngsild-tenant"
HEADER_CONTENT_TYPE: Final = "content-type"

MEDIA_JSON: Final = "application/json"
MEDIA_LD_JSON: Final = "application/ld+json"
_JSON_ONLY: Final = (MEDIA_JSON,)
_JSON_OR_LD: Final = (MEDIA_JSON, MEDIA_LD_JSON)

# Header names as they appear in error fields (the constants are lower-cased for look-up).
_SHOWN_HEADERS: Final = {
    HEADER_CONTENT_TYPE: "Content-Type",
    HEADER_SERVICE: "Fiware-Service",
    HEADER_SERVICE_PATH: "Fiware-ServicePath",
    HEADER_CORRELATOR: "Fiware-Correlator",
    HEADER_ATTRS_FORMAT: "Ngsiv2-AttrsFormat",
    HEADER_MESSAGE_GUID: "X-Message-Guid",
    HEADER_LD_TENANT: "NGSILD-Tenant",
}

_ERROR_NAMES: Final = {400: "BadRequest", 413: "PayloadTooLarge", 415: "UnsupportedMediaType"}


class PayloadError(Exception):
    """A request the receiver refuses: HTTP ``status``, where (``field``) and what (``problem``)."""

    def __init__(self, status: int, field: str, problem: str) -> None:
        super().__init__(f"{status} {field}: {problem}")
        self.status = status
        self.field = field
        self.problem = problem

    def to_dict(self) -> dict[str, str]:
        """The JSON error body, in Orion's style plus the field."""
        return {
            "error": _ERROR_NAMES.get(self.status, "BadRequest"),
            "field": self.field,
            "description": self.problem,
        }


@dataclass(frozen=True)
class IngestSettings:
    """What the receiver assumes when a request leaves something out, and what it refuses."""

    default_service: str = DEFAULT_SERVICE  # Orion sends no Fiware-Service for its default tenant
    default_service_path: str = DEFAULT_SERVICE_PATH
    max_body_bytes: int = 1_048_576
    guid_from_correlator: bool = False  # guid = "<correlator>;cbnotif=<N>" when the correlator has N


class Endpoint(StrEnum):
    """The receiver's routes."""

    NOTIFY = "notify"  # POST /notify: NGSI v2, or NGSI-LD when Content-Type is application/ld+json
    NGSI_LD = "ngsi-ld"  # POST /ngsi-ld/notify: NGSI-LD only (application/json or application/ld+json)
    MESSAGES = "messages"  # POST /messages: the generic data-hub message of seed 004


@dataclass(frozen=True)
class ValidatedMessage:
    """One accepted request: its protocol, tenant, routing headers and the body exactly as received."""

    kind: Kind
    format: Format
    service: str
    service_path: str  # one path, or a comma-separated list with exactly one entry per entity
    correlator: str | None  # Fiware-Correlator without any '; cbnotif=N' suffix
    cbnotif: int | None  # N from that suffix
    guid: str | None  # messages: body 'guid'; NGSI: X-Message-Guid, else per guid_from_correlator
    body: bytes
    entity_count: int  # entities (NGSI) or data records (messages)

    def stamp(self, message_id: str, recv_ms: int, origin: str) -> Envelope:
        """The landing envelope of this message, received at ``recv_ms`` through ``origin``."""
        return Envelope(
            message_id=message_id,
            recv_ms=recv_ms,
            kind=str(self.kind),
            format=str(self.format),
            service=self.service,
            service_path=self.service_path,
            correlator=self.correlator,
            cbnotif=self.cbnotif,
            guid=self.guid,
            origin=origin,
            body=self.body,
        )


# --------------------------------------------------------------------------------------------
# Field types. Each protocol is one schema (TypedDicts, with models for entities) checked in one
# pydantic-core call per request. Custom errors carry their text in ctx["problem"] and, when the
# culprit lies deeper than where the validator stands, the rest of its location in ctx["loc"].

_STRICT: Final = ConfigDict(strict=True)  # JSON gives exact types: "true" is no boolean, 1 no string


def _custom(problem: str, loc: tuple[str | int, ...] = ()) -> PydanticCustomError:
    return PydanticCustomError("ngsi_payload", "{problem}", {"problem": problem, "loc": loc})


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _check_iso8601(value: str) -> str:
    # datetime.fromisoformat (3.11+) reads ISO 8601 calendar and week dates, with or without zone.
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise _custom(f"not an ISO 8601 date-time: {value!r}") from None
    return value


_NO_CONTROL: Final = r"^[^\x00-\x1f\x7f]*$"
_URI: Final = r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\x00-\x1f\x7f]*$"
_PATTERN_PROBLEMS: Final = {
    _NO_CONTROL: "contains control characters",
    _URI: "not a URI (expected a scheme, as in urn:ngsi-ld:Vehicle:A4567, and no control characters)",
}

Iso8601 = Annotated[str, AfterValidator(_check_iso8601)]
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
# Entity ids and types, metadata names.
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH, pattern=_NO_CONTROL)]
Uri = Annotated[str, StringConstraints(min_length=1, pattern=_URI)]


class NamedKeys:
    """``Annotated`` marker for a TypedDict whose free keys are names (checked like ``Name``).

    TypedDict ``extra_items`` checks the values of free keys but not the keys, so the object is
    first run through ``dict[Name, Any]`` and then through its own schema, both in pydantic-core.
    """

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.chain_schema([handler.generate_schema(dict[Name, Any]), handler(source)])


# --------------------------------------------------------------------------------------------
# NGSI v2


@with_config(_STRICT)
class V2Metadata(TypedDict):
    """One metadata item of a normalized attribute."""

    type: NotRequired[str]
    value: Any


@with_config(_STRICT)
class V2MetadataItems(TypedDict, extra_items=V2Metadata):  # type: ignore[call-arg]
    """Metadata of a normalized attribute: name -> {type, value}.

    A ``TimeInstant`` metadata value is not checked here: one the platform cannot read as an instant
    (ISO 8601 or epoch number) is kept as given and the sample falls back to its receive time, so no
    notification is refused for a metadata value (Orion does not retry a 400).
    """


V2MetadataMap = Annotated[V2MetadataItems, NamedKeys()]


@with_config(_STRICT)
class V2Attribute(TypedDict):
    """A normalized attribute: {type, value, metadata}; the value is any JSON, null included."""

    type: NotRequired[str]
    value: Any
    metadata: NotRequired[V2MetadataMap]


@with_config(_STRICT)
class V2DateTimeAttribute(TypedDict):
    """dateCreated, dateModified or TimeInstant in normalized format."""

    type: NotRequired[str]
    value: Iso8601
    metadata: NotRequired[V2MetadataMap]


@with_config(_STRICT)
class V2AlterationAttribute(TypedDict):
    """alterationType in normalized format."""

    type: NotRequired[str]
    value: Literal[ALTERATION_TYPES]  # type: ignore[valid-type]
    metadata: NotRequired[V2MetadataMap]


class _Entity(BaseModel):
    # Entities are models rather than TypedDicts: a model's typed extras check the free keys
    # (attribute names) as well as their values, in the same pass. The models only validate
    # (nothing reads an instance), and a member's None default stands for "absent": defaults are
    # not validated, so an explicit null is still refused.
    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=False)


class V2Entity(_Entity):
    """An entity in normalized (and simplifiedNormalized) format."""

    __pydantic_extra__: dict[Name, V2Attribute] = Field(init=False)  # type: ignore[assignment]

    id: Name
    type: Name
    alteration_type: V2AlterationAttribute = Field(None, alias=ATTR_ALTERATION_TYPE)
    date_created: V2DateTimeAttribute = Field(None, alias=ATTR_DATE_CREATED)
    date_modified: V2DateTimeAttribute = Field(None, alias=ATTR_DATE_MODIFIED)
    time_instant: V2DateTimeAttribute = Field(None, alias=ATTR_TIME_INSTANT)


class V2KeyValuesEntity(_Entity):
    """An entity in keyValues (and simplifiedKeyValues) format: attribute name -> any JSON value."""

    __pydantic_extra__: dict[Name, Any] = Field(init=False)  # type: ignore[assignment]

    id: Name
    type: Name
    alteration_type: Literal[ALTERATION_TYPES] = Field(None, alias=ATTR_ALTERATION_TYPE)  # type: ignore[valid-type]
    date_created: Iso8601 = Field(None, alias=ATTR_DATE_CREATED)
    date_modified: Iso8601 = Field(None, alias=ATTR_DATE_MODIFIED)
    time_instant: Iso8601 = Field(None, alias=ATTR_TIME_INSTANT)


@with_config(_STRICT)
class V2Notification(TypedDict):
    """An Orion notification: {subscriptionId, data: [entity, ...]} in normalized format."""

    subscriptionId: NonEmptyStr
    data: Annotated[list[V2Entity], Field(min_length=1)]


@with_config(_STRICT)
class V2KeyValuesNotification(TypedDict):
    """An Orion notification in keyValues format."""

    subscriptionId: NonEmptyStr
    data: Annotated[list[V2KeyValuesEntity], Field(min_length=1)]


# --------------------------------------------------------------------------------------------
# NGSI-LD


def _check_uri_or_uris(value: Any, what: str) -> Any:
    if isinstance(value, str):
        if value:
            return value
        raise _custom("must not be empty")
    if isinstance(value, list) and value:
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise _custom(f"must be a string, got {_json_type(item)}", (i,))
            if not item:
                raise _custom("must not be empty", (i,))
        return value
    raise _custom(f"must be {what} or a non-empty array of them, got {_json_type(value)}")


def _check_ld_type(value: Any) -> Any:
    return _check_uri_or_uris(value, "a type name")


def _check_ld_object(value: Any) -> Any:
    return _check_uri_or_uris(value, "a URI string")


LdType = Annotated[Any, AfterValidator(_check_ld_type)]
LdObject = Annotated[Any, AfterValidator(_check_ld_object)]


@with_config(ConfigDict(strict=True, extra="allow"))
class LdGeometry(TypedDict):
    """A GeoJSON geometry: only its ``type`` is checked."""

    type: NonEmptyStr


@with_config(_STRICT)
class _LdAttribute(TypedDict):
    """Members every NGSI-LD attribute may have; unitCode and sub-attributes pass unchecked."""

    observedAt: NotRequired[Iso8601]
    datasetId: NotRequired[NonEmptyStr]
    createdAt: NotRequired[Iso8601]
    modifiedAt: NotRequired[Iso8601]


@with_config(_STRICT)
class LdProperty(_LdAttribute):
    type: Literal[LD_PROPERTY]  # type: ignore[valid-type]
    value: Any


@with_config(_STRICT)
class LdRelationship(_LdAttribute):
    type: Literal[LD_RELATIONSHIP]  # type: ignore[valid-type]
    object: LdObject


@with_config(_STRICT)
class LdGeoProperty(_LdAttribute):
    type: Literal[LD_GEOPROPERTY]  # type: ignore[valid-type]
    value: LdGeometry


@with_config(_STRICT)
class LdLanguageProperty(_LdAttribute):
    type: Literal[LD_LANGUAGE_PROPERTY]  # type: ignore[valid-type]
    languageMap: dict[str, Any]


_LD_ATTRIBUTE_TYPES: Final = (LD_PROPERTY, LD_RELATIONSHIP, LD_GEOPROPERTY, LD_LANGUAGE_PROPERTY)
# Union tags start with NUL so that dropping them from error locations cannot drop a real name
# (names may not hold control characters).
_TAG_PREFIX: Final = "\x00"
_TAG_INVALID: Final = "\x00invalid"
_TAG_MANY: Final = "\x00many"
_LD_TAGS: Final = {kind: _TAG_PREFIX + kind for kind in _LD_ATTRIBUTE_TYPES}


def _ld_attribute_tag(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            return _LD_TAGS.get(kind, _TAG_INVALID)
    return _TAG_INVALID


def _ld_member_tag(value: Any) -> str:
    return _TAG_MANY if isinstance(value, list) else _ld_attribute_tag(value)


def _reject_ld_attribute(value: Any) -> Any:
    if not isinstance(value, dict):
        raise _custom(f"an NGSI-LD attribute must be a JSON object, got {_json_type(value)}")
    if "type" not in value:
        raise _custom("required key 'type' is missing", ("type",))
    kinds = ", ".join(_LD_ATTRIBUTE_TYPES)
    raise _custom(f"must be one of {kinds}; got {value['type']!r}", ("type",))


_LD_INSTANCE_CHOICES = (
    Annotated[LdProperty, Tag(_LD_TAGS[LD_PROPERTY])]
    | Annotated[LdRelationship, Tag(_LD_TAGS[LD_RELATIONSHIP])]
    | Annotated[LdGeoProperty, Tag(_LD_TAGS[LD_GEOPROPERTY])]
    | Annotated[LdLanguageProperty, Tag(_LD_TAGS[LD_LANGUAGE_PROPERTY])]
    | Annotated[Any, AfterValidator(_reject_ld_attribute), Tag(_TAG_INVALID)]
)
LdAttribute = Annotated[_LD_INSTANCE_CHOICES, Discriminator(_ld_attribute_tag)]


def _check_dataset_ids(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A multi-attribute holds one instance per datasetId; no datasetId is the default instance.
    seen: set[str | None] = set()
    for i, instance in enumerate(instances):
        dataset_id = instance.get(LD_DATASET_ID)
        if dataset_id in seen:
            which = "default instance (no datasetId)" if dataset_id is None else f"datasetId {dataset_id!r}"
            raise _custom(f"duplicate {which} in a multi-attribute", (i, LD_DATASET_ID))
        seen.add(dataset_id)
    return instances


LdMultiAttribute = Annotated[list[LdAttribute], Field(min_length=1), AfterValidator(_check_dataset_ids)]
# An entity member is one attribute instance or a list of them; one discriminator call decides.
LdAttributeOrInstances = Annotated[
    _LD_INSTANCE_CHOICES | Annotated[LdMultiAttribute, Tag(_TAG_MANY)],
    Discriminator(_ld_member_tag),
]


class LdEntity(_Entity):
    """An NGSI-LD entity in normalized form: every member but the core ones is an attribute."""

    __pydantic_extra__: dict[Name, LdAttributeOrInstances] = Field(init=False)  # type: ignore[assignment]

    id: Uri
    type: LdType
    context: Any = Field(None, alias=LD_CONTEXT)
    scope: Any = None
    created_at: Iso8601 = Field(None, alias="createdAt")
    modified_at: Iso8601 = Field(None, alias="modifiedAt")
    deleted_at: Iso8601 = Field(None, alias="deletedAt")


@with_config(_STRICT)
class LdNotification(TypedDict):
    """An NGSI-LD notification: {id, type: Notification, subscriptionId, notifiedAt, data}."""

    id: Uri
    type: Literal[LD_NOTIFICATION]  # type: ignore[valid-type]
    subscriptionId: NonEmptyStr
    notifiedAt: Iso8601
    data: Annotated[list[LdEntity], Field(min_length=1)]


# --------------------------------------------------------------------------------------------
# Generic data-hub message (seed 004)


def _records_or_text(value: Any, handler: Any) -> Any:
    # Text is for a source system with an alternative message reader (CSV, seed 004): which reader
    # applies is the schema's business, decided when the message is processed.
    if isinstance(value, str):
        if not value.strip():
            raise _custom("must not be empty")
        return value
    return handler(value)


# The records, or the text an alternative message reader reads (CSV with a header line).
MessageData = Annotated[list[dict[str, Any]], WrapValidator(_records_or_text)]


@with_config(_STRICT)
class DataHubMessage(TypedDict):
    """A data-hub message: {entity, timestamp, data: [record, ...] or text, guid?, refresh?, source?, user?}.

    ``timestamp`` without a zone means UTC. Unknown top-level keys are ignored. ``data`` as a string
    is read by the source system's message reader (CSV).
    """

    entity: Name
    timestamp: Iso8601
    data: MessageData
    guid: NotRequired[NonEmptyStr]
    refresh: NotRequired[bool]
    source: NotRequired[str]
    user: NotRequired[str]


def _check_data_or_refresh(message: dict[str, Any]) -> dict[str, Any]:
    # An empty refresh means "no rows remain"; an empty plain message means nothing at all.
    if not message["data"] and not message.get("refresh", False):
        raise _custom("must not be empty unless refresh is true", ("data",))
    return message


CheckedDataHubMessage = Annotated[DataHubMessage, AfterValidator(_check_data_or_refresh)]


@dataclass(frozen=True, slots=True)
class _Schema:
    """What a request is checked against, built once: one validate_python call per request."""

    kind: Kind
    format: Format
    adapter: TypeAdapter[Any]
    single_entity: bool  # the body is one entity (the simplified formats)


_V2_SCHEMAS: Final = {
    fmt.value: _Schema(Kind.NGSI_V2, fmt, TypeAdapter(shape), single)
    for fmt, shape, single in (
        (Format.NORMALIZED, V2Notification, False),
        (Format.KEY_VALUES, V2KeyValuesNotification, False),
        (Format.SIMPLIFIED_NORMALIZED, V2Entity, True),
        (Format.SIMPLIFIED_KEY_VALUES, V2KeyValuesEntity, True),
    )
}
_V2_DEFAULT_SCHEMA: Final = _V2_SCHEMAS[Format.NORMALIZED.value]
_LD_SCHEMA: Final = _Schema(Kind.NGSI_LD, Format.LD_NORMALIZED, TypeAdapter(LdNotification), False)
_MESSAGE_SCHEMA: Final = _Schema(Kind.MESSAGE, Format.DATAHUB, TypeAdapter(CheckedDataHubMessage), False)

# Enum members bound to plain names: in Python 3.11 reading Kind.X costs a metaclass look-up,
# which adds up on a path run thousands of times a second.
_KIND_LD: Final = Kind.NGSI_LD
_KIND_MESSAGE: Final = Kind.MESSAGE
_ENDPOINT_LD: Final = Endpoint.NGSI_LD
_ENDPOINT_MESSAGES: Final = Endpoint.MESSAGES


# --------------------------------------------------------------------------------------------
# Error translation

_KEY_MARK: Final = "[key]"  # pydantic-core's mark for a failing dict key


def _path(loc: tuple[str | int, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif parts:
            parts.append("." + item)
        else:
            parts.append(item)
    return "".join(parts) or "body"


def _problem(error: Any, loc: tuple[str | int, ...], is_name: bool) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    got = _json_type(value)
    what = "name " if is_name else ""
    if kind == "ngsi_payload":
        return str(ctx["problem"])
    if kind == "missing":
        return f"required key {loc[-1]!r} is missing" if loc else "required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a JSON object, got {got}"
    if kind == "list_type":
        return f"must be a JSON array, got {got}"
    if kind == "string_type":
        return f"must be a string, got {got}"
    if kind == "bool_type":
        return f"must be true or false, got {got}"
    if kind in ("string_too_short", "too_short"):
        return f"{what}must not be empty"
    if kind == "string_too_long":
        return f"{what}longer than {ctx.get('max_length')} characters ({len(value)})"
    if kind == "string_pattern_mismatch":
        return what + _PATTERN_PROBLEMS.get(ctx.get("pattern", ""), str(error["msg"]))
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}; got {value!r}"
    return str(error["msg"])


def _from_validation_error(exc: ValidationError) -> PayloadError:
    error = exc.errors(include_url=False)[0]
    loc: tuple[str | int, ...] = tuple(error["loc"])
    if error["type"] == "ngsi_payload":
        loc += tuple(error["ctx"]["loc"])
    # A refused key: pydantic-core marks dict keys with "[key]"; a model's extras are reported at
    # the key itself, which is then also the input (a valid field name never fails as a value).
    is_name = bool(loc) and (loc[-1] == _KEY_MARK or (isinstance(loc[-1], str) and loc[-1] == error["input"]))
    bare = tuple(
        item for item in loc if not (isinstance(item, str) and (item.startswith(_TAG_PREFIX) or item == _KEY_MARK))
    )
    return PayloadError(400, _path(bare), _problem(error, bare, is_name))


# --------------------------------------------------------------------------------------------
# Headers


def _header_error(name: str, problem: str, status: int = 400) -> PayloadError:
    return PayloadError(status, "header " + _SHOWN_HEADERS[name], problem)


def _lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}


@lru_cache(maxsize=64)
def _media_type(raw: str | None, accepted: tuple[str, ...]) -> str:
    # Cached: clients send the same few Content-Type values over and over.
    if raw is None or not raw.strip():
        raise _header_error(HEADER_CONTENT_TYPE, f"missing; expected {' or '.join(accepted)}", 415)
    media, _, params = raw.partition(";")
    media = media.strip().lower()
    if media not in accepted:
        raise _header_error(
            HEADER_CONTENT_TYPE, f"unsupported media type {media!r}; expected {' or '.join(accepted)}", 415
        )
    for param in params.split(";") if params else ():
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
            if charset not in ("utf-8", "utf8"):
                raise _header_error(HEADER_CONTENT_TYPE, f"unsupported charset {charset!r}; JSON must be UTF-8", 415)
    return media


def _service(headers: dict[str, str], kind: Kind, settings: IngestSettings) -> str:
    name = HEADER_SERVICE
    raw = headers.get(HEADER_SERVICE)
    if raw is None and kind is _KIND_LD:
        name, raw = HEADER_LD_TENANT, headers.get(HEADER_LD_TENANT)
    if raw is None:
        return settings.default_service
    service = raw.strip()
    if not service:
        raise _header_error(name, "must not be empty (leave it out for the default service)")
    if len(service) > MAX_SERVICE_LENGTH:
        raise _header_error(name, f"longer than {MAX_SERVICE_LENGTH} characters ({len(service)})")
    return service


def _check_service_path(entry: str, where: str) -> None:
    if not entry.startswith("/"):
        raise _header_error(HEADER_SERVICE_PATH, f"{where}{entry!r} does not start with '/'")
    levels = entry.rstrip("/").count("/")
    if levels > MAX_SERVICE_PATH_LEVELS:
        raise _header_error(
            HEADER_SERVICE_PATH,
            f"{where}{entry!r} has {levels} levels; at most {MAX_SERVICE_PATH_LEVELS} are allowed",
        )


def _service_path(headers: dict[str, str], entity_count: int, settings: IngestSettings) -> str:
    raw = headers.get(HEADER_SERVICE_PATH)
    if raw is None:
        return settings.default_service_path
    if "," not in raw:
        path = raw.strip()
        _check_service_path(path, "")
        return path
    # Orion sends one path per notified entity, in the order of `data`.
    entries = [entry.strip() for entry in raw.split(",")]
    for i, entry in enumerate(entries):
        _check_service_path(entry, f"entry {i + 1}: ")
    if len(entries) != entity_count:
        raise _header_error(
            HEADER_SERVICE_PATH,
            f"{len(entries)} comma-separated paths for {entity_count} "
            f"{'entity' if entity_count == 1 else 'entities'}; "
            "a list needs exactly one path per entity",
        )
    return ",".join(entries)


def _correlator(headers: dict[str, str]) -> tuple[str | None, int | None]:
    raw = headers.get(HEADER_CORRELATOR)
    if raw is None:
        return None, None
    raw = raw.strip()
    head, semicolon, tail = raw.rpartition(";")
    tail = tail.lstrip()
    if not semicolon or not tail.startswith(_CBNOTIF_KEY):
        return raw or None, None
    number = tail[len(_CBNOTIF_KEY) :].strip()
    if not (number.isascii() and number.isdigit()):
        raise _header_error(HEADER_CORRELATOR, f"cbnotif must be a non-negative integer, got {number!r}")
    return head.rstrip() or None, int(number)


_CBNOTIF_KEY: Final = "cbnotif="


def _header_guid(headers: dict[str, str]) -> str | None:
    raw = headers.get(HEADER_MESSAGE_GUID)
    if raw is None:
        return None
    guid = raw.strip()
    if not guid:
        raise _header_error(HEADER_MESSAGE_GUID, "must not be empty")
    return guid


def _v2_schema(headers: dict[str, str]) -> _Schema:
    raw = headers.get(HEADER_ATTRS_FORMAT)
    if raw is None:
        return _V2_DEFAULT_SCHEMA
    schema = _V2_SCHEMAS.get(raw.strip())
    if schema is None:
        supported = ", ".join(_V2_SCHEMAS)
        raise _header_error(HEADER_ATTRS_FORMAT, f"unsupported format {raw!r}; supported: {supported}")
    return schema


# --------------------------------------------------------------------------------------------
# Body


def _parse_object(body: bytes) -> dict[str, Any]:
    if not body or body.isspace():
        raise PayloadError(400, "body", "empty body; expected a JSON object")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise PayloadError(400, "body", f"not valid UTF-8: {bad.reason} at byte {bad.start}") from None
        raise PayloadError(
            400, "body", f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
        ) from None
    if not isinstance(parsed, dict):
        raise PayloadError(400, "body", f"top level must be a JSON object, got {_json_type(parsed)}")
    return parsed


def validate_request(
    endpoint: Endpoint, headers: Mapping[str, str], body: bytes, settings: IngestSettings
) -> ValidatedMessage:
    """Check one request against its endpoint's protocol; raise PayloadError on the first problem.

    Order: Content-Type (415), size (413), the headers that do not depend on the body, the body,
    then Fiware-ServicePath (whose list form must match the entity count). ``headers`` may use any
    key case; Content-Type may carry parameters (a UTF-8 charset).
    """
    lowered = _lower_headers(headers)
    content_type = lowered.get(HEADER_CONTENT_TYPE)
    if endpoint is _ENDPOINT_MESSAGES:
        _media_type(content_type, _JSON_ONLY)
        schema: _Schema | None = _MESSAGE_SCHEMA
    else:
        media = _media_type(content_type, _JSON_OR_LD)
        # /notify takes NGSI-LD when labelled so; NGSI v2's format header is read after the size check.
        schema = _LD_SCHEMA if endpoint is _ENDPOINT_LD or media == MEDIA_LD_JSON else None

    if len(body) > settings.max_body_bytes:
        raise PayloadError(413, "body", f"{len(body)} bytes; at most {settings.max_body_bytes} are accepted")

    if schema is None:
        schema = _v2_schema(lowered)
    kind = schema.kind
    service = _service(lowered, kind, settings)
    correlator, cbnotif = _correlator(lowered)
    header_guid = None if kind is _KIND_MESSAGE else _header_guid(lowered)

    parsed = _parse_object(body)
    try:
        schema.adapter.validate_python(parsed)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    # Text data (a CSV message) takes one service path, like a single entity.
    entity_count = 1 if schema.single_entity or isinstance(parsed["data"], str) else len(parsed["data"])

    guid: str | None
    if kind is _KIND_MESSAGE:
        guid = parsed.get("guid")
    elif header_guid is not None:
        guid = header_guid
    elif settings.guid_from_correlator and cbnotif is not None and correlator is not None:
        guid = f"{correlator};cbnotif={cbnotif}"
    else:
        guid = None

    return ValidatedMessage(
        kind=kind,
        format=schema.format,
        service=service,
        service_path=_service_path(lowered, entity_count, settings),
        correlator=correlator,
        cbnotif=cbnotif,
        guid=guid,
        body=body,
        entity_count=entity_count,
    )
