"""SQL sink throughput: last-data upserts (1,000,000 updates over 100,000 keys) and historic row-mode inserts.

Measures the writer (``ngsi_assets.sinks.sql_writer.write_rows``, the code each Spark task runs) on
real servers: PostgreSQL (COPY into a temporary table + one ordered INSERT ... ON CONFLICT) and
MariaDB (ordered multi-row INSERT ... ON DUPLICATE KEY UPDATE). The updates arrive in batches (one
per simulated run); each batch is reduced to its newest record per key, as the Spark transform does,
then written in one transaction. Servers: started here (as the tests do) unless POSTGRES_URL /
MYSQL_URL are set.

    .venv/bin/python benchmarks/bench_sql_sinks.py                 # print results
    .venv/bin/python benchmarks/bench_sql_sinks.py --write         # and update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe_machine, stop_cleanly_on_sigterm, write_results  # noqa: E402
from ngsi_assets.ngsi.sql_config import SqlSinkConfig  # noqa: E402
from ngsi_assets.ngsi.sql_naming import Dialect, attribute_column  # noqa: E402
from ngsi_assets.sinks.sql_writer import HISTORIC, LAST_DATA, WriteJob, write_rows  # noqa: E402
from resources.sql import MySQLResource, PostgresResource  # noqa: E402

BEGIN, END = "<!-- bench_sql_sinks:begin -->", "<!-- bench_sql_sinks:end -->"
T0 = 1_772_359_200_000


def rt(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def servers() -> tuple[dict[Dialect, str], list]:
    from tests.support import servers as sv

    started = []
    urls = {}
    pg = os.environ.get("POSTGRES_URL")
    if not pg:
        s = sv.start_postgres()
        started.append(s)
        pg = sv.postgres_server_url(s)
    my = os.environ.get("MYSQL_URL")
    if not my:
        s = sv.start_mariadb()
        started.append(s)
        my = sv.mysql_server_url(s)
    urls[Dialect.POSTGRESQL], urls[Dialect.MYSQL] = pg, my
    return urls, started


def connect_kwargs(dialect: Dialect, url: str) -> dict:
    return (PostgresResource if dialect is Dialect.POSTGRESQL else MySQLResource)(url=url).connect_kwargs()


def bench_last_data(dialect: Dialect, url: str, updates: int, keys: int, batches: int, db: str) -> dict:
    cfg = SqlSinkConfig(dialect=dialect, url=url, last_data_mode="upsert", batch_size=1000)
    job = WriteJob(config=cfg, connect_kwargs=connect_kwargs(dialect, url), sink=LAST_DATA)
    level, temp = attribute_column("fillingLevel", dialect), attribute_column("temperature", dialect)
    rng = random.Random(7)
    per_batch = updates // batches
    written = 0
    write_s = 0.0
    started = time.perf_counter()
    ms = T0
    for _ in range(batches):
        newest: dict[str, dict] = {}
        for _ in range(per_batch):
            ms += 1
            k = f"wc{rng.randrange(keys):06d}"
            newest[k] = {
                "db": db,
                "table": "wastecontainer_last_data",
                "recvTime": rt(ms),
                "fiwareServicePath": "/bench",
                "entityId": k,
                "entityType": "WasteContainer",
                "attrs": {level: (str(rng.random()), "[]"), temp: (str(rng.randrange(40)), "[]")},
                "op": "u",
            }
        rows = [newest[k] for k in sorted(newest)]
        t = time.perf_counter()
        write_rows(rows, job)
        write_s += time.perf_counter() - t
        written += len(rows)
    total_s = time.perf_counter() - started
    return {"updates": updates, "rows_upserted": written, "write_s": write_s, "total_s": total_s}


def bench_historic(dialect: Dialect, url: str, rows_n: int, db: str) -> dict:
    cfg = SqlSinkConfig(dialect=dialect, url=url, batch_size=1000)
    job = WriteJob(
        config=cfg, connect_kwargs=connect_kwargs(dialect, url), sink=HISTORIC, hours=((T0, T0 + 3_600_000),)
    )

    def rows():
        for i in range(rows_n):
            ms = T0 + i // 10
            yield {
                "db": db,
                "table": "x002fbenchxffffcar",
                "recvTimeTs": ms,
                "recvTime": rt(ms).replace(" ", "T") + "Z",
                "fiwareServicePath": "/bench",
                "entityId": f"car{i % 1000}",
                "entityType": "car",
                "attrName": "speed" if i % 2 else "oil_level",
                "attrType": "Float",
                "attrValue": str(i % 200),
                "attrMd": "[]",
            }

    t = time.perf_counter()
    write_rows(rows(), job)
    return {"rows": rows_n, "write_s": time.perf_counter() - t}


def main() -> None:
    stop_cleanly_on_sigterm()
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--historic-rows", type=int, default=1_000_000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    urls, started = servers()
    lines = []
    try:
        for dialect in (Dialect.POSTGRESQL, Dialect.MYSQL):
            db = f"bench_{int(time.time())}"
            ld = bench_last_data(dialect, urls[dialect], args.updates, args.keys, args.batches, db)
            hi = bench_historic(dialect, urls[dialect], args.historic_rows, db)
            lines.append(
                f"| {dialect.value} | last data | {ld['updates']:,} updates over {args.keys:,} keys in "
                f"{args.batches} batches ({ld['rows_upserted']:,} newest-per-key rows upserted) | "
                f"{ld['write_s']:.1f} s writing | **{ld['updates'] / ld['write_s']:,.0f} updates/s**, "
                f"{ld['rows_upserted'] / ld['write_s']:,.0f} upserted rows/s |"
            )
            lines.append(
                f"| {dialect.value} | historic, row mode | {hi['rows']:,} rows, one table, one transaction | "
                f"{hi['write_s']:.1f} s | **{hi['rows'] / hi['write_s']:,.0f} rows/s** |"
            )
            print("\n".join(lines[-2:]), flush=True)
    finally:
        for s in started:
            s.stop()
    section = "\n".join(
        [
            BEGIN,
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `benchmarks/bench_sql_sinks.py` on "
            f"{describe_machine()}. The 2-vCPU machine was shared with other engineers' Spark jobs during "
            "the run, so the figures are lower bounds and vary between runs. Run: "
            "`.venv/bin/python benchmarks/bench_sql_sinks.py --write` (about 7 minutes).",
            "",
            "| database | sink | workload | time | throughput |",
            "|---|---|---|---|---|",
            *lines,
            "",
            "Throwaway servers as in the tests (PostgreSQL 15 with fsync off; MariaDB 10.11 with "
            "innodb_flush_log_at_trx_commit=0, 64 MB buffer pool). The writer is the code each Spark task "
            "runs (`write_rows`); the time excludes generating the updates and Spark's newest-per-key "
            "reduction. PostgreSQL: COPY into a temporary table, rows locked in key order, one "
            "`INSERT ... SELECT ... ORDER BY key ON CONFLICT DO UPDATE ... WHERE stored < incoming`. "
            "MariaDB: ordered multi-row `INSERT ... ON DUPLICATE KEY UPDATE col = IF(...)` of 1,000 rows.",
            "",
            "What limits it: the writer is Python-bound here. A cProfile of the PostgreSQL historic path "
            "(50,000 rows) put about half the time in spooling the batch (one pickle per row, so a failed "
            "batch can be replayed) and a quarter in building the COPY text; the server's COPY is a small "
            "part. A Spark task runs one writer per table batch, so a run over many tables writes them in "
            "parallel across executors; one table is always one transaction in one task.",
            END,
        ]
    )
    print(section)
    if args.write:
        write_results(section, BEGIN, END, "SQL sinks (last data, historic tables)")


if __name__ == "__main__":
    main()
