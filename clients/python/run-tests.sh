#!/usr/bin/env bash
# The Python client's checks, in a virtualenv under the repository's target/ (kept out of the
# system): the package installed editable with its [harmony] extra and the dev tools.
#
#   clients/python/run-tests.sh lint           ruff check, ruff format --check, mypy
#   clients/python/run-tests.sh test [ARGS]    pytest (ARGS go to pytest)
#   clients/python/run-tests.sh all            both
#   clients/python/run-tests.sh venv           only create or update the virtualenv
#
# The tests start their own brokers on a throwaway PostgreSQL: FAIRWAY_BIN names the fairway
# binary (default: target/release/fairway, else target/debug/fairway). With
# FAIRWAY_REQUIRE_TOOLS=1 a missing binary or harmony-service-lib fails the tests rather than
# skipping them. PYTHON picks the interpreter the virtualenv is made from (python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${FAIRWAY_PY_VENV:-$root/target/pyclient-venv}
caches=$root/target/pyclient-cache
stamp=$venv/.fairway-client-installed

venv() {
    if [ ! -x "$venv/bin/python" ]; then
        python=${PYTHON:-python3}
        # The package supports 3.9 and later; say so rather than fail somewhere in pip.
        if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
            echo "$0: the Python client needs Python 3.9 or later; $python is $("$python" -V 2>&1)" >&2
            exit 1
        fi
        # Debian's python3 makes a virtualenv only with python3-venv (.ci/run installs it).
        if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
            echo "$0: $python cannot make a virtualenv: apt-get install python3-venv" >&2
            exit 1
        fi
        "$python" -m venv "$venv"
    fi
    # Reinstall when the package's requirements changed since the last install.
    if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ] ||
        [ "$here/constraints.txt" -nt "$stamp" ]; then
        "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip
        "$venv/bin/pip" install --quiet --disable-pip-version-check \
            -c "$here/constraints.txt" -e "$here[harmony,dev]"
        touch "$stamp"
    fi
}

lint() {
    cd "$here"
    export RUFF_CACHE_DIR=$caches/ruff MYPY_CACHE_DIR=$caches/mypy
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    "$venv/bin/mypy"
}

tests() {
    cd "$here"
    if [ -n "${FAIRWAY_BIN:-}" ]; then
        FAIRWAY_BIN=$(cd "$root" && realpath "$FAIRWAY_BIN")
        export FAIRWAY_BIN
    fi
    PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -o cache_dir="$caches/pytest" "$@"
}

command=${1:-all}
[ $# -gt 0 ] && shift
case "$command" in
    venv) venv ;;
    lint) venv && lint ;;
    test) venv && tests "$@" ;;
    all) venv && lint && tests "$@" ;;
    *)
        echo "usage: $0 [lint|test|all|venv] [pytest arguments]" >&2
        exit 2
        ;;
esac
