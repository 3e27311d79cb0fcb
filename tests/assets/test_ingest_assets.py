"""message_store and ngsi_events materialized through Dagster on a small landing zone.

Full output tables are compared with the expected rows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, Definitions, define_asset_job, in_process_executor, materialize
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.ingest.landing import LandingWriter
from ngsi_assets.ngsi.envelope import Envelope
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENT_REJECTS, NGSI_EVENTS
from resources.lake import LakeResource
from resources.landing import LandingZoneResource

H10 = "2026-03-01-10:00"
H11 = "2026-03-01-11:00"
T10 = int(datetime(2026, 3, 1, 10, 15, tzinfo=UTC).timestamp() * 1000)
T11 = int(datetime(2026, 3, 1, 11, 5, tzinfo=UTC).timestamp() * 1000)

CAR = {
    "subscriptionId": "sub-cars",
    "data": [
        {
            "id": "car1",
            "type": "car",
            "speed": {
                "type": "Float",
                "value": 112.9,
                "metadata": {"TimeInstant": {"type": "DateTime", "value": "2026-03-01T09:58:00.250Z"}},
            },
            "oil_level": {"type": "Float", "value": 74.6, "metadata": {}},
            "alterationType": {"type": "Text", "value": "entityUpdate"},
        }
    ],
}
AIR = {
    "subscriptionId": "sub-air",
    "data": [
        {"id": "aq1", "type": "AirQualityObserved", "NO2": 22, "TimeInstant": "2026-03-01T09:00:00Z"},
        {"id": "aq2", "type": "AirQualityObserved", "NO2": None, "dateModified": "2026-03-01T09:30:00Z"},
    ],
}
PARKING = {
    "id": "urn:ngsi-ld:Notification:1",
    "type": "Notification",
    "subscriptionId": "sub-parking",
    "notifiedAt": "2026-03-01T10:14:59Z",
    "data": [
        {
            "id": "urn:ngsi-ld:ParkingSpot:p1",
            "type": "ParkingSpot",
            "status": {"type": "Property", "value": "free", "observedAt": "2026-03-01T10:10:00Z"},
            "refParkingSite": {"type": "Relationship", "object": "urn:ngsi-ld:ParkingSite:s1"},
        }
    ],
}
WASTE_EMPTY = {"id": "w1", "type": "WasteContainer"}
PRODUCT = {
    "entity": "product",
    "timestamp": "2019-06-05T09:31:17.000",
    "guid": "g-1",
    "source": "erp",
    "user": "alice",
    "data": [{"product_number": 1234567, "product_description": "Breville Toaster"}],
}


def _env(mid: str, recv_ms: int, kind: str, fmt: str, service: str, path: str, body: dict, **kw) -> Envelope:
    return Envelope(
        message_id=mid,
        recv_ms=recv_ms,
        kind=kind,
        format=fmt,
        service=service,
        service_path=path,
        correlator=kw.get("correlator"),
        cbnotif=kw.get("cbnotif"),
        guid=kw.get("guid"),
        origin="http",
        body=json.dumps(body).encode(),
    )


@pytest.fixture()
def landing_and_lake(tmp_path: Path) -> tuple[Path, Path]:
    landing = tmp_path / "landing"
    with LandingWriter(landing) as writer:
        writer.append_many_blocking(
            [
                _env("m01", T10, "ngsi-v2", "normalized", "vehicles", "/4wheels", CAR, correlator="c-1", cbnotif=1),
                _env("m02", T10 + 1, "ngsi-v2", "keyValues", "environment", "/north,/south", AIR),
                _env("m03", T10 + 2, "ngsi-ld", "ld-normalized", "parking", "/", PARKING),
                _env("m04", T10 + 3, "ngsi-v2", "simplifiedKeyValues", "waste", "/containers", WASTE_EMPTY),
                _env("m05", T10 + 4, "message", "datahub", "default", "/", PRODUCT, guid="g-1"),
                _env("m06", T11, "message", "datahub", "default", "/", PRODUCT, guid="g-1"),  # same guid, next hour
            ]
        )
    return landing, tmp_path / "lake"


def _resources(landing: Path, lake: Path) -> dict[str, object]:
    return {
        "spark": LazyPySparkResource(spark_config={}),
        "lake": LakeResource(root=str(lake)),
        "landing": LandingZoneResource(root=str(landing)),
    }


def _check(landing: Path, lake: Path, key: str) -> dict[str, bool]:
    """Materialize both assets for one hour; whether each asset check passed."""
    result = materialize(
        [message_store, ngsi_events],
        partition_key=key,
        resources=_resources(landing, lake),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    return {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


def _run(landing: Path, lake: Path, key: str) -> None:
    checks = _check(landing, lake, key)
    assert len(checks) == 5 and all(checks.values()), checks


def _rows(spark: SparkSession, lake: Path, dataset: str, schema, columns: list[str]) -> list[tuple]:
    df = LakeResource(root=str(lake)).read(spark, dataset, schema)
    return sorted(tuple(r) for r in df.select(*columns).collect())


def test_message_store_full_table(spark: SparkSession, landing_and_lake: tuple[Path, Path]) -> None:
    landing, lake = landing_and_lake
    _run(landing, lake, H10)
    _run(landing, lake, H11)
    cols = ["message_identifier", "source_entity", "effective_timestamp", "status", "error_text", "kind", "format",
            "service", "service_path", "correlator", "cbnotif", "guid", "subscription_id", "refresh",
            "source_system", "user", "dt"]  # fmt: skip
    t = datetime.fromtimestamp
    assert _rows(spark, lake, "message_store", MESSAGE_STORE, cols) == sorted(
        [
            ("m01", "car", t(T10 / 1000, UTC).replace(tzinfo=None), 0, None, "ngsi-v2", "normalized", "vehicles",
             "/4wheels", "c-1", 1, None, "sub-cars", None, None, None, "2026-03-01-10"),
            ("m02", "AirQualityObserved", t((T10 + 1) / 1000, UTC).replace(tzinfo=None), 0, None, "ngsi-v2",
             "keyValues", "environment", "/north,/south", None, None, None, "sub-air", None, None, None,
             "2026-03-01-10"),
            ("m03", "ParkingSpot", datetime(2026, 3, 1, 10, 14, 59), 0, None, "ngsi-ld", "ld-normalized", "parking",
             "/", None, None, None, "sub-parking", None, None, None, "2026-03-01-10"),
            ("m04", "WasteContainer", t((T10 + 3) / 1000, UTC).replace(tzinfo=None), 0, None, "ngsi-v2",
             "simplifiedKeyValues", "waste", "/containers", None, None, None, None, None, None, None,
             "2026-03-01-10"),
            ("m05", "product", datetime(2019, 6, 5, 9, 31, 17), 0, None, "message", "datahub", "default", "/", None,
             None, "g-1", None, False, "erp", "alice", "2026-03-01-10"),
            ("m06", "product", datetime(2019, 6, 5, 9, 31, 17), 5, "guid previously received", "message", "datahub",
             "default", "/", None, None, "g-1", None, False, "erp", "alice", "2026-03-01-11"),
        ]
    )  # fmt: skip
    data = LakeResource(root=str(lake)).read(spark, "message_store", MESSAGE_STORE).where("message_identifier='m05'")
    assert json.loads(data.first()["data"]) == PRODUCT


def test_ngsi_events_full_table(spark: SparkSession, landing_and_lake: tuple[Path, Path]) -> None:
    landing, lake = landing_and_lake
    _run(landing, lake, H10)
    cols = ["recvTimeTs", "recvTime", "fiwareService", "fiwareServicePath", "entityId", "entityType", "attrName",
            "attrType", "attrValue", "attrMd", "datasetId", "timeIndex", "timeIndexSource", "alterationType",
            "messageId", "entityIndex", "dt"]  # fmt: skip
    r10 = "2026-03-01T10:15:00.000Z"
    r10_1 = "2026-03-01T10:15:00.001Z"
    r10_2 = "2026-03-01T10:15:00.002Z"
    md_speed = '[{"name":"TimeInstant","type":"DateTime","value":"2026-03-01T09:58:00.250Z"}]'
    dt = "2026-03-01-10"
    assert _rows(spark, lake, "ngsi_events", NGSI_EVENTS, cols) == sorted(
        [
            (T10, r10, "vehicles", "/4wheels", "car1", "car", "speed", "Float", "112.9", md_speed, None,
             datetime(2026, 3, 1, 9, 58, 0, 250000), "TimeInstant metadata", "entityUpdate", "m01", 0, dt),
            (T10, r10, "vehicles", "/4wheels", "car1", "car", "oil_level", "Float", "74.6", "[]", None,
             datetime(2026, 3, 1, 10, 15), "recvTime", "entityUpdate", "m01", 0, dt),
            (T10 + 1, r10_1, "environment", "/north", "aq1", "AirQualityObserved", "NO2", None, "22", "[]", None,
             datetime(2026, 3, 1, 9, 0), "TimeInstant", None, "m02", 0, dt),
            (T10 + 1, r10_1, "environment", "/north", "aq1", "AirQualityObserved", "TimeInstant", None,
             "2026-03-01T09:00:00Z", "[]", None, datetime(2026, 3, 1, 9, 0), "TimeInstant", None, "m02", 0, dt),
            (T10 + 1, r10_1, "environment", "/south", "aq2", "AirQualityObserved", "NO2", None, None, "[]", None,
             datetime(2026, 3, 1, 9, 30), "dateModified", None, "m02", 1, dt),
            (T10 + 1, r10_1, "environment", "/south", "aq2", "AirQualityObserved", "dateModified", None,
             "2026-03-01T09:30:00Z", "[]", None, datetime(2026, 3, 1, 9, 30), "dateModified", None, "m02", 1, dt),
            (T10 + 2, r10_2, "parking", "/", "urn:ngsi-ld:ParkingSpot:p1", "ParkingSpot", "status", "Property", "free",
             '[{"name":"observedAt","value":"2026-03-01T10:10:00Z"}]', None, datetime(2026, 3, 1, 10, 10),
             "observedAt", None, "m03", 0, dt),
            (T10 + 2, r10_2, "parking", "/", "urn:ngsi-ld:ParkingSpot:p1", "ParkingSpot", "refParkingSite",
             "Relationship", "urn:ngsi-ld:ParkingSite:s1", "[]", None, datetime(2026, 3, 1, 10, 15, 0, 2000),
             "recvTime", None, "m03", 0, dt),
        ]
    )  # fmt: skip
    assert _rows(spark, lake, "ngsi_event_rejects", NGSI_EVENT_REJECTS, ["messageId", "reason", "dt"]) == [
        ("m04", "entity 'w1' carries no attribute", dt)
    ]


def test_rerunning_a_partition_changes_nothing(spark: SparkSession, landing_and_lake: tuple[Path, Path]) -> None:
    landing, lake = landing_and_lake
    _run(landing, lake, H10)
    first = {
        name: _rows(spark, lake, name, schema, schema.fieldNames())
        for name, schema in [("message_store", MESSAGE_STORE), ("ngsi_events", NGSI_EVENTS)]
    }
    _run(landing, lake, H10)
    again = {
        name: _rows(spark, lake, name, schema, schema.fieldNames())
        for name, schema in [("message_store", MESSAGE_STORE), ("ngsi_events", NGSI_EVENTS)]
    }
    assert first == again
    assert len(first["message_store"]) == 5 and len(first["ngsi_events"]) == 8


def test_backfill_of_several_hours_is_one_run_equal_to_hourly_runs(
    spark: SparkSession, landing_and_lake: tuple[Path, Path], tmp_path: Path
) -> None:

    landing, lake = landing_and_lake
    _run(landing, lake, H10)
    _run(landing, lake, H11)
    datasets = [
        ("message_store", MESSAGE_STORE),
        ("ngsi_events", NGSI_EVENTS),
        ("ngsi_event_rejects", NGSI_EVENT_REJECTS),
    ]
    hourly = {name: _rows(spark, lake, name, schema, schema.fieldNames()) for name, schema in datasets}

    backfill_lake = tmp_path / "lake-backfill"
    defs = Definitions(
        assets=[message_store, ngsi_events],
        jobs=[define_asset_job("j", selection=[message_store, ngsi_events])],
        resources=_resources(landing, backfill_lake),
        executor=in_process_executor,
    )
    result = defs.resolve_job_def("j").execute_in_process(
        instance=DagsterInstance.ephemeral(),
        tags={ASSET_PARTITION_RANGE_START_TAG: H10, ASSET_PARTITION_RANGE_END_TAG: H11},
    )
    assert result.success
    # One run, one step per asset, each covering both hours.
    assert sorted(e.step_key for e in result.all_events if e.event_type_value == "STEP_START") == [
        "message_store",
        "ngsi_events",
    ]
    backfilled = {name: _rows(spark, backfill_lake, name, schema, schema.fieldNames()) for name, schema in datasets}
    assert backfilled == hourly
    assert {r[-1] for r in backfilled["message_store"]} == {"2026-03-01-10", "2026-03-01-11"}


def test_a_corrupt_complete_landing_line_fails_the_check(
    spark: SparkSession, landing_and_lake: tuple[Path, Path]
) -> None:
    landing, lake = landing_and_lake
    segment = next((landing / "dt=2026-03-01-10").glob("*.jsonl"))
    with open(segment, "ab") as f:
        f.write(b'{"message_id":"bad","recv_ms":1,"body":{"truncated"\n')  # complete line, not an envelope
    checks = _check(landing, lake, H10)
    assert checks["every_landed_line_stored"] is False
    assert checks["every_message_accounted_for"] is True


def test_a_torn_tail_passes_the_check(spark: SparkSession, landing_and_lake: tuple[Path, Path]) -> None:
    landing, lake = landing_and_lake
    segment = next((landing / "dt=2026-03-01-10").glob("*.jsonl"))
    with open(segment, "ab") as f:
        f.write(b'{"message_id":"torn","recv_ms":1,"ki')  # a crash mid-write: never acknowledged
    assert _check(landing, lake, H10)["every_landed_line_stored"] is True


def test_events_missing_for_a_message_fail_the_check(
    spark: SparkSession, landing_and_lake: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ngsi_assets.assets.ingest as ingest_assets

    real = ingest_assets.to_ngsi_events
    monkeypatch.setattr(ingest_assets, "to_ngsi_events", lambda ms: real(ms).where("messageId != 'm01'"))
    landing, lake = landing_and_lake
    checks = _check(landing, lake, H10)
    assert checks["every_message_accounted_for"] is False
    assert checks["every_landed_line_stored"] is True


def test_hours_materialized_out_of_order_fail_the_guid_check(
    spark: SparkSession, landing_and_lake: tuple[Path, Path]
) -> None:
    landing, lake = landing_and_lake
    # Hour 11 first: its message with guid g-1 cannot see hour 10's yet, so both get processed...
    assert _check(landing, lake, H11)["guids_processed_once"] is True
    assert _check(landing, lake, H10)["guids_processed_once"] is False
    # ... and rematerializing the later hour, as the check says, repairs it.
    assert _check(landing, lake, H11)["guids_processed_once"] is True
    store = LakeResource(root=str(lake)).read(spark, "message_store", MESSAGE_STORE).where("guid = 'g-1'")
    assert sorted((r["message_identifier"], r["status"]) for r in store.collect()) == [("m05", 0), ("m06", 5)]


def test_a_whole_hour_without_guids_does_not_read_earlier_hours(
    spark: SparkSession, landing_and_lake: tuple[Path, Path]
) -> None:
    """Guids are checked against every earlier hour only when the run's lines carry one: an earlier hour
    made unreadable stops a run with guids, not one without (its cost does not grow with history)."""
    landing, lake = landing_and_lake
    _run(landing, lake, H10)
    h12, h13 = T10 + 2 * 3_600_000, T10 + 3 * 3_600_000
    with LandingWriter(landing) as writer:
        writer.append_many_blocking(
            [
                _env("m20", h12, "ngsi-v2", "normalized", "vehicles", "/4wheels", CAR),
                _env("m30", h13, "message", "datahub", "default", "/", PRODUCT, guid="g-3"),
            ]
        )
    (lake / "message_store" / "dt=2026-03-01-10" / "part-damaged.parquet").write_bytes(b"not parquet")

    def materialize_store(key: str) -> bool:
        return materialize(
            [message_store],
            partition_key=key,
            resources=_resources(landing, lake),
            instance=DagsterInstance.ephemeral(),
            raise_on_error=False,
        ).success

    assert materialize_store("2026-03-01-12:00")
    assert not materialize_store("2026-03-01-13:00")
