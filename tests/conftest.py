"""Session fixtures: real servers (PostgreSQL, MariaDB, MongoDB wire) and one local Spark session."""

from tests.support.servers import mongo_url, mysql_url, postgres_url  # noqa: F401  (fixtures)
from tests.support.spark import spark  # noqa: F401  (fixture)
