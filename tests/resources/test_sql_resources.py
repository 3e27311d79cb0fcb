"""PostgresResource and MySQLResource against the real servers the test session starts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from urllib.parse import unquote, urlsplit

import pymysql.connections
import pytest
from dagster import DagsterResourceFunctionError, EnvVar, asset, materialize
from pydantic import ValidationError

from resources.sql import DatabaseConnectionError, MySQLResource, PostgresResource
from tests.support.servers import free_port, fresh_mysql_database, fresh_postgres_database

integration = pytest.mark.integration

SqlResource = PostgresResource | MySQLResource
FRESH: dict[str, tuple[type[SqlResource], Callable[[str], AbstractContextManager[str]]]] = {
    "postgres": (PostgresResource, fresh_postgres_database),
    "mysql": (MySQLResource, fresh_mysql_database),
}


@pytest.fixture(params=sorted(FRESH))
def db_url(request: pytest.FixtureRequest) -> Iterator[tuple[type[SqlResource], str]]:
    """(resource class, URL of an empty database of its own) for each SQL server."""
    resource_cls, fresh = FRESH[request.param]
    server_url = request.getfixturevalue(f"{request.param}_url")
    with fresh(server_url) as url:
        yield resource_cls, url


@pytest.fixture
def db(db_url: tuple[type[SqlResource], str]) -> SqlResource:
    resource_cls, url = db_url
    resource = resource_cls(url=url)
    resource.execute_script("CREATE TABLE reading (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL)")
    return resource


def rows(resource: SqlResource) -> list[tuple[object, ...]]:
    with resource.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name FROM reading ORDER BY id")
        return [tuple(row) for row in cur.fetchall()]


def autocommit_of(conn: object) -> bool:
    if isinstance(conn, pymysql.connections.Connection):
        return bool(conn.get_autocommit())
    return bool(conn.autocommit)  # type: ignore[attr-defined]


@integration
def test_a_block_that_ends_normally_is_committed(db: SqlResource) -> None:
    with db.connect() as conn:
        assert not autocommit_of(conn)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s), (%s, %s)", (1, "room1", 2, "room2"))
            cur.execute("SELECT count(*) FROM reading")
            assert cur.fetchone()[0] == 2  # its own writes are visible inside the transaction
    assert rows(db) == [(1, "room1"), (2, "room2")]


@integration
def test_a_block_that_raises_leaves_nothing(db: SqlResource) -> None:
    with pytest.raises(RuntimeError, match="half way"), db.connect() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (1, "room1"))
        raise RuntimeError("half way")
    assert rows(db) == []


@integration
def test_a_failing_statement_rolls_back_the_earlier_ones(db: SqlResource) -> None:
    with pytest.raises(Exception, match="(?i)duplicate"), db.connect() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (1, "room1"))
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (1, "again"))
    assert rows(db) == []


@integration
def test_uncommitted_writes_are_invisible_to_other_connections(db: SqlResource) -> None:
    with db.connect() as writer, writer.cursor() as cur:
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (7, "room7"))
        assert rows(db) == []
    assert rows(db) == [(7, "room7")]


@integration
def test_text_round_trips_as_utf8(db: SqlResource) -> None:
    name = "Sala \u00f1 \U0001f321 \u6e29\u5ea6"  # 4-byte emoji: needs utf8mb4 on MySQL
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (1, name))
    assert rows(db) == [(1, name)]


@integration
def test_execute_script_runs_every_statement(db: SqlResource) -> None:
    db.execute_script(
        "INSERT INTO reading (id, name) VALUES (1, 'a;b');\nINSERT INTO reading (id, name) VALUES (2, 'c');"
    )
    assert rows(db) == [(1, "a;b"), (2, "c")]


@integration
def test_execute_script_fails_as_a_whole_on_a_bad_statement(db: SqlResource) -> None:
    with pytest.raises(Exception, match="(?i)no_such_table|doesn't exist|does not exist"):
        db.execute_script("INSERT INTO reading (id, name) VALUES (1, 'a'); INSERT INTO no_such_table (id) VALUES (1);")
    assert rows(db) == []


@integration
def test_postgres_ddl_in_a_failed_script_is_rolled_back_too(postgres_url: str) -> None:
    with fresh_postgres_database(postgres_url) as url:
        pg = PostgresResource(url=url)
        with pytest.raises(Exception, match="division by zero"):
            pg.execute_script("CREATE TABLE t (id INT); INSERT INTO t VALUES (1); SELECT 1 / 0;")
        with pg.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass('public.t')")
            assert cur.fetchone() == (None,)


@integration
def test_sessions_run_in_utc(db: SqlResource) -> None:
    query = "SHOW TimeZone" if isinstance(db, PostgresResource) else "SELECT @@session.time_zone"
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute(query)
        assert cur.fetchone()[0] in ("UTC", "+00:00")


@integration
def test_config_from_parts_reaches_the_same_database(db: SqlResource, db_url: tuple[type[SqlResource], str]) -> None:
    resource_cls, url = db_url
    parts = urlsplit(url)
    from_parts = resource_cls(
        host=parts.hostname,
        port=parts.port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
    )
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO reading (id, name) VALUES (%s, %s)", (3, "room3"))
    assert rows(from_parts) == [(3, "room3")]
    assert from_parts.target == db.target


@integration
def test_mysql_connection_speaks_utf8mb4(mysql_url: str) -> None:
    with MySQLResource(url=mysql_url).connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@character_set_client, @@character_set_connection, @@character_set_results")
        assert cur.fetchone() == ("utf8mb4", "utf8mb4", "utf8mb4")


@integration
@pytest.mark.parametrize("kind", sorted(FRESH))
def test_a_wrong_password_gives_a_clear_error(kind: str, request: pytest.FixtureRequest) -> None:
    resource_cls, _ = FRESH[kind]
    parts = urlsplit(request.getfixturevalue(f"{kind}_url"))
    wrong = parts._replace(netloc=f"{parts.username}:Wr0ng-Secret@{parts.hostname}:{parts.port}").geturl()
    with pytest.raises(DatabaseConnectionError) as raised, resource_cls(url=wrong).connect():
        pass
    message = str(raised.value)
    assert "Wr0ng-Secret" not in message
    assert f"{parts.username}@{parts.hostname}:{parts.port}" in message
    assert "password authentication failed" in message or "Access denied" in message


@pytest.mark.parametrize("resource_cls", [PostgresResource, MySQLResource])
def test_an_unreachable_server_gives_a_clear_error(resource_cls: type[SqlResource]) -> None:
    port = free_port()
    resource = resource_cls(host="127.0.0.1", port=port, user="nobody", password="x", connect_timeout_s=2)
    with pytest.raises(DatabaseConnectionError, match=f"nobody@127.0.0.1:{port}") as raised, resource.connect():
        pass
    assert "refused" in str(raised.value).lower() or "can't connect" in str(raised.value).lower()


@pytest.mark.parametrize(
    ("resource_cls", "config", "expected"),
    [
        (PostgresResource, {"url": "mysql://u:s3cret@h/db"}, "has scheme 'mysql'"),
        (MySQLResource, {"url": "postgresql://u:s3cret@h/db"}, "has scheme 'postgresql'"),
        (PostgresResource, {"url": "postgresql://u:s3cret@h:port/db"}, "Port could not be cast"),
        (PostgresResource, {"url": "postgresql://u:s3cret@/db"}, "names no host"),
        (MySQLResource, {"url": "mysql://h:3306/db"}, "names no user"),
        (MySQLResource, {"url": "mysql://u:s3cret@h/a/b"}, "single database name"),
        (PostgresResource, {"url": "postgresql://u:s3cret@h/db", "host": "h"}, "either url or host, not both"),
        (MySQLResource, {"password": "s3cret"}, "set url"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message_and_no_password(
    resource_cls: type[SqlResource], config: dict[str, str], expected: str
) -> None:
    with pytest.raises(ValidationError, match=expected) as raised:
        resource_cls(**config)
    assert "s3cret" not in str(raised.value)


def test_scheme_with_a_driver_suffix_and_escaped_password_is_understood() -> None:
    target = PostgresResource(url="postgresql+psycopg2://ngsi:p%40ss%2Fw@db.example:6432/cygnus").target
    assert (target.host, target.port, target.user, target.password, target.database) == (
        "db.example",
        6432,
        "ngsi",
        "p@ss/w",
        "cygnus",
    )
    assert "p@ss/w" not in repr(PostgresResource(url="postgresql://ngsi:p%40ss%2Fw@h/db"))


def test_jdbc_urls_use_the_driver_and_dialect_spark_needs() -> None:
    pg = PostgresResource(url="postgresql://u:p@h:5433/d")
    my = MySQLResource(url="mysql://u:p@h/d")
    assert pg.jdbc_url() == "jdbc:postgresql://h:5433/d"
    assert my.jdbc_url().startswith("jdbc:mysql://h:3306/d?permitMysqlScheme")
    assert my.jdbc_properties() == {"user": "u", "password": "p", "driver": "org.mariadb.jdbc.Driver"}


@integration
def test_a_url_from_the_environment_is_read_when_a_run_starts(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    @asset
    def server_version(pg: PostgresResource) -> str:
        with pg.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW server_version")
            return str(cur.fetchone()[0])

    resources = {"pg": PostgresResource(url=EnvVar("NGSI_TEST_PG_URL"))}
    monkeypatch.setenv("NGSI_TEST_PG_URL", postgres_url)
    result = materialize([server_version], resources=resources)
    assert result.output_for_node("server_version")

    monkeypatch.setenv("NGSI_TEST_PG_URL", "mysql://u:s3cret@h:1/x")
    with pytest.raises(DagsterResourceFunctionError) as raised:
        materialize([server_version], resources=resources)
    cause = raised.value.__cause__
    assert isinstance(cause, ValidationError)
    assert "has scheme 'mysql'" in str(cause)
    assert "s3cret" not in str(cause)
