"""The MongoDB sinks' retry rule: transient failures are retried up to batch_ttl, others fail at once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pymongo.errors import AutoReconnect, BulkWriteError

from ngsi_assets.sinks.mongo_bulk import MongoWriteError, with_retries


@dataclass
class Policy:
    batch_ttl: int = 2

    def retry_interval_ms(self, attempt: int) -> int:
        return 0


def failing(*errors: Exception, result: str = "done"):  # noqa: ANN201
    calls = []

    def write() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return write, calls


def bulk(*codes: int, n_inserted: int = 0) -> BulkWriteError:
    return BulkWriteError(
        {"writeErrors": [{"code": c, "errmsg": f"error {c}"} for c in codes], "nInserted": n_inserted}
    )


def test_transient_failures_are_retried_until_success() -> None:
    write, calls = failing(AutoReconnect("primary stepped down"), bulk(11600))
    assert with_retries(write, "db.c", Policy()) == "done"
    assert len(calls) == 3


def test_retries_stop_after_batch_ttl_naming_the_collection() -> None:
    write, calls = failing(*[AutoReconnect("down")] * 5)
    with pytest.raises(MongoWriteError, match=r"bulk write to db\.c failed after 2 retries: down"):
        with_retries(write, "db.c", Policy(batch_ttl=2))
    assert len(calls) == 3


def test_other_write_errors_fail_at_once() -> None:
    write, calls = failing(bulk(11000, 2))
    with pytest.raises(MongoWriteError, match=r"bulk write to db\.c failed: error 2"):
        with_retries(write, "db.c", Policy(), harmless={11000})
    assert len(calls) == 1


def test_harmless_errors_are_a_partial_success() -> None:
    write, calls = failing(bulk(11000, 11000, n_inserted=3))
    result = with_retries(write, "db.c", Policy(), harmless={11000}, partial=lambda e: e.details["nInserted"])
    assert (result, len(calls)) == (3, 1)
