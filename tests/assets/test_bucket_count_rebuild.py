"""The rebuild that docs/features/versioned-entities.md's "Storage and cost" prescribes for a new bucket
count, and the transaction history.

The history's HEAD is stored by versioned bucket. After the entity tables are rebuilt with another
count, the keys sit in other buckets than HEAD has them in: the next transaction must find that
nothing changed, move HEAD to the new buckets, and go on from it as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.history_store import HistoryStore
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.ngsi.transactions import Action
from resources.lake import LakeResource
from tests.assets.test_transaction_history import Clock, current, record_all, rewound
from tests.assets.versioning_support import Msg, process, schema_of, store_messages

H1 = "2026-03-01-10:00"
H2 = "2026-03-01-11:00"
FIELDS = {
    "sku": {"type": "text", "key": True},
    "name": {"type": "text"},
    "price": {"type": "decimal", "precision": 8, "scale": 2},
}
SCHEMA = schema_of({"entities": {"product": {"fields": FIELDS}, "override": {"fields": FIELDS}}})
SKUS = [f"S{n:02d}" for n in range(24)]
# What docs/features/versioned-entities.md ("Storage and cost") says to delete before a backfill with
# the new count.
ENTITY_TABLES = (
    "versioned_entities",
    "entity_records",
    "entity_record_marks",
    "entity_refreshes",
    "entity_exports",
    "entity_record_index",
)


def bucket_folders(root: Path, dataset: str) -> set[int]:
    return {int(p.name.split("=")[1]) for p in (root / dataset / entity_folder("product")).glob("bucket=*")}


def actions(store: HistoryStore, txn: int) -> list[tuple[str, str]]:
    return sorted((r["id"], Action(r["action"]).name) for r in store.history("product", [txn]).collect())


@pytest.mark.spark
def test_history_goes_on_after_the_entity_tables_are_rebuilt_with_another_count(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    clock = Clock()
    store = HistoryStore(spark, lake, clock=clock)
    first = [
        Msg(f"m{n}", "product", "2026-03-01T09:00:00", [{"sku": s, "name": f"item {s}", "price": f"{n}.50"}], H1)
        for n, s in enumerate(SKUS)
    ]
    store_messages(spark, lake, first)
    process(spark, lake, SCHEMA, [H1], buckets=8)
    [created] = record_all(store, lake, spark, [H1])
    assert actions(store, created.txn) == [(s, "CREATE") for s in SKUS]
    before = current(spark, lake, "product")
    assert bucket_folders(root, "transaction_head") == bucket_folders(root, "versioned_entities")
    assert max(bucket_folders(root, "transaction_head")) >= 2  # the keys fall beyond the new count's buckets
    clock.advance()

    for name in ENTITY_TABLES:
        shutil.rmtree(root / name, ignore_errors=True)
    process(spark, lake, SCHEMA, [H1], buckets=2)
    assert current(spark, lake, "product") == before

    # Nothing changed: no transaction, and HEAD now lies in the new buckets, each key once.
    assert record_all(store, lake, spark, [H1]) == []
    assert bucket_folders(root, "transaction_head") == bucket_folders(root, "versioned_entities") <= {0, 1}
    head = store.head("product").select("id").collect()
    assert sorted(r["id"] for r in head) == SKUS
    clock.advance()

    # The history goes on from it: one update, chained to its key's create, and rewinds stay exact.
    store_messages(
        spark, lake, [*first, Msg("u1", "product", "2026-03-01T10:00:00", [{"sku": "S05", "price": "99.00"}], H2)]
    )
    process(spark, lake, SCHEMA, [H2], buckets=2)
    [updated] = record_all(store, lake, spark, [H2])
    assert actions(store, updated.txn) == [("S05", "UPDATE")]
    rows = {r["i"]: r for r in store.history("product").collect()}
    [update] = [r for r in rows.values() if r["txn"] == updated.txn]
    [create] = [r for r in rows.values() if r["txn"] == created.txn and r["id"] == "S05"]
    assert update["id"] == "S05" and update["puuid"] == create["uuid"]
    assert rewound(store, "product", created.tnx) == before
    assert rewound(store, "product", updated.tnx) == current(spark, lake, "product")
    verification = store.verification("product", updated.txn)
    assert verification is not None and (verification.chain_breaks, verification.uuid_faults) == (0, 0)


@pytest.mark.spark
def test_a_history_state_from_before_the_count_was_kept_costs_no_rewrite(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    store = HistoryStore(spark, lake, clock=Clock())
    first = [
        Msg(f"m{n}", "product", "2026-03-01T09:00:00", [{"sku": s, "name": f"item {s}"}], H1)
        for n, s in enumerate(SKUS[:8])
    ]
    store_messages(spark, lake, first)
    process(spark, lake, SCHEMA, [H1], buckets=4)
    assert len(record_all(store, lake, spark, [H1])) == 1
    state_file = root / "transaction_head" / entity_folder("product") / "_state.json"
    state = json.loads(state_file.read_text())
    assert state["buckets"] == 4
    # As a lake written before the count was kept: the state names none.
    state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "buckets"}))
    head_files = sorted(p.name for p in (root / "transaction_head").rglob("*.parquet"))

    assert record_all(store, lake, spark, [H1]) == []
    after = json.loads(state_file.read_text())
    assert after == state  # the count is adopted, the signatures kept (no bucket compared again)
    assert sorted(p.name for p in (root / "transaction_head").rglob("*.parquet")) == head_files
