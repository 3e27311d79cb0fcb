"""Session fixtures: real servers (PostgreSQL, MariaDB, MongoDB wire) and one local Spark session.

Also the order the test files run in. The test command runs files in two processes (pytest-xdist
``--dist loadfile --no-loadscope-reorder``), each file whole in one process, handed out in collection
order as the processes free up. The files that take longest go first (longest-processing-time
first): a file of many minutes handed out last would keep one process busy long after the other has
run out of files (xdist's own reordering, by number of tests, put the single 23-minute test of
``test_spark_modes.py`` near the end).
"""

from __future__ import annotations

import os

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

# One Spark session serves a whole test process, hundreds of runs: C2's code pays for itself there
# (a module of the runs' tests took 295-317 s with it, 430-436 s with the run drivers' "quick").
os.environ.setdefault("NGSI_SPARK_JIT", "full")

# The slowest files, slowest first, with their seconds in a full run of the test command (an earlier run,
# AMD EPYC 2 cores: BENCHMARKS.md, "Test suite"); every other file follows in collection order.
# tests/test_suite_order.py checks that each still exists.
SLOWEST_FIRST = (
    "tests/assets/test_derived_increments.py",  # 3,212 s
    "tests/cluster/test_spark_modes.py",  # 2,326 s (1,432 s alone)
    "tests/test_faults.py",  # about 500 s alone (a platform under traffic, two faults)
    "tests/assets/test_increments.py",  # 785 s
    "tests/assets/test_versioning_rules.py",  # 675 s
    "tests/assets/test_sth_increments.py",  # 589 s
    "tests/assets/test_last_data_state.py",  # 319 s
    "tests/assets/test_sth_assets.py",  # 296 s
    "tests/assets/test_last_data_rules.py",  # 244 s
    "tests/assets/test_csv_reader.py",  # 194 s
    "tests/resources/test_history_store.py",  # 178 s
    "tests/assets/test_history_property.py",  # 160 s
    "tests/sinks/test_sql_sinks_spark.py",  # 147 s
    "tests/assets/test_transaction_history.py",  # 147 s
    "tests/assets/test_mongo_raw_asset.py",  # 143 s
    "tests/assets/test_versioning_property.py",  # 119 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
