# Shared set-up for scripts/*.sh (sourced, not run): a project .venv with the package installed.

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

# apt_install PKG...: install Debian packages (as root, or through sudo) without starting services.
apt_install() {
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
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" || rc=$?
    if [[ $made_policy -eq 1 ]]; then
        "${sudo[@]}" rm -f "$policy"
    fi
    return "$rc"
}

# runtime_packages: the Debian packages Spark and the venv need, one per line, when missing.
runtime_packages() {
    command -v java >/dev/null 2>&1 || echo openjdk-17-jre-headless
    # javac builds the local lake's file system without a process per file (resources/local_fs.py).
    command -v javac >/dev/null 2>&1 || echo openjdk-17-jdk-headless
    if ! command -v python3.11 >/dev/null 2>&1; then
        printf '%s\n' python3.11 python3.11-venv
    elif [[ ! -x .venv/bin/python ]] && ! python3.11 -c 'import ensurepip' >/dev/null 2>&1; then
        echo python3.11-venv
    fi
}

# ensure_venv [EXTRA]: .venv with the project installed editable (with the extra, e.g. "test").
# Reinstalls only when pyproject.toml or the interpreter changed: an editable install picks up source
# changes by itself, and skipping pip keeps repeated runs fast.
ensure_venv() {
    local extra=${1:-}
    if [[ ! -x .venv/bin/python ]]; then
        log "creating .venv with python3.11"
        python3.11 -m venv .venv
    fi
    local spec=. stamp=.venv/.ngsi-assets-installed
    [[ -n $extra ]] && spec=".[$extra]" && stamp="$stamp-$extra"
    local want
    want=$(cat pyproject.toml <(.venv/bin/python -VV) | sha256sum | cut -d' ' -f1)
    if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
        log "installing the project into .venv (pip install -e '$spec')"
        # A machine whose pip configuration names local index folders that do not exist makes pip
        # say so once per package and folder (hundreds of lines); exactly that notice is dropped.
        .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec" \
            2> >(grep -v -E "^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$" >&2)
        printf '%s\n' "$want" >"$stamp"
    fi
    PYSPARK_PYTHON="$(pwd)/.venv/bin/python"
    PYSPARK_DRIVER_PYTHON="$PYSPARK_PYTHON"
    export PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON
}

# prepare_runtime [EXTRA]: what the main job and the dev server need: Java, Python's venv, .venv.
prepare_runtime() {
    local packages
    mapfile -t packages < <(runtime_packages)
    if [[ ${#packages[@]} -gt 0 ]]; then
        apt_install "${packages[@]}"
    fi
    ensure_venv "$@"
}
