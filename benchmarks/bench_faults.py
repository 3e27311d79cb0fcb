"""Faults under continuous load: servers stopped and killed while traffic flows; what is lost, what recovers.

    .venv/bin/python benchmarks/bench_faults.py [--rate 100] [--down-s 60] [--faults a,b] [--write-results]

The platform as ``make dev`` runs it: PostgreSQL and MariaDB with historic tables and last data, a
MongoDB server with the raw history and the STH aggregates (SecantusDB, or ``MONGO_URL``), a Spark
Connect server every run shares, the receiver (its landing zone on a tmpfs of its own, so the disk can
fill), the Dagster daemon with the sensors and the webserver. Steady traffic of NGSI v2 notifications
flows and, one after another, the faults of ``FAULTS`` happen: a server stopped for ``--down-s``
seconds or killed with SIGKILL, then started again as an operator (or systemd) would; the landing
disk filled for ``--down-s`` seconds, then emptied. Nothing in the platform restarts a server it does
not own.

After each fault, the time to recover: from the fault's end to the first last-data row (for the
MongoDB faults: the first raw-history document) that shows a notification acknowledged after it. At
the end, with the traffic stopped and the runs drained, every acknowledged notification is looked for
in the message store, the NGSI events, both historic tables and the raw history (lost: not there;
duplicated: there twice); the STH aggregates of ``seq`` must count every acknowledged notification
once at every resolution with their sum; last data is compared with the newest acknowledged value of
every car (what a from-scratch run gives); and no run may be left STARTED. The shortened form (one
database stop and one Spark Connect kill) is ``tests/test_faults.py``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_continuous import (  # noqa: E402
    ATTRS,
    SERVICE,
    Observations,
    free_port,
    poll_last_data,
    stop_group,
    stop_strays,
    table,
    traffic,
    wait_port,
)
from benchmarks.bench_spark_modes import platform_env, start_connect_server  # noqa: E402
from benchmarks.machine import describe_code, describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402

BEGIN = "<!-- bench_faults:begin -->"
END = "<!-- bench_faults:end -->"
FAULTS = (
    "postgres-stop",
    "postgres-kill",
    "mariadb-stop",
    "mariadb-kill",
    "mongo-stop",
    "mongo-kill",
    "connect-kill",
    "daemon-kill",
    "webserver-kill",
    "receiver-kill",
    "disk-full",
)
SQL_TABLES = ("message_store", "ngsi_events", "postgresql_historic", "mysql_historic")
LANDING_DISK = "1g"  # the tmpfs the landing zone is on: room for hours of this traffic


@dataclass
class Platform:
    """The processes and servers of one fault run, and how to stop and start each again."""

    work: Path
    env: dict[str, str]
    pg: Any
    my: Any
    pg_url: str
    my_url: str
    connect_port: int
    receiver_port: int
    mongo_url: str
    mongo: Any  # the SecantusDB server started here; None with MONGO_URL (not ours to stop)
    webserver_port: int
    disk: Path | None  # the tmpfs mount the landing zone is on; None where nothing can be mounted
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.work / "home"

    @property
    def lake(self) -> Path:
        return self.work / "lake"

    @property
    def landing(self) -> Path:
        return (self.disk or self.work) / "landing"

    def start_connect(self) -> None:
        self.procs["connect"], _ = start_connect_server(self.work, self.connect_port)

    def start_receiver(self) -> None:
        log = self.work / "receiver.log"
        self.procs["receiver"] = subprocess.Popen(
            [str(Path(sys.executable).parent / "ngsi-assets"), "serve", "--host", "127.0.0.1",
             "--port", str(self.receiver_port), "--landing-root", str(self.landing)],
            env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
        wait_port(self.receiver_port, self.procs["receiver"], "the receiver", log)

    def start_daemon(self) -> None:
        log = self.work / "daemon.log"
        self.procs["daemon"] = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
            cwd=REPO, env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip

    def start_webserver(self) -> None:
        log = self.work / "webserver.log"
        self.procs["webserver"] = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-webserver"), "-w", str(REPO / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(self.webserver_port)],
            cwd=REPO, env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
        wait_port(self.webserver_port, self.procs["webserver"], "the webserver", log)

    def kill(self, name: str) -> None:
        """SIGKILL a process group of the platform's, as a crash or an OOM kill does."""
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if name == "daemon":  # its code server runs in a session of its own; the receiver shares its home
            spared = {p.pid for p in self.procs.values() if p.poll() is None}
            stop_strays(f"DAGSTER_HOME={self.home}", spare=spared)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            stop_group(proc)
        stop_strays(f"DAGSTER_HOME={self.home}")
        self.pg.stop()
        self.my.stop()
        if self.mongo is not None:
            self.mongo.stop()
        if self.disk is not None:
            subprocess.run(["umount", "--lazy", str(self.disk)], check=False, capture_output=True)


def mount_landing_disk(work: Path) -> Path | None:
    """A tmpfs of ``LANDING_DISK`` at ``work/disk`` for the landing zone, or None where mounting is
    not allowed (not root, or a container without the right): then the disk-full fault is skipped."""
    disk = work / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={LANDING_DISK},mode=0755", "tmpfs", str(disk)],
        check=False, capture_output=True,
    )  # fmt: skip
    return disk if done.returncode == 0 else None


def fill_disk(disk: Path) -> Callable[[], None]:
    """Fill ``disk`` until a write of one byte fails with ENOSPC; returns what frees the space again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
        try:
            os.write(fd, b"\0")
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    finally:
        os.close(fd)
    return filler.unlink


def start_platform(work: Path, derived_interval_s: float, landing_disk: bool) -> Platform:
    """Start every server and process; with ``landing_disk``, the landing zone on a tmpfs of its own."""
    from tests.support.servers import (
        mongo_server_url,
        mysql_server_url,
        postgres_server_url,
        start_mariadb,
        start_postgres,
        start_secantus,
    )

    pg = start_postgres()
    my = start_mariadb()
    pg_url, my_url = postgres_server_url(pg), mysql_server_url(my)
    mongo = None if os.environ.get("MONGO_URL") else start_secantus()
    mongo_url = os.environ["MONGO_URL"] if mongo is None else mongo_server_url(mongo)
    if mongo is None:
        import pymongo

        with pymongo.MongoClient(mongo_url) as client:
            for name in client.list_database_names():
                if SERVICE in name and name.startswith("sth"):
                    client.drop_database(name)
    sinks = work / "sql_sinks.yaml"
    common = "  last_data_mode: both\n  data_model: dm-by-entity-type\n  batch_ttl: 10\n  batch_retry_intervals: 2000\n"
    sinks.write_text(f"postgresql:\n  url: {pg_url}\n{common}mysql:\n  url: {my_url}\n{common}")
    connect_port = free_port()
    env = platform_env(
        work / "home",
        work / "landing",
        work / "lake",
        {
            "NGSI_SPARK_REMOTE": f"sc://127.0.0.1:{connect_port}",
            "NGSI_SQL_SINKS_CONFIG": str(sinks),
            "NGSI_MONGO_URL": mongo_url,
            "NGSI_MONGO_RAW_ENABLED": "true",
            "NGSI_DERIVED_INTERVAL_S": f"{derived_interval_s:g}",
        },
    )
    disk = mount_landing_disk(work) if landing_disk else None
    platform = Platform(
        work, env, pg, my, pg_url, my_url, connect_port, free_port(), mongo_url, mongo, free_port(), disk
    )
    env["NGSI_LANDING_ROOT"] = str(platform.landing)
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "dagster"), "instance", "migrate"], env=env, check=True, capture_output=True)
    platform.start_connect()
    platform.start_receiver()
    platform.start_daemon()
    platform.start_webserver()
    return platform


def can_inject(platform: Platform, fault: str) -> str | None:
    """Why ``fault`` cannot happen on this platform, or None."""
    if fault.startswith("mongo-") and platform.mongo is None:
        return "MONGO_URL's server is not this benchmark's to stop"
    if fault == "disk-full" and platform.disk is None:
        return "no tmpfs could be mounted for the landing zone (needs root and the mount right)"
    return None


def inject(platform: Platform, fault: str) -> Callable[[], None]:
    """Start ``fault``; returns what ends it (the server started again)."""
    server, _, how = fault.partition("-")
    if server in ("postgres", "mariadb", "mongo"):
        db = {"postgres": platform.pg, "mariadb": platform.my, "mongo": platform.mongo}[server]
        db.halt(signal.SIGKILL if how == "kill" else None)
        return db.start_again
    if server == "disk":
        assert platform.disk is not None
        return fill_disk(platform.disk)
    platform.kill(server)
    return {
        "connect": platform.start_connect,
        "daemon": platform.start_daemon,
        "webserver": platform.start_webserver,
        "receiver": platform.start_receiver,
    }[server]


@dataclass
class FaultWindow:
    fault: str
    start: float
    end: float
    recovered_after_s: float | None = None
    failed_runs: int = 0
    skipped: str | None = None  # why the fault could not happen here


def recovery(obs: Observations, after: float) -> float | None:
    """Seconds from ``after`` to the first last-data change showing a notification acknowledged after it."""
    first = None
    for car, changes in obs.visible.items():
        for seen_at, seq in changes:
            acked = obs.acks.get((car, seq))
            if acked is not None and acked > after and seen_at >= acked:
                first = seen_at if first is None else min(first, seen_at)
                break
    return None if first is None else first - after


CAR = re.compile(r"car(\d+)")


def sth_database(client: Any) -> Any:
    """The database of the service's raw history and STH aggregates (``sth_`` + service)."""
    return client[next((n for n in client.list_database_names() if n.startswith("sth") and SERVICE in n), "sth_x")]


def poll_raw_history(mongo_url: str, seen: Observations, stop: threading.Event) -> None:
    """Record in ``seen.visible`` each change of the newest ``seq`` in car000's raw-history collection."""
    import pymongo

    newest = None
    with pymongo.MongoClient(mongo_url, serverSelectionTimeoutMS=2000, socketTimeoutMS=10_000) as client:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # down during a MongoDB fault; absent before the first run
                db = sth_database(client)
                name = next(n for n in db.list_collection_names() if "car000" in n and not n.endswith(".aggr"))
                doc = db[name].find_one({"attrName": "seq"}, sort=[("recvTime", -1), ("_id", -1)])
                now = time.time()
                if doc is not None and int(float(doc["attrValue"])) != newest:
                    newest = int(float(doc["attrValue"]))
                    seen.visible.setdefault(0, []).append((now, newest))
            stop.wait(1.0)


def raw_history(mongo_url: str) -> collections.Counter[tuple[int, int]]:
    """(car, seq) -> how many times the raw history holds it (its ``seq`` attribute's documents)."""
    import pymongo

    out: collections.Counter[tuple[int, int]] = collections.Counter()
    with pymongo.MongoClient(mongo_url) as client:
        db = sth_database(client)
        for name in db.list_collection_names():
            car = CAR.search(name)
            if car is None or name.endswith(".aggr"):
                continue
            for doc in db[name].find({"attrName": "seq"}, {"attrValue": 1, "_id": 0}):
                out[(int(car.group(1)), int(float(doc["attrValue"])))] += 1
    return out


def sth_totals(mongo_url: str) -> dict[str, dict[int, tuple[int, float]]]:
    """resolution -> car -> (samples, sum) of ``seq`` over the STH aggregate documents."""
    import pymongo

    out: dict[str, dict[int, tuple[int, float]]] = {}
    with pymongo.MongoClient(mongo_url) as client:
        db = sth_database(client)
        for name in db.list_collection_names():
            car = CAR.search(name)
            if car is None or not name.endswith(".aggr"):
                continue
            for doc in db[name].find({"_id.attrName": "seq"}):
                per_car = out.setdefault(doc["_id"]["resolution"], {})
                samples, total = per_car.get(int(car.group(1)), (0, 0.0))
                for point in doc["points"]:
                    samples, total = samples + int(point["samples"]), total + float(point.get("sum", 0))
                per_car[int(car.group(1))] = (samples, total)
    return out


def sth_account(obs: Observations, totals: dict[str, dict[int, tuple[int, float]]]) -> dict[str, Any]:
    """Per resolution: samples missing and extra against the acknowledged notifications, and whether
    every car's sum of ``seq`` is the sum of its acknowledged ones."""
    expected: dict[int, tuple[int, float]] = {}
    for car, seq in obs.acks:
        samples, total = expected.get(car, (0, 0.0))
        expected[car] = (samples + 1, total + seq)
    out: dict[str, Any] = {}
    for resolution, per_car in sorted(totals.items()):
        out[resolution] = {
            "missing": sum(max(0, n - per_car.get(car, (0, 0.0))[0]) for car, (n, _) in expected.items()),
            "extra": sum(max(0, per_car.get(car, (0, 0.0))[0] - n) for car, (n, _) in expected.items()),
            "sums_equal": all(per_car.get(car, (0, 0.0))[1] == total for car, (_, total) in expected.items()),
        }
    return out


def _headline(text: str) -> str:
    """The line of an error's text that says what went wrong: its first, or for an error raised in a
    Spark Python worker (whose first line is only the wrapper's class), the traceback's last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    if "Traceback (most recent call last):" in lines:
        return f"{lines[0].split(':')[0].rsplit('.', 1)[-1]}: {lines[-1]}"
    return lines[0]


def failure_reasons(home: Path) -> list[tuple[float, str]]:
    """(end time, reason) of every failed run: each failed step's error headline, or the run's own."""
    from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

    reasons: list[tuple[float, str]] = []
    with DagsterInstance.from_config(str(home)) as instance:
        for record in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE])):
            if not record.end_time:
                continue
            run_id = record.dagster_run.run_id
            steps = instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
            for event in steps:
                error = event.dagster_event.step_failure_data.error if event.dagster_event else None
                while error is not None and error.cause is not None:  # the user code's own exception
                    error = error.cause
                text = (error.message if error else event.message or "").strip()
                reasons.append((record.end_time, f"{event.step_key}: {_headline(text)[:110]}"))
            if not steps:
                failure = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
                text = (failure[-1].message if failure else "") or "(no message)"
                reasons.append((record.end_time, f"run: {text.strip().splitlines()[0][:110]}"))
    return reasons


def _counter_of_seq(rows: list[tuple[str, Any]]) -> collections.Counter[tuple[int, int]]:
    return collections.Counter((int(e[3:]), int(float(v))) for e, v in rows)


def stored_notifications(platform: Platform) -> dict[str, collections.Counter[tuple[int, int]]]:
    """(car, seq) -> how many times it is stored, in the message store, the events and both historic tables."""
    import psycopg2
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pymysql

    from resources.sql import MySQLResource

    out: dict[str, collections.Counter[tuple[int, int]]] = {}
    store = ds.dataset(str(platform.lake / "message_store"), format="parquet", partitioning="hive")
    bodies = store.to_table(columns=["data"]).column("data").to_pylist()
    out["message_store"] = collections.Counter(
        (int(e["id"][3:]), int(e["seq"]["value"])) for b in bodies for e in json.loads(b)["data"]
    )
    events = ds.dataset(str(platform.lake / "ngsi_events"), format="parquet", partitioning="hive")
    seq = events.to_table(columns=["entityId", "attrValue"], filter=pc.field("attrName") == "seq")
    out["ngsi_events"] = _counter_of_seq(list(zip(seq.column(0).to_pylist(), seq.column(1).to_pylist(), strict=True)))
    with psycopg2.connect(platform.pg_url) as conn, conn.cursor() as cur:
        cur.execute(
            f'SELECT entityid, attrvalue FROM "{SERVICE}"."{table("postgresql")}" WHERE attrname = %s', ("seq",)
        )
        out["postgresql_historic"] = _counter_of_seq(cur.fetchall())
    conn = pymysql.connect(**MySQLResource(url=platform.my_url).connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT entityId, attrValue FROM `{SERVICE}`.`{table('mysql')}` WHERE attrName = %s", ("seq",))
            out["mysql_historic"] = _counter_of_seq(cur.fetchall())
    finally:
        conn.close()
    out["mongo_raw_history"] = raw_history(platform.mongo_url)
    return out


def last_data(platform: Platform) -> dict[str, dict[int, int]]:
    import psycopg2
    import pymysql

    from resources.sql import MySQLResource

    with psycopg2.connect(platform.pg_url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT entityid, seq FROM "{SERVICE}"."{table("postgresql", "_last_data")}"')
        pg = {int(e[3:]): int(float(s)) for e, s in cur.fetchall()}
    conn = pymysql.connect(**MySQLResource(url=platform.my_url).connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT entityId, seq FROM `{SERVICE}`.`{table('mysql', '_last_data')}`")
            my = {int(e[3:]): int(float(s)) for e, s in cur.fetchall()}
    finally:
        conn.close()
    return {"postgresql": pg, "mysql": my}


def run_statuses(home: Path) -> list[tuple[str, str, float | None, float | None]]:
    """(job, status, start, end) of every run of the instance."""
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        return [
            (r.dagster_run.job_name, r.dagster_run.status.value, r.start_time, r.end_time)
            for r in instance.get_run_records()
        ]


def settled(home: Path) -> bool:
    """No run queued, starting, started or canceling."""
    return not any(
        status in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING") for _, status, *_ in run_statuses(home)
    )


def account(
    obs: Observations, stored: dict[str, collections.Counter[tuple[int, int]]], since: float, until: float
) -> dict[str, Any]:
    """Of the notifications acknowledged in [since, until): how many, and per table how many lost and duplicated."""
    acked = [key for key, t in obs.acks.items() if since <= t < until]
    out: dict[str, Any] = {"acknowledged": len(acked)}
    for name, counts in stored.items():
        out[name] = {
            "lost": sum(1 for k in acked if counts.get(k, 0) == 0),
            "duplicated": sum(1 for k in acked if counts.get(k, 0) > 1),
        }
    return out


def run_faults(
    work: Path, faults: list[str], rate: float, cars: int, down_s: float, settle_s: float, warmup_s: float,
    drain_s: float, derived_interval_s: float = 120.0, log: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Start the platform in ``work``, run traffic through ``faults`` one after another, and account."""
    code = describe_code()  # the code measured, before anything is written
    platform = start_platform(work, derived_interval_s, landing_disk="disk-full" in faults)
    obs, raw_seen = Observations(), Observations()
    stop_traffic, stop_watch = threading.Event(), threading.Event()
    windows: list[FaultWindow] = []
    try:
        watchers = [
            threading.Thread(target=poll_last_data, args=(platform.pg_url, obs, stop_watch), daemon=True),
            threading.Thread(target=poll_raw_history, args=(platform.mongo_url, raw_seen, stop_watch), daemon=True),
        ]
        for watcher in watchers:
            watcher.start()
        total_s = warmup_s + len(faults) * (down_s + settle_s) + 3600
        sender = threading.Thread(
            target=traffic, args=(platform.receiver_port, rate, total_s, cars, obs, stop_traffic), daemon=True
        )
        started = time.time()
        sender.start()
        time.sleep(warmup_s)
        log(f"warm-up done: {len(obs.acks)} acknowledged, first last data after {recovery(obs, started)} s")
        raw_seen.acks = obs.acks  # the same acknowledgements, seen in the raw history
        for fault in faults:
            window = FaultWindow(fault, time.time(), 0.0, skipped=can_inject(platform, fault))
            if window.skipped:
                window.end = window.start
                windows.append(window)
                log(f"{fault}: skipped ({window.skipped})")
                continue
            restart = inject(platform, fault)
            time.sleep(down_s if fault.endswith(("-stop", "-full")) else min(down_s, 10.0))
            restart()
            window.end = time.time()
            seen = raw_seen if fault.startswith("mongo-") else obs
            deadline = window.end + settle_s
            while time.time() < deadline and recovery(seen, window.end) is None:
                time.sleep(1)
            time.sleep(max(0.0, deadline - time.time()))
            windows.append(window)
            log(f"{fault}: recovered after {recovery(seen, window.end)} s")
        stop_traffic.set()
        sender.join(timeout=60)
        traffic_end = time.time()
        deadline = traffic_end + drain_s
        while time.time() < deadline and not (caught_up_all(obs) and settled(platform.home)):
            time.sleep(5)
        # The STH aggregates follow in the derived lane: wait for its run over the last increments.
        while time.time() < deadline and not sth_complete(obs, platform):
            time.sleep(15)
        stop_watch.set()
        for watcher in watchers:
            watcher.join(timeout=30)
        stored = stored_notifications(platform)
        statuses = run_statuses(platform.home)
        reasons = failure_reasons(platform.home)
        newest: dict[int, int] = {}
        for car, seq in obs.acks:
            newest[car] = max(seq, newest.get(car, 0))
        current = last_data(platform)

        def window_result(w: FaultWindow) -> dict[str, Any]:
            if w.skipped:
                return {"fault": w.fault, "skipped": w.skipped}
            until = w.end + settle_s
            recovered = recovery(raw_seen if w.fault.startswith("mongo-") else obs, w.end)
            return {
                "fault": w.fault,
                "down_s": round(w.end - w.start, 1),
                # Seen in the whole record: it may take longer than the settling time.
                "recovered_after_s": None if recovered is None else round(recovered, 1),
                "refused": sum(1 for t in obs.refused_at if w.start <= t < until),
                # Runs that failed while the fault was on or while the platform recovered from it.
                "failed_runs": sum(
                    1 for _, st, _, end in statuses if st == "FAILURE" and end and w.start <= end < until
                ),
                "failures": collections.Counter(r for end, r in reasons if w.start <= end < until).most_common(3),
                **account(obs, stored, w.start, until),
            }

        return {
            "code": code,
            "rate": rate,
            "cars": cars,
            "down_s": down_s,
            "settle_s": settle_s,
            "derived_interval_s": derived_interval_s,
            "mongo": "MONGO_URL" if platform.mongo is None else "SecantusDB",
            "acknowledged": len(obs.acks),
            "refused": obs.refused,
            "faults": [window_result(w) for w in windows],
            "whole_run": account(obs, stored, 0.0, float("inf")),
            "sth_aggregates": sth_account(obs, sth_totals(platform.mongo_url)),
            "historic_rows_expected": ATTRS * len(obs.acks),
            "last_data_current": {d: rows == newest for d, rows in current.items()},
            "runs": collections.Counter(s for _, s, *_ in statuses),
            "runs_left_started": sum(1 for _, s, *_ in statuses if s in ("STARTED", "STARTING", "CANCELING")),
        }
    finally:
        stop_traffic.set()
        stop_watch.set()
        platform.stop_all()


def sth_complete(obs: Observations, platform: Platform) -> bool:
    """Every resolution of the STH aggregates counts every acknowledged notification."""
    with contextlib.suppress(Exception):
        totals = sth_account(obs, sth_totals(platform.mongo_url))
        return bool(totals) and all(r["missing"] == 0 for r in totals.values())
    return False


def caught_up_all(obs: Observations) -> bool:
    newest: dict[int, int] = {}
    for car, seq in obs.acks:
        newest[car] = max(seq, newest.get(car, 0))
    return all(obs.visible.get(car) and obs.visible[car][-1][1] >= s for car, s in newest.items())


def _saw(f: dict[str, Any]) -> str:
    """What the operator saw of one fault: refusals at the receiver, failed runs and their errors."""
    parts = []
    if f["refused"]:
        parts.append(f"{f['refused']:,} notifications refused (503 or no answer)")
    if f["failed_runs"]:
        reasons = "; ".join(f"{n}x {text}" for text, n in f["failures"])
        parts.append(f"{f['failed_runs']} failed runs ({reasons})" if reasons else f"{f['failed_runs']} failed runs")
    return ", ".join(parts).replace("|", "\\|") or "nothing: no refusal, no failed run"


def render(r: dict[str, Any]) -> str:
    tables = (*SQL_TABLES, "mongo_raw_history")
    rows = [
        "| fault | down (s) | acknowledged in its window | lost | duplicated | recovered after (s) "
        "| what the operator saw |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for f in r["faults"]:
        if "skipped" in f:
            rows.append(f"| {f['fault']} | | | | | | not run: {f['skipped']} |")
            continue
        lost = sum(f[t]["lost"] for t in tables)
        dup = sum(f[t]["duplicated"] for t in tables)
        recovered = f["recovered_after_s"] if f["recovered_after_s"] is not None else "not within the run"
        rows.append(
            f"| {f['fault']} | {f['down_s']} | {f['acknowledged']:,} | {lost} | {dup} | {recovered} | {_saw(f)} |"
        )
    whole = r["whole_run"]
    sth = r["sth_aggregates"]
    return "\n".join(
        [
            BEGIN,
            r["code"],
            "",
            f"Machine: {describe_machine()}.",
            "",
            f"`benchmarks/bench_faults.py --rate {r['rate']:g} --cars {r['cars']} --down-s {r['down_s']:g} "
            f"--settle-s {r['settle_s']:g} --derived-interval-s {r['derived_interval_s']:g}` (MongoDB: {r['mongo']}): "
            f"{r['acknowledged']:,} notifications acknowledged, {r['refused']:,} refused (the sender saw an "
            "error or no answer: not acknowledged, to be sent again).",
            "",
            *rows,
            "",
            "Lost and duplicated count, over the message store, the NGSI events, both historic tables and the raw "
            "history, the notifications acknowledged from the fault's start to the end of its settling time. "
            "Recovered after: from the fault's end to the first last-data row (MongoDB faults: raw-history "
            "document) showing a notification acknowledged after it. Whole run: "
            + ", ".join(f"{t} {whole[t]['lost']} lost / {whole[t]['duplicated']} duplicated" for t in tables)
            + "; STH aggregates of `seq`: "
            + ", ".join(
                f"{res} {a['missing']} missing / {a['extra']} extra samples, "
                f"sums {'equal' if a['sums_equal'] else 'differ'}"
                for res, a in sth.items()
            )
            + f"; last data equal to the newest acknowledged value (a from-scratch run's): {r['last_data_current']}; "
            f"runs: {dict(r['runs'])}; left started: {r['runs_left_started']}.",
            END,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="notifications per second")
    parser.add_argument("--cars", type=int, default=50)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, among {', '.join(FAULTS)}")
    parser.add_argument("--down-s", type=float, default=60.0, help="how long a stopped server stays down")
    parser.add_argument("--settle-s", type=float, default=120.0, help="traffic after each fault before the next")
    parser.add_argument("--warmup-s", type=float, default=90.0)
    parser.add_argument("--drain-minutes", type=float, default=15.0)
    parser.add_argument(
        "--derived-interval-s",
        type=float,
        default=120.0,
        help="NGSI_DERIVED_INTERVAL_S (how often the STH aggregates follow)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}; choose among {', '.join(FAULTS)}")
    work = Path(tempfile.mkdtemp(prefix="ngsi-bench-faults-"))
    print(f"work folder {work}", flush=True)
    try:
        result = run_faults(
            work, faults, args.rate, args.cars, args.down_s, args.settle_s, args.warmup_s, args.drain_minutes * 60,
            args.derived_interval_s, log=lambda text: print(text, flush=True),
        )  # fmt: skip
        print(json.dumps(result, indent=2, default=str), flush=True)
        if args.write_results:
            write_results(render(result), BEGIN, END, "Faults under continuous load")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
