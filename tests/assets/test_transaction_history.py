"""The transaction history over real versioning runs: actions, puuid chains, rewind, rerun, tags, layers, purge."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.history_store import HistoryError, HistoryStore
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.ngsi.transactions import Action, tnx_of, uuid_of
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, process, schema_of, store_messages

H1 = "2026-03-01-10:00"
H2 = "2026-03-01-11:00"
H3 = "2026-03-01-12:00"

SCHEMA = schema_of(
    {
        "entities": {
            "product": {
                "fields": {
                    "sku": {"type": "text", "key": True},
                    "name": {"type": "text"},
                    "price": {"type": "decimal", "precision": 8, "scale": 2},
                }
            },
            "override": {
                "fields": {
                    "sku": {"type": "text", "key": True},
                    "name": {"type": "text"},
                    "price": {"type": "decimal", "precision": 8, "scale": 2},
                }
            },
        }
    }
)


class Clock:
    """A settable clock: transaction times are part of tnx, so tests fix them."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, minutes: int = 7) -> None:
        self.now += timedelta(minutes=minutes)


def record_all(store: HistoryStore, lake: LakeResource, spark: SparkSession, hours: list[str]) -> list:
    messages = lake.read(spark, "message_store", MESSAGE_STORE, hours).select(
        "message_identifier", "user", "source_system"
    )
    commits = []
    with store.writer_lock():
        for space in ("product", "override"):
            c = store.record(space, ("sku",), messages)
            if c is not None:
                commits.append(c)
    return commits


def current(spark: SparkSession, lake: LakeResource, space: str) -> dict[str, dict]:
    """The open versions of a space, keyed by sku, as plain dicts (what a rewind must reproduce)."""
    df = lake.read_folders(spark, "versioned_entities", "bucket", None, subfolder=entity_folder(space))
    if df is None:
        return {}
    out = {}
    for r in df.where("valid_to_timestamp is null").collect():
        d = r.asDict()
        out[d["sku"]] = {
            "deleted": d["deleted_indicator"],
            "name": d["name"],
            "price": None if d["price"] is None else str(d["price"]),
            "source_message": d["source_message"],
        }
    return out


def rewound(store: HistoryStore, space: str, at: str | int | None) -> dict[str, dict]:
    out = {}
    for r in store.state(space, at=at).collect():
        s = json.loads(r["state"])
        out[r["id"]] = {
            "deleted": s["deleted_indicator"],
            "name": s.get("name"),
            "price": None if s.get("price") is None else f"{s['price']:.2f}",
            "source_message": s["source_message"],
        }
    return out


@pytest.fixture(scope="module")
def story(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three hours of product changes, a rerun of each hour, and an override space."""
    lake = LakeResource(root=str(tmp_path_factory.mktemp("history") / "lake"))
    clock = Clock()
    store = HistoryStore(spark, lake, clock=clock)
    snapshots: list[tuple[int, dict[str, dict]]] = []
    out: dict = {"lake": lake, "store": store, "clock": clock, "commits": [], "snapshots": snapshots}

    def step(hour: str, msgs: list[Msg]) -> None:
        store_messages(spark, lake, msgs)
        process(spark, lake, SCHEMA, [hour])
        commits = record_all(store, lake, spark, [hour])
        out["commits"].append(commits)
        for c in commits:
            if c.space == "product":
                snapshots.append((c.tnx, current(spark, lake, "product")))
        clock.advance()

    step(
        H1,
        [
            Msg(
                "m1",
                "product",
                "2026-03-01T09:00:00",
                [{"sku": "A", "name": "Toaster", "price": "10.00"}],
                H1,
                source="erp",
            ),
            Msg(
                "m2",
                "product",
                "2026-03-01T09:05:00",
                [{"sku": "B", "name": "Kettle", "price": "20.00"}],
                H1,
                source="web",
            ),
        ],
    )
    # The same hour again: versioning rewrites its buckets with the same rows; no transaction.
    process(spark, lake, SCHEMA, [H1])
    out["rerun"] = record_all(store, lake, spark, [H1])
    step(
        H2,
        [
            Msg("m3", "product", "2026-03-01T10:00:00", [{"sku": "A", "price": "12.50"}], H2, source="erp"),
            Msg("m4", "product", "2026-03-01T10:01:00", [{"sku": "B", "deleted_indicator": True}], H2, source="web"),
            Msg("m5", "override", "2026-03-01T10:02:00", [{"sku": "A", "name": "Toaster XL"}], H2, source="ops"),
            Msg("m6", "override", "2026-03-01T10:03:00", [{"sku": "C", "name": "Mixer XL"}], H2, source="ops"),
        ],
    )
    step(
        H3,
        [
            # A late message: it changes the current version's name but is not its source message.
            Msg("m7", "product", "2026-03-01T09:30:00", [{"sku": "A", "name": "Toaster 2"}], H3, source="pim"),
            Msg(
                "m8",
                "product",
                "2026-03-01T11:00:00",
                [{"sku": "B", "name": "Kettle", "price": "21.00"}],
                H3,
                source="web",
            ),
            Msg(
                "m9",
                "product",
                "2026-03-01T11:00:00",
                [{"sku": "C", "name": "Mixer", "price": "30.00"}],
                H3,
                source="erp",
            ),
            Msg("m10", "override", "2026-03-01T11:00:00", [{"sku": "C", "deleted_indicator": True}], H3, source="ops"),
        ],
    )
    return out


def test_rerunning_an_hour_commits_nothing(story: dict) -> None:
    assert story["rerun"] == []
    product = [c for run in story["commits"] for c in run if c.space == "product"]
    assert [c.txn for c in product] == [1, 2, 3]


def test_actions_ids_and_last_updated_by(story: dict) -> None:
    rows = story["store"].history("product").orderBy("i").collect()
    got = [(r["i"], Action(r["action"]).name, r["id"], r["txn"], r["last_updated_by"]) for r in rows]
    assert got == [
        (1, "CREATE", "A", 1, "erp"),
        (2, "CREATE", "B", 1, "web"),
        (3, "UPDATE", "A", 2, "erp"),
        (4, "DELETE", "B", 2, "web"),
        (5, "UPDATE", "A", 3, "pim"),
        (6, "UPDATE", "B", 3, "web"),  # recreated
        (7, "CREATE", "C", 3, "erp"),
    ]


def test_tnx_and_uuids_follow_the_seed_layout(story: dict) -> None:
    store: HistoryStore = story["store"]
    commits = store.commits("product")
    for c in commits:
        assert c.tnx == tnx_of(c.ts, c.txn)
    by_txn = {c.txn: c for c in commits}
    for r in store.history("product").collect():
        assert r["tnx"] == by_txn[r["txn"]].tnx
        assert r["uuid"] == str(uuid_of(r["tnx"], r["i"]))
    assert [c.id for c in store.transactions()] == list(range(1, len(store.transactions()) + 1))


def test_puuid_chains(story: dict) -> None:
    rows = {r["i"]: r for r in story["store"].history("product").collect()}
    assert rows[1]["puuid"] is None and rows[2]["puuid"] is None and rows[7]["puuid"] is None
    assert rows[3]["puuid"] == rows[1]["uuid"]
    assert rows[5]["puuid"] == rows[3]["uuid"]
    assert rows[4]["puuid"] == rows[2]["uuid"]
    assert rows[6]["puuid"] == rows[4]["uuid"]


def test_record_verified_every_transaction_clean(story: dict) -> None:
    """Creates, updates, deletes, a purge and the CREATE after it: no fault against the rows before each."""
    store: HistoryStore = story["store"]
    commits = store.commits("product")
    assert len(commits) >= 3
    for c in commits:
        verification = store.verification("product", c.txn)
        assert verification is not None, c.txn
        assert (verification.chain_breaks, verification.uuid_faults) == (0, 0), (c.txn, verification)


def test_rewind_to_each_transaction_reproduces_the_versioned_state(story: dict) -> None:
    store: HistoryStore = story["store"]
    assert len(story["snapshots"]) == 3
    for tnx, snapshot in story["snapshots"]:
        assert rewound(store, "product", tnx) == snapshot


def test_rewind_by_tag_txn_and_time(story: dict) -> None:
    store: HistoryStore = story["store"]
    first = store.commits("product")[0]
    store.tag("product", "launch", "txn:1", message="first load")
    assert store.tags("product")["launch"]["tnx"] == first.tnx
    assert set(rewound(store, "product", "launch")) == {"A", "B"}
    assert rewound(store, "product", "launch") == rewound(store, "product", first.tnx)
    by_time = {r["id"] for r in store.state("product", ts=first.ts + timedelta(minutes=1)).collect()}
    assert by_time == {"A", "B"}
    with pytest.raises(HistoryError, match="no tag 'nope'"):
        store.state("product", at="nope")
    with pytest.raises(HistoryError, match="bad tag name"):
        store.tag("product", "123")
    store.untag("product", "launch")
    assert "launch" not in store.tags("product")


def test_diff_between_transactions(story: dict) -> None:
    store: HistoryStore = story["store"]
    c1, c2, _ = store.commits("product")
    d = {r["id"]: r["change"] for r in store.diff("product", c1.tnx, c2.tnx).collect()}
    assert d == {"A": "changed", "B": "changed"}
    d = {r["id"]: r["change"] for r in store.diff("product", c1.tnx).collect()}
    assert d == {"A": "changed", "B": "changed", "C": "added"}


def test_layer_view(story: dict) -> None:
    store: HistoryStore = story["store"]
    view = {
        r["id"]: (r["layer"], json.loads(r["state"]).get("name"))
        for r in store.layer_view("product", "override").collect()
    }
    # The delta's A shows over the base's; its C is deleted, which hides the base's C; B reads through.
    assert view == {"A": ("delta", "Toaster XL"), "B": ("base", "Kettle")}
    # Before the delta deleted C, the delta's C shows (the base had no C yet at its first transaction).
    view_before = store.layer_view("product", "override", base_at="txn:1", delta_at="txn:1")
    got = {r["id"]: (r["layer"], json.loads(r["state"]).get("name")) for r in view_before.collect()}
    assert got == {"A": ("delta", "Toaster XL"), "B": ("base", "Kettle"), "C": ("delta", "Mixer XL")}
