"""The Python transaction ids and uuids, bit for bit against the seed's SQL in a real PostgreSQL.

``SEED_SQL`` below is the seed's function code copied verbatim (seeds/003, "Triggers code"): it is the
reference. It is installed into a schema of its own (``xyz_seed``, reached through ``search_path``),
next to the functions ``ngsi_assets.sinks.history_pg.install`` creates in ``public``, and both are
fed the same 1,000+ random and edge inputs in one query each (arrays and ``unnest``).
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg2
import pytest

from ngsi_assets.ngsi.transactions import (
    I_MAX,
    INT8_MAX,
    INT8_MIN,
    Action,
    TnxParts,
    tnx_extract,
    tnx_max,
    tnx_min,
    tnx_of,
    tnx_timestamp,
    uuid_of,
    uuid_parts,
)
from ngsi_assets.sinks.history_pg import install

# fmt: off
SEED_SQL = r"""-- Create a unique transaction identifier from the given UTC timestamp and the given transaction id.
CREATE OR REPLACE FUNCTION xyz_tnx_of(ts timestamptz, txid int8)
    RETURNS int8
    LANGUAGE plpgsql IMMUTABLE 
    AS $$
DECLARE
    r record;
    tid int8 := (txid & x'fffffff'::int8);
BEGIN
    WITH parts AS (SELECT EXTRACT(year from ts)::int8   as "year",
                          EXTRACT(month from ts)::int8  as "month",
                          EXTRACT(day from ts)::int8    as "day",
                          EXTRACT(hour from ts)::int8   as "hour",
                          EXTRACT(minute from ts)::int8 as "minute")
    SELECT parts.* INTO r FROM parts;
    RETURN ((r.year - 2000) << 52)
               | (r.month << 48)
               | (r.day << 43)
               | (r.hour << 38)
               | (r.minute << 32)
               | ((tid >> 12) << 16)
               | (4::int8 << 12)
               | (tid & x'fff'::int8);
END;
$$;

-- Create the minimal unique transaction identifier for the given UTC timestamp.
CREATE OR REPLACE FUNCTION xyz_tnx_min(ts timestamptz)
    RETURNS int8
    LANGUAGE 'plpgsql' IMMUTABLE
AS $$
BEGIN
    RETURN xyz_tnx_of(ts, 0::int8);
END
$$;

-- Create the maximal unique transaction identifier for the given UTC timestamp.
CREATE OR REPLACE FUNCTION xyz_tnx_max(ts timestamptz)
    RETURNS int8
    LANGUAGE 'plpgsql' IMMUTABLE
AS $$
BEGIN
    RETURN xyz_tnx_of(ts, x'7fffffffffffffff'::int8);
END
$$;

-- Create the unique transaction identifier for the current transaction.
CREATE OR REPLACE FUNCTION xyz_tnx_current()
    RETURNS int8
    LANGUAGE 'plpgsql' STABLE
    AS $$
BEGIN
    RETURN xyz_tnx_of(current_timestamp, txid_current());
END
$$;

-- Split the given unique transaction identifier into its part.
CREATE OR REPLACE FUNCTION xyz_tnx_extract(tnx int8)
    RETURNS TABLE
            (
                year    int8,
                month   int8,
                day     int8,
                hour    int8,
                minute  int8,
                txid    int8
            )
    LANGUAGE 'plpgsql' IMMUTABLE 
AS
$$
BEGIN
    RETURN QUERY SELECT 2000 + ((tnx >> 52) & x'ff'::int8)                           as "year",
                        ((tnx >> 48) & x'f'::int8)                                   as "month",
                        ((tnx >> 43) & x'1f'::int8)                                  as "day",
                        (tnx >> 38) & x'1f'::int8                                    as "hour",
                        (tnx >> 32) & x'3f'::int8                                    as "minute",
                        (((tnx >> 16) & x'ffff'::int8) << 12 | (tnx & x'fff'::int8)) as "txid";
END;
$$;

-- Create a UUID from the given unique transaction identifier and the given sequence.
CREATE OR REPLACE FUNCTION xyz_uuid_of(tnx int8, i int8)
    RETURNS uuid
    LANGUAGE 'plpgsql' IMMUTABLE
    AS
$BODY$
DECLARE
    raw_uuid bytea; 
BEGIN
    raw_uuid := set_byte('\x00000000000000000000000000000000'::bytea, 0, ((tnx >> 56) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 1, ((tnx >> 48) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 2, ((tnx >> 40) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 3, ((tnx >> 32) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 4, ((tnx >> 24) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 5, ((tnx >> 16) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 6, ((tnx >> 8) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 7, (tnx & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 8, (((i >> 56) & x'3f'::int8) | 128)::int);
    raw_uuid := set_byte(raw_uuid, 9, ((i >> 48) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 10, ((i >> 40) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 11, ((i >> 32) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 12, ((i >> 24) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 13, ((i >> 16) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 14, ((i >> 8) & x'ff'::int8)::int);
    raw_uuid := set_byte(raw_uuid, 15, (i & x'ff'::int8)::int);
    RETURN CAST(ENCODE(raw_uuid, 'hex') AS UUID);
END
$BODY$;
"""  # noqa: W291  (verbatim: the seed has trailing spaces)
# fmt: on
N_RANDOM = 1200
KATHMANDU = timezone(timedelta(hours=5, minutes=45))
FIRST = datetime(2000, 1, 1, tzinfo=UTC)
LAST = datetime(4047, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
EDGE_TS = [
    FIRST,
    LAST,
    datetime(2000, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2047, 12, 31, 23, 59, tzinfo=UTC),
    datetime(2048, 1, 1, tzinfo=UTC),
    datetime(2048, 2, 29, 12, 30, tzinfo=UTC),
    datetime(2255, 12, 31, 23, 59, 59, tzinfo=UTC),
    datetime(2256, 1, 1, tzinfo=UTC),
    datetime(3071, 6, 15, 7, 7, 7, tzinfo=UTC),
    datetime(4047, 1, 1, tzinfo=UTC),
    # Aware but not UTC: the UTC fields count (2026-11-22 02:15 UTC).
    datetime(2026, 11, 22, 8, 0, tzinfo=KATHMANDU),
]
EDGE_COUNTERS = [0, 1, 0xFFF, 0x1000, 0xFFFFFFF, 0x10000000, 0x10000FFF, 2**40 + 5, INT8_MAX, INT8_MIN, -1, -(2**28)]
EDGE_I = [0, 1, 0xFF, 2**56 - 1, 2**56, 2**61, I_MAX]


def _inputs() -> list[tuple[datetime, int, int, int]]:
    """(ts, counter, i, any_tnx): edge values crossed, then seeded random ones over the whole ranges."""
    rng = random.Random(20261122)
    span_us = int((LAST - FIRST) / timedelta(microseconds=1))
    out = []
    for k, ts in enumerate(EDGE_TS):
        for j, c in enumerate(EDGE_COUNTERS):
            out.append((ts, c, EDGE_I[(k + j) % len(EDGE_I)], [0, -1, INT8_MIN, INT8_MAX, 1][(k * j) % 5]))
    for _ in range(N_RANDOM):
        ts = FIRST + timedelta(microseconds=rng.randrange(span_us))
        counter = rng.choice([rng.randrange(2**28), rng.randrange(2**32), rng.randrange(INT8_MIN, INT8_MAX + 1)])
        i = rng.choice([rng.randrange(2**20), rng.randrange(I_MAX + 1)])
        out.append((ts, counter, i, rng.randrange(INT8_MIN, INT8_MAX + 1)))
    return out


INPUTS = _inputs()


def _connect(url: str, time_zone: str = "UTC") -> Any:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SET TIME ZONE %s", (time_zone,))
    return conn


def _ids_query(cur: Any, search_path: str) -> list[tuple]:
    """(tnx_of, tnx_min, tnx_max, uuid_of(tnx_of, i), uuid_of(any_tnx, i)) per input, from the SQL functions."""
    cur.execute(f"SET search_path = {search_path}")
    cur.execute(
        """SELECT xyz_tnx_of(ts, c), xyz_tnx_min(ts), xyz_tnx_max(ts),
                  xyz_uuid_of(xyz_tnx_of(ts, c), i)::text, xyz_uuid_of(a, i)::text
           FROM unnest(%s::timestamptz[], %s::int8[], %s::int8[], %s::int8[]) WITH ORDINALITY AS t(ts, c, i, a, n)
           ORDER BY n""",
        ([r[0] for r in INPUTS], [r[1] for r in INPUTS], [r[2] for r in INPUTS], [r[3] for r in INPUTS]),
    )
    return cur.fetchall()


def _extract_query(cur: Any, search_path: str, tnxs: list[int]) -> list[tuple]:
    cur.execute(f"SET search_path = {search_path}")
    cur.execute(
        """SELECT e.year, e.month, e.day, e.hour, e.minute, e.txid
           FROM unnest(%s::int8[]) WITH ORDINALITY AS t(tnx, n), LATERAL xyz_tnx_extract(t.tnx) e
           ORDER BY n""",
        (tnxs,),
    )
    return [TnxParts(*r) for r in cur.fetchall()]


def _python_ids() -> list[tuple]:
    return [
        (tnx_of(ts, c), tnx_min(ts), tnx_max(ts), str(uuid_of(tnx_of(ts, c), i)), str(uuid_of(a, i)))
        for ts, c, i, a in INPUTS
    ]


@pytest.fixture
def seeded_db(postgres_db_url: str) -> str:
    """A fresh database with the seed's functions verbatim in ``xyz_seed`` and ours (install) in ``public``."""
    conn = _connect(postgres_db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE SCHEMA xyz_seed")
            cur.execute("SET search_path = xyz_seed")
            cur.execute(SEED_SQL)
        conn.autocommit = False
        install(conn, "ngsi_history")
        conn.commit()
    finally:
        conn.close()
    return postgres_db_url


# -- against the seed's SQL ------------------------------------------------------------------------


@pytest.mark.integration
def test_python_equals_the_seed_sql_bit_for_bit(seeded_db: str) -> None:
    assert len(INPUTS) >= 1000
    python = _python_ids()
    conn = _connect(seeded_db)
    try:
        with conn.cursor() as cur:
            seed = _ids_query(cur, "xyz_seed")
            ours = _ids_query(cur, "public")
    finally:
        conn.close()
    assert len(seed) == len(INPUTS)
    mismatches = [(INPUTS[k], python[k], seed[k]) for k in range(len(INPUTS)) if python[k] != seed[k]]
    assert mismatches == []
    assert ours == seed
    # The edge years sit where the seed says: 2048 stays positive, the sign bit is never reached.
    assert tnx_min(datetime(2048, 1, 1, tzinfo=UTC)) == (48 << 52) | (1 << 48) | (1 << 43) | (4 << 12)
    assert tnx_max(LAST) == (2047 << 52) | (12 << 48) | (31 << 43) | (23 << 38) | (59 << 32) | 0xFFFF_4FFF
    assert all(row[0] >= 0 for row in python)


@pytest.mark.integration
def test_extract_equals_the_seed_up_to_2255_and_round_trips_beyond(seeded_db: str) -> None:
    tnxs = [tnx_of(ts, c) for ts, c, _, _ in INPUTS]
    conn = _connect(seeded_db)
    try:
        with conn.cursor() as cur:
            seed = _extract_query(cur, "xyz_seed", tnxs)
            ours = _extract_query(cur, "public", tnxs)
    finally:
        conn.close()
    python = [tnx_extract(t) for t in tnxs]
    assert ours == python
    early = [k for k, (ts, *_rest) in enumerate(INPUTS) if ts.astimezone(UTC).year <= 2255]
    late = [k for k in range(len(INPUTS)) if k not in set(early)]
    assert len(early) >= 50 and len(late) >= 500
    assert [seed[k] for k in early] == [python[k] for k in early]
    # Every extract round-trips the input's UTC minute and 28-bit counter.
    for (ts, c, _, _), parts in zip(INPUTS, python, strict=True):
        utc = ts.astimezone(UTC)
        assert parts == TnxParts(utc.year, utc.month, utc.day, utc.hour, utc.minute, c & 0xFFFFFFF)
    # The seed's 8-bit year mask: 2256 reads as 2000, 2300 as 2044; ours keeps 12 bits.
    wrong = [k for k in late if seed[k].year != python[k].year]
    assert wrong == late
    assert all(seed[k].year == 2000 + (python[k].year - 2000) % 256 for k in late)
    assert all(seed[k][1:] == python[k][1:] for k in late)


@pytest.mark.integration
def test_installed_functions_pin_utc_where_the_seed_reads_the_session_time_zone(seeded_db: str) -> None:
    utc_conn, ktm_conn = _connect(seeded_db), _connect(seeded_db, "Asia/Kathmandu")
    try:
        with utc_conn.cursor() as cur:
            seed_utc = _ids_query(cur, "xyz_seed")
        with ktm_conn.cursor() as cur:
            ours_ktm = _ids_query(cur, "public")
            seed_ktm = _ids_query(cur, "xyz_seed")
    finally:
        utc_conn.close()
        ktm_conn.close()
    assert ours_ktm == seed_utc == _python_ids()
    # The seed's functions in a +05:45 session encode the local wall-clock minute instead.
    expected_local = []
    for ts, c, _, _ in INPUTS:
        local = ts.astimezone(KATHMANDU)
        expected_local.append(tnx_of(local.replace(tzinfo=UTC), c) if local.year <= 4047 else None)
    compared = [k for k, e in enumerate(expected_local) if e is not None]
    assert len(compared) >= len(INPUTS) - len(EDGE_COUNTERS) - 5  # LAST is already 4048 in Kathmandu
    assert [seed_ktm[k][0] for k in compared] == [expected_local[k] for k in compared]
    assert sum(seed_ktm[k][0] != seed_utc[k][0] for k in compared) == len(compared)


@pytest.mark.integration
def test_sql_masks_i_and_counter_where_python_refuses_i(seeded_db: str) -> None:
    conn = _connect(seeded_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET search_path = xyz_seed")
            cur.execute("SELECT xyz_uuid_of(7, %s)::text, xyz_uuid_of(7, %s)::text", (2**62, -1))
            over, negative = cur.fetchone()
    finally:
        conn.close()
    assert over == str(uuid_of(7, 0))  # bit 62 dropped: two different i would share a uuid
    assert negative == str(uuid_of(7, I_MAX))
    with pytest.raises(ValueError, match="outside 0..2"):
        uuid_of(7, 2**62)
    with pytest.raises(ValueError, match="outside 0..2"):
        uuid_of(7, -1)


# -- pure unit tests -------------------------------------------------------------------------------


def test_known_vector() -> None:
    ts = datetime(2026, 11, 22, 8, 5, 59, 999999, tzinfo=UTC)
    tnx = tnx_of(ts, 123456789)
    tid_high, tid_low = divmod(123456789, 4096)
    assert tnx == (26 << 52) | (11 << 48) | (22 << 43) | (8 << 38) | (5 << 32) | (tid_high << 16) | (4 << 12) | tid_low
    assert tnx == 0x01AB_B205_75BC_4D15
    assert str(uuid_of(tnx, 42)) == "01abb205-75bc-4d15-8000-00000000002a"
    assert str(uuid_of(tnx, I_MAX)) == "01abb205-75bc-4d15-bfff-ffffffffffff"
    assert uuid_of(tnx, 42).version == 4 and uuid_of(tnx, 42).variant == uuid.RFC_4122
    assert tnx_extract(tnx) == TnxParts(2026, 11, 22, 8, 5, 123456789)
    assert tnx_timestamp(tnx) == datetime(2026, 11, 22, 8, 5, tzinfo=UTC)
    assert tnx_min(ts) == tnx_of(ts, 0) == 0x01AB_B205_0000_4000
    assert tnx_max(ts) == 0x01AB_B205_FFFF_4FFF
    assert uuid_parts(uuid_of(tnx, 42)) == (tnx, 42)
    assert uuid_parts("01abb205-75bc-4d15-bfff-ffffffffffff") == (tnx, I_MAX)


def test_counter_masking_follows_int8_two_complement() -> None:
    ts = datetime(2030, 1, 1, tzinfo=UTC)
    assert tnx_of(ts, -1) == tnx_of(ts, 0xFFFFFFF) == tnx_max(ts)
    assert tnx_of(ts, 0x10000000) == tnx_min(ts)
    assert tnx_of(ts, INT8_MIN) == tnx_min(ts)
    assert tnx_extract(tnx_of(ts, -(2**28) + 5)).txid == 5


def test_uuid_round_trip_of_negative_tnx() -> None:
    assert uuid_parts(uuid_of(INT8_MIN, 0)) == (INT8_MIN, 0)
    assert str(uuid_of(-1, 0)) == "ffffffff-ffff-ffff-8000-000000000000"
    assert uuid_parts(uuid_of(-1, 2**56)) == (-1, 2**56)


def test_actions() -> None:
    assert [(a.name, int(a)) for a in Action] == [("CREATE", 0), ("UPDATE", 1), ("DELETE", 2), ("PURGE", 3)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tnx_of(datetime(2026, 1, 1), 1), "naive datetime"),
        (lambda: tnx_of(datetime(1999, 12, 31, 23, 59, tzinfo=UTC), 1), "UTC year 1999, outside 2000..4047"),
        (lambda: tnx_of(datetime(2000, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), 1), "UTC year 1999"),
        (lambda: tnx_of(datetime(4048, 1, 1, tzinfo=UTC), 1), "UTC year 4048"),
        (lambda: tnx_of("2026-01-01T00:00:00Z", 1), "ts must be a datetime"),
        (lambda: tnx_of(FIRST, 2**63), "counter 9223372036854775808 is outside the int8 range"),
        (lambda: tnx_of(FIRST, INT8_MIN - 1), "outside the int8 range"),
        (lambda: tnx_of(FIRST, 1.0), "counter must be an int, got float"),
        (lambda: tnx_of(FIRST, True), "counter must be an int, got bool"),
        (lambda: tnx_min(datetime(2026, 1, 1)), "naive datetime"),
        (lambda: tnx_extract(2**63), "tnx 9223372036854775808 is outside the int8 range"),
        (lambda: tnx_timestamp(0), "does not encode a valid UTC minute"),
        (lambda: uuid_of(2**64, 0), "tnx .* is outside the int8 range"),
        (lambda: uuid_of(0, -1), "i -1 is outside 0..2\\*\\*62-1"),
        (lambda: uuid_of(0, 2**62), "is outside 0..2\\*\\*62-1"),
        (lambda: uuid_of(0, "1"), "i must be an int, got str"),
        (lambda: uuid_parts("not-a-uuid"), "is not a uuid"),
        (lambda: uuid_parts(uuid.UUID("01abb205-75bc-4d15-c000-00000000002a")), "byte 8 is 0xc0"),
        (lambda: uuid_parts(uuid.UUID("01abb205-75bc-4d15-0000-00000000002a")), "top bits must be 10"),
        (lambda: uuid_parts(42), "expected a uuid, got int"),
    ],
)
def test_bad_inputs_are_refused_with_the_reason(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
