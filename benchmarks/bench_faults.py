"""Faults under continuous load: servers stopped and killed while traffic flows; what is lost, what recovers.

    .venv/bin/python benchmarks/bench_faults.py [--rate 100] [--down-s 60] [--faults a,b] [--write-results]

The platform as ``bench_continuous.py`` runs it (PostgreSQL and MariaDB with historic tables and last
data, a Spark Connect server every run shares, the receiver, the Dagster daemon with the sensors; STH
in the lake), steady traffic of NGSI v2 notifications, and, one after another while it flows, the
faults of ``FAULTS``: a server stopped for ``--down-s`` seconds or killed with SIGKILL, then started
again as an operator (or systemd) would. Nothing in the platform restarts a server it does not own.

After each fault, the time to recover: from the fault's end to the first last-data row that shows a
notification acknowledged after it. At the end, with the traffic stopped and the runs drained, every
acknowledged notification is looked for in the message store, the NGSI events and both historic
tables (lost: not there; duplicated: there twice), last data is compared with the newest acknowledged
value of every car, and no run may be left STARTED. The shortened form (one database stop and one
Spark Connect kill) is ``tests/test_faults.py``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
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
    "connect-kill",
    "daemon-kill",
    "receiver-kill",
)


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
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.work / "home"

    @property
    def lake(self) -> Path:
        return self.work / "lake"

    def start_connect(self) -> None:
        self.procs["connect"], _ = start_connect_server(self.work, self.connect_port)

    def start_receiver(self) -> None:
        log = self.work / "receiver.log"
        self.procs["receiver"] = subprocess.Popen(
            [str(Path(sys.executable).parent / "ngsi-assets"), "serve", "--host", "127.0.0.1",
             "--port", str(self.receiver_port), "--landing-root", str(self.work / "landing")],
            env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
        wait_port(self.receiver_port, self.procs["receiver"], "the receiver", log)

    def start_daemon(self) -> None:
        log = self.work / "daemon.log"
        self.procs["daemon"] = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
            cwd=REPO, env=self.env, stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip

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


def start_platform(work: Path) -> Platform:
    from tests.support.servers import mysql_server_url, postgres_server_url, start_mariadb, start_postgres

    pg = start_postgres()
    my = start_mariadb()
    pg_url, my_url = postgres_server_url(pg), mysql_server_url(my)
    sinks = work / "sql_sinks.yaml"
    common = "  last_data_mode: both\n  data_model: dm-by-entity-type\n  batch_ttl: 10\n  batch_retry_intervals: 2000\n"
    sinks.write_text(f"postgresql:\n  url: {pg_url}\n{common}mysql:\n  url: {my_url}\n{common}")
    connect_port = free_port()
    env = platform_env(
        work / "home",
        work / "landing",
        work / "lake",
        {"NGSI_SPARK_REMOTE": f"sc://127.0.0.1:{connect_port}", "NGSI_SQL_SINKS_CONFIG": str(sinks)},
    )
    platform = Platform(work, env, pg, my, pg_url, my_url, connect_port, free_port())
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "dagster"), "instance", "migrate"], env=env, check=True, capture_output=True)
    platform.start_connect()
    platform.start_receiver()
    platform.start_daemon()
    return platform


def inject(platform: Platform, fault: str) -> Callable[[], None]:
    """Start ``fault``; returns what ends it (the server started again)."""
    server, _, how = fault.partition("-")
    if server in ("postgres", "mariadb"):
        db = platform.pg if server == "postgres" else platform.my
        db.halt(signal.SIGKILL if how == "kill" else None)
        return db.start_again
    platform.kill(server)
    return {"connect": platform.start_connect, "daemon": platform.start_daemon, "receiver": platform.start_receiver}[
        server
    ]


@dataclass
class FaultWindow:
    fault: str
    start: float
    end: float
    recovered_after_s: float | None = None
    failed_runs: int = 0
    seen: str = ""


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
    drain_s: float, log: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    """Start the platform in ``work``, run traffic through ``faults`` one after another, and account."""
    code = describe_code()  # the code measured, before anything is written
    platform = start_platform(work)
    obs = Observations()
    stop_traffic, stop_watch = threading.Event(), threading.Event()
    windows: list[FaultWindow] = []
    try:
        watcher = threading.Thread(target=poll_last_data, args=(platform.pg_url, obs, stop_watch), daemon=True)
        watcher.start()
        total_s = warmup_s + len(faults) * (down_s + settle_s) + 3600
        sender = threading.Thread(
            target=traffic, args=(platform.receiver_port, rate, total_s, cars, obs, stop_traffic), daemon=True
        )
        started = time.time()
        sender.start()
        time.sleep(warmup_s)
        log(f"warm-up done: {len(obs.acks)} acknowledged, first last data after {recovery(obs, started)} s")
        for fault in faults:
            window = FaultWindow(fault, time.time(), 0.0)
            restart = inject(platform, fault)
            time.sleep(down_s if fault.endswith("-stop") else min(down_s, 10.0))
            restart()
            window.end = time.time()
            deadline = window.end + settle_s
            while time.time() < deadline and recovery(obs, window.end) is None:
                time.sleep(1)
            window.recovered_after_s = recovery(obs, window.end)
            time.sleep(max(0.0, deadline - time.time()))
            windows.append(window)
            log(f"{fault}: recovered after {window.recovered_after_s} s")
        stop_traffic.set()
        sender.join(timeout=60)
        traffic_end = time.time()
        deadline = traffic_end + drain_s
        while time.time() < deadline and not (caught_up_all(obs) and settled(platform.home)):
            time.sleep(5)
        stop_watch.set()
        watcher.join(timeout=30)
        stored = stored_notifications(platform)
        statuses = run_statuses(platform.home)
        for w in windows:
            # A run that failed while the fault was on or while the platform recovered from it.
            w.failed_runs = sum(
                1 for _, s, _, end in statuses if s == "FAILURE" and end and w.start <= end < w.end + settle_s
            )
            # Recovery seen in the whole record (it may take longer than the settling time).
            w.recovered_after_s = recovery(obs, w.end)
        newest: dict[int, int] = {}
        for car, seq in obs.acks:
            newest[car] = max(seq, newest.get(car, 0))
        current = last_data(platform)
        result = {
            "code": code,
            "rate": rate,
            "cars": cars,
            "down_s": down_s,
            "acknowledged": len(obs.acks),
            "refused": obs.refused,
            "faults": [
                {
                    "fault": w.fault,
                    "down_s": round(w.end - w.start, 1),
                    "recovered_after_s": None if w.recovered_after_s is None else round(w.recovered_after_s, 1),
                    "failed_runs": w.failed_runs,
                    **account(obs, stored, w.start, w.end + settle_s),
                }
                for w in windows
            ],
            "whole_run": account(obs, stored, 0.0, float("inf")),
            "historic_rows_expected": ATTRS * len(obs.acks),
            "last_data_current": {d: rows == newest for d, rows in current.items()},
            "runs": collections.Counter(s for _, s, *_ in statuses),
            "runs_left_started": sum(1 for _, s, *_ in statuses if s in ("STARTED", "STARTING", "CANCELING")),
        }
        return result
    finally:
        stop_traffic.set()
        stop_watch.set()
        platform.stop_all()
        platform.pg.stop()
        platform.my.stop()


def caught_up_all(obs: Observations) -> bool:
    newest: dict[int, int] = {}
    for car, seq in obs.acks:
        newest[car] = max(seq, newest.get(car, 0))
    return all(obs.visible.get(car) and obs.visible[car][-1][1] >= s for car, s in newest.items())


def render(r: dict[str, Any]) -> str:
    rows = [
        "| fault | down (s) | acknowledged in its window | lost | duplicated | failed runs | recovered after (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    tables = ("message_store", "ngsi_events", "postgresql_historic", "mysql_historic")
    for f in r["faults"]:
        lost = sum(f[t]["lost"] for t in tables)
        dup = sum(f[t]["duplicated"] for t in tables)
        rows.append(
            f"| {f['fault']} | {f['down_s']} | {f['acknowledged']:,} | {lost} | {dup} | {f['failed_runs']} | "
            f"{f['recovered_after_s'] if f['recovered_after_s'] is not None else 'not within the window'} |"
        )
    whole = r["whole_run"]
    return "\n".join(
        [
            BEGIN,
            r["code"],
            "",
            f"Machine: {describe_machine()}.",
            "",
            f"`benchmarks/bench_faults.py --rate {r['rate']:g} --cars {r['cars']} --down-s {r['down_s']:g}`: "
            f"{r['acknowledged']:,} notifications acknowledged, {r['refused']:,} refused (the sender saw an "
            "error or no answer: not acknowledged, to be sent again).",
            "",
            *rows,
            "",
            "Lost and duplicated count, over the message store, the NGSI events and both historic tables, the "
            "notifications acknowledged from the fault's start to the end of its settling time. Whole run: "
            + ", ".join(f"{t} {whole[t]['lost']} lost / {whole[t]['duplicated']} duplicated" for t in tables)
            + f"; last data current: {r['last_data_current']}; runs: {dict(r['runs'])}; "
            f"left started: {r['runs_left_started']}.",
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
            log=lambda text: print(text, flush=True),
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
