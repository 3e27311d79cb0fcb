"""History depth: does a derived run of in-order updates cost the same however long its keys' history is?

    .venv/bin/python benchmarks/bench_history_depth.py [--cars 5] [--depths 200 20000] [--per-batch 20]
        [--repeat 3] [--write-results]

Continuous mode's derived runs touch the same keys all day: at 100 notifications/s for 50 cars, each
car's buckets gain 7,200 records an hour. This measures what those keys' history costs a derived run,
as a user runs the platform (``bench_growth``'s set-up: one warm Spark Connect server, PostgreSQL and
MariaDB last data and historic tables, STH in the lake, each run a Dagster run in a fresh process).

For each of ``--depths``: a fresh lake whose hour before the measured one holds ``depth``
notifications of each of ``--cars`` cars, run whole (``ngsi_ingest_job``). Then, ``--repeat`` + 1
times, every car is notified ``--per-batch`` times more in the measured hour (in order, after all it
had), and the increment (``ngsi_increment_job``) and the hour's derived run (``ngsi_derived_job``, as
the landing sensor asks for it) are run. The first derived run of the hour is left out; the median of
the others is reported, with each run's time and what ``versioned_entities`` did with the buckets.
Target: the derived run costs the same at every depth (issue 12: "cost independent of history age").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_growth import (  # noqa: E402
    HOUR_MS,
    MEASURED_HOUR_MS,
    Lab,
    end_slice,
    fmt_steps,
    hour_key,
    land,
    landed_after,
    median_run,
    run_job,
    runs,
    warm_lab,
)
from benchmarks.machine import describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402

BEGIN = "<!-- bench_history_depth:begin -->"
END = "<!-- bench_history_depth:end -->"


def folded(home: Path, run_id: str) -> dict[str, Any]:
    """What the run's ``versioned_entities`` step did: how it folded and, summed over entities, the
    buckets it rewrote and added to."""
    from dagster import AssetKey, DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(AssetKey("versioned_entities"), limit=20).records
        for record in records:
            if record.run_id != run_id:
                continue
            meta = record.asset_materialization.metadata
            entities = meta["entities"].value
            return {
                "folded": meta["folded"].value,
                "rewritten": sum(int(e["buckets_rewritten"]) for e in entities.values()),
                "appended": sum(int(e["buckets_appended"]) for e in entities.values()),
            }
    return {}


def depth_path(lab: Lab, depth: int, cars: int, per_batch: int, repeat: int) -> dict[str, Any]:
    env, landing = lab.platform(f"depth-{depth}")
    before = MEASURED_HOUR_MS - HOUR_MS
    land(landing, before, range(cars), depth)
    history = run_job(env, "ngsi_ingest_job", hour_key(before))
    key = hour_key(MEASURED_HOUR_MS)
    incs, deriveds = [], []
    for r in range(repeat + 1):
        seen = {name: end for name, (_, end) in landed_after(landing, MEASURED_HOUR_MS, {}).items()}
        land(
            landing,
            MEASURED_HOUR_MS,
            range(cars),
            per_batch,
            first_seq=depth + r * per_batch,
            window=end_slice(r, repeat + 1),
        )
        inc = run_job(env, "ngsi_increment_job", key, increment=landed_after(landing, MEASURED_HOUR_MS, seen))
        derived = run_job(env, "ngsi_derived_job", key, derived=True)
        derived |= folded(Path(env["DAGSTER_HOME"]), derived["run_id"])
        print(json.dumps({"depth": depth, "batch": r, "increment": inc["seconds"], "derived": derived}), flush=True)
        if r:  # the hour's first derived run is left out
            incs.append(inc)
            deriveds.append(derived)
    return {
        "depth": depth,
        "history": history,
        "increment": median_run(incs),
        "derived": median_run(deriveds),
        "all": deriveds,
    }


def render(args: argparse.Namespace, depths: list[dict[str, Any]], machine: str) -> str:
    lines = [
        BEGIN,
        f"Machine: {machine}.",
        "",
        f"`benchmarks/bench_history_depth.py --cars {args.cars} --depths {' '.join(map(str, args.depths))} "
        f"--per-batch {args.per_batch} --repeat {args.repeat}`: {args.cars} cars with `depth` notifications each "
        f"in the hour before, then {args.repeat} batches of {args.per_batch} in-order notifications per car "
        f"({args.cars * args.per_batch} a batch) in the measured hour, each an increment and a derived run (the "
        "hour's first derived run left out). Medians, each run's time in brackets.",
        "",
        "| records per car | history run (s) | increment (s) | derived run (s) | derived steps (s) "
        "| buckets added to / rewritten per derived run |",
        "|---|---|---|---|---|---|",
    ]
    for d in depths:
        der = d["derived"]
        buckets = ", ".join(f"{r.get('appended', '?')}/{r.get('rewritten', '?')}" for r in d["all"])
        lines.append(
            f"| {d['depth']} | {d['history']['seconds']:.1f} | {d['increment']['seconds']:.1f} "
            f"{runs(d['increment'])} | {der['seconds']:.1f} {runs(der)} | {fmt_steps(der['steps'])} | {buckets} |"
        )
    if len(depths) >= 2:
        lo, hi = depths[0], depths[-1]
        ratio = hi["derived"]["seconds"] / lo["derived"]["seconds"]
        lines += ["", f"Derived run at {hi['depth']} records per car / at {lo['depth']}: {ratio:.2f}x."]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cars", type=int, default=5)
    parser.add_argument("--depths", type=int, nargs="+", default=[200, 20000])
    parser.add_argument("--per-batch", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args(argv)

    with warm_lab("ngsi-bench-depth-") as lab:
        depths = [depth_path(lab, d, args.cars, args.per_batch, args.repeat) for d in args.depths]
        block = render(args, depths, describe_machine())
        print(block)
        if args.write_results:
            write_results(block, BEGIN, END, "History depth: derived runs of keys with a long history")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
