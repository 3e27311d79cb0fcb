"""Session fixtures: real servers (PostgreSQL, MariaDB, MongoDB wire) and one local Spark session.

Also the order the test files run in. The test command runs files in two processes (pytest-xdist
``--dist loadfile --no-loadscope-reorder``), each file whole in one process, handed out in collection
order as the processes free up. The files that take longest go first (longest-processing-time
first): a file of many minutes handed out last would keep one process busy long after the other has
run out of files (xdist's own reordering, by number of tests, put the single 23-minute test of
``test_spark_modes.py`` near the end).
"""

from __future__ import annotations

import pytest

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

# The slowest files, slowest first (from the per-file times of a full run: BENCHMARKS.md, "Test
# suite"); every other file follows in collection order. tests/test_suite_order.py checks each exists.
SLOWEST_FIRST = (
    "tests/cluster/test_spark_modes.py",
    "tests/assets/test_derived_increments.py",
    "tests/assets/test_versioning_rules.py",
    "tests/demo/test_city.py",
    "tests/assets/test_sth_increments.py",
    "tests/assets/test_increments.py",
    "tests/assets/test_versioning_property.py",
    "tests/assets/test_history_property.py",
    "tests/resources/test_lake_commits.py",
    "tests/assets/test_ingest_assets.py",
    "tests/cluster/test_shared_session.py",
    "tests/cluster/test_scheduler_pools.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
