#!/usr/bin/env bash
# The project's test command (`make test`): makes a fresh Debian 12 machine ready, then runs pytest.
#
# Installs only what is missing (the servers the integration tests start, the JDBC jars Spark uses,
# Python 3.11 and Java 17), creates .venv, installs the project with its test extra, and runs
# .venv/bin/pytest with every argument passed through. The test session itself starts throwaway
# PostgreSQL, MariaDB and MongoDB-wire servers (tests/support/servers.py) and stops them at the end.
# Tests run in NGSI_TEST_WORKERS processes (pytest-xdist, default 2; 0 runs them in pytest's own),
# each with its own servers and Spark session, a test module's tests all in the same process: much
# of a test's time is latency (Dagster runs, small Spark jobs), which two processes overlap. Files
# are handed out in the order tests/conftest.py sorts them (slowest first; --no-loadscope-reorder
# stops xdist from reordering them by their number of tests).
# Exits with pytest's exit code; "no tests collected" (5) is a failure like any other non-zero code.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

missing_packages() {
    [[ -x /usr/lib/postgresql/15/bin/postgres ]] || echo postgresql-15
    [[ -f /usr/share/postgresql/15/extension/postgis.control ]] || echo postgresql-15-postgis-3
    [[ -x /usr/sbin/mariadbd ]] || command -v mariadbd >/dev/null 2>&1 || echo mariadb-server
    [[ -f /usr/share/java/postgresql.jar ]] || echo libpostgresql-jdbc-java
    [[ -f /usr/share/java/mariadb-java-client.jar ]] || echo libmariadb-java
    runtime_packages
}

mapfile -t packages < <(missing_packages)
if [[ ${#packages[@]} -gt 0 ]]; then
    apt_install "${packages[@]}"
fi
ensure_venv test

rc=0
.venv/bin/pytest -n "${NGSI_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    log "pytest collected no tests: failing"
fi
exit "$rc"
