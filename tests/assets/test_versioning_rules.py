"""Seed 004, section 3 at the Spark level: one test per rule, exact tables after real versioning runs.

Two module-scoped lakes keep the number of runs low (each run costs tens of seconds):

- ``rules``: one run over one hour holding products (conversions, conversion errors, explicit null vs
  missing field, same effective timestamp, a status-5 duplicate), persons written by three source
  systems of different priorities, stores (refresh messages), readings (unique facts) and a catalog
  (an export entity);
- ``orders``: customers, orders linking to them and order lines as children, over three runs: hour 10
  (links resolved, null, unmatched, ambiguous; children), hour 11 (the missing customer arrives), then
  hour 10 again (the reprocessing path: the waiting order resolves, nothing else changes).

The fold's rules are unit-tested in ``tests/ngsi/test_versioning.py``; here they are checked end to end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from ngsi_assets.assets.versioned_entities import EXPORTS_DS
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from ngsi_assets.transforms.versioned_entities import guid_of
from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, log_rows, materialize_versioned, process, schema_of, table_rows

H10 = "2026-03-01-10:00"
H11 = "2026-03-01-11:00"
STANDARD = ["guid", "valid_from_timestamp", "valid_to_timestamp", "deleted_indicator"]
TAIL = ["source_message", "field_provenance"]


def at(n: int) -> str:
    """Effective timestamp number n: 2019-06-05 at (9 + n) o'clock."""
    return f"2019-06-05T{9 + n:02d}:00:00"


T = {n: datetime.fromisoformat(at(n)) for n in range(12)}


def pv(**fields: str | tuple[str, int]) -> str:
    """field_provenance JSON: guid first, then fields by name; a bare message id means priority 0."""

    def entry(v: str | tuple[str, int]) -> dict[str, Any]:
        m, p = (v, 0) if isinstance(v, str) else v
        return {"m": m, "p": p}

    out = {"guid": entry(fields.pop("guid"))}
    out.update({name: entry(fields[name]) for name in sorted(fields)})
    return json.dumps(out, separators=(",", ":"))


def key_guid(entity: str, *key: str) -> str:
    return guid_of(entity, json.dumps(list(key), separators=(",", ":")))


def rows(*expected: tuple) -> list[tuple]:
    return sorted(expected, key=repr)


def store(
    spark: SparkSession, lake: LakeResource, messages: list[Msg], overrides: dict[str, dict] | None = None
) -> list[str]:
    """Write messages into the message store (replacing their hours); ``overrides`` patch columns by message id."""
    hours = sorted({m.hour for m in messages})
    data = []
    for i, m in enumerate(messages):
        row = m.row(minute=i % 60)
        row.update((overrides or {}).get(m.mid, {}))
        data.append(row)
    lake.replace_partitions(spark.createDataFrame(data, MESSAGE_STORE), "message_store", hours)
    return hours


@dataclass
class Snapshot:
    tables: dict[str, list[tuple]]
    log: dict[str, tuple[int, str | None]]


# ---------------------------------------------------------------------------------------------------
# The "rules" lake: one run


RULES_SCHEMA = schema_of(
    {
        "entities": {
            "product": {
                "fields": {
                    "product_number": {"type": "integer", "key": True},
                    "product_description": {"type": "text", "length": 10},
                    "price": {"type": "decimal", "precision": 8, "scale": 2},
                    "stock": {"type": "integer"},
                    "active": {"type": "boolean"},
                    "launched": {"type": "timestamp"},
                }
            },
            "person": {
                "fields": {
                    "person_id": {"type": "text", "key": True},
                    "name": {"type": "text"},
                    "email": {"type": "text"},
                }
            },
            "store": {
                "fields": {
                    "store_code": {"type": "text", "key": True},
                    "store_name": {"type": "text"},
                    "floors": {"type": "integer"},
                }
            },
            "reading": {
                "unique": True,
                "uniqueIdentifier": "batch",
                "uniqueSequence": "seq",
                "fields": {
                    "batch": {"type": "text", "key": True},
                    "seq": {"type": "integer", "key": True},
                    "sensor": {"type": "text"},
                    "value": {"type": "decimal", "precision": 6, "scale": 1},
                },
            },
            "catalog": {
                "export": True,
                "exportIdentifier": "code",
                "fields": {"code": {"type": "text", "key": True}, "label": {"type": "text"}},
            },
        },
        "sourceSystems": {
            # web writes every person field at priority 2; hr at 5, except email at 1; admin at 9.
            "web": {"mappings": {"person": [{"reference": "person", "priority": 2}]}},
            "hr": {
                "mappings": {
                    "person": [
                        {
                            "reference": "person",
                            "priority": 5,
                            "fields": [
                                {"reference": "person_id"},
                                {"reference": "name"},
                                {"reference": "email", "priority": 1},
                            ],
                        }
                    ]
                }
            },
            "admin": {"mappings": {"person": [{"reference": "person", "priority": 9}]}},
        },
    }
)

PRODUCT_COLUMNS = [
    *STANDARD,
    "product_number",
    "product_description",
    "price",
    "stock",
    "active",
    "launched",
    *TAIL,
]
PERSON_COLUMNS = [*STANDARD, "person_id", "name", "email", *TAIL]
STORE_COLUMNS = [*STANDARD, "store_code", "store_name", "floors", *TAIL]
READING_COLUMNS = [*STANDARD, "batch", "seq", "sensor", "value", *TAIL]
CATALOG_COLUMNS = [*STANDARD, "code", "label", *TAIL]


def _person(mid: str, source: str, n: int, *records: dict[str, Any]) -> Msg:
    return Msg(mid, "person", at(n), list(records), hour=H10, source=source)


RULES_MESSAGES = [
    # Conversions: strings <-> numbers, rounding, decimal scale, boolean words, truncation, timestamps;
    # record 3 cannot be converted: the message gets status 4, its records 1, 2 and 4 go through.
    Msg(
        "pc1",
        "product",
        at(1),
        [
            {
                "product_number": "101",
                "product_description": "Breville Toaster Deluxe",
                "price": 19.999,
                "stock": 12.5,
                "active": "yes",
                "launched": "2019-06-05T10:00:00+02:00",
            },
            {
                "product_number": 102,
                "product_description": 12345,
                "price": "2.345",
                "stock": -2.5,
                "active": "OFF",
                "launched": "2019-06-05",
            },
            {"product_number": 103, "stock": "lots"},
            {"product_number": 104.4, "active": 1, "price": 7},
        ],
        hour=H10,
    ),
    Msg("pc2", "product", at(1), [{"product_number": 105, "product_description": "Kettle", "active": "n"}], hour=H10),
    # A bad deleted_indicator and a missing key: both records fail, each named in the error text.
    Msg(
        "pbad",
        "product",
        at(1),
        [{"product_number": 107, "deleted_indicator": "maybe"}, {"product_description": "no key"}],
        hour=H10,
    ),
    # An explicit null overwrites; a missing field keeps its value.
    Msg(
        "pn1",
        "product",
        at(2),
        [{"product_number": 101, "product_description": None}, {"product_number": 102, "price": 3}],
        hour=H10,
    ),
    # Two messages with the same effective timestamp for one key: the first (by message id) wins.
    Msg("ps_a", "product", at(3), [{"product_number": 106, "product_description": "first"}], hour=H10),
    Msg("ps_b", "product", at(3), [{"product_number": 106, "product_description": "second"}], hour=H10),
    # A duplicate (status 5 in the message store): never processed.
    Msg("pdup", "product", at(3), [{"product_number": 999, "product_description": "dup"}], hour=H10),
    # Priorities: web 2, hr 5 (email 1), admin 9.
    _person("w1", "web", 1, {"person_id": "P1", "name": "Ann", "email": "ann@web"}, {"person_id": "P2", "name": "Bob"}),
    _person("h2", "hr", 2, {"person_id": "P1", "name": "Anne", "email": "anne@hr"}, {"person_id": "P2", "name": "Bob"}),
    _person("w3", "web", 3, {"person_id": "P1", "name": "Annie", "email": "annie@web"}),
    _person("w4", "web", 4, {"person_id": "P1", "deleted_indicator": True}),
    _person("h5", "hr", 5, {"person_id": "P1", "deleted_indicator": True}),
    _person("w6", "web", 6, {"person_id": "P1", "name": "Zed"}),
    _person("a7", "admin", 7, {"person_id": "P1", "deleted_indicator": True}),
    _person("h8", "hr", 8, {"person_id": "P1", "name": "Back"}),
    _person("h9", "hr", 9, {"person_id": "P1", "deleted_indicator": True}),
    _person("a10", "admin", 10, {"person_id": "P1", "name": "Ann again"}),
    # Refresh: s2 replaces the stores (C is deleted; B's record fails, which must not delete B),
    # the empty s3 deletes them all.
    Msg(
        "s1",
        "store",
        at(1),
        [
            {"store_code": "A", "store_name": "Alpha"},
            {"store_code": "B", "store_name": "Beta"},
            {"store_code": "C", "store_name": "Gamma"},
        ],
        hour=H10,
    ),
    Msg(
        "s2",
        "store",
        at(2),
        [{"store_code": "A", "store_name": "Alpha2"}, {"store_code": "B", "store_name": "Beta", "floors": "many"}],
        hour=H10,
        refresh=True,
    ),
    Msg("s3", "store", at(3), [], hour=H10, refresh=True),
    # Unique facts: identical data (even the same timestamp) gives separate rows.
    Msg("u1", "reading", at(1), [{"sensor": "s1", "value": 1.5}, {"sensor": "s1", "value": 1.5}], hour=H10),
    Msg("u2", "reading", at(1), [{"sensor": "s1", "value": 1.5}, {"sensor": "s1", "value": 1.5}], hour=H10),
    # Export: X and Y inserted, then Y deleted and X updated.
    Msg("e1", "catalog", at(1), [{"code": "X", "label": "Ex"}, {"code": "Y", "label": "Why"}], hour=H10),
    Msg("e2", "catalog", at(2), [{"code": "Y", "deleted_indicator": True}, {"code": "X", "label": "Ex2"}], hour=H10),
]


@pytest.fixture(scope="module")
def rules(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    lake = LakeResource(root=str(tmp_path_factory.mktemp("rules") / "lake"))
    hours = store(spark, lake, RULES_MESSAGES, {"pdup": {"status": 5, "guid": "dup-guid"}})
    process(spark, lake, RULES_SCHEMA, hours)
    columns = {
        "product": PRODUCT_COLUMNS,
        "person": PERSON_COLUMNS,
        "store": STORE_COLUMNS,
        "reading": READING_COLUMNS,
        "catalog": CATALOG_COLUMNS,
    }
    tables = {name: table_rows(spark, lake, name, cols) for name, cols in columns.items()}
    exports = lake.read_folders(spark, EXPORTS_DS, "bucket", None, subfolder=entity_folder("catalog"))
    tables["catalog_export"] = (
        [] if exports is None else sorted((tuple(r) for r in exports.drop("bucket").collect()), key=repr)
    )
    tables["catalog_export_columns"] = [] if exports is None else [tuple(exports.drop("bucket").columns)]
    return Snapshot(tables, log_rows(spark, lake))


G101, G102, G104, G105, G106 = (key_guid("product", n) for n in ("101", "102", "104", "105", "106"))
TOASTER_PROV = pv(
    guid="pc1", active="pc1", launched="pc1", price="pc1", product_description="pc1", product_number="pc1", stock="pc1"
)


def test_conversions_end_to_end(rules: Snapshot) -> None:
    """Numbers from strings and strings from numbers, rounding, scale, boolean words, truncation, timestamps."""
    first = {r[0]: r for r in rules.tables["product"] if r[1] == T[1]}
    assert first[G101] == (
        G101, T[1], T[2], False, 101, "Breville T", Decimal("20.00"), 13, True, datetime(2019, 6, 5, 8, 0), "pc1",
        TOASTER_PROV,
    )  # fmt: skip
    assert first[G102] == (
        G102, T[1], T[2], False, 102, "12345", Decimal("2.35"), -3, False, datetime(2019, 6, 5), "pc1", TOASTER_PROV,
    )  # fmt: skip
    assert first[G104] == (
        G104, T[1], None, False, 104, None, Decimal("7.00"), None, True, None, "pc1",
        pv(guid="pc1", active="pc1", price="pc1", product_number="pc1"),
    )  # fmt: skip
    assert first[G105] == (
        G105, T[1], None, False, 105, "Kettle", None, None, False, None, "pc2",
        pv(guid="pc2", active="pc2", product_description="pc2", product_number="pc2"),
    )  # fmt: skip


def test_conversion_error_is_recorded_and_the_rest_goes_through(rules: Snapshot) -> None:
    """A value that cannot be converted fails its record only: status 4 with the field and value named."""
    assert {r[4] for r in rules.tables["product"]} == {101, 102, 104, 105, 106}  # not 103, 107, 999
    assert rules.log["pc1"] == (4, "product record 3: stock: cannot convert 'lots' to integer")
    assert rules.log["pbad"] == (
        4,
        "product record 1: deleted_indicator: cannot convert 'maybe' to boolean"
        " | product record 2: key field product_number: missing or null",
    )
    assert rules.log["pc2"] == (3, None)
    assert rules.log["pn1"] == (3, None)


def test_explicit_null_overwrites_and_missing_field_keeps(rules: Snapshot) -> None:
    """pn1 nulls 101's description (provenance pn1) and sets 102's price; fields it lacks keep their values."""
    assert [r for r in rules.tables["product"] if r[0] in (G101, G102)] == rows(
        (G101, T[1], T[2], False, 101, "Breville T", Decimal("20.00"), 13, True, datetime(2019, 6, 5, 8, 0), "pc1",
         TOASTER_PROV),
        (G101, T[2], None, False, 101, None, Decimal("20.00"), 13, True, datetime(2019, 6, 5, 8, 0), "pn1",
         pv(guid="pc1", active="pc1", launched="pc1", price="pc1", product_description="pn1", product_number="pc1",
            stock="pc1")),
        (G102, T[1], T[2], False, 102, "12345", Decimal("2.35"), -3, False, datetime(2019, 6, 5), "pc1", TOASTER_PROV),
        (G102, T[2], None, False, 102, "12345", Decimal("3.00"), -3, False, datetime(2019, 6, 5), "pn1",
         pv(guid="pc1", active="pc1", launched="pc1", price="pn1", product_description="pc1", product_number="pc1",
            stock="pc1")),
    )  # fmt: skip


def test_same_effective_timestamp_first_message_wins(rules: Snapshot) -> None:
    """ps_b's record has the effective timestamp of the row ps_a made: it is ignored (but processed)."""
    assert [r for r in rules.tables["product"] if r[0] == G106] == [
        (G106, T[3], None, False, 106, "first", None, None, None, None, "ps_a",
         pv(guid="ps_a", product_description="ps_a", product_number="ps_a")),
    ]  # fmt: skip
    assert rules.log["ps_a"] == (3, None)
    assert rules.log["ps_b"] == (3, None)


def test_duplicate_guid_message_is_not_processed(rules: Snapshot) -> None:
    """A status-5 message (a duplicate guid) writes nothing and gets no log row."""
    assert "pdup" not in rules.log
    assert key_guid("product", "999") not in {r[0] for r in rules.tables["product"]}
    assert set(rules.log) == {m.mid for m in RULES_MESSAGES} - {"pdup"}


def test_priorities_of_fields_guid_delete_and_recreate(rules: Snapshot) -> None:
    """Three source systems on person: web (2), hr (5, email 1), admin (9)."""
    p1, p2 = key_guid("person", "P1"), key_guid("person", "P2")
    w1, h2, w3, h5, a7, a10 = ("w1", 2), ("h2", 5), ("w3", 2), ("h5", 5), ("a7", 9), ("a10", 9)
    assert rules.tables["person"] == rows(
        (p1, T[1], T[2], False, "P1", "Ann", "ann@web", "w1", pv(guid=w1, email=w1, name=w1, person_id=w1)),
        # hr's name (5 >= 2) wins, its email (1 < 2) does not; the guid moves to hr (5 > 2).
        (p1, T[2], T[3], False, "P1", "Anne", "ann@web", "h2", pv(guid=h2, email=w1, name=h2, person_id=w1)),
        # web's name (2 < 5) loses, its email (2 >= 2) wins; the guid stays with hr (2 <= 5).
        (p1, T[3], T[5], False, "P1", "Anne", "annie@web", "w3", pv(guid=h2, email=w3, name=h2, person_id=w1)),
        # web's delete (w4, 2 < 5) is ignored; hr's (5 >= 5) deletes; web's recreate (w6, 2 < 5) is ignored.
        (p1, T[5], T[7], True, "P1", None, None, "h5", pv(guid=h5, email=h5, name=h5, person_id=w1)),
        # Deleting a deleted row: admin (9 > 5) raises the guid; hr's recreate (h8) and delete (h9) then lose.
        (p1, T[7], T[10], True, "P1", None, None, "a7", pv(guid=a7, email=h5, name=h5, person_id=w1)),
        # admin's recreate (9 >= 9) applies; the guid stays (9 is not > 9).
        (p1, T[10], None, False, "P1", "Ann again", None, "a10", pv(guid=a7, email=h5, name=a10, person_id=w1)),
        (p2, T[1], T[2], False, "P2", "Bob", None, "w1", pv(guid=w1, name=w1, person_id=w1)),
        # A higher entity priority takes the guid even when no field changes: a new version.
        (p2, T[2], None, False, "P2", "Bob", None, "h2", pv(guid=h2, name=w1, person_id=w1)),
    )  # fmt: skip
    assert {m: rules.log[m] for m in ("w1", "h2", "w3", "w4", "h5", "w6", "a7", "h8", "h9", "a10")} == {
        m: (3, None) for m in ("w1", "h2", "w3", "w4", "h5", "w6", "a7", "h8", "h9", "a10")
    }


def test_refresh_deletes_rows_not_in_the_message(rules: Snapshot) -> None:
    """s2 (refresh) deletes C at its timestamp and updates A; B's record in s2 fails conversion, so B is
    neither updated nor deleted (the record names its row); the empty refresh s3 deletes A and B."""
    ga, gb, gc = (key_guid("store", c) for c in "ABC")
    assert rules.tables["store"] == rows(
        (ga, T[1], T[2], False, "A", "Alpha", None, "s1", pv(guid="s1", store_code="s1", store_name="s1")),
        (ga, T[2], T[3], False, "A", "Alpha2", None, "s2", pv(guid="s1", store_code="s1", store_name="s2")),
        (ga, T[3], None, True, "A", None, None, "s3", pv(guid="s3", store_code="s1", store_name="s3")),
        (gb, T[1], T[3], False, "B", "Beta", None, "s1", pv(guid="s1", store_code="s1", store_name="s1")),
        (gb, T[3], None, True, "B", None, None, "s3", pv(guid="s3", store_code="s1", store_name="s3")),
        (gc, T[1], T[2], False, "C", "Gamma", None, "s1", pv(guid="s1", store_code="s1", store_name="s1")),
        (gc, T[2], None, True, "C", None, None, "s2", pv(guid="s2", store_code="s1", store_name="s2")),
    )
    assert {m: rules.log[m] for m in ("s1", "s2", "s3")} == {
        "s1": (3, None),
        "s2": (4, "store record 2: floors: cannot convert 'many' to integer"),
        "s3": (3, None),
    }


def test_unique_facts_are_keyed_by_message_and_record_number(rules: Snapshot) -> None:
    expected = [
        (key_guid("reading", mid, str(seq)), T[1], None, False, mid, seq, "s1", Decimal("1.5"), mid,
         pv(guid=mid, batch=mid, seq=mid, sensor=mid, value=mid))
        for mid in ("u1", "u2")
        for seq in (1, 2)
    ]  # fmt: skip
    assert rules.tables["reading"] == rows(*expected)


def test_export_entity_holds_live_rows(rules: Snapshot) -> None:
    """entity_exports presents the catalog as inserts and deletes: X (updated) is there, deleted Y is not."""
    assert rules.tables["catalog_export_columns"] == [("export_id", "code", "label")]
    assert rules.tables["catalog_export"] == [("X", "X", "Ex2")]
    gx, gy = key_guid("catalog", "X"), key_guid("catalog", "Y")
    assert rules.tables["catalog"] == rows(
        (gx, T[1], T[2], False, "X", "Ex", "e1", pv(guid="e1", code="e1", label="e1")),
        (gx, T[2], None, False, "X", "Ex2", "e2", pv(guid="e1", code="e1", label="e2")),
        (gy, T[1], T[2], False, "Y", "Why", "e1", pv(guid="e1", code="e1", label="e1")),
        (gy, T[2], None, True, "Y", None, "e2", pv(guid="e2", code="e1", label="e2")),
    )


# ---------------------------------------------------------------------------------------------------
# The "orders" lake: links, reprocessing, children


ORDERS_DOC: dict[str, Any] = {
    "entities": {
        "customer": {
            "fields": {
                "customer_number": {"type": "text", "key": True},
                "customer_name": {"type": "text"},
                "region": {"type": "text"},
            }
        },
        "order": {
            "fields": {
                "order_number": {"type": "integer", "key": True},
                "order_customer": {"type": "link", "linkEntity": "customer", "linkKey": ["customer_number"]},
                # region is not unique among customers: a lookup by it can match several rows.
                "region_customer": {"type": "link", "linkEntity": "customer", "linkKey": ["region"]},
                "order_lines": {
                    "type": "children",
                    "childEntity": "order_line",
                    "parentIdentifier": "order",
                    "childSequence": "line_number",
                },
            }
        },
        "order_line": {
            "fields": {
                "order": {"type": "link", "linkEntity": "order", "key": True},
                "line_number": {"type": "integer", "key": True},
                "product": {"type": "text"},
                "quantity": {"type": "integer"},
            }
        },
    }
}
ORDERS_SCHEMA = schema_of(ORDERS_DOC)
ORDER_COLUMNS = [*STANDARD, "order_number", "order_customer", "region_customer", *TAIL]
CUSTOMER_COLUMNS = [*STANDARD, "customer_number", "customer_name", "region", *TAIL]
LINE_COLUMNS = [*STANDARD, "order", "line_number", "product", "quantity", *TAIL]

ORDERS_HOUR_10 = [
    Msg(
        "c1",
        "customer",
        at(0),
        [
            {"customer_number": "C1", "customer_name": "One", "region": "north"},
            {"customer_number": "C2", "customer_name": "Two", "region": "north"},
            {"customer_number": "C3", "customer_name": "Three", "region": "south"},
        ],
        hour=H10,
    ),
    # Resolved; all link keys null -> null link; no such customer (yet) -> status 1, record not written.
    Msg(
        "o1",
        "order",
        at(1),
        [
            {"order_number": 1, "customer_number": "C1"},
            {"order_number": 3, "customer_number": None},
            {"order_number": 4, "customer_number": "C9"},
        ],
        hour=H10,
    ),
    # Two customers in the north: an error for order 5; order 6 resolves both of its links.
    Msg(
        "o2",
        "order",
        at(1),
        [
            {"order_number": 5, "customer_number": "C1", "region": "north"},
            {"order_number": 6, "customer_number": "C2", "region": "south"},
        ],
        hour=H10,
    ),
    # Children: two lines, then one (line 2 is deleted, line 1 updated), then the order is deleted.
    Msg(
        "o3",
        "order",
        at(2),
        [
            {
                "order_number": 7,
                "customer_number": "C3",
                "order_lines": [{"product": "P1", "quantity": 1}, {"product": "P2", "quantity": 4}],
            }
        ],
        hour=H10,
    ),
    Msg(
        "o4",
        "order",
        at(3),
        [{"order_number": 7, "customer_number": "C3", "order_lines": [{"product": "P1", "quantity": 2}]}],
        hour=H10,
    ),
    Msg("o5", "order", at(4), [{"order_number": 7, "deleted_indicator": True}], hour=H10),
    # Order 8's second list has a line that cannot be converted: that line is neither changed nor deleted.
    Msg(
        "o6",
        "order",
        at(2),
        [
            {
                "order_number": 8,
                "customer_number": "C3",
                "order_lines": [{"product": "P1", "quantity": 1}, {"product": "P2", "quantity": 2}],
            }
        ],
        hour=H10,
    ),
    Msg(
        "o7",
        "order",
        at(3),
        [
            {
                "order_number": 8,
                "customer_number": "C3",
                "order_lines": [{"product": "P1", "quantity": 1}, {"product": "P2", "quantity": "two"}],
            }
        ],
        hour=H10,
    ),
    # An order line in its own right: its parent link resolves through order's key (the default linkKey),
    # the value converted to the key's type first (1.0 is the integer 1); "abc" cannot be converted.
    Msg(
        "ol1",
        "order_line",
        at(2),
        [{"order_number": 1.0, "line_number": 1, "product": "P9", "quantity": 3}],
        hour=H10,
    ),
    Msg("ol2", "order_line", at(2), [{"order_number": "abc", "line_number": 1}], hour=H10),
]
ORDERS_HOUR_11 = [
    Msg("c9", "customer", at(5), [{"customer_number": "C9", "customer_name": "Nine", "region": "west"}], hour=H11)
]
ORDERS_TABLES = {"customer": CUSTOMER_COLUMNS, "order": ORDER_COLUMNS, "order_line": LINE_COLUMNS}


@pytest.fixture(scope="module")
def orders(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> list[Snapshot]:
    """Snapshots after: hour 10; hour 11 (customer C9 arrives); hour 10 again (reprocessing)."""
    lake = LakeResource(root=str(tmp_path_factory.mktemp("orders") / "lake"))
    store(spark, lake, ORDERS_HOUR_10)
    store(spark, lake, ORDERS_HOUR_11)
    snapshots = []
    for hour in (H10, H11, H10):
        process(spark, lake, ORDERS_SCHEMA, [hour])
        tables = {name: table_rows(spark, lake, name, cols) for name, cols in ORDERS_TABLES.items()}
        snapshots.append(Snapshot(tables, log_rows(spark, lake)))
    return snapshots


GC1, GC2, GC3, GC9 = (key_guid("customer", c) for c in ("C1", "C2", "C3", "C9"))
GO1, GO3, GO4, GO6, GO7, GO8 = (key_guid("order", n) for n in ("1", "3", "4", "6", "7", "8"))
GL1, GL2 = key_guid("order_line", GO7, "1"), key_guid("order_line", GO7, "2")
ORDERS_AFTER_HOUR_10 = rows(
    (GO1, T[1], None, False, 1, GC1, None, "o1", pv(guid="o1", order_customer="o1", order_number="o1")),
    (GO3, T[1], None, False, 3, None, None, "o1", pv(guid="o1", order_customer="o1", order_number="o1")),
    (GO6, T[1], None, False, 6, GC2, GC3, "o2",
     pv(guid="o2", order_customer="o2", order_number="o2", region_customer="o2")),
    # o4 changes nothing on the order itself: no version; o5 deletes it.
    (GO7, T[2], T[4], False, 7, GC3, None, "o3", pv(guid="o3", order_customer="o3", order_number="o3")),
    (GO7, T[4], None, True, 7, None, None, "o5", pv(guid="o5", order_customer="o5", order_number="o3")),
    (GO8, T[2], None, False, 8, GC3, None, "o6", pv(guid="o6", order_customer="o6", order_number="o6")),
)  # fmt: skip
CUSTOMERS_HOUR_10 = rows(
    *[
        (key_guid("customer", c), T[0], None, False, c, name, region, "c1",
         pv(guid="c1", customer_name="c1", customer_number="c1", region="c1"))
        for c, name, region in (("C1", "One", "north"), ("C2", "Two", "north"), ("C3", "Three", "south"))
    ]
)  # fmt: skip
C9_ROW = (GC9, T[5], None, False, "C9", "Nine", "west", "c9",
          pv(guid="c9", customer_name="c9", customer_number="c9", region="c9"))  # fmt: skip
O4_ROW = (GO4, T[1], None, False, 4, GC9, None, "o1", pv(guid="o1", order_customer="o1", order_number="o1"))
WAITING = "order record 3: link order_customer: no live customer with ['customer_number'] = [\"C9\"]"
AMBIGUOUS = 'order record 1: link region_customer: 2 customer rows match ["north"]'
BAD_LINE = "order_line record 10002: quantity: cannot convert 'two' to integer"
BAD_LINK_KEY = (
    "order_line record 1: link order: order_number: cannot convert 'abc' to integer; key field order: missing or null"
)


def test_links_resolve_null_unmatched_and_ambiguous(orders: list[Snapshot]) -> None:
    first = orders[0]
    assert first.tables["customer"] == CUSTOMERS_HOUR_10
    assert first.tables["order"] == ORDERS_AFTER_HOUR_10  # no order 4 (waits for C9), no order 5 (ambiguous)
    assert first.log == {"c1": (3, None), "o1": (1, WAITING), "o2": (4, AMBIGUOUS), "o3": (3, None),
                         "o4": (3, None), "o5": (3, None), "o6": (3, None), "o7": (4, BAD_LINE),
                         "ol1": (3, None), "ol2": (4, BAD_LINK_KEY)}  # fmt: skip
    # The order line sent in its own right links to order 1 through order's key.
    gl = key_guid("order_line", GO1, "1")
    assert [r for r in first.tables["order_line"] if r[0] == gl] == [
        (gl, T[2], None, False, GO1, 1, "P9", 3, "ol1",
         pv(guid="ol1", line_number="ol1", order="ol1", product="ol1", quantity="ol1")),
    ]  # fmt: skip


def test_reprocessing_resolves_a_link_that_arrived_later(orders: list[Snapshot]) -> None:
    """C9 arrives in hour 11; rerunning hour 10 writes order 4 and sets o1 to status 3; nothing else changes."""
    _, second, third = orders
    assert second.tables["customer"] == rows(*CUSTOMERS_HOUR_10, C9_ROW)
    assert second.tables["order"] == ORDERS_AFTER_HOUR_10
    assert second.log["o1"] == (1, WAITING)
    assert second.log["c9"] == (3, None)
    assert third.tables["customer"] == second.tables["customer"]
    assert third.tables["order"] == rows(*ORDERS_AFTER_HOUR_10, O4_ROW)
    assert third.tables["order_line"] == second.tables["order_line"]
    assert third.log == {**second.log, "o1": (3, None)}


def test_the_materialization_names_waiting_and_failed_messages_only_when_there_are_some(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Up to 5 messages waiting for a link and 5 that failed, with their errors, in the asset's metadata;
    none (and no query for them) when every message was processed."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    store(spark, lake, ORDERS_HOUR_10)
    store(spark, lake, ORDERS_HOUR_11)
    schema_file = tmp_path / "schema.yaml"
    schema_file.write_text(yaml.safe_dump(ORDERS_DOC))

    def metadata(hour: str) -> dict[str, Any]:
        result = materialize_versioned(lake.root, [hour], str(schema_file))
        assert result.success
        (event,) = result.asset_materializations_for_node("versioned_entities")
        return {k: v.value for k, v in event.metadata.items()}

    first = metadata(H10)
    log = log_rows(spark, lake)
    waiting = sorted(m for m, (status, _) in log.items() if status == 1)
    failed = {m: error for m, (status, error) in log.items() if status == 4}
    assert waiting == ["o1"] and 1 < len(failed) <= 5
    assert first["reprocessing_examples"] == waiting
    assert {e["message"]: e["error"] for e in first["error_examples"]} == failed
    assert first["messages_by_status"] == {"1": 1, "3": len(log) - 1 - len(failed), "4": len(failed)}
    clean = metadata(H11)
    assert clean["messages_by_status"] == {"3": 1}
    assert clean["reprocessing_examples"] == [] and clean["error_examples"] == []


def test_children_follow_their_parent(orders: list[Snapshot]) -> None:
    """Lines from the order's array (parent link, childSequence); a shorter list deletes the missing line;
    the parent's delete deletes the rest."""
    expected = rows(
        (GL1, T[2], T[3], False, GO7, 1, "P1", 1, "o3",
         pv(guid="o3", line_number="o3", order="o3", product="o3", quantity="o3")),
        (GL1, T[3], T[4], False, GO7, 1, "P1", 2, "o4",
         pv(guid="o3", line_number="o3", order="o3", product="o3", quantity="o4")),
        (GL1, T[4], None, True, GO7, 1, None, None, "o5",
         pv(guid="o5", line_number="o3", order="o3", product="o5", quantity="o5")),
        (GL2, T[2], T[3], False, GO7, 2, "P2", 4, "o3",
         pv(guid="o3", line_number="o3", order="o3", product="o3", quantity="o3")),
        (GL2, T[3], None, True, GO7, 2, None, None, "o4",
         pv(guid="o4", line_number="o3", order="o3", product="o4", quantity="o4")),
    )  # fmt: skip
    assert [r for r in orders[0].tables["order_line"] if r[4] == GO7] == expected
    assert [r for r in orders[2].tables["order_line"] if r[4] == GO7] == expected


def test_a_child_that_fails_is_not_deleted_by_its_parents_list(orders: list[Snapshot]) -> None:
    """o7 lists order 8's lines again, line 2 with a quantity that cannot be converted: line 2 keeps its row
    (the child refresh must not delete it), the message gets status 4 naming the child record."""
    l81, l82 = key_guid("order_line", GO8, "1"), key_guid("order_line", GO8, "2")
    assert [r for r in orders[0].tables["order_line"] if r[4] == GO8] == rows(
        (l81, T[2], None, False, GO8, 1, "P1", 1, "o6",
         pv(guid="o6", line_number="o6", order="o6", product="o6", quantity="o6")),
        (l82, T[2], None, False, GO8, 2, "P2", 2, "o6",
         pv(guid="o6", line_number="o6", order="o6", product="o6", quantity="o6")),
    )  # fmt: skip
    assert orders[0].log["o7"] == (4, BAD_LINE)
