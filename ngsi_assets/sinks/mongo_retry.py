"""One retry rule for the MongoDB sinks' bulk writes (Cygnus's ``batch_ttl`` and ``batch_retry_intervals``).

A bulk write that failed for a transient reason (network, primary stepping down, a write error with a
transient code) is sent again after the configured interval, up to ``batch_ttl`` times (-1: forever).
The writes are idempotent (whole-document replaces, inserts with deterministic ``_id``), so sending a
batch again cannot count anything twice. Any other error fails at once, naming the collection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Protocol, TypeVar

from pymongo.errors import AutoReconnect, BulkWriteError, ConnectionFailure, NetworkTimeout

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
