"""The history store over generated versioned-entity tables: the rewind property, PURGE, and crash recovery.

The tables are written straight into the lake (one open version per present key), so hypothesis can
explore many histories (creates, updates, deletes, recreates, purges, unchanged steps) without paying
for a versioning run per step; ``tests/assets/test_transaction_history.py`` runs the real versioning.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ngsi_assets.history_store import HEAD_DS, HistoryStore
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.ngsi.transactions import Action, tnx_of, uuid_of
from ngsi_assets.transforms.transaction_history import chain_breaks
from ngsi_assets.transforms.versioned_entities import bucket_column, guid_of
from resources.lake import LakeResource

SPACE = "thing"
KEYS = ["A", "B", "C", "D"]
BUCKETS = 2
TABLE = (
    "guid string, valid_from_timestamp timestamp, valid_to_timestamp timestamp, deleted_indicator boolean, "
    "code string, name string, size int, source_message string, field_provenance string"
)

State = tuple[bool, str | None, int | None]  # deleted, name, size
Step = dict[str, State]  # the present keys' open versions; an absent key has no rows (purged)

states = st.tuples(st.booleans(), st.sampled_from([None, "x", "y"]), st.sampled_from([None, 1, 2]))
steps = st.dictionaries(st.sampled_from(KEYS), states, max_size=len(KEYS))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=50)
        return self.now


def write_table(spark: SparkSession, lake: LakeResource, step: Step, n: int, space: str = SPACE) -> None:
    """The space's versioned-entities table holding ``step`` (every bucket replaced, empty ones too)."""
    rows = []
    for key, (deleted, name, size) in sorted(step.items()):
        prov = {"guid": {"m": f"m{n}", "p": 0}}
        if name is not None:
            prov["name"] = {"m": f"m{n}", "p": 0}
        if size is not None:
            prov["size"] = {"m": f"m{n}", "p": 0}
        rows.append(
            (
                guid_of(space, json.dumps([key])),
                datetime(2026, 1, 1) + timedelta(hours=n),
                None,
                deleted,
                key,
                name,
                size,
                f"m{n}",
                json.dumps(prov),
            )
        )
    df = spark.createDataFrame(rows, TABLE).withColumn("bucket", bucket_column(F.col("guid"), BUCKETS))
    lake.replace_folders(df, "versioned_entities", "bucket", list(range(BUCKETS)), subfolder=entity_folder(space))


def record(store: HistoryStore, spark: SparkSession, n: int):
    messages = spark.createDataFrame(
        [(f"m{n}", None, f"system{n}")], "message_identifier string, user string, source_system string"
    )
    with store.writer_lock():
        return store.record(SPACE, ("code",), messages)


def rewound(store: HistoryStore, at: int) -> Step:
    out = {}
    for r in store.state(SPACE, at=at).collect():
        s = json.loads(r["state"])
        out[r["id"]] = (s["deleted_indicator"], s.get("name"), s.get("size"))
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(steps, min_size=1, max_size=5))
def test_rewinding_to_each_transaction_reproduces_the_state(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, history: list[Step]
) -> None:
    lake = LakeResource(root=str(tmp_path_factory.mktemp("prop") / "lake"))
    store = HistoryStore(spark, lake, clock=Clock())
    snapshots: list[tuple[int, Step]] = []
    previous: Step = {}
    for n, step in enumerate(history, start=1):
        write_table(spark, lake, step, n)
        commit = record(store, spark, n)
        if not step and not previous:
            assert commit is None  # nothing before, nothing now
        else:
            assert commit is not None  # every version's source message and valid-from differ per step
        if commit is not None:
            snapshots.append((commit.tnx, dict(step)))
            assert commit.tnx == tnx_of(commit.ts, commit.txn)
        previous = step
    for tnx, snapshot in snapshots:
        assert rewound(store, tnx) == snapshot
    if snapshots:
        rows = store.history(SPACE)
        assert chain_breaks(rows).count() == 0
        all_rows = rows.collect()
        assert len({r["uuid"] for r in all_rows}) == len(all_rows)
        assert all(r["uuid"] == str(uuid_of(r["tnx"], r["i"])) for r in all_rows)
        assert sorted(r["i"] for r in all_rows) == list(range(1, len(all_rows) + 1))
        # Recording again without a change commits nothing.
        assert record(store, spark, len(history)) is None


@pytest.fixture
def store(spark: SparkSession, tmp_path: Path) -> HistoryStore:
    return HistoryStore(spark, LakeResource(root=str(tmp_path / "lake")), clock=Clock())


def actions(store: HistoryStore) -> list[tuple[int, str, str, bool]]:
    rows = store.history(SPACE).orderBy("i").collect()
    prev = {}
    out = []
    for r in rows:
        out.append((r["i"], Action(r["action"]).name, r["id"], r["puuid"] == prev.get(r["id"])))
        prev[r["id"]] = r["uuid"]
    return out


def test_purge_then_reappearance_starts_a_new_chain(spark: SparkSession, store: HistoryStore) -> None:
    lake = store.lake
    write_table(spark, lake, {"A": (False, "x", 1), "B": (False, "y", 2)}, 1)
    record(store, spark, 1)
    write_table(spark, lake, {"B": (False, "y", 2)}, 1)  # A's rows are gone (reprocessing withdrew them)
    purge = record(store, spark, 1)
    assert purge is not None and purge.commit_json["actions"] == {"PURGE": 1}
    write_table(spark, lake, {"A": (False, "z", 1), "B": (False, "y", 2)}, 1)
    record(store, spark, 1)
    assert actions(store) == [
        (1, "CREATE", "A", True),  # puuid None == no previous uuid
        (2, "CREATE", "B", True),
        (3, "PURGE", "A", True),  # puuid: the CREATE's uuid
        (4, "CREATE", "A", False),  # a new chain: puuid null, not the PURGE's uuid
    ]
    rows = {r["i"]: r for r in store.history(SPACE).collect()}
    assert rows[4]["puuid"] is None and rows[3]["puuid"] == rows[1]["uuid"]
    assert json.loads(rows[3]["state"])["name"] == "x"  # a PURGE carries the last state
    assert chain_breaks(store.history(SPACE)).count() == 0
    # Between the PURGE and the re-creation the feature does not exist; before it, it did.
    commits = store.commits(SPACE)
    assert set(rewound(store, commits[1].tnx)) == {"B"}
    assert rewound(store, commits[0].tnx)["A"] == (False, "x", 1)
    assert rewound(store, commits[2].tnx)["A"] == (False, "z", 1)


def test_chain_breaks_finds_a_broken_chain(spark: SparkSession, store: HistoryStore) -> None:
    write_table(spark, store.lake, {"A": (False, "x", 1)}, 1)
    record(store, spark, 1)
    write_table(spark, store.lake, {"A": (False, "y", 1)}, 2)
    record(store, spark, 2)
    rows = store.history(SPACE)
    broken = rows.withColumn(
        "puuid", F.when(F.col("i") == 2, F.lit("00000000-0000-4000-8000-000000000000")).otherwise(F.col("puuid"))
    )
    assert [(r["i"], r["reason"]) for r in chain_breaks(broken).collect()] == [(2, "puuid is not the previous uuid")]
    doubled = rows.withColumn("action", F.lit(int(Action.CREATE)))
    assert [(r["i"], r["reason"]) for r in chain_breaks(doubled).collect()] == [(2, "CREATE inside a chain")]


def test_crash_before_the_commit_leaves_no_rows(
    spark: SparkSession, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_table(spark, store.lake, {"A": (False, "x", 1)}, 1)
    record(store, spark, 1)
    write_table(spark, store.lake, {"A": (False, "y", 1), "B": (True, None, None)}, 2)
    fs_type = type(store.fs)
    real = fs_type.write_text

    def crash(self, uri: str, text: str) -> None:  # noqa: ANN001
        if uri.endswith(".json") and "transaction_log" in uri:
            raise OSError("disk gone")
        real(self, uri, text)

    monkeypatch.setattr(fs_type, "write_text", crash)
    with pytest.raises(OSError, match="disk gone"):
        record(store, spark, 2)
    monkeypatch.undo()
    assert [r["i"] for r in store.history(SPACE).collect()] == [1]  # txn 2's rows are not committed
    again = record(store, spark, 2)
    assert again is not None and again.txn == 2
    assert actions(store) == [(1, "CREATE", "A", True), (2, "UPDATE", "A", True), (3, "DELETE", "B", True)]


def test_crash_after_the_commit_is_replayed_onto_head(
    spark: SparkSession, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_table(spark, store.lake, {"A": (False, "x", 1)}, 1)
    record(store, spark, 1)
    write_table(spark, store.lake, {"A": (False, "y", 1)}, 2)
    real = store.lake.replace_in_subfolders

    def crash(df, dataset, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if dataset == HEAD_DS:
            raise OSError("killed")
        return real(df, dataset, *args, **kwargs)

    monkeypatch.setattr(type(store.lake), "replace_in_subfolders", lambda self, *a, **k: crash(*a, **k))
    with pytest.raises(OSError, match="killed"):
        record(store, spark, 2)
    monkeypatch.undo()
    # Committed, but HEAD still says A is "x": without recovery the next run would write A again.
    assert record(store, spark, 2) is None
    assert actions(store) == [(1, "CREATE", "A", True), (2, "UPDATE", "A", True)]
    write_table(spark, store.lake, {"A": (False, "z", 1)}, 3)
    assert record(store, spark, 3).txn == 3
    assert actions(store)[-1] == (3, "UPDATE", "A", True)


def test_the_asset_checks_fail_on_a_corrupted_history(spark: SparkSession, store: HistoryStore) -> None:
    from dataclasses import replace

    from ngsi_assets.assets.transaction_history import check_results

    write_table(spark, store.lake, {"A": (False, "x", 1)}, 1)
    first = record(store, spark, 1)
    assert {r.check_name: r.passed for r in check_results(store, [first])} == {
        "puuid_chains_unbroken": True,
        "uuids_unique": True,
        "tnx_non_decreasing": True,
    }
    # A transaction 2 that repeats transaction 1's rows (same uuid, a CREATE inside the chain), with a
    # tnx below transaction 1's.
    rows = store.history(SPACE).withColumn("txn", F.lit(2).cast("long"))
    store.lake.replace_folders(rows, "transaction_history", "txn", [2], subfolder=entity_folder(SPACE))
    bad = replace(first, txn=2, tnx=first.tnx - 1)
    store.fs.write_text(
        f"{store.lake.folder_uri('transaction_log', entity_folder(SPACE))}/{2:012d}.json", bad.to_json()
    )
    results = {r.check_name: r for r in check_results(store, [bad])}
    assert {k: r.passed for k, r in results.items()} == {
        "puuid_chains_unbroken": False,
        "uuids_unique": False,
        "tnx_non_decreasing": False,
    }
    # Written by hand, not recorded: its rows were never checked, which fails the checks too.
    assert results["uuids_unique"].metadata["transactions_not_verified"].value == 1


def test_record_finds_a_transaction_that_breaks_chains_and_repeats_uuids(
    spark: SparkSession, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of transaction 2 are checked against the features' rows before it, without reading the history."""
    import ngsi_assets.history_store as history_module
    from ngsi_assets.assets.transaction_history import check_results

    write_table(spark, store.lake, {"A": (False, "x", 1), "B": (False, "y", 1)}, 1)
    first = record(store, spark, 1)
    a_uuid = store.history(SPACE).where(F.col("id") == "A").first()["uuid"]
    numbered = history_module.number_changes

    def corrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        # A's update restarts its chain with a CREATE and takes transaction 1's uuid.
        rows = numbered(*args, **kwargs)
        is_a = F.col("id") == "A"
        return (
            rows.withColumn("action", F.when(is_a, F.lit(int(Action.CREATE))).otherwise(F.col("action")))
            .withColumn("puuid", F.when(is_a, F.lit(None).cast("string")).otherwise(F.col("puuid")))
            .withColumn("uuid", F.when(is_a, F.lit(a_uuid)).otherwise(F.col("uuid")))
        )

    monkeypatch.setattr(history_module, "number_changes", corrupted)
    write_table(spark, store.lake, {"A": (False, "x2", 2), "B": (False, "y2", 2)}, 2)
    second = record(store, spark, 2)
    verification = store.verification(SPACE, second.txn)
    assert verification is not None
    assert (verification.chain_breaks, verification.uuid_faults) == (1, 2)  # A's uuid: not its own, and taken
    assert [e["reason"] for e in verification.break_examples] == ["CREATE inside a chain"]
    results = {r.check_name: r.passed for r in check_results(store, [first, second])}
    assert results == {"puuid_chains_unbroken": False, "uuids_unique": False, "tnx_non_decreasing": True}
    # An honest third transaction passes.
    monkeypatch.undo()
    write_table(spark, store.lake, {"A": (False, "x3", 3), "B": (False, "y3", 3)}, 3)
    third = record(store, spark, 3)
    assert {r.check_name: r.passed for r in check_results(store, [third])} == {
        "puuid_chains_unbroken": True,
        "uuids_unique": True,
        "tnx_non_decreasing": True,
    }


def test_spaces_recorded_together_equal_spaces_recorded_one_by_one(spark: SparkSession, tmp_path: Path) -> None:
    """``record_all`` compares the spaces side by side but commits them in the order given: the same
    rows, HEAD and records as ``record`` space after space at the same time, global ids in that order."""
    at = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
    spaces = {"gamma": ("code",), "alpha": ("code",), "beta": ("code",), "unchanged": ("code",)}
    steps = [
        {"gamma": {"A": (False, "x", 1)}, "alpha": {"A": (False, "y", None), "B": (True, None, 2)}, "beta": {}},
        {"gamma": {"A": (False, "y", 1)}, "alpha": {"B": (False, "x", 2)}, "beta": {"C": (False, None, None)}},
    ]
    messages = spark.createDataFrame(
        [("m1", "u", "s"), ("m2", None, "s")], "message_identifier string, user string, source_system string"
    )

    def run(together: bool) -> tuple[LakeResource, HistoryStore, list]:
        lake = LakeResource(root=str(tmp_path / ("together" if together else "apart") / "lake"))
        store = HistoryStore(spark, lake, clock=lambda: at)
        made = []
        for n, step in enumerate(steps, start=1):
            for space, rows in step.items():
                write_table(spark, lake, rows, n, space)
            with store.writer_lock():
                if together:
                    made.append([c.space for c in store.record_all(spaces, messages, commit_msg="c")])
                else:
                    made.append(
                        [c.space for s, k in spaces.items() if (c := store.record(s, k, messages, commit_msg="c"))]
                    )
        return lake, store, made

    _, together, made_together = run(True)
    _, apart, made_apart = run(False)
    assert made_together == made_apart == [["gamma", "alpha"], ["gamma", "alpha", "beta"]]
    assert [c.as_dict() for c in together.transactions()] == [c.as_dict() for c in apart.transactions()]
    assert [c.space for c in together.transactions()] == ["gamma", "alpha", "gamma", "alpha", "beta"]
    for space in ("alpha", "beta", "gamma"):
        history = sorted(map(str, together.history(space).drop("ts").collect()))
        assert history and history == sorted(map(str, apart.history(space).drop("ts").collect()))
        assert sorted(map(str, together.head(space).collect())) == sorted(map(str, apart.head(space).collect()))
