"""Instants as devices and IoT agents write them: ISO 8601 in its common forms, and epoch numbers.

Pure Column expressions (no UDF, no action) that never throw under ANSI mode and do not depend on the
session's time zone.

:func:`iso8601_ns` reads an ISO 8601 date-time as epoch nanoseconds:

- extended (``2015-04-21T00:16:56Z``) or basic (``20150421T001656Z``) format; a space (or ``t``) may
  stand for the ``T``;
- seconds optional (``2015-04-21T00:16Z``), a date alone is its midnight (``2015-04-21``);
- a fraction of 1 to 9 digits after ``.`` or ``,`` (milliseconds, microseconds, nanoseconds);
- an offset ``Z``, ``±HH``, ``±HHMM`` or ``±HH:MM`` (``+02:00``, ``-0300``, ``+05``); no offset means UTC;
- each field valid (month 01-12, a day that exists in its month, hour 00-23, minute and second 00-59);
- the instant representable in 64-bit nanoseconds: years 1677 to 2262.

Anything else is null: the caller falls back (to the receive time) and keeps the text as it came.

:func:`metadata_instant_ms` reads a ``TimeInstant`` metadata value as epoch milliseconds: ISO 8601 as
above, or an epoch number as Cygnus accepts it: milliseconds, or seconds when its magnitude is below
10^11 (an epoch in milliseconds below that is before 1973-03-03; in seconds it is after year 5138).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from ngsi_assets.ngsi.constants import MD_TIME_INSTANT

# Groups: 1 year, 2 month, 3 day, 4 hour, 5 minute, 6 second, 7 fraction digits, 8 offset.
_EXTENDED = (
    r"(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2}))?(?:[.,](\d{1,9}))?\s?([Zz]|[+-]\d{2}(?::?\d{2})?)?)?"
)
_BASIC = r"(\d{4})(\d{2})(\d{2})(?:[Tt](\d{2})(\d{2})(\d{2})?(?:[.,](\d{1,9}))?([Zz]|[+-]\d{2}(?:\d{2})?)?)?"
ISO8601 = rf"^(?:{_EXTENDED}|{_BASIC})$"
_GROUPS = 8
# Epoch numbers: optional sign, digits, an optional fraction (seconds with a fraction: 1429535602.5).
_EPOCH = r"^[+-]?\d{1,15}(?:\.\d{1,9})?$"
_SECONDS_BELOW = 10**11
# 64-bit nanoseconds reach 2262-04-11T23:47:16.854775807Z (and as far before 1970).
_MAX_SECONDS = 9_223_372_035
_NS = 1_000_000_000
_MD_ARRAY = ArrayType(
    StructType(
        [StructField("name", StringType()), StructField("type", StringType()), StructField("value", StringType())]
    )
)


# One regexp_replace rewrites a matching text as its groups joined by "|" (a group of the form that
# did not match, or an absent one, is empty): every field from one evaluation of the pattern, where a
# regexp_extract per field evaluated it 16 times a value (BENCHMARKS.md, "Findings behind the defaults").
_FIELDS = "|".join(f"${g}${g + _GROUPS}" for g in range(1, _GROUPS + 1))


def let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(value)`` with ``value`` evaluated once per row however often ``body`` uses it (a lambda
    variable). Spark's subexpression elimination does not reach into conditional branches, where the
    callers' instants sit (``when``/``coalesce``)."""
    return F.get(F.transform(F.array(value), body), 0)


def _int(text: Column, default: int = 0) -> Column:
    return F.when(text == "", F.lit(default)).otherwise(text.try_cast("int"))


def _instant_ns(text: Column, fields: Column) -> Column:
    def part(group: int) -> Column:
        return F.get(fields, group - 1)

    fraction = part(7)
    offset = F.upper(part(8))
    # Spark's time zone ids take "+02:00": normalize +02, +0200 and +02:00 to it, Z to UTC.
    sign, hours = F.substring(offset, 1, 1), F.substring(offset, 2, 2)
    minutes = F.substring(offset, -2, 2)
    zone = (
        F.when(offset.isin("", "Z"), F.lit("UTC"))
        .when(F.length(offset) == 3, F.concat(sign, hours, F.lit(":00")))
        .otherwise(F.concat(sign, hours, F.lit(":"), minutes))
    )
    hour, minute, second = _int(part(4)), _int(part(5)), _int(part(6))
    local = F.try_make_timestamp(
        _int(part(1)), _int(part(2)), _int(part(3)), hour, minute, second.cast("decimal(16,6)"), zone
    )
    seconds = F.unix_seconds(local)
    nanos = F.when(fraction == "", F.lit(0)).otherwise(F.rpad(fraction, 9, "0").try_cast("long"))
    # A text the pattern does not match is left as it is: one field, or as many as it has "|" (which
    # no match holds). Hours 24 and seconds 60 are turned away before make_timestamp can roll them over.
    matched = (F.size(fields) == _GROUPS) & ~text.contains("|")
    valid = matched & (hour < 24) & (second < 60) & (minute < 60) & (F.abs(seconds) <= _MAX_SECONDS)
    return F.when(F.coalesce(valid, F.lit(False)), seconds * F.lit(_NS) + nanos).cast("long")


def iso8601_ns(raw: Column) -> Column:
    """Epoch nanoseconds (long) of an ISO 8601 date-time in any form listed in the module doc, else null."""
    return let(
        F.trim(raw),
        lambda text: let(
            F.split(F.regexp_replace(text, ISO8601, _FIELDS), r"\|"), lambda fields: _instant_ns(text, fields)
        ),
    )


def _metadata_instant_us(raw: Column) -> Column:
    text = F.trim(raw)
    number = text.try_cast("decimal(25,9)")
    epoch_ms = F.when(F.abs(number) < F.lit(_SECONDS_BELOW), number * 1000).otherwise(number)
    return F.when(text.rlike(_EPOCH), F.floor(epoch_ms * 1000)).otherwise(
        F.floor(iso8601_ns(text).cast("decimal(20,0)") / F.lit(1000))
    )


def metadata_instant_ms(raw: Column) -> Column:
    """Epoch milliseconds (long) of a ``TimeInstant`` metadata value, else null (see the module doc)."""
    return F.floor(_metadata_instant_us(raw) / F.lit(1000)).cast("long")


def metadata_instant(raw: Column) -> Column:
    """A ``TimeInstant`` metadata value as a Spark timestamp (microseconds), else null."""
    # timestamp_micros throws on overflow under ANSI: epoch numbers may lie beyond year 294247.
    return let(
        _metadata_instant_us(raw),
        lambda us: F.when(F.abs(us) <= F.lit(_MAX_SECONDS * 1_000_000), F.timestamp_micros(us.cast("long"))),
    )


def time_instant_metadata(attr_md: Column | None = None) -> Column:
    """The value of an event's own ``TimeInstant`` metadata (null if absent) from its ``attrMd`` JSON."""
    md = F.from_json(F.col("attrMd") if attr_md is None else attr_md, _MD_ARRAY)
    return F.get(F.filter(md, lambda m: m["name"] == MD_TIME_INSTANT), 0)["value"]


def time_instant_fallback() -> Column:
    """True for an event whose ``TimeInstant`` metadata is present but not an instant the platform reads."""
    return let(time_instant_metadata(), lambda value: value.isNotNull() & metadata_instant_ms(value).isNull())
