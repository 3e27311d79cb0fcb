"""Publishing the transaction history (seed 003) into PostgreSQL: one HEAD and one history table per space.

Grain: one *space* (a target entity, e.g. ``product``) = the table pair ``"<schema>"."<name>"`` (HEAD:
the newest row of every live feature, keyed by ``id``) and ``"<schema>"."<name>_hst"`` (every history
row, keyed by ``i`` and ``uuid``), in the seed's layout; plus the shared ``xyz_config.transactions``
(one row per (tnx, schema, table)) and ``xyz_config.tags`` (one row per (space, name)).

The seed's text is followed, with its slips fixed (each would fail, or silently misbehave):

- ``CREATE INDEX ... "schema"."name"``: an index name cannot be schema-qualified; indexes are created
  unqualified, which puts them in their table's schema.
- ``CREATE SEQUENCE ... OWNED BY "schema"."table"``: OWNED BY needs a column; the sequences are owned
  by ``<table>.i`` (``_i_all_seq``) and ``xyz_config.transactions.id`` (``transactions_id_seq``).
- ``"action" int2 CONSTRAINT NOT NULL CHECK (...)``: ``CONSTRAINT`` needs a name; written ``NOT NULL CHECK``.
- ``space text COLLATE "C" UNIQUE`` in ``xyz_config.transactions`` would allow one transaction per
  space: the column is not unique (``(tnx, schema, table)`` and ``(id, space)`` stay unique).
- The seed's ``lastUpdatedBy`` is unquoted, so PostgreSQL names the column ``lastupdatedby``; kept so.
- The functions (``public.xyz_tnx_of`` ... ``xyz_uuid_of``) are the seed's, with two fixes: each pins
  ``SET TimeZone = 'UTC'`` (the seed declares them IMMUTABLE yet ``EXTRACT`` on a timestamptz reads the
  session's time zone, so a session outside UTC got other ids and an index on them went stale), and
  ``xyz_tnx_extract`` masks the year with ``x'fff'`` (the seed's ``x'ff'`` reads years >= 2256 wrong).
  ``xyz_tnx_min``/``max``/``current`` call ``public.xyz_tnx_of`` by its qualified name.
- ``geo geometry(GeometryZ, 4326)`` exists only when PostGIS can be enabled in the database
  (``CREATE EXTENSION IF NOT EXISTS postgis``); it is left NULL (features carry no geometry yet).

Table names come from :func:`history_table_names` (lower-case ``[a-z0-9_]``, a hash suffix when the
space had to be changed, shortened or could collide with a derived name), always quoted. DDL
(:func:`install`, :func:`ensure_space_tables`) runs in the caller's transaction under one
transaction-scoped advisory lock, so concurrent installs serialise instead of colliding in the
catalogs; the caller commits.

:func:`publish_partition` runs on Spark executors with its own connection: COPY into a temporary
table, history rows inserted idempotently (``ON CONFLICT (uuid) DO NOTHING``), then the HEAD rows of
the batch's ids recomputed from the whole history table (the newest row per id, kept when it is a
CREATE or UPDATE, like XYZ), all in one transaction. The HEAD step takes a per-space advisory lock so
that it always sees every history row committed before it: batches published in any order, or
concurrently, leave the same tables. Values are COPY'd or bound, never spliced; identifiers are quoted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, NamedTuple

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from ngsi_assets.sinks.sql_writer import _csv_field
from ngsi_assets.transforms.history_publication import OUTPUT_COLUMNS

CONFIG_SCHEMA = "xyz_config"
HISTORY_SUFFIX = "_hst"
PG_NAME_BYTES = 63
# The longest name derived from a space's base name is its history table's uuid index.
_LONGEST_SUFFIX = HISTORY_SUFFIX + "_uuid_idx"
MAX_BASE_BYTES = PG_NAME_BYTES - len(_LONGEST_SUFFIX)  # 50
HASH_CHARS = 10
# A base name ending like a derived relation name (table, index, sequence, primary key) or like a hash
# suffix could collide with another space's relations: such names get a hash suffix too.
_RESERVED_ENDING = re.compile(rf"(_hst|_idx|_seq|_pkey|_[0-9a-f]{{{HASH_CHARS}}})$")
_DDL_LOCK = "ngsi-xyz-history-ddl"
_HEAD_LOCK = "ngsi-xyz-history-head:"

# Columns of a published row, in COPY order (the lake's last_updated_by is the seed's lastUpdatedBy).
ROW_COLUMNS = OUTPUT_COLUMNS  # what feature_rows gives the executors to publish
_TABLE_COLUMNS = ("i", "action", "tnx", "ts", "id", "uuid", "puuid", "lastupdatedby", "jsondata")
TRANSACTION_KEYS = ("i", "id", "tnx", "schema", "table", "ts", "space", "commit_msg", "commit_json")
TAG_KEYS = ("name", "tnx", "ts")  # message is optional

# The seed's functions with the two fixes described in the module docstring (search for "fix").
FUNCTIONS_SQL = r"""
-- Create a unique transaction identifier from the given UTC timestamp and the given transaction id.
-- fix: SET TimeZone = 'UTC' makes EXTRACT read UTC fields whatever the session's time zone (IMMUTABLE holds).
CREATE OR REPLACE FUNCTION public.xyz_tnx_of(ts timestamptz, txid int8)
    RETURNS int8
    LANGUAGE plpgsql IMMUTABLE
    SET TimeZone = 'UTC'
    AS $$
DECLARE
    r record;
    tid int8 := (txid & x'fffffff'::int8);
BEGIN
    WITH parts AS (SELECT EXTRACT(year from ts)::int8   as "year",
                          EXTRACT(month from ts)::int8  as "month",
                          EXTRACT(day from ts)::int8    as "day",
                          EXTRACT(hour from ts)::int8   as "hour",
                          EXTRACT(minute from ts)::int8 as "minute")
    SELECT parts.* INTO r FROM parts;
    RETURN ((r.year - 2000) << 52)
               | (r.month << 48)
               | (r.day << 43)
               | (r.hour << 38)
               | (r.minute << 32)
               | ((tid >> 12) << 16)
               | (4::int8 << 12)
               | (tid & x'fff'::int8);
END;
$$;

-- Create the minimal unique transaction identifier for the given UTC timestamp.
CREATE OR REPLACE FUNCTION public.xyz_tnx_min(ts timestamptz)
    RETURNS int8
    LANGUAGE plpgsql IMMUTABLE
    SET TimeZone = 'UTC'
AS $$
BEGIN
    RETURN public.xyz_tnx_of(ts, 0::int8);
END
$$;

-- Create the maximal unique transaction identifier for the given UTC timestamp.
CREATE OR REPLACE FUNCTION public.xyz_tnx_max(ts timestamptz)
    RETURNS int8
    LANGUAGE plpgsql IMMUTABLE
    SET TimeZone = 'UTC'
AS $$
BEGIN
    RETURN public.xyz_tnx_of(ts, x'7fffffffffffffff'::int8);
END
$$;

-- Create the unique transaction identifier for the current transaction.
CREATE OR REPLACE FUNCTION public.xyz_tnx_current()
    RETURNS int8
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN public.xyz_tnx_of(current_timestamp, txid_current());
END
$$;

-- Split the given unique transaction identifier into its part.
-- fix: the year is 12 bits (x'fff'); the seed's x'ff' read years >= 2256 wrong.
CREATE OR REPLACE FUNCTION public.xyz_tnx_extract(tnx int8)
    RETURNS TABLE
            (
                year    int8,
                month   int8,
                day     int8,
                hour    int8,
                minute  int8,
                txid    int8
            )
    LANGUAGE plpgsql IMMUTABLE
    SET TimeZone = 'UTC'
AS
$$
BEGIN
    RETURN QUERY SELECT 2000 + ((tnx >> 52) & x'fff'::int8)                          as "year",
                        ((tnx >> 48) & x'f'::int8)                                   as "month",
                        ((tnx >> 43) & x'1f'::int8)                                  as "day",
                        (tnx >> 38) & x'1f'::int8                                    as "hour",
                        (tnx >> 32) & x'3f'::int8                                    as "minute",
                        (((tnx >> 16) & x'ffff'::int8) << 12 | (tnx & x'fff'::int8)) as "txid";
END;
$$;

-- Create a UUID from the given unique transaction identifier and the given sequence.
CREATE OR REPLACE FUNCTION public.xyz_uuid_of(tnx int8, i int8)
    RETURNS uuid
    LANGUAGE plpgsql IMMUTABLE
    SET TimeZone = 'UTC'
    AS
$BODY$
DECLARE
    raw_uuid bytea;
BEGIN
    raw_uuid := set_byte('\x00000000000000000000000000000000'::bytea, 0, ((tnx >> 56) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 1, ((tnx >> 48) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 2, ((tnx >> 40) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 3, ((tnx >> 32) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 4, ((tnx >> 24) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 5, ((tnx >> 16) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 6, ((tnx >> 8) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 7, (tnx & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 8, (((i >> 56) & x'3f'::int8) | 128)::int);
    raw_uuid := set_byte(raw_uuid, 9, ((i >> 48) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 10, ((i >> 40) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 11, ((i >> 32) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 12, ((i >> 24) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 13, ((i >> 16) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 14, ((i >> 8) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 15, (i & x'ff'::int8)::int);
    RETURN CAST(ENCODE(raw_uuid, 'hex') AS UUID);
END
$BODY$;
"""

CONFIG_SQL = """
CREATE TABLE IF NOT EXISTS xyz_config.transactions
(
    i           BIGSERIAL PRIMARY KEY,
    id          int8,
    tnx         int8             NOT NULL,
    "schema"    text COLLATE "C" NOT NULL,
    "table"     text COLLATE "C" NOT NULL,
    ts          timestamptz      NOT NULL,
    space       text COLLATE "C",
    commit_msg  text COLLATE "C",
    commit_json jsonb
);
CREATE SEQUENCE IF NOT EXISTS xyz_config.transactions_id_seq AS int8 OWNED BY xyz_config.transactions.id;
CREATE UNIQUE INDEX IF NOT EXISTS transactions_is_idx
    ON xyz_config.transactions USING btree ("id" DESC, "space" DESC);
CREATE UNIQUE INDEX IF NOT EXISTS transactions_tst_idx
    ON xyz_config.transactions USING btree ("tnx" DESC, "schema" ASC, "table" ASC);
CREATE UNIQUE INDEX IF NOT EXISTS transactions_id_idx
    ON xyz_config.transactions USING btree (id DESC);
CREATE INDEX IF NOT EXISTS transactions_tnx_idx
    ON xyz_config.transactions USING btree (tnx DESC);
CREATE INDEX IF NOT EXISTS transactions_ts_idx
    ON xyz_config.transactions USING btree (ts DESC);
CREATE TABLE IF NOT EXISTS xyz_config.tags
(
    space   text COLLATE "C" NOT NULL,
    name    text COLLATE "C" NOT NULL,
    tnx     int8             NOT NULL,
    ts      timestamptz      NOT NULL,
    message text,
    PRIMARY KEY (space, name)
);
"""


class SpaceTables(NamedTuple):
    """A space's two tables in ``schema``, and whether they carry the PostGIS ``geo`` column."""

    schema: str
    head: str
    history: str
    has_geo: bool


def _check_schema(schema: str) -> None:
    if not isinstance(schema, str) or not schema:
        raise ValueError("schema must be a non-empty string")
    if "\x00" in schema:
        raise ValueError(f"schema {schema!r} contains a NUL character")
    if len(schema.encode("utf-8")) > PG_NAME_BYTES:
        raise ValueError(f"schema {schema!r} is longer than PostgreSQL's {PG_NAME_BYTES} bytes")


def history_table_names(space: str) -> tuple[str, str]:
    """``(head, history)`` table names of ``space``: ``<name>`` and ``<name>_hst``, valid and distinct.

    ``<name>`` is the space lower-cased with every character outside ``[a-z0-9_]`` replaced by ``_``.
    When that changed the space, or is longer than 50 bytes (so every derived relation name, up to
    ``<name>_hst_uuid_idx``, fits PostgreSQL's 63 bytes), or ends like a derived name (``_hst``,
    ``_idx``, ``_seq``, ``_pkey``) or a hash suffix, it is cut to 39 characters and ``_`` plus the
    first 10 hex digits of the space's SHA-256 are appended. So distinct spaces never share a relation
    name (short of a 40-bit hash collision), whatever their spelling.
    """
    if not isinstance(space, str) or not space:
        raise ValueError("space must be a non-empty string")
    base = re.sub(r"[^a-z0-9_]", "_", space.lower())
    if base != space or len(base) > MAX_BASE_BYTES or _RESERVED_ENDING.search(base):
        digest = hashlib.sha256(space.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
        base = f"{base[: MAX_BASE_BYTES - HASH_CHARS - 1]}_{digest}"
    return base, base + HISTORY_SUFFIX


def _lock(cur: Any, key: str) -> None:
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))


def install(conn: psycopg2.extensions.connection, schema: str) -> None:
    """Create ``schema``, ``xyz_config`` (transactions, tags) and the ``public.xyz_*`` functions; idempotent.

    Runs in the caller's transaction (commit to release the advisory lock it takes).
    """
    _check_schema(schema)
    with conn.cursor() as cur:
        _lock(cur, _DDL_LOCK)
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(CONFIG_SCHEMA)))
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        cur.execute(FUNCTIONS_SQL)
        cur.execute(CONFIG_SQL)


def _postgis_type(cur: Any) -> sql.Composable | None:
    """The qualified ``geometry(GeometryZ, 4326)`` type, enabling PostGIS if possible; None if it cannot be."""
    cur.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE extname = %s",
        ("postgis",),
    )
    found = cur.fetchone()
    if found is None:
        cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = %s", ("postgis",))
        if cur.fetchone() is None:
            return None
        cur.execute("SAVEPOINT ngsi_postgis")
        try:
            cur.execute("CREATE EXTENSION IF NOT EXISTS postgis")
        except psycopg2.Error:
            # Not allowed (no privilege) or broken install: the tables go without the geo column.
            cur.execute("ROLLBACK TO SAVEPOINT ngsi_postgis")
            return None
        cur.execute("RELEASE SAVEPOINT ngsi_postgis")
        cur.execute(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE extname = %s",
            ("postgis",),
        )
        found = cur.fetchone()
    return sql.SQL("{}.geometry(GeometryZ, 4326)").format(sql.Identifier(found[0]))


def _columns(cur: Any, schema: str, table: str) -> list[str]:
    cur.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
        (schema, table),
    )
    return [r[0] for r in cur.fetchall()]


def ensure_space_tables(conn: psycopg2.extensions.connection, schema: str, space: str) -> SpaceTables:
    """Create the HEAD and history tables of ``space`` in ``schema`` (with sequence and indexes); idempotent.

    ``has_geo`` of the result is False when PostGIS is not available (the ``geo`` column is left out).
    Runs in the caller's transaction, under the DDL advisory lock.
    """
    _check_schema(schema)
    head, history = history_table_names(space)
    with conn.cursor() as cur:
        _lock(cur, _DDL_LOCK)
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        geo_type = _postgis_type(cur)
        geo = sql.SQL("geo {},").format(geo_type) if geo_type is not None else sql.SQL("")
        for table, id_unique in ((head, True), (history, False)):
            qt = sql.Identifier(schema, table)
            cur.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS {qt}
                    (
                        jsondata      jsonb,
                        {geo}
                        i             int8 PRIMARY KEY NOT NULL,
                        "action"      int2             NOT NULL CHECK ("action" >= 0 AND "action" <= 3),
                        tnx           int8             NOT NULL,
                        ts            timestamptz      NOT NULL,
                        id            text COLLATE "C" NOT NULL,
                        uuid          uuid             NOT NULL,
                        puuid         uuid,
                        lastUpdatedBy text COLLATE "C"
                    )"""
                ).format(qt=qt, geo=geo)
            )
            indexes = [
                ("_tnx_idx", "", "tnx DESC"),
                ("_ts_idx", "", "ts DESC"),
                # HEAD holds one row per feature: its id index is unique.
                ("_id_idx", "UNIQUE " if id_unique else "", "id ASC"),
                ("_uuid_idx", "UNIQUE ", "uuid DESC"),
                ("_lub_idx", "", "lastUpdatedBy ASC"),
            ]
            for suffix, unique, expr in indexes:
                cur.execute(
                    sql.SQL("CREATE {unique}INDEX IF NOT EXISTS {name} ON {qt} USING btree ({expr})").format(
                        unique=sql.SQL(unique), name=sql.Identifier(table + suffix), qt=qt, expr=sql.SQL(expr)
                    )
                )
        cur.execute(
            sql.SQL("CREATE SEQUENCE IF NOT EXISTS {seq} AS int8 OWNED BY {col}").format(
                seq=sql.Identifier(schema, head + "_i_all_seq"), col=sql.Identifier(schema, head, "i")
            )
        )
        has_geo = "geo" in _columns(cur, schema, head) and "geo" in _columns(cur, schema, history)
    return SpaceTables(schema, head, history, has_geo)


def published_max_i(conn: psycopg2.extensions.connection, schema: str, space: str) -> int:
    """The largest ``i`` in the space's history table; 0 when the table is missing or empty."""
    _check_schema(schema)
    _, history = history_table_names(space)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, history).as_string(cur),))
        if cur.fetchone()[0] is None:
            return 0
        cur.execute(sql.SQL("SELECT COALESCE(MAX(i), 0) FROM {}").format(sql.Identifier(schema, history)))
        return int(cur.fetchone()[0])


def published_last_i(conn: psycopg2.extensions.connection, schema: str, space: str) -> int:
    """The largest ``commit_json.last_i`` of the space's published transactions; 0 when there is none.

    The publication's watermark: a transaction row is published only after all its history rows
    (up to its ``last_i``), so rows above it may be missing and rows below it are all there.
    """
    _check_schema(schema)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('xyz_config.transactions')")
        if cur.fetchone()[0] is None:
            return 0
        cur.execute(
            """SELECT COALESCE(MAX((commit_json->>'last_i')::int8), 0) FROM xyz_config.transactions
               WHERE "schema" = %s AND space = %s""",
            (schema, space),
        )
        return int(cur.fetchone()[0])


def _require(row: Mapping[str, Any], keys: Iterable[str], what: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{what} lacks key(s) {', '.join(missing)}: {dict(row)!r}")


def _aware(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(f"{what} must be a datetime, got {type(value).__name__}")
    # PySpark hands TimestampType values out as naive datetimes in the process's local time.
    return value if value.tzinfo is not None else value.astimezone()


def publish_transactions(conn: psycopg2.extensions.connection, rows: list[dict]) -> int:
    """Insert ``xyz_config.transactions`` rows, one per (tnx, schema, table); returns how many were new.

    Keys: i (None: the serial's next value), id, tnx, schema, table, ts, space, commit_msg, commit_json
    (a dict, list or JSON text, or None). A (tnx, schema, table) already there is left as it is.
    Runs in the caller's transaction.
    """
    params = []
    for row in rows:
        _require(row, TRANSACTION_KEYS, "transaction row")
        cj = row["commit_json"]
        params.append(
            (
                row["i"],
                row["id"],
                row["tnx"],
                row["schema"],
                row["table"],
                _aware(row["ts"], "transaction ts"),
                row["space"],
                row["commit_msg"],
                cj if cj is None or isinstance(cj, str) else json.dumps(cj),
            )
        )
    inserted = 0
    with conn.cursor() as cur:
        for p in sorted(params, key=lambda p: (p[2], p[3], p[4])):
            cur.execute(
                """INSERT INTO xyz_config.transactions
                       (i, id, tnx, "schema", "table", ts, space, commit_msg, commit_json)
                   VALUES (COALESCE(%s::int8, nextval(pg_get_serial_sequence('xyz_config.transactions', 'i'))),
                           %s, %s, %s, %s, %s, %s, %s, %s::jsonb)
                   ON CONFLICT (tnx, "schema", "table") DO NOTHING""",
                p,
            )
            inserted += cur.rowcount
        if any(p[0] is not None for p in params):
            # Explicit i values bypass the serial: move it past them so a default never collides.
            cur.execute(
                """SELECT setval(pg_get_serial_sequence('xyz_config.transactions', 'i'), m)
                   FROM (SELECT MAX(i) AS m FROM xyz_config.transactions) t
                   WHERE m > (SELECT last_value FROM xyz_config.transactions_i_seq)"""
            )
    return inserted


def replace_tags(conn: psycopg2.extensions.connection, space: str, tags: list[dict]) -> None:
    """Make ``tags`` (keys name, tnx, ts, optional message) the ``xyz_config.tags`` rows of ``space``."""
    if not isinstance(space, str) or not space:
        raise ValueError("space must be a non-empty string")
    params = []
    seen: set[str] = set()
    for tag in tags:
        _require(tag, TAG_KEYS, "tag")
        if tag["name"] in seen:
            raise ValueError(f"tag {tag['name']!r} given twice for space {space!r}")
        seen.add(tag["name"])
        params.append((space, tag["name"], tag["tnx"], _aware(tag["ts"], "tag ts"), tag.get("message")))
    with conn.cursor() as cur:
        cur.execute("DELETE FROM xyz_config.tags WHERE space = %s", (space,))
        if params:
            cur.executemany(
                "INSERT INTO xyz_config.tags (space, name, tnx, ts, message) VALUES (%s, %s, %s, %s, %s)",
                sorted(params, key=lambda p: p[1]),
            )


def _copy_value(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name == "ts":
        return _csv_field(_aware(value, "ts").isoformat())
    return _csv_field(value)


def connect(url: str) -> psycopg2.extensions.connection:
    """A connection to ``url`` (``postgresql://user:password@host:port/db``), autocommit off, session in UTC."""
    # libpq reads postgresql:// URLs itself; an SQLAlchemy-style "+driver" is dropped.
    dsn = re.sub(r"^(postgres(?:ql)?)\+[A-Za-z0-9_]+://", r"\1://", url)
    conn = psycopg2.connect(dsn, options="-c TimeZone=UTC", application_name="ngsi-assets-history")
    conn.autocommit = False
    return conn


def publish_partition(rows: Iterable[Any], url: str, schema: str, space: str) -> Iterator[dict]:
    """Publish one partition of history rows (all rows of an id in the same partition); yields one stats dict.

    ``rows`` (Spark Rows or dicts) carry ``i, action, tnx, ts, id, uuid, puuid, last_updated_by,
    jsondata`` (JSON text). The tables must exist (:func:`install`, :func:`ensure_space_tables`). One
    transaction: COPY into a temporary table, insert into the history table (``ON CONFLICT (uuid) DO
    NOTHING``), then replace the HEAD rows of the batch's ids by each id's newest history row when it
    is a CREATE or UPDATE. Publishing the same rows again changes nothing.
    """
    _check_schema(schema)
    head, history = history_table_names(space)
    stats = {
        "schema": schema,
        "space": space,
        "head": head,
        "history": history,
        "rows": 0,
        "ids": 0,
        "history_inserted": 0,
        "head_deleted": 0,
        "head_inserted": 0,
    }
    with tempfile.SpooledTemporaryFile(max_size=32 * 2**20, mode="w+", encoding="utf-8", newline="") as spool:
        for r in rows:
            spool.write(",".join(_copy_value(c, r[c]) for c in ROW_COLUMNS))
            spool.write("\n")
            stats["rows"] += 1
        if stats["rows"] == 0:
            yield stats
            return
        spool.seek(0)
        conn = connect(url)
        try:
            with conn.cursor() as cur:
                stats.update(_publish(cur, spool, schema, head, history))
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise
        finally:
            conn.close()
    yield stats


def _publish(cur: Any, spool: Any, schema: str, head: str, history: str) -> dict[str, int]:
    cur.execute(
        """CREATE TEMPORARY TABLE ngsi_history_batch
           (i int8, "action" int2, tnx int8, ts timestamptz, id text COLLATE "C", uuid uuid, puuid uuid,
            lastupdatedby text COLLATE "C", jsondata jsonb) ON COMMIT DROP"""
    )
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in _TABLE_COLUMNS)
    cur.copy_expert(sql.SQL("COPY ngsi_history_batch ({}) FROM STDIN WITH (FORMAT csv)").format(cols), spool)
    hst, hd = sql.Identifier(schema, history), sql.Identifier(schema, head)
    cur.execute(
        sql.SQL(
            "INSERT INTO {hst} ({cols}) SELECT {cols} FROM ngsi_history_batch ORDER BY i ON CONFLICT (uuid) DO NOTHING"
        ).format(hst=hst, cols=cols)
    )
    history_inserted = cur.rowcount
    cur.execute("SELECT COUNT(DISTINCT id) FROM ngsi_history_batch")
    ids = int(cur.fetchone()[0])
    # Serialise the HEAD step of one space: it then reads every history row committed before it.
    _lock(cur, _HEAD_LOCK + sql.Identifier(schema, head).as_string(cur))
    cur.execute(sql.SQL("DELETE FROM {hd} h WHERE h.id IN (SELECT id FROM ngsi_history_batch)").format(hd=hd))
    head_deleted = cur.rowcount
    geo = "geo" in _columns(cur, schema, head) and "geo" in _columns(cur, schema, history)
    head_cols = sql.SQL(", ").join(sql.Identifier(c) for c in (*_TABLE_COLUMNS, *(("geo",) if geo else ())))
    cur.execute(
        sql.SQL(
            """INSERT INTO {hd} ({cols})
               SELECT {cols} FROM (
                   SELECT DISTINCT ON (x.id) x.* FROM {hst} x
                   WHERE x.id IN (SELECT id FROM ngsi_history_batch)
                   ORDER BY x.id, x.i DESC
               ) newest
               WHERE newest."action" IN (0, 1)
               ORDER BY newest.id"""
        ).format(hd=hd, hst=hst, cols=head_cols)
    )
    return {
        "ids": ids,
        "history_inserted": history_inserted,
        "head_deleted": head_deleted,
        "head_inserted": cur.rowcount,
    }
