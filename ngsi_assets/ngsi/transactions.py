"""XYZ Hub history identifiers (seed 003): one 64-bit transaction id per (UTC minute, counter), one uuid per (tnx, i).

Pure Python twins of the seed's PostgreSQL functions, bit for bit (``tests/ngsi/test_transactions.py``
runs the seed's SQL verbatim in a real PostgreSQL and compares):

- :func:`tnx_of` = ``xyz_tnx_of(ts, txid)``: year-2000 (12 bits) << 52 | month << 48 | day << 43 |
  hour << 38 | minute << 32 | (tid >> 12) << 16 | 4 << 12 | (tid & 0xfff), with tid = txid & 0xfffffff.
  The fields are those of ``ts`` in UTC. The 12-bit year reaches bit 63 only for years >= 4048, which
  are refused, so within 2000..4047 every tnx is a non-negative int8.
- :func:`tnx_min` / :func:`tnx_max` = ``xyz_tnx_min`` / ``xyz_tnx_max``: counter 0 and counter
  0x7fffffffffffffff (masked to 0xfffffff).
- :func:`tnx_extract` = ``xyz_tnx_extract`` with one fix: the seed masks the year with ``x'ff'`` (8
  bits) although :func:`tnx_of` encodes 12 bits, so the seed reads years >= 2256 wrong (2256 -> 2000).
  Here, and in the SQL function ``ngsi_assets.sinks.history_pg.install`` creates, the mask is
  ``x'fff'`` (the seed's meaning); for years 2000..2255 both agree.
- :func:`uuid_of` = ``xyz_uuid_of(tnx, i)``: bytes 0-7 the tnx big-endian (so byte 6 carries the
  version nibble 4 that tnx_of puts at bits 12-15), byte 8 = ``((i >> 56) & 0x3f) | 0x80`` (variant
  1), bytes 9-15 the low 56 bits of ``i``. The seed's prose says "i (60 bit)" but its code keeps 62
  bits (6 + 56); the code is followed.

Validation (ValueError naming the problem) is stricter than SQL, which silently masks or wraps:
``ts`` must be timezone-aware (a naive datetime has no defined UTC minute) with a UTC year in
2000..4047; the counter and tnx must be int8 values (any int8 counter is accepted and masked to 28
bits exactly as ``txid & x'fffffff'`` masks it, negative ones included); ``i`` must be in 0..2**62-1
(SQL would drop the higher bits and make two sequences share a uuid).

No Spark, no database: the Spark column twins live in ``ngsi_assets.transforms.transaction_ids``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import IntEnum
from typing import NamedTuple

INT8_MIN = -(2**63)
INT8_MAX = 2**63 - 1
YEAR_MIN = 2000
YEAR_MAX = 4047  # 2000 + 0xfff
COUNTER_MASK = 0xFFFFFFF  # the 28 bits of the transaction counter kept (txid & x'fffffff')
I_MAX = 2**62 - 1  # 6 bits in byte 8 + 56 bits in bytes 9-15 of the uuid


class Action(IntEnum):
    """What a history row did to its feature (the seed's ``action`` column)."""

    CREATE = 0
    UPDATE = 1
    DELETE = 2
    PURGE = 3


class TnxParts(NamedTuple):
    """The fields packed into a transaction id: its UTC minute and 28-bit counter."""

    year: int
    month: int
    day: int
    hour: int
    minute: int
    txid: int


def _int8(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {type(value).__name__}")
    if not INT8_MIN <= value <= INT8_MAX:
        raise ValueError(f"{what} {value} is outside the int8 range {INT8_MIN}..{INT8_MAX}")
    return value


def _signed64(value: int) -> int:
    """Two's-complement reading of the low 64 bits (what PostgreSQL's int8 operators leave)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return value - 2**64 if value >= 2**63 else value


def _utc(ts: datetime) -> datetime:
    if not isinstance(ts, datetime):
        raise ValueError(f"ts must be a datetime, got {type(ts).__name__}")
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"ts {ts.isoformat()} is a naive datetime: give a timezone-aware one (its UTC minute is used)")
    utc = ts.astimezone(UTC)
    if not YEAR_MIN <= utc.year <= YEAR_MAX:
        raise ValueError(f"ts {ts.isoformat()} has UTC year {utc.year}, outside {YEAR_MIN}..{YEAR_MAX}")
    return utc


def tnx_of(ts: datetime, counter: int) -> int:
    """The transaction id of the UTC minute of ``ts`` and ``counter`` (masked to 28 bits), as an int8."""
    utc = _utc(ts)
    tid = _int8(counter, "counter") & COUNTER_MASK
    value = (
        ((utc.year - 2000) << 52)
        | (utc.month << 48)
        | (utc.day << 43)
        | (utc.hour << 38)
        | (utc.minute << 32)
        | ((tid >> 12) << 16)
        | (4 << 12)
        | (tid & 0xFFF)
    )
    return _signed64(value)


def tnx_min(ts: datetime) -> int:
    """The smallest transaction id of the UTC minute of ``ts`` (counter 0)."""
    return tnx_of(ts, 0)


def tnx_max(ts: datetime) -> int:
    """The largest transaction id of the UTC minute of ``ts`` (counter 0x7fffffffffffffff, masked)."""
    return tnx_of(ts, INT8_MAX)


def tnx_extract(tnx: int) -> TnxParts:
    """The fields of ``tnx`` (12-bit year: the seed's 8-bit mask is a bug, see the module docstring).

    Pure bit extraction like the SQL function: fields are not checked for being a valid date.
    """
    _int8(tnx, "tnx")
    return TnxParts(
        year=2000 + ((tnx >> 52) & 0xFFF),
        month=(tnx >> 48) & 0xF,
        day=(tnx >> 43) & 0x1F,
        hour=(tnx >> 38) & 0x1F,
        minute=(tnx >> 32) & 0x3F,
        txid=(((tnx >> 16) & 0xFFFF) << 12) | (tnx & 0xFFF),
    )


def tnx_timestamp(tnx: int) -> datetime:
    """The UTC minute of ``tnx`` as an aware datetime; ValueError if its fields are not a valid date."""
    p = tnx_extract(tnx)
    try:
        return datetime(p.year, p.month, p.day, p.hour, p.minute, tzinfo=UTC)
    except ValueError as exc:
        raise ValueError(f"tnx {tnx} does not encode a valid UTC minute ({p}): {exc}") from exc


def uuid_of(tnx: int, i: int) -> uuid.UUID:
    """The uuid of the row ``i`` written in transaction ``tnx`` (the seed's byte layout)."""
    _int8(tnx, "tnx")
    if isinstance(i, bool) or not isinstance(i, int):
        raise ValueError(f"i must be an int, got {type(i).__name__}")
    if not 0 <= i <= I_MAX:
        raise ValueError(f"i {i} is outside 0..2**62-1: the uuid keeps 62 bits of it")
    raw = (tnx & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big")
    raw += bytes([((i >> 56) & 0x3F) | 0x80]) + (i & 0xFF_FFFF_FFFF_FFFF).to_bytes(7, "big")
    return uuid.UUID(bytes=raw)


def uuid_parts(u: uuid.UUID | str) -> tuple[int, int]:
    """``(tnx, i)`` of a uuid made by :func:`uuid_of`; ValueError if its variant bits are not ``10``."""
    if isinstance(u, str):
        try:
            u = uuid.UUID(u)
        except ValueError as exc:
            raise ValueError(f"{u!r} is not a uuid: {exc}") from exc
    if not isinstance(u, uuid.UUID):
        raise ValueError(f"expected a uuid, got {type(u).__name__}")
    raw = u.bytes
    if raw[8] & 0xC0 != 0x80:
        raise ValueError(f"uuid {u} was not made by uuid_of: byte 8 is {raw[8]:#04x}, its top bits must be 10")
    tnx = _signed64(int.from_bytes(raw[:8], "big"))
    i = ((raw[8] & 0x3F) << 56) | int.from_bytes(raw[9:], "big")
    return tnx, i
