"""Helpers for the SQL sink tests: a sink per dialect on the per-test database, reading tables back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
import pymysql
import pytest

from ngsi_assets.ngsi.sql_config import SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import Dialect, quote_ident
from ngsi_assets.sinks.sql_writer import WriteJob, write_rows
from resources.sql import MySQLResource, PostgresResource

H10 = (1_772_359_200_000, 1_772_362_800_000)  # 2026-03-01 10:00 UTC, one hour


@dataclass
class Sink:
    """One dialect's server (a fresh database of the test's own) and how to read it."""

    dialect: Dialect
    url: str
    created_dbs: list[str]

    def connect_kwargs(self) -> dict[str, Any]:
        if self.dialect is Dialect.POSTGRESQL:
            return PostgresResource(url=self.url).connect_kwargs()
        return MySQLResource(url=self.url).connect_kwargs()

    def config(self, **kw: Any) -> SqlSinkConfig:
        kw.setdefault("batch_retry_intervals", [10])
        kw.setdefault("batch_ttl", 1)
        return SqlSinkConfig(dialect=self.dialect, url=self.url, **kw)

    def job(self, cfg: SqlSinkConfig, sink: str, hours: tuple[tuple[int, int], ...] = (H10,), **kw: Any) -> WriteJob:
        return WriteJob(config=cfg, connect_kwargs=self.connect_kwargs(), sink=sink, hours=hours, **kw)

    def write(self, rows: list[dict], cfg: SqlSinkConfig, sink: str, **kw: Any) -> list[dict]:
        for r in rows:
            if r["db"] not in self.created_dbs:
                self.created_dbs.append(r["db"])
        return write_rows(rows, self.job(cfg, sink, **kw), sleep=lambda _s: None)

    def connect(self) -> Any:
        kwargs = self.connect_kwargs()
        if self.dialect is Dialect.POSTGRESQL:
            return psycopg2.connect(**kwargs)
        return pymysql.connect(**kwargs)

    def q(self, name: str) -> str:
        return quote_ident(name, self.dialect)

    def rows(self, db: str, table: str, columns: list[str] | None = None, order: str | None = None) -> list[tuple]:
        """Every row of db.table, as tuples of the named columns (all, in table order, if None), sorted."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cols = "*" if columns is None else ", ".join(self.q(c) for c in columns)
                cur.execute(f"SELECT {cols} FROM {self.q(db)}.{self.q(table)}")
                out = [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()
        return sorted(out, key=lambda r: tuple("" if v is None else str(v) for v in r))

    def columns(self, db: str, table: str) -> list[str]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "ORDER BY ordinal_position",
                    (db, table),
                )
                return [r[0] for r in cur.fetchall()]
        finally:
            conn.close()

    def tables(self, db: str) -> list[str]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (db,))
                return sorted(r[0] for r in cur.fetchall())
        finally:
            conn.close()

    def drop_created(self) -> None:
        if self.dialect is not Dialect.MYSQL:
            return  # PostgreSQL schemas live in the per-test database, dropped with it
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for db in self.created_dbs:
                    cur.execute(f"DROP DATABASE IF EXISTS {self.q(db)}")
        finally:
            conn.close()


@pytest.fixture(params=[Dialect.POSTGRESQL, Dialect.MYSQL], ids=["postgresql", "mysql"])
def sink(request: pytest.FixtureRequest) -> Iterator[Sink]:
    """A sink on a fresh database of each server; MySQL databases it creates are dropped afterwards."""
    dialect: Dialect = request.param
    url = request.getfixturevalue("postgres_db_url" if dialect is Dialect.POSTGRESQL else "mysql_db_url")
    s = Sink(dialect, url, [])
    try:
        yield s
    finally:
        s.drop_created()
