"""Session fixtures: real servers (PostgreSQL, MariaDB, MongoDB wire) and one local Spark session."""

from tests.support.dagster_context import _no_dagster_storage_left_set  # noqa: F401  (fixture)
from tests.support.servers import (  # noqa: F401  (fixtures)
    mongo_db_url,
    mongo_url,
    mysql_db_url,
    mysql_url,
    postgres_db_url,
    postgres_url,
)
from tests.support.spark import _release_cached_frames, spark  # noqa: F401  (fixtures)
