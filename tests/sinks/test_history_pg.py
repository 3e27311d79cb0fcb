"""The transaction history's PostgreSQL publication against the real server: DDL, HEAD rules, idempotence, names.

Each test takes a fresh database (``postgres_db_url``). The throwaway server has PostGIS installed
(``scripts/test.sh`` installs ``postgresql-15-postgis-3``), so the ``geo`` column path runs; a role
that may not create extensions shows the path without it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg2
import pytest
from psycopg2 import sql

from ngsi_assets.ngsi.transactions import tnx_of, uuid_of
from ngsi_assets.sinks.history_pg import (
    SpaceTables,
    connect,
    ensure_space_tables,
    history_table_names,
    install,
    publish_partition,
    publish_transactions,
    published_last_i,
    published_max_i,
    replace_tags,
)
from tests.support.servers import unique_name

SCHEMA = "ngsi_history"
T0 = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
TABLE_COLUMNS = [
    ("jsondata", "jsonb", None),
    ("geo", "geometry", None),
    ("i", "int8", None),
    ("action", "int2", None),
    ("tnx", "int8", None),
    ("ts", "timestamptz", None),
    ("id", "text", "C"),
    ("uuid", "uuid", None),
    ("puuid", "uuid", None),
    ("lastupdatedby", "text", "C"),
]


@pytest.fixture
def conn(postgres_db_url: str) -> Iterator[Any]:
    c = psycopg2.connect(postgres_db_url, options="-c TimeZone=UTC")
    try:
        yield c
    finally:
        c.close()


def prepared(conn: Any, space: str, schema: str = SCHEMA) -> SpaceTables:
    install(conn, schema)
    tables = ensure_space_tables(conn, schema, space)
    conn.commit()
    return tables


def hrow(i: int, action: int, fid: str, minute: int, puuid: str | None = None, doc: str | None = None) -> dict:
    """One publishable history row of feature ``fid`` written ``minute`` minutes after T0."""
    tnx = tnx_of(T0 + timedelta(minutes=minute), 100 + i)
    return {
        "i": i,
        "action": action,
        "tnx": tnx,
        "ts": T0 + timedelta(minutes=minute),
        "id": fid,
        "uuid": str(uuid_of(tnx, i)),
        "puuid": puuid,
        "last_updated_by": "ingest",
        "jsondata": doc if doc is not None else f'{{"type":"Feature","id":"{fid}","properties":{{"v":{i}}}}}',
    }


def chain() -> tuple[list[dict], list[dict]]:
    """Two batches: a CREATE+UPDATE, b CREATE+DELETE, c CREATE, d CREATE+UPDATE+PURGE; then b recreated, c deleted."""
    a1, a2 = hrow(1, 0, "a", 0), hrow(5, 1, "a", 1)
    a2["puuid"] = a1["uuid"]
    b1, b2 = hrow(2, 0, "b", 0), hrow(6, 2, "b", 1)
    b2["puuid"] = b1["uuid"]
    c1 = hrow(3, 0, "c", 0)
    d1, d2, d3 = hrow(4, 0, "d", 0), hrow(7, 1, "d", 1), hrow(8, 3, "d", 2)
    d2["puuid"], d3["puuid"] = d1["uuid"], d2["uuid"]
    first = [a1, a2, b1, b2, c1, d1, d2, d3]
    b3 = hrow(9, 1, "b", 3, puuid=b2["uuid"])
    c2 = hrow(10, 2, "c", 3, puuid=c1["uuid"])
    return first, [b3, c2]


def dump(conn: Any, schema: str, table: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL(
                'SELECT i, "action", tnx, ts, id, uuid::text, puuid::text, lastupdatedby, jsondata FROM {} ORDER BY i'
            ).format(sql.Identifier(schema, table))
        )
        return cur.fetchall()


def as_table_row(r: dict) -> tuple:
    return (
        r["i"],
        r["action"],
        r["tnx"],
        r["ts"],
        r["id"],
        r["uuid"],
        r["puuid"],
        r["last_updated_by"],
        json.loads(r["jsondata"]),
    )


def publish(url: str, rows: list[dict], space: str, schema: str = SCHEMA) -> dict:
    return list(publish_partition(iter(rows), url, schema, space))[0]


# -- names -----------------------------------------------------------------------------------------


def test_table_names() -> None:
    assert history_table_names("product") == ("product", "product_hst")
    assert history_table_names("sensor_2") == ("sensor_2", "sensor_2_hst")
    fiware = history_table_names("https://uri.fiware.org/ns/data-models#Parking")
    assert fiware == (
        "https___uri_fiware_org_ns_data_models_p_36dc4a0f82",
        "https___uri_fiware_org_ns_data_models_p_36dc4a0f82_hst",
    )
    # Spellings that fold or replace to the same name stay apart, and never take the plain name.
    spaces = [
        "Product",
        "product",
        "PRODUCT",
        "a-b",
        "a_b",
        "a.b",
        "a b",
        "é",
        "e",
        "x",
        "x_hst",
        "x_idx",
        "x_seq",
        "x_pkey",
    ]
    names = [history_table_names(s) for s in spaces]
    every = [n for pair in names for n in pair]
    assert len(set(every)) == len(every)
    assert names[1] == ("product", "product_hst")
    assert names[4] == ("a_b", "a_b_hst")
    assert names[9] == ("x", "x_hst")
    assert names[10][0].startswith("x_hst_") and len(names[10][0]) == len("x_hst_") + 10
    # A plain name that looks hashed gets hashed itself, so no plain name equals a hashed one.
    looks_hashed = "product_" + history_table_names("Product")[0][-10:]
    assert history_table_names(looks_hashed)[0] != history_table_names("Product")[0]


def test_over_long_names_fit_and_stay_distinct() -> None:
    long_a, long_b = "a" * 200 + "1", "a" * 200 + "2"
    head_a, hst_a = history_table_names(long_a)
    head_b, hst_b = history_table_names(long_b)
    assert head_a != head_b and hst_a != hst_b
    assert len((hst_a + "_uuid_idx").encode()) <= 63
    assert head_a == "a" * 39 + "_" + head_a[-10:]
    # 50 bytes is the longest plain name (its history uuid index has 63); 51 gets hashed.
    assert history_table_names("b" * 50) == ("b" * 50, "b" * 50 + "_hst")
    assert history_table_names("b" * 51)[0] == "b" * 39 + "_" + history_table_names("b" * 51)[0][-10:]


@pytest.mark.parametrize("space", ["", None, 5])
def test_bad_space_is_refused(space: Any) -> None:
    with pytest.raises(ValueError, match="space must be a non-empty string"):
        history_table_names(space)


# -- DDL -------------------------------------------------------------------------------------------


def columns(conn: Any, schema: str, table: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(
            """SELECT column_name, udt_name, collation_name FROM information_schema.columns
               WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position""",
            (schema, table),
        )
        return cur.fetchall()


def indexes(conn: Any, schema: str, table: str) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s", (schema, table)
        )
        return {name: " ".join(d.split()) for name, d in cur.fetchall()}


@pytest.mark.integration
def test_install_twice_gives_the_seed_layout(conn: Any) -> None:
    install(conn, SCHEMA)
    conn.commit()
    install(conn, SCHEMA)
    conn.commit()
    assert columns(conn, "xyz_config", "transactions") == [
        ("i", "int8", None),
        ("id", "int8", None),
        ("tnx", "int8", None),
        ("schema", "text", "C"),
        ("table", "text", "C"),
        ("ts", "timestamptz", None),
        ("space", "text", "C"),
        ("commit_msg", "text", "C"),
        ("commit_json", "jsonb", None),
    ]
    on = "ON xyz_config.transactions USING btree"
    assert indexes(conn, "xyz_config", "transactions") == {
        "transactions_pkey": f"CREATE UNIQUE INDEX transactions_pkey {on} (i)",
        "transactions_is_idx": f"CREATE UNIQUE INDEX transactions_is_idx {on} (id DESC, space DESC)",
        "transactions_tst_idx": f'CREATE UNIQUE INDEX transactions_tst_idx {on} (tnx DESC, schema, "table")',
        "transactions_id_idx": f"CREATE UNIQUE INDEX transactions_id_idx {on} (id DESC)",
        "transactions_tnx_idx": f"CREATE INDEX transactions_tnx_idx {on} (tnx DESC)",
        "transactions_ts_idx": f"CREATE INDEX transactions_ts_idx {on} (ts DESC)",
    }
    assert columns(conn, "xyz_config", "tags") == [
        ("space", "text", "C"),
        ("name", "text", "C"),
        ("tnx", "int8", None),
        ("ts", "timestamptz", None),
        ("message", "text", None),
    ]
    with conn.cursor() as cur:
        cur.execute(
            """SELECT p.proname, p.provolatile, p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = 'public' AND p.proname LIKE 'xyz_%%' ORDER BY p.proname"""
        )
        assert cur.fetchall() == [
            ("xyz_tnx_current", "s", None),
            ("xyz_tnx_extract", "i", ["TimeZone=UTC"]),
            ("xyz_tnx_max", "i", ["TimeZone=UTC"]),
            ("xyz_tnx_min", "i", ["TimeZone=UTC"]),
            ("xyz_tnx_of", "i", ["TimeZone=UTC"]),
            ("xyz_uuid_of", "i", ["TimeZone=UTC"]),
        ]
        cur.execute("SELECT pg_get_serial_sequence('xyz_config.transactions', 'id')")
        assert cur.fetchone() == ("xyz_config.transactions_id_seq",)
        cur.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s", (SCHEMA,))
        assert cur.fetchone() == (SCHEMA,)
        cur.execute("SET TIME ZONE 'Pacific/Chatham'")
        cur.execute("SELECT public.xyz_tnx_current() = public.xyz_tnx_of(current_timestamp, txid_current())")
        assert cur.fetchone() == (True,)
        cur.execute("SELECT (public.xyz_tnx_extract(public.xyz_tnx_of('2300-05-06 07:08+00', 99))).*")
        assert cur.fetchone() == (2300, 5, 6, 7, 8, 99)


@pytest.mark.integration
def test_space_tables_layout_with_postgis(conn: Any) -> None:
    first = prepared(conn, "product")
    again = ensure_space_tables(conn, SCHEMA, "product")
    conn.commit()
    assert first == again == SpaceTables(SCHEMA, "product", "product_hst", True)
    for table in ("product", "product_hst"):
        assert columns(conn, SCHEMA, table) == TABLE_COLUMNS
    with conn.cursor() as cur:
        cur.execute("SELECT type, srid, coord_dimension FROM geometry_columns WHERE f_table_name = 'product_hst'")
        assert cur.fetchone() == ("GEOMETRY", 4326, 3)
        cur.execute("SELECT pg_get_serial_sequence('ngsi_history.product', 'i')")
        assert cur.fetchone() == ("ngsi_history.product_i_all_seq",)
    q = "ngsi_history."
    assert indexes(conn, SCHEMA, "product") == {
        "product_pkey": f"CREATE UNIQUE INDEX product_pkey ON {q}product USING btree (i)",
        "product_tnx_idx": f"CREATE INDEX product_tnx_idx ON {q}product USING btree (tnx DESC)",
        "product_ts_idx": f"CREATE INDEX product_ts_idx ON {q}product USING btree (ts DESC)",
        "product_id_idx": f"CREATE UNIQUE INDEX product_id_idx ON {q}product USING btree (id)",
        "product_uuid_idx": f"CREATE UNIQUE INDEX product_uuid_idx ON {q}product USING btree (uuid DESC)",
        "product_lub_idx": f"CREATE INDEX product_lub_idx ON {q}product USING btree (lastupdatedby)",
    }
    assert indexes(conn, SCHEMA, "product_hst") == {
        "product_hst_pkey": f"CREATE UNIQUE INDEX product_hst_pkey ON {q}product_hst USING btree (i)",
        "product_hst_tnx_idx": f"CREATE INDEX product_hst_tnx_idx ON {q}product_hst USING btree (tnx DESC)",
        "product_hst_ts_idx": f"CREATE INDEX product_hst_ts_idx ON {q}product_hst USING btree (ts DESC)",
        "product_hst_id_idx": f"CREATE INDEX product_hst_id_idx ON {q}product_hst USING btree (id)",
        "product_hst_uuid_idx": f"CREATE UNIQUE INDEX product_hst_uuid_idx ON {q}product_hst USING btree (uuid DESC)",
        "product_hst_lub_idx": f"CREATE INDEX product_hst_lub_idx ON {q}product_hst USING btree (lastupdatedby)",
    }
    with conn.cursor() as cur, pytest.raises(psycopg2.errors.CheckViolation):
        cur.execute(
            "INSERT INTO ngsi_history.product_hst (i, action, tnx, ts, id, uuid) VALUES (1, 4, 1, now(), 'x', %s)",
            (str(uuid.uuid4()),),
        )
    conn.rollback()


@pytest.mark.integration
def test_space_tables_without_postgis_leave_geo_out(conn: Any, postgres_db_url: str) -> None:
    # A role that may create schemas but not the (untrusted) PostGIS extension.
    role, password = unique_name("nogis"), "nogis-pw"
    install(conn, SCHEMA)  # public's functions need an owner of public (PostgreSQL 15)
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(role)), (password,))
        dbname = urlsplit(postgres_db_url).path.lstrip("/")
        cur.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(dbname), sql.Identifier(role)))
    parts = urlsplit(postgres_db_url)
    url = parts._replace(netloc=f"{role}:{quote(password)}@{parts.hostname}:{parts.port}").geturl()
    other = psycopg2.connect(url)
    try:
        tables = ensure_space_tables(other, "plain", "product")
        other.commit()
        assert tables == SpaceTables("plain", "product", "product_hst", False)
        assert columns(other, "plain", "product_hst") == [c for c in TABLE_COLUMNS if c[0] != "geo"]
        # Publishing needs no PostGIS either (the functions and xyz_config are not involved).
        first, _ = chain()
        stats = publish(url, first, "product", "plain")
        assert (stats["history_inserted"], stats["head_inserted"]) == (8, 2)
    finally:
        other.close()
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            cur.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- publishing ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_publish_applies_the_head_rules(conn: Any, postgres_db_url: str) -> None:
    prepared(conn, "product")
    first, second = chain()
    stats = publish(postgres_db_url, first, "product")
    assert stats == {
        "schema": SCHEMA,
        "space": "product",
        "head": "product",
        "history": "product_hst",
        "rows": 8,
        "ids": 4,
        "history_inserted": 8,
        "head_deleted": 0,
        "head_inserted": 2,
    }
    assert dump(conn, SCHEMA, "product_hst") == [as_table_row(r) for r in sorted(first, key=lambda r: r["i"])]
    # a: its UPDATE; c: its CREATE; b deleted and d purged are not in HEAD.
    assert dump(conn, SCHEMA, "product") == [as_table_row(first[4]), as_table_row(first[1])]
    stats = publish(postgres_db_url, second, "product")
    assert (stats["history_inserted"], stats["head_deleted"], stats["head_inserted"]) == (2, 1, 1)
    assert dump(conn, SCHEMA, "product_hst") == [as_table_row(r) for r in sorted(first + second, key=lambda r: r["i"])]
    # b recreated by an UPDATE, c deleted.
    assert dump(conn, SCHEMA, "product") == [as_table_row(first[1]), as_table_row(second[0])]
    assert published_max_i(conn, SCHEMA, "product") == 10


@pytest.mark.integration
def test_publishing_twice_or_out_of_order_leaves_the_same_tables(conn: Any, postgres_db_url: str) -> None:
    prepared(conn, "in_order")
    ensure_space_tables(conn, SCHEMA, "reversed")
    conn.commit()
    first, second = chain()
    publish(postgres_db_url, first, "in_order")
    publish(postgres_db_url, second, "in_order")
    once = (dump(conn, SCHEMA, "in_order"), dump(conn, SCHEMA, "in_order_hst"))
    again = publish(postgres_db_url, second, "in_order")
    again_first = publish(postgres_db_url, first, "in_order")
    assert (again["history_inserted"], again_first["history_inserted"]) == (0, 0)
    assert (dump(conn, SCHEMA, "in_order"), dump(conn, SCHEMA, "in_order_hst")) == once
    # The later batch first, then the earlier one: HEAD still shows each feature's newest row.
    publish(postgres_db_url, second, "reversed")
    publish(postgres_db_url, first, "reversed")
    assert (dump(conn, SCHEMA, "reversed"), dump(conn, SCHEMA, "reversed_hst")) == once
    assert len(once[0]) == 2 and len(once[1]) == 10


@pytest.mark.integration
def test_empty_partition_touches_nothing(postgres_db_url: str) -> None:
    stats = list(publish_partition(iter([]), "postgresql://nobody@127.0.0.1:1/none", SCHEMA, "product"))
    assert [(s["rows"], s["history_inserted"]) for s in stats] == [(0, 0)]


@pytest.mark.integration
def test_injection_attempts_are_data(conn: Any, postgres_db_url: str) -> None:
    space = "ev\"il'; DROP SCHEMA public CASCADE; --"
    schema = 'sch"ema; DROP TABLE x'
    tables = prepared(conn, space, schema)
    assert tables.head == history_table_names(space)[0]
    evil_id = 'x\'); DELETE FROM ngsi_history.product_hst; --\n"quoted"\\,tab\t'
    doc = '{"type":"Feature","id":"x","properties":{"s":"\'); DROP TABLE t; -- \\" , \\n é \\\\"}}'
    row = hrow(1, 0, evil_id, 0, doc=doc)
    row["last_updated_by"] = '","\n'
    stats = publish(postgres_db_url, [row], space, schema)
    assert stats["history_inserted"] == 1
    assert dump(conn, schema, tables.history) == [as_table_row(row)]
    assert dump(conn, schema, tables.head) == [as_table_row(row)]
    with conn.cursor() as cur:
        cur.execute(f"SELECT jsondata->'properties'->>'s' FROM {sql.Identifier(schema, tables.head).as_string(cur)}")
        assert cur.fetchone() == ("'); DROP TABLE t; -- \" , \n é \\",)
        cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname IN ('public', %s)", (schema,))
        assert cur.fetchone() == (2,)


@pytest.mark.integration
def test_over_long_space_name_publishes(conn: Any, postgres_db_url: str) -> None:
    space = "https://uri.fiware.org/ns/data-models#" + "VeryLong" * 20
    tables = prepared(conn, space)
    publish(postgres_db_url, chain()[0], space)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE nspname = %s ORDER BY relname",
            (SCHEMA,),
        )
        names = [r[0] for r in cur.fetchall()]
    assert tables.head in names and tables.history in names and len(names) == 15  # 2 tables, 12 indexes, 1 sequence
    assert all(n.startswith(tables.head) for n in names)
    assert len(dump(conn, SCHEMA, tables.history)) == 8
    assert published_max_i(conn, SCHEMA, space) == 8


@pytest.mark.integration
def test_published_max_i_is_zero_without_rows(conn: Any) -> None:
    assert published_max_i(conn, SCHEMA, "product") == 0
    prepared(conn, "product")
    assert published_max_i(conn, SCHEMA, "product") == 0


@pytest.mark.integration
def test_publish_transactions_once_per_tnx_schema_table(conn: Any) -> None:
    install(conn, SCHEMA)
    tnx1, tnx2 = tnx_of(T0, 1), tnx_of(T0, 2)
    rows = [
        {
            "i": 1,
            "id": None,
            "tnx": tnx1,
            "schema": SCHEMA,
            "table": "product_hst",
            "ts": T0,
            "space": "product",
            "commit_msg": "run 1",
            "commit_json": {"partitions": ["2026-11-22-08:00"]},
        },
        {
            "i": 2,
            "id": None,
            "tnx": tnx2,
            "schema": SCHEMA,
            "table": "product_hst",
            "ts": T0,
            "space": "product",
            "commit_msg": None,
            "commit_json": None,
        },
    ]
    assert publish_transactions(conn, rows) == 2
    assert publish_transactions(conn, rows) == 0
    # No i: the serial's next value, past the explicit ones.
    extra = dict(rows[1], i=None, tnx=tnx_of(T0, 3), commit_msg="x'); --")
    assert publish_transactions(conn, [extra]) == 1
    conn.commit()
    with conn.cursor() as cur:
        cur.execute(
            'SELECT i, id, tnx, "schema", "table", ts, space, commit_msg, commit_json'
            " FROM xyz_config.transactions ORDER BY i"
        )
        assert cur.fetchall() == [
            (1, None, tnx1, SCHEMA, "product_hst", T0, "product", "run 1", {"partitions": ["2026-11-22-08:00"]}),
            (2, None, tnx2, SCHEMA, "product_hst", T0, "product", None, None),
            (3, None, tnx_of(T0, 3), SCHEMA, "product_hst", T0, "product", "x'); --", None),
        ]
    with pytest.raises(ValueError, match="transaction row lacks key"):
        publish_transactions(conn, [{"tnx": 1}])


@pytest.mark.integration
def test_replace_tags(conn: Any) -> None:
    install(conn, SCHEMA)
    replace_tags(conn, "product", [{"name": "v1", "tnx": 5, "ts": T0, "message": "first"}])
    replace_tags(conn, "other", [{"name": "v1", "tnx": 6, "ts": T0, "message": None}])
    replace_tags(
        conn,
        "product",
        [{"name": "v2", "tnx": 7, "ts": T0, "message": None}, {"name": "v1'--", "tnx": 8, "ts": T0, "message": "m"}],
    )
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("SELECT space, name, tnx, ts, message FROM xyz_config.tags ORDER BY space, name")
        assert cur.fetchall() == [
            ("other", "v1", 6, T0, None),
            ("product", "v1'--", 8, T0, "m"),
            ("product", "v2", 7, T0, None),
        ]
    with pytest.raises(ValueError, match="tag 'v1' given twice"):
        replace_tags(conn, "product", [{"name": "v1", "tnx": 1, "ts": T0, "message": None}] * 2)
    with pytest.raises(ValueError, match="lacks key"):
        replace_tags(conn, "product", [{"name": "v1"}])
    conn.rollback()
    replace_tags(conn, "other", [{"name": "v3", "tnx": 9, "ts": T0}])  # no message
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("SELECT space, name, tnx, message FROM xyz_config.tags WHERE space = 'other'")
        assert cur.fetchall() == [("other", "v3", 9, None)]


@pytest.mark.parametrize(("schema", "message"), [("", "non-empty"), ("a" * 64, "longer than"), ("a\x00", "NUL")])
def test_bad_schema_is_refused(schema: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        list(publish_partition(iter([]), "postgresql://x@127.0.0.1/x", schema, "product"))


@pytest.mark.integration
@pytest.mark.spark
def test_publish_from_spark_executors(conn: Any, postgres_db_url: str, spark: Any) -> None:
    from pyspark.sql import functions as F

    from ngsi_assets.transforms.history_publication import feature_rows

    prepared(conn, "product")
    first, second = chain()
    lake = [
        (
            r["i"],
            r["action"],
            r["tnx"],
            r["ts"],
            r["id"],
            r["uuid"],
            r["puuid"],
            r["last_updated_by"],
            T0,
            f'{{"v":{r["i"]}}}',
        )
        for r in first + second
    ]
    schema = (
        "i long, action int, tnx long, ts timestamp, id string, uuid string, puuid string, last_updated_by string,"
        " created_at timestamp, state string"
    )
    rows = feature_rows(spark.createDataFrame(lake, schema)).repartition(3, F.col("id"))
    url = postgres_db_url
    stats = rows.rdd.mapPartitions(lambda part: publish_partition(part, url, SCHEMA, "product")).collect()
    assert sum(s["history_inserted"] for s in stats) == 10
    assert sum(s["ids"] for s in stats) == 4
    hst = dump(conn, SCHEMA, "product_hst")
    # The same rows as published directly, with the Feature JSON of feature_rows and the same instants.
    assert [r[:8] for r in hst] == [as_table_row(r)[:8] for r in sorted(first + second, key=lambda r: r["i"])]
    assert hst[0][8] == {
        "type": "Feature",
        "id": "a",
        "properties": {
            "v": 1,
            "@ns:com:here:xyz": {
                "uuid": first[0]["uuid"],
                "action": "CREATE",
                "tnx": first[0]["tnx"],
                "createdAt": 1795334400000,
                "updatedAt": 1795334400000,
            },
        },
    }
    assert [r[4] for r in dump(conn, SCHEMA, "product")] == ["a", "b"]


@pytest.mark.integration
def test_concurrent_installs_serialise(postgres_db_url: str) -> None:
    import threading

    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run() -> None:
        c = psycopg2.connect(postgres_db_url)
        try:
            start.wait()
            install(c, SCHEMA)
            ensure_space_tables(c, SCHEMA, "product")
            c.commit()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    c = psycopg2.connect(postgres_db_url)
    try:
        assert columns(c, SCHEMA, "product_hst") == TABLE_COLUMNS
    finally:
        c.close()


@pytest.mark.integration
def test_published_last_i_reads_the_transactions_watermark(postgres_db_url: str) -> None:
    c = connect(postgres_db_url)
    try:
        assert published_last_i(c, SCHEMA, "product") == 0
        install(c, SCHEMA)
        assert published_last_i(c, SCHEMA, "product") == 0

        def tx(counter: int, space: str, last_i: int, schema: str = SCHEMA) -> dict:
            return {
                "i": None,
                "id": None,
                "tnx": tnx_of(T0, counter),
                "schema": schema,
                "table": space,
                "ts": T0,
                "space": space,
                "commit_msg": None,
                "commit_json": {"first_i": 1, "last_i": last_i},
            }

        publish_transactions(
            c, [tx(1, "product", 8), tx(2, "product", 10), tx(3, "other", 99), tx(4, "product", 50, "x")]
        )
        c.commit()
        assert published_last_i(c, SCHEMA, "product") == 10
        assert published_last_i(c, SCHEMA, "other") == 99
        with c.cursor() as cur:
            cur.execute("SHOW TimeZone")
            assert cur.fetchone() == ("UTC",)
    finally:
        c.close()
