"""Field value conversions: one table per target type, every accepted form and every error path.

Each table is one DataFrame collected once: (field, raw) -> exact (canonical value, error), plus the typed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DecimalType, LongType, StringType, TimestampType

from ngsi_assets.transforms.conversions import convert_value, spark_type, typed_column


@dataclass(frozen=True)
class Field:
    type: str
    length: int | None = None
    precision: int | None = None
    scale: int | None = None


Case = tuple[Field, str | None, str | None, str | None]

TEXT = Field("text")
TEXT3 = Field("text", length=3)
LINK = Field("link")
INTEGER = Field("integer")
PRICE = Field("decimal", precision=5, scale=2)
DECIMAL = Field("decimal")
WHOLE = Field("decimal", precision=3, scale=0)
BOOLEAN = Field("boolean")
TIMESTAMP = Field("timestamp")


def _expected_typed(field: Field, value: str | None) -> Any:
    """The typed value a canonical text stands for, computed in Python (timestamps as epoch milliseconds)."""
    if value is None:
        return None
    if field.type == "integer":
        return int(value)
    if field.type == "decimal":
        return Decimal(value)
    if field.type == "boolean":
        return {"true": True, "false": False}[value]
    if field.type == "timestamp":
        return round(datetime.fromisoformat(value).timestamp() * 1000)
    return value


def check_table(spark: SparkSession, name: str, cases: list[Case]) -> None:
    """Converts every case in one DataFrame and asserts its exact (value, error) and typed round trip."""
    fields = list(dict.fromkeys(case[0] for case in cases))
    df = spark.createDataFrame(
        [(i, fields.index(field), raw) for i, (field, raw, _, _) in enumerate(cases)], "i int, f int, raw string"
    )
    columns = [F.col("i"), F.col("f")]
    for k, field in enumerate(fields):
        converted = convert_value(F.col("raw"), field, name)
        typed = typed_column(converted["value"], field)
        assert df.select(typed).schema[0].dataType == spark_type(field)
        if field.type == "timestamp":
            # Epoch milliseconds: collecting a timestamp would apply the driver's local time zone.
            typed = F.unix_millis(typed)
        columns += [converted.alias(f"c{k}"), typed.alias(f"t{k}")]
    result = df.select(*columns)
    rows = {row["i"]: row for row in result.collect()}
    actual = [
        (case[1], rows[i][f"c{rows[i]['f']}"]["value"], rows[i][f"c{rows[i]['f']}"]["error"])
        for i, case in enumerate(cases)
    ]
    expected = [(raw, value, error) for _, raw, value, error in cases]
    assert actual == expected
    typed_actual = [rows[i][f"t{rows[i]['f']}"] for i in range(len(cases))]
    assert typed_actual == [_expected_typed(field, value) for field, _, value, _ in cases]


def test_text_and_link(spark: SparkSession) -> None:
    long_text = "x" * 500
    cases: list[Case] = [
        (TEXT, "abc", "abc", None),
        (TEXT, "  spaced\t", "  spaced\t", None),
        (TEXT, "123", "123", None),
        (TEXT, "194.27", "194.27", None),
        (TEXT, "1e3", "1e3", None),
        (TEXT, "true", "true", None),
        (TEXT, '{"a": [1, 2]}', '{"a": [1, 2]}', None),
        (TEXT, "", "", None),
        (TEXT, long_text, long_text, None),
        (TEXT, None, None, None),
        (TEXT3, "abcdef", "abc", None),
        (TEXT3, "a😀bcd", "a😀b", None),
        (TEXT3, "ñandú", "ñan", None),
        (TEXT3, "ab", "ab", None),
        (TEXT3, "", "", None),
        (TEXT3, "12345", "123", None),
        (TEXT3, None, None, None),
        (LINK, "urn:ngsi-ld:Store:001", "urn:ngsi-ld:Store:001", None),
        (LINK, None, None, None),
    ]
    check_table(spark, "description", cases)


def test_integer(spark: SparkSession) -> None:
    cannot = "product_number: cannot convert {} to integer"
    too_big = "product_number: {} does not fit integer (signed 64-bit)"
    cases: list[Case] = [
        (INTEGER, "1234567", "1234567", None),
        (INTEGER, "-42", "-42", None),
        (INTEGER, "+7", "7", None),
        (INTEGER, "007", "7", None),
        (INTEGER, "0", "0", None),
        (INTEGER, "12.5", "13", None),
        (INTEGER, "-12.5", "-13", None),
        (INTEGER, "12.49999", "12", None),
        (INTEGER, "-12.4", "-12", None),
        (INTEGER, "0.5", "1", None),
        (INTEGER, "-0.5", "-1", None),
        (INTEGER, "-0.4", "0", None),
        (INTEGER, ".5", "1", None),
        (INTEGER, "5.", "5", None),
        (INTEGER, "1e3", "1000", None),
        (INTEGER, "1.5E2", "150", None),
        (INTEGER, "2.5e+1", "25", None),
        (INTEGER, "125e-1", "13", None),
        (INTEGER, "1e-9999", "0", None),
        (INTEGER, " 42 ", "42", None),
        (INTEGER, "\t42\r\n", "42", None),
        (INTEGER, "9223372036854775807", "9223372036854775807", None),
        (INTEGER, "-9223372036854775808", "-9223372036854775808", None),
        (INTEGER, "9223372036854775807.4", "9223372036854775807", None),
        (INTEGER, None, None, None),
        # Not numbers.
        (INTEGER, "abc", None, cannot.format("'abc'")),
        (INTEGER, "true", None, cannot.format("'true'")),
        (INTEGER, "false", None, cannot.format("'false'")),
        (INTEGER, "", None, cannot.format("''")),
        (INTEGER, "   ", None, cannot.format("'   '")),
        (INTEGER, "\t", None, cannot.format("'\\t'")),
        (INTEGER, "NaN", None, cannot.format("'NaN'")),
        (INTEGER, "Infinity", None, cannot.format("'Infinity'")),
        (INTEGER, "-Infinity", None, cannot.format("'-Infinity'")),
        (INTEGER, "1,5", None, cannot.format("'1,5'")),
        (INTEGER, "12abc", None, cannot.format("'12abc'")),
        (INTEGER, "0x1F", None, cannot.format("'0x1F'")),
        (INTEGER, "1 000", None, cannot.format("'1 000'")),
        (INTEGER, "1e", None, cannot.format("'1e'")),
        (INTEGER, "e3", None, cannot.format("'e3'")),
        (INTEGER, ".", None, cannot.format("'.'")),
        (INTEGER, "+", None, cannot.format("'+'")),
        (INTEGER, "--1", None, cannot.format("'--1'")),
        (INTEGER, "1e10000", None, cannot.format("'1e10000'")),
        (INTEGER, '{"value": 1}', None, cannot.format("'{\"value\": 1}'")),
        (INTEGER, "[1, 2]", None, cannot.format("'[1, 2]'")),
        (INTEGER, "it's\\", None, cannot.format("'it\\'s\\\\'")),
        (INTEGER, "a\nb", None, cannot.format("'a\\nb'")),
        (INTEGER, "y" * 150, None, cannot.format("'" + "y" * 100 + "'...")),
        # Numbers too large for a signed 64-bit integer.
        (INTEGER, "9223372036854775808", None, too_big.format("9223372036854775808")),
        (INTEGER, "9223372036854775807.5", None, too_big.format("9223372036854775807.5")),
        (INTEGER, "-9223372036854775809", None, too_big.format("-9223372036854775809")),
        (INTEGER, " 1e19 ", None, too_big.format("1e19")),
        (INTEGER, "1e400", None, too_big.format("1e400")),
        (INTEGER, "9" * 120, None, too_big.format("9" * 100 + "...")),
    ]
    check_table(spark, "product_number", cases)


def test_decimal(spark: SparkSession) -> None:
    cannot = "price: cannot convert {} to decimal(5,2)"
    cases: list[Case] = [
        (PRICE, "194.27", "194.27", None),
        (PRICE, "5", "5.00", None),
        (PRICE, "-5", "-5.00", None),
        (PRICE, "1e2", "100.00", None),
        (PRICE, "2.5e-1", "0.25", None),
        (PRICE, "-0.5", "-0.50", None),
        (PRICE, "0.125", "0.13", None),
        (PRICE, "-0.125", "-0.13", None),
        (PRICE, "0.124", "0.12", None),
        (PRICE, "1.005", "1.01", None),
        (PRICE, "0.004", "0.00", None),
        (PRICE, "999.994", "999.99", None),
        (PRICE, "-999.99", "-999.99", None),
        (PRICE, " 1.5\n", "1.50", None),
        (PRICE, "+.5", "0.50", None),
        (PRICE, None, None, None),
        (PRICE, "123456.789", None, "price: 123456.789 does not fit decimal(5,2)"),
        (PRICE, "1000", None, "price: 1000 does not fit decimal(5,2)"),
        (PRICE, "999.995", None, "price: 999.995 does not fit decimal(5,2)"),
        (PRICE, "-1e3", None, "price: -1e3 does not fit decimal(5,2)"),
        (PRICE, "abc", None, cannot.format("'abc'")),
        (PRICE, "true", None, cannot.format("'true'")),
        (PRICE, "", None, cannot.format("''")),
        (PRICE, " ", None, cannot.format("' '")),
        (PRICE, "NaN", None, cannot.format("'NaN'")),
        (PRICE, "Infinity", None, cannot.format("'Infinity'")),
        (PRICE, "12.5€", None, cannot.format("'12.5€'")),
        (PRICE, '{"amount": 12.5}', None, cannot.format("'{\"amount\": 12.5}'")),
        # Defaults: decimal(38,10).
        (DECIMAL, "1234567.123456789012", "1234567.1234567890", None),
        (DECIMAL, "0.00000000005", "0.0000000001", None),
        (DECIMAL, "-0.00000000005", "-0.0000000001", None),
        (DECIMAL, "1e27", "1000000000000000000000000000.0000000000", None),
        (DECIMAL, "1e28", None, "price: 1e28 does not fit decimal(38,10)"),
        (DECIMAL, "false", None, "price: cannot convert 'false' to decimal(38,10)"),
        # Scale 0: rounding to whole numbers, halves away from zero.
        (WHOLE, "12.5", "13", None),
        (WHOLE, "-12.5", "-13", None),
        (WHOLE, "999.4", "999", None),
        (WHOLE, "999.5", None, "price: 999.5 does not fit decimal(3,0)"),
    ]
    check_table(spark, "price", cases)


def test_boolean(spark: SparkSession) -> None:
    cannot = "active: cannot convert {} to boolean"
    truthy = [
        "true",
        "TRUE",
        "True",
        "t",
        "T",
        "yes",
        "YES",
        "y",
        "Y",
        "on",
        "On",
        " true ",
        "\tyes\n",
        "1",
        "1.0",
        "1.000",
        "1e0",
        "+1",
        "01",
        "0.1e1",
    ]
    falsy = ["false", "FALSE", "f", "F", "no", "No", "n", "N", "off", "OFF", " off ", "0", "0.0", "-0", "0e5", ".0"]
    bad = [
        "2",
        "-1",
        "10",
        "0.5",
        "1.5",
        "1.0000000001",
        "",
        "   ",
        "maybe",
        "yes please",
        "tru",
        "nope",
        "oui",
        "NaN",
        "Infinity",
        '{"a": true}',
        "[true]",
        "null",
    ]
    cases: list[Case] = [(BOOLEAN, raw, "true", None) for raw in truthy]
    cases += [(BOOLEAN, raw, "false", None) for raw in falsy]
    cases += [(BOOLEAN, raw, None, cannot.format(_repr(raw))) for raw in bad]
    cases.append((BOOLEAN, None, None, None))
    check_table(spark, "active", cases)


def test_timestamp(spark: SparkSession) -> None:
    cannot = "observed: cannot convert {} to timestamp"
    cases: list[Case] = [
        (TIMESTAMP, "2019-06-05", "2019-06-05T00:00:00.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30", "2019-06-05T08:30:00.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15.1", "2019-06-05T08:30:15.100Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15.12", "2019-06-05T08:30:15.120Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15.123456789", "2019-06-05T08:30:15.123Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15.9999Z", "2019-06-05T08:30:15.999Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15Z", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30Z", "2019-06-05T08:30:00.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15+02:00", "2019-06-05T06:30:15.000Z", None),
        (TIMESTAMP, "2019-06-05T01:30-05:30", "2019-06-05T07:00:00.000Z", None),
        (TIMESTAMP, "2019-06-05T23:30:00.5-01:00", "2019-06-06T00:30:00.500Z", None),
        (TIMESTAMP, "2019-01-01T00:15:00+01:00", "2018-12-31T23:15:00.000Z", None),
        (TIMESTAMP, "2019-06-05T08:30:15-00:00", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, "2019-06-05 08:30:15", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, "2019-06-05t08:30:15z", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, " 2019-06-05T08:30:15Z\n", "2019-06-05T08:30:15.000Z", None),
        (TIMESTAMP, "2020-02-29T12:00", "2020-02-29T12:00:00.000Z", None),
        (TIMESTAMP, "0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000Z", None),
        (TIMESTAMP, "9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999Z", None),
        (TIMESTAMP, None, None, None),
    ]
    bad = [
        "2019-13-01",
        "2019-00-10",
        "2019-06-00",
        "2019-06-31",
        "2019-02-29",
        "2019-06-05T25:00",
        "2019-06-05T24:00",
        "2019-06-05T08:60",
        "2019-06-05T08:30:60",
        "2019-06-05T08:30+24:00",
        "2019-06-05T08:30+02:60",
        "2019-06-05T08:30+02",
        "2019-06-05T08:30+0200",
        "2019-06-05T08:30:15.",
        "2019-06-05T08",
        "2019-06-05T",
        "2019-06-05Z",
        "2019-6-5",
        "20190605",
        "05/06/2019",
        "1559723415",
        "1559723415000",
        "1.5",
        "true",
        "",
        "   ",
        "yesterday",
        "0000-01-01",
        "0001-01-01T00:30+01:00",
        "9999-12-31T23:30-01:00",
        '{"@value": "2019-06-05"}',
    ]
    cases += [(TIMESTAMP, raw, None, cannot.format(_repr(raw))) for raw in bad]
    check_table(spark, "observed", cases)


def _repr(raw: str) -> str:
    """The quoted form errors use, for values without quotes or escapes (mirrors Python's repr)."""
    assert "'" not in raw and "\\" not in raw and "\n" not in raw and "\t" not in raw
    return f"'{raw}'"


def test_spark_type() -> None:
    assert spark_type(TEXT) == StringType()
    assert spark_type(TEXT3) == StringType()
    assert spark_type(LINK) == StringType()
    assert spark_type(INTEGER) == LongType()
    assert spark_type(PRICE) == DecimalType(5, 2)
    assert spark_type(DECIMAL) == DecimalType(38, 10)
    assert spark_type(Field("decimal", precision=6)) == DecimalType(6, 6)
    assert spark_type(Field("decimal", precision=20)) == DecimalType(20, 10)
    assert spark_type(Field("decimal", scale=2)) == DecimalType(38, 2)
    assert spark_type(BOOLEAN) == BooleanType()
    assert spark_type(TIMESTAMP) == TimestampType()


class FieldKind(StrEnum):
    INTEGER = "integer"
    DECIMAL = "decimal"


def test_spark_type_accepts_str_enums() -> None:
    assert spark_type(Field(FieldKind.INTEGER)) == LongType()  # type: ignore[arg-type]
    assert spark_type(Field(FieldKind.DECIMAL, precision=7, scale=3)) == DecimalType(7, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (Field("date"), "type: 'date' is not one of text, integer, decimal, boolean, timestamp, link"),
        (Field("decimal", precision=39), "precision: 39 is not between 1 and 38"),
        (Field("decimal", precision=0), "precision: 0 is not between 1 and 38"),
        (Field("decimal", precision=5, scale=6), "scale: 6 is not between 0 and the precision 5"),
        (Field("decimal", scale=-1), "scale: -1 is not between 0 and the precision 38"),
    ],
)
def test_bad_field_types(spark: SparkSession, field: Field, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        spark_type(field)
    with pytest.raises(ValueError, match="^" + message.split(":")[0]):
        convert_value(F.lit("1"), field, "x")


def test_bad_text_length(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="^length: 0 is not a positive number of characters$"):
        convert_value(F.lit("abc"), Field("text", length=0), "x")
