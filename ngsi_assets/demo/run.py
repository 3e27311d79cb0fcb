"""The demo: a generated city posted over HTTP to a real receiver, then materialized by Spark.

    python -m ngsi_assets.demo.run            # what `make demo` runs

Steps: generate the city sample; start the receiver (a separate process, durable acks); post the
sample over HTTP; stop the receiver; let the landing sensor decide which hours to run; run
every asset (message store, NGSI events, versioned entities, STH aggregates in the lake; the SQL and
MongoDB sinks skip, no servers being configured) for those hours in one run (one Spark session) on
a SQLite Dagster instance; print what was produced. Everything lives under the work folder (default ``.demo``),
which is cleared first so every demo starts from nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the receiver exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the receiver was not healthy at {url} within {timeout_s:.0f} s")


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def run_demo(workdir: Path, seed: int, notifications: int, hours: int) -> int:
    from ngsi_assets.demo.city import generate_city, write_jsonl
    from ngsi_assets.demo.post import post_requests

    workdir = workdir.resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    landing, lake, home = workdir / "landing", workdir / "lake", workdir / "dagster_home"
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    os.environ.update(
        {
            "NGSI_LANDING_ROOT": str(landing),
            "NGSI_LAKE_ROOT": str(lake),
            "DAGSTER_HOME": str(home),
            "NGSI_ENTITY_SCHEMA": str(Path(__file__).with_name("entities.yaml")),
        }
    )

    _section("1. generate the city sample")
    requests, summary = generate_city(seed=seed, hours=hours, target_notifications=notifications)
    sample = workdir / "city.jsonl"
    write_jsonl(requests, sample)
    print(f"{summary.requests} requests over {hours} simulated hours ({summary.start} .. {summary.end}) -> {sample}")
    print(f"  by kind {summary.by_kind}; by format {summary.by_format}")
    print(
        f"  {summary.attribute_updates} attribute updates, {summary.message_records} generic records, "
        f"{summary.malformed} malformed, {summary.duplicates} duplicates, {summary.out_of_order} out of order"
    )

    _section("2. start the receiver and post the sample over HTTP")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngsi_assets.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--landing-root", str(landing), "--guid-from-correlator"],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "receiver.log", "wb"),  # noqa: SIM115 (the child owns it)
    )  # fmt: skip
    try:
        _wait_healthy(url, proc)
        report = post_requests(url, requests, concurrency=32)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(
        f"posted {report.sent} in {report.elapsed_s:.1f} s ({report.requests_per_s:.0f}/s): "
        f"{report.accepted} acknowledged, rejected by status {dict(sorted(report.rejected.items()))}, "
        f"{report.failed} without answer"
    )
    for reason in report.rejection_samples:
        print(f"  rejected: {reason}")
    if report.failed:
        print("the receiver failed to answer some requests; see", workdir / "receiver.log")
        return 1

    _section("3. the hours that hold landed data")
    from dagster import DagsterInstance

    from ngsi_assets.definitions import defs
    from ngsi_assets.materialize import CLI_STEPS_SIDE_BY_SIDE, landed_hours, run_ingest

    instance = DagsterInstance.get()
    resources = defs.resources
    hours_to_run = landed_hours(resources["landing"])
    print(f"hours with new landing data: {hours_to_run}")
    if not hours_to_run:
        print("nothing landed")
        return 1

    _section("4. materialize the platform for those hours (one run, one Spark session)")
    # As ``ngsi-assets materialize`` runs it: independent steps two at a time.
    outcome = run_ingest(
        defs, hours_to_run[0], hours_to_run[-1], instance, log_level="INFO", steps_side_by_side=CLI_STEPS_SIDE_BY_SIDE
    )
    print(f"run {outcome.run_id}: {'succeeded' if outcome.success else 'FAILED'} in {outcome.seconds:.1f} s")
    for name, passed in outcome.checks:
        print(f"  check {name}: {'passed' if passed else 'FAILED'}")
    if not outcome.success:
        return 1

    _section("5. what was produced")
    _print_outputs(resources["spark"].spark_session, resources["lake"], hours_to_run)
    print(f"\nlake: {lake}\nlanding: {landing}\nDagster instance (SQLite): {home}")
    print("Open the Dagster UI on this data:  DAGSTER_HOME=" + str(home) + " NGSI_LANDING_ROOT=" + str(landing)
          + " NGSI_LAKE_ROOT=" + str(lake) + " .venv/bin/dagster dev -w workspace.yaml")  # fmt: skip
    return 0


def _print_outputs(spark, lake, hours: Sequence[str]) -> None:  # noqa: ANN001 (Spark and resource types)
    from pyspark.sql import functions as F

    from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENT_REJECTS, NGSI_EVENTS

    store = lake.read(spark, "message_store", MESSAGE_STORE, hours)
    events = lake.read(spark, "ngsi_events", NGSI_EVENTS, hours)
    rejects = lake.read(spark, "ngsi_event_rejects", NGSI_EVENT_REJECTS, hours)
    print(f"message_store: {store.count()} messages")
    store.groupBy("kind", "format", "status").count().orderBy("kind", "format", "status").show(truncate=False)
    reject_count = rejects.count()
    print(f"ngsi_events: {events.count()} attribute updates, {reject_count} rejects")
    events.groupBy("fiwareService", "entityType").agg(
        F.countDistinct("entityId").alias("entities"),
        F.count("*").alias("updates"),
        F.min("timeIndex").alias("first"),
        F.max("timeIndex").alias("last"),
    ).orderBy("fiwareService", "entityType").show(truncate=False)
    events.groupBy("timeIndexSource").count().orderBy("timeIndexSource").show(truncate=False)
    print("a few events:")
    events.where(F.col("entityType") == "car").orderBy("timeIndex").select(
        "recvTime", "fiwareService", "fiwareServicePath", "entityId", "attrName", "attrValue", "timeIndex"
    ).show(5, truncate=40)
    if reject_count:
        rejects.groupBy("reason").count().orderBy(F.desc("count")).show(5, truncate=False)
    _print_versioned(spark, lake, hours)
    _print_history(spark, lake)


def _print_history(spark, lake) -> None:  # noqa: ANN001 (Spark and resource types)
    from pyspark.sql import functions as F

    from ngsi_assets.history_store import HistoryStore

    store = HistoryStore(spark, lake)
    print("transaction history: one transaction per space the run changed (seed 003 tnx; i..: history rows)")
    for c in store.transactions():
        print(f"  #{c.id} {c.space}: txn {c.txn} tnx {c.tnx} (0x{c.tnx & (2**64 - 1):016x}) "
              f"at {c.ts:%Y-%m-%d %H:%M:%S}Z, i {c.first_i}..{c.last_i}, {c.commit_json['actions']}")  # fmt: skip
    if "product" in store.spaces():
        rows = store.history("product")
        first = rows.orderBy("i").first()
        print(f"the history rows of product {first['id']} (rewind: ngsi-assets history show product --at <tnx>):")
        rows.where(F.col("id") == first["id"]).orderBy("i").select(
            "i", "action", "tnx", "uuid", "puuid", "last_updated_by", F.substring("state", 1, 60).alias("state")
        ).show(truncate=False)


def _print_versioned(spark, lake, hours: Sequence[str]) -> None:  # noqa: ANN001 (Spark and resource types)
    from pyspark.sql import functions as F

    from ngsi_assets.assets.versioned_entities import LOG_DS, VERSIONS_DS
    from ngsi_assets.ngsi.entity_schema import entity_folder
    from ngsi_assets.transforms.versioned_entities import MESSAGE_LOG

    log = lake.read(spark, LOG_DS, MESSAGE_LOG, hours)
    print("versioned entities: messages by processing status (3 processed, 4 error, 1 awaits a link)")
    log.groupBy("status").agg(F.count("*").alias("messages"), F.sum("records").alias("records")).orderBy("status").show(
        truncate=False
    )
    errors = log.where(F.col("status") == 4).select("error_text")
    if errors.limit(1).count():
        errors.groupBy(F.substring("error_text", 1, 90).alias("error")).count().orderBy(F.desc("count")).show(
            3, truncate=False
        )
    for entity in ("product", "container_route", "car", "ParkingSpot"):
        table = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder(entity))
        if table is None:
            continue
        summary = table.agg(
            F.count("*").alias("versions"),
            F.countDistinct("guid").alias("keys"),
            F.sum(F.col("valid_to_timestamp").isNull().cast("int")).alias("open"),
            F.sum(F.col("deleted_indicator").cast("int")).alias("deleted_versions"),
        ).first()
        print(f"{entity}: {summary['versions']} versions of {summary['keys']} keys, {summary['open']} open, "
              f"{summary['deleted_versions']} deleted versions")  # fmt: skip
    product = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder("product"))
    if product is not None:
        busiest = product.groupBy("guid").count().orderBy(F.desc("count"), "guid").first()
        print("the history of the most changed product:")
        product.where(F.col("guid") == busiest["guid"]).orderBy("valid_from_timestamp").select(
            "valid_from_timestamp", "valid_to_timestamp", "deleted_indicator", "product_number", "unit_price",
            "stock", "source_message", "field_provenance",
        ).show(6, truncate=60)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ngsi-assets demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".demo"), help="folder for everything (cleared first)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--notifications", type=int, default=12_000)
    parser.add_argument("--hours", type=int, default=4, help="simulated hours covered by the sample")
    args = parser.parse_args(argv)
    return run_demo(args.workdir, args.seed, args.notifications, args.hours)


if __name__ == "__main__":
    sys.exit(main())
