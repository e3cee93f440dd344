#!/usr/bin/env bash
# What `make test` needs besides Rust, checked before anything builds: every missing piece is
# named in one message, with the Debian package that brings it, rather than met one failing
# test at a time. Exits 1 when anything is missing.
set -u
missing=()
need() { # WHAT PACKAGE TEST...
  local what=$1 package=$2
  shift 2
  "$@" >/dev/null 2>&1 || missing+=("$what (Debian: $package)")
}
has_initdb() {
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb
}
has_pgtap() {
  compgen -G '/usr/share/postgresql/*/extension/pgtap.control' >/dev/null
}
need "cargo" "cargo" command -v cargo
need "the PostgreSQL server binaries" "postgresql" has_initdb
need "the pgtap extension, for the server functions' SQL tests" "postgresql-15-pgtap" has_pgtap
need "pg_prove, which runs those tests" "libtap-parser-sourcehandler-pgtap-perl" \
  command -v pg_prove
need "chromium, for the dashboard's browser tests" "chromium" test -x /usr/bin/chromium
need "chromedriver, which drives it" "chromium-driver" test -x /usr/bin/chromedriver
need "python3 with venv, for the test tools and the Python client" "python3-venv" \
  python3 -c 'import ensurepip, venv'
need "openssl, which makes the Python HTTPS tests' CA" "openssl" command -v openssl
# kubectl comes from `apt-get download kubernetes-client`, which needs the package lists.
need "the package lists that hold kubernetes-client" "run apt-get update" \
  apt-cache show kubernetes-client
if [ ${#missing[@]} -gt 0 ]; then
  printf 'make test needs what this machine lacks:\n' >&2
  printf '  - %s\n' "${missing[@]}" >&2
  printf 'On Debian or Ubuntu: apt-get update && apt-get install postgresql chromium chromium-driver python3-venv openssl postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl\n' >&2
  exit 1
fi
