"""Growth: does a run's cost follow the data it brings, or the hour's size and the history's age?

    .venv/bin/python benchmarks/bench_growth.py [--keys 600] [--per-key 10] [--days 1 30] [--write-results]

Issue 12's two growth targets, measured as a user runs the platform: one Spark Connect server every
run shares (as ``make dev``), PostgreSQL and MariaDB last data and historic tables on (as the tests
start them), STH in the lake, NGSI v2 notifications of four attributes (``bench_continuous``'s).
Each run is a Dagster run of the platform's own jobs in a fresh process; its time is the run's
(Python start excluded) and each asset step's, read back from the event log.

- **1% new keys.** An hour of ``--keys`` cars x ``--per-key`` notifications is materialized whole.
  Then 1% more keys land (as many notifications each) and are processed as continuous mode does: an
  ``ngsi_increment_job`` run over exactly the new bytes (message store to last data and historic
  tables), then the hour's ``ngsi_derived_job`` run (versioned entities, transaction history, STH).
  Both are compared with a full run (``ngsi_ingest_job``) of the same hour, all its data, on a fresh
  lake. Target: the incremental run costs at most 10% of the full one.
- **History age.** For each of ``--days``: a fresh lake gets that many days of generated history (the
  same cars every hour, ``--history-per-hour`` notifications an hour), backfilled as one run; then each
  of the next ``--repeat`` hours (the same size as above) is run whole, as an hourly run is (reported
  as the median run), and, on top of the last of them, as an increment of 1% new keys
  plus its derived run, then as an increment of 1% of its keys that have history (in-order updates at
  the hour's end) plus its derived run: the buckets a derived run rewrites hold those keys' history.
  Target: after 30 days each costs at most 1.2x what it costs after 1 day.

Each incremental path is done ``--repeat`` times, 1% more each time, and reported as the median run:
one run alone is noisy on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_continuous import notification, stop_group  # noqa: E402
from benchmarks.bench_spark_modes import platform_env, start_connect_server, step_seconds  # noqa: E402
from benchmarks.machine import describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402

BEGIN = "<!-- bench_growth:begin -->"
END = "<!-- bench_growth:end -->"
SERVICE = "bench"
HOUR_MS = 3_600_000
# The measured hour; history goes back from it.
MEASURED_HOUR_MS = 1_767_225_600_000 + 10 * 24 * HOUR_MS  # 2026-01-11 00:00 UTC


def hour_key(ms: int) -> str:
    return time.strftime("%Y-%m-%d-%H:00", time.gmtime(ms / 1000))


# Where in its hour a notification is received: spread over the hour, or the r-th of n slices of its
# last 29 s, after everything received in it before (in-order updates of cars the hour already has).
SPREAD = (30_000, HOUR_MS - 60_000)


def end_slice(r: int, n: int) -> tuple[int, int]:
    width = 29_000 // n
    return HOUR_MS - 29_000 + r * width, width


def land(
    root: Path, hour_ms: int, cars: range, per_car: int, first_seq: int = 0, window: tuple[int, int] = SPREAD
) -> None:
    """``per_car`` notifications of each car in ``cars``, in time order over ``window`` (offset into the
    hour and length, ms)."""
    from ngsi_assets.ingest.landing import LandingWriter
    from ngsi_assets.ngsi.envelope import Envelope

    total = len(cars) * per_car
    start = hour_ms + window[0]
    step = max(1, window[1] // max(total, 1))

    def envelopes():  # noqa: ANN202
        for i in range(total):
            car, seq = cars[i % len(cars)], first_seq + i // len(cars)
            yield Envelope(
                f"g{hour_ms // HOUR_MS}-{car}-{seq}", start + i * step, "ngsi-v2", "normalized",
                SERVICE, "/cars", None, None, None, "bench", notification(car, seq),
            )  # fmt: skip

    with LandingWriter(root) as writer:
        writer.append_many_blocking(envelopes())


def landed_after(root: Path, hour_ms: int, seen: dict[str, int]) -> dict[str, list[int]]:
    """The ranges of the hour's segments past ``seen`` ({segment: offset}), as the landing sensor reads them."""
    from resources.landing import LandingZoneResource

    return LandingZoneResource(root=str(root)).complete_ranges([hour_key(hour_ms)], seen)


def run_job(
    env: dict[str, str], job: str, first: str, last: str | None = None, increment: Any = None, derived: bool = False
) -> dict:
    """One Dagster run of ``job`` in a fresh process (``--child``); its run time and step times.

    ``increment``: the ranges of an increment run; ``derived``: the tags of the landing sensor's
    derived runs (one piece at a time, only the increments not folded yet)."""
    args = [sys.executable, __file__, "--child", job, first, last or first, json.dumps(increment), json.dumps(derived)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{job} {first}..{last} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    out = json.loads(lines[-1])
    out["steps"] = step_seconds(Path(env["DAGSTER_HOME"]), out["run_id"])
    return out


def child(job: str, first: str, last: str, increment: Any, derived: bool) -> int:
    """Run ``job`` over ``first``..``last`` in this process, print its id and seconds as JSON.

    The modules the daemon's run processes start with (``WarmRunLauncher``'s preload) are imported
    before the run, as they are there: a run's time leaves out process start, and importing Dagster's
    storage cost the run itself about 0.5 s otherwise (py-spy, BENCHMARKS.md, "Growth")."""
    import importlib

    from ngsi_assets.run_launcher import DEFAULT_PRELOAD

    for module in DEFAULT_PRELOAD:
        importlib.import_module(module)
    from ngsi_assets.definitions import defs
    from ngsi_assets.increments import INCREMENT_TAG, Increment
    from ngsi_assets.materialize import run_ingest
    from ngsi_assets.sensors import ContinuousSettings, derived_run_tags

    tags = {INCREMENT_TAG: Increment.of(increment).to_tag()} if increment else {}
    if derived:
        tags |= derived_run_tags(ContinuousSettings())
    outcome = run_ingest(defs, first, last, job_name=job, tags=tags)
    print(json.dumps({"run_id": outcome.run_id, "seconds": outcome.seconds, "success": outcome.success,
                      "failed": list(outcome.failed_checks)}))  # fmt: skip
    return 0 if outcome.success and not outcome.failed_checks else 1


class Lab:
    """The shared servers, and a fresh platform (landing zone, lake, Dagster home) per experiment."""

    def __init__(self, work: Path, base_env: dict[str, str]) -> None:
        self.work = work
        self.base_env = base_env
        self.n = 0

    def platform(self, name: str) -> tuple[dict[str, str], Path]:
        self.n += 1
        root = self.work / f"{self.n:02d}-{name}"
        landing = root / "landing"
        landing.mkdir(parents=True)
        env = platform_env(root / "home", landing, root / "lake", self.base_env)
        return env, landing


def incremental_path(
    env: dict[str, str],
    landing: Path,
    hour_ms: int,
    keys: int,
    per_key: int,
    repeat: int,
    known_from_seq: int | None = None,
) -> dict[str, dict]:
    """``repeat`` times: land 1% of ``keys`` more into an hour already materialized, run its increment,
    then its derived run. Each run's time is the median over the repeats (one run is noisy here: the
    same derived run took 16 s and 29 s); ``runs`` lists them all.

    The 1% are new keys each time, or (``known_from_seq``) the hour's first keys, notified after all they
    had, from that sequence number on: in-order updates of keys with history."""
    new = max(1, keys // 100)
    key = hour_key(hour_ms)
    incs, deriveds = [], []
    for r in range(repeat):
        seen = {name: end for name, (_, end) in landed_after(landing, hour_ms, {}).items()}
        if known_from_seq is None:
            land(landing, hour_ms, range(keys + r * new, keys + (r + 1) * new), per_key)
        else:
            first = known_from_seq + r * per_key
            land(landing, hour_ms, range(new), per_key, first_seq=first, window=end_slice(r, repeat))
        incs.append(run_job(env, "ngsi_increment_job", key, increment=landed_after(landing, hour_ms, seen)))
        deriveds.append(run_job(env, "ngsi_derived_job", key, derived=True))
    return {"increment": median_run(incs), "derived": median_run(deriveds)}


def median_run(runs: list[dict]) -> dict:
    """The run of median time (the lower middle one for an even count), with every run's seconds."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return {**ordered[(len(ordered) - 1) // 2], "runs": [round(r["seconds"], 1) for r in runs]}


def one_percent(lab: Lab, keys: int, per_key: int, repeat: int) -> dict[str, Any]:
    hour = MEASURED_HOUR_MS
    key = hour_key(hour)
    env, landing = lab.platform("one-percent")
    land(landing, hour, range(keys), per_key)
    base = run_job(env, "ngsi_ingest_job", key)
    path = incremental_path(env, landing, hour, keys, per_key, repeat)
    # The full run of the same hour (all its data, the 1% included) on a fresh lake.
    full_env, full_landing = lab.platform("full")
    shutil.rmtree(full_landing)
    shutil.copytree(landing, full_landing)
    full = run_job(full_env, "ngsi_ingest_job", key)
    return {"base": base, "full": full, **path}


def history_age(
    lab: Lab, days: int, history_keys: int, history_per_hour: int, keys: int, per_key: int, repeat: int
) -> dict:
    measured = MEASURED_HOUR_MS
    env, landing = lab.platform(f"history-{days}d")
    hours = days * 24
    first = measured - hours * HOUR_MS
    per_car = max(1, history_per_hour // history_keys)
    for h in range(hours):
        land(landing, first + h * HOUR_MS, range(history_keys), per_car, first_seq=h * per_car)
    started = time.monotonic()
    backfill = run_job(env, "ngsi_ingest_job", hour_key(first), hour_key(measured - HOUR_MS))
    backfill["wall"] = time.monotonic() - started
    # The next ``repeat`` hours, each run whole as an hourly run is, and reported as the median: one
    # run alone once came out at 1.8x its 1-day counterpart, where repeated hours gave 1.04-1.15x
    # (BENCHMARKS.md, "Growth").
    wholes = []
    for i in range(repeat):
        last = measured + i * HOUR_MS
        land(landing, last, range(keys), per_key, first_seq=hours * per_car + i * per_key)
        wholes.append(run_job(env, "ngsi_ingest_job", hour_key(last)))
    whole = median_run(wholes)
    # The increments go to the last of them (``last``), the hour a sensor's runs go to.
    path = incremental_path(env, landing, last, keys, per_key, repeat)
    # The same 1% of keys, now cars with history: their records and versions are what a derived run
    # rewrites, so this is where the history's age can show.
    known_from = hours * per_car + repeat * per_key
    known = incremental_path(env, landing, last, keys, per_key, repeat, known_from_seq=known_from)
    return {
        "days": days,
        "backfill": backfill,
        "whole": whole,
        **path,
        "known_increment": known["increment"],
        "known_derived": known["derived"],
    }


def fmt_steps(steps: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]))


def runs(median: dict) -> str:
    return "[" + ", ".join(f"{s:.1f}" for s in median.get("runs", [])) + "]"


def render(args: argparse.Namespace, one: dict[str, Any], ages: list[dict[str, Any]], machine: str) -> str:
    keys, per_key = args.keys, args.per_key
    new = max(1, keys // 100)
    full, inc, der = one["full"]["seconds"], one["increment"]["seconds"], one["derived"]["seconds"]
    lines = [
        BEGIN,
        f"Machine: {machine}.",
        "",
        f"`benchmarks/bench_growth.py --keys {keys} --per-key {per_key} --days {' '.join(map(str, args.days))} "
        f"--history-keys {args.history_keys} --history-per-hour {args.history_per_hour} --repeat {args.repeat}`: "
        "one warm Spark Connect server, PostgreSQL and MariaDB (historic and last data, dm-by-entity-type), STH "
        f"in the lake. Run times exclude process start. Every incremental path is done {args.repeat} times "
        "(each time 1% more) and its runs are the median; each run's times are in brackets.",
        "",
        f"**1% new keys.** An hour of {keys} cars x {per_key} notifications ({keys * per_key}), then {new} new cars "
        f"({new * per_key} notifications) processed as continuous mode does, {args.repeat} times; the full run is "
        f"of the whole hour at the end ({(keys + args.repeat * new) * per_key} notifications).",
        "",
        "| run | seconds | share of the full run | steps (s) |",
        "|---|---|---|---|",
        f"| full run of the hour (`ngsi_ingest_job`, fresh lake) | {full:.1f} | 100% "
        f"| {fmt_steps(one['full']['steps'])} |",
        f"| increment of the 1% (`ngsi_increment_job`) {runs(one['increment'])} | {inc:.1f} | {100 * inc / full:.0f}% "
        f"| {fmt_steps(one['increment']['steps'])} |",
        f"| the hour's derived run after it (`ngsi_derived_job`) {runs(one['derived'])} | {der:.1f} "
        f"| {100 * der / full:.0f}% "
        f"| {fmt_steps(one['derived']['steps'])} |",
        f"| increment + derived | {inc + der:.1f} | {100 * (inc + der) / full:.0f}% | |",
    ]
    if not ages:
        return "\n".join([*lines, END])
    lines += [
        "",
        f"**History age.** {args.history_keys} cars, {args.history_per_hour} notifications an hour of history, "
        f"backfilled as one run; then each of the next {args.repeat} hours ({keys * per_key} notifications) "
        "whole (the median run), then, in the last of them, 1% new keys as an increment and the derived "
        f"run, then {new} cars with history ({new * per_key} in-order notifications at the hour's end) as an "
        "increment and the derived run.",
        "",
        "| history | backfill run (s) | next hours whole (s) | 1% new keys: increment / derived (s) "
        "| 1% keys with history: increment / derived (s) |",
        "|---|---|---|---|---|",
    ]
    for a in ages:
        lines.append(
            f"| {a['days']} day(s) | {a['backfill']['seconds']:.1f} | {a['whole']['seconds']:.1f} {runs(a['whole'])} | "
            f"{a['increment']['seconds']:.1f} {runs(a['increment'])} / {a['derived']['seconds']:.1f} "
            f"{runs(a['derived'])} | {a['known_increment']['seconds']:.1f} {runs(a['known_increment'])} / "
            f"{a['known_derived']['seconds']:.1f} {runs(a['known_derived'])} |"
        )
    if len(ages) >= 2:
        lo, hi = ages[0], ages[-1]
        measured = ("whole", "increment", "derived", "known_increment", "known_derived")
        ratio = {k: hi[k]["seconds"] / lo[k]["seconds"] for k in measured}
        lines += [
            "",
            f"Ratio {hi['days']} days / {lo['days']} day(s): whole hour {ratio['whole']:.2f}x; 1% new keys: "
            f"increment {ratio['increment']:.2f}x, derived run {ratio['derived']:.2f}x; 1% keys with history: "
            f"increment {ratio['known_increment']:.2f}x, derived run {ratio['known_derived']:.2f}x.",
            "",
            f"Steps of the derived run of the keys with history after {lo['days']} day(s): "
            f"{fmt_steps(lo['known_derived']['steps'])}; after {hi['days']} days: "
            f"{fmt_steps(hi['known_derived']['steps'])}.",
            "",
            f"Steps of the median whole hour after {lo['days']} day(s): {fmt_steps(lo['whole']['steps'])}; after "
            f"{hi['days']} days: {fmt_steps(hi['whole']['steps'])}.",
            f"Steps of the derived run after {lo['days']} day(s): {fmt_steps(lo['derived']['steps'])}; after "
            f"{hi['days']} days: {fmt_steps(hi['derived']['steps'])}.",
        ]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, default=600)
    parser.add_argument("--per-key", type=int, default=10)
    parser.add_argument(
        "--days", type=int, nargs="*", default=[1, 30], help="history ages; none measures only the 1%% new keys"
    )
    parser.add_argument("--history-keys", type=int, default=60)
    parser.add_argument("--history-per-hour", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=3, help="incremental paths per experiment (medians)")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        job, first, last, increment, derived = args.child
        return child(job, first, last, json.loads(increment), json.loads(derived))

    with warm_lab("ngsi-bench-growth-") as lab:
        one = one_percent(lab, args.keys, args.per_key, args.repeat)
        print(json.dumps({k: v["seconds"] for k, v in one.items()}), flush=True)
        ages = []
        for days in args.days:
            a = history_age(lab, days, args.history_keys, args.history_per_hour, args.keys, args.per_key, args.repeat)
            print(json.dumps({k: v["seconds"] for k, v in a.items() if isinstance(v, dict)}), flush=True)
            ages.append(a)
        block = render(args, one, ages, describe_machine())
        print(block)
        if args.write_results:
            write_results(block, BEGIN, END, "Growth: cost against new data and history age")
        return 0


@contextlib.contextmanager
def warm_lab(prefix: str) -> Iterator[Lab]:
    """A Lab over PostgreSQL and MariaDB (historic and last data) and one Spark Connect server, warmed
    up (JIT, Python workers) on a small hour of its own, as a running platform is; all stopped after."""
    from tests.support.servers import mysql_server_url, postgres_server_url, start_mariadb, start_postgres

    work = Path(tempfile.mkdtemp(prefix=prefix))
    servers, procs = [], []
    try:
        pg, my = start_postgres(), start_mariadb()
        servers += [pg, my]
        sinks = work / "sql_sinks.yaml"
        common = "  last_data_mode: both\n  data_model: dm-by-entity-type\n"
        sinks.write_text(
            f"postgresql:\n  url: {postgres_server_url(pg)}\n{common}mysql:\n  url: {mysql_server_url(my)}\n{common}"
        )
        connect, remote = start_connect_server(work)
        procs.append(connect)
        lab = Lab(work, {"NGSI_SPARK_REMOTE": remote, "NGSI_SQL_SINKS_CONFIG": str(sinks)})
        warm_env, warm_landing = lab.platform("warm-up")
        land(warm_landing, MEASURED_HOUR_MS - 40 * 24 * HOUR_MS, range(50), 4)
        run_job(warm_env, "ngsi_ingest_job", hour_key(MEASURED_HOUR_MS - 40 * 24 * HOUR_MS))
        print("warmed up", flush=True)
        yield lab
    finally:
        for p in procs:
            stop_group(p)
        for s in servers:
            s.stop()
        if os.environ.get("NGSI_BENCH_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
