"""An entity table's columns kept beside it (``versioned_entities/<entity>/_schema.json``): the fold
writes them before its files, and the transaction history reads the table with them instead of merging
the files' Parquet schemas (a Spark job over every file's footer). The history it records is the same
either way, through columns added to and dropped from the entity schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DecimalType, IntegerType, StringType, StructField, StructType

from ngsi_assets.history_store import HistoryStore
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from resources.lake import LakeResource
from resources.versioning import SCHEMA_FILE, VERSIONS_DS, store_table_schema, stored_table_schema
from tests.assets.test_transaction_history import Clock
from tests.assets.versioning_support import Msg, process, schema_of, store_messages

H1 = "2026-03-01-10:00"
H2 = "2026-03-01-11:00"
H3 = "2026-03-01-12:00"


def _schema(*fields: str) -> Any:
    types = {"name": {"type": "text"}, "price": {"type": "decimal", "precision": 8, "scale": 2}}
    return schema_of(
        {"entities": {"product": {"fields": {"sku": {"type": "text", "key": True}} | {f: types[f] for f in fields}}}}
    )


# The entity schema grows (price added), then shrinks (name dropped): files of earlier hours keep columns
# the later ones lack.
STEPS = [
    (
        H1,
        _schema("name"),
        [
            Msg("m1", "product", "2026-03-01T09:00:00", [{"sku": "A", "name": "Toaster"}], H1, source="erp"),
            Msg("m2", "product", "2026-03-01T09:05:00", [{"sku": "B", "name": "Kettle"}], H1, source="erp"),
        ],
    ),
    (
        H2,
        _schema("name", "price"),
        [Msg("m3", "product", "2026-03-01T10:00:00", [{"sku": "A", "price": "12.50"}], H2, source="web")],
    ),
    (
        H3,
        _schema("price"),
        [
            Msg("m4", "product", "2026-03-01T11:00:00", [{"sku": "C", "price": "3.00"}], H3, source="erp"),
            Msg("m5", "product", "2026-03-01T11:01:00", [{"sku": "B", "price": "21.00"}], H3, source="web"),
        ],
    ),
]


def test_kept_columns_are_the_union_of_every_schema_kept(tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    folder = entity_folder("product")
    assert stored_table_schema(lake, folder) is None
    first = StructType([StructField("sku", StringType(), False), StructField("name", StringType())])
    assert store_table_schema(lake, folder, first) == first
    second = StructType([StructField("sku", StringType(), False), StructField("price", DecimalType(8, 2))])
    kept = store_table_schema(lake, folder, second)
    assert [(f.name, f.dataType, f.nullable) for f in kept.fields] == [
        ("sku", StringType(), False),
        ("price", DecimalType(8, 2), True),
        ("name", StringType(), True),
    ]
    assert stored_table_schema(lake, folder) == kept
    # A column's type is the newest one's.
    retyped = StructType([StructField("sku", StringType(), False), StructField("name", IntegerType())])
    assert store_table_schema(lake, folder, retyped)["name"].dataType == IntegerType()


def test_an_unreadable_kept_schema_is_an_error_naming_its_file(tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    folder = entity_folder("product")
    lake.write_dataset_file(VERSIONS_DS, SCHEMA_FILE, '{"buckets": 4}', subfolder=folder)
    with pytest.raises(ValueError, match=rf"versioned_entities/{folder}/_schema.json does not hold a table schema"):
        stored_table_schema(lake, folder)


def _history(spark: SparkSession, root: Path, keep_schema: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """The three steps folded and recorded; with ``keep_schema`` False every kept schema is deleted
    before the history reads the table (a lake from before they were kept). The history's rows and
    the versioned-entities reads that merged the files' schemas."""
    lake = LakeResource(root=str(root))
    clock = Clock()
    store = HistoryStore(spark, lake, clock=clock)
    merged: list[str] = []
    real_folders, real_files = LakeResource.read_folders, LakeResource.read_folder_files

    def read_folders(self: LakeResource, spark: SparkSession, dataset: str, column: str, values: Any, **kw: Any) -> Any:
        if dataset == VERSIONS_DS and kw.get("schema") is None:
            merged.append(f"read_folders {values}")
        return real_folders(self, spark, dataset, column, values, **kw)

    def read_folder_files(
        self: LakeResource, spark: SparkSession, dataset: str, column: str, files: Any, schema: Any, **kw: Any
    ) -> Any:
        if dataset == VERSIONS_DS and schema is None:
            merged.append(f"read_folder_files {sorted(files)}")
        return real_files(self, spark, dataset, column, files, schema, **kw)

    monkeypatch.setattr(LakeResource, "read_folders", read_folders)
    monkeypatch.setattr(LakeResource, "read_folder_files", read_folder_files)
    schema_file = Path(lake.folder_uri(VERSIONS_DS, entity_folder("product"))) / SCHEMA_FILE
    for hour, entities, msgs in STEPS:
        store_messages(spark, lake, msgs)
        process(spark, lake, entities, [hour])
        assert schema_file.exists(), "the fold keeps the table's columns beside it"
        if not keep_schema:
            schema_file.unlink()
        messages = lake.read(spark, "message_store", MESSAGE_STORE, [hour])
        with store.writer_lock():
            assert store.record("product", ("sku",), messages.select("message_identifier", "user", "source_system"))
        clock.advance()
    monkeypatch.undo()
    rows = sorted(
        json.dumps(r.asDict(), default=str, sort_keys=True)
        for r in store.history("product").drop("tnx", "created_at", "valid_from").collect()
    )
    return rows, merged


def test_the_history_reads_the_table_with_its_kept_columns(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, kept_merges = _history(spark, tmp_path / "kept", True, monkeypatch)
    assert kept_merges == [], "no read of the entity table merged its files' schemas"
    legacy, legacy_merges = _history(spark, tmp_path / "legacy", False, monkeypatch)
    assert legacy_merges, "without kept columns the history merges the files' schemas (the test's control)"
    assert kept == legacy
    # The history saw every column the table ever had: the dropped one is in the earlier states.
    assert any('\\"name\\":\\"Kettle\\"' in r for r in kept) and any('\\"price\\":21.00' in r for r in kept)
