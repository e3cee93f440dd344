# fairway's entry points. `make run` needs only Rust and the PostgreSQL server binaries; `make
# test` also pgTAP with pg_prove, a headless Chromium, python3-venv and openssl (the README's
# Debian line, checked by tests/requirements.sh). Nothing has to be running.

CARGO ?= cargo
# The throwaway cluster `make test` starts when DATABASE_URL is not set.
TEST_PG_DATA ?= target/test-postgres
# Test-only Python tools (tests/requirements.txt: the OpenAPI validator, Schemathesis, the
# Prometheus parser, the manifests' validators), in a virtualenv under target/, kept out of the
# system.
PYTOOLS := target/pytools
PYTOOLS_READY := $(PYTOOLS)/.installed
# Debian's kubernetes-client (kubectl 1.20 and the old kustomize it carries, which the manifests
# in k8s/ keep to), unpacked under target/ rather than installed: a machine's own kubectl, if
# any, stays as it is.
KUBECTL ?= target/kubernetes-client/usr/bin/kubectl
# Where the tests find both.
TEST_TOOLS = FAIRWAY_TEST_PYTHON=$(abspath $(PYTOOLS))/bin/python FAIRWAY_TEST_KUBECTL=$(abspath $(KUBECTL))

# Test-only code the tests compile in: crates/fairway-broker/src/faults.rs.
TEST_FEATURES := --features fairway/fault-injection

.PHONY: run test requirements lint bench bench-quick bench-scale demo k8s-validate chaos soak version upgrade-test

## Build and start the broker on 127.0.0.1:8080, on its private PostgreSQL unless DATABASE_URL is set.
run:
	$(CARGO) run --release -- serve

## Run every test against a real PostgreSQL: DATABASE_URL if set, else a throwaway cluster.
## The tests build with the test-only `fault-injection` feature (forced deadlocks); `make run`,
## `make bench` and release builds never do.
## Then the Python client's tests (clients/python), with that binary's brokers on a PostgreSQL
## of their own, in a virtualenv under target/.
## What the tests need is checked first (tests/requirements.sh), and a failing test binary does
## not stop the others (--no-fail-fast).
test: export FAIRWAY_REQUIRE_TOOLS = 1
test: requirements $(PYTOOLS_READY) $(KUBECTL)
ifdef DATABASE_URL
	$(TEST_TOOLS) $(CARGO) test --no-fail-fast --workspace --all-targets $(TEST_FEATURES)
else
	$(CARGO) build --bin fairway
	$(TEST_TOOLS) ./target/debug/fairway postgres --data-dir $(TEST_PG_DATA) --ephemeral -- $(CARGO) test --no-fail-fast --workspace --all-targets $(TEST_FEATURES)
endif
	FAIRWAY_BIN=target/debug/fairway clients/python/run-tests.sh test

## Render and validate each overlay in k8s/ (the tests do this too, and check it against the binary).
k8s-validate: $(PYTOOLS_READY) $(KUBECTL)
	for dir in overlays/dev overlays/production autoscaling/hpa; do \
		$(PYTOOLS)/bin/python tests/validate_manifests.py $(KUBECTL) k8s/$$dir >/dev/null || exit 1; \
	done

requirements:
	@tests/requirements.sh

$(PYTOOLS_READY): tests/requirements.txt
	python3 -m venv $(PYTOOLS)
	$(PYTOOLS)/bin/pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	touch $@

$(KUBECTL):
	rm -rf target/kubernetes-client && mkdir -p target/kubernetes-client
	cd target/kubernetes-client && apt-get download kubernetes-client && dpkg-deb -x kubernetes-client_*.deb .

## Measure the broker beside its baselines (about 13 minutes on 2 cores); results in docs/bench/.
bench:
	$(CARGO) run --release -- bench --lane-shares 0,10,50 --json docs/bench/results.json

## Many users: fair beside fifo_batched at 10 × 10,000 (the reference for a flat p99), then at
## 10,000 and 100,000 users × 1,000,000 items, each run long enough to serve 10 items a user
## (about 10 minutes on 2 cores); results in docs/bench/scale/.
bench-scale:
	$(CARGO) run --release -- bench --points 10x10000,10000x1000000,100000x1000000 \
		--paths fair,fifo_batched --wide-max 1 --rounds 10 --max-duration 4m \
		--competing-tenants 0 --services-per-user 0 --wakeup-trials 0 \
		--json docs/bench/scale/results.json

## The two-minute smoke version, on a throwaway cluster unless DATABASE_URL is set.
bench-quick:
	$(CARGO) build --release --bin fairway
ifdef DATABASE_URL
	./target/release/fairway bench --quick --lane-shares 0,50 --json target/bench-quick/results.json
else
	./target/release/fairway postgres --data-dir target/bench-postgres --ephemeral -- \
		./target/release/fairway bench --quick --lane-shares 0,50 \
		--json target/bench-quick/results.json
endif

## The fault suite: 3 brokers and 40 workers on a durable PostgreSQL in target/chaos-postgres,
## while brokers are killed, PostgreSQL crashes and clients vanish (under 3 minutes; see
## docs/reliability.md). Figures and logs in target/chaos/.
chaos:
	$(CARGO) build --release --bin fairway
	./target/release/fairway chaos --out target/chaos

## A rolling upgrade under load (tests/api/upgrade.rs): two brokers of the previous release,
## built from git history, replaced one at a time by this tree's, then by a drill release (this
## tree with the test-only `upgrade-drill` feature) and back. Each build has a target folder of
## its own under target/upgrade (two trees' crates of one name cannot share one), so that
## neither touches target/debug.
PREVIOUS_RELEASE := 1771533
UPGRADE := target/upgrade
UPGRADE_SOURCE := $(UPGRADE)/src/$(PREVIOUS_RELEASE)
upgrade-test: export FAIRWAY_REQUIRE_TOOLS = 1
upgrade-test:
	@git cat-file -e $(PREVIOUS_RELEASE)^{commit} 2>/dev/null || { \
		echo "upgrade-test: commit $(PREVIOUS_RELEASE) (the previous release) is not in this clone's history; fetch it (git fetch --unshallow)" >&2; exit 1; }
	@if [ ! -f $(UPGRADE_SOURCE)/Cargo.toml ]; then \
		rm -rf $(UPGRADE_SOURCE) && mkdir -p $(UPGRADE_SOURCE) && \
		git archive $(PREVIOUS_RELEASE) | tar -x -C $(UPGRADE_SOURCE); fi
	cd $(UPGRADE_SOURCE) && CARGO_TARGET_DIR=$(abspath $(UPGRADE))/previous $(CARGO) build --locked --bin fairway
	CARGO_TARGET_DIR=$(UPGRADE)/drill $(CARGO) build --bin fairway --features fairway/upgrade-drill
	$(CARGO) build --bin fairway
	FAIRWAY_PREVIOUS_RELEASE=$(abspath $(UPGRADE))/previous/debug/fairway \
	FAIRWAY_DRILL_RELEASE=$(abspath $(UPGRADE))/drill/debug/fairway \
	./target/debug/fairway postgres --data-dir $(UPGRADE)/postgres --ephemeral -- \
		$(CARGO) test $(TEST_FEATURES) --test api -- --ignored --exact --nocapture \
		upgrade::a_rolling_upgrade_and_its_rollback_under_load_lose_nothing

## The same load without faults for DURATION, sampling the brokers' memory and the tables' sizes
## every 10 s into target/soak/soak.csv.
DURATION ?= 10m
soak:
	$(CARGO) build --release --bin fairway
	./target/release/fairway chaos --soak --duration $(DURATION) --out target/soak

## What CI checks besides the tests.
## For the Python client (clients/python): ruff and mypy, in its virtualenv under target/.
lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --all-targets $(TEST_FEATURES) -- -D warnings
	$(CARGO) check --tests --features containers
	$(CARGO) clippy -p fairway-broker --features upgrade-drill -- -D warnings
	clients/python/run-tests.sh lint

## Fair sharing, shown: a broker on a throwaway cluster, worker pods, and three users arriving
## in turn; draws each user's share of the workers in $(DEMO_OUT) (about 40 s).
## `make demo DEMO_OUT=docs/demo/shares.svg` refreshes the chart the docs show.
DEMO_OUT ?= target/demo/shares.svg
demo:
	$(CARGO) build --release --bin fairway
	./target/release/fairway postgres --data-dir target/demo-postgres --ephemeral -- sh -c '\
		./target/release/fairway serve --bind 127.0.0.1:8091 & broker=$$!; \
		./target/release/fairway demo --url http://127.0.0.1:8091 --out $(DEMO_OUT); status=$$?; \
		kill $$broker; wait $$broker; exit $$status'

## Set the release version everywhere it is written: the workspace's Cargo.toml (the binary, the
## Rust client and the wire types), the Python package and the image's label, then Cargo.lock.
## `make version VERSION=0.2.0`; tests/api/workspace.rs checks that every place agrees.
version:
	@echo "$(VERSION)" | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+$$' \
		|| { echo "usage: make version VERSION=x.y.z" >&2; exit 1; }
	sed -i -E 's/^version = "[^"]+"$$/version = "$(VERSION)"/' Cargo.toml clients/python/pyproject.toml
	sed -i -E 's/^(fairway-(api|client) = \{ path = "[^"]+", version = ")[^"]+"/\1$(VERSION)"/' Cargo.toml
	sed -i -E 's/(org\.opencontainers\.image\.version=")[^"]+"/\1$(VERSION)"/' Dockerfile
	sed -i -E 's/^(    newTag: )[0-9]+\.[0-9]+\.[0-9]+$$/\1$(VERSION)/' k8s/overlays/production/kustomization.yaml
	$(CARGO) update --workspace --offline --quiet
