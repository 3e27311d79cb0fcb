"""Throwaway database servers for the test session: PostgreSQL, MariaDB and a MongoDB-wire server.

Each session fixture yields a server URL. When ``POSTGRES_URL``, ``MYSQL_URL`` or ``MONGO_URL`` is set,
the fixture yields that URL and starts nothing (the user in it needs the right to create and drop
databases). Otherwise it starts a server of its own on a free 127.0.0.1 port with its data in a temp
directory, waits until the server answers, and at the end of the session stops it and deletes the
directory; an ``atexit`` hook does the same if the session dies before its teardown runs.

- PostgreSQL: the cluster is initialised and run as the ``postgres`` system user when the tests run
  as root (PostgreSQL refuses root), with password (SCRAM) authentication on loopback TCP only.
- MariaDB: ``mariadb-install-db`` into the temp dir, ``mariadbd`` on loopback TCP, and a real user
  with a password (never ``--skip-grant-tables``).
- MongoDB wire: SecantusDB's Python server (``python -m secantus``, a GPL test-only dependency)
  advertising itself as a single-node replica set, so multi-document transactions work.

Tests that must not see each other's tables take a database of their own from
``fresh_postgres_database`` / ``fresh_mysql_database`` / ``fresh_mongo_database`` (context managers),
or from the function-scoped fixtures ``postgres_db_url`` / ``mysql_db_url`` / ``mongo_db_url`` built
on them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg2
import pymongo
import pymysql
import pytest
from psycopg2 import sql as pgsql

STARTUP_TIMEOUT_S = float(os.environ.get("NGSI_TEST_SERVER_TIMEOUT", "90"))
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 40
# A port picked free can be taken by another process before the server binds it; retry then.
PORT_ATTEMPTS = 3

PG_USER = "ngsi"
PG_PASSWORD = "ngsi-test-pw"
PG_DATABASE = "ngsi_test"
MYSQL_USER = "ngsi"
MYSQL_PASSWORD = "ngsi-test-pw"
MYSQL_DATABASE = "ngsi_test"


class ServerStartError(RuntimeError):
    """A throwaway test server did not come up; the message carries the tail of its log."""

    def __init__(self, message: str, *, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique_name(prefix: str = "t") -> str:
    """A fresh lower-case identifier, valid unquoted as a PostgreSQL/MySQL/MongoDB database name."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


@dataclass
class ServerProcess:
    """One running server process and the temp directory that holds its data and log."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    stop_signal: int = signal.SIGTERM
    # Signal the whole process group (a launcher script whose server is its child, not its exec).
    signal_group: bool = False
    # How to start the server process again on its data (``halt`` then ``start_again``: fault runs).
    launch: Callable[[], subprocess.Popen[bytes]] | None = None
    probe: Callable[[], None] | None = None
    _stopped: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the server (politely, then by force) and delete its directory; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.signal_group:
                    os.killpg(self.process.pid, self.stop_signal)
                else:
                    self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # The server runs in its own process group: take its helpers down with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def halt(self, sig: int | None = None) -> None:
        """Stop the server's processes, keeping its data and port, to start it again later.

        ``sig`` defaults to the server's polite stop; ``signal.SIGKILL`` is a crash: the whole process
        group is killed at once, as when the machine loses the server.
        """
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL or self.signal_group:
                os.killpg(self.process.pid, sig or self.stop_signal)
            else:
                self.process.send_signal(sig or self.stop_signal)
        self.process.wait(timeout=STOP_TIMEOUT_S)
        if sig == signal.SIGKILL:  # helpers that outlived their parent (PostgreSQL's backends)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Stop the server's processes with SIGSTOP for the block, then let them go on: its connections
        stay open and its kernel still acknowledges packets, but nothing answers, as with a hung server
        or a network partition."""
        os.killpg(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self.process.pid, signal.SIGCONT)

    def start_again(self) -> None:
        """Start the server again on its data and port after ``halt``, and wait until it answers."""
        if self.launch is None or self.probe is None:
            raise ServerStartError(f"{self.name} cannot be started again")
        self.process = self.launch()
        self.wait_ready(self.probe)

    def wait_ready(self, probe: Callable[[], None], timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Call ``probe`` until it succeeds; raise ServerStartError with the log tail if it never does."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited with code {self.process.returncode} before accepting "
                    f"connections on port {self.port}; last lines of its log:\n{log_tail(self.log_path)}",
                    port_taken=self._port_was_taken(),
                )
            try:
                probe()
                return
            except Exception as exc:  # any failure means "not ready yet" until the deadline
                last_error = exc
            time.sleep(0.2)
        raise ServerStartError(
            f"{self.name} did not accept connections within {timeout:.0f}s "
            f"(last error: {last_error!r}); last lines of its log:\n{log_tail(self.log_path)}"
        )

    def _port_was_taken(self) -> bool:
        text = log_tail(self.log_path, lines=200).lower()
        return "address already in use" in text or "errno 98" in text


def _traversable_by_anyone(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def _make_workdir(name: str, owner: str | None) -> Path:
    base = Path(tempfile.gettempdir()).resolve()
    if owner is not None and not _traversable_by_anyone(base):
        # A server run as another user must reach its directory: fall back from a private $TMPDIR.
        base = Path("/tmp")
    workdir = Path(tempfile.mkdtemp(prefix=f"ngsi-test-{name}-", dir=base))
    if owner is not None:
        entry = pwd.getpwnam(owner)
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
    return workdir


def _launch(cmd: list[str], log_path: Path, workdir: Path, **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a server process in a process group of its own, its output appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            process_group=0,
            **popen_kwargs,
        )


def _run_setup_step(cmd: list[str], log_path: Path, what: str, **popen_kwargs: Any) -> None:
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        result = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False, **popen_kwargs
        )
    if result.returncode != 0:
        raise ServerStartError(
            f"{what} failed with code {result.returncode}; last lines of its log:\n{log_tail(log_path)}"
        )


def _start_with_port_retries(start: Callable[[int], ServerProcess]) -> ServerProcess:
    """Start a server on a free port, retrying with another port if the picked one was taken."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start(free_port())
        except ServerStartError as exc:
            if not exc.port_taken or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _ready_or_stop(server: ServerProcess, probe: Callable[[], None]) -> ServerProcess:
    server.probe = probe
    try:
        server.wait_ready(probe)
    except BaseException:
        server.stop()
        raise
    return server


# --------------------------------------------------------------------------------------------------
# PostgreSQL


def _postgres_bindir() -> Path:
    explicit = os.environ.get("PG_BINDIR")
    candidates = [Path(explicit)] if explicit else []
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "postgres").exists():
            return bindir
    raise ServerStartError(
        "no PostgreSQL server binaries found (looked in $PG_BINDIR, /usr/lib/postgresql/*/bin and PATH); "
        "run scripts/test.sh, which installs postgresql-15, or set POSTGRES_URL to a running server"
    )


def _server_user(system_user: str) -> str | None:
    """The system user to run a server as: ``system_user`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(system_user)
    except KeyError as exc:
        raise ServerStartError(
            f"running as root but the system user {system_user!r} does not exist; install the server "
            "package (scripts/test.sh does) or run the tests as an unprivileged user"
        ) from exc
    return system_user


def start_postgres() -> ServerProcess:
    """Start a throwaway PostgreSQL cluster; its URL is ``postgres_server_url(server)``."""
    bindir = _postgres_bindir()
    run_as = _server_user("postgres")
    # Popen switches user itself (no runuser wrapper), so the server is our direct child to signal.
    as_user: dict[str, Any] = (
        {"user": run_as, "group": pwd.getpwnam(run_as).pw_gid, "extra_groups": []} if run_as else {}
    )

    def start(port: int) -> ServerProcess:
        workdir = _make_workdir("postgres", run_as)
        data, sockets, log_path = workdir / "data", workdir / "sock", workdir / "postgres.log"
        pwfile = workdir / "pwfile"
        try:
            pwfile.write_text(PG_PASSWORD + "\n")
            sockets.mkdir()
            log_path.touch()
            if run_as:
                entry = pwd.getpwnam(run_as)
                for path in (pwfile, sockets, log_path):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            _run_setup_step(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_USER,
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                log_path,
                "initdb",
                cwd=workdir,
                **as_user,
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

        def launch() -> subprocess.Popen[bytes]:
            return _launch(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-k",
                    str(sockets),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=100",
                    "-c",
                    "timezone=UTC",
                ],
                log_path,
                workdir,
                **as_user,
            )

        # SIGINT is PostgreSQL's "fast" shutdown: it does not wait for clients a test left open.
        server = ServerProcess(
            "PostgreSQL", launch(), port, workdir, log_path, stop_signal=signal.SIGINT, launch=launch
        )

        def probe() -> None:
            psycopg2.connect(
                host="127.0.0.1", port=port, user=PG_USER, password=PG_PASSWORD, dbname="postgres", connect_timeout=2
            ).close()

        return _ready_or_stop(server, probe)

    server = _start_with_port_retries(start)
    try:
        conn = psycopg2.connect(
            host="127.0.0.1", port=server.port, user=PG_USER, password=PG_PASSWORD, dbname="postgres"
        )
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(PG_DATABASE)))
        finally:
            conn.close()
    except BaseException:
        server.stop()
        raise
    return server


def postgres_server_url(server: ServerProcess) -> str:
    return f"postgresql://{PG_USER}:{quote(PG_PASSWORD, safe='')}@127.0.0.1:{server.port}/{PG_DATABASE}"


# --------------------------------------------------------------------------------------------------
# MariaDB


def _mariadb_binaries() -> tuple[Path, Path]:
    install_db = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    daemon = next(
        (p for p in (shutil.which("mariadbd"), "/usr/sbin/mariadbd", "/usr/sbin/mysqld") if p and Path(p).exists()),
        None,
    )
    if not install_db or not daemon:
        raise ServerStartError(
            "MariaDB server binaries not found (mariadb-install-db, mariadbd); run scripts/test.sh, which "
            "installs mariadb-server, or set MYSQL_URL to a running server"
        )
    return Path(install_db), Path(daemon)


def start_mariadb() -> ServerProcess:
    """Start a throwaway MariaDB server; its URL is ``mysql_server_url(server)``."""
    install_db, daemon = _mariadb_binaries()
    run_as = _server_user("mysql")

    def start(port: int) -> ServerProcess:
        workdir = _make_workdir("mariadb", run_as)
        data, log_path = workdir / "data", workdir / "mariadb.log"
        sock = workdir / "mysqld.sock"
        # Options shared by the bootstrap and the server: small and unsynced, as fits a test server.
        common = [
            f"--datadir={data}",
            f"--tmpdir={workdir}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=0",
            "--innodb-doublewrite=0",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
        ]
        user_opt = [f"--user={run_as}"] if run_as else []
        try:
            log_path.touch()
            if run_as:
                entry = pwd.getpwnam(run_as)
                os.chown(log_path, entry.pw_uid, entry.pw_gid)
            _run_setup_step(
                [
                    str(install_db),
                    "--no-defaults",
                    *user_opt,
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    *common,
                ],
                log_path,
                "mariadb-install-db",
                cwd=workdir,
            )
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

        def launch() -> subprocess.Popen[bytes]:
            return _launch(
                [
                    str(daemon),
                    "--no-defaults",
                    *user_opt,
                    *common,
                    f"--port={port}",
                    "--bind-address=127.0.0.1",
                    f"--socket={sock}",
                    f"--pid-file={workdir / 'mariadbd.pid'}",
                    f"--log-error={log_path}",
                    "--skip-log-bin",
                    "--default-time-zone=+00:00",
                ],
                log_path,
                workdir,
            )

        server = ServerProcess("MariaDB", launch(), port, workdir, log_path, launch=launch)

        def probe() -> None:
            pymysql.connect(unix_socket=str(sock), user="root", password="", connect_timeout=2).close()

        server = _ready_or_stop(server, probe)
        try:
            conn = pymysql.connect(unix_socket=str(sock), user="root", password="", autocommit=True)
            with conn, conn.cursor() as cur:
                # Tests connect over TCP from 127.0.0.1; '%' also covers a client that reports ::1.
                for host in ("127.0.0.1", "%"):
                    cur.execute("CREATE USER %s@%s IDENTIFIED BY %s", (MYSQL_USER, host, MYSQL_PASSWORD))
                    cur.execute("GRANT ALL PRIVILEGES ON *.* TO %s@%s WITH GRANT OPTION", (MYSQL_USER, host))
                cur.execute(f"CREATE DATABASE `{MYSQL_DATABASE}` CHARACTER SET utf8mb4")
        except BaseException:
            server.stop()
            raise
        return server

    return _start_with_port_retries(start)


def mysql_server_url(server: ServerProcess) -> str:
    return f"mysql://{MYSQL_USER}:{quote(MYSQL_PASSWORD, safe='')}@127.0.0.1:{server.port}/{MYSQL_DATABASE}"


# --------------------------------------------------------------------------------------------------
# MongoDB wire (SecantusDB)


def start_secantus() -> ServerProcess:
    """Start SecantusDB's MongoDB-wire server; its URL is ``mongo_server_url(server)``."""
    try:
        import secantus  # noqa: F401  (only to fail early with a clear message; it runs in a child)
    except ImportError as exc:
        raise ServerStartError(
            "SecantusDB is not installed (pip install -e '.[test]'); or set MONGO_URL to a running MongoDB"
        ) from exc

    def start(port: int) -> ServerProcess:
        workdir = _make_workdir("secantus", None)
        log_path = workdir / "secantus.log"
        # An explicit (empty) config file turns off the daemon's discovery of ./secantusd.toml,
        # ~/.secantus/ and /etc/secantus/, so nothing on the machine changes the test server.
        config = workdir / "secantusd.toml"
        config.write_text("")

        def launch() -> subprocess.Popen[bytes]:
            return _launch(
                [
                    sys.executable,
                    "-m",
                    "secantus",
                    "--config",
                    str(config),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--storage-path",
                    str(workdir / "data"),
                    "--cache-size",
                    "128M",
                    "--log-level",
                    "WARNING",
                ],
                log_path,
                workdir,
            )

        server = ServerProcess("SecantusDB", launch(), port, workdir, log_path, launch=launch)

        def probe() -> None:
            with pymongo.MongoClient(
                f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, connectTimeoutMS=1000
            ) as client:
                client.admin.command("ping")

        return _ready_or_stop(server, probe)

    return _start_with_port_retries(start)


def mongo_server_url(server: ServerProcess) -> str:
    return f"mongodb://127.0.0.1:{server.port}/"


# --------------------------------------------------------------------------------------------------
# Session fixtures


def _server_url(env_var: str, start: Callable[[], ServerProcess], url: Callable[[ServerProcess], str]) -> Iterator[str]:
    external = os.environ.get(env_var)
    if external:
        yield external
        return
    server = start()
    try:
        yield url(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """``postgresql://user:password@127.0.0.1:PORT/ngsi_test`` of a throwaway server, or $POSTGRES_URL."""
    yield from _server_url("POSTGRES_URL", start_postgres, postgres_server_url)


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    """``mysql://user:password@127.0.0.1:PORT/ngsi_test`` of a throwaway MariaDB, or $MYSQL_URL."""
    yield from _server_url("MYSQL_URL", start_mariadb, mysql_server_url)


@pytest.fixture(scope="session")
def mongo_url() -> Iterator[str]:
    """``mongodb://127.0.0.1:PORT/`` of a throwaway SecantusDB server, or $MONGO_URL."""
    yield from _server_url("MONGO_URL", start_secantus, mongo_server_url)


# --------------------------------------------------------------------------------------------------
# Per-test databases


def with_database(url: str, database: str) -> str:
    """``url`` with its path (the database) replaced by ``database``; the query string is kept."""
    return urlsplit(url)._replace(path="/" + quote(database, safe="")).geturl()


def _pg_admin_connect(server_url: str) -> psycopg2.extensions.connection:
    parts = urlsplit(server_url)
    conn = psycopg2.connect(
        host=parts.hostname,
        port=parts.port or 5432,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        dbname=unquote(parts.path.lstrip("/")) or "postgres",
        connect_timeout=10,
    )
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def fresh_postgres_database(server_url: str, prefix: str = "t") -> Iterator[str]:
    """Create an empty database on the server of ``server_url``; yield its URL; drop it afterwards."""
    name = unique_name(prefix)
    conn = _pg_admin_connect(server_url)
    try:
        with conn.cursor() as cur:
            cur.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        yield with_database(server_url, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
        conn.close()


@contextlib.contextmanager
def fresh_mysql_database(server_url: str, prefix: str = "t") -> Iterator[str]:
    """Create an empty utf8mb4 database (schema) on the server; yield its URL; drop it afterwards."""
    name = unique_name(prefix)
    parts = urlsplit(server_url)
    conn = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        autocommit=True,
        connect_timeout=10,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        yield with_database(server_url, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


@contextlib.contextmanager
def fresh_mongo_database(server_url: str, prefix: str = "t") -> Iterator[str]:
    """Yield the URL of a database no one has used (``mongodb://.../NAME``); drop it afterwards."""
    name = unique_name(prefix)
    try:
        yield with_database(server_url, name)
    finally:
        with pymongo.MongoClient(server_url, serverSelectionTimeoutMS=10_000) as client:
            client.drop_database(name)


@pytest.fixture
def postgres_db_url(postgres_url: str) -> Iterator[str]:
    """URL of an empty PostgreSQL database for this test alone."""
    with fresh_postgres_database(postgres_url) as url:
        yield url


@pytest.fixture
def mysql_db_url(mysql_url: str) -> Iterator[str]:
    """URL of an empty MySQL/MariaDB database for this test alone."""
    with fresh_mysql_database(mysql_url) as url:
        yield url


@pytest.fixture
def mongo_db_url(mongo_url: str) -> Iterator[str]:
    """URL (with the database in its path) of a MongoDB database for this test alone."""
    with fresh_mongo_database(mongo_url) as url:
        yield url
