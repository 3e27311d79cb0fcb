"""A server that stops answering (hung, or cut off by a network partition) ends a sink's write in an
error that names it, which the sink's retries and the run's failure handle, never in a write that
waits forever and holds its run STARTED.

The servers here are the tests' own, whatever ``MYSQL_URL`` or ``MONGO_URL`` say: they are frozen
with SIGSTOP (their connections stay open and the kernel still acknowledges packets, but nothing
answers), which a shared server must not be. MongoDB's bound (the sinks' ``socketTimeoutMS``) has
no test here yet. PostgreSQL is not here: libpq has no read timeout, so a
frozen PostgreSQL server holds a write until it answers again (see docs/operations.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest

from resources.sql import MySQLResource
from tests.support.servers import (
    ServerProcess,
    mysql_server_url,
    start_mariadb,
)

pytestmark = pytest.mark.integration

# A guard against a regression that hangs, not a speed limit: the timeouts below are 2 s.
HANG_GUARD_S = 120


def outcome_within(call: Callable[[], Any]) -> BaseException | Any:
    """``call()``'s result or exception, from a thread given ``HANG_GUARD_S`` seconds."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert box, f"still waiting after {HANG_GUARD_S} s: the call has no timeout"
    return box[0]


@pytest.fixture(scope="module")
def mariadb() -> Iterator[ServerProcess]:
    server = start_mariadb()
    yield server
    server.stop()


def test_a_frozen_mysql_server_ends_a_statement_in_an_error(mariadb: ServerProcess) -> None:
    resource = MySQLResource(url=mysql_server_url(mariadb), io_timeout_s=2)
    conn = pymysql.connect(**resource.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
            with mariadb.frozen():
                failed = outcome_within(lambda: cur.execute("SELECT 2"))
        assert isinstance(failed, pymysql.err.OperationalError), failed
        assert "Lost connection" in str(failed) or "timed out" in str(failed), failed
    finally:
        conn.close()
    # The server goes on serving once it answers again.
    with resource.connect() as again, again.cursor() as cur:
        cur.execute("SELECT 3")
        assert cur.fetchone() == (3,)


def test_the_mysql_timeout_is_a_parameter_with_a_bound_default() -> None:
    assert MySQLResource(url="mysql://u:p@h:3306/d").connect_kwargs()["read_timeout"] == 300
    with pytest.raises(ValueError, match="io_timeout_s"):
        MySQLResource(url="mysql://u:p@h:3306/d", io_timeout_s=0)
