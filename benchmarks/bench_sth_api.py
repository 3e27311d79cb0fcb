"""STH API latency and throughput: aggregated and raw queries over real HTTP on a large history.

    .venv/bin/python benchmarks/bench_sth_api.py [--sizes 10000,100000] [--seconds 20] [--write-results]

For each size, fills one raw collection (Cygnus NGSIMongoSink, dm-by-entity, row mode: 4 attributes
of one entity, one document per second) with that many documents, with the sink's own indexes, and
one STH collection with a year of aggregates of the same 4 attributes at hour resolution (365 day
documents each) and at minute resolution (8,760 hour documents each). Then it starts
``ngsi-assets sth-api`` as a subprocess and, from an aiohttp client with ``--concurrency``
connections, sends each kind of query for ``--seconds``:

- ``raw lastN=100``: the newest 100 values of an attribute;
- ``raw page``: ``hLimit=100`` at a random ``hOffset`` with ``count=true``;
- ``raw window``: ``lastN=100`` between a random ``dateFrom`` and ``dateTo`` an hour apart;
- ``aggr hour/month``: ``aggrMethod=all``, ``aggrPeriod=hour`` over a random month (about 30 documents);
- ``aggr minute/day``: ``aggrMethod=sum``, ``aggrPeriod=minute`` over a random day (24 documents).

MongoDB is SecantusDB (a MongoDB-wire server in Python) unless ``--mongo-url`` names a real one.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import (  # noqa: E402
    describe_machine,
    process_cpu_s,
    stop_cleanly_on_sigterm,
    write_results,
)

BEGIN, END = "<!-- bench_sth_api:begin -->", "<!-- bench_sth_api:end -->"
ATTRS = ("speed", "fuel", "temperature", "state")
YEAR = 2025
T0 = datetime(YEAR, 1, 1, tzinfo=UTC)
HEADERS = {"Fiware-Service": "bench", "Fiware-ServicePath": "/fleet"}
PREFIX = "sthapi_"


def fill(url: str, raw_documents: int) -> None:
    """The raw collection (``raw_documents``) and a year of hour and minute aggregates, with indexes."""
    import pymongo

    from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
    from ngsi_assets.ngsi.sth_config import STHConfig
    from ngsi_assets.sinks.mongo_raw import ensure_collection
    from ngsi_assets.sinks.sth_mongo import ensure_aggregate_indexes

    db_name = PREFIX + "bench"
    raw_name, aggr_name = "sth_/fleet_car1_Car", "sth_/fleet_car1_Car.aggr"
    with pymongo.MongoClient(url) as client:
        client.drop_database(db_name)
        ensure_collection(client, db_name, raw_name, MongoRawConfig(db_prefix=PREFIX))
        raw = client[db_name][raw_name]
        batch = []
        for i in range(raw_documents):
            attr = ATTRS[i % len(ATTRS)]
            value: Any = f"s{i % 5}" if attr == "state" else round(20 + (i % 1000) / 10, 1)
            batch.append(
                {
                    "attrName": attr,
                    "attrType": "Text" if attr == "state" else "Number",
                    "attrValue": value,
                    "recvTime": T0 + timedelta(seconds=i // len(ATTRS)),
                }
            )
            if len(batch) == 5000:
                raw.insert_many(batch, ordered=False)
                batch.clear()
        if batch:
            raw.insert_many(batch, ordered=False)
        aggr = client[db_name][aggr_name]
        docs = []
        for attr in ATTRS:
            for day in range(365):
                origin = T0 + timedelta(days=day)
                docs.append(_aggregate(attr, origin, "hour", "day", 24))
                for hour in range(24):
                    docs.append(_aggregate(attr, origin + timedelta(hours=hour), "minute", "hour", 60))
                if len(docs) >= 5000:
                    aggr.insert_many(docs, ordered=False)
                    docs.clear()
        if docs:
            aggr.insert_many(docs, ordered=False)
        ensure_aggregate_indexes(client, [(db_name, aggr_name)], STHConfig(db_prefix=PREFIX))


def _aggregate(attr: str, origin: datetime, resolution: str, rng: str, slots: int) -> dict[str, Any]:
    if attr == "state":
        points = [{"offset": o, "samples": 60, "occur": {"s0": 30, "s1": 30}} for o in range(slots)]
    else:
        points = [
            {"offset": o, "samples": 60, "sum": 1200.0 + o, "sum2": 24000.0, "min": 18.0, "max": 25.5}
            for o in range(slots)
        ]
    return {
        "_id": {"attrName": attr, "origin": origin, "resolution": resolution, "range": rng},
        "attrType": "Text" if attr == "state" else "Number",
        "points": points,
    }


def queries(raw_documents: int) -> dict[str, Any]:
    seconds = raw_documents // len(ATTRS)
    base = "/STH/v2/entities/car1/attrs/"

    def raw_last() -> tuple[str, dict[str, str]]:
        return base + random.choice(ATTRS), {"type": "Car", "lastN": "100"}

    def raw_page() -> tuple[str, dict[str, str]]:
        offset = random.randrange(max(1, seconds - 100))
        return base + random.choice(ATTRS), {"type": "Car", "hLimit": "100", "hOffset": str(offset), "count": "true"}

    def raw_window() -> tuple[str, dict[str, str]]:
        start = T0 + timedelta(seconds=random.randrange(max(1, seconds - 3600)))
        return base + random.choice(ATTRS), {
            "type": "Car",
            "lastN": "100",
            "dateFrom": start.isoformat(),
            "dateTo": (start + timedelta(hours=1)).isoformat(),
        }

    def aggr_month() -> tuple[str, dict[str, str]]:
        month = random.randrange(1, 13)
        start = datetime(YEAR, month, 1, tzinfo=UTC)
        end = datetime(YEAR + (month == 12), month % 12 + 1, 1, tzinfo=UTC) - timedelta(milliseconds=1)
        return base + random.choice(ATTRS[:3]), {
            "type": "Car",
            "aggrMethod": "all",
            "aggrPeriod": "hour",
            "dateFrom": start.isoformat(),
            "dateTo": end.isoformat(),
        }

    def aggr_day() -> tuple[str, dict[str, str]]:
        start = T0 + timedelta(days=random.randrange(365))
        return base + random.choice(ATTRS[:3]), {
            "type": "Car",
            "aggrMethod": "sum",
            "aggrPeriod": "minute",
            "dateFrom": start.isoformat(),
            "dateTo": (start + timedelta(days=1) - timedelta(milliseconds=1)).isoformat(),
        }

    return {
        "raw lastN=100": raw_last,
        "raw page (hLimit=100, count)": raw_page,
        "raw window (1 h, lastN=100)": raw_window,
        "aggr hour, one month (all)": aggr_month,
        "aggr minute, one day (sum)": aggr_day,
    }


async def _load(base_url: str, make: Any, seconds: float, concurrency: int) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(headers=HEADERS) as session:

        async def worker() -> None:
            nonlocal errors
            while time.monotonic() < deadline:
                path, params = make()
                started = time.perf_counter()
                async with session.get(base_url + path, params=params) as response:
                    body = await response.read()
                    if response.status != 200 or len(body) < 30:
                        errors += 1
                latencies.append(time.perf_counter() - started)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def start_api(url: str) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "NGSI_MONGO_URL": url, "NGSI_STH_DB_PREFIX": PREFIX, "NGSI_MONGO_RAW_DB_PREFIX": PREFIX}
    process = subprocess.Popen(
        [sys.executable, "-m", "ngsi_assets.cli", "sth-api", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"the STH API did not start: {line!r}")
    return process, line.strip().rsplit(" ", 1)[-1]


def render(machine: str, results: dict[int, dict[str, dict[str, float]]], fill_s: dict[int, float], args: Any) -> str:
    lines = [
        BEGIN,
        f"Machine: {machine}. MongoDB: {args.server}. {args.concurrency} connections, {args.seconds:.0f} s per "
        "query kind; one `ngsi-assets sth-api` process.",
        "",
        "| raw documents | query | requests/s | p50 ms | p99 ms | API CPU ms/request | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, by_query in results.items():
        for name, r in by_query.items():
            lines.append(
                f"| {size:,} | {name} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['api_cpu_ms']:.2f} | {r['errors']} |"
            )
    lines.append("")
    lines.append(
        "Aggregates: a year at hour and minute resolution for 4 attributes (1,460 day and 35,040 hour "
        "documents). Filling took " + ", ".join(f"{fill_s[s]:.0f} s for {s:,}" for s in fill_s) + "."
    )
    lines.append(END)
    return "\n".join(lines)


def main() -> int:
    stop_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="raw documents, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--mongo-url", default=None, help="a real MongoDB (default: a throwaway SecantusDB)")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    server = None
    if args.mongo_url:
        url, args.server = args.mongo_url, "MongoDB at --mongo-url"
    else:
        from tests.support.servers import mongo_server_url, start_secantus

        server = start_secantus()
        url, args.server = mongo_server_url(server), "SecantusDB (MongoDB wire protocol, WiredTiger)"
    results: dict[int, dict[str, dict[str, float]]] = {}
    fill_s: dict[int, float] = {}
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            started = time.monotonic()
            fill(url, size)
            fill_s[size] = time.monotonic() - started
            print(f"filled {size:,} raw documents and a year of aggregates in {fill_s[size]:.0f} s", flush=True)
            process, base_url = start_api(url)
            try:
                results[size] = {}
                for name, make in queries(size).items():
                    cpu = process_cpu_s(process.pid)
                    results[size][name] = r = asyncio.run(_load(base_url, make, args.seconds, args.concurrency))
                    r["api_cpu_ms"] = 1000 * (process_cpu_s(process.pid) - cpu) / max(1, r["requests"])
                    print(f"  {name}: {r['rps']:.1f} req/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                          f"{r['errors']} errors", flush=True)  # fmt: skip
            finally:
                process.terminate()
                process.wait(30)
    finally:
        if server is not None:
            server.stop()
    block = render(describe_machine(), results, fill_s, args)
    print(block)
    if args.write_results:
        write_results(block, BEGIN, END, "STH API (read side)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
