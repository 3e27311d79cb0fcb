"""Property: after real versioning runs over random messages, hours and run orders, rewinding the
transaction history to each transaction gives exactly the open versions the table had at that point.

Each hour is one versioning run followed by one history transaction; every column of every open row
(guid, valid_from, deleted, key, fields, source_message, field_provenance) is compared with the state
the history holds, so nothing the versioned entities know is lost in the history.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from ngsi_assets.history_store import HistoryStore
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from ngsi_assets.transforms.transaction_history import chain_breaks
from resources.lake import LakeResource
from tests.assets.test_versioning_property import COLUMNS, SCHEMA, _message
from tests.assets.versioning_support import Msg, process, store_messages, table_rows


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 13, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=40)
        return self.now


def _utc(value: datetime) -> datetime:
    """A collected Spark timestamp (naive, process-local) as an aware UTC datetime."""
    return value.astimezone(UTC) if value.tzinfo is None else value


def open_rows(spark: SparkSession, lake: LakeResource) -> dict[str, dict]:
    """The item table's open rows by key, every column, nulls left out (as the history's state does)."""
    out = {}
    for row in table_rows(spark, lake, "item", COLUMNS):
        r = dict(zip(COLUMNS, row, strict=True))
        if r.pop("valid_to_timestamp") is not None:
            continue
        r["valid_from_timestamp"] = _utc(r["valid_from_timestamp"])
        r["field_provenance"] = json.loads(r["field_provenance"])
        out[str(r["code"])] = {k: v for k, v in r.items() if v is not None}
    return out


def rewound(store: HistoryStore, tnx: int) -> dict[str, dict]:
    out = {}
    for r in store.state("item", at=tnx).collect():
        s = json.loads(r["state"])
        s["valid_from_timestamp"] = datetime.fromisoformat(s["valid_from_timestamp"])
        out[r["id"]] = s
    return out


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(_message, min_size=1, max_size=6, unique_by=lambda m: m[0]), st.randoms(use_true_random=False))
def test_rewinding_to_each_transaction_gives_the_table_of_that_moment(spark: SparkSession, messages, rnd) -> None:
    msgs = [
        Msg(f"m{i:02d}", "item", f"2019-06-05T10:{minute:02d}:00", data, hour=hour, source=source)
        for i, (minute, source, data, hour) in enumerate(messages)
    ]
    root = tempfile.mkdtemp(prefix="history-property-")
    try:
        lake = LakeResource(root=root)
        store = HistoryStore(spark, lake, clock=Clock())
        hours = store_messages(spark, lake, msgs)
        rnd.shuffle(hours)
        hours.append(hours[0])  # and one hour rerun: it must commit nothing
        snapshots: list[tuple[int, dict[str, dict]]] = []
        commits = []
        for hour in hours:
            process(spark, lake, SCHEMA, [hour], buckets=2)
            who = lake.read(spark, "message_store", MESSAGE_STORE, [hour]).select(
                "message_identifier", "user", "source_system"
            )
            with store.writer_lock():
                commit = store.record("item", ("code",), who)
            commits.append(commit)
            if commit is not None:
                snapshots.append((commit.tnx, open_rows(spark, lake)))
        assert commits[-1] is None
        for tnx, snapshot in snapshots:
            assert rewound(store, tnx) == snapshot
        if snapshots:
            assert chain_breaks(store.history("item")).count() == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
