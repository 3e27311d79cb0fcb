"""Writing historic and last-data tables into PostgreSQL and MySQL/MariaDB, one table batch at a time.

Grain: one *table batch* = every row a run sends to one destination table (a Spark partition holds
whole tables: the caller repartitions by (db, table) and sorts by table then key). Each table batch:

1. is spooled to a local temporary file (so it can be replayed on retry without holding it in memory);
2. gets its DDL in a step of its own (MySQL commits DDL implicitly): CREATE SCHEMA/DATABASE and
   CREATE TABLE IF NOT EXISTS (a last-data table with its unique index), then ALTER TABLE ADD COLUMN
   for attributes the table lacks (column mode), in sorted order, idempotently;
3. lands in one transaction, whole or not at all, retried ``batch_ttl`` times with
   ``batch_retry_intervals`` waits before the run fails with the last error:

   - historic: delete the rows of the run's hours (receive time) from the table, bulk insert (PostgreSQL
     ``COPY``; MySQL multi-row ``INSERT`` of ``batch_size`` rows), then capping (keep the newest
     ``max_records``) and expiration (drop rows older than ``expiration_time``). Deleting the run's
     hours first makes a rerun leave the table exactly as one run does, with Cygnus's columns only.
     An increment (a continuous run: part of an hour) deletes nothing: it records (table, increment)
     in the bookkeeping table ``ngsi_assets_sink_state.historic_increments`` in the same transaction
     as its rows, and a table that already has the increment is left alone, so each increment's
     rows land exactly once.
   - last data: lock the existing rows of the batch's keys in key order, then one ordered upsert
     (PostgreSQL ``COPY`` into a temporary table and ``INSERT ... SELECT ... ORDER BY key ON CONFLICT
     DO UPDATE ... WHERE NOT stored > incoming``; MySQL ordered multi-row ``INSERT ... ON DUPLICATE KEY
     UPDATE col = IF(NOT stored > incoming, ...)``, timestamp column last), then the entityDelete rows,
     each guarded the same way. Times are the timestamp key's column read with
     ``last_data_sql_timestamp_format``, or, for a sink that orders by an ISO 8601 instant, the
     ``INSTANT_COLUMN`` (epoch nanoseconds, a BIGINT) the rows carry: the server compares numbers
     and never parses the device's text.
     Every writer takes row locks in key order, so two writers on one table cannot deadlock.

An attribute a record lacks arrives with a NULL metadata column (present attributes always carry at
least ``[]``): the upsert keeps the stored value of such a column.

Executors open their own connections from plain keyword arguments (psycopg2 / pymysql). Names are
already encoded by ``ngsi_assets.ngsi.sql_naming``; they are quoted here, and every value is bound.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ngsi_assets.ngsi.sql_config import AttrPersistence, SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import (
    COLUMN_FIXED,
    INSTANT_COLUMN,
    MD_SUFFIX,
    ROW_COLUMNS,
    Dialect,
    fixed_column,
    quote_ident,
)

log = logging.getLogger(__name__)

HISTORIC = "historic"
LAST_DATA = "last_data"
OP_UPSERT = "u"
OP_DELETE = "d"
# MySQL needs a bounded length to index a column: 3 such columns of utf8mb4 fill InnoDB's 3072 bytes.
MYSQL_KEY_CHARS = 256
_SPOOL_MEMORY = 32 * 2**20
# Where the writers record which increments each historic table holds (a schema in PostgreSQL, a
# database in MySQL); a name no Cygnus data model derives from a service, a path and an entity.
BOOKKEEPING = "ngsi_assets_sink_state"
INCREMENTS_TABLE = "historic_increments"
_COPY_CHUNK = 20_000


class SqlBatchError(RuntimeError):
    """A table batch could not be written after every retry; nothing of it was committed."""


@dataclass(frozen=True)
class WriteJob:
    """What one writer task needs: plain, picklable parameters (shipped to the Spark executors)."""

    config: SqlSinkConfig
    connect_kwargs: dict[str, Any] = field(repr=False)
    sink: str  # HISTORIC or LAST_DATA
    # The run's hours as [start_ms, end_ms) ranges: historic rows of these hours are replaced.
    hours: tuple[tuple[int, int], ...] = ()
    # Expiration cut-off (ms since the epoch), from the run's clock; None when expiration is off.
    now_ms: int | None = None
    # A continuous run's increment id: historic rows are added once per table, nothing is deleted.
    increment: str | None = None

    @property
    def dialect(self) -> Dialect:
        return self.config.dialect

    @property
    def column_mode(self) -> bool:
        return self.sink == LAST_DATA or self.config.attr_persistence is AttrPersistence.COLUMN

    @property
    def by_instant(self) -> bool:
        """Last data whose guard compares ``INSTANT_COLUMN`` (the rows carry ``instant``)."""
        return self.sink == LAST_DATA and self.config.orders_by_instant


@dataclass
class TableBatch:
    """Rows for one table, spooled; ``attr_columns`` is the union of their attribute columns.

    ``database`` is the PostgreSQL database of a ``*-database*`` data model (None: the sink URL's).
    """

    db: str
    table: str
    spool: IO[bytes]
    rows: int = 0
    attr_columns: set[str] = field(default_factory=set)
    database: str | None = None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self.spool.seek(0)
        for _ in range(self.rows):
            yield pickle.load(self.spool)


def _get(row: Any, name: str) -> Any:
    return row[name]


def _database(row: Any) -> str | None:
    """The row's ``database``; rows shaped without one (tests, tools) belong to the URL's database."""
    try:
        return row["database"]
    except (KeyError, ValueError):  # a dict, or a pyspark Row, without the field
        return None


def _spool_tables(rows: Iterable[Any], job: WriteJob) -> Iterator[TableBatch]:
    """Consecutive rows of one (database, db, table) become one spooled TableBatch (input sorted by table)."""
    key = lambda r: (_database(r), _get(r, "db"), _get(r, "table"))  # noqa: E731
    for (database, db, table), group in itertools.groupby(rows, key=key):
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY) as spool:
            batch = TableBatch(db, table, spool, database=database)
            for r in group:
                if job.column_mode:
                    attrs = dict(_get(r, "attrs") or {})
                    item: tuple[Any, ...] = (
                        *(_get(r, c) for c in COLUMN_FIXED),
                        {k: (v[0], v[1]) for k, v in attrs.items()},
                        _get(r, "op") if job.sink == LAST_DATA else OP_UPSERT,
                        _get(r, "instant") if job.by_instant else None,
                    )
                    batch.attr_columns.update(attrs)
                    if job.sink == LAST_DATA and not job.config.timestamp_is_recv_time and not job.by_instant:
                        # The guard compares this column: it must exist even if no row carries it.
                        batch.attr_columns.add(job.config.timestamp_column)
                else:
                    item = tuple(_get(r, c) for c in ROW_COLUMNS)
                # One pickle per row: a shared Pickler would memoize (hold) every row it has written.
                pickle.dump(item, spool, protocol=pickle.HIGHEST_PROTOCOL)
                batch.rows += 1
            yield batch


def write_rows(rows: Iterable[Any], job: WriteJob, *, sleep: Callable[[float], None] = time.sleep) -> list[dict]:
    """Write every table batch of ``rows`` (sorted by db, table, key); one stats dict per table.

    Usable directly (tests, benchmarks) and inside ``mapPartitions`` on a Spark executor.
    """
    writer = _WRITERS[job.dialect](job)
    stats: list[dict] = []
    try:
        for batch in _spool_tables(rows, job):
            stats.append(writer.write_with_retries(batch, sleep))
    finally:
        writer.close()
    return stats


def _csv_field(value: Any) -> str:
    if value is None:
        return ""
    text = str(value)
    return '"' + text.replace('"', '""') + '"'


def _csv(rows: Iterable[Sequence[Any]]) -> io.StringIO:
    buf = io.StringIO()
    for r in rows:
        buf.write(",".join(_csv_field(v) for v in r))
        buf.write("\n")
    buf.seek(0)
    return buf


class _Writer:
    """Shared retry loop and row shaping; subclasses speak one dialect."""

    dialect: Dialect

    def __init__(self, job: WriteJob) -> None:
        self.job = job
        self.cfg = job.config
        self.conn: Any = None
        self.conn_database: str | None = None  # the database self.conn is on (None: the URL's)
        # Databases where this writer has made the increments bookkeeping table (once, not per batch).
        self.bookkeeping_in: set[str | None] = set()

    def needs_bookkeeping(self, database: str | None) -> bool:
        """Whether an increment's writer has yet to make the bookkeeping table in this database."""
        return self.job.increment is not None and database not in self.bookkeeping_in

    # -- connection -------------------------------------------------------------------------------
    def _connect(self, database: str | None = None) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None

    def q(self, name: str) -> str:
        return quote_ident(name, self.dialect)

    def qt(self, batch: TableBatch) -> str:
        return f"{self.q(batch.db)}.{self.q(batch.table)}"

    def fixed(self, name: str) -> str:
        return fixed_column(name, self.dialect)

    # -- shaping ----------------------------------------------------------------------------------
    def columns(self, batch: TableBatch) -> list[str]:
        """Database column names of the batch, in insert order."""
        if not self.job.column_mode:
            return [self.fixed(c) for c in ROW_COLUMNS]
        attrs = sorted(batch.attr_columns)
        instant = [INSTANT_COLUMN] if self.job.by_instant else []
        return [self.fixed(c) for c in COLUMN_FIXED] + [c for a in attrs for c in (a, a + MD_SUFFIX)] + instant

    def values(self, batch: TableBatch) -> Iterator[tuple[Any, ...]]:
        """Rows as tuples matching ``columns`` (column mode: absent attributes are NULL, op last)."""
        if not self.job.column_mode:
            yield from batch
            return
        attrs = sorted(batch.attr_columns)
        nfix = len(COLUMN_FIXED)
        for item in batch:
            present = item[nfix]
            out = list(item[:nfix])
            for a in attrs:
                value, md = present.get(a, (None, None))
                out.append(value)
                out.append(md)
            if self.job.by_instant:
                out.append(item[nfix + 2])
            out.append(item[nfix + 1])
            yield tuple(out)

    def key_columns(self) -> list[str]:
        return [self.fixed(c) for c in self.cfg.last_data_unique_key]

    # -- the retry loop ---------------------------------------------------------------------------
    def write_with_retries(self, batch: TableBatch, sleep: Callable[[float], None]) -> dict:
        delays = self.cfg.retry_delays_s()
        attempt = 0
        while True:
            try:
                if self.conn is not None and self.conn_database != batch.database:
                    self.close()
                if self.conn is None:
                    self.conn = self._connect(batch.database)
                    self.conn_database = batch.database
                self.ensure_table(batch)
                written = self.write(batch)
                stats = {"db": batch.db, "table": batch.table, "rows": batch.rows, "written": written}
                if batch.database is not None:
                    stats["database"] = batch.database
                return stats
            except Exception as exc:
                with contextlib.suppress(Exception):
                    self.conn.rollback()
                if not self._retryable(exc) or attempt >= len(delays):
                    self.close()
                    raise SqlBatchError(
                        f"{self.dialect} table {batch.db}.{batch.table}: batch of {batch.rows} rows not written "
                        f"after {attempt + 1} attempt(s): {type(exc).__name__}: {' '.join(str(exc).split())}"
                    ) from exc
                log.warning("retrying %s.%s in %.1fs after %s", batch.db, batch.table, delays[attempt], exc)
                self.close()
                sleep(delays[attempt])
                attempt += 1

    def _retryable(self, exc: Exception) -> bool:
        return True

    def ensure_table(self, batch: TableBatch) -> None:
        raise NotImplementedError

    def write(self, batch: TableBatch) -> int:
        raise NotImplementedError

    # -- shared SQL pieces ------------------------------------------------------------------------
    def create_columns(self, batch: TableBatch) -> list[tuple[str, str]]:
        """(column, type) for CREATE TABLE: Cygnus's layout with text columns, recvTimeTs a BIGINT."""
        text = "TEXT"
        keys = set(self.key_columns()) if self.job.sink == LAST_DATA else set()
        out: list[tuple[str, str]] = []
        for c in self.columns(batch):
            if c in (self.fixed("recvTimeTs"), INSTANT_COLUMN):
                out.append((c, "BIGINT"))
            elif c in keys and self.dialect is Dialect.MYSQL:
                out.append((c, f"VARCHAR({MYSQL_KEY_CHARS}) NOT NULL"))
            elif c in keys:
                out.append((c, "TEXT NOT NULL"))
            else:
                out.append((c, text))
        return out

    @staticmethod
    def added_type(column: str) -> str:
        """The type of a column added to an existing table: text, or the instant's BIGINT."""
        return "BIGINT" if column == INSTANT_COLUMN else "TEXT"

    def increments_table(self) -> str:
        return f"{self.q(BOOKKEEPING)}.{self.q(INCREMENTS_TABLE)}"

    def claim_increment(self, cur: Any, batch: TableBatch) -> bool:
        """Record the job's increment for this table; False when the table already holds it."""
        verb = "INSERT IGNORE INTO" if self.dialect is Dialect.MYSQL else "INSERT INTO"
        tail = "" if self.dialect is Dialect.MYSQL else " ON CONFLICT DO NOTHING"
        cur.execute(
            f"{verb} {self.increments_table()} (db_name, table_name, increment, row_count) VALUES (%s, %s, %s, %s)"
            + tail,
            (batch.db, batch.table, self.job.increment, batch.rows),
        )
        return cur.rowcount == 1

    def write_historic(self, cur: Any, batch: TableBatch, insert: Callable[[Iterable[tuple[Any, ...]]], None]) -> int:
        """Replace the run's hours of the table (or add the increment's rows once), cap and expire."""
        if self.job.increment is not None:
            if not self.claim_increment(cur, batch):
                return 0
        else:
            cond, params = self.hour_condition()
            cur.execute(f"DELETE FROM {self.qt(batch)} WHERE {cond}", params)
        values = self.values(batch)
        if self.job.column_mode:
            values = (v[:-1] for v in values)
        insert(values)
        self.cap_and_expire(cur, batch)
        return batch.rows

    def hour_condition(self) -> tuple[str, list[Any]]:
        """SQL (and parameters) matching the rows of the run's hours, by receive time."""
        if not self.job.hours:
            return "FALSE", []
        if not self.job.column_mode:
            ts = self.q(self.fixed("recvTimeTs"))
            parts = [f"({ts} >= %s AND {ts} < %s)" for _ in self.job.hours]
            params = [v for h in self.job.hours for v in h]
        else:
            # Column tables carry recvTime only ('YYYY-MM-DD HH:MM:SS.mmm', UTC): match the hour prefix.
            rt = self.q(self.fixed("recvTime"))
            parts = [f"{rt} LIKE %s" for _ in self.job.hours]
            params = [time.strftime("%Y-%m-%d %H", time.gmtime(start // 1000)) + "%" for start, _ in self.job.hours]
        return "(" + " OR ".join(parts) + ")", params

    def order_columns(self, cur: Any, batch: TableBatch) -> list[str]:
        """Every column of the table, oldest-first sort key first: a total order for capping."""
        existing = self.existing_columns(cur, batch)
        first = self.fixed("recvTimeTs") if not self.job.column_mode else self.fixed("recvTime")
        rest = sorted(c for c in existing if c != first)
        return [first, *rest]

    def existing_columns(self, cur: Any, batch: TableBatch) -> list[str]:
        raise NotImplementedError

    def cap_and_expire(self, cur: Any, batch: TableBatch) -> None:
        policy = self.cfg.persistence_policy
        table = self.qt(batch)
        if policy.expiration_time and self.job.now_ms is not None:
            cutoff_ms = self.job.now_ms - policy.expiration_time * 1000
            if not self.job.column_mode:
                cur.execute(f"DELETE FROM {table} WHERE {self.q(self.fixed('recvTimeTs'))} < %s", (cutoff_ms,))
            else:
                cutoff = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(cutoff_ms // 1000)) + f".{cutoff_ms % 1000:03d}"
                cur.execute(f"DELETE FROM {table} WHERE {self.q(self.fixed('recvTime'))} < %s", (cutoff,))
        if policy.max_records:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            excess = int(cur.fetchone()[0]) - policy.max_records
            if excess > 0:
                order = ", ".join(self.q(c) for c in self.order_columns(cur, batch))
                self.delete_oldest(cur, batch, order, excess)

    def delete_oldest(self, cur: Any, batch: TableBatch, order: str, count: int) -> None:
        raise NotImplementedError


class _PostgresWriter(_Writer):
    dialect = Dialect.POSTGRESQL

    def _connect(self, database: str | None = None) -> Any:
        import psycopg2

        kwargs = dict(self.job.connect_kwargs)
        if database is not None:
            kwargs["dbname"] = database
            self._create_database(database)
        conn = psycopg2.connect(**kwargs)
        conn.autocommit = False
        return conn

    def _create_database(self, database: str) -> None:
        """CREATE DATABASE for a ``*-database*`` data model, unless it exists (Cygnus needs it made by hand).

        Run from the sink URL's database, outside a transaction as PostgreSQL requires; a concurrent
        writer creating it first is not an error. Needs the CREATEDB privilege only when it is missing.
        """
        import psycopg2
        from psycopg2 import errorcodes

        admin = psycopg2.connect(**self.job.connect_kwargs)
        try:
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if cur.fetchone() is None:
                    try:
                        cur.execute(f"CREATE DATABASE {self.q(database)}")
                    except psycopg2.Error as exc:
                        if exc.pgcode not in (errorcodes.DUPLICATE_DATABASE, errorcodes.UNIQUE_VIOLATION):
                            raise
        finally:
            admin.close()

    def existing_columns(self, cur: Any, batch: TableBatch) -> list[str]:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (batch.db, batch.table),
        )
        return [r[0] for r in cur.fetchall()]

    def ensure_table(self, batch: TableBatch) -> None:
        with self.conn.cursor() as cur:
            # Concurrent CREATE ... IF NOT EXISTS of one name can still collide in PostgreSQL's
            # catalogs: transaction-scoped locks on the schema name, then the table name (always in
            # that order), serialise the DDL.
            for name in (batch.db, f"{batch.db}.{batch.table}"):
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ngsi-sql-ddl:{name}",))
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.q(batch.db)}")
            cols = ", ".join(f"{self.q(c)} {t}" for c, t in self.create_columns(batch))
            unique = ""
            if self.job.sink == LAST_DATA:
                unique = ", UNIQUE (" + ", ".join(self.q(c) for c in self.key_columns()) + ")"
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.qt(batch)} ({cols}{unique})")
            bookkeeping = self.needs_bookkeeping(batch.database)
            if bookkeeping:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ngsi-sql-ddl:{BOOKKEEPING}",))
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.q(BOOKKEEPING)}")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.increments_table()} (db_name TEXT NOT NULL, "
                    "table_name TEXT NOT NULL, increment TEXT NOT NULL, row_count BIGINT NOT NULL, "
                    "written_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (db_name, table_name, increment))"
                )
            if self.job.column_mode:
                have = set(self.existing_columns(cur, batch))
                missing = [c for c in self.columns(batch) if c not in have]
                if missing:
                    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS {self.q(c)} {self.added_type(c)}" for c in missing)
                    cur.execute(f"ALTER TABLE {self.qt(batch)} {adds}")
        self.conn.commit()
        if bookkeeping:
            self.bookkeeping_in.add(batch.database)

    def _copy(self, cur: Any, target: str, columns: list[str], rows: Iterable[Sequence[Any]]) -> None:
        cols = ", ".join(self.q(c) for c in columns)
        sql = f"COPY {target} ({cols}) FROM STDIN WITH (FORMAT csv)"
        it = iter(rows)
        while chunk := list(itertools.islice(it, _COPY_CHUNK)):
            cur.copy_expert(sql, _csv(chunk))

    def write(self, batch: TableBatch) -> int:
        cols = self.columns(batch)
        with self.conn.cursor() as cur:
            if self.job.sink == HISTORIC:
                written = self.write_historic(cur, batch, lambda values: self._copy(cur, self.qt(batch), cols, values))
            else:
                written = self._upsert(cur, batch, cols)
        self.conn.commit()
        return written

    def _upsert(self, cur: Any, batch: TableBatch, cols: list[str]) -> int:
        stage = self.q("ngsi_last_data_stage")
        coldefs = ", ".join(f"{self.q(c)} {self.added_type(c)}" for c in cols)
        cur.execute(f"CREATE TEMP TABLE {stage} ({coldefs}, op TEXT) ON COMMIT DROP")
        self._copy(cur, stage, [*cols, "op"], self.values(batch))
        keys = self.key_columns()
        on_keys = " AND ".join(f"t.{self.q(k)} = s.{self.q(k)}" for k in keys)
        key_order = ", ".join(f"t.{self.q(k)}" for k in keys)
        # Lock the rows that exist, in key order, before changing any: see the module docstring.
        cur.execute(
            f"SELECT 1 FROM {self.qt(batch)} t JOIN {stage} s ON {on_keys} ORDER BY {key_order} FOR UPDATE OF t"
        )
        ts = self.q(self.cfg.timestamp_column)
        fmt = self.cfg.timestamp_format
        # Cygnus's guard (stored older than incoming), except that an equal time also updates: the
        # incoming row is the key's merged state, which may add columns at the same time.
        if self.job.by_instant:
            inst = self.q(INSTANT_COLUMN)
            newer = f"NOT COALESCE(t.{inst} > EXCLUDED.{inst}, FALSE)"
            stored_newer = f"t.{inst} > s.{inst}"
            params: tuple[Any, ...] = ()
        else:
            newer = f"NOT COALESCE(to_timestamp(t.{ts}::text, %s) > to_timestamp(EXCLUDED.{ts}::text, %s), FALSE)"
            stored_newer = f"to_timestamp(t.{ts}::text, %s) > to_timestamp(s.{ts}::text, %s)"
            params = (fmt, fmt)
        sets = []
        for c in cols:
            if c in keys:
                continue
            if c in {self.fixed(f) for f in COLUMN_FIXED} or c == INSTANT_COLUMN:
                sets.append(f"{self.q(c)} = EXCLUDED.{self.q(c)}")
            elif c.endswith(MD_SUFFIX) and c[: -len(MD_SUFFIX)] in batch.attr_columns:
                sets.append(f"{self.q(c)} = COALESCE(EXCLUDED.{self.q(c)}, t.{self.q(c)})")
            else:
                md = self.q(c + MD_SUFFIX)
                sets.append(
                    f"{self.q(c)} = CASE WHEN EXCLUDED.{md} IS NULL THEN t.{self.q(c)} ELSE EXCLUDED.{self.q(c)} END"
                )
        collist = ", ".join(self.q(c) for c in cols)
        s_order = ", ".join(f"{self.q(k)}" for k in keys)
        cur.execute(
            f"INSERT INTO {self.qt(batch)} AS t ({collist}) SELECT {collist} FROM {stage} WHERE op = %s "
            f"ORDER BY {s_order} ON CONFLICT ({s_order}) DO UPDATE SET {', '.join(sets)} WHERE {newer}",
            (OP_UPSERT, *params),
        )
        written = cur.rowcount
        cur.execute(
            f"DELETE FROM {self.qt(batch)} t USING {stage} s WHERE s.op = %s AND {on_keys} "
            f"AND NOT COALESCE({stored_newer}, FALSE)",
            (OP_DELETE, *params),
        )
        return written + cur.rowcount

    def delete_oldest(self, cur: Any, batch: TableBatch, order: str, count: int) -> None:
        cur.execute(
            f"DELETE FROM {self.qt(batch)} WHERE ctid IN (SELECT ctid FROM {self.qt(batch)} ORDER BY {order} LIMIT %s)",
            (count,),
        )


class _MySQLWriter(_Writer):
    dialect = Dialect.MYSQL

    def _connect(self, database: str | None = None) -> Any:
        import pymysql

        kwargs = dict(self.job.connect_kwargs)
        kwargs["autocommit"] = False
        return pymysql.connect(**kwargs)

    def existing_columns(self, cur: Any, batch: TableBatch) -> list[str]:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (batch.db, batch.table),
        )
        return [r[0] for r in cur.fetchall()]

    def ensure_table(self, batch: TableBatch) -> None:
        import pymysql

        with self.conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {self.q(batch.db)} CHARACTER SET utf8mb4")
            cols = ", ".join(f"{self.q(c)} {t}" for c, t in self.create_columns(batch))
            unique = ""
            if self.job.sink == LAST_DATA:
                unique = ", UNIQUE KEY (" + ", ".join(self.q(c) for c in self.key_columns()) + ")"
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.qt(batch)} ({cols}{unique}) CHARACTER SET utf8mb4")
            bookkeeping = self.needs_bookkeeping(None)  # one bookkeeping database per MySQL server
            if bookkeeping:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {self.q(BOOKKEEPING)} CHARACTER SET utf8mb4")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.increments_table()} (db_name VARCHAR(64) NOT NULL, "
                    "table_name VARCHAR(64) NOT NULL, increment VARCHAR(64) NOT NULL, row_count BIGINT NOT NULL, "
                    "written_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), "
                    "PRIMARY KEY (db_name, table_name, increment)) CHARACTER SET utf8mb4"
                )
            if self.job.column_mode:
                have = {c.lower() for c in self.existing_columns(cur, batch)}
                for c in self.columns(batch):
                    if c.lower() in have:
                        continue
                    try:
                        cur.execute(f"ALTER TABLE {self.qt(batch)} ADD COLUMN {self.q(c)} {self.added_type(c)}")
                    except pymysql.err.OperationalError as exc:
                        if exc.args[0] != 1060:  # duplicate column: another writer added it first
                            raise
        self.conn.commit()
        if bookkeeping:
            self.bookkeeping_in.add(None)

    def _chunks(self, rows: Iterable[Sequence[Any]]) -> Iterator[list[Sequence[Any]]]:
        it = iter(rows)
        while chunk := list(itertools.islice(it, self.cfg.batch_size)):
            yield chunk

    def _insert_sql(self, batch: TableBatch, cols: list[str], n: int) -> str:
        collist = ", ".join(self.q(c) for c in cols)
        one = "(" + ", ".join(["%s"] * len(cols)) + ")"
        return f"INSERT INTO {self.qt(batch)} ({collist}) VALUES " + ", ".join([one] * n)

    def write(self, batch: TableBatch) -> int:
        cols = self.columns(batch)
        with self.conn.cursor() as cur:
            if self.job.sink == HISTORIC:

                def insert(values: Iterable[tuple[Any, ...]]) -> None:
                    for chunk in self._chunks(values):
                        cur.execute(self._insert_sql(batch, cols, len(chunk)), [v for r in chunk for v in r])

                written = self.write_historic(cur, batch, insert)
            else:
                written = self._upsert(cur, batch, cols)
        self.conn.commit()
        return written

    def _upsert(self, cur: Any, batch: TableBatch, cols: list[str]) -> int:
        keys = self.key_columns()
        key_idx = [cols.index(k) for k in keys]
        table = self.qt(batch)
        key_order = ", ".join(self.q(k) for k in keys)
        # Lock the rows that exist, in key order, before changing any: see the module docstring.
        for chunk in self._chunks(self.values(batch)):
            tuple_sql = "(" + ", ".join(["%s"] * len(keys)) + ")"
            cur.execute(
                f"SELECT 1 FROM {table} WHERE ({key_order}) IN ({', '.join([tuple_sql] * len(chunk))}) "
                f"ORDER BY {key_order} FOR UPDATE",
                [r[i] for r in chunk for i in key_idx],
            )
        # The column the guard compares: the instant's, or the timestamp key's read with the format.
        ts_name = INSTANT_COLUMN if self.job.by_instant else self.cfg.timestamp_column
        ts = self.q(ts_name)
        # See the PostgreSQL writer: stored newer than incoming leaves the row untouched.
        if self.job.by_instant:
            newer = f"(NOT COALESCE({ts} > VALUES({ts}), FALSE))"
            stored_newer = f"{ts} > %s"
            fmts: list[Any] = []
        else:
            newer = f"(NOT COALESCE(STR_TO_DATE({ts}, %s) > STR_TO_DATE(VALUES({ts}), %s), FALSE))"
            stored_newer = f"STR_TO_DATE({ts}, %s) > STR_TO_DATE(%s, %s)"
            fmts = [self.cfg.timestamp_format] * 2
        fixed = {self.fixed(f) for f in COLUMN_FIXED} | {INSTANT_COLUMN}
        sets: list[str] = []
        params: list[Any] = []
        for c in cols:
            if c in keys or c == ts_name:
                continue
            qc = self.q(c)
            if c in fixed:
                sets.append(f"{qc} = IF({newer}, VALUES({qc}), {qc})")
            else:
                attr = (
                    c[: -len(MD_SUFFIX)] if c.endswith(MD_SUFFIX) and c[: -len(MD_SUFFIX)] in batch.attr_columns else c
                )
                md = self.q(attr + MD_SUFFIX)
                sets.append(f"{qc} = IF({newer} AND VALUES({md}) IS NOT NULL, VALUES({qc}), {qc})")
            params += fmts
        # The timestamp column last: MySQL applies assignments left to right, and every condition
        # above compares against the stored timestamp.
        if ts_name not in keys:
            if ts_name in fixed:
                sets.append(f"{ts} = IF({newer}, VALUES({ts}), {ts})")
            else:
                md = self.q(ts_name + MD_SUFFIX)
                sets.append(f"{ts} = IF({newer} AND VALUES({md}) IS NOT NULL, VALUES({ts}), {ts})")
            params += fmts
        written = 0
        upserts = (v[:-1] for v in self.values(batch) if v[-1] == OP_UPSERT)
        for chunk in self._chunks(upserts):
            sql = self._insert_sql(batch, cols, len(chunk)) + " ON DUPLICATE KEY UPDATE " + ", ".join(sets)
            cur.execute(sql, [v for r in chunk for v in r] + params)
            written += len(chunk)
        ts_idx = cols.index(ts_name)
        key_match = " AND ".join(f"{self.q(k)} = %s" for k in keys)
        deletes = [
            (*[v[i] for i in key_idx], *([v[ts_idx]] if self.job.by_instant else [fmts[0], v[ts_idx], fmts[0]]))
            for v in self.values(batch)
            if v[-1] == OP_DELETE
        ]
        if deletes:
            cur.executemany(
                f"DELETE FROM {table} WHERE {key_match} AND NOT COALESCE({stored_newer}, FALSE)",
                deletes,
            )
            written += len(deletes)
        return written

    def delete_oldest(self, cur: Any, batch: TableBatch, order: str, count: int) -> None:
        cur.execute(f"DELETE FROM {self.qt(batch)} ORDER BY {order} LIMIT %s", (count,))


_WRITERS: dict[Dialect, type[_Writer]] = {Dialect.POSTGRESQL: _PostgresWriter, Dialect.MYSQL: _MySQLWriter}


def rows_by_table(stats: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``{"db.table": rows}`` (``database/db.table`` for a database per service) summed over writer stats."""
    out: dict[str, int] = {}
    for s in stats:
        key = (f"{s['database']}/" if s.get("database") else "") + f"{s['db']}.{s['table']}"
        out[key] = out.get(key, 0) + int(s["rows"])
    return dict(sorted(out.items()))


def write_dataframe(rows: Any, job: WriteJob, order: Sequence[str], partitions: int | None = None) -> list[dict]:
    """Write a Spark DataFrame of sink rows from the executors; returns the per-table stats.

    Rows are clustered by (database, db, table) so a table is written by one task (one transaction), and
    sorted by ``order`` (table, then key) inside each partition. Only the per-table stats, one small
    dict per table, come back to the driver.

    ``partitions``: how many tasks write; by default the session's shuffle partitions, which adaptive
    execution coalesces when the rows are few (an increment's: one task and one connection per
    server rather than one per shuffle partition, most of them empty).
    """
    from ngsi_assets.sinks.executors import on_each_partition
    from ngsi_assets.transforms.partitioning import cluster_by

    by_table = [c for c in ("database", "db", "table") if c in rows.columns]
    shaped = cluster_by(rows, *by_table, partitions=partitions).sortWithinPartitions(
        *[c for c in order if c in rows.columns]
    )
    return on_each_partition(shaped, lambda part: write_rows(part, job))
