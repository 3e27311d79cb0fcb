"""versioned_entities throughput: a full history of N updates over K keys, then an incremental run.

    .venv/bin/python benchmarks/bench_versioned.py [--updates 1000000] [--keys 100000] \
        [--incremental 10000] [--buckets 64] [--write-results]

Data-hub messages of 100 records each (``product_number`` key, a description and a price) are
written straight into the lake's message store by Spark (no driver-side data): the full history in
one hour, then ``--incremental`` more updates of random existing keys, some of them late (effective
timestamps inside the history), in the next hour. Each is one ``VersioningRun``, as a materialization
does. Reports updates/s for both and how the incremental cost compares to the full one.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe_machine, write_results  # noqa: E402

SCHEMA = {
    "entities": {
        "product": {
            "fields": {
                "product_number": {"type": "integer", "key": True},
                "product_description": {"type": "text", "length": 60},
                "price": {"type": "decimal", "precision": 10, "scale": 2},
            }
        }
    }
}
PER_MESSAGE = 100
BEGIN, END = "<!-- bench_versioned:begin -->", "<!-- bench_versioned:end -->"


def messages(spark, n_updates: int, keys: int, hour: str, seed: int, late: bool):  # noqa: ANN001, ANN201
    """A message-store frame of n_updates records in messages of PER_MESSAGE, generated in Spark."""
    from pyspark.sql import functions as F

    from ngsi_assets.transforms.schemas import MESSAGE_STORE

    n_msgs = max(1, n_updates // PER_MESSAGE)
    base = 1_559_700_000 if not late else 1_559_700_000 + 3_600  # 2019-06-05, inside the history when late
    step = 60 if not late else 37
    recs = (
        spark.range(n_msgs * PER_MESSAGE)
        .withColumn("msg", (F.col("id") / PER_MESSAGE).cast("long"))
        .withColumn("key", (F.abs(F.xxhash64(F.col("id"), F.lit(seed))) % keys) if late else F.col("id") % keys)
        .withColumn(
            "rec",
            F.to_json(
                F.struct(
                    F.col("key").alias("product_number"),
                    F.concat(F.lit("product "), F.col("key"), F.lit(" v"), F.col("msg")).alias("product_description"),
                    ((F.col("id") % 10000) / 100).alias("price"),
                )
            ),
        )
    )
    bodies = recs.groupBy("msg").agg(F.concat_ws(",", F.collect_list("rec")).alias("recs"))
    dt = hour[:-3]
    recv = F.to_timestamp(F.lit(dt), "yyyy-MM-dd-HH")
    eff = F.timestamp_seconds(F.lit(base) + F.col("msg") * step)
    return bodies.select(
        F.concat(F.lit(f"s{seed}-"), F.lpad(F.col("msg").cast("string"), 9, "0")).alias("message_identifier"),
        F.lit("product").alias("source_entity"),
        recv.alias("message_timestamp"),
        eff.alias("effective_timestamp"),
        F.concat(
            F.lit('{"entity":"product","timestamp":"'),
            F.date_format(eff, "yyyy-MM-dd'T'HH:mm:ss"),
            F.lit('","data":['),
            F.col("recs"),
            F.lit("]}"),
        ).alias("data"),
        F.lit(0).alias("status"),
        F.lit(None).cast("string").alias("error_text"),
        (F.unix_timestamp(recv) * 1000).alias("recv_ms"),
        F.lit("message").alias("kind"),
        F.lit("datahub").alias("format"),
        F.lit("default").alias("service"),
        F.lit("/").alias("service_path"),
        *[F.lit(None).cast(t).alias(c) for c, t in (("correlator", "string"), ("cbnotif", "long"), ("guid", "string"))],
        F.lit("bench").alias("origin"),
        F.lit(None).cast("string").alias("subscription_id"),
        F.lit(False).alias("refresh"),
        F.lit(None).cast("string").alias("source_system"),
        F.lit(None).cast("string").alias("user"),
        F.lit(dt).alias("dt"),
    ).select(*MESSAGE_STORE.fieldNames())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--incremental", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--write-results", action="store_true", help="replace the section in BENCHMARKS.md")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from ngsi_assets.assets.versioned_entities import VERSIONS_DS, VersioningRun
    from ngsi_assets.ngsi.entity_schema import entity_folder, parse_schema
    from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENTS
    from resources.lake import LakeResource
    from resources.spark import default_spark_config

    load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    builder = SparkSession.builder
    for k, v in default_spark_config("local[*]").items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    schema = parse_schema(SCHEMA)
    work = Path(tempfile.mkdtemp(prefix="bench-versioned-"))
    lake = LakeResource(root=str(work / "lake"))
    h1, h2 = "2026-03-01-10:00", "2026-03-01-11:00"
    try:
        lake.replace_partitions(messages(spark, args.updates, args.keys, h1, 1, late=False), "message_store", [h1])
        lake.replace_partitions(messages(spark, args.incremental, args.keys, h2, 2, late=True), "message_store", [h2])
        empty_events = spark.createDataFrame([], NGSI_EVENTS)

        def run(hour: str) -> float:
            msgs = lake.read(spark, "message_store", MESSAGE_STORE, [hour])
            start = time.perf_counter()
            VersioningRun(spark, lake, schema, args.buckets, [hour]).run(msgs, empty_events)
            return time.perf_counter() - start

        full = run(h1)
        incremental = run(h2)
        rows = lake.read_folders(spark, VERSIONS_DS, "bucket", None, subfolder=entity_folder("product")).count()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    result = (
        f"- Machine: {describe_machine()}; load average {load:.1f} when the run started.\n"
        f"- Full: {args.updates:,} updates over {args.keys:,} keys in one hour: **{full:.1f} s, "
        f"{args.updates / full:,.0f} updates/s**; {rows:,} version rows after both runs.\n"
        f"- Incremental: {args.incremental:,} updates of random existing keys (late: effective times inside the "
        f"history) in the next hour: **{incremental:.1f} s, {args.incremental / incremental:,.0f} updates/s**; "
        f"{incremental / full:.0%} of the full run's time for {args.incremental / args.updates:.1%} of its data "
        f"({args.buckets} buckets).\n"
    )
    print(result)
    if args.write_results:
        write_results(f"{BEGIN}\n{result}{END}", BEGIN, END, "versioned_entities (Spark)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
