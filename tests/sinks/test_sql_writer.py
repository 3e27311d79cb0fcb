"""The SQL writer against the real PostgreSQL and MariaDB servers: upserts, transactions, DDL, capping.

Rows are handed to the writer as the Spark transforms shape them (names already encoded), sorted by
table and key, as the Spark path sorts them. Every test reads whole tables back.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from ngsi_assets.ngsi.sql_naming import Dialect, attribute_column, fixed_column
from ngsi_assets.sinks.sql_writer import HISTORIC, LAST_DATA, SqlBatchError
from tests.sinks.support import H10, Sink

pytestmark = pytest.mark.integration

T0 = H10[0] + 15 * 60_000  # 10:15


def rt(ms: int) -> str:
    """recvTime of column/last-data tables."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def col(s: Sink, name: str) -> str:
    return attribute_column(name, s.dialect)


def fx(s: Sink, name: str) -> str:
    return fixed_column(name, s.dialect)


def rec(
    s: Sink,
    eid: str,
    ms: int,
    attrs: dict[str, Any],
    *,
    table: str = "wc_last_data",
    db: str = "waste",
    etype: str = "WasteContainer",
    path: str = "/sub",
    op: str = "u",
) -> dict[str, Any]:
    return {
        "db": db,
        "table": table,
        "recvTime": rt(ms),
        "fiwareServicePath": path,
        "entityId": eid,
        "entityType": etype,
        "attrs": {col(s, k): (None if v is None else str(v), "[]") for k, v in attrs.items()},
        "op": op,
    }


def last(s: Sink, recs: list[dict[str, Any]], **cfg: Any) -> list[dict]:
    config = s.config(last_data_mode="upsert", **cfg)
    keys = config.last_data_unique_key
    return s.write(sorted(recs, key=lambda r: (r["db"], r["table"], *[r[k] for k in keys])), config, LAST_DATA)


def ld_rows(s: Sink, *attrs: str, table: str = "wc_last_data") -> list[tuple]:
    cols = [fx(s, "entityId"), fx(s, "entityType"), fx(s, "recvTime")]
    for a in attrs:
        cols += [col(s, a), col(s, a) + "_md"]
    return s.rows("waste", table, cols)


def test_last_data_insert_then_newer_update_then_older_ignored(sink: Sink) -> None:
    last(sink, [rec(sink, "wc1", T0, {"fillingLevel": 0.5}), rec(sink, "wc2", T0, {"fillingLevel": 0.1})])
    last(sink, [rec(sink, "wc1", T0 + 1000, {"fillingLevel": 0.7})])
    # An older record arriving later (out of order) never overwrites a newer one.
    last(sink, [rec(sink, "wc1", T0 + 500, {"fillingLevel": 0.6}), rec(sink, "wc2", T0 - 1, {"fillingLevel": 0.9})])
    assert ld_rows(sink, "fillingLevel") == [
        ("wc1", "WasteContainer", rt(T0 + 1000), "0.7", "[]"),
        ("wc2", "WasteContainer", rt(T0), "0.1", "[]"),
    ]
    # The unique index was created with the table: the same key cannot be inserted twice.
    conn = sink.connect()
    try:
        with conn.cursor() as cur, pytest.raises(Exception, match="(?i)duplicate"):
            cur.execute(
                f"INSERT INTO {sink.q('waste')}.{sink.q('wc_last_data')} ({sink.q(fx(sink, 'entityId'))}, "
                f"{sink.q(fx(sink, 'entityType'))}) VALUES ('wc1', 'x')"
            )
    finally:
        conn.close()


def test_rerunning_a_batch_changes_nothing(sink: Sink) -> None:
    batch = [rec(sink, "wc1", T0, {"fillingLevel": 0.5, "temperature": 20})]
    last(sink, batch)
    first = ld_rows(sink, "fillingLevel", "temperature")
    last(sink, batch)
    assert (
        ld_rows(sink, "fillingLevel", "temperature")
        == first
        == [("wc1", "WasteContainer", rt(T0), "0.5", "[]", "20", "[]")]
    )


def test_a_column_the_newest_record_lacks_keeps_its_stored_value(sink: Sink) -> None:
    last(sink, [rec(sink, "wc1", T0, {"fillingLevel": 0.5, "temperature": 20})])
    last(sink, [rec(sink, "wc1", T0 + 1000, {"fillingLevel": 0.8})])
    # A JSON null is a value: it overwrites (metadata present), unlike an absent attribute.
    last(sink, [rec(sink, "wc2", T0, {"fillingLevel": 0.1, "temperature": 5})])
    last(sink, [rec(sink, "wc2", T0 + 1, {"fillingLevel": None, "temperature": 6})])
    assert ld_rows(sink, "fillingLevel", "temperature") == [
        ("wc1", "WasteContainer", rt(T0 + 1000), "0.8", "[]", "20", "[]"),
        ("wc2", "WasteContainer", rt(T0 + 1), None, "[]", "6", "[]"),
    ]


def test_several_unique_key_columns(sink: Sink) -> None:
    keys = ["entityId", "entityType"]
    last(
        sink,
        [
            rec(sink, "e1", T0, {"level": 1}, etype="A"),
            rec(sink, "e1", T0, {"level": 2}, etype="B"),
        ],
        last_data_unique_key=keys,
    )
    last(sink, [rec(sink, "e1", T0 + 5, {"level": 3}, etype="B")], last_data_unique_key=keys)
    assert ld_rows(sink, "level") == [
        ("e1", "A", rt(T0), "1", "[]"),
        ("e1", "B", rt(T0 + 5), "3", "[]"),
    ]


def test_entity_delete_removes_the_row_unless_the_stored_one_is_newer(sink: Sink) -> None:
    last(sink, [rec(sink, "wc1", T0, {"fillingLevel": 0.5}), rec(sink, "wc2", T0 + 10, {"fillingLevel": 0.2})])
    stats = last(
        sink,
        [
            rec(sink, "wc1", T0 + 1, {"fillingLevel": 0.5}, op="d"),
            rec(sink, "wc2", T0 + 5, {"fillingLevel": 0.2}, op="d"),  # older than what is stored
        ],
    )
    assert ld_rows(sink, "fillingLevel") == [("wc2", "WasteContainer", rt(T0 + 10), "0.2", "[]")]
    assert [s["rows"] for s in stats] == [2]


def test_values_are_bound_never_spliced(sink: Sink) -> None:
    nasty = "x'); DROP TABLE wc_last_data; -- `\" \\ \u00e9\U0001f600"
    last(sink, [rec(sink, nasty, T0, {"fillingLevel": nasty}, path="/'; --")])
    assert ld_rows(sink, "fillingLevel") == [(nasty, "WasteContainer", rt(T0), nasty, "[]")]


def test_last_data_batch_failing_midway_leaves_the_table_unchanged(sink: Sink) -> None:
    last(sink, [rec(sink, "a", T0, {"level": 1}), rec(sink, "z", T0, {"level": 1})])
    before = ld_rows(sink, "level")
    # MySQL refuses a key over its VARCHAR(256), PostgreSQL a NUL character: the last row fails.
    bad = "z" * 300 if sink.dialect is Dialect.MYSQL else "zz\u0000"
    with pytest.raises(SqlBatchError, match="after 2 attempt"):
        last(
            sink,
            [
                rec(sink, "a", T0 + 1, {"level": 2}),
                rec(sink, "b", T0 + 1, {"level": 2}),
                rec(sink, bad, T0, {"level": 2}),
            ],
            batch_size=1,
        )
    assert ld_rows(sink, "level") == before


def hist(s: Sink, eid: str, ms: int, attr: str, value: Any, *, table: str = "t", db: str = "vehicles") -> dict:
    return {
        "db": db,
        "table": table,
        "recvTimeTs": ms,
        "recvTime": iso(ms),
        "fiwareServicePath": "/4wheels",
        "entityId": eid,
        "entityType": "car",
        "attrName": attr,
        "attrType": "Float",
        "attrValue": None if value is None else str(value),
        "attrMd": "[]",
    }


ROW_COLS = ["recvTimeTs", "entityId", "attrName", "attrValue"]


def hist_rows(s: Sink, table: str = "t") -> list[tuple]:
    return s.rows("vehicles", table, [fx(s, c) for c in ROW_COLS])


def test_historic_row_mode_rerun_replaces_the_hour_only(sink: Sink) -> None:
    cfg = sink.config()
    h11 = (H10[1], H10[1] + 3_600_000)
    sink.write([hist(sink, "car1", H10[1] + 5, "speed", 1)], cfg, HISTORIC, hours=(h11,))
    batch = [hist(sink, "car1", T0, "oil_level", 74.6), hist(sink, "car1", T0, "speed", 112.9)]
    sink.write(batch, cfg, HISTORIC)
    sink.write(batch, cfg, HISTORIC)
    assert hist_rows(sink) == [
        (T0, "car1", "oil_level", "74.6"),
        (T0, "car1", "speed", "112.9"),
        (H10[1] + 5, "car1", "speed", "1"),
    ]
    assert sink.columns("vehicles", "t") == [fx(sink, c) for c in (
        "recvTimeTs", "recvTime", "fiwareServicePath", "entityId", "entityType",
        "attrName", "attrType", "attrValue", "attrMd",
    )]  # fmt: skip


def test_historic_batch_failing_midway_leaves_the_table_unchanged(sink: Sink) -> None:
    cfg = sink.config(batch_size=1)
    sink.write([hist(sink, "car1", T0, "speed", 1)], cfg, HISTORIC)
    before = hist_rows(sink)
    # PostgreSQL text refuses NUL; MariaDB (strict mode) refuses a BIGINT that is not a number.
    bad = hist(sink, "car1", T0 + 2, "speed", "x\u0000" if sink.dialect is Dialect.POSTGRESQL else 3)
    if sink.dialect is Dialect.MYSQL:
        bad["recvTimeTs"] = "not a number"
    with pytest.raises(SqlBatchError):
        sink.write([hist(sink, "car1", T0 + 1, "speed", 2), bad], cfg, HISTORIC)
    assert hist_rows(sink) == before


def test_capping_keeps_exactly_the_newest_rows(sink: Sink) -> None:
    cfg = sink.config(persistence_policy={"max_records": 3})
    rows = [hist(sink, "car1", T0 + i, "speed", i) for i in range(6)]
    sink.write(rows, cfg, HISTORIC)
    assert hist_rows(sink) == [(T0 + i, "car1", "speed", str(i)) for i in (3, 4, 5)]
    sink.write(rows, cfg, HISTORIC)  # rerun: the same rows remain
    assert hist_rows(sink) == [(T0 + i, "car1", "speed", str(i)) for i in (3, 4, 5)]


def test_expiration_drops_exactly_the_rows_older_than_the_expiration_time(sink: Sink) -> None:
    cfg = sink.config(**{"persistence_policy.expiration_time": 60})
    rows = [hist(sink, "car1", T0 + i * 30_000, "speed", i) for i in range(5)]  # 0, 30, 60, 90, 120 s
    sink.write(rows, cfg, HISTORIC, now_ms=T0 + 150_000)  # cut-off T0 + 90 s: rows at 90 and 120 s stay
    assert hist_rows(sink) == [(T0 + i * 30_000, "car1", "speed", str(i)) for i in (3, 4)]


def colrec(s: Sink, eid: str, ms: int, attrs: dict[str, Any]) -> dict:
    r = rec(s, eid, ms, attrs, table="car1_car", db="vehicles", etype="car", path="/4wheels")
    r.pop("op")
    return r


def test_column_mode_with_varying_attribute_sets_adds_columns(sink: Sink) -> None:
    cfg = sink.config(attr_persistence="column")
    sink.write([colrec(sink, "car1", T0, {"speed": 112.9, "oil_level": 74.6})], cfg, HISTORIC)
    sink.write(
        [colrec(sink, "car1", T0 + 60_000, {"speed": 100}), colrec(sink, "car1", T0 + 61_000, {"gear": 3})],
        cfg,
        HISTORIC,
        hours=((T0 + 60_000, T0 + 60_001),),
    )
    speed, oil, gear = col(sink, "speed"), col(sink, "oil_level"), col(sink, "gear")
    assert sink.columns("vehicles", "car1_car") == [
        fx(sink, "recvTime"), fx(sink, "fiwareServicePath"), fx(sink, "entityId"), fx(sink, "entityType"),
        oil, oil + "_md", speed, speed + "_md", gear, gear + "_md",
    ]  # fmt: skip
    # Same hour prefix: the second write replaced the hour, so only its rows remain.
    assert sink.rows("vehicles", "car1_car", [fx(sink, "recvTime"), speed, oil, gear]) == [
        (rt(T0 + 60_000), "100", None, None),
        (rt(T0 + 61_000), None, None, "3"),
    ]


def test_two_concurrent_writers_on_one_last_data_table_finish_without_deadlock(sink: Sink) -> None:
    keys = [f"k{i:04d}" for i in range(400)]
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for round_ in range(3):
                ms = T0 + round_ * 10 + offset
                last(sink, [rec(sink, k, ms, {"level": f"{offset}-{round_}"}) for k in keys], batch_size=50)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(off,)) for off in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Newest wins: writer 2's last round (T0 + 22) for every key.
    assert ld_rows(sink, "level") == [(k, "WasteContainer", rt(T0 + 22), "2-2", "[]") for k in keys]


def test_names_exactly_at_the_server_limits_are_accepted(sink: Sink) -> None:
    limit = 63 if sink.dialect is Dialect.POSTGRESQL else 64
    db, table, attr = "d" * limit, "t" * limit, "a" * (limit - 3)  # the attribute's _md column: limit
    rows = [rec(sink, "e1", T0, {attr: 1}, db=db, table=table)]
    last(sink, rows)
    assert sink.tables(db) == [table]
    assert sink.rows(db, table, [fx(sink, "entityId"), attr, attr + "_md"]) == [("e1", "1", "[]")]


def test_column_mode_capping_and_expiration(sink: Sink) -> None:
    cfg = sink.config(attr_persistence="column", persistence_policy={"max_records": 2, "expiration_time": 100})
    rows = [colrec(sink, "car1", T0 + i * 30_000, {"speed": i}) for i in range(5)]  # 0, 30, ... 120 s
    # Expiration first drops rows before T0 + 150 - 100 = 50 s (0 and 30 s), then capping keeps the newest 2.
    sink.write(rows, cfg, HISTORIC, now_ms=T0 + 150_000)
    speed = col(sink, "speed")
    assert sink.rows("vehicles", "car1_car", [fx(sink, "recvTime"), speed]) == [
        (rt(T0 + 90_000), "3"),
        (rt(T0 + 120_000), "4"),
    ]


def test_a_failed_batch_is_retried_and_lands_once_the_cause_is_gone(sink: Sink) -> None:
    from ngsi_assets.sinks.sql_writer import write_rows

    cfg = sink.config(batch_ttl=3, batch_retry_intervals=[7, 11])
    sink.write([hist(sink, "car1", T0, "speed", 1)], cfg, HISTORIC)  # creates vehicles.t
    conn = sink.connect()
    table = f"{sink.q('vehicles')}.{sink.q('t')}"
    try:
        with conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {sink.q('extra')} INT NOT NULL DEFAULT 0")
            cur.execute(f"ALTER TABLE {table} ALTER COLUMN {sink.q('extra')} DROP DEFAULT")
        conn.commit()
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 2:  # the second retry finds the obstacle gone
                with conn.cursor() as cur:
                    cur.execute(f"ALTER TABLE {table} DROP COLUMN {sink.q('extra')}")
                conn.commit()

        write_rows([hist(sink, "car1", T0 + 1, "speed", 2)], sink.job(cfg, HISTORIC), sleep=sleep)
    finally:
        conn.close()
    assert waits == [0.007, 0.011]
    assert hist_rows(sink) == [(T0 + 1, "car1", "speed", "2")]
