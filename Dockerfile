# The broker's image: `fairway serve` on 0.0.0.0:8080, as a non-root user, needing nothing
# written to its root filesystem. It holds no PostgreSQL and refuses to start without
# DATABASE_URL; bound to 0.0.0.0, it also refuses to start without auth: give it
# FAIRWAY_ADMIN_TOKEN (docs/security.md), or a database that holds tokens.
# Build: docker build -t fairway .

# Build stage. The dependencies are built first, against stub sources, in a layer of their own:
# changing fairway's code rebuilds only fairway.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates/fairway-api/Cargo.toml crates/fairway-api/
COPY crates/fairway-bench/Cargo.toml crates/fairway-bench/
COPY crates/fairway-broker/Cargo.toml crates/fairway-broker/
COPY crates/fairway-chaos/Cargo.toml crates/fairway-chaos/
COPY crates/fairway-client/Cargo.toml crates/fairway-client/
COPY crates/fairway-devdb/Cargo.toml crates/fairway-devdb/
COPY crates/fairway-pg/Cargo.toml crates/fairway-pg/
COPY crates/fairway-server/Cargo.toml crates/fairway-server/
# One stub per crate and per target Cargo.toml names (tests/api/deploy.rs checks that none is
# missing).
RUN mkdir -p src tests/api \
 && for crate in crates/*/; do mkdir -p "$crate/src" && touch "$crate/src/lib.rs"; done \
 && echo 'fn main() {}' > src/main.rs \
 && touch tests/api/main.rs tests/bench.rs \
 && cargo build --release --locked --bin fairway \
 && rm -rf src crates/*/src
# The test targets stay stubs: the broker does not need them, and editing a test then leaves
# the image alone.
COPY src src
COPY crates crates
COPY sql sql
COPY migrations migrations
COPY ui ui
# The stubs' build left newer outputs than the sources just copied in: make fairway rebuild.
RUN touch src/main.rs crates/*/src/lib.rs \
 && cargo build --release --locked --bin fairway \
 && cp target/release/fairway /fairway

# Runtime stage: glibc and the binary, nothing else (no shell, no package manager).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /fairway /usr/local/bin/fairway
# A cluster's broker uses the cluster's database, never one of its own.
ENV FAIRWAY_NO_EMBEDDED_POSTGRES=true
# The release, as `make version` sets it everywhere.
LABEL org.opencontainers.image.version="0.2.0"
# distroless' `nonroot` user and group.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/fairway", "serve"]
CMD ["--bind", "0.0.0.0:8080"]
