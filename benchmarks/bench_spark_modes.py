"""The main job's wall time in a fresh process with ``local[*]``, and through a warm Spark Connect server.

    .venv/bin/python benchmarks/bench_spark_modes.py [--notifications 1000] [--repeat 3] [--warmup 1] [--write-results]

A generated city (NGSI v2, NGSI-LD, data-hub messages) is landed once through the file loader. Then
``ngsi-assets materialize`` (``ngsi_ingest_job``: message store, events, versioned entities with the
demo's schema, transaction history, STH in the lake; no SQL server) runs over it as a user runs it,
each time in a new process, on a fresh lake and Dagster instance:

- (a) ``local[*]``: the process starts its own JVM and Spark session, as today's default;
- (b) ``NGSI_SPARK_REMOTE``: the process connects to a Spark Connect server started once and warmed
  by ``--warmup`` runs beforehand, so the JVM, its JIT and its Python workers are already there.

Reported per run: the process's wall time (Python and Dagster start included), the run's time, each
asset step's time read back from the Dagster event log, and the CPU seconds the run cost: the
Python process's own (in (a) without its JVM, which it does not wait for), and in (b) the server's
JVM, with what of it went to HotSpot's JIT compilers and to its collector (a young server's
compilers are a large part of a run: see BENCHMARKS.md, "The main job").
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import (  # noqa: E402
    describe_machine,
    find_in_tree,
    jvm_cpu_by_role,
    stop_cleanly_on_sigterm,
    write_results,
)

BEGIN = "<!-- bench_spark_modes:begin -->"
END = "<!-- bench_spark_modes:end -->"


def land(work: Path, notifications: int) -> Path:
    from ngsi_assets.demo.city import generate_city, write_jsonl
    from ngsi_assets.ingest.landing import LandingWriter
    from ngsi_assets.ingest.loader import load_paths
    from ngsi_assets.ngsi.envelope import MessageIdFactory
    from ngsi_assets.ngsi.payloads import IngestSettings

    requests, _ = generate_city(seed=5, hours=1, target_notifications=notifications)
    sample = work / "city.jsonl"
    write_jsonl(requests, sample)
    root = work / "landing"
    with LandingWriter(root) as writer:
        report = load_paths([sample], writer, IngestSettings(guid_from_correlator=True), MessageIdFactory())
    print(f"landed {report.accepted} notifications ({report.rejected} malformed refused)", flush=True)
    return root


def step_seconds(home: Path, run_id: str) -> dict[str, float]:
    """Each step's time, from its STEP_START and STEP_SUCCESS events in the run's event log."""
    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        starts: dict[str, float] = {}
        out: dict[str, float] = {}
        for record in instance.all_logs(run_id):
            event = record.dagster_event
            if event is None or not record.step_key:
                continue
            if event.event_type == DagsterEventType.STEP_START:
                starts[record.step_key] = record.timestamp
            elif event.event_type == DagsterEventType.STEP_SUCCESS and record.step_key in starts:
                out[record.step_key] = record.timestamp - starts[record.step_key]
    return out


def platform_env(home: Path, landing: Path, lake: Path, extra: dict[str, str]) -> dict[str, str]:
    """A fresh Dagster home (with the project's dagster.yaml) and the environment of the platform's processes."""
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NGSI_")}
    env.update(
        {
            "DAGSTER_HOME": str(home),
            "NGSI_LANDING_ROOT": str(landing),
            "NGSI_LAKE_ROOT": str(lake),
            "PYSPARK_PYTHON": sys.executable,
            **extra,
        }
    )
    return env


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    work: Path, landing: Path, name: str, extra_env: dict[str, str], server_jvm: int | None = None
) -> dict[str, object]:
    """One ``materialize`` in a new process; with ``server_jvm`` (the Connect server's JVM pid), also
    that JVM's CPU during the run (``server_cpu``: total, jit, gc)."""
    home, lake = work / name / "home", work / name / "lake"
    env = platform_env(
        home, landing, lake, {"NGSI_ENTITY_SCHEMA": str(REPO / "ngsi_assets" / "demo" / "entities.yaml"), **extra_env}
    )
    server_before = jvm_cpu_by_role(server_jvm) if server_jvm else None
    cpu_before = _children_cpu_s()
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ngsi-assets")), "materialize"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    process_cpu = _children_cpu_s() - cpu_before
    server_cpu = None
    if server_before is not None:
        after = jvm_cpu_by_role(server_jvm)  # type: ignore[arg-type]  # set with server_before
        server_cpu = {k: after[k] - server_before[k] for k in after}
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("run "))
    run_id, run_s = line.split()[1], float(line.split(" in ")[1].split()[0])
    return {
        "wall": wall,
        "run": run_s,
        "steps": step_seconds(home, run_id),
        "process_cpu": process_cpu,
        "server_cpu": server_cpu,
    }


def start_connect_server(work: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A Connect server on ``port`` (else a free loopback port), with the platform's settings: (its
    process, its URL)."""
    from ngsi_assets.spark_servers import connect_server_command, server_env

    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    logs = work / "connect"
    logs.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        connect_server_command(port),
        env=server_env(logs, python=sys.executable, host="127.0.0.1"),
        stdout=(logs / "server.log").open("ab"),
        stderr=subprocess.STDOUT,
        process_group=0,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"sc://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the Spark Connect server did not start; see " + str(logs / "server.log"))


def summarize(name: str, runs: list[dict[str, object]]) -> list[str]:
    walls = [float(r["wall"]) for r in runs]
    inner = [float(r["run"]) for r in runs]
    steps: dict[str, list[float]] = {}
    for r in runs:
        for step, s in r["steps"].items():  # type: ignore[attr-defined]
            steps.setdefault(step, []).append(s)
    step_text = ", ".join(
        f"{k} {statistics.median(v):.1f}" for k, v in sorted(steps.items(), key=lambda kv: -max(kv[1]))
    )
    process_cpu = statistics.median(float(r["process_cpu"]) for r in runs)  # type: ignore[arg-type]
    servers = [r["server_cpu"] for r in runs if r.get("server_cpu")]
    server_text = "-"
    if servers:
        med = {k: statistics.median(float(s[k]) for s in servers) for k in ("total", "jit", "gc")}  # type: ignore[index]
        server_text = f"{med['total']:.1f} s (JIT {med['jit']:.1f}, GC {med['gc']:.1f})"
    return [
        f"| {name} | {statistics.median(walls):.1f} s ({min(walls):.1f}-{max(walls):.1f}) "
        f"| {statistics.median(inner):.1f} s | {process_cpu:.1f} s | {server_text} | {step_text} |"
    ]


def main() -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notifications", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="runs through the server before the measured ones (default 1)"
    )
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-spark-modes-"))
    try:
        landing = land(work, args.notifications)
        local = []
        for i in range(args.repeat):
            local.append(run_once(work, landing, f"local{i}", {"NGSI_SPARK_MASTER": "local[*]"}))
            print(f"(a) local[*], fresh process: {local[-1]}", flush=True)
        server, url = start_connect_server(work)
        jvm = find_in_tree(server.pid, "java")
        try:
            warmups = []
            for i in range(max(1, args.warmup)):
                warmups.append(run_once(work, landing, f"warmup{i}", {"NGSI_SPARK_REMOTE": url}, jvm))
                print(f"warm-up run through Spark Connect: {warmups[-1]}", flush=True)
            remote = []
            for i in range(args.repeat):
                remote.append(run_once(work, landing, f"connect{i}", {"NGSI_SPARK_REMOTE": url}, jvm))
                print(f"(b) warm Spark Connect: {remote[-1]}", flush=True)
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm_walls = ", ".join(f"{float(w['wall']):.1f}" for w in warmups)
    warm_jit = ", ".join(f"{float(w['server_cpu']['jit']):.1f}" for w in warmups if w.get("server_cpu"))  # type: ignore[index]
    rows = [
        "| how | process wall time (median, min-max) | run | process CPU | server JVM CPU "
        "| steps (median s, slowest first) |",
        "|---|---|---|---|---|---|",
        *summarize("(a) `local[*]`, fresh process", local),
        *summarize("(b) warm Spark Connect server", remote),
    ]
    block = "\n".join(
        [
            BEGIN,
            f"Machine: {describe_machine()}; load average {load_before:.1f} before the runs.",
            f"`{args.notifications}` notifications generated, {args.repeat} runs each; "
            f"the server's first {len(warmups)} run(s) (warm-up, not counted) took "
            f"{warm_walls} s"
            + (f"; the server's JIT compilers took {warm_jit} s of CPU in them." if warm_jit else "."),
            "",
            *rows,
            END,
        ]
    )
    print(block)
    if args.write_results:
        write_results(block, BEGIN, END, "The main job: fresh process against a warm Spark Connect server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
