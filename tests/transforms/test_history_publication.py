"""Lake history rows -> publishable rows with the XYZ Feature JSON, on small frames with exact expected JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from ngsi_assets.transforms.history_publication import feature_rows
from ngsi_assets.transforms.transaction_history import HISTORY

pytestmark = pytest.mark.spark

# The lake's own history columns (an extra one, deleted, included to show it is ignored).
LAKE = StructType(
    [
        HISTORY[n]
        for n in (
            "i",
            "action",
            "tnx",
            "ts",
            "id",
            "uuid",
            "puuid",
            "last_updated_by",
            "created_at",
            "deleted",
            "state",
        )
    ]
)
T0 = datetime(2026, 11, 22, 8, 5, 1, 234000, tzinfo=UTC)  # 1795334701234 ms
T1 = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)  # 1795338000000 ms
U1, U2, U3 = (
    "01abb205-75bc-4d15-8000-000000000001",
    "01abb205-75bc-4d15-8000-000000000002",
    "01abb205-75bc-4d15-8000-000000000003",
)


def test_feature_json_per_action(spark: SparkSession) -> None:
    rows = [
        (1, 0, 11, T0, "p1", U1, "ignored-on-create", "ingest", T0, False, '{"name":"A \\"quoted\\"","price":1.50}'),
        (2, 1, 12, T1, "p1", U2, U1, None, T0, False, '{"name":"B","tags":["x",{"y":null}]}  '),
        (3, 2, 13, T1, "p/2", U3, None, "ingest", T0, True, "{}"),
        (4, 3, 14, T1, 'q"é', U3, U2, "ingest", T0, True, '{ "n" : 1 }'),
    ]
    out = feature_rows(spark.createDataFrame(rows, LAKE)).orderBy("i").collect()
    assert [r.asDict() for r in out] == [
        {
            "i": 1,
            "action": 0,
            "tnx": 11,
            "ts": out[0]["ts"],
            "id": "p1",
            "uuid": U1,
            "puuid": None,
            "last_updated_by": "ingest",
            "jsondata": '{"type":"Feature","id":"p1","properties":{"name":"A \\"quoted\\"","price":1.50,'
            f'"@ns:com:here:xyz":{{"uuid":"{U1}","action":"CREATE","tnx":11,'
            '"createdAt":1795334701234,"updatedAt":1795334701234}}}',
        },
        {
            "i": 2,
            "action": 1,
            "tnx": 12,
            "ts": out[1]["ts"],
            "id": "p1",
            "uuid": U2,
            "puuid": U1,
            "last_updated_by": None,
            "jsondata": '{"type":"Feature","id":"p1","properties":{"name":"B","tags":["x",{"y":null}],'
            f'"@ns:com:here:xyz":{{"uuid":"{U2}","puuid":"{U1}","action":"UPDATE","tnx":12,'
            '"createdAt":1795334701234,"updatedAt":1795338000000}}}',
        },
        {
            "i": 3,
            "action": 2,
            "tnx": 13,
            "ts": out[2]["ts"],
            "id": "p/2",
            "uuid": U3,
            "puuid": None,
            "last_updated_by": "ingest",
            "jsondata": '{"type":"Feature","id":"p/2","properties":{'
            f'"@ns:com:here:xyz":{{"uuid":"{U3}","action":"DELETE","tnx":13,'
            '"createdAt":1795334701234,"updatedAt":1795338000000}}}',
        },
        {
            "i": 4,
            "action": 3,
            "tnx": 14,
            "ts": out[3]["ts"],
            "id": 'q"é',
            "uuid": U3,
            "puuid": U2,
            "last_updated_by": "ingest",
            "jsondata": '{"type":"Feature","id":"q\\"é","properties":{ "n" : 1 ,'
            f'"@ns:com:here:xyz":{{"uuid":"{U3}","puuid":"{U2}","action":"PURGE","tnx":14,'
            '"createdAt":1795334701234,"updatedAt":1795338000000}}}',
        },
    ]
    # ts passes through untouched (PySpark hands it back as a naive local datetime).
    assert [r["ts"].astimezone(UTC) for r in out] == [T0, T1, T1, T1]
    # Every document is valid JSON with the namespace last.
    docs = [json.loads(r["jsondata"]) for r in out]
    assert [list(d["properties"])[-1] for d in docs] == ["@ns:com:here:xyz"] * 4
    assert docs[0]["properties"]["price"] == 1.5


@pytest.mark.parametrize(
    ("action", "state", "message"),
    [
        (4, "{}", "feature_rows: action outside 0..3 in history row i=9"),
        (1, "[1,2]", "feature_rows: state is not a JSON object in history row i=9"),
        (1, "not json", "feature_rows: state is not a JSON object in history row i=9"),
    ],
)
def test_bad_rows_fail_the_job_naming_the_row(spark: SparkSession, action: int, state: str, message: str) -> None:
    df = spark.createDataFrame([(9, action, 1, T0, "x", U1, None, None, T0, False, state)], LAKE)
    with pytest.raises(Exception, match=message):
        feature_rows(df).collect()
