"""Rebuild speed: the main job over a landing zone of N notifications, from a fresh lake.

    .venv/bin/python benchmarks/bench_rebuild.py [--notifications 1000000] [--modes lake sql mongo]
        [--spark local|connect] [--baseline] [--workdir DIR] [--write-results]

The input is the demo city's mix (NGSI v2 in its four formats, NGSI-LD, data-hub messages, duplicates
and malformed requests, out-of-order deliveries; about 4 attributes per notification), generated
once per size and kept under ``--workdir`` (``landing-<N>``), so later runs reuse it. It is landed
through the file loader (the receiver's own validation and envelope) with receive times spread over
the hours a 100 notifications/s deployment would take (at most 360,000 an hour).

Then ``ngsi-assets materialize`` (``ngsi_ingest_job`` over every landed hour, one run) in a new
process on a fresh lake and Dagster instance, for each mode:

- ``lake``: the lake assets only: message store, NGSI events, versioned entities (the demo's
  entity schema), transaction history, STH aggregates in the lake;
- ``sql``: the same with PostgreSQL and MariaDB historic tables and last data (``dm-by-entity-type``,
  ``last_data_mode: both``; throwaway servers started here, as the tests start them);
- ``mongo``: the same as ``lake`` with the STH aggregates published to a MongoDB (``MONGO_URL``, or
  the SecantusDB test server: slow with large collections, so use a real server for large N).

Per asset, from the driver's Spark event log (each job carries the tag ``ngsi-asset-<asset>``):
seconds (Dagster's step times), Spark jobs, stages and tasks run, bytes shuffled and the largest
task's peak execution memory; per run, the peak resident memory of the run's process tree.

``--baseline`` also times, on the same landing lines, a plain single-process Python loop doing what
Cygnus does per notification: parse the landed line and its body, name the table
(``dm-by-entity-type``), make one historic row per attribute, and upsert last data into a dict,
newest observation wins. Its rows stay in memory; nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_spark_modes import platform_env, start_connect_server, step_seconds  # noqa: E402
from benchmarks.machine import describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402

BEGIN = "<!-- bench_rebuild:begin -->"
END = "<!-- bench_rebuild:end -->"
SECTION = "Rebuild: the main job over 100,000 to 3,000,000 notifications"
PER_HOUR = 360_000  # 100 notifications/s
START = datetime(2026, 1, 5, tzinfo=UTC)
SEED = 7
ASSET_TAG = "ngsi-asset-"
MODES = ("lake", "sql", "mongo")
MODE_TITLES = {
    "lake": "(a) lake only",
    "sql": "(b) + PostgreSQL and MariaDB (historic, last data)",
    "mongo": "(c) + MongoDB STH",
}


# ---------------------------------------------------------------------------------------------------
# Input


def land_city(root: Path, notifications: int) -> dict[str, Any]:
    """The city's notifications landed under ``root`` (reused when already there); what was landed."""
    done = root / "landed.json"
    if done.exists():
        info = json.loads(done.read_text())
        if info.get("notifications") == notifications and info.get("seed") == SEED:
            return info
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    from ngsi_assets.demo.city import generate_city, write_jsonl
    from ngsi_assets.ingest.landing import LandingWriter
    from ngsi_assets.ingest.loader import load_paths
    from ngsi_assets.ngsi.envelope import MessageIdFactory
    from ngsi_assets.ngsi.payloads import IngestSettings

    hours = max(1, math.ceil(notifications / PER_HOUR))
    info: dict[str, Any] = {"notifications": notifications, "seed": SEED, "hours": hours, "accepted": 0,
                            "rejected": 0, "attribute_updates": 0, "by_kind": defaultdict(int)}  # fmt: skip
    started = time.monotonic()
    ids = MessageIdFactory()
    with LandingWriter(root / "zone") as writer:
        for h in range(hours):
            n = notifications // hours + (1 if h < notifications % hours else 0)
            hour_start = START + timedelta(hours=h)
            requests, summary = generate_city(seed=SEED + h, hours=1, start=hour_start, target_notifications=n)
            sample = root / "city.jsonl"
            write_jsonl(requests, sample)
            del requests
            # Receive times spread evenly over the hour, in file order (the loader stamps each request).
            step = 3600.0 / n
            ticks = iter(hour_start.timestamp() + 1.0 + i * step for i in range(n + 1))
            report = load_paths([sample], writer, IngestSettings(guid_from_correlator=True), ids,
                                clock=functools.partial(next, ticks))  # fmt: skip
            sample.unlink()
            info["accepted"] += report.accepted
            info["rejected"] += report.rejected
            info["attribute_updates"] += summary.attribute_updates
            for kind, count in summary.by_kind.items():
                info["by_kind"][kind] += count
            print(f"landed hour {h + 1}/{hours}: {report.accepted} accepted, {report.rejected} refused", flush=True)
    info["landing_bytes"] = sum(p.stat().st_size for p in (root / "zone").rglob("*") if p.is_file())
    info["seconds"] = round(time.monotonic() - started, 1)
    done.write_text(json.dumps(info))
    return info


# ---------------------------------------------------------------------------------------------------
# The Python baseline


def python_baseline(zone: Path) -> dict[str, Any]:
    """What Cygnus does per notification, in one Python process: see the module docstring."""
    import orjson

    from ngsi_assets.ngsi.sql_naming import DataModel, Dialect, NamingConfig, NamingError, db_name, table_name

    cfg = NamingConfig(dialect=Dialect.MYSQL, data_model=DataModel.BY_ENTITY_TYPE)
    not_attributes = {"id", "type", "alterationType", "@context", "createdAt", "modifiedAt", "deletedAt", "scope"}
    tables: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    last: dict[tuple[str, str, str, str], tuple] = {}
    names: dict[tuple[str, str, str], tuple[str, str]] = {}
    lines = notifications = errors = rows = 0
    files = sorted(p for p in zone.rglob("*") if p.is_file() and not p.name.startswith("."))
    started = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                try:
                    envelope = orjson.loads(line)
                except orjson.JSONDecodeError:
                    errors += 1
                    continue
                kind = envelope.get("kind")
                if kind not in ("ngsi-v2", "ngsi-ld"):
                    continue
                notifications += 1
                body = envelope["body"]
                entities = body.get("data") if isinstance(body, dict) and "data" in body else [body]
                service = envelope.get("service") or "default"
                paths = (envelope.get("service_path") or "/").split(",")
                recv_ms = envelope["recv_ms"]
                recv_time = datetime.fromtimestamp(recv_ms / 1000, UTC).isoformat(timespec="milliseconds")
                for i, entity in enumerate(entities or ()):
                    if not isinstance(entity, dict) or "id" not in entity:
                        errors += 1
                        continue
                    path = (paths[i] if len(paths) > i else paths[0]).strip()
                    etype = entity.get("type") or ""
                    key = (service, path, etype)
                    name = names.get(key)
                    if name is None:
                        try:
                            name = names[key] = (
                                db_name(service, cfg, path),
                                table_name(path, entity["id"], etype, cfg),
                            )
                        except NamingError:
                            errors += 1
                            continue
                    table = tables[name]
                    for attr, raw in entity.items():
                        if attr in not_attributes:
                            continue
                        if isinstance(raw, dict):
                            value, atype = raw.get("value", raw.get("object")), raw.get("type")
                            md = raw.get("metadata") or {}
                            observed = (md.get("TimeInstant") or {}).get("value") or raw.get("observedAt")
                        else:
                            value, atype, md, observed = raw, None, {}, None
                        text = value if isinstance(value, str) else orjson.dumps(value).decode()
                        row = (recv_ms, recv_time, path, entity["id"], etype, attr, atype, text,
                               orjson.dumps(md).decode())  # fmt: skip
                        table.append(row)
                        rows += 1
                        stamp = observed or recv_time
                        lkey = (*name, entity["id"], attr)
                        old = last.get(lkey)
                        if old is None or old[0] <= stamp:
                            last[lkey] = (stamp, row)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "lines": lines, "notifications": notifications, "historic_rows": rows,
            "tables": len(tables), "last_data_rows": len(last), "errors": errors}  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Spark's event log: jobs, stages, tasks, shuffle and memory per asset


def spark_metrics(event_dir: Path) -> dict[str, dict[str, float]]:
    """Per asset tag (``ngsi-asset-<asset>``, ``other`` for untagged jobs), from every event log
    under ``event_dir``: jobs, stages and tasks run (skipped stages are not run), bytes shuffled
    (written), the largest peak execution memory of one task, and the tasks' summed run time and JVM
    CPU time (seconds)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stage_asset: dict[tuple[str, int], str] = {}
    # Spark 4 writes each application's log as a folder of rolled files (``eventlog_v2_<app>/events_<n>_<app>``).
    for path in sorted(
        event_dir.rglob("*"),
        key=lambda p: (p.parent.name, int(p.name.split("_")[1]) if p.name.startswith("events_") else 0),
    ):
        if not path.is_file() or path.name.startswith("appstatus"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith('{"Event":"SparkListener'):
                    continue
                event = json.loads(line)
                kind = event["Event"]
                if kind == "SparkListenerJobStart":
                    tags = (event.get("Properties") or {}).get("spark.job.tags") or ""
                    asset = next((t.split(ASSET_TAG, 1)[1] for t in tags.split(",") if ASSET_TAG in t), "other")
                    out[asset]["jobs"] += 1
                    for sid in event.get("Stage IDs", []):
                        stage_asset[(path.parent.name, sid)] = asset
                elif kind == "SparkListenerStageCompleted":
                    info = event["Stage Info"]
                    asset = stage_asset.get((path.parent.name, info["Stage ID"]), "other")
                    out[asset]["stages"] += 1
                    out[asset]["tasks"] += info.get("Number of Tasks", 0)
                    for acc in info.get("Accumulables", []):
                        if acc.get("Name") == "internal.metrics.shuffle.write.bytesWritten":
                            out[asset]["shuffle_bytes"] += float(acc.get("Value", 0))
                elif kind == "SparkListenerTaskEnd":
                    asset = stage_asset.get((path.parent.name, event.get("Stage ID")), "other")
                    metrics = event.get("Task Metrics") or {}
                    peak = metrics.get("Peak Execution Memory", 0) or 0
                    out[asset]["task_peak_bytes"] = max(out[asset]["task_peak_bytes"], float(peak))
                    # Wall time in the task (its Python workers' included) and the JVM's CPU in it.
                    out[asset]["task_seconds"] += (metrics.get("Executor Run Time", 0) or 0) / 1000
                    out[asset]["task_cpu_seconds"] += (metrics.get("Executor CPU Time", 0) or 0) / 1e9
    return {k: dict(v) for k, v in out.items()}


def _tree_rss_bytes(pid: int) -> int:
    from benchmarks.machine import _tree

    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/statm") as f:
            total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


# ---------------------------------------------------------------------------------------------------
# Runs


def run_materialize(env: dict[str, str], home: Path, events: Path, watch_pid: int | None = None) -> dict[str, Any]:
    """``ngsi-assets materialize`` in a new process; its times, steps, Spark metrics and peak memory
    (``watch_pid``: also the memory of that process tree, a Connect server's)."""
    started = time.monotonic()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ngsi-assets")), "materialize"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            rss = _tree_rss_bytes(proc.pid) + (_tree_rss_bytes(watch_pid) if watch_pid else 0)
            peak[0] = max(peak[0], rss)
            done.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    done.set()
    watcher.join()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"materialize failed ({proc.returncode}):\n{stdout[-4000:]}\n{stderr[-6000:]}")
    line = next(ln for ln in stdout.splitlines() if ln.startswith("run "))
    run_id, run_s = line.split()[1], float(line.split(" in ")[1].split()[0])
    failed = [ln.strip() for ln in stdout.splitlines() if "FAILED" in ln]
    if failed:
        raise RuntimeError("checks failed:\n" + "\n".join(failed))
    return {"wall": wall, "run": run_s, "steps": step_seconds(home, run_id), "spark": spark_metrics(events),
            "peak_rss": peak[0]}  # fmt: skip


@contextlib.contextmanager
def sql_servers(work: Path) -> Iterator[dict[str, str]]:
    """PostgreSQL and MariaDB started for the run (as the tests start them); the sinks' settings."""
    from tests.support.servers import mysql_server_url, postgres_server_url, start_mariadb, start_postgres

    servers = []
    try:
        pg = start_postgres()
        servers.append(pg)
        my = start_mariadb()
        servers.append(my)
        sinks = work / "sql_sinks.yaml"
        common = "  last_data_mode: both\n  data_model: dm-by-entity-type\n"
        sinks.write_text(
            f"postgresql:\n  url: {postgres_server_url(pg)}\n{common}mysql:\n  url: {mysql_server_url(my)}\n{common}"
        )
        yield {"NGSI_SQL_SINKS_CONFIG": str(sinks)}
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def mongo_server() -> Iterator[dict[str, str]]:
    """``MONGO_URL``'s MongoDB, else a SecantusDB test server started for the run."""
    if os.environ.get("MONGO_URL"):
        yield {"NGSI_MONGO_URL": os.environ["MONGO_URL"]}
        return
    from tests.support.servers import mongo_server_url, start_secantus

    server = start_secantus()
    try:
        yield {"NGSI_MONGO_URL": mongo_server_url(server)}
    finally:
        server.stop()


def event_log_conf(conf_dir: Path, events: Path) -> dict[str, str]:
    """A Spark configuration folder whose defaults turn the driver's event log on into ``events``."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    events.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\nspark.eventLog.compress false\n"
    )
    return {"SPARK_CONF_DIR": str(conf_dir)}


def measure(work: Path, landing: Path, mode: str, n: int, spark: str) -> dict[str, Any]:
    root = work / f"run-{n}-{mode}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    events = root / "events"
    extra = {"NGSI_ENTITY_SCHEMA": str(REPO / "ngsi_assets" / "demo" / "entities.yaml"),
             **event_log_conf(root / "spark-conf", events)}  # fmt: skip
    with contextlib.ExitStack() as stack:
        if mode == "sql":
            extra |= stack.enter_context(sql_servers(root))
        if mode == "mongo":
            extra |= stack.enter_context(mongo_server())
        server_pid = None
        if spark == "connect":
            conf_env = {k: v for k, v in extra.items() if k == "SPARK_CONF_DIR"}
            with _env(conf_env):
                proc, remote = start_connect_server(root)
            stack.callback(_stop_group, proc)
            server_pid = proc.pid
            extra["NGSI_SPARK_REMOTE"] = remote
        env = platform_env(root / "home", landing, root / "lake", extra)
        print(f"{n} notifications, {mode}: running", flush=True)
        out = run_materialize(env, root / "home", events, server_pid)
    if os.environ.get("NGSI_BENCH_KEEP") != "1":
        shutil.rmtree(root, ignore_errors=True)
    print(f"  run {out['run']:.1f} s: {fmt_steps(out['steps'])}", flush=True)
    return out


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    from benchmarks.bench_continuous import stop_group

    stop_group(proc)


# ---------------------------------------------------------------------------------------------------
# Report


def fmt_steps(steps: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]))


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def render(args: argparse.Namespace, inputs: dict[int, dict], results: dict, baseline: dict, machine: str) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    lines = [
        BEGIN,
        f"Machine: {machine}. Commit {commit.strip() or 'unknown'}.",
        "",
        f"`benchmarks/bench_rebuild.py --notifications {' '.join(map(str, args.notifications))} --modes "
        f"{' '.join(args.modes)}{f' --sinks-up-to {args.sinks_up_to}' if args.sinks_up_to else ''} "
        f"--spark {args.spark}{' --baseline' if args.baseline else ''}`: `ngsi_ingest_job` "
        "over every landed hour, one run in a new process (`ngsi-assets materialize`"
        + (", through a warm Spark Connect server" if args.spark == "connect" else ", its own `local[*]` driver")
        + "), fresh lake and Dagster instance. Run: the Dagster run's seconds; notifications/s: acknowledged "
        "notifications / run seconds.",
        "",
        "| notifications | hours | mode | run (s) | process (s) | notifications/s | attribute updates/s "
        "| peak memory (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in args.notifications:
        info = inputs[n]
        for mode in args.modes:
            r = results.get((n, mode))
            if r is None:
                continue
            lines.append(
                f"| {info['accepted']:,} | {info['hours']} | {MODE_TITLES[mode]} | {r['run']:.1f} | {r['wall']:.1f} | "
                f"**{info['accepted'] / r['run']:,.0f}** | {info['attribute_updates'] / r['run']:,.0f} | "
                f"{_mib(r['peak_rss'])} |"
            )
    lines.append("")
    for (n, mode), r in sorted(results.items()):
        lines += [
            f"Per asset, {inputs[n]['accepted']:,} notifications, {MODE_TITLES[mode]}:",
            "",
            "| asset | seconds | Spark jobs | stages | tasks | task time (s) | task JVM CPU (s) | shuffled (MiB) "
            "| largest task peak (MiB) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        spark = r["spark"]
        for asset, secs in sorted(r["steps"].items(), key=lambda kv: -kv[1]):
            m = spark.get(asset, {})
            lines.append(
                f"| {asset} | {secs:.1f} | {m.get('jobs', 0):.0f} | {m.get('stages', 0):.0f} | {m.get('tasks', 0):.0f} "
                f"| {m.get('task_seconds', 0):.1f} | {m.get('task_cpu_seconds', 0):.1f} "
                f"| {_mib(m.get('shuffle_bytes', 0))} | {_mib(m.get('task_peak_bytes', 0))} |"
            )
        other = spark.get("other")
        if other:
            lines.append(
                f"| (outside any asset) | | {other.get('jobs', 0):.0f} | {other.get('stages', 0):.0f} | "
                f"{other.get('tasks', 0):.0f} | {other.get('task_seconds', 0):.1f} | "
                f"{other.get('task_cpu_seconds', 0):.1f} | {_mib(other.get('shuffle_bytes', 0))} | "
                f"{_mib(other.get('task_peak_bytes', 0))} |"
            )
        lines.append("")
    if len([n for n in args.notifications if (n, "lake") in results]) > 1:
        ns = [n for n in args.notifications if (n, "lake") in results]
        base = ns[0]
        growth = ", ".join(
            f"{inputs[n]['accepted'] / inputs[base]['accepted']:.0f}x the notifications: "
            f"{results[(n, 'lake')]['run'] / results[(base, 'lake')]['run']:.1f}x the time"
            for n in ns[1:]
        )
        lines += [f"Growth of (a) from {inputs[base]['accepted']:,} notifications: {growth}.", ""]
    for n, b in sorted(baseline.items()):
        lake = results.get((n, "lake"))
        rate = b["notifications"] / b["seconds"]
        lines.append(
            f"Python baseline, {inputs[n]['accepted']:,} landed lines: {b['seconds']:.1f} s in one process "
            f"({rate:,.0f} NGSI notifications/s, {b['historic_rows']:,} historic rows in {b['tables']} tables, "
            f"{b['last_data_rows']:,} last-data rows)"
            + (
                f"; (a) took {lake['run']:.1f} s: Spark on 2 cores is **{b['seconds'] / lake['run']:.2f}x** the "
                "baseline's speed."
                if lake
                else "."
            )
        )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notifications", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--sinks-up-to",
        type=int,
        default=None,
        help="run the sql and mongo modes only for sizes up to this many notifications (larger: lake only)",
    )
    parser.add_argument("--spark", choices=("local", "connect"), default="local")
    parser.add_argument("--baseline", action="store_true", help="also time the single-process Python baseline")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ngsi-bench-rebuild")
    parser.add_argument("--write-results", action="store_true", help="write the block into BENCHMARKS.md")
    args = parser.parse_args(argv)
    stop_cleanly_on_sigterm()
    args.workdir.mkdir(parents=True, exist_ok=True)
    inputs, results, baseline = {}, {}, {}
    for n in args.notifications:
        inputs[n] = land_city(args.workdir / f"landing-{n}", n)
        print(f"input {n}: {json.dumps(inputs[n])}", flush=True)
        landing = args.workdir / f"landing-{n}" / "zone"
        if args.baseline:
            baseline[n] = python_baseline(landing)
            print(f"  python baseline: {json.dumps(baseline[n])}", flush=True)
        for mode in args.modes:
            if mode != "lake" and args.sinks_up_to is not None and n > args.sinks_up_to:
                continue
            results[(n, mode)] = measure(args.workdir, landing, mode, n, args.spark)
    block = render(args, inputs, results, baseline, describe_machine())
    print(block)
    if args.write_results:
        write_results(block, BEGIN, END, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
