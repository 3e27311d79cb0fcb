#!/usr/bin/env bash
# The project's test command (`make test`): makes a fresh Debian 12 machine ready, then runs pytest.
#
# Installs only what is missing (the servers the integration tests start, the JDBC jars Spark uses,
# Python 3.11 and Java 17), creates .venv, installs the project with its test extra, and runs
# .venv/bin/pytest with every argument passed through. The test session itself starts throwaway
# PostgreSQL, MariaDB and MongoDB-wire servers (tests/support/servers.py) and stops them at the end.
# Exits with pytest's exit code; "no tests collected" (5) is a failure like any other non-zero code.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive

log() { printf 'test.sh: %s\n' "$*" >&2; }

missing_packages() {
    local pkgs=()
    [[ -x /usr/lib/postgresql/15/bin/postgres ]] || pkgs+=(postgresql-15)
    [[ -x /usr/sbin/mariadbd ]] || command -v mariadbd >/dev/null 2>&1 || pkgs+=(mariadb-server)
    [[ -f /usr/share/java/postgresql.jar ]] || pkgs+=(libpostgresql-jdbc-java)
    [[ -f /usr/share/java/mariadb-java-client.jar ]] || pkgs+=(libmariadb-java)
    command -v java >/dev/null 2>&1 || pkgs+=(openjdk-17-jre-headless)
    if ! command -v python3.11 >/dev/null 2>&1; then
        pkgs+=(python3.11 python3.11-venv)
    elif [[ ! -x .venv/bin/python ]] && ! python3.11 -c 'import ensurepip' >/dev/null 2>&1; then
        pkgs+=(python3.11-venv)
    fi
    if [[ ${#pkgs[@]} -gt 0 ]]; then
        printf '%s\n' "${pkgs[@]}"
    fi
}

install_packages() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            log "missing system packages: $*; install them as root (apt-get install -y $*)"
            exit 1
        fi
    fi
    # The tests start their own throwaway servers; keep the packages' system services from starting
    # (and being left running) during the install. Docker images already ship this policy file.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    log "installing system packages: $*"
    local rc=0
    "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" || rc=$?
    if [[ $made_policy -eq 1 ]]; then
        "${sudo[@]}" rm -f "$policy"
    fi
    return "$rc"
}

mapfile -t packages < <(missing_packages)
if [[ ${#packages[@]} -gt 0 ]]; then
    install_packages "${packages[@]}"
fi

if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv with python3.11"
    python3.11 -m venv .venv
fi

# Reinstall only when the project's metadata changed: an editable install that is already in place
# picks up source changes by itself, and skipping pip keeps repeated runs fast.
stamp=.venv/.ngsi-assets-installed
want=$(cat pyproject.toml <(.venv/bin/python -VV) | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    log "installing the project into .venv (pip install -e '.[test]')"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    printf '%s\n' "$want" >"$stamp"
fi

PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
export PYSPARK_PYTHON

rc=0
.venv/bin/pytest "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    log "pytest collected no tests: failing"
fi
exit "$rc"
