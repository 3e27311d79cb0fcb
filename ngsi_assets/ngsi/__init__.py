"""Pure NGSI domain code: payload models, envelopes, naming and time rules.

Nothing in this package imports Dagster, a database driver, or builds a Spark session.
"""
