"""NGSI notifications to Dagster software-defined assets computed by PySpark."""
