"""Runs through Spark Connect share one server-side session, and still read what earlier runs wrote.

Each check runs the platform's Spark resource in fresh processes, as Dagster runs do.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.spark import SHARED_SESSION_S, shared_session_url
from tests.support.snippets import run_snippet
from tests.support.spark_servers import connect_url  # noqa: F401 (fixture)

# A run's read of a lake folder, then a write into it; prints its session id and what it read.
RUN = """
import json, sys, time
import pyarrow as pa, pyarrow.parquet as pq
from resources.spark import SHARED_SESSION_S, spark_resource
if sys.argv[3] == "raw":  # a plain pyspark client on the shared session: plan ids from 0
    import resources.spark as rs
    rs.unique_plan_ids = lambda: True
folder, release = sys.argv[1], sys.argv[2] == "release"
before = int(time.time() // SHARED_SESSION_S)
spark = spark_resource().spark_session
period = before if int(time.time() // SHARED_SESSION_S) == before else None  # None: at a period's change
rows = spark.read.parquet(folder).count()
files = len(list(__import__("pathlib").Path(folder).glob("*.parquet")))
pq.write_table(pa.table({"a": [1, 2, 3]}), f"{folder}/part-{files}.parquet")
cache = spark.conf.get("spark.connect.session.planCache.enabled", "true")
print(json.dumps({"session": spark.client._session_id, "period": period, "rows": rows, "files_before": files,
                  "plan_cache": cache}))
if release:
    spark.stop()
"""


def run(url: str, folder: Path, *, release: bool = False, shared: bool = True, raw: bool = False) -> dict:
    env = {"NGSI_SPARK_REMOTE": url, "NGSI_SPARK_SHARED_SESSION": "1" if shared else "0"}
    return run_snippet(RUN, str(folder), "release" if release else "keep", "raw" if raw else "platform", env=env)


def folder_with_one_file(path: Path) -> Path:
    path.mkdir()
    pq.write_table(pa.table({"a": [1, 2, 3]}), f"{path}/part-0.parquet")
    return path


def test_the_shared_id_follows_the_url_the_settings_and_the_period() -> None:
    conf = {"spark.sql.session.timeZone": "UTC"}
    url = shared_session_url("sc://h:15002", conf, now=10 * SHARED_SESSION_S + 5)
    assert url.startswith("sc://h:15002/;session_id=")
    assert url == shared_session_url("sc://h:15002", conf, now=11 * SHARED_SESSION_S - 1)
    assert url != shared_session_url("sc://h:15002", conf, now=11 * SHARED_SESSION_S)
    assert url != shared_session_url("sc://h:15002", {"spark.sql.session.timeZone": "CET"}, now=10 * SHARED_SESSION_S)
    assert url != shared_session_url("sc://other:15002", conf, now=10 * SHARED_SESSION_S + 5)
    with_params = shared_session_url("sc://h:15002/;token=abc", conf, now=0)
    assert with_params.startswith("sc://h:15002/;token=abc;session_id=")
    own = "sc://h:15002/;session_id=00000000-0000-0000-0000-000000000001"
    assert shared_session_url(own, conf) == own


@pytest.mark.cluster
def test_runs_share_a_session_and_read_what_the_previous_run_wrote(connect_url: str, tmp_path: Path) -> None:  # noqa: F811
    folder = folder_with_one_file(tmp_path / "data")
    runs = [run(connect_url, folder) for _ in range(3)]
    # One session per period (an hour): runs that straddle a period's change get two (CI met one at 08:00).
    by_period: dict[int, set[str]] = {}
    for r in runs:
        if r["period"] is not None:
            by_period.setdefault(r["period"], set()).add(r["session"])
    assert all(len(sessions) == 1 for sessions in by_period.values()), runs
    assert max(sum(r["period"] == p for r in runs) for p in by_period) >= 2, runs
    # The plan cache stays on (a full run is 25% slower without it)...
    assert {r["plan_cache"] for r in runs} == {"true"}
    # ... and still each run reads the files the previous one wrote.
    assert [r["rows"] for r in runs] == [3 * r["files_before"] for r in runs] == [3, 6, 9]


@pytest.mark.cluster
def test_without_unique_plan_ids_a_shared_session_reads_a_stale_listing(connect_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Why the plan ids are moved: the same code in two processes on one session, ids from 0."""
    folder = folder_with_one_file(tmp_path / "data")
    runs = [run(connect_url, folder, raw=True) for _ in range(2)]
    assert runs[0]["session"] == runs[1]["session"]
    assert [r["rows"] for r in runs] == [3, 3]  # the second run missed the file the first one wrote


@pytest.mark.cluster
def test_a_closed_shared_session_gives_the_run_a_session_of_its_own(connect_url: str, tmp_path: Path) -> None:  # noqa: F811
    folder = folder_with_one_file(tmp_path / "data")
    first = run(connect_url, folder, release=True)  # a client that stops the session closes it on the server
    second = run(connect_url, folder)
    third = run(connect_url, folder)
    assert second["session"] != first["session"] and third["session"] != second["session"]
    assert [first["rows"], second["rows"], third["rows"]] == [3, 6, 9]


@pytest.mark.cluster
def test_sharing_can_be_turned_off(connect_url: str, tmp_path: Path) -> None:  # noqa: F811
    folder = folder_with_one_file(tmp_path / "data")
    runs = [run(connect_url, folder, shared=False) for _ in range(2)]
    assert runs[0]["session"] != runs[1]["session"]
    assert [r["rows"] for r in runs] == [3, 6]
