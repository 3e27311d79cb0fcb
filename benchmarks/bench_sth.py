"""STH aggregation throughput (Spark) on 1,000,000 attribute updates, all five resolutions.

    .venv/bin/python benchmarks/bench_sth.py [--updates 1000000] [--write-results]

Generates ``ngsi_events`` rows in Spark (10 attributes per entity, one in ten a string attribute,
one in five with a TimeInstant metadata, spread over one hour), stores them as Parquet, then times
the two Spark stages of the ``sth_aggregates`` asset on them, each forced by a write:

1. events -> per-hour partial aggregates (classification, naming, five resolutions), to Parquet;
2. partials -> whole STH-Comet documents (all slots), to Spark's ``noop`` sink.

The MongoDB writes are not timed (they measure the server, not Spark). Not a test: nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe_machine, write_results  # noqa: E402

BEGIN, END = "<!-- bench_sth:begin -->", "<!-- bench_sth:end -->"
HOUR_MS = 3_600_000
T0 = int(datetime(2026, 3, 1, 10, tzinfo=UTC).timestamp() * 1000)


def generate_events(spark, n: int):
    """``n`` ngsi_events rows of one hour, built by Spark (no Python per row)."""
    from pyspark.sql import functions as F

    from ngsi_assets.transforms.schemas import NGSI_EVENTS

    i = F.col("id")
    entity = (i / 100).cast("long")  # 10 updates of 10 attributes per entity
    attr = F.pmod(i, 10)
    recv = F.lit(T0) + F.pmod(i * 7919, HOUR_MS)
    value = F.when(attr == 9, F.concat(F.lit("state-"), F.pmod(i, 5).cast("string"))).otherwise(
        (F.pmod(i * 31, 10_000) / 100 - 20).cast("string")
    )
    md = F.when(
        F.pmod(i, 5) == 0,
        F.format_string(
            '[{"name":"TimeInstant","type":"DateTime","value":"%s"}]',
            F.date_format(F.timestamp_millis(recv - 5000), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
        ),
    ).otherwise(F.lit("[]"))
    df = spark.range(n).select(
        recv.alias("recvTimeTs"),
        F.date_format(F.timestamp_millis(recv), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("recvTime"),
        F.lit("city").alias("fiwareService"),
        F.concat(F.lit("/district"), F.pmod(entity, 8).cast("string")).alias("fiwareServicePath"),
        F.concat(F.lit("urn:ngsi-ld:Device:"), entity.cast("string")).alias("entityId"),
        F.lit("Device").alias("entityType"),
        F.concat(F.lit("attr"), attr.cast("string")).alias("attrName"),
        F.when(attr == 9, F.lit("Text")).otherwise(F.lit("Number")).alias("attrType"),
        value.alias("attrValue"),
        md.alias("attrMd"),
        F.lit(None).cast("string").alias("datasetId"),
        F.timestamp_millis(recv).alias("timeIndex"),
        F.lit("recvTime").alias("timeIndexSource"),
        F.lit(None).cast("string").alias("alterationType"),
        F.concat(F.lit("m"), i.cast("string")).alias("messageId"),
        F.lit(0).alias("entityIndex"),
        F.lit("2026-03-01-10").alias("dt"),
    )
    return df.select(*NGSI_EVENTS.fieldNames())


def run(updates: int, work: Path) -> dict[str, object]:
    from pyspark.sql import SparkSession

    from ngsi_assets.ngsi.sth_config import STHConfig
    from ngsi_assets.transforms import sth
    from resources.spark import default_spark_config

    builder = SparkSession.builder
    for key, value in default_spark_config().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cfg = STHConfig(data_model="dm-by-entity")  # all five resolutions
    events_path, partials_path = str(work / "events"), str(work / "partials")
    generate_events(spark, updates).write.mode("overwrite").parquet(events_path)
    events = spark.read.parquet(events_path)
    n = events.count()

    t0 = time.perf_counter()
    classified = sth.classify_events(events, cfg)
    sth.sth_partials(classified, cfg.resolutions).write.mode("overwrite").parquet(partials_path)
    t1 = time.perf_counter()
    partials = spark.read.parquet(partials_path)
    partial_rows = partials.count()
    t2 = time.perf_counter()
    sth.build_documents(partials, cfg, 0).write.format("noop").mode("overwrite").save()
    t3 = time.perf_counter()
    documents = sth.build_documents(partials, cfg, 0).count()
    spark.stop()
    return {
        "updates": n,
        "partial_rows": partial_rows,
        "documents": documents,
        "partials_s": t1 - t0,
        "documents_s": t3 - t2,
        "total_s": (t1 - t0) + (t3 - t2),
    }


def render(r: dict[str, object]) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    n = int(r["updates"])  # type: ignore[arg-type]
    return "\n".join(
        [
            BEGIN,
            f"Measured {now} by `benchmarks/bench_sth.py` ({n:,} attribute updates, resolutions "
            "month,day,hour,minute,second, dm-by-entity, Spark `local[*]`).",
            "",
            f"Machine: {describe_machine()}. The 2-vCPU machine was shared with other Spark jobs during the run, "
            "so the figures are a floor rather than what the code does on an idle machine.",
            "",
            "| stage | seconds | attribute updates/s |",
            "|---|---:|---:|",
            f"| events -> partial aggregates ({int(r['partial_rows']):,} rows, Parquet) | {r['partials_s']:.1f} | "  # type: ignore[str-format]
            f"{n / float(r['partials_s']):,.0f} |",  # type: ignore[arg-type]
            f"| partials -> documents ({int(r['documents']):,} documents, all slots, noop sink) | "
            f"{r['documents_s']:.1f} | {n / float(r['documents_s']):,.0f} |",  # type: ignore[arg-type]
            f"| **both** | **{r['total_s']:.1f}** | **{n / float(r['total_s']):,.0f}** |",  # type: ignore[arg-type]
            END,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--write-results", action="store_true", help="replace the marked section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_sth_"))
    try:
        result = run(args.updates, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    block = render(result)
    print(block)
    print(result)
    if args.write_results:
        write_results(block, BEGIN, END, "STH aggregates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
