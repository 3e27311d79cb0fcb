"""last_data_sql_timestamp_format -> Spark pattern: every accepted token, and refusals that name the token."""

from __future__ import annotations

import pytest

from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.ngsi.sql_timestamp import TimestampFormatError, spark_pattern

PG = Dialect.POSTGRESQL
MY = Dialect.MYSQL


@pytest.mark.parametrize(
    ("fmt", "dialect", "pattern"),
    [
        ("YYYY-MM-DD HH24:MI:SS.MS", PG, "yyyy-MM-dd HH:mm:ss.SSS"),  # Cygnus's PostgreSQL default
        ('YYYY-MM-DD"T"HH24:MI:SS.MS"Z"', PG, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
        ("YYYY-MM-DD HH24:MI:SS.US", PG, "yyyy-MM-dd HH:mm:ss.SSSSSS"),
        ("YYYY/MM/DD HH24:MI:SS.FF2", PG, "yyyy/MM/dd HH:mm:ss.SS"),
        ('YYYY"it\'s"MM', PG, "yyyy'it''s'MM"),
        ("%Y-%m-%d %H:%i:%s.%f", MY, "yyyy-MM-dd HH:mm:ss.SSSSSS"),  # Cygnus's MySQL default
        ("%Y-%m-%dT%H:%i:%s.%fZ", MY, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"),
        ("%Y-%m-%d %T", MY, "yyyy-MM-dd HH:mm:ss"),
        ("%Y%%%m", MY, "yyyy%MM"),
    ],
)
def test_patterns(fmt: str, dialect: Dialect, pattern: str) -> None:
    assert spark_pattern(fmt, dialect) == pattern


@pytest.mark.parametrize(
    ("fmt", "dialect", "message"),
    [
        ("YYYY-MM-DD HH12:MI:SS", PG, "unsupported token 'HH12'"),
        ("YYYY-Month-DD", PG, "unsupported token 'Month'"),
        ('YYYY-MM-DD"T', PG, "unterminated quoted text"),
        ("HH24:MI", PG, "has no year"),
        ("%Y-%m-%d %h", MY, "unsupported specifier %h"),
        ("%Y-%m-%d %", MY, "a lone '%'"),
    ],
)
def test_refused_formats_name_the_problem(fmt: str, dialect: Dialect, message: str) -> None:
    with pytest.raises(TimestampFormatError, match=message):
        spark_pattern(fmt, dialect)
