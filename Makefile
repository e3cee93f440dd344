# fairway's entry points. `make run` and `make test` need only Rust and the PostgreSQL server
# binaries (Debian/Ubuntu: apt-get install postgresql); nothing has to be running.

CARGO ?= cargo
# The throwaway cluster `make test` starts when DATABASE_URL is not set.
TEST_PG_DATA ?= target/test-postgres
# Test-only Python tools (the OpenAPI validator and Schemathesis), kept out of the system.
PYTOOLS := target/pytools
PYTOOLS_READY := $(PYTOOLS)/.installed

.PHONY: run test lint bench bench-quick demo

## Build and start the broker on 127.0.0.1:8080, on its private PostgreSQL unless DATABASE_URL is set.
run:
	$(CARGO) run --release -- serve

## Run every test against a real PostgreSQL: DATABASE_URL if set, else a throwaway cluster.
test: export FAIRWAY_REQUIRE_TOOLS = 1
test: $(PYTOOLS_READY)
ifdef DATABASE_URL
	$(CARGO) test --all-targets
else
	$(CARGO) build --bin fairway
	./target/debug/fairway postgres --data-dir $(TEST_PG_DATA) --ephemeral -- $(CARGO) test --all-targets
endif

$(PYTOOLS_READY): Makefile
	python3 -m venv $(PYTOOLS)
	$(PYTOOLS)/bin/pip install --quiet --disable-pip-version-check \
		schemathesis==4.32.5 openapi-spec-validator==0.9.0
	touch $@

## Measure the broker beside its baselines (about 9 minutes on 2 cores); results in docs/bench/.
bench:
	$(CARGO) run --release -- bench --json docs/bench/results.json

## The two-minute smoke version, on a throwaway cluster unless DATABASE_URL is set.
bench-quick:
	$(CARGO) build --release --bin fairway
ifdef DATABASE_URL
	./target/release/fairway bench --quick --json target/bench-quick/results.json
else
	./target/release/fairway postgres --data-dir target/bench-postgres --ephemeral -- \
		./target/release/fairway bench --quick --json target/bench-quick/results.json
endif

## What CI checks besides the tests.
lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) check --tests --features containers

## Fair sharing, shown: a broker on a throwaway cluster, worker pods, and three users arriving
## in turn; draws each user's share of the workers in docs/demo/shares.svg (about 40 s).
demo:
	$(CARGO) build --release --bin fairway
	./target/release/fairway postgres --data-dir target/demo-postgres --ephemeral -- sh -c '\
		./target/release/fairway serve --bind 127.0.0.1:8091 & broker=$$!; \
		./target/release/fairway demo --url http://127.0.0.1:8091; status=$$?; \
		kill $$broker; wait $$broker; exit $$status'
