"""Events -> Spark transforms -> writer on the executors -> the real servers: the seeds' examples,
injection attempts and name length limits, reading whole tables back."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from ngsi_assets.ngsi.sql_naming import Dialect, fixed_column
from ngsi_assets.sinks.sql_writer import HISTORIC, LAST_DATA, WriteJob, write_dataframe
from ngsi_assets.transforms.sql_sinks import sink_rows, writer_order
from tests.sinks.support import H10, Sink
from tests.transforms.test_sql_sinks import T0, ev, events, iso, rt

pytestmark = [pytest.mark.integration, pytest.mark.spark]

CAR_PATHS = ("/4wheels", "/")
MODELS = ("dm-by-entity", "dm-by-service-path", "dm-by-entity-type")
# The seed's table names (001): per (encoding, data model), for /4wheels and for the root path.
SEED_TABLES = {
    (False, "dm-by-entity"): ("4wheels_car1_car", "car1_car"),
    (False, "dm-by-service-path"): ("4wheels", None),  # the root path cannot name a table: quarantined
    (False, "dm-by-entity-type"): ("4wheels_car", "car"),
    (True, "dm-by-entity"): ("x002f4wheelsxffffcar1xffffcar", "x002fxffffcar1xffffcar"),
    (True, "dm-by-service-path"): ("x002f4wheels", "x002f"),
    (True, "dm-by-entity-type"): ("x002f4wheelsxffffcar", "x002fxffffcar"),
}


def car_events(spark: SparkSession) -> DataFrame:
    rows = []
    for i, path in enumerate(CAR_PATHS):
        msg = f"m{i}"
        ms = T0 + i
        rows += [ev(msg, "car1", "speed", "112.9", ms, path=path), ev(msg, "car1", "oil_level", "74.6", ms, path=path)]
    return events(spark, rows)


def run(spark_df: DataFrame, s: Sink, sink_kind: str, **cfg: Any) -> tuple[list[dict], list[tuple]]:
    config = s.config(**cfg)
    rows, rejects = sink_rows(spark_df, config, sink_kind)
    job = WriteJob(config=config, connect_kwargs=s.connect_kwargs(), sink=sink_kind, hours=(H10,), now_ms=None)
    s.created_dbs.extend(sorted({r["db"] for r in rows.select("db").distinct().collect()}))
    stats = write_dataframe(rows, job, writer_order(config, sink_kind), partitions=2)
    return stats, sorted(tuple(r) for r in rejects.select("messageId", "entityId", "attrName", "reason").collect())


@pytest.mark.parametrize("encoding", [False, True], ids=["old-encoding", "new-encoding"])
@pytest.mark.parametrize("mode", ["row", "column"])
def test_seed_car1_every_data_model(spark: SparkSession, sink: Sink, mode: str, encoding: bool) -> None:
    df = car_events(spark).cache()
    f = lambda c: fixed_column(c, sink.dialect)  # noqa: E731
    for model in MODELS:
        _, rejects = run(df, sink, HISTORIC, data_model=model, enable_encoding=encoding, attr_persistence=mode)
        for path, table in zip(CAR_PATHS, SEED_TABLES[(encoding, model)], strict=True):
            i = CAR_PATHS.index(path)
            ms = T0 + i
            if table is None:
                assert rejects == [
                    (
                        f"m{i}",
                        "car1",
                        a,
                        "bad name: the root service path '/' cannot name a table with dm-by-service-path",
                    )
                    for a in ("oil_level", "speed")
                ]
                continue
            if mode == "row":
                assert sink.rows("vehicles", table) == [
                    (ms, iso(ms), path, "car1", "car", "oil_level", "Float", "74.6", "[]"),
                    (ms, iso(ms), path, "car1", "car", "speed", "Float", "112.9", "[]"),
                ], (model, table)
                assert sink.columns("vehicles", table) == [f(c) for c in (
                    "recvTimeTs", "recvTime", "fiwareServicePath", "entityId", "entityType",
                    "attrName", "attrType", "attrValue", "attrMd")]  # fmt: skip
            else:
                assert sink.rows("vehicles", table) == [(rt(ms), path, "car1", "car", "74.6", "[]", "112.9", "[]")]
                assert sink.columns("vehicles", table) == [
                    f("recvTime"), f("fiwareServicePath"), f("entityId"), f("entityType"),
                    "oil_level", "oil_level_md", "speed", "speed_md",
                ]  # fmt: skip
        if table is not None or model != "dm-by-service-path":
            assert rejects == []
    df.unpersist()


def test_seed_waste_container_last_data_upsert(spark: SparkSession, sink: Sink) -> None:
    """Seed 000: service pruebapostmanx, table subpruebapostman_5dde9_wastecontainer_last_data."""
    path = "/subpruebapostman_5dde9"
    wc = dict(etype="WasteContainer", service="pruebapostmanx", path=path)
    first = events(
        spark,
        [
            ev("m1", "wc1", "fillingLevel", "0.3", T0, **wc),
            ev("m2", "wc1", "fillingLevel", "0.5", T0 + 1000, **wc),
            ev("m2", "wc1", "temperature", "21", T0 + 1000, **wc),
        ],
    )
    cfg = dict(data_model="dm-by-entity-type", last_data_mode="both", enable_lowercase=True)
    run(first, sink, LAST_DATA, **cfg)
    later = events(
        spark,
        [ev("m3", "wc1", "fillingLevel", "0.9", T0 + 2000, **wc), ev("m0", "wc1", "fillingLevel", "0.1", T0, **wc)],
    )
    run(later, sink, LAST_DATA, **cfg)
    table = "subpruebapostman_5dde9_wastecontainer_last_data"
    assert sink.tables("pruebapostmanx") == [table]
    level = "fillinglevel" if sink.dialect is Dialect.POSTGRESQL else "fillingLevel"
    f = lambda c: fixed_column(c, sink.dialect)  # noqa: E731
    assert sink.rows("pruebapostmanx", table, [f("entityId"), f("entityType"), f("fiwareServicePath"), f("recvTime"),
                                               level, "temperature", "temperature_md"]) == [
        ("wc1", "WasteContainer", path, rt(T0 + 2000), "0.9", "21", "[]")
    ]  # fmt: skip


NASTY = [
    "car'; DROP TABLE x; --",
    "car`; DROP DATABASE vehicles; #",
    'car"); DELETE FROM t; /*',
    "car\u00e9\U0001f600",
    "x0027",
]


@pytest.mark.parametrize("encoding", [False, True], ids=["old-encoding", "new-encoding"])
def test_injection_attempts_only_ever_become_encoded_names(spark: SparkSession, sink: Sink, encoding: bool) -> None:
    """Entity ids are stored verbatim (bound values); types, paths and attribute names become encoded names."""
    types = ["'", "`;", '";--', "\u00e9\U0001f600", "/*"]
    attrs = ["a'b", "a`b", 'a"b', "a;--b", "a/*b*/"]
    rows = [
        ev(f"m{i}", eid, attr, eid, T0 + i, etype=etype, path=f"/p'{i}")
        for i, (eid, etype, attr) in enumerate(zip(NASTY, types, attrs, strict=True))
    ]
    df = events(spark, rows)
    cfg = dict(enable_encoding=encoding, attr_persistence="column", data_model="dm-by-entity-type")
    _, rejects = run(df, sink, HISTORIC, **cfg)
    assert rejects == []
    from ngsi_assets.ngsi.sql_naming import attribute_column, table_name

    naming = sink.config(**cfg).naming
    assert sink.tables("vehicles") == sorted({table_name(r[3], r[4], r[5], naming) for r in rows})
    for r in rows:
        table = table_name(r[3], r[4], r[5], naming)
        got = sink.rows(
            "vehicles", table, [fixed_column("entityId", sink.dialect), attribute_column(r[6], sink.dialect)]
        )
        assert got == [(r[4], r[4])]


@pytest.mark.parametrize("model", ["dm-by-entity", "dm-by-entity-type"])
def test_names_at_the_length_limit_land_and_one_over_is_quarantined(
    spark: SparkSession, sink: Sink, model: str
) -> None:
    limit = 63 if sink.dialect is Dialect.POSTGRESQL else 64
    suffix = "_last_data"
    room = limit - len(suffix) - len("p_")  # table "p_<name>_last_data" (dm-by-entity-type: the type names it)
    at, over = "e" * room, "e" * (room + 1)

    def both(name: str) -> dict[str, str]:
        return dict(etype=name, path="/p") if model == "dm-by-entity-type" else dict(etype="", path="/p")

    if model == "dm-by-entity":
        at, over = "e" * (room - 1), "e" * room  # "p_<id>_" + "" type: one more underscore
    df = events(spark, [ev("m1", at, "level", "1", **both(at)), ev("m2", over, "level", "2", **both(over))])
    _, rejects = run(df, sink, LAST_DATA, last_data_mode="upsert", data_model=model)
    tables = sink.tables("vehicles")
    assert len(tables) == 1 and len(tables[0]) == limit
    assert [(m, reason.split(":")[0]) for m, _, _, reason in rejects] == [("m2", "bad name")]
    assert f"over the {sink.dialect.value} limit of {limit}" in rejects[0][3]


# Old encoding, service "smart-city": MySQL keeps '-' and '.' as Cygnus's NGSIMySQLSink does (it
# backtick-quotes), PostgreSQL turns them into '_' (Cygnus's unquoted SQL could not create them).
SMART_CITY = {
    Dialect.MYSQL: {
        "dm-by-entity": ("smart-city", "my.zone-1_car-1.a_Car"),
        "dm-by-fixed-entity-type": ("smart-city", "Car"),
        "dm-by-entity-type-database": ("smart-city", "my.zone-1_Car"),
    },
    Dialect.POSTGRESQL: {
        "dm-by-entity": ("smart_city", "my_zone_1_car_1_a_car"),
        "dm-by-fixed-entity-type": ("smart_city", "car"),
    },
}


def test_cygnus_names_with_dash_and_dot_land_where_cygnus_puts_them(spark: SparkSession, sink: Sink) -> None:
    rows = [
        ev("s1", "car-1.a", "speed", "50", T0, etype="Car", service="smart-city", path="/my.zone-1"),
        ev("s2", "car-2", "speed", "60", T0 + 1, etype="Car", service="smart-city", path="/other"),
    ]
    df = events(spark, rows)
    for model, (db, table) in SMART_CITY[sink.dialect].items():
        _, rejects = run(df, sink, HISTORIC, data_model=model)
        assert rejects == []
        got = sink.rows(db, table, [fixed_column(c, sink.dialect) for c in ("entityId", "attrValue")])
        if model == "dm-by-fixed-entity-type":
            assert got == [("car-1.a", "50"), ("car-2", "60")]  # one table for the type, whatever the path
        else:
            assert got == [("car-1.a", "50")]


def _pg_rows(kwargs: dict[str, Any], database: str, sql: str) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(**{**kwargs, "dbname": database})
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return sorted(cur.fetchall())
    finally:
        conn.close()


def test_postgresql_database_per_service_and_schema_per_path(spark: SparkSession, postgres_db_url: str) -> None:
    """Cygnus's dm-by-*-database(-schema) models: the writer creates the service's database, then the
    schema (service, or service path) and table in it, as NGSIPostgreSQLSink names them."""
    import uuid

    import psycopg2

    s = Sink(Dialect.POSTGRESQL, postgres_db_url, [])
    service = f"smart-city-{uuid.uuid4().hex[:8]}"
    rows = [
        ev("s1", "car-1.a", "speed", "50", T0, etype="Car", service=service, path="/my.zone-1"),
        ev("s2", "car-2", "speed", "60", T0 + 1, etype="Car", service=service, path="/other"),
        ev("s3", "car-2", "speed", "70", T0 + 2, etype="Car", service=service, path="/other"),
    ]
    df = events(spark, rows)
    try:
        stats, rejects = run(df, s, HISTORIC, data_model="dm-by-entity-type-database-schema")
        assert rejects == []
        assert sorted((st["database"], st["db"], st["table"]) for st in stats) == [
            (service, "my_zone_1", "my_zone_1_car"),
            (service, "other", "other_car"),
        ]
        kwargs = s.connect_kwargs()
        got = _pg_rows(kwargs, service, "SELECT entityid, attrvalue FROM my_zone_1.my_zone_1_car")
        assert got == [("car-1.a", "50")]
        assert _pg_rows(kwargs, service, "SELECT entityid, attrvalue FROM other.other_car") == [
            ("car-2", "60"),
            ("car-2", "70"),
        ]
        # Last data in the same database, schema per service (dm-by-entity-database), twice: no change.
        for _ in range(2):
            _, rejects = run(df, s, LAST_DATA, data_model="dm-by-entity-database", last_data_mode="upsert")
            assert rejects == []
        schema = service.replace("-", "_")
        got = _pg_rows(kwargs, service, f'SELECT entityid, speed FROM "{schema}".other_car_2_car_last_data')
        assert got == [("car-2", "70")]
        # Nothing landed in the sink URL's own database.
        assert s.tables(schema) == [] and s.tables("other") == []
    finally:
        conn = psycopg2.connect(**s.connect_kwargs())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{service}"')
        conn.close()
