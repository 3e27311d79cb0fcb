"""Which target entity a run's source records go to, decided for all of them at once: NGSI types the
schema maps (through the ``ngsi`` source system's mappings, or by a target entity's own name), NGSI
types it does not (default entities, one table per type), and records with no target (errors in the
message log). A run folds them whole or as increments alike."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.assets.versioned_entities import VERSIONS_DS, fold_hours
from ngsi_assets.ngsi.constants import MessageStatus
from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENTS
from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, log_rows, schema_of, table_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOUR = "2026-03-01-10:00"
SCHEMA = schema_of(
    {
        "entities": {
            # NGSI type "truck" maps here by the entity's name.
            "truck": {"fields": {"entity_id": {"type": "text", "key": True}, "load": {"type": "integer"}}},
            # NGSI type "Store" maps here through the ngsi source system's mapping.
            "shop": {"fields": {"entity_id": {"type": "text", "key": True}, "name": {"type": "text"}}},
        },
        "sourceSystems": {"ngsi": {"mappings": {"Store": [{"reference": "shop"}]}}},
    }
)


def _event(mid: str, minute: int, etype: str | None, eid: str, attr: str, value: str) -> dict:
    when = datetime(2026, 3, 1, 10, minute, tzinfo=UTC)
    return {
        "recvTimeTs": int(when.timestamp() * 1000),
        "recvTime": when.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "fiwareService": "city",
        "fiwareServicePath": "/",
        "entityId": eid,
        "entityType": etype,
        "attrName": attr,
        "attrType": "Text",
        "attrValue": value,
        "attrMd": "[]",
        "datasetId": None,
        "timeIndex": when.replace(tzinfo=None),
        "timeIndexSource": "recvTime",
        "alterationType": None,
        "messageId": mid,
        "entityIndex": 0,
        "dt": "2026-03-01-10",
    }


EVENTS = [
    _event("n1", 1, "Car", "car1", "speed", "10"),
    _event("n2", 2, "truck", "t1", "load", "7"),
    _event("n3", 3, "Store", "s1", "name", "Corner"),
    _event("n4", 4, None, "x1", "speed", "1"),  # no type: no target entity
    _event("n5", 5, "Car", "car2", "speed", "20"),
    _event("n6", 6, "Bike", "b1", "speed", "5"),
    _event("n7", 8, "Car", "car3", "guid", "x"),  # an attribute named like a column of the table
]
# A data-hub message for an entity neither the schema nor its mappings know.
GHOST = Msg("d1", "ghost", "2026-03-01T10:07:00", [{"a": 1}], source="hub")


def _lake(spark: SparkSession, root: Path, increments: bool) -> LakeResource:
    lake = LakeResource(root=str(root))
    events = spark.createDataFrame(EVENTS, NGSI_EVENTS)
    messages = spark.createDataFrame([GHOST.row(minute=7)], MESSAGE_STORE)
    if increments:  # two increments, each folded on its own
        halves = (events.where("messageId < 'n4'"), events.where("messageId >= 'n4'"))
        lake.append_increment(halves[0], "ngsi_events", HOUR, "01")
        lake.mark_increment_done("ngsi_events", HOUR, "01")
        assert fold_hours(spark, lake, SCHEMA, 4, [HOUR], new_only=True).how == "1 increments"
        lake.append_increment(halves[1], "ngsi_events", HOUR, "02")
        lake.append_increment(messages, "message_store", HOUR, "02")
        lake.mark_increment_done("ngsi_events", HOUR, "02")
        assert fold_hours(spark, lake, SCHEMA, 4, [HOUR], new_only=True).how == "1 increments"
    else:
        lake.replace_partitions(events, "ngsi_events", [HOUR])
        lake.replace_partitions(messages, "message_store", [HOUR])
        assert fold_hours(spark, lake, SCHEMA, 4, [HOUR], new_only=False).how == "whole"
    return lake


@pytest.mark.parametrize("increments", [False, True], ids=["whole", "increments"])
def test_each_record_goes_to_its_target_entity_or_is_an_error(
    spark: SparkSession, tmp_path: Path, increments: bool
) -> None:
    lake = _lake(spark, tmp_path / "lake", increments)
    folders = sorted(lake.files().list_folders(lake.dataset_uri(VERSIONS_DS)))
    assert folders == sorted(entity_folder(e) for e in ("Bike", "Car", "shop", "truck"))
    assert table_rows(spark, lake, "truck", ["entity_id", "load"]) == [("t1", 7)]
    assert table_rows(spark, lake, "shop", ["entity_id", "name"]) == [("s1", "Corner")]
    assert table_rows(spark, lake, "Car", ["entity_id", "entity_type", "speed"]) == [
        ("car1", "Car", "10"),
        ("car2", "Car", "20"),
    ]
    assert table_rows(spark, lake, "Bike", ["entity_id", "speed"]) == [("b1", "5")]
    log = log_rows(spark, lake)
    done = int(MessageStatus.PROCESSED)
    assert {m: s for m, (s, _) in log.items() if s == done} == {m: done for m in ("n1", "n2", "n3", "n5", "n6")}
    assert log["n4"] == (int(MessageStatus.ERROR), "record 1: entity has no type")
    clash = "Car record 1: attribute names clash with columns of the target table: guid"
    assert log["n7"] == (int(MessageStatus.ERROR), clash)
    assert log["d1"][0] == int(MessageStatus.ERROR)
    assert "no target entity 'ghost'" in (log["d1"][1] or "")
