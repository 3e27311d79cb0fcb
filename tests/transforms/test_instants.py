"""ISO 8601 in the forms devices write, and TimeInstant metadata values, read as instants in Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ngsi_assets.transforms.instants import iso8601_ns, metadata_instant, metadata_instant_ms

BASE_NS = 1429575333834000000  # 2015-04-21T00:15:33.834Z


def read(spark: SparkSession, fn, values: list[str | None]) -> list[int | None]:  # noqa: ANN001
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, v string")
    return [r["x"] for r in df.select("i", fn(F.col("v")).alias("x")).orderBy("i").collect()]


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2015-04-21T00:15:33.834Z", BASE_NS),
        ("2015-04-21T02:15:33.834+02:00", BASE_NS),
        ("2015-04-21T02:15:33.834+0200", BASE_NS),
        ("2015-04-21T02:15:33.834+02", BASE_NS),
        ("2015-04-20T21:15:33.834-0300", BASE_NS),
        ("2015-04-21 00:15:33.834Z", BASE_NS),
        ("2015-04-21T00:15:33.834", BASE_NS),  # no offset: UTC
        ("2015-04-21t00:15:33.834z", BASE_NS),
        ("2015-04-21T00:15:33,834Z", BASE_NS),
        ("2015-04-21T00:15:33.834000Z", BASE_NS),
        ("2015-04-21T00:15:33.834000001Z", BASE_NS + 1),
        ("2015-04-21T00:15:33.8340001Z", BASE_NS + 100),
        ("20150421T001533.834Z", BASE_NS),
        ("20150421T021533.834+0200", BASE_NS),
        ("2015-04-21T00:15:33Z", BASE_NS - 834_000_000),
        ("2015-04-21T00:15Z", BASE_NS - 33_834_000_000),
        ("2015-04-21", 1429574400 * 10**9),
        ("  2015-04-21T00:15:33.834Z ", BASE_NS),
        ("1969-12-31T23:59:59.999999999Z", -1),
    ],
)
def test_iso8601_forms_read_as_one_instant(spark: SparkSession, text: str, ns: int) -> None:
    assert read(spark, iso8601_ns, [text]) == [ns]


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "",
        "1483228801123",
        "2015-13-01T00:00:00Z",  # month 13
        "2015-02-29T00:00:00Z",  # not a leap year
        "2015-04-21T24:00:00Z",
        "2015-04-21T23:60:00Z",
        "2015-04-21T23:59:60Z",  # leap second
        "2015-04-21T00:00:00+25:00",
        "2015-04-21T00:00:00+02:75",
        "2015-04-21T00:00:00.1234567890Z",  # ten fraction digits
        "+12015-04-21T00:00:00Z",
        "1500-01-01T00:00:00Z",  # before 64-bit nanoseconds reach
        "2300-01-01T00:00:00Z",  # after
        "2015|04|21|00|15|33|834|Z",  # the fields of an instant, as they are split internally
        "2015-04-21T00:15:33Z|",
        "2015-04-21T00:00:00ZZ",
        None,
    ],
)
def test_what_is_not_an_iso8601_instant_is_null(spark: SparkSession, text: str | None) -> None:
    assert read(spark, iso8601_ns, [text]) == [None]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1483228801123", 1483228801123),  # epoch milliseconds
        ("1483228801", 1483228801000),  # epoch seconds
        ("1483228801.5", 1483228801500),
        ("2017-01-01T00:00:01.123Z", 1483228801123),
        ("2017-01-01T01:00:01.123+01:00", 1483228801123),
        ("yesterday", None),
        ("", None),
        ("[1, 2]", None),
    ],
)
def test_time_instant_metadata_values(spark: SparkSession, text: str, ms: int | None) -> None:
    assert read(spark, metadata_instant_ms, [text]) == [ms]
    at = read(spark, metadata_instant, [text])[0]
    assert (None if at is None else round(at.timestamp() * 1000)) == ms


def test_a_huge_epoch_number_is_no_instant_and_no_error(spark: SparkSession) -> None:
    assert read(spark, metadata_instant, ["999999999999999"]) == [None]


# Random instants rendered in random ISO 8601 forms and offsets read back as the same instant.
_instants = st.integers(
    min_value=int(datetime(1700, 1, 1, tzinfo=UTC).timestamp()) * 10**9,
    max_value=int(datetime(2250, 1, 1, tzinfo=UTC).timestamp()) * 10**9,
)
_offsets = st.integers(min_value=-18 * 60, max_value=18 * 60)


@st.composite
def rendered(draw: st.DrawFn) -> tuple[str, int]:
    """(text, its epoch ns): an instant in a random form; forms without seconds or fraction drop them."""
    ns = draw(_instants)
    offset_min = draw(_offsets)
    precision = draw(st.sampled_from(["minute", "second", 1, 2, 3, 6, 9]))
    if precision == "minute":
        ns -= ns % (60 * 10**9)
    elif precision == "second":
        ns -= ns % 10**9
    else:
        ns -= ns % 10 ** (9 - precision)
    seconds, frac = divmod(ns, 10**9)
    local = datetime(1970, 1, 1) + timedelta(seconds=seconds, minutes=offset_min)
    basic = draw(st.booleans())
    date = local.strftime("%Y%m%d" if basic else "%Y-%m-%d")
    sep = "T" if basic else draw(st.sampled_from(["T", " "]))
    clock = local.strftime("%H%M" if basic else "%H:%M")
    if precision != "minute":
        clock += local.strftime("%S" if basic else ":%S")
    if isinstance(precision, int):
        clock += draw(st.sampled_from([".", ","])) + f"{frac:09d}"[:precision]
    if offset_min == 0:
        # The basic format's offsets are basic too (as for the other offsets below).
        zone = draw(st.sampled_from(["Z", "+0000", "+00"] if basic else ["Z", "+00:00", "", "+0000", "+00"]))
    else:
        sign = "+" if offset_min > 0 else "-"
        h, m = divmod(abs(offset_min), 60)
        forms = [f"{sign}{h:02d}{m:02d}"] if basic else [f"{sign}{h:02d}:{m:02d}", f"{sign}{h:02d}{m:02d}"]
        if m == 0:
            forms.append(f"{sign}{h:02d}")
        zone = draw(st.sampled_from(forms))
    return f"{date}{sep}{clock}{zone}", ns


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rendered(), min_size=1, max_size=20))
def test_random_instants_in_random_forms_read_back(spark: SparkSession, cases: list[tuple[str, int]]) -> None:
    texts = [t for t, _ in cases]
    assert read(spark, iso8601_ns, texts) == [ns for _, ns in cases], texts


def test_offsets_agree_with_python(spark: SparkSession) -> None:
    at = datetime(2015, 4, 21, 2, 15, 33, 834000, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert read(spark, iso8601_ns, [at.isoformat()]) == [round(at.timestamp() * 1000) * 10**6]
