"""The reprocessing sensor resolves a link once its parent arrives: message status 1 -> 3, end to end.

An order arrives before its customer: materializing its hour leaves the message in status 1 and
says so in the materialization's metadata; the customer lands in a later hour; the sensor asks for
the order's hour again once its delay has passed; that run resolves the link.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, build_sensor_context, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets import sensors
from ngsi_assets.assets.versioned_entities import versioned_entities
from ngsi_assets.definitions import defs as project_defs
from ngsi_assets.sensors import reprocessing_sensor
from ngsi_assets.transforms.versioned_entities import guid_of
from resources.lake import LakeResource
from resources.spark import default_spark_config
from resources.versioning import VersioningResource
from tests.assets.versioning_support import Msg, log_rows, store_messages, table_rows

SCHEMA = {
    "entities": {
        "customer": {"fields": {"customer_number": {"type": "text", "key": True}, "customer_name": {}}},
        "order": {
            "fields": {
                "order_number": {"type": "integer", "key": True},
                "order_customer": {"type": "link", "linkEntity": "customer", "linkKey": ["customer_number"]},
                "total_price": {"type": "decimal", "precision": 10, "scale": 2},
            }
        },
    },
    "sourceSystems": {
        "shop": {
            "mappings": {
                "order": [
                    {
                        "reference": "order",
                        "fields": [
                            {"reference": "order_number"},
                            {"reference": "order_customer", "sourceLinkKey": ["customer_number"]},
                            {"reference": "total_price"},
                        ],
                    }
                ]
            }
        }
    },
}
H1, H2 = "2026-03-01-10:00", "2026-03-01-11:00"
ORDER = Msg(
    "m-order",
    "order",
    "2019-06-05T10:00:00",
    [{"order_number": 123456, "customer_number": "918723", "customer_name": "Bill Jones", "total_price": 194.27}],
    hour=H1,
    source="shop",
)
CUSTOMER = Msg(
    "m-customer",
    "customer",
    "2019-06-05T09:00:00",
    [{"customer_number": "918723", "customer_name": "Bill Jones"}],
    hour=H2,
)


def test_sensor_reprocesses_until_the_link_resolves(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema_file = tmp_path / "schema.yaml"
    schema_file.write_text(yaml.safe_dump(SCHEMA))
    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {
        "spark": LazyPySparkResource(spark_config=default_spark_config("local[2]", shuffle_partitions=4, ui=False)),
        "lake": lake,
        "versioning": VersioningResource(schema_path=str(schema_file), buckets=2),
    }
    for var in ("INITIAL_DELAY_S", "BACKOFF_FACTOR", "MAX_DELAY_S", "MAX_ATTEMPTS", "MAX_RUNS_PER_TICK"):
        monkeypatch.delenv(f"NGSI_REPROCESS_{var}", raising=False)
    now = [datetime(2026, 3, 1, 12, 0, tzinfo=UTC)]
    monkeypatch.setattr(sensors, "utc_now", lambda: now[0])
    instance = DagsterInstance.ephemeral()
    cursor: list[str | None] = [None]

    def tick() -> list:
        ctx = build_sensor_context(instance=instance, cursor=cursor[0], definitions=project_defs)
        data = reprocessing_sensor.evaluate_tick(ctx)
        cursor[0] = data.cursor
        return list(data.run_requests or [])

    store_messages(spark, lake, [ORDER])
    result = materialize([versioned_entities], partition_key=H1, resources=resources, instance=instance)
    assert result.success
    meta = result.asset_materializations_for_node("versioned_entities")[0].metadata
    assert meta["messages_requiring_reprocessing"].value == 1
    assert log_rows(spark, lake)["m-order"][0] == 1
    assert tick() == []  # the first retry waits for its delay (60 s by default)

    store_messages(spark, lake, [CUSTOMER])
    assert materialize([versioned_entities], partition_key=H2, resources=resources, instance=instance).success
    now[0] += timedelta(seconds=61)
    requests = tick()
    assert [r.partition_key for r in requests] == [H1]

    rerun = materialize(
        [versioned_entities], partition_key=H1, resources=resources, instance=instance, tags=requests[0].tags
    )
    assert rerun.success
    assert (
        rerun.asset_materializations_for_node("versioned_entities")[0].metadata["messages_requiring_reprocessing"].value
        == 0
    )
    assert log_rows(spark, lake) == {"m-order": (3, None), "m-customer": (3, None)}
    assert table_rows(spark, lake, "order", ["order_number", "order_customer", "total_price", "source_message"]) == [
        (123456, guid_of("customer", '["918723"]'), Decimal("194.27"), "m-order")
    ]
    now[0] += timedelta(hours=2)
    assert tick() == []  # the hour is clear: nothing more to retry
