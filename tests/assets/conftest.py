"""The ``sink`` fixture: one per SQL server (PostgreSQL, MariaDB) on a fresh database."""

from tests.sinks.support import sink  # noqa: F401  (fixture)
