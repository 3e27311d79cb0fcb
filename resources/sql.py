"""Connection-level resources for the SQL sinks: PostgreSQL (psycopg2) and MySQL/MariaDB (pymysql).

A resource is configured either with ``url`` (``postgresql://user:password@host:port/database``,
``mysql://...``) or with ``host``/``port``/``user``/``password``/``database``, never both. The
configuration is checked when the resource is built, so a bad URL fails before any run starts.

``connect()`` opens one connection with autocommit off: the ``with`` block is one transaction, committed
when the block ends normally and rolled back when it raises, which is how a sink batch lands whole or
not at all. Connection failures raise ``DatabaseConnectionError`` naming the server and user (never the
password) and the server's reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import SplitResult, quote, unquote, urlsplit

import psycopg2
import psycopg2.extensions
import pymysql
import pymysql.connections
from dagster import ConfigurableResource, EnvVar
from pydantic import ConfigDict, Field, model_validator
from pymysql.constants import CLIENT


class DatabaseConnectionError(ConnectionError):
    """A database server could not be reached, or refused the login."""


@dataclass(frozen=True)
class SqlTarget:
    """Where a SQL resource connects: one server, one login, optionally one database."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str | None

    def describe(self) -> str:
        """``user@host:port/database``: safe for messages and logs (no password)."""
        return f"{self.user}@{self.host}:{self.port}/{self.database or ''}"


def _masked(url: str) -> str:
    """``url`` with any password replaced by ``***``, for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def parse_sql_url(url: str, *, schemes: tuple[str, ...], default_port: int, example: str) -> SqlTarget:
    """Parse ``scheme://user:password@host:port/database``; ``scheme+driver`` is accepted too.

    Raises ValueError with a message that says what is wrong and what a good URL looks like.
    """
    shown = _masked(url)
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid database URL {shown!r}: {exc}; expected {example}") from exc
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme not in schemes:
        raise ValueError(
            f"database URL {shown!r} has scheme {parts.scheme!r}, expected one of {', '.join(schemes)} (like {example})"
        )
    if not parts.hostname:
        raise ValueError(f"database URL {shown!r} names no host; expected {example}")
    if not parts.username:
        raise ValueError(f"database URL {shown!r} names no user; expected {example}")
    database = unquote(parts.path.lstrip("/")) or None
    if database is not None and "/" in database:
        raise ValueError(f"database URL {shown!r}: the path must be a single database name")
    return SqlTarget(
        host=parts.hostname,
        port=port or default_port,
        user=unquote(parts.username),
        password=unquote(parts.password or ""),
        database=database,
    )


class _SqlResource(ConfigurableResource):
    """Shared configuration of the SQL resources: a URL, or the parts of one."""

    # The URL and password stay out of reprs and validation errors: they carry the secret.
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str | None = Field(
        default=None, repr=False, description="Connection URL with user, password, host, port and database."
    )
    host: str | None = Field(default=None, description="Server host, when no url is given.")
    port: int | None = Field(default=None, description="Server port, when no url is given.")
    user: str | None = Field(default=None, description="Login user, when no url is given.")
    password: str | None = Field(default=None, repr=False, description="Login password, when no url is given.")
    database: str | None = Field(default=None, description="Database to use, when no url is given.")
    connect_timeout_s: int = Field(default=10, ge=1, description="Seconds to wait for the server to answer.")

    _schemes: ClassVar[tuple[str, ...]] = ()
    _default_port: ClassVar[int] = 0
    _example: ClassVar[str] = ""
    _system: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _check_location(cls, data: Any) -> Any:
        # Runs on the raw input, where an EnvVar is still an EnvVar (the after-stage sees its name as
        # a plain str); a URL from the environment is checked when Dagster builds the resource for a run.
        if not isinstance(data, dict):
            return data
        name = cls.__name__
        given = sorted(k for k in ("host", "port", "user", "password", "database") if data.get(k) is not None)
        url = data.get("url")
        if url is not None:
            if given:
                raise ValueError(f"{name}: give either url or {', '.join(given)}, not both")
            if isinstance(url, str) and not isinstance(url, EnvVar):
                parse_sql_url(url, schemes=cls._schemes, default_port=cls._default_port, example=cls._example)
        elif data.get("host") is None or data.get("user") is None:
            raise ValueError(f"{name}: set url (like {cls._example}), or at least host and user")
        return data

    @property
    def target(self) -> SqlTarget:
        """The server, login and database this resource connects to."""
        if self.url is not None:
            return parse_sql_url(
                self.url, schemes=self._schemes, default_port=self._default_port, example=self._example
            )
        assert self.host is not None and self.user is not None  # checked by _check_location
        return SqlTarget(
            host=self.host,
            port=self.port or self._default_port,
            user=self.user,
            password=self.password or "",
            database=self.database,
        )

    def _connection_error(self, target: SqlTarget, exc: Exception) -> DatabaseConnectionError:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return DatabaseConnectionError(f"cannot connect to {self._system} as {target.describe()}: {reason}")


class PostgresResource(_SqlResource):
    """A PostgreSQL database reached through psycopg2; sessions run in UTC unless ``time_zone`` says otherwise."""

    time_zone: str = Field(default="UTC", description="Session TimeZone.")
    application_name: str = Field(default="ngsi-assets", description="Shown in pg_stat_activity.")

    _schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    _default_port: ClassVar[int] = 5432
    _example: ClassVar[str] = "postgresql://user:password@host:5432/database"
    _system: ClassVar[str] = "PostgreSQL"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``psycopg2.connect`` (also usable from Spark executors)."""
        target = self.target
        kwargs: dict[str, Any] = {
            "host": target.host,
            "port": target.port,
            "user": target.user,
            "password": target.password,
            "connect_timeout": self.connect_timeout_s,
            "application_name": self.application_name,
            "options": f"-c TimeZone={self.time_zone}",
        }
        if target.database is not None:
            kwargs["dbname"] = target.database
        return kwargs

    @contextlib.contextmanager
    def connect(self) -> Iterator[psycopg2.extensions.connection]:
        """One connection, autocommit off; commits when the block ends, rolls back if it raises."""
        try:
            conn = psycopg2.connect(**self.connect_kwargs())
        except psycopg2.OperationalError as exc:
            raise self._connection_error(self.target, exc) from exc
        try:
            conn.autocommit = False
            yield conn
            conn.commit()
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        finally:
            conn.close()

    def execute_script(self, script: str) -> None:
        """Run several ``;``-separated statements in one transaction (PostgreSQL DDL is transactional)."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(script)

    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/database`` for Spark's JDBC source and sink."""
        target = self.target
        return f"jdbc:postgresql://{target.host}:{target.port}/{quote(target.database or '', safe='')}"

    def jdbc_properties(self) -> dict[str, str]:
        target = self.target
        return {"user": target.user, "password": target.password, "driver": "org.postgresql.Driver"}


class MySQLResource(_SqlResource):
    """A MySQL or MariaDB database reached through pymysql, in utf8mb4; sessions run in UTC by default."""

    time_zone: str = Field(
        default="+00:00", description="Session time_zone; an offset works without the server's tz tables."
    )
    io_timeout_s: int = Field(
        default=300,
        ge=1,
        description="Seconds one read or write may wait for the server: a frozen server or "
        "a network partition ends in an error (retried as a table batch's failure), not in a run that never ends.",
    )

    _schemes: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    _default_port: ClassVar[int] = 3306
    _example: ClassVar[str] = "mysql://user:password@host:3306/database"
    _system: ClassVar[str] = "MySQL"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (also usable from Spark executors)."""
        target = self.target
        return {
            "host": target.host,
            "port": target.port,
            "user": target.user,
            "password": target.password,
            "database": target.database,
            "charset": "utf8mb4",
            "autocommit": False,
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.io_timeout_s,
            "write_timeout": self.io_timeout_s,
            "init_command": f"SET time_zone = '{pymysql.converters.escape_string(self.time_zone)}'",
        }

    @contextlib.contextmanager
    def connect(self, *, multi_statements: bool = False) -> Iterator[pymysql.connections.Connection[Any]]:
        """One connection, autocommit off; commits when the block ends, rolls back if it raises."""
        kwargs = self.connect_kwargs()
        if multi_statements:
            kwargs["client_flag"] = CLIENT.MULTI_STATEMENTS
        try:
            conn = pymysql.connect(**kwargs)
        except pymysql.err.OperationalError as exc:
            raise self._connection_error(self.target, exc) from exc
        try:
            yield conn
            conn.commit()
        except BaseException:
            if conn.open:
                conn.rollback()
            raise
        finally:
            if conn.open:
                conn.close()

    def execute_script(self, script: str) -> None:
        """Run several ``;``-separated statements in one transaction.

        MySQL commits implicitly around DDL (CREATE, ALTER, DROP): only the DML of a script is
        rolled back when a later statement fails.
        """
        with self.connect(multi_statements=True) as conn, conn.cursor() as cur:
            cur.execute(script)
            # Errors of later statements only surface when their results are read.
            while cur.nextset():
                pass

    def jdbc_url(self) -> str:
        """A JDBC URL for Spark, for the MariaDB driver with the MySQL dialect.

        A ``jdbc:mariadb://`` URL makes Spark pick a dialect that quotes names wrongly; the MariaDB
        driver accepts ``jdbc:mysql://`` when ``permitMysqlScheme`` is set.
        """
        target = self.target
        database = quote(target.database or "", safe="")
        return f"jdbc:mysql://{target.host}:{target.port}/{database}?permitMysqlScheme&characterEncoding=UTF-8"

    def jdbc_properties(self) -> dict[str, str]:
        target = self.target
        return {"user": target.user, "password": target.password, "driver": "org.mariadb.jdbc.Driver"}
