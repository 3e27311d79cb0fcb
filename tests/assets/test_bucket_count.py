"""The versioned entities refuse a bucket count other than the one their tables were written with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.assets.versioned_entities import (
    BUCKETS_FILE,
    VERSIONS_DS,
    BucketCountChanged,
    check_bucket_count,
)
from ngsi_assets.ngsi.entity_schema import entity_folder, parse_schema
from ngsi_assets.settings import entity_buckets
from resources.lake import LakeResource
from resources.versioning import DEFAULT_BUCKETS, VersioningResource
from tests.assets.versioning_support import Msg, materialize_versioned, process, store_messages, table_rows

SCHEMA = parse_schema(
    {
        "entities": {"item": {"fields": {"code": {"type": "text", "key": True}, "qty": {"type": "integer"}}}},
        "sourceSystems": {"hub": {"mappings": {"item": [{"reference": "item"}]}}},
    }
)


def _stored(root: Path) -> dict | None:
    path = root / VERSIONS_DS / BUCKETS_FILE
    return json.loads(path.read_text()) if path.exists() else None


def test_the_first_run_keeps_its_count_and_another_one_is_refused_by_both_numbers(tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path))
    check_bucket_count(lake, 16)
    assert _stored(tmp_path) == {"buckets": 16}
    check_bucket_count(lake, 16)  # the same count again: fine
    with pytest.raises(BucketCountChanged, match=r"NGSI_ENTITY_BUCKETS is 64, but .* written with 16 buckets"):
        check_bucket_count(lake, 64)
    assert _stored(tmp_path) == {"buckets": 16}


def test_a_lake_from_before_the_file_is_checked_against_its_folders(tmp_path: Path) -> None:
    folder = entity_folder("car")
    (tmp_path / VERSIONS_DS / folder / "bucket=3").mkdir(parents=True)
    (tmp_path / VERSIONS_DS / folder / "bucket=40").mkdir(parents=True)
    lake = LakeResource(root=str(tmp_path))
    refused = rf"is 16, but .* more buckets \(versioned_entities/{folder}/bucket=40 exists\)"
    with pytest.raises(BucketCountChanged, match=refused):
        check_bucket_count(lake, 16)
    assert _stored(tmp_path) is None
    check_bucket_count(lake, 64)  # a count that can have made every folder is adopted
    assert _stored(tmp_path) == {"buckets": 64}


@pytest.mark.parametrize("text", ["oops", "[]", '{"count": 4}', '{"buckets": "four"}'])
def test_an_unreadable_count_file_is_refused_by_name(tmp_path: Path, text: str) -> None:
    (tmp_path / VERSIONS_DS).mkdir()
    (tmp_path / VERSIONS_DS / BUCKETS_FILE).write_text(text)
    with pytest.raises(ValueError, match=r"versioned_entities/_buckets.json does not hold a bucket count"):
        check_bucket_count(LakeResource(root=str(tmp_path)), 4)


@pytest.mark.spark
def test_a_run_with_another_count_fails_before_it_writes(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    first = [Msg("m1", "item", "2019-06-05T10:00:00", [{"code": "a", "qty": 1}, {"code": "b", "qty": 2}], source="hub")]
    [hour] = store_messages(spark, lake, first)
    process(spark, lake, SCHEMA, [hour], buckets=4)
    before = table_rows(spark, lake, "item", ["code", "qty"])
    assert before == [("a", 1), ("b", 2)]

    later = [*first, Msg("m2", "item", "2019-06-05T10:05:00", [{"code": "a", "qty": 5}], source="hub")]
    store_messages(spark, lake, later)
    with pytest.raises(BucketCountChanged, match=r"is 8, but .* written with 4 buckets"):
        process(spark, lake, SCHEMA, [hour], buckets=8)
    assert table_rows(spark, lake, "item", ["code", "qty"]) == before
    process(spark, lake, SCHEMA, [hour], buckets=4)
    assert table_rows(spark, lake, "item", ["code", "qty"]) == [("a", 1), ("a", 5), ("b", 2)]


def test_an_unset_count_is_the_lakes_own_and_64_for_a_new_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("", None), ("  ", None), ("8", 8)):
        monkeypatch.setenv("NGSI_ENTITY_BUCKETS", value)
        assert entity_buckets() == expected
    monkeypatch.delenv("NGSI_ENTITY_BUCKETS")
    assert entity_buckets() is None
    monkeypatch.setenv("NGSI_ENTITY_BUCKETS", "eight")
    with pytest.raises(ValueError, match="NGSI_ENTITY_BUCKETS must be an integer, not 'eight'"):
        entity_buckets()

    lake = LakeResource(root=str(tmp_path))
    assert VersioningResource().bucket_count(lake) == DEFAULT_BUCKETS == 64
    check_bucket_count(lake, 8)  # what the first fold of a lake with NGSI_ENTITY_BUCKETS=8 writes
    assert VersioningResource().bucket_count(lake) == 8
    assert VersioningResource(buckets=16).bucket_count(lake) == 16  # set: as set (the fold refuses it)


@pytest.mark.spark
def test_a_run_without_a_count_folds_with_the_lakes(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    schema_file = tmp_path / "schema.yaml"
    schema_file.write_text(
        "entities:\n  item:\n    fields:\n      code: {type: text, key: true}\n      qty: {type: integer}\n"
        "sourceSystems:\n  hub:\n    mappings:\n      item: [{reference: item}]\n"
    )
    codes = [{"code": c, "qty": n} for n, c in enumerate("abcdefgh")]
    first = [Msg("m1", "item", "2019-06-05T10:00:00", codes, source="hub")]
    [hour] = store_messages(spark, lake, first)
    process(spark, lake, SCHEMA, [hour], buckets=2)

    later = Msg("m2", "item", "2019-06-05T11:00:00", [{"code": "a", "qty": 9}], "2026-03-01-11:00", source="hub")
    [_, next_hour] = store_messages(spark, lake, [*first, later])
    result = materialize_versioned(lake.root, [next_hour], str(schema_file), buckets=None)
    assert result.success
    assert _stored(tmp_path / "lake") == {"buckets": 2}
    folders = {p.name for p in (tmp_path / "lake" / VERSIONS_DS / entity_folder("item")).glob("bucket=*")}
    assert folders <= {"bucket=0", "bucket=1"}
    assert ("a", 9) in table_rows(spark, lake, "item", ["code", "qty"])
