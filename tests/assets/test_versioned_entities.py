"""Versioned entities on Spark: the seed's worked example with exact tables, and each rule of seed 004."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.transforms.versioned_entities import guid_of
from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, log_rows, process, schema_of, store_messages, table_rows, ts

PRODUCT_SCHEMA = schema_of(
    {
        "entities": {
            "product": {
                "fields": {
                    "product_number": {"type": "integer", "key": True},
                    "product_description": {"type": "text", "length": 40},
                }
            }
        }
    }
)

M1 = Msg(
    "m1",
    "product",
    "2019-06-05T09:31:17",
    [
        {"product_number": 1234567, "product_description": "Breville Toaster"},
        {"product_number": 2345678, "product_description": "Kenwood Kettle"},
    ],
)
M2 = Msg(
    "m2",
    "product",
    "2019-06-05T10:10:14",
    [
        {"product_number": 1234567, "product_description": "Breville Toaster"},
        {"product_number": 2345678, "product_description": "Kenwood Automatic Kettle"},
        {"product_number": 3456789, "product_description": "Panasonic Microwave"},
    ],
    hour="2026-03-01-11:00",
)
M3 = Msg(
    "m3",
    "product",
    "2019-06-05T10:45:19",
    [{"product_number": 3456789, "deleted_indicator": True}],
    hour="2026-03-01-12:00",
)
M4_LATE = Msg(
    "m4",
    "product",
    "2019-06-05T09:50:00",
    [{"product_number": 2345678, "product_description": "Kenwood Auto Kettle"}],
    hour="2026-03-01-13:00",
)

COLUMNS = [
    "guid",
    "valid_from_timestamp",
    "valid_to_timestamp",
    "deleted_indicator",
    "product_number",
    "product_description",
    "source_message",
    "field_provenance",
]

G1 = guid_of("product", '["1234567"]')
G2 = guid_of("product", '["2345678"]')
G3 = guid_of("product", '["3456789"]')
T0931, T1010, T1045, T0950 = (ts("2019-06-05T09:31:17"), ts("2019-06-05T10:10:14"), ts("2019-06-05T10:45:19"),
                              ts("2019-06-05T09:50:00"))  # fmt: skip


def prov(**fields: str) -> str:
    """field_provenance JSON: guid first, then fields by name, priority 0."""
    out = {"guid": {"m": fields.pop("guid"), "p": 0}}
    for name in sorted(fields):
        out[name] = {"m": fields[name], "p": 0}
    return json.dumps(out, separators=(",", ":"))


@pytest.fixture()
def lake(tmp_path: Path) -> LakeResource:
    return LakeResource(root=str(tmp_path / "lake"))


def _run(spark: SparkSession, lake: LakeResource, *messages: Msg) -> None:
    hours = store_messages(spark, lake, list(messages))
    process(spark, lake, PRODUCT_SCHEMA, hours)


def test_seed_worked_example(spark: SparkSession, lake: LakeResource) -> None:
    _run(spark, lake, M1)
    assert table_rows(spark, lake, "product", COLUMNS) == sorted(
        [
            (G1, T0931, None, False, 1234567, "Breville Toaster", "m1",
             prov(guid="m1", product_number="m1", product_description="m1")),
            (G2, T0931, None, False, 2345678, "Kenwood Kettle", "m1",
             prov(guid="m1", product_number="m1", product_description="m1")),
        ],
        key=repr,
    )  # fmt: skip

    _run(spark, lake, M2)
    after_m2 = [
        (G1, T0931, None, False, 1234567, "Breville Toaster", "m1",
         prov(guid="m1", product_number="m1", product_description="m1")),
        (G2, T0931, T1010, False, 2345678, "Kenwood Kettle", "m1",
         prov(guid="m1", product_number="m1", product_description="m1")),
        (G2, T1010, None, False, 2345678, "Kenwood Automatic Kettle", "m2",
         prov(guid="m1", product_number="m1", product_description="m2")),
        (G3, T1010, None, False, 3456789, "Panasonic Microwave", "m2",
         prov(guid="m2", product_number="m2", product_description="m2")),
    ]  # fmt: skip
    assert table_rows(spark, lake, "product", COLUMNS) == sorted(after_m2, key=repr)

    _run(spark, lake, M3)
    after_m3 = [
        *[r for r in after_m2 if r[0] != G3],
        (G3, T1010, T1045, False, 3456789, "Panasonic Microwave", "m2",
         prov(guid="m2", product_number="m2", product_description="m2")),
        (G3, T1045, None, True, 3456789, None, "m3",
         prov(guid="m3", product_number="m2", product_description="m3")),
    ]  # fmt: skip
    assert table_rows(spark, lake, "product", COLUMNS) == sorted(after_m3, key=repr)

    # The 09:50 kettle update arrives after the 10:10 one: it splits the 09:31 version.
    _run(spark, lake, M4_LATE)
    after_late = [
        *[r for r in after_m3 if r[0] != G2],
        (G2, T0931, T0950, False, 2345678, "Kenwood Kettle", "m1",
         prov(guid="m1", product_number="m1", product_description="m1")),
        (G2, T0950, T1010, False, 2345678, "Kenwood Auto Kettle", "m4",
         prov(guid="m1", product_number="m1", product_description="m4")),
        (G2, T1010, None, False, 2345678, "Kenwood Automatic Kettle", "m2",
         prov(guid="m1", product_number="m1", product_description="m2")),
    ]  # fmt: skip
    assert table_rows(spark, lake, "product", COLUMNS) == sorted(after_late, key=repr)
    assert {m: s for m, (s, _) in log_rows(spark, lake).items()} == {"m1": 3, "m2": 3, "m3": 3, "m4": 3}

    # Rerunning every hour changes nothing.
    before = table_rows(spark, lake, "product", COLUMNS)
    process(
        spark, lake, PRODUCT_SCHEMA, ["2026-03-01-10:00", "2026-03-01-11:00", "2026-03-01-12:00", "2026-03-01-13:00"]
    )
    assert table_rows(spark, lake, "product", COLUMNS) == before
