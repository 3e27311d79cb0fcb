"""Spark column twins of ``ngsi_assets.ngsi.transactions``: one tnx per (UTC minute, counter), one uuid per (tnx, i).

Built from Spark SQL expressions only (no Python UDF), so they run in the JVM. The UTC fields of the
timestamp come from epoch arithmetic (``unix_seconds`` and ``date_from_unix_date``), which do not
read ``spark.sql.session.timeZone``: the result is the same whatever the session's time zone.

Values the Python functions refuse with a ValueError make the Spark job fail (``raise_error``) with
the same reason: a UTC year outside 2000..4047, an ``i`` outside 0..2**62-1. Null inputs give null.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from ngsi_assets.ngsi.transactions import COUNTER_MASK, I_MAX, YEAR_MAX, YEAR_MIN

_LOW56 = (1 << 56) - 1


def _long(value: int) -> Column:
    return F.lit(value).cast("long")


def tnx_column(ts: Column, counter: Column) -> Column:
    """bigint transaction id of the UTC minute of ``ts`` (a TimestampType column) and ``counter`` (a long)."""
    secs = F.unix_seconds(ts)
    date = F.date_from_unix_date(F.floor(secs / 86400).cast("int"))
    year = F.year(date).cast("long")
    second_of_day = F.pmod(secs, F.lit(86400))
    tid = counter.cast("long").bitwiseAND(_long(COUNTER_MASK))
    value = (
        F.shiftleft(year - 2000, 52)
        .bitwiseOR(F.shiftleft(F.month(date).cast("long"), 48))
        .bitwiseOR(F.shiftleft(F.dayofmonth(date).cast("long"), 43))
        .bitwiseOR(F.shiftleft(F.floor(second_of_day / 3600).cast("long"), 38))
        .bitwiseOR(F.shiftleft(F.floor(F.pmod(secs, F.lit(3600)) / 60).cast("long"), 32))
        .bitwiseOR(F.shiftleft(F.shiftright(tid, 12), 16))
        .bitwiseOR(_long(4 << 12))
        .bitwiseOR(tid.bitwiseAND(_long(0xFFF)))
    )
    in_range = year.between(YEAR_MIN, YEAR_MAX)
    message = F.concat(
        F.lit("tnx_column: UTC year "), year.cast("string"), F.lit(f" is outside {YEAR_MIN}..{YEAR_MAX}")
    )
    return (
        F.when(ts.isNull() | counter.isNull(), F.lit(None).cast("long"))
        .when(in_range, value)
        .otherwise(F.raise_error(message).cast("long"))
    )


def _hex16(value: Column) -> Column:
    # hex() of a negative bigint is its two's complement (16 digits); positives need the zero padding.
    return F.lpad(F.lower(F.hex(value)), 16, "0")


def uuid_column(tnx: Column, i: Column) -> Column:
    """Canonical lower-case uuid string (8-4-4-4-12) of row ``i`` (0..2**62-1) in transaction ``tnx`` (bigint)."""
    i = i.cast("long")
    high = _hex16(tnx.cast("long"))
    byte8 = F.shiftright(i, 56).bitwiseAND(_long(0x3F)).bitwiseOR(_long(0x80))
    low = _hex16(F.shiftleft(byte8, 56).bitwiseOR(i.bitwiseAND(_long(_LOW56))))
    digits = F.concat(high, low)
    text = F.concat_ws(
        "-",
        F.substring(digits, 1, 8),
        F.substring(digits, 9, 4),
        F.substring(digits, 13, 4),
        F.substring(digits, 17, 4),
        F.substring(digits, 21, 12),
    )
    message = F.concat(F.lit("uuid_column: i "), i.cast("string"), F.lit(" is outside 0..2**62-1"))
    return (
        F.when(tnx.isNull() | i.isNull(), F.lit(None).cast("string"))
        .when(i.between(0, I_MAX), text)
        .otherwise(F.raise_error(message).cast("string"))
    )
