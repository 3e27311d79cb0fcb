"""The one wiring point: assets, checks, jobs, sensors and resources."""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from ngsi_assets import settings
from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.sensors import ingest_job, landing_sensor
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.spark import spark_resource


def build_resources() -> dict[str, object]:
    """The resources for this environment (embedded default unless the NGSI_* variables say so)."""
    return {
        "spark": spark_resource(),
        "lake": LakeResource(root=settings.lake_root()),
        "landing": LandingZoneResource(root=settings.landing_root()),
    }


defs = Definitions(
    assets=[message_store, ngsi_events],
    jobs=[ingest_job],
    sensors=[landing_sensor],
    resources=build_resources(),
    # Every Spark asset of a run shares one process, hence one Spark session (starting one costs
    # several seconds); a backfill over many hours is one run (BackfillPolicy.single_run).
    executor=in_process_executor,
)
