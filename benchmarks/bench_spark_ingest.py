"""message_store + ngsi_events throughput on about 1,000,000 attribute updates.

    .venv/bin/python benchmarks/bench_spark_ingest.py [--updates 1000000] [--write-results]

Builds a landing zone from the city sample (validated by the receiver's own validation, landed by
the receiver's own writer, all in one hour), then materializes both assets through Dagster exactly
as a run does (asset checks and metadata included) and reports attribute updates per second.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe_machine, write_results  # noqa: E402

BEGIN, END = "<!-- bench_spark_ingest:begin -->", "<!-- bench_spark_ingest:end -->"


def build_landing(root: Path, target_updates: int, recv_ms: int) -> int:
    """Land city requests worth about ``target_updates`` attribute updates; returns the messages landed."""
    from ngsi_assets.demo.city import generate_city
    from ngsi_assets.ingest.landing import LandingWriter
    from ngsi_assets.ngsi.envelope import MessageIdFactory
    from ngsi_assets.ngsi.payloads import Endpoint, IngestSettings, PayloadError, validate_request

    per_request = 4.2  # the city's mean attribute updates per notification
    requests, _ = generate_city(seed=7, hours=6, target_notifications=int(target_updates / per_request))
    ids = MessageIdFactory()
    settings = IngestSettings()
    envelopes = []
    for i, req in enumerate(requests):
        try:
            vm = validate_request(Endpoint(req.endpoint), req.headers, req.data(), settings)
        except PayloadError:
            continue
        envelopes.append(vm.stamp(ids.new(recv_ms), recv_ms + i // 100, "bench"))
    with LandingWriter(root) as writer:
        for start in range(0, len(envelopes), 10_000):
            writer.append_many_blocking(envelopes[start : start + 10_000])
    return len(envelopes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--write-results", action="store_true", help="append the result to BENCHMARKS.md")
    args = parser.parse_args(argv)

    from dagster import DagsterInstance, materialize

    from ngsi_assets.assets.ingest import message_store, ngsi_events
    from resources.lake import LakeResource
    from resources.landing import LandingZoneResource
    from resources.spark import spark_resource

    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        hour = datetime(2026, 5, 1, 12, tzinfo=UTC)
        t0 = time.monotonic()
        messages = build_landing(work / "landing", args.updates, int(hour.timestamp() * 1000))
        landing_bytes = sum(p.stat().st_size for p in (work / "landing").rglob("*.jsonl"))
        print(f"landed {messages} messages ({landing_bytes / 2**20:.0f} MiB) in {time.monotonic() - t0:.0f} s")

        spark = spark_resource()
        resources = {
            "spark": spark,
            "lake": LakeResource(root=str(work / "lake")),
            "landing": LandingZoneResource(root=str(work / "landing")),
        }
        # Start the session and warm the JVM's JIT outside the timing (one small hour, both assets):
        # a long-running deployment pays these once, whatever the data size.
        build_landing(work / "landing", 20_000, int(hour.timestamp() * 1000) - 3_600_000)
        materialize([message_store, ngsi_events], partition_key="2026-05-01-11:00", resources=resources,
                    instance=DagsterInstance.ephemeral())  # fmt: skip
        t1 = time.monotonic()
        result = materialize(
            [message_store, ngsi_events],
            partition_key=hour.strftime("%Y-%m-%d-%H:00"),
            resources=resources,
            instance=DagsterInstance.ephemeral(),
        )
        elapsed = time.monotonic() - t1
        assert result.success
        mats = {m.asset_key.to_user_string(): m for m in result.get_asset_materialization_events()}
        updates = mats["ngsi_events"].materialization.metadata["dagster/row_count"].value
        steps = {s.step_key: s.end_time - s.start_time for s in result.get_step_stats()} if hasattr(
            result, "get_step_stats") else {}  # fmt: skip
        line = {
            "messages": messages,
            "attribute_updates": updates,
            "landing_MiB": round(landing_bytes / 2**20),
            "seconds": round(elapsed, 1),
            "updates_per_s": round(updates / elapsed),
            "steps_s": {k: round(v, 1) for k, v in steps.items()},
        }
        print(json.dumps(line))
        if args.write_results:
            _write_results(line)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _write_results(line: dict) -> None:
    entry = (
        f"{BEGIN}\n"
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {describe_machine()}.\n\n"
        f"| input | run | attribute updates/s | steps (s) |\n|---|---:|---:|---|\n"
        f"| {line['messages']:,} notifications and messages ({line['landing_MiB']} MiB of landing lines), "
        f"{line['attribute_updates']:,} attribute updates, one hour | {line['seconds']} s | "
        f"**{line['updates_per_s']:,}** | {', '.join(f'{k} {v}' for k, v in line['steps_s'].items())} |\n"
        f"{END}"
    )
    write_results(entry, BEGIN, END, "message_store + ngsi_events (Spark)")


if __name__ == "__main__":
    sys.exit(main())
