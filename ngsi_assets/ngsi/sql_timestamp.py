"""``last_data_sql_timestamp_format`` as a Spark datetime pattern, so Spark and the SQL server read
a timestamp the same way.

Cygnus compares last-data records in SQL with ``to_timestamp(col::text, format)`` (PostgreSQL) or
``STR_TO_DATE(col, format)`` (MySQL), where ``format`` is ``last_data_sql_timestamp_format``
(``SQLQueryUtils.postgreSqlUpsertQuery`` / ``mySQLUpdateRecordQuery`` in fiware-cygnus). The platform
also picks the newest record per key in Spark, before the upsert: it parses the timestamp key with
the pattern built here from the same format, so a value either parses on both sides or is treated as
having no usable timestamp (the record then falls back to its receive time).

Only the tokens a timestamp needs are accepted; anything else is refused with the token named, so a
format that Spark would read differently from the server never reaches a run.

- PostgreSQL (``to_timestamp``): ``YYYY MM DD HH24 MI SS MS US FF1``..``FF6``, ``"quoted text"``,
  and separators (anything that is not a letter). ``HH``/``HH12`` need an AM/PM marker and are refused.
- MySQL (``STR_TO_DATE``): ``%Y %m %d %H %i %s %S %f %T %%`` and literal characters.
"""

from __future__ import annotations

import re

from ngsi_assets.ngsi.sql_naming import Dialect

_PG_TOKENS = [
    ("HH24", "HH"),
    ("YYYY", "yyyy"),
    ("FF1", "S"),
    ("FF2", "SS"),
    ("FF3", "SSS"),
    ("FF4", "SSSS"),
    ("FF5", "SSSSS"),
    ("FF6", "SSSSSS"),
    ("MM", "MM"),
    ("DD", "dd"),
    ("MI", "mm"),
    ("SS", "ss"),
    ("MS", "SSS"),
    ("US", "SSSSSS"),
]
_MYSQL_TOKENS = {
    "Y": "yyyy",
    "m": "MM",
    "d": "dd",
    "H": "HH",
    "i": "mm",
    "s": "ss",
    "S": "ss",
    "f": "SSSSSS",
    "T": "HH:mm:ss",
}


class TimestampFormatError(ValueError):
    """A ``last_data_sql_timestamp_format`` the platform cannot read the way the server does."""


def _literal(text: str) -> str:
    """Text matched verbatim by a Spark pattern: letters and quotes quoted, other characters as they are."""
    if not text:
        return ""
    if re.fullmatch(r"[^A-Za-z'\[\]#{}]*", text):
        return text
    return "'" + text.replace("'", "''") + "'"


def _postgres(fmt: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(fmt):
        if fmt[i] == '"':
            end = fmt.find('"', i + 1)
            if end < 0:
                raise TimestampFormatError(f"unterminated quoted text at position {i} of {fmt!r}")
            out.append(_literal(fmt[i + 1 : end]))
            i = end + 1
            continue
        for token, spark in _PG_TOKENS:
            if fmt.startswith(token, i):
                out.append(spark)
                i += len(token)
                break
        else:
            if fmt[i].isalpha():
                word = re.match(r"[A-Za-z0-9]+", fmt[i:])
                raise TimestampFormatError(
                    f"unsupported token {word.group(0) if word else fmt[i]!r} in {fmt!r}; "
                    'use YYYY MM DD HH24 MI SS MS US FF1-FF6 and "quoted text"'
                )
            out.append(_literal(fmt[i]))
            i += 1
    return "".join(out)


def _mysql(fmt: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(_literal(c))
            i += 1
            continue
        if i + 1 >= len(fmt):
            raise TimestampFormatError(f"a lone '%' ends {fmt!r}")
        spec = fmt[i + 1]
        if spec == "%":
            out.append("%")
        elif spec in _MYSQL_TOKENS:
            out.append(_MYSQL_TOKENS[spec])
        else:
            raise TimestampFormatError(f"unsupported specifier %{spec} in {fmt!r}; use %Y %m %d %H %i %s %f %T %%")
        i += 2
    return "".join(out)


def spark_pattern(fmt: str, dialect: Dialect) -> str:
    """The Spark datetime pattern that reads what ``fmt`` reads on ``dialect``'s server."""
    pattern = _postgres(fmt) if dialect is Dialect.POSTGRESQL else _mysql(fmt)
    if "yyyy" not in pattern:
        raise TimestampFormatError(f"{fmt!r} has no year: it cannot order timestamps")
    return pattern
