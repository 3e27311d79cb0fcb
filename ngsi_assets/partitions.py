"""Hourly partitions by receive time (UTC), shared by every asset from the message store on."""

from __future__ import annotations

import os

from dagster import HourlyPartitionsDefinition

# The first hour a deployment can hold; override with NGSI_PARTITIONS_START (YYYY-MM-DD-HH:00).
PARTITIONS_START = os.environ.get("NGSI_PARTITIONS_START", "2024-01-01-00:00")

# end_offset=1 includes the hour in progress: notifications land continuously, and the sensor
# materializes the current hour as it fills (rerunning an hour is idempotent).
hourly_partitions = HourlyPartitionsDefinition(start_date=PARTITIONS_START, timezone="UTC", end_offset=1)
