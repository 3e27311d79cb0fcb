"""What the MongoDB sinks (STH aggregates, raw history) share: the executor loop that sends a
partition's rows as bulk writes per collection, the retry rule, and the listing of collections.

``write_by_collection`` runs in a Spark task: rows grouped by (database, collection) become
operations, sent ``batch_size`` at a time to their collection; only per-collection counts come back.

Retries (Cygnus's ``batch_ttl`` and ``batch_retry_intervals``): a bulk write that failed for a
transient reason (network, primary stepping down, a write error with a transient code) is sent again
after the configured interval, up to ``batch_ttl`` times (-1: forever).
The writes are idempotent (whole-document replaces, inserts with deterministic ``_id``), so sending a
batch again cannot count anything twice. Any other error fails at once, naming the collection.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from pymongo import MongoClient
from pymongo.collection import Collection as MongoCollection
from pymongo.errors import AutoReconnect, BulkWriteError, ConnectionFailure, NetworkTimeout
from pyspark.sql import DataFrame

from ngsi_assets.sinks.executors import on_each_partition

# Errors after which the same bulk write may simply be sent again.
TRANSIENT_ERRORS = (AutoReconnect, ConnectionFailure, NetworkTimeout)
TRANSIENT_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})

T = TypeVar("T")


class RetryPolicy(Protocol):
    batch_ttl: int

    def retry_interval_ms(self, attempt: int) -> int: ...


class MongoWriteError(RuntimeError):
    """A bulk write to MongoDB failed for good (after its retries)."""


def with_retries(
    write: Callable[[], T],
    target: str,
    policy: RetryPolicy,
    *,
    harmless: Collection[int] = (),
    partial: Callable[[BulkWriteError], T] | None = None,
    error: type[MongoWriteError] = MongoWriteError,
) -> T:
    """``write()``, sent again on transient failures; ``target`` names the collection in errors.

    A ``BulkWriteError`` whose write errors all have codes in ``harmless`` (say, duplicate keys of
    documents already stored) is a success: ``partial(exc)`` gives the result.
    """
    attempt = 0
    while True:
        try:
            return write()
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            codes = {e.get("code") for e in errors} - set(harmless)
            if not codes and partial is not None:
                return partial(exc)
            if not codes <= TRANSIENT_CODES:
                first = next((e for e in errors if e.get("code") not in harmless), {})
                raise error(f"bulk write to {target} failed: {first.get('errmsg', exc)}") from exc
            failure: Exception = exc
        except TRANSIENT_ERRORS as exc:
            failure = exc
        attempt += 1
        if policy.batch_ttl != -1 and attempt > policy.batch_ttl:
            raise error(f"bulk write to {target} failed after {attempt - 1} retries: {failure}") from failure
        time.sleep(policy.retry_interval_ms(attempt) / 1000)


# How long one operation of a sink's write may wait for the server's reply (MongoResource's default):
# a frozen server or a network partition then ends in NetworkTimeout, retried as any transient
# error, rather than in a Spark task (and its run) that never ends. A bulk write of ``batch_size``
# documents is answered in well under a second on a healthy server.
SOCKET_TIMEOUT_MS = 300_000
CONNECT_TIMEOUT_MS = 10_000


def connect(url: str, appname: str, socket_timeout_ms: int = SOCKET_TIMEOUT_MS) -> MongoClient[dict[str, Any]]:
    """A client for a sink's writes (dates come back timezone-aware), every wait bounded."""
    return MongoClient(
        url,
        tz_aware=True,
        appname=appname,
        serverSelectionTimeoutMS=30_000,
        connectTimeoutMS=CONNECT_TIMEOUT_MS,
        socketTimeoutMS=socket_timeout_ms,
    )


def existing_collections(client: MongoClient, databases: Iterable[str]) -> set[tuple[str, str]]:
    """(database, collection) of every collection in ``databases`` (one call per database)."""
    return {(db, name) for db in databases if db is not None for name in client[db].list_collection_names()}


def write_by_collection(
    rows: Iterable[Any],
    url: str,
    appname: str,
    batch_size: int,
    operation: Callable[[dict[str, Any]], tuple[Any, str] | None],
    send: Callable[[MongoCollection, list[Any], str], Mapping[str, int]],
) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Send one Spark partition's rows (grouped by database, collection) as bulk writes.

    ``operation(row)`` gives the write and the name of the count it adds one to (None: no write);
    ``send(collection, ops, "db.collection")`` writes a batch and returns counts to add. Yields
    (database, collection, counts) per collection the partition touched.
    """
    counts: dict[tuple[str, str], Counter[str]] = {}
    client: MongoClient[dict[str, Any]] | None = None
    ops: list[Any] = []
    current: tuple[str, str] | None = None

    def flush() -> None:
        if ops and current is not None:
            assert client is not None
            database, collection = current
            counts[current].update(send(client[database][collection], ops, f"{database}.{collection}"))
            ops.clear()

    try:
        for spark_row in rows:
            row = spark_row.asDict(recursive=True)
            key = (row["database"], row["collection"])
            if key != current or len(ops) >= batch_size:
                if client is None:
                    client = connect(url, appname)
                flush()
                current = key
            tally = counts.setdefault(key, Counter())
            built = operation(row)
            if built is not None:
                op, counted = built
                ops.append(op)
                tally[counted] += 1
        flush()
    finally:
        if client is not None:
            client.close()
    for (database, collection), tally in counts.items():
        yield (database, collection, dict(tally))


def run_by_collection(
    rows: DataFrame, write: Callable[[Iterable[Any]], Iterator[tuple[str, str, dict[str, int]]]]
) -> dict[tuple[str, str], Counter[str]]:
    """Run ``write`` on every partition of ``rows`` (on the executors); the counts summed per collection."""
    summed: dict[tuple[str, str], Counter[str]] = {}
    for database, collection, tally in on_each_partition(rows, write):
        summed.setdefault((database, collection), Counter()).update(tally)
    return summed
