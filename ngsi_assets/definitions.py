"""The one wiring point: assets, checks, jobs, sensors, schedules and resources."""

from __future__ import annotations

import atexit
import gc

from dagster import Definitions

from ngsi_assets import settings
from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.assets.mongo_raw import mongo_raw
from ngsi_assets.assets.sql_sinks import historic_tables, last_data
from ngsi_assets.assets.sth import sth_aggregates
from ngsi_assets.assets.transaction_history import transaction_history
from ngsi_assets.assets.versioned_entities import versioned_entities
from ngsi_assets.compaction import last_data_compaction_job, last_data_compaction_schedule
from ngsi_assets.executor import side_by_side_executor
from ngsi_assets.freshness import freshness_checks, freshness_sensor
from ngsi_assets.sensors import (
    DERIVED_LANE,
    INGEST_LANE,
    derived_job,
    increment_job,
    ingest_job,
    landing_sensor,
    reprocess_job,
    reprocessing_sensor,
)
from resources.history import TransactionHistoryResource
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.mongo_raw import MongoRawSinkResource
from resources.spark import BACKGROUND_POOL, FRESH_POOL, spark_resource
from resources.sql_sinks import SqlSinksResource
from resources.sth_mongo import STHSinkResource
from resources.versioning import VersioningResource

# Every process that loads these definitions (each run's, the daemon's, the UI's, ``ngsi-assets
# materialize``'s) ends with the interpreter's last garbage collections walking every object Dagster,
# Spark and their imports made: 0.9-1.2 s at the end of a ``materialize`` process on two cores (0.1 s
# frozen), and as much of a core beside the next run at the end of each run's. Frozen at the exit,
# they are left to it; what the exit handlers that run after this one make is collected as usual.
atexit.register(gc.freeze)


def build_resources() -> dict[str, object]:
    """The resources for this environment (embedded default unless the NGSI_* variables say so)."""
    return {
        # On a shared Spark Connect server, the increments' jobs go first (a whole-hour run carries both
        # lane tags: it brings last data too); the derived lane gets the cores they leave.
        "spark": spark_resource(pools_by_tag={INGEST_LANE: FRESH_POOL, DERIVED_LANE: BACKGROUND_POOL}),
        "lake": LakeResource(root=settings.lake_root()),
        "landing": LandingZoneResource(root=settings.landing_root()),
        # Off unless NGSI_POSTGRES_URL / NGSI_MYSQL_URL / NGSI_SQL_SINKS_CONFIG say otherwise.
        "sql_sinks": SqlSinksResource(),
        # Lake aggregates always; MongoDB publishing only when NGSI_MONGO_URL is set (NGSI_STH_* parameters).
        "sth": STHSinkResource.from_env(),
        # Off unless NGSI_MONGO_RAW_ENABLED=true (with NGSI_MONGO_URL and the NGSI_MONGO_RAW_* parameters).
        "mongo_raw_sink": MongoRawSinkResource.from_env(),
        "versioning": VersioningResource(schema_path=settings.entity_schema_path(), buckets=settings.entity_buckets()),
        # Lake always; published to PostgreSQL when NGSI_HISTORY_POSTGRES_URL (or NGSI_POSTGRES_URL) is set.
        "history": TransactionHistoryResource.from_env(),
    }


def build_definitions(resources: dict[str, object] | None = None) -> Definitions:
    """Every asset, check, job and sensor, bound to ``resources`` (default: ``build_resources()``)."""
    return Definitions(
        assets=[
            message_store,
            ngsi_events,
            historic_tables,
            last_data,
            mongo_raw,
            versioned_entities,
            sth_aggregates,
            transaction_history,
        ],
        asset_checks=[freshness_checks],
        jobs=[ingest_job, increment_job, derived_job, reprocess_job, last_data_compaction_job],
        sensors=[landing_sensor, reprocessing_sensor, freshness_sensor],
        schedules=[last_data_compaction_schedule],
        resources=build_resources() if resources is None else resources,
        # Every Spark asset of a run shares one process, hence one Spark session (starting one costs
        # several seconds); a backfill over many hours is one run (BackfillPolicy.single_run).
        # Independent steps may run side by side in threads (NGSI_STEPS_SIDE_BY_SIDE; see executor.py).
        executor=side_by_side_executor,
    )


defs = build_definitions()
