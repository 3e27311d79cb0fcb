"""Property: any partitioning of messages into hours, processed in any order, gives the tables that
processing every message in effective-timestamp order gives.

The expected tables come from the pure fold applied to the messages in effective order (Python, no
Spark); the Spark pipeline gets the same messages spread over random hours, run in a random order,
each hour one run (late messages, reruns of the same keys, deletes and two priorities included).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from ngsi_assets.ngsi.versioning import DELETE, UPSERT, Record, fold_key, provenance_json
from ngsi_assets.transforms.versioned_entities import guid_of
from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, process, schema_of, store_messages, table_rows

SCHEMA = schema_of(
    {
        "entities": {"item": {"fields": {"code": {"type": "integer", "key": True}, "label": {}, "colour": {}}}},
        "sourceSystems": {
            "low": {"mappings": {"item": [{"reference": "item", "priority": 0}]}},
            "high": {"mappings": {"item": [{"reference": "item", "priority": 1}]}},
        },
    }
)
HOURS = ["2026-03-01-10:00", "2026-03-01-11:00", "2026-03-01-12:00"]
COLUMNS = ["guid", "valid_from_timestamp", "valid_to_timestamp", "deleted_indicator", "code", "label", "colour",
           "source_message", "field_provenance"]  # fmt: skip

_record = st.fixed_dictionaries(
    {"code": st.integers(1, 3)},
    optional={
        "label": st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
        "colour": st.sampled_from(["red", "blue"]),
        "deleted_indicator": st.just(True),
    },
)
_message = st.tuples(
    st.integers(0, 59),  # effective minute (distinct per message, see unique_by)
    st.sampled_from(["low", "high"]),
    st.lists(_record, min_size=1, max_size=3, unique_by=lambda r: r["code"]),
    st.sampled_from(HOURS),  # the hour it is received in
)


def expected_rows(messages: list[Msg]) -> list[tuple]:
    """The table from the pure fold, every message applied in effective-timestamp order."""
    by_key: dict[int, list[Record]] = {}
    for m in messages:
        priority = 1 if m.source == "high" else 0
        for seq, rec in enumerate(m.data, start=1):
            deleted = rec.get("deleted_indicator") is True
            fields = {k: (None if v is None else str(v)) for k, v in rec.items() if k != "deleted_indicator"}
            if deleted:
                fields = {"code": fields["code"]}
            by_key.setdefault(rec["code"], []).append(
                Record(
                    guid_of("item", json.dumps([str(rec["code"])])),
                    datetime.fromisoformat(m.effective),
                    m.mid,
                    seq,
                    DELETE if deleted else UPSERT,
                    priority,
                    fields,
                    {},
                    ("code",),
                )
            )
    rows = []
    for code, records in by_key.items():
        ordered = sorted(records, key=lambda r: (r.effective, r.message, r.seq))
        for v in fold_key(ordered):
            rows.append(
                (
                    v.guid,
                    v.valid_from,
                    v.valid_to,
                    v.deleted,
                    code,
                    v.fields.get("label"),
                    v.fields.get("colour"),
                    v.source_message,
                    json.dumps(provenance_json(v.provenance), separators=(",", ":")),
                )
            )
    return sorted(rows, key=repr)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(_message, min_size=1, max_size=6, unique_by=lambda m: m[0]), st.randoms(use_true_random=False))
def test_any_partitioning_and_order_gives_the_effective_order_tables(spark: SparkSession, messages, rnd) -> None:
    msgs = [
        Msg(f"m{i:02d}", "item", f"2019-06-05T10:{minute:02d}:00", data, hour=hour, source=source)
        for i, (minute, source, data, hour) in enumerate(messages)
    ]
    root = tempfile.mkdtemp(prefix="versioning-property-")
    try:
        lake = LakeResource(root=root)
        hours = store_messages(spark, lake, msgs)
        rnd.shuffle(hours)
        for hour in hours:
            process(spark, lake, SCHEMA, [hour], buckets=2)
        expected = expected_rows(msgs)
        got = table_rows(spark, lake, "item", COLUMNS) if expected else []
        assert got == expected
    finally:
        shutil.rmtree(root, ignore_errors=True)
