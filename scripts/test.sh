#!/usr/bin/env bash
# The whole test suite, against real PostgreSQL servers: unit and property
# tests, then the integration and end-to-end tests on the system's
# PostgreSQL and again on PostgreSQL 17 (fetched by scripts/fetch-postgres.sh).
#
#   scripts/test.sh              # everything
#   PG_VERSIONS="17 18" scripts/test.sh   # integration tests on other majors too
#
# Installs what is missing (nextest, psql, openssl, OpenSSL headers, and
# for the kafka sink's tests the tansu broker and Python's confluent-kafka:
# scripts/kafka-test-env.sh) and is safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v psql >/dev/null || need_apt+=(postgresql-client)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v runuser >/dev/null || need_apt+=(util-linux)
# librdkafka (built by rdkafka-sys) links the system OpenSSL.
pkg-config --exists openssl 2>/dev/null || need_apt+=(libssl-dev pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
command -v initdb >/dev/null || { echo "test.sh: initdb is not on PATH: install the PostgreSQL server binaries" >&2; exit 2; }
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home postgres
fi

versions="${PG_VERSIONS:-17}"
# Cross-version tests replicate from 14 and into 15 besides the suite's versions.
extra=(14)
[ "$(postgres --version | awk '{print $3}' | cut -d. -f1)" = 15 ] || extra+=(15)
# shellcheck disable=SC2086
scripts/fetch-postgres.sh "${extra[@]}" $versions
scripts/kafka-test-env.sh

cargo build --workspace --all-targets --locked
echo "== tests on PostgreSQL $(postgres --version | awk '{print $3}') (system)"
cargo nextest run --workspace --locked --no-fail-fast
for v in $versions; do
  echo "== integration tests on PostgreSQL $v"
  WALBRIDGE_PG_VERSION=$v cargo nextest run --workspace --locked --no-fail-fast -E 'kind(test)'
done
