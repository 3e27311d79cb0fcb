"""STH-Comet names and keys: databases, collections, ``_id`` fields, slots and ``occur`` keys.

Pure functions, no I/O. The rules follow Cygnus's NGSISTHSink (seed 002) where it is right:

- database: ``db_prefix`` + service; collection: ``collection_prefix`` + a name built from the
  service path (``dm-by-service-path``), plus entity id and type (``dm-by-entity``), plus the
  attribute name (``dm-by-attribute``), then the ``.aggr`` suffix;
- old encoding (``enable_encoding=false``): in database names ``/ \\ . " $`` and space become ``_``;
  in collection names ``$`` becomes ``_``; parts are joined with ``_``, also after a root service
  path: ``sth_/_car1_car.aggr``, as Cygnus's ``NGSIMongoBaseSink.buildCollectionName`` (and its test
  ``testBuildCollectionNameDMByEntityRootServicePathOldEncoding``) and STH-Comet's
  ``sthDatabaseNaming.getCollectionName4Aggregated`` name it (Cygnus's documentation table shows
  ``sth_/car1_car``, which neither program writes or reads);
- new encoding (``enable_encoding=true``): a character MongoDB forbids becomes ``x`` and the 4
  lower-case hex digits of its UTF-16 code unit, ``=`` becomes ``xffff``, a literal ``x`` followed
  by 4 hex digits becomes ``xx``..., and parts are joined with the concatenator ``xffff``. In
  database names upper-case ASCII letters are encoded as well (MongoDB database names are unique
  regardless of case), and so is the space (forbidden in database names; Cygnus forgets it);
- a namespace (database + ``.`` + collection) longer than the limit in UTF-8, a database name of
  64 bytes or more, or any name holding a NUL character cannot be written: ``STHNameError`` says
  why, and the records are quarantined with that reason. The namespace limit is
  ``max_namespace_bytes`` when set, else the server's: 255 bytes since MongoDB 4.4, 113 before
  (Cygnus's and STH-Comet's figure, which an old STH-Comet still enforces when it reads). The sinks
  read the server's version (``buildInfo``) before naming; without a server, 255 applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ngsi_assets.ngsi.sth_config import DataModel, Resolution, STHConfig

AGGR_SUFFIX = ".aggr"
CONCATENATOR = "xffff"
MAX_NAMESPACE_BYTES = 255
LEGACY_NAMESPACE_BYTES = 113
MAX_DATABASE_BYTES = 63

# The range a document of each resolution covers, and its slots (offsets) as STH-Comet reads them.
RANGES: dict[Resolution, str] = {
    Resolution.SECOND: "minute",
    Resolution.MINUTE: "hour",
    Resolution.HOUR: "day",
    Resolution.DAY: "month",
    Resolution.MONTH: "year",
}
SLOTS: dict[Resolution, tuple[int, int]] = {
    Resolution.SECOND: (0, 59),
    Resolution.MINUTE: (0, 59),
    Resolution.HOUR: (0, 23),
    Resolution.DAY: (1, 31),
    Resolution.MONTH: (0, 11),
}

# '$' and '.' cannot appear in MongoDB keys as written by STH-Comet: full-width look-alikes replace them.
OCCUR_ESCAPES = {"$": "\uff04", ".": "\uff0e"}

_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_OLD_DB = re.compile(r'[/\\."$ ]')
_OLD_COLLECTION = re.compile(r"\$")
_NEW_DB_SPECIAL = frozenset('/\\."$ ')
_NEW_COLLECTION_SPECIAL = frozenset("/$")


class STHNameError(ValueError):
    """A database or collection name that MongoDB would refuse; the message is the quarantine reason."""


@dataclass(frozen=True)
class STHNames:
    database: str
    collection: str


def _hex_code(ch: str) -> str:
    return "x" + format(ord(ch), "04x")


def _encode_new(text: str, special: frozenset[str], encode_upper: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "x" and _HEX4.fullmatch(text, i + 1, i + 5):
            out.append("xx")
        elif ch == "=":
            out.append(CONCATENATOR)
        elif ch in special or (encode_upper and "A" <= ch <= "Z"):
            out.append(_hex_code(ch))
        else:
            out.append(ch)
    return "".join(out)


def encode_database_new(text: str) -> str:
    """New encoding of a database name part (Cygnus ``encodeMongoDBDatabase``, plus the space)."""
    return _encode_new(text, _NEW_DB_SPECIAL, encode_upper=True)


def encode_collection_new(text: str) -> str:
    """New encoding of a collection name part (Cygnus ``encodeMongoDBCollection``)."""
    return _encode_new(text, _NEW_COLLECTION_SPECIAL, encode_upper=False)


def encode_database_old(text: str) -> str:
    """Old encoding of a database name part: ``/ \\ . " $`` and space become ``_``."""
    return _OLD_DB.sub("_", text)


def encode_collection_old(text: str) -> str:
    """Old encoding of a collection name part: ``$`` becomes ``_``."""
    return _OLD_COLLECTION.sub("_", text)


def database_name(service: str, config: STHConfig) -> str:
    """``db_prefix`` + service, both encoded; raises STHNameError if MongoDB would refuse it."""
    _no_nul("service", service)
    if config.enable_encoding:
        name = encode_database_new(config.db_prefix) + encode_database_new(service)
    else:
        name = encode_database_old(config.db_prefix) + encode_database_old(service)
    if not name:
        raise STHNameError("empty database name (empty db_prefix and service)")
    size = len(name.encode("utf-8"))
    if size > MAX_DATABASE_BYTES:
        raise STHNameError(
            f"database name {name!r} is {size} bytes in UTF-8; MongoDB allows at most {MAX_DATABASE_BYTES}"
        )
    return name


def collection_name(
    service_path: str,
    entity_id: str,
    entity_type: str | None,
    attr_name: str,
    config: STHConfig,
    *,
    aggregated: bool = True,
) -> str:
    """The collection of one attribute under ``config.data_model``, with the prefix.

    ``aggregated`` (STH aggregates, Cygnus's NGSISTHSink) adds ``.aggr``; the raw collections of
    Cygnus's NGSIMongoSink have the same name without it (both call
    ``NGSIMongoBaseSink.buildCollectionName``; only NGSISTHSink appends ``.aggr``).
    """
    for field, value in (
        ("service path", service_path),
        ("entity id", entity_id),
        ("entity type", entity_type),
        ("attribute name", attr_name),
    ):
        _no_nul(field, value)
    etype = entity_type or ""
    model = config.data_model
    if config.enable_encoding:
        enc = encode_collection_new
        parts = [enc(service_path)]
        if model in (DataModel.BY_ENTITY, DataModel.BY_ATTRIBUTE):
            parts += [enc(entity_id), enc(etype)]
        if model is DataModel.BY_ATTRIBUTE:
            parts.append(enc(attr_name))
        body = CONCATENATOR.join(parts)
        prefix = encode_collection_new(config.collection_prefix)
    else:
        enc = encode_collection_old
        body = enc(service_path)
        rest: list[str] = []
        if model in (DataModel.BY_ENTITY, DataModel.BY_ATTRIBUTE):
            rest += [enc(entity_id), enc(etype)]
        if model is DataModel.BY_ATTRIBUTE:
            rest.append(enc(attr_name))
        if rest:
            body += "_" + "_".join(rest)
        prefix = encode_collection_old(config.collection_prefix)
    return prefix + body + (AGGR_SUFFIX if aggregated else "")


def sth_names(
    service: str,
    service_path: str,
    entity_id: str,
    entity_type: str | None,
    attr_name: str,
    config: STHConfig,
    *,
    aggregated: bool = True,
) -> STHNames:
    """Database and collection of one attribute's aggregates (or, not ``aggregated``, of its raw
    samples as Cygnus's NGSIMongoSink names them); STHNameError if they cannot be written."""
    database = database_name(service, config)
    collection = collection_name(service_path, entity_id, entity_type, attr_name, config, aggregated=aggregated)
    namespace = f"{database}.{collection}"
    size = len(namespace.encode("utf-8"))
    limit = config.max_namespace_bytes or MAX_NAMESPACE_BYTES
    if size > limit:
        raise STHNameError(
            f"namespace {namespace!r} is {size} bytes in UTF-8; the limit is {limit} "
            "(max_namespace_bytes, else the server's: 255 from MongoDB 4.4, 113 before)"
        )
    return STHNames(database, collection)


def id_fields(data_model: DataModel) -> tuple[str, ...]:
    """The entity/attribute fields of ``_id`` (before origin, resolution, range) for a data model."""
    if data_model is DataModel.BY_SERVICE_PATH:
        return ("entityId", "entityType", "attrName")
    if data_model is DataModel.BY_ENTITY:
        return ("attrName",)
    return ()


def escape_occur_key(value: str) -> str:
    """A string value as an ``occur`` key: ``$`` -> U+FF04, ``.`` -> U+FF0E (as STH-Comet does)."""
    return value.replace("$", OCCUR_ESCAPES["$"]).replace(".", OCCUR_ESCAPES["."])


def _no_nul(field: str, value: str | None) -> None:
    if value is not None and "\x00" in value:
        raise STHNameError(f"{field} {value!r} contains a NUL character, which MongoDB names cannot hold")
