"""Field value conversions: one Column expression per (record value, target field type), evaluated row by row.

Incoming record values reach Spark as the strings of ``from_json(..., MapType(StringType(), StringType()))``: a
JSON string arrives unquoted, a number as its JSON text (``1234567``, ``194.27``, ``1e3``), a boolean as
``true``/``false``, an object or array as its raw JSON text and JSON null as SQL null. A string ``"123"`` and a
number ``123`` therefore arrive identically and convert identically.

:func:`convert_value` gives ``struct<value: string, error: string>``: ``value`` is the *canonical text* of the
converted value (what :func:`typed_column` casts to the field's Spark type, and what provenance can record), and
``error`` says why the value cannot be converted (``value`` is then null). Both are pure Spark SQL expressions
(no Python UDF, no action) that never throw under ANSI mode.

Rules (the platform's documented behaviour)
------------------------------------------
- **null**: a null raw value gives value null and error null (whether an explicit null overwrites is the caller's
  business).
- **White space**: for integer, decimal, boolean and timestamp the raw text is first trimmed of leading and trailing
  white space (space, tab, line feed, carriage return, form feed, vertical tab); text and link keep it.
- **Numbers** (integer, decimal, and numeric booleans): after trimming, the text must match
  ``[+-]?(digits[.digits?] | .digits)([eE][+-]?digits)?`` with an exponent of at most 4 digits (larger exponents
  are refused as not convertible rather than risk seconds of arithmetic per value). Empty or blank text, ``NaN``,
  ``Infinity``, booleans, nested JSON and any other text are errors.
- **text** (and **link**, whose value is resolved elsewhere): any raw value is accepted as it arrives (numbers keep
  their JSON text, booleans are ``true``/``false``, nested JSON is its raw text), truncated to ``length``
  characters (Unicode code points) when ``length`` is set. Never an error.
- **integer** (Spark ``LongType``): the number is rounded to the nearest integer, halves away from zero
  (``12.5`` -> ``13``, ``-12.5`` -> ``-13``); the result must fit a signed 64-bit integer. Canonical text: the
  integer in plain digits (``"13"``, ``"-13"``, ``"1000"`` for ``1e3``).
- **decimal(p, s)** (Spark ``DecimalType(p, s)``; ``precision`` defaults to 38 and ``scale`` to
  ``min(10, precision)`` when None): the number is rounded to ``s`` decimal places, halves away from zero; if the
  rounded result needs more than ``p`` digits (more than ``p - s`` before the point) it is an error. Canonical text:
  plain notation with exactly ``s`` decimals, no exponent (``"194.27"``, ``"5.00"``, ``"1000.00"`` for ``1e3``).
- **boolean** (Spark ``BooleanType``): after trimming and case-insensitively, ``true``, ``t``, ``yes``, ``y``,
  ``on`` and any number equal to 1 (``1``, ``1.0``, ``1e0``) are true; ``false``, ``f``, ``no``, ``n``, ``off`` and
  any number equal to 0 (``0``, ``0.0``, ``-0``) are false (numbers are compared at 37 decimal places). Anything
  else that is not null is an error. Canonical text: ``"true"`` / ``"false"``.
- **timestamp** (Spark ``TimestampType``): after trimming, an ISO 8601 text ``yyyy-MM-dd`` (midnight) or
  ``yyyy-MM-ddTHH:mm[:ss[.fraction]]`` followed by an optional ``Z`` or ``±HH:MM`` offset (hours 00-23, minutes
  00-59); a space may replace the ``T``, and ``t``/``z`` may be lower case. No offset means UTC. Each field must
  be valid (month 01-12, a day that exists in that month, hour 00-23, minute and second 00-59; no leap second), and
  the instant in UTC must lie in years 0001-9999. Fraction digits beyond milliseconds are truncated, not rounded.
  Numbers (epoch values included) and anything else are errors. Canonical text: ``yyyy-MM-ddTHH:mm:ss.SSSZ`` in UTC
  (``"2019-06-05T08:30:00.000Z"``).

Errors read ``"{name}: cannot convert {quoted raw} to {type}"`` where ``{type}`` is ``integer``, ``decimal(p,s)``,
``boolean`` or ``timestamp``, and, for a well-formed number too large for the type,
``"{name}: {trimmed number} does not fit integer (signed 64-bit)"`` or ``"{name}: {number} does not fit
decimal(p,s)"``. The quoted raw value is single-quoted, Python-like: backslash, single quote, line feed, carriage
return and tab are escaped as ``\\\\``, ``\\'``, ``\\n``, ``\\r``, ``\\t``. Only the first 100 characters of a value
are shown in an error, followed by ``...`` when it was longer.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

TEXT = "text"
INTEGER = "integer"
DECIMAL = "decimal"
BOOLEAN = "boolean"
TIMESTAMP = "timestamp"
LINK = "link"
FIELD_TYPES = (TEXT, INTEGER, DECIMAL, BOOLEAN, TIMESTAMP, LINK)

DEFAULT_PRECISION = 38
DEFAULT_SCALE = 10
MAX_PRECISION = 38
# How much of an offending value an error message shows.
ERROR_VALUE_CHARS = 100

TRUE_WORDS = ("true", "t", "yes", "y", "on")
FALSE_WORDS = ("false", "f", "no", "n", "off")

CONVERTED = StructType().add("value", StringType()).add("error", StringType())

# Java regular expressions, matched by Spark.
_NUMBER = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?$"
_TIMESTAMP = (
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-5][0-9])(?:\.([0-9]+))?)?([Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)?$"
)
_TS_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
# Fraction digits beyond milliseconds are cut (never rounded up to the next second); the offset is applied apart.
_FRACTION_EXCESS_OR_OFFSET = r"(\.[0-9]{3})[0-9]+|(?:Z|[+-][0-9]{2}:[0-9]{2})$"
_OFFSET = r"([+-][0-9]{2}:[0-9]{2})$"
# Years 1-9999 only: what ISO 8601 text, Python and most sinks can represent.
_MIN_UTC = "0001-01-01 00:00:00"
_MAX_UTC = "9999-12-31 23:59:59.999"
_BLANK_ENDS = r"^[ \t\n\r\f\x0B]+|[ \t\n\r\f\x0B]+$"
_ESCAPES = (("\\", "\\\\"), ("'", "\\'"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


class FieldTypeLike(Protocol):
    """The type of a target field: ``type`` is one of :data:`FIELD_TYPES` (a str or a str-valued enum)."""

    @property
    def type(self) -> str: ...

    @property
    def length(self) -> int | None: ...

    @property
    def precision(self) -> int | None: ...

    @property
    def scale(self) -> int | None: ...


def field_kind(field: FieldTypeLike) -> str:
    """The field's type name, checked against :data:`FIELD_TYPES` (accepts str-valued enums)."""
    kind = str(getattr(field.type, "value", field.type))
    if kind not in FIELD_TYPES:
        raise ValueError(f"type: {kind!r} is not one of {', '.join(FIELD_TYPES)}")
    return kind


def decimal_precision_scale(field: FieldTypeLike) -> tuple[int, int]:
    """The (precision, scale) of a decimal field, defaults applied: precision 38, scale min(10, precision)."""
    precision = DEFAULT_PRECISION if field.precision is None else field.precision
    scale = min(DEFAULT_SCALE, precision) if field.scale is None else field.scale
    if not 1 <= precision <= MAX_PRECISION:
        raise ValueError(f"precision: {precision} is not between 1 and {MAX_PRECISION}")
    if not 0 <= scale <= precision:
        raise ValueError(f"scale: {scale} is not between 0 and the precision {precision}")
    return precision, scale


def spark_type(field: FieldTypeLike) -> DataType:
    """The Spark type of the field's values."""
    kind = field_kind(field)
    if kind in (TEXT, LINK):
        return StringType()
    if kind == INTEGER:
        return LongType()
    if kind == DECIMAL:
        return DecimalType(*decimal_precision_scale(field))
    if kind == BOOLEAN:
        return BooleanType()
    return TimestampType()


def type_description(field: FieldTypeLike) -> str:
    """How error messages name the field's type: ``integer``, ``decimal(5,2)``, ``boolean``, ``timestamp``..."""
    kind = field_kind(field)
    if kind == DECIMAL:
        return "decimal({},{})".format(*decimal_precision_scale(field))
    return kind


def convert_value(raw: Column, field: FieldTypeLike, name: str) -> Column:
    """struct<value: string, error: string>: the canonical text of raw converted to field's type, or an error.

    One value per row; the rules are in the module docstring. ``name`` (the field's name) starts every error.
    """
    kind = field_kind(field)
    spark_type(field)  # Refuses a bad decimal precision or scale before any expression is built.
    if kind in (TEXT, LINK):
        value = raw if field.length is None else F.substring(raw, 1, _text_length(field.length))
        return F.struct(value.alias("value"), F.lit(None).cast(StringType()).alias("error"))
    trimmed = F.regexp_replace(raw, _BLANK_ENDS, "")
    cannot = F.concat(F.lit(f"{name}: cannot convert "), _quoted(raw), F.lit(f" to {type_description(field)}"))
    if kind in (INTEGER, DECIMAL):
        is_number = trimmed.rlike(_NUMBER)
        if kind == INTEGER:
            value = trimmed.try_cast(DecimalType(MAX_PRECISION, 0)).try_cast(LongType()).cast(StringType())
            too_big = "integer (signed 64-bit)"
        else:
            value = trimmed.try_cast(DecimalType(*decimal_precision_scale(field))).cast(StringType())
            too_big = type_description(field)
        does_not_fit = F.concat(F.lit(f"{name}: "), _bounded(trimmed), F.lit(f" does not fit {too_big}"))
        error = F.when(~is_number, cannot).when(value.isNull(), does_not_fit)
        value = F.when(is_number, value)
    elif kind == BOOLEAN:
        value = _boolean_text(trimmed)
        error = F.when(value.isNull(), cannot)
    else:
        value = _timestamp_text(trimmed)
        error = F.when(value.isNull(), cannot)
    # A null raw value leaves both null: every condition is then null (false) and every message a null concat.
    return F.struct(value.alias("value"), error.cast(StringType()).alias("error"))


def typed_column(canonical: Column, field: FieldTypeLike) -> Column:
    """The canonical text (``convert_value(...).value``) cast to the Spark type of the field; null stays null."""
    kind = field_kind(field)
    if kind in (TEXT, LINK):
        return canonical.cast(StringType())
    # The canonical text always casts; try_cast only keeps a foreign text from throwing under ANSI mode.
    return canonical.try_cast(spark_type(field))


def _text_length(length: int) -> int:
    if length < 1:
        raise ValueError(f"length: {length} is not a positive number of characters")
    return length


def _bounded(text: Column) -> Column:
    """The first characters of text, with ``...`` when it was cut."""
    return F.concat(
        F.substring(text, 1, ERROR_VALUE_CHARS),
        F.when(F.char_length(text) > ERROR_VALUE_CHARS, F.lit("...")).otherwise(F.lit("")),
    )


def _quoted(raw: Column) -> Column:
    """raw single-quoted and escaped like a Python repr, bounded to its first characters."""
    shown = F.substring(raw, 1, ERROR_VALUE_CHARS)
    for search, replacement in _ESCAPES:
        shown = F.replace(shown, F.lit(search), F.lit(replacement))
    cut = F.when(F.char_length(raw) > ERROR_VALUE_CHARS, F.lit("...")).otherwise(F.lit(""))
    return F.concat(F.lit("'"), shown, F.lit("'"), cut)


def _boolean_text(trimmed: Column) -> Column:
    word = F.lower(trimmed)
    # Scale 37 keeps every digit of a number whose integer part is one digit: only 1 and 0 compare equal.
    number = F.when(trimmed.rlike(_NUMBER), trimmed.try_cast(DecimalType(MAX_PRECISION, MAX_PRECISION - 1)))
    return (
        F.when(word.isin(*TRUE_WORDS) | (number == F.lit(1)), F.lit("true"))
        .when(word.isin(*FALSE_WORDS) | (number == F.lit(0)), F.lit("false"))
        .cast(StringType())
    )


def _timestamp_text(trimmed: Column) -> Column:
    # Once the strict pattern matched, Spark's own parser reads the local date-time (checking that the month, day
    # and hour exist); the offset is then subtracted by hand so that no session time zone is involved.
    local = F.regexp_replace(F.upper(trimmed), _FRACTION_EXCESS_OR_OFFSET, "$1").try_cast(TimestampNTZType())
    offset = F.regexp_extract(trimmed, _OFFSET, 1)
    offset_seconds = F.when(offset.startswith("-"), F.lit(-1)).otherwise(F.lit(1)) * (
        F.substring(offset, 2, 2).try_cast(IntegerType()) * 3600
        + F.substring(offset, 5, 2).try_cast(IntegerType()) * 60
    )
    # No offset, or Z: the offset extracts as "" and its seconds as null, meaning UTC.
    utc = local - F.make_dt_interval(F.lit(0), F.lit(0), F.lit(0), F.coalesce(offset_seconds, F.lit(0)))
    in_range = utc.between(F.lit(_MIN_UTC).cast(TimestampNTZType()), F.lit(_MAX_UTC).cast(TimestampNTZType()))
    return F.when(trimmed.rlike(_TIMESTAMP) & in_range, F.date_format(utc, _TS_FORMAT))
