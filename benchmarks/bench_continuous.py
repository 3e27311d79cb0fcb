"""The platform run as a user runs it, unattended under steady traffic: freshness, queue, runs, CPU.

    .venv/bin/python benchmarks/bench_continuous.py [--rate 20] [--minutes 20] [--cars 50] [--write-results]

Started here, each in its own process group, on free loopback ports and a fresh work folder:
PostgreSQL and MariaDB (as the tests start them), a Spark Connect server every run shares, the
receiver (``ngsi-assets serve``) and the Dagster daemon with the platform's sensors (the landing
sensor requests ``ngsi_increment_job`` runs of what landed since the previous one, and
``ngsi_derived_job`` runs per hour; ``dagster.yaml``'s queue runs one of each at a time). Both SQL sinks
write historic tables and last data (``last_data_mode: both``, ``dm-by-entity-type``); STH aggregates
stay in the lake, unless ``--mongo``: then the raw history and the STH aggregates are written to a
MongoDB server (SecantusDB started here, or ``MONGO_URL``). Before the traffic, the new Connect
server is warmed up with ``--warm-up-runs`` runs of the main job on a throwaway sample, as ``make dev``
has ``ngsi-assets spark warm-up`` do (``--warm-up-runs 0``: a cold server meets the traffic).

A load generator posts NGSI v2 notifications at ``--rate`` per second for ``--minutes``: one car of
``--cars`` per notification, round robin, four attributes (``seq``, speed, fuel, location text); ``seq``
numbers each car's notifications. Measured:

- freshness: from the receiver's 201 to the first poll (every 0.5 s) of PostgreSQL's last-data table
  showing that car's ``seq`` at or past the notification's; p50, p95 and max;
- freshness per asset (message store, events, last data, historic tables, raw history, versioned
  entities, transaction history, STH aggregates): from the 201 to the end of the first
  materialization whose ``ngsi/received_until`` is at or past the notification's receive time (the
  201's ``recv_ms``), read from the Dagster instance after the traffic;
- the run queue (runs queued or starting, and runs executing) every 5 s;
- every run's duration, and the machine's CPU use (``/proc/stat``) over the traffic;
- at the end (after traffic stops, waiting up to ``--drain-minutes`` for the runs to catch up):
  whether every acknowledged notification is in the message store, in both historic tables (4 rows
  each) and in both last-data tables (every car's last ``seq``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_spark_modes import platform_env, start_connect_server, step_seconds  # noqa: E402
from benchmarks.machine import describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402
from ngsi_assets.spark_warmup import DEFAULT_RUNS, warm_up  # noqa: E402

BEGIN = "<!-- bench_continuous:begin -->"
END = "<!-- bench_continuous:end -->"
SERVICE = "bench"
ATTRS = 4


def table(dialect: str, suffix: str = "") -> str:
    """The sinks' table for the cars (dm-by-entity-type, root service path), named by the platform."""
    from ngsi_assets.ngsi.sql_naming import DataModel, Dialect, NamingConfig, table_name

    naming = NamingConfig(dialect=Dialect(dialect), data_model=DataModel.BY_ENTITY_TYPE)
    return table_name("/", "car000", "Car", naming, suffix)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not listen on {port}; see {log}")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def stop_strays(marker: str, grace_s: float = 10.0, spare: Iterable[int] = ()) -> list[int]:
    """Stop every process whose environment holds ``marker`` (say ``DAGSTER_HOME=<the bench's home>``),
    but those in the process groups of ``spare``; returns their pids. A daemon's code server runs in a
    session of its own, so stopping the daemon's process group can leave it (seen once, after a
    20-minute run: parent 1, deaf to SIGTERM)."""
    wanted = marker.encode() + b"\0"
    spared_groups = set()
    for pid in spare:
        with contextlib.suppress(ProcessLookupError):
            spared_groups.add(os.getpgid(pid))

    def holders() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(int(entry.name)) in spared_groups:
                    continue
            with contextlib.suppress(OSError):
                if wanted in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
        return found

    strays = holders()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and set(holders()) & set(strays):
            time.sleep(0.2)
    return strays


def cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


@dataclass
class Observations:
    acks: dict[tuple[int, int], float] = field(default_factory=dict)  # (car, seq) -> time of the 201
    received: dict[tuple[int, int], float] = field(default_factory=dict)  # (car, seq) -> its recv_ms (s)
    refused: int = 0
    refused_at: list[float] = field(default_factory=list)  # when each refusal (or no answer) came
    visible: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # car -> (time, seq) changes
    queue: list[tuple[float, int, int]] = field(default_factory=list)  # (t, waiting, executing)
    cpu: list[tuple[float, float]] = field(default_factory=list)


def notification(car: int, seq: int) -> bytes:
    entity = {
        "id": f"car{car:03d}",
        "type": "Car",
        "seq": {"type": "Number", "value": seq, "metadata": {}},
        "speed": {"type": "Number", "value": (seq * 7) % 130, "metadata": {}},
        "fuel": {"type": "Number", "value": 100 - seq % 100, "metadata": {}},
        "location": {"type": "Text", "value": f"street {seq % 17}", "metadata": {}},
    }
    return json.dumps({"subscriptionId": "bench", "data": [entity]}).encode()


def traffic(port: int, rate: float, seconds: float, cars: int, obs: Observations, stop: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", "Fiware-Service": SERVICE, "Fiware-ServicePath": "/"}
    start = time.monotonic()
    n = 0
    while not stop.is_set():
        due = start + n / rate
        now = time.monotonic()
        if due - start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        car, seq = n % cars, n // cars + 1
        try:
            conn.request("POST", "/notify", body=notification(car, seq), headers=headers)
            resp = conn.getresponse()
            answer = resp.read()
            if resp.status == 201:
                obs.acks[(car, seq)] = time.time()
                obs.received[(car, seq)] = int(json.loads(answer)["recv_ms"]) / 1000.0
            else:
                obs.refused += 1
                obs.refused_at.append(time.time())
        except (OSError, http.client.HTTPException):
            obs.refused += 1
            obs.refused_at.append(time.time())
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        n += 1
    conn.close()


def poll_last_data(pg_url: str, obs: Observations, stop: threading.Event) -> None:
    import psycopg2

    last: dict[int, int] = {}
    conn = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = psycopg2.connect(pg_url)
                conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'SELECT entityid, seq FROM "{SERVICE}"."{table("postgresql", "_last_data")}"')
                now = time.time()
                for eid, seq in cur.fetchall():
                    car, s = int(eid[3:]), int(float(seq))
                    if last.get(car) != s:
                        last[car] = s
                        obs.visible.setdefault(car, []).append((now, s))
        except Exception:  # the table does not exist before the first run writes it
            if conn is not None:
                conn.close()
            conn = None
        stop.wait(0.5)
    if conn is not None:
        conn.close()


def sample_queue(home: Path, obs: Observations, stop: threading.Event) -> None:
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    waiting_s = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
    with DagsterInstance.from_config(str(home)) as instance:
        busy_before, total_before = cpu_times()
        while not stop.is_set():
            try:
                waiting = instance.get_runs_count(RunsFilter(statuses=waiting_s))
                executing = instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
                obs.queue.append((time.time(), waiting, executing))
            except Exception:  # SQLite busy: skip a sample
                pass
            busy, total = cpu_times()
            if total > total_before:
                obs.cpu.append((time.time(), (busy - busy_before) / (total - total_before)))
            busy_before, total_before = busy, total
            stop.wait(5)


def delays(obs: Observations) -> list[tuple[float, float]]:
    """(time of the 201, time of the first poll showing its car at its seq or later) per acknowledged
    notification seen in last data."""
    out = []
    for (car, seq), acked in obs.acks.items():
        for t, shown in obs.visible.get(car, []):
            if shown >= seq:
                out.append((acked, max(acked, t)))
                break
    return out


def freshness_timeline(pairs: Iterable[tuple[float, float]], since: float, step_s: float = 60.0) -> list[tuple]:
    """(minute since ``since``, p95, max) of the notifications acknowledged in each ``step_s`` window:
    where in the traffic freshness was worst."""
    windows: dict[int, list[float]] = {}
    for acked, seen in pairs:
        windows.setdefault(int((acked - since) // step_s), []).append(seen - acked)
    return [(w, round(pct(v, 95), 1), round(max(v), 1)) for w, v in sorted(windows.items()) if w >= 0]


def worst_moments(
    pairs: Iterable[tuple[float, float]], runs: Iterable[RunWindow], since: float, count: int = 5, apart_s: float = 60.0
) -> list[dict[str, Any]]:
    """The ``count`` worst delays at least ``apart_s`` apart (by time of the 201), each with the runs
    that were executing between the 201 and the row's appearance: what a slow moment waited on."""
    chosen: list[tuple[float, float]] = []
    for acked, seen in sorted(pairs, key=lambda p: p[0] - p[1]):
        if all(abs(acked - a) >= apart_s for a, _ in chosen):
            chosen.append((acked, seen))
            if len(chosen) == count:
                break
    return [
        {
            "at_s": round(acked - since),
            "delay_s": round(seen - acked, 1),
            "runs": [
                (r.job.removeprefix("ngsi_").removesuffix("_job"), round(r.start - since), round(r.end - r.start, 1))
                for r in sorted(runs, key=lambda r: r.start)
                if r.start < seen and r.end > acked
            ],
        }
        for acked, seen in chosen
    ]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


@dataclass(frozen=True)
class RunWindow:
    job: str
    start: float
    end: float
    status: str


def run_windows(home: Path) -> list[RunWindow]:
    """Every finished run: its job, start and end (epoch seconds) and status."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        return [
            RunWindow(r.dagster_run.job_name, r.start_time, r.end_time, r.dagster_run.status.value)
            for r in instance.get_run_records()
            if r.start_time and r.end_time
        ]


def runs_summary(windows: Iterable[RunWindow]) -> list[tuple[str, float, str]]:
    """(job name, duration in seconds, status) of every finished run."""
    return [(w.job, w.end - w.start, w.status) for w in windows]


def steps_median(per_run: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The median seconds per step over runs' step times (``step_seconds``; over the runs that have the step)."""
    steps: dict[str, list[float]] = {}
    for run_steps in per_run:
        for step, seconds in run_steps.items():
            steps.setdefault(step, []).append(seconds)
    return {k: round(statistics.median(v), 1) for k, v in steps.items()}


def job_run_ids(home: Path, job_name: str) -> list[str]:
    """The ids of every run of ``job_name``."""
    from dagster import DagsterInstance, RunsFilter

    with DagsterInstance.from_config(str(home)) as instance:
        return [r.dagster_run.run_id for r in instance.get_run_records(RunsFilter(job_name=job_name))]


def landing_ticks(home: Path) -> dict[str, Any]:
    """How often the daemon evaluated the landing sensor: its ticks, the mean gap between them, and
    how many gaps were longer than one daemon loop (5 s) and a half."""
    from dagster import DagsterInstance
    from dagster._core.scheduler.instigation import InstigatorType

    with DagsterInstance.from_config(str(home)) as instance:
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
            if state.name == "landing_sensor":
                ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100_000)
                times = sorted(t.timestamp for t in ticks)
                gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
                return {
                    "ticks": len(times),
                    "mean_gap_s": round(statistics.mean(gaps), 2) if gaps else None,
                    "gaps_over_7_5s": sum(g > 7.5 for g in gaps),
                }
    return {}


def derived_runs_detail(home: Path, since: float) -> dict[str, Any]:
    """The derived runs' median seconds per step, how each asset that says so (``folded`` metadata)
    folded (how many runs folded the hour whole, new increments only, or nothing new), and how many
    keys ``versioned_entities`` folded on from their latest version."""
    from dagster import DagsterEventType, DagsterInstance

    folds: dict[str, dict[str, int]] = {}
    from_latest = 0
    run_ids = job_run_ids(home, "ngsi_derived_job")
    steps = {run_id: step_seconds(home, run_id) for run_id in run_ids}
    with DagsterInstance.from_config(str(home)) as instance:
        starts = {r.dagster_run.run_id: r.start_time for r in instance.get_run_records() if r.start_time}
        for run_id in run_ids:
            for record in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
                materialization = record.dagster_event.event_specific_data.materialization
                folded = materialization.metadata.get("folded")
                if folded is not None:
                    kind = str(folded.value)
                    kind = "whole" if kind.startswith("whole") else kind.split(" ", 1)[-1]
                    per_kind = folds.setdefault(materialization.asset_key.path[-1], {})
                    per_kind[kind] = per_kind.get(kind, 0) + 1
                latest = materialization.metadata.get("keys_folded_from_latest_version")
                from_latest += int(latest.value) if latest is not None else 0
    return {
        "steps_median_s": steps_median(steps.values()),
        # Each run in start order: when it started (seconds since the traffic began) and its steps, to
        # see a cost that grows with what the hour or the lake holds.
        "runs": sorted(
            (round(starts[run_id] - since), {k: round(v, 1) for k, v in steps[run_id].items()})
            for run_id in run_ids
            if run_id in starts
        ),
        "folds": folds,
        "keys_from_latest_version": from_latest,
    }


def completeness(obs: Observations, lake: Path, pg_url: str, my_url: str, cars: int) -> dict[str, Any]:
    import psycopg2
    import pyarrow.dataset as ds
    import pymysql

    from resources.sql import MySQLResource

    acked = len(obs.acks)
    stored = ds.dataset(str(lake / "message_store"), format="parquet", partitioning="hive").count_rows()
    last_seq = {car: max((s for (c, s) in obs.acks if c == car), default=0) for car in range(cars)}
    out: dict[str, Any] = {"acknowledged": acked, "message_store_rows": stored}
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT count(*) FROM "{SERVICE}"."{table("postgresql")}"')
        out["postgresql_historic_rows"] = cur.fetchone()[0]
        cur.execute(f'SELECT entityid, seq FROM "{SERVICE}"."{table("postgresql", "_last_data")}"')
        pg_last = {int(e[3:]): int(float(s)) for e, s in cur.fetchall()}
    conn = pymysql.connect(**MySQLResource(url=my_url).connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM `{SERVICE}`.`{table('mysql')}`")
            out["mysql_historic_rows"] = cur.fetchone()[0]
            cur.execute(f"SELECT entityId, seq FROM `{SERVICE}`.`{table('mysql', '_last_data')}`")
            my_last = {int(e[3:]): int(float(s)) for e, s in cur.fetchall()}
    finally:
        conn.close()
    out["last_data_current"] = {
        "postgresql": pg_last == {c: s for c, s in last_seq.items() if s},
        "mysql": my_last == {c: s for c, s in last_seq.items() if s},
    }
    out["everything_in_every_table"] = (
        stored >= acked
        and out["postgresql_historic_rows"] == ATTRS * acked
        and out["mysql_historic_rows"] == ATTRS * acked
        and all(out["last_data_current"].values())
    )
    return out


def materializations(home: Path, asset: str) -> list[tuple[str, float, float]]:
    """(hour, newest receive time held, when) of every materialization of ``asset`` that records one."""
    from dagster import AssetKey, DagsterInstance

    from ngsi_assets.freshness import RECEIVED_UNTIL

    out = []
    with DagsterInstance.from_config(str(home)) as instance:
        cursor = None
        while True:
            page = instance.fetch_materializations(AssetKey(asset), limit=1000, cursor=cursor, ascending=True)
            for rec in page.records:
                m = rec.asset_materialization
                if m is None or m.partition is None or RECEIVED_UNTIL not in m.metadata:
                    continue
                out.append((m.partition, float(m.metadata[RECEIVED_UNTIL].value), rec.timestamp))
            if not page.has_more:
                return out
            cursor = page.cursor


def asset_freshness(home: Path, obs: Observations) -> dict[str, dict[str, Any]]:
    """Per followed asset: from each notification's 201 to the first materialization that holds it
    (of its hour, with a newest receive time at or past the notification's); p50, p95, max, and the
    notifications no materialization held by the end."""
    import bisect

    from ngsi_assets.freshness import FOLLOWED

    out: dict[str, dict[str, Any]] = {}
    for asset in FOLLOWED:
        by_hour: dict[str, tuple[list[float], list[float]]] = {}
        for hour, received, when in sorted(materializations(home, asset), key=lambda m: m[2]):
            held, times = by_hour.setdefault(hour, ([], []))
            held.append(max(received, held[-1]) if held else received)  # what the hour holds only grows
            times.append(when)
        delays, missing = [], 0
        for key, acked in obs.acks.items():
            recv = obs.received[key]
            held, times = by_hour.get(time.strftime("%Y-%m-%d-%H:00", time.gmtime(recv)), ([], []))
            i = bisect.bisect_left(held, recv)
            if i == len(held):
                missing += 1
            else:
                delays.append(max(0.0, times[i] - acked))
        out[asset] = {
            "p50": pct(delays, 50) if delays else None,
            "p95": pct(delays, 95) if delays else None,
            "max": max(delays) if delays else None,
            "measured": len(delays),
            "never_held": missing,
        }
    return out


def caught_up(obs: Observations) -> bool:
    last_seq: dict[int, int] = {}
    for car, seq in obs.acks:
        last_seq[car] = max(seq, last_seq.get(car, 0))
    return all(obs.visible.get(car) and obs.visible[car][-1][1] >= s for car, s in last_seq.items())


def without_launcher(config: Path) -> None:
    """Drop the ``run_launcher`` block from a copy of ``dagster.yaml``: Dagster's default launcher."""
    import yaml

    settings = yaml.safe_load(config.read_text())
    settings.pop("run_launcher", None)
    config.write_text(yaml.safe_dump(settings, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="notifications per second")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--cars", type=int, default=50)
    parser.add_argument("--drain-minutes", type=float, default=15.0)
    parser.add_argument(
        "--derived-side-by-side",
        type=int,
        default=None,
        help="NGSI_DERIVED_SIDE_BY_SIDE for the daemon (default: the platform's)",
    )
    parser.add_argument(
        "--steps-side-by-side",
        type=int,
        default=None,
        help="NGSI_STEPS_SIDE_BY_SIDE for the daemon's runs (default: the platform's)",
    )
    parser.add_argument(
        "--run-launcher",
        choices=("platform", "default"),
        default="platform",
        help="the daemon's run launcher: dagster.yaml's (WarmRunLauncher), or Dagster's DefaultRunLauncher",
    )
    parser.add_argument(
        "--derived-interval",
        type=float,
        default=None,
        help="NGSI_DERIVED_INTERVAL_S for the daemon (default: the platform's)",
    )
    parser.add_argument(
        "--derived-share",
        type=float,
        default=None,
        help="NGSI_DERIVED_SHARE for the daemon (default: the platform's; 1 with a short interval: derived "
        "runs back to back)",
    )
    parser.add_argument(
        "--derived-in-increments",
        action="store_true",
        help="NGSI_DERIVED_IN_INCREMENTS=true for the daemon: the increments fold the versioned entities and the "
        "transaction history",
    )
    parser.add_argument(
        "--mongo",
        action="store_true",
        help="publish the raw history and the STH aggregates to MongoDB (SecantusDB, or MONGO_URL)",
    )
    parser.add_argument(
        "--warm-up-runs",
        type=int,
        default=DEFAULT_RUNS,
        help=f"main-job runs that warm the new Connect server before the traffic, as `make dev` has it do "
        f"(`ngsi-assets spark warm-up`; default {DEFAULT_RUNS}, 0: none)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args(argv)

    from tests.support.servers import (
        mongo_server_url,
        mysql_server_url,
        postgres_server_url,
        start_mariadb,
        start_postgres,
        start_secantus,
    )

    work = Path(tempfile.mkdtemp(prefix="ngsi-bench-continuous-"))
    procs: list[subprocess.Popen[bytes]] = []
    servers = []
    try:
        pg, my = start_postgres(), start_mariadb()
        servers += [pg, my]
        pg_url, my_url = postgres_server_url(pg), mysql_server_url(my)
        my_db_url = my_url  # the sink creates the service's database itself
        sinks = work / "sql_sinks.yaml"
        common = "  last_data_mode: both\n  data_model: dm-by-entity-type\n"
        sinks.write_text(f"postgresql:\n  url: {pg_url}\n{common}mysql:\n  url: {my_db_url}\n{common}")
        connect, remote = start_connect_server(work)
        procs.append(connect)
        home, landing, lake = work / "home", work / "landing", work / "lake"
        extra = {"NGSI_SPARK_REMOTE": remote, "NGSI_SQL_SINKS_CONFIG": str(sinks)}
        if args.derived_side_by_side is not None:
            extra["NGSI_DERIVED_SIDE_BY_SIDE"] = str(args.derived_side_by_side)
        if args.steps_side_by_side is not None:
            extra["NGSI_STEPS_SIDE_BY_SIDE"] = str(args.steps_side_by_side)
        if args.derived_interval is not None:
            extra["NGSI_DERIVED_INTERVAL_S"] = f"{args.derived_interval:g}"
        if args.derived_share is not None:
            extra["NGSI_DERIVED_SHARE"] = f"{args.derived_share:g}"
        if args.derived_in_increments:
            extra["NGSI_DERIVED_IN_INCREMENTS"] = "true"
        if args.mongo:
            mongo = None if os.environ.get("MONGO_URL") else start_secantus()
            if mongo is not None:
                servers.append(mongo)
            extra["NGSI_MONGO_URL"] = os.environ["MONGO_URL"] if mongo is None else mongo_server_url(mongo)
            extra["NGSI_MONGO_RAW_ENABLED"] = "true"
        env = platform_env(home, landing, lake, extra)
        warm_up_s = [r.seconds for r in warm_up(remote, args.warm_up_runs, base_env=env)] if args.warm_up_runs else []
        if warm_up_s:
            print(f"Connect server warmed: {', '.join(f'{s:.1f}' for s in warm_up_s)} s", flush=True)
        if args.run_launcher == "default":
            without_launcher(home / "dagster.yaml")
        bin_dir = Path(sys.executable).parent
        # The instance's SQLite storage created once, before the daemon and this process's sampler open
        # it side by side: two first openings at once can stamp its version twice, and every later
        # opening then fails (dagster-io/dagster#27390; it cost a 300/s run its results).
        subprocess.run([str(bin_dir / "dagster"), "instance", "migrate"], env=env, check=True, capture_output=True)
        rport = free_port()
        rlog = work / "receiver.log"
        receiver = subprocess.Popen(
            [str(bin_dir / "ngsi-assets"), "serve", "--host", "127.0.0.1", "--port", str(rport),
             "--landing-root", str(landing)],
            env=env, stdout=rlog.open("wb"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
        procs.append(receiver)
        wait_port(rport, receiver, "the receiver", rlog)
        dlog = work / "daemon.log"
        daemon = subprocess.Popen(
            [str(bin_dir / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
            cwd=REPO, env=env, stdout=dlog.open("wb"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
        procs.append(daemon)
        print(f"work folder {work}; rate {args.rate}/s for {args.minutes} min", flush=True)

        obs = Observations()
        stop_traffic, stop_watch = threading.Event(), threading.Event()
        watchers = [
            threading.Thread(target=poll_last_data, args=(pg_url, obs, stop_watch), daemon=True),
            threading.Thread(target=sample_queue, args=(home, obs, stop_watch), daemon=True),
        ]
        for t in watchers:
            t.start()
        seconds = args.minutes * 60
        started = time.time()
        traffic(rport, args.rate, seconds, args.cars, obs, stop_traffic)
        traffic_end = time.time()
        cpu_during = [c for t, c in obs.cpu if started <= t <= traffic_end]
        print(f"traffic done: {len(obs.acks)} acknowledged, {obs.refused} refused", flush=True)
        deadline = time.time() + args.drain_minutes * 60
        while time.time() < deadline and not caught_up(obs):
            time.sleep(2)
        drained = caught_up(obs)
        drain_s = time.time() - traffic_end
        # Let the run that made last data current finish its other assets before counting.
        while time.time() < deadline and any(w + e for _, w, e in obs.queue[-2:]):
            time.sleep(5)
        stop_watch.set()
        for t in watchers:
            t.join(timeout=30)
        pairs = delays(obs)
        fresh = [seen - acked for acked, seen in pairs]
        complete = completeness(obs, lake, pg_url, my_db_url, args.cars)
        # The figures that need no Dagster instance first, so a failure reading it loses less.
        if fresh:
            print(
                f"freshness p50 / p95 / max: {pct(fresh, 50):.1f} / {pct(fresh, 95):.1f} / {max(fresh):.1f} s; "
                f"caught up after {round(drain_s) if drained else 'not'} s; everything in every table: "
                f"{complete['everything_in_every_table']}",
                flush=True,
            )
        windows = run_windows(home)
        runs = runs_summary(windows)
        during = [(w, e) for t, w, e in obs.queue if started <= t <= traffic_end]
        durations = [d for _, d, _ in runs]
        result = {
            "rate": args.rate,
            "minutes": args.minutes,
            "cars": args.cars,
            "derived_side_by_side": args.derived_side_by_side,
            "steps_side_by_side": args.steps_side_by_side,
            "run_launcher": args.run_launcher,
            "derived_interval": args.derived_interval,
            "derived_share": args.derived_share,
            "derived_in_increments": args.derived_in_increments,
            "mongo": args.mongo,
            "warm_up_runs": args.warm_up_runs,
            "warm_up_s": warm_up_s,
            "acknowledged": len(obs.acks),
            "refused": obs.refused,
            "freshness_s": {
                "p50": pct(fresh, 50) if fresh else None,
                "p95": pct(fresh, 95) if fresh else None,
                "max": max(fresh) if fresh else None,
                "measured": len(fresh),
            },
            "freshness_timeline": freshness_timeline(pairs, started),
            "worst_moments": worst_moments(pairs, windows, started),
            "queue_max_waiting": max((w for w, _ in during), default=0),
            "queue_timeline": [(round(t - started), w, e) for t, w, e in obs.queue[:: max(1, len(obs.queue) // 40)]],
            "runs": len(runs),
            "run_seconds": {
                "median": statistics.median(durations) if durations else None,
                "max": max(durations) if durations else None,
                "failed": sum(1 for *_, s in runs if s != "SUCCESS"),
            },
            "runs_by_job": {
                job: {
                    "runs": len(ds),
                    "median": statistics.median(ds),
                    "max": max(ds),
                    "failed": sum(1 for j, _, s in runs if j == job and s != "SUCCESS"),
                }
                for job in sorted({j for j, _, _ in runs})
                for ds in [[d for j, d, _ in runs if j == job]]
            },
            "cpu_busy_mean": statistics.mean(cpu_during) if cpu_during else None,
            "caught_up_after_traffic_s": round(drain_s) if drained else None,
            "completeness": complete,
            "derived": derived_runs_detail(home, started),
            # Where an increment's share of freshness goes.
            "increment_steps_median_s": steps_median(
                step_seconds(home, run_id) for run_id in job_run_ids(home, "ngsi_increment_job")
            ),
            "landing_ticks": landing_ticks(home),
            "asset_freshness_s": asset_freshness(home, obs),
        }
        print(json.dumps(result, indent=2), flush=True)
        if args.write_results:
            write_results(render(result), BEGIN, END, "Continuous operation")
        return 0
    finally:
        for p in reversed(procs):
            stop_group(p)
        strays = stop_strays(f"DAGSTER_HOME={work / 'home'}")
        if strays:
            print(f"stopped {len(strays)} process(es) left by the daemon: {strays}", flush=True)
        for s in servers:
            s.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def render(r: dict[str, Any]) -> str:
    f = r["freshness_s"]
    c = r["completeness"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    timeline = ", ".join(f"{t}s:{w}+{e}" for t, w, e in r["queue_timeline"])
    lines = [
        BEGIN,
        f"Machine: {describe_machine()}.",
        "",
        f"`benchmarks/bench_continuous.py --rate {r['rate']:g} --minutes {r['minutes']:g} --cars {r['cars']}"
        + ("" if r.get("derived_side_by_side") is None else f" --derived-side-by-side {r['derived_side_by_side']}")
        + ("" if r.get("steps_side_by_side") is None else f" --steps-side-by-side {r['steps_side_by_side']}")
        + ("" if r.get("run_launcher", "platform") == "platform" else f" --run-launcher {r['run_launcher']}")
        + ("" if r.get("derived_interval") is None else f" --derived-interval {r['derived_interval']:g}")
        + ("" if r.get("derived_share") is None else f" --derived-share {r['derived_share']:g}")
        + (" --derived-in-increments" if r.get("derived_in_increments") else "")
        + (" --mongo" if r.get("mongo") else "")
        + ("" if r.get("warm_up_runs", 0) == DEFAULT_RUNS else f" --warm-up-runs {r.get('warm_up_runs', 0)}")
        + "`: "
        "receiver, Dagster daemon with the sensors, one Spark Connect server, PostgreSQL and MariaDB "
        "(historic and last data, dm-by-entity-type), "
        + (
            "raw history and STH aggregates in MongoDB (SecantusDB unless MONGO_URL)."
            if r.get("mongo")
            else "STH in the lake (no MongoDB: the raw history is off)."
        ),
        "",
        "| measure | value |",
        "|---|---|",
        f"| notifications acknowledged / refused | {r['acknowledged']} / {r['refused']} |",
        f"| Connect server warm-up before the traffic: runs (s) | "
        f"{', '.join(f'{s:.1f}' for s in r.get('warm_up_s', [])) or 'none'} |",
        f"| freshness p50 / p95 / max (s), {f['measured']} measured | {fmt(f['p50'])} / {fmt(f['p95'])} / "
        f"{fmt(f['max'])} |",
        f"| runs waiting (max during traffic) | {r['queue_max_waiting']} |",
        f"| runs; duration median / max (s); failed | {r['runs']}; {fmt(r['run_seconds']['median'])} / "
        f"{fmt(r['run_seconds']['max'])}; {r['run_seconds']['failed']} |",
        *[
            f"| `{job}` runs; duration median / max (s); failed | {j['runs']}; {fmt(j['median'])} / "
            f"{fmt(j['max'])}; {j['failed']} |"
            for job, j in r.get("runs_by_job", {}).items()
        ],
        f"| CPU busy (mean over the traffic) | "
        f"{'-' if r['cpu_busy_mean'] is None else format(r['cpu_busy_mean'], '.0%')} |",
        f"| caught up after traffic stopped (s) | {r['caught_up_after_traffic_s'] or 'not within the drain time'} |",
        f"| message store rows / acknowledged | {c['message_store_rows']} / {c['acknowledged']} |",
        f"| historic rows PostgreSQL / MariaDB (expected {ATTRS} x acknowledged) | "
        f"{c['postgresql_historic_rows']} / {c['mysql_historic_rows']} |",
        f"| last data current PostgreSQL / MariaDB | {c['last_data_current']['postgresql']} / "
        f"{c['last_data_current']['mysql']} |",
        f"| everything acknowledged in every table | {c['everything_in_every_table']} |",
        *(
            [
                "",
                "Freshness per asset: from a notification's 201 to the end of the first materialization that "
                "holds it (its `ngsi/received_until` at or past the notification's receive time).",
                "",
                "| asset | p50 / p95 / max (s) | notifications measured / never held |",
                "|---|---|---|",
                *[
                    f"| `{asset}` | {fmt(a['p50'])} / {fmt(a['p95'])} / {fmt(a['max'])} | "
                    f"{a['measured']} / {a['never_held']} |"
                    for asset, a in r["asset_freshness_s"].items()
                ],
            ]
            if r.get("asset_freshness_s")
            else []
        ),
        *(
            [
                "",
                "Derived runs, median seconds per step: "
                + ", ".join(
                    f"{k} {v:.1f}" for k, v in sorted(r["derived"]["steps_median_s"].items(), key=lambda kv: -kv[1])
                )
                + "".join(
                    f"; `{asset}` folded: " + ", ".join(f"{k} {n}x" for k, n in sorted(kinds.items()))
                    for asset, kinds in sorted(r["derived"]["folds"].items())
                )
                + f"; keys folded on from their latest version: {r['derived'].get('keys_from_latest_version', 0)}.",
                "",
                "Derived runs one by one (start, seconds since traffic began: steps in seconds): "
                + "; ".join(
                    f"{t}s: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(steps.items()))
                    for t, steps in r["derived"].get("runs", [])
                )
                + ".",
            ]
            if (r.get("derived") or {}).get("runs")
            else [
                "",
                "No derived runs: the increments fold the versioned entities and the transaction history "
                "(`NGSI_DERIVED_IN_INCREMENTS`).",
            ]
            if "versioned_entities" in r.get("increment_steps_median_s", {})
            else []
        ),
        *(
            [
                "",
                "Increments, median seconds per step: "
                + ", ".join(
                    f"{k} {v:.1f}" for k, v in sorted(r["increment_steps_median_s"].items(), key=lambda kv: -kv[1])
                )
                + ".",
            ]
            if r.get("increment_steps_median_s")
            else []
        ),
        *(
            [
                "",
                f"Landing sensor: {r['landing_ticks']['ticks']} ticks, one every "
                f"{fmt(r['landing_ticks']['mean_gap_s'])} s on average, "
                f"{r['landing_ticks']['gaps_over_7_5s']} gaps over 7.5 s (a daemon loop is 5 s).",
            ]
            if r.get("landing_ticks")
            else []
        ),
        *(
            [
                "",
                "Freshness per minute of traffic (minute: p95 / max, s): "
                + ", ".join(f"{m}: {p:.0f} / {x:.0f}" for m, p, x in r["freshness_timeline"])
                + ".",
            ]
            if r.get("freshness_timeline")
            else []
        ),
        *(
            [
                "",
                "The worst delays, a minute apart, and the runs executing meanwhile (job, start and duration, s): "
                + "; ".join(
                    f"{w['delay_s']:.1f} s at {w['at_s']}s: "
                    + (", ".join(f"{job} {t}s {d:.1f}" for job, t, d in w["runs"]) or "no run")
                    for w in r["worst_moments"]
                )
                + ".",
            ]
            if r.get("worst_moments")
            else []
        ),
        "",
        f"Queue over time (seconds since traffic began: waiting+executing runs): {timeline}.",
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
