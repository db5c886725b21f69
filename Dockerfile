# syntax=docker/dockerfile:1
# The `ferry` binary in a small Debian image.
#
#   docker build -t ferry .
#   docker run --rm -e FERRY_POSTGRES_URL=... -e FERRY_KAFKA_BROKERS=... \
#     -e FERRY_HTTP_LISTEN=0.0.0.0:9187 -p 9187:9187 ferry run
#
# Configure with a mounted file (`ferry run --config /etc/ferry/ferry.toml`) or with environment
# variables only (FERRY_<SECTION>_<KEY>); docker-compose.yml shows the latter. In a container
# set FERRY_HTTP_LISTEN=0.0.0.0:9187: the default listens on loopback only.

# --- build -----------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build

# rdkafka builds librdkafka from source and links the system OpenSSL (its `ssl` feature) and zlib
# dynamically; the runtime stage installs the matching libraries. Debian package versions are not
# pinned (DL3008): the archive drops superseded versions with every security update, which would
# break the build; the base images are pinned instead.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends pkg-config libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# Dependencies first: this layer is rebuilt only when a manifest or Cargo.lock changes, not on
# every source edit. Every workspace member's manifest is needed to resolve the workspace, with
# stub sources for its targets; a new workspace member needs a line here.
COPY Cargo.toml Cargo.lock ./
COPY crates/ferry-wal/Cargo.toml crates/ferry-wal/
COPY crates/ferry-router/Cargo.toml crates/ferry-router/
COPY crates/ferry/Cargo.toml crates/ferry/
COPY crates/ferry-testkit/Cargo.toml crates/ferry-testkit/
COPY tests/Cargo.toml tests/
RUN for crate in crates/ferry-wal crates/ferry-router crates/ferry-testkit crates/ferry tests; do \
        mkdir -p "$crate/src/bin" && touch "$crate/src/lib.rs"; \
    done \
 && echo 'fn main() {}' > crates/ferry/src/main.rs \
 && echo 'fn main() {}' > tests/src/bin/ferry-under-test.rs \
 && cargo build --release -p ferry --locked \
 && rm -rf crates tests

# Then the sources. Their mtimes may predate the stub build above, so drop the workspace crates'
# fingerprints to make sure cargo rebuilds them from the real sources.
COPY crates crates
COPY tests tests
RUN rm -rf target/release/.fingerprint/ferry-* \
 && cargo build --release -p ferry --locked \
 && install -m 0755 target/release/ferry /usr/local/bin/ferry

# --- runtime ---------------------------------------------------------------------------------
FROM debian:bookworm-slim

# libssl3 and zlib1g: the binary links them (see `ldd`); ca-certificates: TLS to Postgres and
# Kafka (verify-full, SASL_SSL). Unpinned versions: see the build stage.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 ferry \
 && useradd --system --uid 10001 --gid ferry --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin ferry

COPY --from=build /usr/local/bin/ferry /usr/local/bin/ferry

USER 10001:10001
EXPOSE 9187

# Liveness: GET /healthz on the default port (127.0.0.1:9187 works for both the default listen
# address and 0.0.0.0:9187). There is no curl in the slim image; bash's /dev/tcp is enough.
# /readyz is the readiness probe (a standby instance is healthy but not ready), for orchestrators.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9187 && printf 'GET /healthz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

ENTRYPOINT ["ferry"]
CMD ["--help"]
