"""STH transforms on small frames: samples, partials and whole documents compared with expected values."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.sinks.sth_mongo import to_document
from ngsi_assets.transforms import sth
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from resources.spark import sql_config
from tests.support.spark import physical_plan, session_settings

INF = float("inf")


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ev(
    entity: str,
    attr: str,
    value: str | None,
    recv_ms: int,
    *,
    md: list[dict[str, Any]] | None = None,
    mid: str = "m1",
    idx: int = 0,
    attr_type: str = "Number",
    service: str = "vehicles",
    path: str = "/4wheels",
    etype: str | None = "car",
    dt: str | None = None,
    alteration: str | None = None,
) -> tuple:
    recv = datetime.fromtimestamp(recv_ms / 1000, UTC)
    return (
        recv_ms, recv.strftime("%Y-%m-%dT%H:%M:%S.000Z"), service, path, entity, etype, attr, attr_type, value,
        json.dumps(md or []), None, recv.replace(tzinfo=None), "recvTime", alteration, mid, idx,
        dt or recv.strftime("%Y-%m-%d-%H"),
    )  # fmt: skip


def events(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, NGSI_EVENTS)


def documents(spark: SparkSession, rows: list[tuple], cfg: STHConfig, now_ms: int = 0) -> list[dict[str, Any]]:
    """Rows of build_documents (as dicts with the STH-Comet document under 'doc')."""
    classified = sth.classify_events(events(spark, rows), cfg)
    docs = sth.build_documents(sth.sth_partials(classified, cfg.resolutions), cfg, now_ms)
    out = []
    for r in docs.collect():
        row = r.asDict(recursive=True)
        row["doc"] = to_document(row, cfg.data_model)
        out.append(row)
    return out


def empty_numeric(offset: int) -> dict[str, Any]:
    return {"offset": offset, "samples": 0, "sum": 0.0, "sum2": 0.0, "min": INF, "max": -INF}


def numeric_points(lo: int, hi: int, filled: dict[int, tuple[int, float, float, float, float]]) -> list[dict]:
    points = []
    for o in range(lo, hi + 1):
        if o in filled:
            n, s, s2, mn, mx = filled[o]
            points.append({"offset": o, "samples": n, "sum": s, "sum2": s2, "min": mn, "max": mx})
        else:
            points.append(empty_numeric(o))
    return points


def text_points(lo: int, hi: int, filled: dict[int, dict[str, int]]) -> list[dict]:
    return [
        {"offset": o, "samples": sum(filled.get(o, {}).values()), "occur": filled.get(o, {})} for o in range(lo, hi + 1)
    ]


def by_key(rows: list[dict[str, Any]], attr: str, resolution: str) -> dict[str, Any]:
    found = [r for r in rows if r["doc"]["_id"].get("attrName") == attr and r["resolution"] == resolution]
    assert len(found) == 1, (attr, resolution, found)
    return found[0]


# --------------------------------------------------------------------------------------------------
# The seed's example


SEED_RECV = ms(2015, 4, 20, 12, 13, 22)


@pytest.fixture(scope="module")
def seed_docs(spark: SparkSession) -> list[dict[str, Any]]:
    rows = [
        ev("car1", "speed", "112.9", SEED_RECV, attr_type="float"),
        ev("car1", "oil_level", "74.6", SEED_RECV, attr_type="float", idx=0),
    ]
    return documents(spark, rows, STHConfig(data_model="dm-by-entity"))


SEED_EXPECTED = [
    # resolution, range, origin, slots, offset
    ("month", "year", utc(2015, 1, 1), (0, 11), 3),
    ("day", "month", utc(2015, 4, 1), (1, 31), 20),
    ("hour", "day", utc(2015, 4, 20), (0, 23), 12),
    ("minute", "hour", utc(2015, 4, 20, 12), (0, 59), 13),
    ("second", "minute", utc(2015, 4, 20, 12, 13), (0, 59), 22),
]


@pytest.mark.parametrize(("resolution", "rng", "origin", "slots", "offset"), SEED_EXPECTED)
@pytest.mark.parametrize(("attr", "value"), [("speed", 112.9), ("oil_level", 74.6)])
def test_seed_example(
    seed_docs: list[dict[str, Any]],
    attr: str,
    value: float,
    resolution: str,
    rng: str,
    origin: datetime,
    slots: tuple[int, int],
    offset: int,
) -> None:
    row = by_key(seed_docs, attr, resolution)
    assert row["database"] == "sth_vehicles"
    assert row["collection"] == "sth_/4wheels_car1_car.aggr"
    assert row["action"] == "upsert"
    assert row["doc"] == {
        "_id": {"attrName": attr, "origin": origin, "resolution": resolution, "range": rng},
        "attrType": "float",
        "points": numeric_points(*slots, {offset: (1, value, value * value, value, value)}),
    }
    assert list(row["doc"]) == ["_id", "attrType", "points"]
    assert list(row["doc"]["_id"]) == ["attrName", "origin", "resolution", "range"]


def test_seed_sum2_values(seed_docs: list[dict[str, Any]]) -> None:
    speed = by_key(seed_docs, "speed", "hour")["doc"]["points"][12]
    oil = by_key(seed_docs, "oil_level", "hour")["doc"]["points"][12]
    assert speed["sum2"] == pytest.approx(12746.41, abs=1e-9)
    assert oil["sum2"] == pytest.approx(5565.16, abs=1e-9)
    assert len(seed_docs) == 10


# --------------------------------------------------------------------------------------------------
# One frame with the awkward cases (dm-by-service-path: entity and attribute are in _id)

T0 = ms(2026, 3, 1, 10, 15, 30)
CASES = [
    # TimeInstant metadata overrides recvTime for its own attribute only
    ev("car1", "speed", "50", T0, md=[{"name": "TimeInstant", "type": "DateTime", "value": "2026-03-01T08:01:02Z"}]),
    ev("car1", "rpm", "3000", T0, md=[{"name": "other", "type": "Text", "value": "2026-03-01T08:01:02Z"}]),
    # epoch-millisecond TimeInstant; an unparsable one falls back to recvTime
    ev("car2", "speed", "1", T0, md=[{"name": "TimeInstant", "type": "Number", "value": str(ms(2026, 2, 28, 23))}]),
    ev("car3", "speed", "1", T0, md=[{"name": "TimeInstant", "type": "DateTime", "value": "yesterday"}]),
    # negative and zero values: max must be 0, min -5
    ev("neg", "temp", "-5", T0, mid="n1"),
    ev("neg", "temp", "0", T0, mid="n2"),
    ev("neg", "temp", "-2.5", T0, mid="n3"),
    ev("neg", "temp", "-0", T0, mid="n4"),
    # a non-numeric string in a numeric attribute
    ev("mix", "level", "10", T0, mid="x1"),
    ev("mix", "level", "n/a", T0, mid="x2"),
    ev("mix", "level", "20", T0, mid="x3"),
    # string values with '.' and '$', white space, empty, null
    ev("txt", "status", "v1.2$", T0, mid="t1", attr_type="Text"),
    ev("txt", "status", "v1.2$", T0, mid="t2", attr_type="Text"),
    ev("txt", "status", "ok", T0, mid="t3", attr_type="Text"),
    ev("txt", "status", "   ", T0, mid="t4", attr_type="Text"),
    ev("txt", "status", "\t\n", T0, mid="t5", attr_type="Text"),
    ev("txt", "status", "", T0, mid="t6", attr_type="Text"),
    ev("txt", "status", None, T0, mid="t7", attr_type="Text"),
    # rejects: a NUL in a string value, a name over the namespace limit
    ev("bad", "status", "a\x00b", T0, mid="r1", attr_type="Text"),
    ev("e" * 120, "speed", "1", T0, mid="r2"),
    # the newest sample's attrType wins
    ev("typ", "v", "1", T0, mid="y1", attr_type="Integer"),
    ev("typ", "v", "2", T0 + 1000, mid="y2", attr_type="Float"),
]
CASES_CFG = STHConfig(data_model="dm-by-service-path", resolutions="hour,minute")


@pytest.fixture(scope="module")
def case_docs(spark: SparkSession) -> list[dict[str, Any]]:
    return documents(spark, CASES, CASES_CFG)


def doc_of(rows: list[dict[str, Any]], entity: str, attr: str, resolution: str) -> dict[str, Any]:
    found = [
        r
        for r in rows
        if r["doc"]["_id"]["entityId"] == entity
        and r["doc"]["_id"]["attrName"] == attr
        and r["resolution"] == resolution
    ]
    assert len(found) == 1, found
    return found[0]


def filled(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["offset"]: p for p in doc["points"] if p["samples"]}


def test_time_instant_overrides_recv_time_for_its_attribute(case_docs: list[dict[str, Any]]) -> None:
    speed = doc_of(case_docs, "car1", "speed", "minute")["doc"]
    assert speed["_id"] == {
        "entityId": "car1", "entityType": "car", "attrName": "speed", "origin": utc(2026, 3, 1, 8),
        "resolution": "minute", "range": "hour",
    }  # fmt: skip
    assert filled(speed) == {1: {"offset": 1, "samples": 1, "sum": 50.0, "sum2": 2500.0, "min": 50.0, "max": 50.0}}
    rpm = doc_of(case_docs, "car1", "rpm", "minute")["doc"]
    assert rpm["_id"]["origin"] == utc(2026, 3, 1, 10)
    assert list(filled(rpm)) == [15]


def test_time_instant_epoch_ms_and_unparsable(case_docs: list[dict[str, Any]]) -> None:
    car2 = doc_of(case_docs, "car2", "speed", "hour")["doc"]
    assert (car2["_id"]["origin"], list(filled(car2))) == (utc(2026, 2, 28), [23])
    car3 = doc_of(case_docs, "car3", "speed", "hour")["doc"]
    assert (car3["_id"]["origin"], list(filled(car3))) == (utc(2026, 3, 1), [10])


def test_negative_and_zero_values(case_docs: list[dict[str, Any]]) -> None:
    doc = doc_of(case_docs, "neg", "temp", "hour")["doc"]
    assert filled(doc) == {
        10: {"offset": 10, "samples": 4, "sum": -7.5, "sum2": 31.25, "min": -5.0, "max": 0.0},
    }
    # -0 counts as 0: the max is +0.0 whatever order the zeros came in
    assert str(filled(doc)[10]["max"]) == "0.0"


def test_numbers_and_text_in_one_document(case_docs: list[dict[str, Any]]) -> None:
    """A numeric attribute that sometimes says "n/a": one document with both kinds, samples counting both."""
    row = doc_of(case_docs, "mix", "level", "hour")
    assert (row["numeric"], row["text"], row["totalSamples"], row["textSamples"]) == (True, True, 3, 1)
    assert filled(row["doc"]) == {
        10: {"offset": 10, "samples": 3, "sum": 30.0, "sum2": 500.0, "min": 10.0, "max": 20.0, "occur": {"n/a": 1}}
    }
    # Every point of a mixed document has both kinds of fields, empty ones included (as STH-Comet reads them).
    empty = row["doc"]["points"][0]
    assert empty == {"offset": 0, "samples": 0, "sum": 0.0, "sum2": 0.0, "min": INF, "max": -INF, "occur": {}}


def test_mixed_document_is_the_same_whichever_kind_comes_first(spark: SparkSession) -> None:
    text_first = [
        ev("m", "level", "n/a", T0, mid="a1"),
        ev("m", "level", "7", T0 + 61_000, mid="a2"),
        ev("m", "level", "error", T0 + 3_600_000, mid="a3"),
    ]
    number_first = [
        ev("m", "level", "7", T0 + 61_000, mid="a2"),
        ev("m", "level", "n/a", T0, mid="a1"),
        ev("m", "level", "error", T0 + 3_600_000, mid="a3"),
    ]
    cfg = STHConfig(data_model="dm-by-entity", resolutions="minute,hour")
    a = sorted((r["resolution"], r["origin"], repr(r["doc"])) for r in documents(spark, text_first, cfg))
    b = sorted((r["resolution"], r["origin"], repr(r["doc"])) for r in documents(spark, number_first, cfg))
    assert a == b
    hour_doc = next(r for r in documents(spark, text_first, cfg) if r["resolution"] == "hour")["doc"]
    assert filled(hour_doc) == {
        10: {"offset": 10, "samples": 2, "sum": 7.0, "sum2": 49.0, "min": 7.0, "max": 7.0, "occur": {"n/a": 1}},
        11: {"offset": 11, "samples": 1, "sum": 0.0, "sum2": 0.0, "min": INF, "max": -INF, "occur": {"error": 1}},
    }


def test_entity_delete_adds_no_sample(spark: SparkSession) -> None:
    rows = [
        ev("d", "level", "5", T0, mid="u1", alteration="entityUpdate"),
        # Orion's entityDelete notification repeats the entity's last values: not a measurement.
        ev("d", "level", "5", T0 + 1000, mid="x1", alteration="entityDelete"),
        ev("d", "state", "on", T0 + 1000, mid="x1", alteration="entityDelete", attr_type="Text"),
    ]
    cfg = STHConfig(data_model="dm-by-entity", resolutions="hour")
    classified = {(r["messageId"], r["attrName"]): (r["status"], r["reason"]) for r in sth.classify_events(
        events(spark, rows), cfg).collect()}  # fmt: skip
    assert classified == {
        ("u1", "level"): ("sample", None),
        ("x1", "level"): ("skipped", sth.REASON_DELETE),
        ("x1", "state"): ("skipped", sth.REASON_DELETE),
    }
    (doc,) = documents(spark, rows, cfg)
    assert doc["totalSamples"] == 1 and filled(doc["doc"])[10]["samples"] == 1


def test_unaccounted_samples_finds_a_point_whose_counts_disagree(
    spark: SparkSession, case_docs: list[dict[str, Any]]
) -> None:
    classified = sth.classify_events(events(spark, CASES), CASES_CFG)
    docs = sth.build_documents(sth.sth_partials(classified, CASES_CFG.resolutions), CASES_CFG, 0)
    assert sth.unaccounted_samples(docs).count() == 0
    # One point claims a sample it aggregates nowhere: the check must see exactly that point.
    broken = docs.withColumn(
        "points",
        F.transform(
            "points",
            lambda p: F.when(
                (F.col("collection") == "sth_/4wheels.aggr") & (F.col("idEntityId") == "neg")
                & (F.col("resolution") == "hour") & (p["offset"] == 10),
                p.withField("samples", p["samples"] + 1),
            ).otherwise(p),
        ),
    )  # fmt: skip
    found = [(r["idEntityId"], r["offset"], r["samples"], r["numSamples"], r["occurrences"])
             for r in sth.unaccounted_samples(broken).collect()]  # fmt: skip
    assert found == [("neg", 10, 5, 4, 0)]
    # The same count from each document's row (the asset's check counts this way, without the explode).
    total = F.sum(sth.unaccounted_points())
    assert docs.agg(total).first()[0] == 0
    assert broken.agg(total).first()[0] == 1
    # A delete publishes no point: none of its points counts, as none is listed.
    deleted = broken.withColumn("action", F.lit(sth.ACTION_DELETE))
    assert sth.unaccounted_samples(deleted).count() == 0
    assert deleted.agg(total).first()[0] == 0


def test_string_values_escaped_and_white_space_ignored(case_docs: list[dict[str, Any]]) -> None:
    row = doc_of(case_docs, "txt", "status", "hour")
    assert row["numeric"] is False
    assert row["doc"]["points"] == text_points(0, 23, {10: {"ok": 1, "v1\uff0e2\uff04": 2}})
    assert row["doc"]["attrType"] == "Text"


def test_rejects(spark: SparkSession) -> None:
    classified = sth.classify_events(events(spark, CASES), CASES_CFG)
    rejects = sorted((r["messageId"], r["reason"]) for r in sth.sth_rejects(classified).collect())
    long_ns = "sth_vehicles.sth_/4wheels.aggr"
    assert len(long_ns) < 113  # dm-by-service-path: the long entity id is only in _id, hence no reject
    assert rejects == [("r1", sth.REASON_NUL_VALUE)]
    # 161 bytes: within the limit of current servers (255), over the old one when it is forced.
    collection = "sth_/4wheels_" + "e" * 120 + "_car_speed.aggr"
    for limit in (None, 113):
        by_attr = STHConfig(data_model="dm-by-attribute", resolutions="hour", max_namespace_bytes=limit)
        classified = sth.classify_events(events(spark, CASES), by_attr)
        rows = sorted((r["messageId"], r["entityId"][:3], r["reason"]) for r in sth.sth_rejects(classified).collect())
        reason = (
            f"namespace 'sth_vehicles.{collection}' is {13 + len(collection)} bytes in UTF-8; the limit is 113 "
            "(max_namespace_bytes, else the server's: 255 from MongoDB 4.4, 113 before)"
        )
        long_reject = ("r2", "eee", reason)
        assert rows == [("r1", "bad", sth.REASON_NUL_VALUE), *([long_reject] if limit else [])]
    statuses = {r["messageId"]: (r["status"], r["reason"]) for r in classified.collect() if r["entityId"] == "txt"}
    assert statuses == {
        "t1": ("sample", None), "t2": ("sample", None), "t3": ("sample", None),
        "t4": ("skipped", sth.REASON_WHITE_SPACE), "t5": ("skipped", sth.REASON_WHITE_SPACE),
        "t6": ("skipped", sth.REASON_WHITE_SPACE), "t7": ("skipped", sth.REASON_NULL),
    }  # fmt: skip


def test_white_spaces_counted_when_not_ignored(spark: SparkSession) -> None:
    rows = [r for r in CASES if r[4] == "txt"]
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="hour", ignore_white_spaces=False)
    (row,) = documents(spark, rows, cfg)
    assert filled(row["doc"])[10]["occur"] == {"": 1, "\t\n": 1, "   ": 1, "ok": 1, "v1\uff0e2\uff04": 2}


def test_newest_sample_gives_attr_type(case_docs: list[dict[str, Any]]) -> None:
    assert doc_of(case_docs, "typ", "v", "hour")["doc"]["attrType"] == "Float"


NUMERIC_RULE = [
    ("12", 12.0, None),
    ("-3.25", -3.25, None),
    ("1e3", 1000.0, None),
    ("2.5E-2", 0.025, None),
    ("007", 7.0, None),
    ("-0", 0.0, None),
    ("1e400", None, "1e400"),
    ("NaN", None, "NaN"),
    ("Infinity", None, "Infinity"),
    (" 12", None, " 12"),
    ("+5", None, "+5"),
    (".5", None, "\uff0e5"),
    ("5.", None, "5\uff0e"),
    ("0x1F", None, "0x1F"),
    ("1,5", None, "1,5"),
    ("true", None, "true"),
    ('{"a": 1.5}', None, '{"a": 1\uff0e5}'),
]


def test_numeric_rule(spark: SparkSession) -> None:
    rows = [ev("e", "a", value, T0, mid=f"n{i:02d}") for i, (value, _, _) in enumerate(NUMERIC_RULE)]
    got = sorted((r["messageId"], r["status"], r["numValue"], r["occurKey"]) for r in sth.classify_events(
        events(spark, rows), STHConfig()).collect())  # fmt: skip
    assert got == [(f"n{i:02d}", "sample", num, key) for i, (_, num, key) in enumerate(NUMERIC_RULE)]


def test_calendar_edges(spark: SparkSession) -> None:
    rows = [
        ev("cal", "v", "1", ms(2024, 12, 31, 23, 59, 59), mid="c1"),  # last slot of each range
        ev("cal", "v", "2", ms(1969, 12, 31, 23, 59, 58), mid="c2"),  # before the epoch
    ]
    docs = documents(spark, rows, STHConfig(data_model="dm-by-service-path"))
    got = sorted((r["doc"]["_id"]["origin"], r["resolution"], list(filled(r["doc"]))) for r in docs)
    assert got == sorted(
        [
            (utc(2024, 1, 1), "month", [11]),
            (utc(2024, 12, 1), "day", [31]),
            (utc(2024, 12, 31), "hour", [23]),
            (utc(2024, 12, 31, 23), "minute", [59]),
            (utc(2024, 12, 31, 23, 59), "second", [59]),
            (utc(1969, 1, 1), "month", [11]),
            (utc(1969, 12, 1), "day", [31]),
            (utc(1969, 12, 31), "hour", [23]),
            (utc(1969, 12, 31, 23), "minute", [59]),
            (utc(1969, 12, 31, 23, 59), "second", [58]),
        ]
    )


# --------------------------------------------------------------------------------------------------
# Determinism, partitions, tombstones, expiration


def _values_rows(values: list[str], dt_of: Any = None) -> list[tuple]:
    return [ev("d", "x", v, T0 + i, mid=f"v{i}", dt=dt_of(i) if dt_of else None) for i, v in enumerate(values)]


def test_sums_do_not_depend_on_row_order(spark: SparkSession) -> None:
    values = ["0.1", "0.2", "0.3", "1e16", "-1e16", "0.7", "3.3"]
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="hour")
    first = documents(spark, _values_rows(values), cfg)[0]["doc"]
    second = documents(spark, list(reversed(_values_rows(values))), cfg)[0]["doc"]
    assert first == second
    # the order is the sorted one: (((((( -1e16 + 0.1) + 0.2) + 0.3) + 0.7) + 3.3) + 1e16)
    expected = 0.0
    for v in sorted(float(v) for v in values):
        expected += v
    assert filled(first)[10]["sum"] == expected


def test_documents_merge_partials_of_several_hours(spark: SparkSession) -> None:
    values = ["1.5", "2.5", "4", "8"]
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="day")
    hours = ["2026-03-01-10", "2026-03-01-11"]
    rows = _values_rows(values, lambda i: hours[i % 2])
    classified = sth.classify_events(events(spark, rows), cfg)
    partials = sth.sth_partials(classified, cfg.resolutions)
    got = sorted((r["dt"], r["samples"], r["sum"]) for r in partials.collect())
    assert got == [("2026-03-01-10", 2, 5.5), ("2026-03-01-11", 2, 10.5)]
    docs = sth.build_documents(partials, cfg, 0).collect()
    doc = to_document(docs[0].asDict(recursive=True), cfg.data_model)
    assert filled(doc) == {1: {"offset": 1, "samples": 4, "sum": 16.0, "sum2": 88.5, "min": 1.5, "max": 8.0}}


def test_text_of_one_hour_and_numbers_of_another_both_kept(spark: SparkSession) -> None:
    """The hour with numbers only has no occur map: merging it must not drop the other hour's text."""
    cfg = STHConfig(data_model="dm-by-entity", resolutions="day")
    rows = [
        ev("m", "level", "7", ms(2026, 3, 1, 10, 5), mid="a"),
        ev("m", "level", "n/a", ms(2026, 3, 1, 11, 5), mid="b"),
        ev("m", "level", "2", ms(2026, 3, 1, 12, 5), mid="c"),
    ]
    (doc,) = documents(spark, rows, cfg)
    assert filled(doc["doc"]) == {
        1: {"offset": 1, "samples": 3, "sum": 9.0, "sum2": 53.0, "min": 2.0, "max": 7.0, "occur": {"n/a": 1}}
    }
    assert (
        sth.unaccounted_samples(
            sth.build_documents(
                sth.sth_partials(sth.classify_events(events(spark, rows), cfg), cfg.resolutions), cfg, 0
            )
        ).count()
        == 0
    )


def test_bucket_of_each_resolution(spark: SparkSession) -> None:
    origins = [
        ("second", ms(2026, 3, 1, 10, 15)),
        ("minute", ms(2026, 3, 1, 10)),
        ("hour", ms(2026, 3, 1)),
        ("day", ms(2026, 3, 1)),
        ("month", ms(2026, 1, 1)),
        ("hour", ms(1969, 12, 31)),
    ]
    df = spark.createDataFrame(origins, "resolution string, origin long")
    got = [r["b"] for r in df.select(sth.bucket_of().alias("b")).collect()]
    assert got == [
        "second-2026-03-01T10", "minute-2026-03-01T10", "hour-2026-03-01", "day-2026-03", "month-2026",
        "hour-1969-12-31",
    ]  # fmt: skip


def test_narrowing_keeps_every_row_of_the_documents_named_and_few_others(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter from some documents' collections and entity ids keeps every row of those documents
    (null ids too) and drops rows of collections or ids not among them; a column with too many values
    to name is left out of it."""
    rows = [
        ("db", "sth_/a", "e1", "T", "x"),  # per service path: the id tells entities apart
        ("db", "sth_/a", "e2", "T", "x"),
        ("db", "sth_/a", None, None, "x"),  # per entity or attribute: no ids in the document
        ("db", "sth_/a_e3_T", None, None, "x"),
        ("db", "sth_/a_e4_T", None, None, "x"),
        ("db", "sth_/b", "e1", "T", "x"),
    ]
    table = spark.createDataFrame(rows, ", ".join(f"{c} string" for c in sth.ID_COLUMNS))

    def kept(named: list[int]) -> list[tuple]:
        documents = table.where(F.col("idAttrName").isNull())  # no rows: only the frames' shape
        for i in named:
            documents = documents.unionByName(table.where(_row_is(rows[i])))
        values = {c: df.collect() for c, df in sth.narrowing_values(documents).items()}
        narrowing = sth.narrowing_filter(values)
        assert narrowing is not None
        return _in_order(tuple(r) for r in table.where(narrowing).collect())

    assert kept([0]) == [rows[0]]
    assert kept([0, 5]) == _in_order([rows[0], rows[5]])
    assert kept([2, 3]) == _in_order([rows[2], rows[3]])
    # sth_/a with e2, and sth_/a_e4_T with no id: a superset (sth_/a with no id too), never fewer.
    assert kept([1, 4]) == _in_order([rows[1], rows[2], rows[4]])
    assert kept([]) == []
    monkeypatch.setattr(sth, "MAX_NARROWING_VALUES", 1)
    values = {
        c: df.collect() for c, df in sth.narrowing_values(table.where(_row_is(rows[0]) | _row_is(rows[1]))).items()
    }
    narrowing = sth.narrowing_filter(values)  # two ids: only the collection is named
    assert narrowing is not None
    assert _in_order(tuple(r) for r in table.where(narrowing).collect()) == _in_order(rows[:3])
    values = {c: df.collect() for c, df in sth.narrowing_values(table).items()}
    assert sth.narrowing_filter(values) is None


def test_parquet_is_asked_for_every_value_the_narrowing_names() -> None:
    """Spark pushes an IN filter to Parquet value by value only up to its threshold (above it, only
    the min and max): the platform's threshold covers every value ``narrowing_filter`` names."""
    assert int(sql_config()["spark.sql.parquet.pushdown.inFilterThreshold"]) >= sth.MAX_NARROWING_VALUES


def _in_order(rows: Any) -> list[tuple]:
    return sorted(rows, key=lambda r: tuple((v is not None, v or "") for v in r))


def _row_is(row: tuple) -> Any:
    return functools.reduce(
        lambda a, b: a & b, [F.col(c).eqNullSafe(F.lit(v)) for c, v in zip(sth.ID_COLUMNS, row, strict=True)]
    )


def test_documents_from_rollups_equal_documents_from_partials(spark: SparkSession) -> None:
    """Hour partials re-keyed into rollups (day and month rows merged per receive day) give the same documents."""
    cfg = STHConfig(data_model="dm-by-entity")  # every resolution
    late = [{"name": "TimeInstant", "type": "DateTime", "value": "2026-02-27T23:59:59Z"}]
    rows = [
        ev("c", "speed", "1.5", ms(2026, 3, 1, 10, 5), mid="a"),
        ev("c", "speed", "2", ms(2026, 3, 1, 10, 50), mid="b"),
        ev("c", "speed", "4", ms(2026, 3, 1, 11, 5), mid="c"),
        ev("c", "speed", "n/a", ms(2026, 3, 2, 0, 5), mid="d"),
        ev("c", "speed", "8", ms(2026, 3, 2, 1, 5), mid="e", md=late),  # measured in February
        ev("c", "state", "on", ms(2026, 3, 2, 1, 6), mid="f", attr_type="Text"),
    ]
    partials = sth.sth_partials(sth.classify_events(events(spark, rows), cfg), cfg.resolutions)
    rollups = sth.rollup_rows(partials, partials)
    # second/minute/hour rows stay per receive hour; day and month rows become one per receive day
    parts = sorted({(r["resolution"], r["part"]) for r in rollups.collect()})
    assert ("month", "2026-03-01") in parts and ("month", "2026-03-02") in parts
    assert ("hour", "2026-03-01-10") in parts and not any(r == "month" and len(p) > 10 for r, p in parts)

    def docs(df: DataFrame, order: str) -> list[tuple]:
        out = sth.build_documents(df, cfg, 0, order=order).collect()
        return sorted(
            (r["resolution"], r["origin"], repr(to_document(r.asDict(recursive=True), cfg.data_model))) for r in out
        )

    assert docs(rollups, "part") == docs(partials, "dt")
    # speed: 1 month, 2 day, 3 hour, 4 minute and 5 second documents; state: one of each
    assert len(docs(partials, "dt")) == 20


def test_batches_rollups_compacted_give_the_same_documents_from_fewer_rows(spark: SparkSession) -> None:
    """Each batch's rollup rows kept beside the others' (continuous mode), and those rows compacted to
    one per slot and part, give the documents of the rollups of all the events at once."""
    cfg = STHConfig(data_model="dm-by-entity")  # every resolution
    rows = [
        ev("c", "speed", "1.5", ms(2026, 3, 1, 10, 5, 1), mid="a"),
        ev("c", "speed", "2", ms(2026, 3, 1, 10, 5, 1), mid="b"),
        ev("c", "speed", "4", ms(2026, 3, 1, 10, 50), mid="c"),
        ev("c", "speed", "n/a", ms(2026, 3, 1, 10, 51), mid="d"),
        ev("c", "speed", "8", ms(2026, 3, 1, 10, 52), mid="e"),
    ]

    def rollups(batch: list[dict[str, Any]]) -> DataFrame:
        partials = sth.sth_partials(sth.classify_events(events(spark, batch), cfg), cfg.resolutions)
        return sth.rollup_rows(partials, partials)

    whole = rollups(rows)
    batches = rollups(rows[:1]).unionByName(rollups(rows[1:3])).unionByName(rollups(rows[3:]))
    compacted = sth.compact_rollups(batches)

    def docs(df: DataFrame) -> list[tuple]:
        out = sth.build_documents(df, cfg, 0, order="part").collect()
        return sorted(
            (r["resolution"], r["origin"], repr(to_document(r.asDict(recursive=True), cfg.data_model))) for r in out
        )

    assert docs(batches) == docs(whole) == docs(compacted)
    per_slot = ["resolution", "origin", "offset", "part"]
    assert batches.count() > whole.count() == compacted.count()
    assert compacted.groupBy(*per_slot).count().where("count > 1").isEmpty()
    assert compacted.columns == sth.STH_ROLLUPS.fieldNames()


def test_tombstones_delete_documents_left_without_samples(spark: SparkSession) -> None:
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="hour")
    old = sth.sth_partials(sth.classify_events(events(spark, _values_rows(["1"])), cfg), cfg.resolutions)
    new = sth.sth_partials(sth.classify_events(events(spark, _values_rows([" "])), cfg), cfg.resolutions)
    merged = sth.with_tombstones(new, old)
    rows = [r.asDict(recursive=True) for r in merged.collect()]
    assert [(r["offset"], r["samples"], r["numSamples"], r["sum"], r["occur"], r["latest"]) for r in rows] == [
        (10, 0, 0, None, None, None)
    ]
    (doc,) = sth.build_documents(merged, cfg, 0).collect()
    assert (doc["action"], doc["totalSamples"]) == (sth.ACTION_DELETE, 0)
    # the same rows again are not duplicated
    assert sth.with_tombstones(merged, merged).count() == 1


def test_data_expiration_deletes_old_origins(spark: SparkSession) -> None:
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="hour,minute", data_expiration=3600)
    docs = documents(spark, _values_rows(["1"]), cfg, now_ms=ms(2026, 3, 1, 11, 0, 0))
    got = sorted((r["resolution"], r["action"]) for r in docs)
    # hour document: origin 2026-03-01T00:00 is 11 h old; minute document: origin 10:00 is exactly 1 h old
    assert got == [("hour", "delete"), ("minute", "upsert")]


def test_day_hour_mismatches(spark: SparkSession, seed_docs: list[dict[str, Any]]) -> None:
    cfg = STHConfig(data_model="dm-by-entity", resolutions="day,hour")
    rows = [ev("car1", "speed", "1", SEED_RECV + i * 3_600_000, mid=f"h{i}") for i in range(3)]
    classified = sth.classify_events(events(spark, rows), cfg)
    partials = sth.sth_partials(classified, cfg.resolutions)
    docs = sth.build_documents(partials, cfg, 0)
    assert sth.day_hour_mismatches(docs).count() == 0
    # lose one hour partial: the day document now counts more samples than its hour document
    lost = sth.build_documents(
        partials.where(~((partials["resolution"] == "hour") & (partials["offset"] == 13))), cfg, 0
    )
    (m,) = sth.day_hour_mismatches(lost).collect()
    assert (m["day"], m["hourSamples"], m["daySamples"]) == (ms(2015, 4, 20), 2, 3)


def test_day_hour_mismatches_compare_each_attribute_with_itself(spark: SparkSession) -> None:
    """Two cars, one hour lost for one of them: one mismatch, that car's. (Both sides of the join come
    from the same documents; a term matching any car with any car would pair their documents.)"""
    cfg = STHConfig(data_model="dm-by-entity", resolutions="day,hour")
    rows = [
        ev(car, "speed", "1", SEED_RECV + i * 3_600_000, mid=f"{car}-{i}") for car in ("car1", "car2") for i in range(3)
    ]
    rows.append(ev("car2", "speed", "1", SEED_RECV + 4 * 3_600_000, mid="car2-4"))
    partials = sth.sth_partials(sth.classify_events(events(spark, rows), cfg), cfg.resolutions)
    assert sth.day_hour_mismatches(sth.build_documents(partials, cfg, 0)).count() == 0
    # dm-by-entity: the car is in the collection's name (idEntityId is null).
    car1 = F.col("collection").contains("car1")
    lost = partials.where(~((F.col("resolution") == "hour") & (F.col("offset") == 13) & car1))
    mismatches = sth.day_hour_mismatches(sth.build_documents(lost, cfg, 0)).collect()
    assert [("car1" in m["collection"], m["hourSamples"], m["daySamples"]) for m in mismatches] == [(True, 2, 3)]


def test_names_udf_is_made_without_a_warning() -> None:
    """The naming UDF says how it is evaluated: pyspark then neither guesses from the type hints (and
    warns "Cannot infer the eval type" in every run) nor depends on the session's Arrow setting."""
    import warnings

    from pyspark.util import PythonEvalType

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        udf = sth.names_udf(STHConfig())
        sth.names_udf(STHConfig(), aggregated=False)
    assert udf.evalType == PythonEvalType.SQL_BATCHED_UDF  # rows pickled, whatever the session says


def _point_updates(spark: SparkSession, rows: list[tuple], cfg: STHConfig, now_ms: int = 0) -> list[dict[str, Any]]:
    classified = sth.classify_events(events(spark, rows), cfg)
    updates = sth.point_updates(sth.sth_partials(classified, cfg.resolutions), cfg, now_ms)
    return sorted((r.asDict(recursive=True) for r in updates.collect()), key=lambda r: (r["idAttrName"], r["origin"]))


def test_point_updates_hold_the_batch_slots_only_merged_by_offset(spark: SparkSession) -> None:
    """One row per document the batch touches: only its slots, each merged (samples of both kinds,
    the numbers' sum, sum2, min, max, the text counted), with the range's first and last offset."""
    cfg = STHConfig(data_model="dm-by-entity", resolutions="day,minute")
    t = ms(2026, 3, 14, 10, 5, 0)
    rows = [
        ev("car1", "level", "2.5", t, mid="a"),
        ev("car1", "level", "n/a", t + 1_000, mid="b", attr_type="Text"),
        ev("car1", "level", "-1", t + 120_000, mid="c"),
    ]
    by_key = {(r["idAttrName"], r["resolution"]): r for r in _point_updates(spark, rows, cfg)}
    day, minute = by_key[("level", "day")], by_key[("level", "minute")]
    assert (day["first"], day["last"], day["range"]) == (1, 31, "month")
    assert (minute["first"], minute["last"], minute["range"]) == (0, 59, "hour")
    assert [p["offset"] for p in minute["points"]] == [5, 7]
    five = minute["points"][0]
    assert (five["samples"], five["numSamples"], five["sum"], five["sum2"], five["min"], five["max"]) == (
        2, 1, 2.5, 6.25, 2.5, 2.5)  # fmt: skip
    assert five["occur"] == {"n/a": 1}
    assert [(p["offset"], p["samples"], p["sum"], p["min"], p["max"]) for p in day["points"]] == [
        (14, 3, 1.5, -1.0, 2.5)
    ]
    assert day["numeric"] and day["text"] and day["attrType"] == "Number"  # the newest sample's
    assert {r["action"] for r in by_key.values()} == {sth.ACTION_UPDATE}


def test_point_updates_leave_expired_documents_out_and_rebuild_an_unnamed_text(spark: SparkSession) -> None:
    """A document whose origin is past data_expiration is not written (a rebuild deletes it); an
    empty text value, which no field path names, has its document rebuilt whole."""
    t = ms(2026, 3, 20, 10, 5, 0)
    cfg = STHConfig(
        data_model="dm-by-entity", resolutions="minute,day", data_expiration=5 * 86_400, ignore_white_spaces=False
    )
    rows = [ev("car1", "speed", "3", t, mid="a"), ev("car1", "note", "", t, mid="b", attr_type="Text")]
    actions = {(r["idAttrName"], r["resolution"]): r["action"] for r in _point_updates(spark, rows, cfg, t + 3_600_000)}
    assert actions == {
        ("note", "day"): sth.ACTION_EXPIRED,  # origin March 1st: 19 days before
        ("note", "minute"): sth.ACTION_REBUILD,
        ("speed", "day"): sth.ACTION_EXPIRED,
        ("speed", "minute"): sth.ACTION_UPDATE,
    }


def test_partial_occurrences_count_each_string_in_a_slot(spark: SparkSession) -> None:
    """One slot's strings, unsorted and repeated at the start, middle and end of their sorted order,
    beside numbers: each string counted once per sample, the map's keys sorted, the numbers apart."""
    t = ms(2026, 3, 1, 10, 0, 5)
    values = ["c", "a", "7", "b", "c", "a", "c", "3", "b", "b", "z", "c"]
    rows = [ev("e1", "s", v, t, mid=f"m{i}") for i, v in enumerate(values)]
    rows.append(ev("e2", "s", "only", t, mid="n1"))
    cfg = STHConfig(data_model="dm-by-service-path", resolutions="hour")
    partials = sth.sth_partials(sth.classify_events(events(spark, rows), cfg), cfg.resolutions)
    got = {
        # As entries: a map collected to Python does not keep Spark's key order.
        r["idEntityId"]: (r["samples"], r["numSamples"], r["sum"], [tuple(e) for e in r["entries"]])
        for r in partials.select("*", F.map_entries("occur").alias("entries")).collect()
    }
    assert got == {
        "e1": (12, 2, 10.0, [("a", 2), ("b", 3), ("c", 4), ("z", 1)]),
        "e2": (1, 0, None, [("only", 1)]),
    }


@pytest.mark.parametrize("build", ["documents", "point_updates"])
def test_documents_of_stored_partials_take_one_shuffle(spark: SparkSession, build: str) -> None:
    """The merge per slot and the grouping per document share one exchange (by document), where
    planning each from its own keys shuffles twice. Static planning shows the exchanges up front."""
    cfg = STHConfig(data_model="dm-by-entity", resolutions="hour,minute")
    rows = [ev("car1", "speed", str(v), T0 + v * 61_000, mid=f"m{v}") for v in range(6)]
    classified = sth.classify_events(events(spark, rows), cfg)
    # As read from the lake: partials with no partitioning of their own.
    stored = spark.createDataFrame(sth.sth_partials(classified, cfg.resolutions).collect(), sth.STH_PARTIALS)
    with session_settings(spark, {"spark.sql.adaptive.enabled": "false"}):
        made = sth.build_documents(stored, cfg, 0) if build == "documents" else sth.point_updates(stored, cfg, 0)
        plan = physical_plan(made)
        got = made.collect()
    exchanges = [line for line in plan.splitlines() if "Exchange " in line]
    assert len(exchanges) == 1, plan
    assert all(f"{c}#" in exchanges[0] for c in sth.DOC_COLUMNS), exchanges[0]
    assert {(r["idAttrName"], r["resolution"]) for r in got} == {("speed", "hour"), ("speed", "minute")}
