"""Cygnus-compatible database, table and column names for the PostgreSQL and MySQL sinks.

One name per (dialect, configuration, fiware-service, service path, entity id, entity type), computed
exactly as Cygnus does (``NGSICharsets.encodePostgreSQL`` / ``encodeMySQL`` and ``NGSIUtils.encode``,
``NGSIPostgreSQLSink`` / ``NGSIMySQLSink.buildDbName`` / ``buildTableName``), so tables and queries
built on Cygnus keep working:

- new encoding (``enable_encoding``): ``x`` + 4 lower-case hex digits per UTF-16 code unit for every
  character outside the kept set (PostgreSQL keeps ``a-z``, ``0-9`` and ``_``; MySQL also keeps
  ``A-Z``), ``=`` -> ``xffff`` (also the concatenator), a literal ``x`` followed by 4 hex digits ->
  ``xx``; the entity is named ``<entityId>=<entityType>`` before encoding;
- old encoding: the leading ``/`` of the service path is dropped and ``_`` concatenates. MySQL: every
  character outside ``A-Za-z0-9.-`` becomes ``_``, exactly as Cygnus's ``NGSIUtils.encode`` (its
  MySQL sink backtick-quotes names, so a service ``smart-city`` has a database ``smart-city``).
  PostgreSQL: every character outside ``A-Za-z0-9_`` becomes ``_``, ``-`` and ``.`` included, on
  purpose: Cygnus's PostgreSQL sink splices names unquoted, so a name with ``-`` is a syntax error and
  one with ``.`` a qualified name; no table Cygnus managed to create has them, so this rule finds
  every existing table and names the others safely;
- ``enable_lowercase`` lower-cases the final names; PostgreSQL names are always lower-cased because
  Cygnus never quotes them and PostgreSQL folds unquoted names to lower case (this platform quotes
  every name, so it folds first to land on the same table);
- a name longer than 63 (PostgreSQL) or 64 (MySQL) characters, or the root service path ``/`` with
  ``dm-by-service-path`` under the old encoding, is a :class:`NamingError` for that record.

No Spark, no Dagster, no driver: pure functions, exhaustively unit-tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Dialect(StrEnum):
    POSTGRESQL = "postgresql"
    MYSQL = "mysql"


class DataModel(StrEnum):
    BY_SERVICE_PATH = "dm-by-service-path"
    BY_ENTITY = "dm-by-entity"
    BY_ENTITY_TYPE = "dm-by-entity-type"
    BY_FIXED_ENTITY_TYPE = "dm-by-fixed-entity-type"
    # Cygnus's MySQL sink accepts these and names tables as the model without "-database" (a MySQL
    # database is already per service); its PostgreSQL sink makes them a database per service.
    BY_ENTITY_DATABASE = "dm-by-entity-database"
    BY_ENTITY_TYPE_DATABASE = "dm-by-entity-type-database"
    BY_FIXED_ENTITY_TYPE_DATABASE = "dm-by-fixed-entity-type-database"
    # PostgreSQL only: a database per service and a schema per service path.
    BY_ENTITY_DATABASE_SCHEMA = "dm-by-entity-database-schema"
    BY_ENTITY_TYPE_DATABASE_SCHEMA = "dm-by-entity-type-database-schema"
    BY_FIXED_ENTITY_TYPE_DATABASE_SCHEMA = "dm-by-fixed-entity-type-database-schema"


# The table naming each model shares (the case groups of NGSIMySQLSink / NGSIPostgreSQLSink.buildTableName).
_TABLE_MODEL: dict[DataModel, DataModel] = {
    DataModel.BY_ENTITY_DATABASE: DataModel.BY_ENTITY,
    DataModel.BY_ENTITY_TYPE_DATABASE: DataModel.BY_ENTITY_TYPE,
    DataModel.BY_FIXED_ENTITY_TYPE_DATABASE: DataModel.BY_FIXED_ENTITY_TYPE,
    DataModel.BY_ENTITY_DATABASE_SCHEMA: DataModel.BY_ENTITY,
    DataModel.BY_ENTITY_TYPE_DATABASE_SCHEMA: DataModel.BY_ENTITY_TYPE,
    DataModel.BY_FIXED_ENTITY_TYPE_DATABASE_SCHEMA: DataModel.BY_FIXED_ENTITY_TYPE,
}
# Models with a PostgreSQL database per service (NGSIPostgreSQLSink.buildDBName); on MySQL the
# "-database" ones name tables as their base model, and the "-database-schema" ones do not exist.
SCHEMA_PER_PATH = frozenset(
    {
        DataModel.BY_ENTITY_DATABASE_SCHEMA,
        DataModel.BY_ENTITY_TYPE_DATABASE_SCHEMA,
        DataModel.BY_FIXED_ENTITY_TYPE_DATABASE_SCHEMA,
    }
)
DATABASE_PER_SERVICE = frozenset(_TABLE_MODEL)


MAX_NAME_LEN: dict[Dialect, int] = {Dialect.POSTGRESQL: 63, Dialect.MYSQL: 64}
CONCATENATOR = "xffff"
# Cygnus names an entity ``<id>=<type>`` before encoding; ``=`` encodes to the concatenator.
INTERNAL_CONCATENATOR = "="
OLD_CONCATENATOR = "_"
DEFAULT_SERVICE = "default"
DEFAULT_SERVICE_PATH = "/"
MD_SUFFIX = "_md"
# The last-data column of a row's ordering instant (epoch nanoseconds) when the sink orders by an
# attribute's ISO 8601 instant (``SqlSinkConfig.orders_by_instant``). Attribute columns are made of
# A-Za-z0-9_ only (anything else is x-encoded), so the ``$`` keeps this name clear of every one.
INSTANT_COLUMN = "ngsi$instant"

_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_OLD_INVALID = re.compile(r"[^A-Za-z0-9_]")
# Cygnus NGSIUtils.ENCODEPATTERN: "[^a-zA-Z0-9\\.\\-]" (``_`` is replaced by itself).
_OLD_INVALID_MYSQL = re.compile(r"[^A-Za-z0-9.\-]")


class NamingError(ValueError):
    """A database, table or column name that breaks a rule; the record it comes from is quarantined."""


def _kept(ch: str, dialect: Dialect) -> bool:
    if "a" <= ch <= "z" or "0" <= ch <= "9" or ch == "_":
        return True
    return dialect is Dialect.MYSQL and "A" <= ch <= "Z"


def encode_new(text: str, dialect: Dialect) -> str:
    """The new (x-hex) encoding of ``text`` for ``dialect``, per UTF-16 code unit as Cygnus (Java) does."""
    units = text.encode("utf-16-le")
    chars = [chr(int.from_bytes(units[i : i + 2], "little")) for i in range(0, len(units), 2)]
    out: list[str] = []
    for i, ch in enumerate(chars):
        if ch == "x":
            # Cygnus looks at the next 4 code units only when 4 more follow (i + 4 < len).
            nxt = "".join(chars[i + 1 : i + 5]) if i + 4 < len(chars) else ""
            out.append("xx" if _HEX4.fullmatch(nxt) else "x")
        elif _kept(ch, dialect):
            out.append(ch)
        elif ch == "=":
            out.append(CONCATENATOR)
        else:
            out.append(f"x{ord(ch):04x}")
    return "".join(out)


def encode_old(text: str, dialect: Dialect = Dialect.POSTGRESQL) -> str:
    """The old encoding: every character but ``A-Za-z0-9.-`` (MySQL) or ``A-Za-z0-9_`` (PostgreSQL) becomes ``_``."""
    return (_OLD_INVALID_MYSQL if dialect is Dialect.MYSQL else _OLD_INVALID).sub("_", text)


@dataclass(frozen=True)
class NamingConfig:
    """The naming parameters of a sink, with Cygnus's names."""

    dialect: Dialect
    data_model: DataModel = DataModel.BY_ENTITY
    enable_encoding: bool = False
    enable_lowercase: bool = False
    default_service: str = DEFAULT_SERVICE
    default_service_path: str = DEFAULT_SERVICE_PATH


def _finish(name: str, what: str, cfg: NamingConfig) -> str:
    if cfg.enable_lowercase or cfg.dialect is Dialect.POSTGRESQL:
        name = name.lower()
    return _checked(name, what, cfg)


def _checked(name: str, what: str, cfg: NamingConfig) -> str:
    if not name:
        raise NamingError(f"{what} name is empty")
    limit = MAX_NAME_LEN[cfg.dialect]
    if len(name) > limit:
        raise NamingError(
            f"{what} name '{name}' is {len(name)} characters long, over the {cfg.dialect} limit of {limit}"
        )
    return name


def effective_service(service: str | None, cfg: NamingConfig) -> str:
    return service if service else cfg.default_service


def effective_service_path(service_path: str | None, cfg: NamingConfig) -> str:
    return service_path if service_path else cfg.default_service_path


def database_name(service: str | None, cfg: NamingConfig) -> str | None:
    """The PostgreSQL database of a fiware-service under a ``*-database*`` model; None otherwise (the URL's).

    Cygnus's ``NGSIPostgreSQLSink.buildDBName``: ``encodePostgreSQL`` (new encoding) or
    ``NGSIUtils.encode`` (old encoding, which keeps ``-`` and ``.``: Cygnus passes the name in its JDBC
    URL, never in SQL, so ``smart-city`` is a database it can use). Not case-folded: a database name
    in a connection string is taken as written (``enable_lowercase`` still lower-cases it).
    """
    if cfg.dialect is not Dialect.POSTGRESQL or cfg.data_model not in DATABASE_PER_SERVICE:
        return None
    service = effective_service(service, cfg)
    name = encode_new(service, cfg.dialect) if cfg.enable_encoding else encode_old(service, Dialect.MYSQL)
    return _checked(name.lower() if cfg.enable_lowercase else name, "database", cfg)


def db_name(service: str | None, cfg: NamingConfig, service_path: str | None = None) -> str:
    """The MySQL database, or the PostgreSQL schema: of the fiware-service, or of the service path
    under a ``*-database-schema`` model (``NGSIPostgreSQLSink.buildSchemaName``)."""
    if cfg.data_model in SCHEMA_PER_PATH:
        path = effective_service_path(service_path, cfg)
        if cfg.enable_encoding:
            name = encode_new(path, cfg.dialect)
        else:
            if path == "/":
                raise NamingError(f"the root service path '/' cannot name a schema with {cfg.data_model.value}")
            name = encode_old(path[1:] if path.startswith("/") else path, cfg.dialect)
        return _finish(name, "schema", cfg)
    service = effective_service(service, cfg)
    name = encode_new(service, cfg.dialect) if cfg.enable_encoding else encode_old(service, cfg.dialect)
    kind = "schema" if cfg.dialect is Dialect.POSTGRESQL else "database"
    return _finish(name, kind, cfg)


def table_name(
    service_path: str | None, entity_id: str, entity_type: str | None, cfg: NamingConfig, suffix: str = ""
) -> str:
    """The table of a record under ``cfg.data_model``; ``suffix`` is the last-data suffix, if any."""
    path = effective_service_path(service_path, cfg)
    etype = entity_type or ""
    model = _TABLE_MODEL.get(cfg.data_model, cfg.data_model)
    if cfg.enable_encoding:
        enc = cfg.dialect
        if model is DataModel.BY_SERVICE_PATH:
            name = encode_new(path, enc)
        elif model is DataModel.BY_ENTITY:
            name = encode_new(path, enc) + CONCATENATOR + encode_new(entity_id + INTERNAL_CONCATENATOR + etype, enc)
        elif model is DataModel.BY_FIXED_ENTITY_TYPE:
            name = encode_new(etype, enc)
        else:
            # Cygnus's PostgreSQL sink encodes dm-by-entity-type names with encodeMySQL (upper case
            # kept), which PostgreSQL then folds: reproduced so the same table is found.
            enc = Dialect.MYSQL
            name = encode_new(path, enc) + CONCATENATOR + encode_new(etype, enc)
    else:
        dialect = cfg.dialect
        trimmed = encode_old(path[1:] if path.startswith("/") else path, dialect)
        prefix = trimmed + OLD_CONCATENATOR if trimmed else ""
        if model is DataModel.BY_SERVICE_PATH:
            if path == "/":
                raise NamingError("the root service path '/' cannot name a table with dm-by-service-path")
            name = trimmed
        elif model is DataModel.BY_ENTITY:
            name = prefix + encode_old(entity_id + OLD_CONCATENATOR + etype, dialect)
        elif model is DataModel.BY_FIXED_ENTITY_TYPE:
            name = encode_old(etype, dialect)
        else:
            name = prefix + encode_old(etype, dialect)
    return _finish(name + suffix, "table", cfg)


# Fixed columns of the Cygnus layouts, as Cygnus names them.
ROW_COLUMNS: tuple[str, ...] = (
    "recvTimeTs",
    "recvTime",
    "fiwareServicePath",
    "entityId",
    "entityType",
    "attrName",
    "attrType",
    "attrValue",
    "attrMd",
)
COLUMN_FIXED: tuple[str, ...] = ("recvTime", "fiwareServicePath", "entityId", "entityType")


def fixed_column(name: str, dialect: Dialect) -> str:
    """A fixed Cygnus column as it exists in the database (PostgreSQL folds Cygnus's unquoted names)."""
    return name.lower() if dialect is Dialect.POSTGRESQL else name


def attribute_column(attr_name: str, dialect: Dialect) -> str:
    """The column of an attribute in column mode (its metadata column adds ``_md``).

    Cygnus uses the attribute name as it is (unquoted); a name made of ``A-Za-z0-9_`` keeps that
    name (lower-cased on PostgreSQL, as PostgreSQL folds it), anything else is x-encoded so no
    notified string reaches the SQL text. Raises NamingError if the column (or its ``_md``) is too
    long or would collide with a fixed column.
    """
    name = encode_new(attr_name, Dialect.MYSQL)
    if dialect is Dialect.POSTGRESQL:
        name = name.lower()
    if not name:
        raise NamingError("attribute name is empty")
    fixed = {c.lower() for c in COLUMN_FIXED}
    if name.lower() in fixed:
        raise NamingError(f"attribute '{attr_name}' would overwrite the fixed column '{name}'")
    limit = MAX_NAME_LEN[dialect]
    if len(name) + len(MD_SUFFIX) > limit:
        raise NamingError(
            f"column '{name}{MD_SUFFIX}' of attribute '{attr_name}' is {len(name) + len(MD_SUFFIX)} characters "
            f"long, over the {dialect} limit of {limit}"
        )
    return name


def quote_ident(name: str, dialect: Dialect) -> str:
    """Quote an (already encoded) identifier; the quote character itself is doubled, as both servers expect."""
    if dialect is Dialect.POSTGRESQL:
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"
