"""The main job gives the same tables on ``local[*]``, on a standalone cluster and through Spark Connect.

One landed fixture (a generated city: NGSI v2 and NGSI-LD notifications, data-hub messages, duplicates
and malformed requests) is materialized by ``ngsi_ingest_job`` (message store to every sink, with the
PostgreSQL and MariaDB sinks on and the history published to PostgreSQL) on each of three Spark modes,
each run in a process of its own as a user runs it:

- ``local``: ``local[2]`` in the run's process (the embedded default);
- ``standalone``: ``NGSI_SPARK_MASTER=spark://...``, a master and two workers, executors in other JVMs;
- ``connect``: ``NGSI_SPARK_REMOTE=sc://...``, a Spark Connect server; the run's process has no JVM.
  The run goes through a server of its own that is SIGKILLed in the middle of ``versioned_entities``
  (the run process is killed too if it has not failed by itself); the job is then run whole again
  through another server, on the same lake and SQL databases, as a user restarts it.

Every lake dataset (every Parquet folder, every transaction record) and every SQL table must be
identical across the three: so the Connect mode's tables show both that the job gives the same tables
through Spark Connect (every asset of the rerun runs there) and that a run killed with its server
leaves nothing its rerun does not mend. An uninterrupted Connect run as well would cost a main-job
run more (2-4 minutes of one test process: BENCHMARKS.md, "Test suite"); what only it would check is
a fresh lake written through Connect past ``versioned_entities``, where the killed run stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg2
import pyarrow.parquet as pq
import pymysql
import pytest
from psycopg2 import sql as pgsql

from ngsi_assets.demo.city import generate_city, write_jsonl
from ngsi_assets.ingest.landing import LandingWriter
from ngsi_assets.ingest.loader import load_paths
from ngsi_assets.ngsi.envelope import MessageIdFactory
from ngsi_assets.ngsi.payloads import IngestSettings
from tests.support.servers import fresh_postgres_database
from tests.support.spark_servers import (  # noqa: F401 (fixtures)
    StandaloneCluster,
    connect_url,
    standalone_cluster,
    start_connect_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
MODES = ("local", "standalone", "connect")
RUN_TIMEOUT_S = 1200
Snapshot = dict[str, list[str]]


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture landed once, through the receiver's validation (the file loader), for all modes."""
    work = tmp_path_factory.mktemp("modes")
    requests, _ = generate_city(seed=11, hours=2, target_notifications=500)
    sample = work / "city.jsonl"
    write_jsonl(requests, sample)
    root = work / "landing"
    with LandingWriter(root) as writer:
        report = load_paths([sample], writer, IngestSettings(guid_from_correlator=True), MessageIdFactory())
    assert report.accepted > 400 and report.rejected > 0  # the city has malformed requests on purpose
    return root


def _row_text(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def lake_snapshot(root: Path, run_id: str) -> Snapshot:
    """Every Parquet folder's rows (sorted), and every transaction record with the run's id blanked.

    Left out: ``_staging`` (empty once a run ends), the lock file, and the history's ``_state.json``
    (file names and modification times of the versioned buckets it compared: bookkeeping, not data).
    """
    out: Snapshot = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or rel.parts[0] == "_staging" or path.name.startswith((".", "_")):
            continue
        if path.suffix == ".parquet":
            rows = pq.read_table(path, partitioning=None).to_pylist()
            out.setdefault(str(rel.parent), []).extend(_row_text(r) for r in rows)
        elif path.suffix == ".json":
            out[str(rel)] = [path.read_text().replace(run_id, "<run>")]
        else:
            out[str(rel)] = ["unexpected file"]
    return {k: sorted(v) for k, v in out.items()}


def postgres_snapshot(url: str, run_id: str) -> Snapshot:
    out: Snapshot = {}
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            """SELECT table_schema, table_name FROM information_schema.tables
               WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
                 AND NOT (table_schema = 'public' AND table_name = 'spatial_ref_sys')"""
        )
        for schema, table in cur.fetchall():
            cur.execute(pgsql.SQL("SELECT row_to_json(t)::text FROM {} t").format(pgsql.Identifier(schema, table)))
            out[f"postgresql {schema}.{table}"] = sorted(r[0].replace(run_id, "<run>") for r in cur.fetchall())
    return out


def _mysql(url: str) -> pymysql.Connection:
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        autocommit=True,
    )


SYSTEM_DATABASES = {"information_schema", "mysql", "performance_schema", "sys"}


def mysql_databases(url: str) -> set[str]:
    with _mysql(url) as conn, conn.cursor() as cur:
        cur.execute("SHOW DATABASES")
        return {r[0] for r in cur.fetchall()} - SYSTEM_DATABASES


def mysql_snapshot_and_drop(url: str, databases: set[str]) -> Snapshot:
    out: Snapshot = {}
    with _mysql(url) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
        for db in sorted(databases):
            cur.execute("SELECT table_name AS t FROM information_schema.tables WHERE table_schema = %s", (db,))
            for table in [r["t"] for r in cur.fetchall()]:
                cur.execute(f"SELECT * FROM `{db}`.`{table}`")  # names listed by the server itself
                out[f"mysql {db}.{table}"] = sorted(_row_text(r) for r in cur.fetchall())
            cur.execute(f"DROP DATABASE `{db}`")
    return out


def _start_main_job(env: dict[str, str], work: Path, name: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    outcome, log = work / f"{name}.json", work / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.run_main_job", str(outcome)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return proc, outcome, log


def run_main_job(env: dict[str, str], work: Path, name: str = "run") -> dict[str, Any]:
    proc, outcome, log = _start_main_job(env, work, name)
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    assert code == 0, f"the main job failed (exit {code}); its log ends:\n{tail}"
    return json.loads(outcome.read_text())


def run_through_a_killed_server(env: dict[str, str], work: Path) -> dict[str, Any]:
    """Start the main job through a Connect server of its own, SIGKILL that server (every process of
    its group) once ``versioned_entities`` has written its first folder, make sure the run is dead,
    then rerun the job through ``env``'s server on the same lake and SQL databases."""
    server = start_connect_server()
    try:
        killed_env = {**env, "NGSI_SPARK_REMOTE": f"sc://127.0.0.1:{server.port}"}
        proc, _, log = _start_main_job(killed_env, work, "killed")
        marker = work / "lake" / "versioned_entities"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists() and proc.poll() is None, (
            "the run ended before versioned_entities wrote:\n" + (log.read_text(errors="replace")[-3000:])
        )
        os.killpg(server.process.pid, signal.SIGKILL)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()  # the client still waits on the dead server: the machine goes down with it
            code = proc.wait()
        assert code != 0, "the run through a killed server reported success"
    finally:
        server.stop()
    return run_main_job(env, work, "rerun")


def history_cli(env: dict[str, str], lake: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ngsi-assets")), "history", "--lake-root", str(lake), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _first_difference(a: list[str], b: list[str]) -> str:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    return f"{len(a)} vs {len(b)} rows; only in local: {only_a[:2]}; only in the other: {only_b[:2]}"


def test_main_job_gives_identical_tables_on_local_standalone_and_connect(
    landing: Path,
    tmp_path: Path,
    standalone_cluster: StandaloneCluster,  # noqa: F811
    connect_url: str,  # noqa: F811
    postgres_url: str,
    mysql_url: str,
) -> None:
    spark_env = {
        "local": {"NGSI_SPARK_MASTER": "local[2]"},
        "standalone": {
            "NGSI_SPARK_MASTER": standalone_cluster.master_url,
            "SPARK_LOCAL_IP": "127.0.0.1",  # the driver's own ports, on loopback like the cluster
        },
        # First through a server of its own, killed in the run; then rerun through this one.
        "connect": {"NGSI_SPARK_REMOTE": connect_url},
    }
    snapshots: dict[str, Snapshot] = {}
    envs: dict[str, dict[str, str]] = {}
    for mode in MODES:
        work = tmp_path / mode
        (work / "home").mkdir(parents=True)
        (work / "home" / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        before = mysql_databases(mysql_url)
        with fresh_postgres_database(postgres_url, "modes") as pg_url:
            sinks = work / "sinks.json"
            sinks.write_text(
                json.dumps(
                    {
                        "postgresql": {"url": pg_url, "last_data_mode": "both"},
                        "mysql": {"url": mysql_url, "last_data_mode": "both"},
                    }
                )
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith(("NGSI_", "SPARK_REMOTE", "SPARK_CONNECT"))}
            env.update(
                {
                    "DAGSTER_HOME": str(work / "home"),
                    "NGSI_LANDING_ROOT": str(landing),
                    "NGSI_LAKE_ROOT": str(work / "lake"),
                    "NGSI_ENTITY_SCHEMA": str(REPO / "ngsi_assets" / "demo" / "entities.yaml"),
                    "NGSI_SQL_SINKS_CONFIG": str(sinks),
                    "NGSI_HISTORY_POSTGRES_URL": pg_url,
                    "NGSI_SPARK_SHUFFLE_PARTITIONS": "4",
                    "NGSI_SPARK_DRIVER_MEMORY": "2g",
                    "PYSPARK_PYTHON": sys.executable,
                    **spark_env[mode],
                }
            )
            envs[mode] = env
            outcome = run_through_a_killed_server(env, work) if mode == "connect" else run_main_job(env, work)
            assert outcome["success"] and not outcome["failed_checks"], outcome
            expected_session = {"local": "local[2]", "standalone": standalone_cluster.master_url, "connect": "connect"}
            assert outcome["session"] == expected_session[mode]
            snapshot = lake_snapshot(work / "lake", outcome["run_id"])
            snapshot.update(postgres_snapshot(pg_url, outcome["run_id"]))
        snapshot.update(mysql_snapshot_and_drop(mysql_url, mysql_databases(mysql_url) - before))
        snapshots[mode] = snapshot

    local = snapshots["local"]
    # The fixture reaches every kind of table: a comparison of empty tables would prove nothing.
    for prefix in (
        "message_store/",
        "ngsi_events/",
        "versioned_entities/",
        "transaction_history/",
        "sth_partials/",
        "sth_rollups/",
    ):
        assert any(k.startswith(prefix) and local[k] for k in local), f"no {prefix} rows"
    for prefix in ("postgresql ", "mysql "):
        assert sum(len(v) for k, v in local.items() if k.startswith(prefix)) > 100, f"no {prefix}rows"
    assert any(k.startswith("postgresql ngsi_history.") and local[k] for k in local), "no history published"
    # The CLI through Spark Connect reads what the local session reads (the history's rewind here).
    answers = {
        mode: [history_cli(envs[mode], tmp_path / mode / "lake", *args) for args in (["spaces"], ["show", "product"])]
        for mode in ("local", "connect")
    }
    assert "product" in answers["local"][0] and answers["local"][1].count("\n") > 10
    assert answers["connect"] == answers["local"]
    for mode in MODES[1:]:
        other = snapshots[mode]
        assert sorted(other) == sorted(local), f"{mode}: different tables or folders"
        different = {k: _first_difference(local[k], other[k]) for k in local if local[k] != other[k]}
        assert not different, f"{mode} differs from local in {len(different)} tables: {different}"
