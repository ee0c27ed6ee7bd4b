#!/usr/bin/env bash
# The whole test suite, against real PostgreSQL servers: unit and property
# tests, then the integration and end-to-end tests on the system's
# PostgreSQL and again on PostgreSQL 17 (fetched by scripts/fetch-postgres.sh).
#
#   scripts/test.sh              # everything
#   PG_VERSIONS="17 18" scripts/test.sh   # integration tests on other majors too
#
# Installs what is missing (the PostgreSQL 15 server, psql, openssl,
# OpenSSL headers, curl, chromium, promtool: scripts/machine.sh; nextest;
# for the kafka sink's tests the broker and Python's confluent-kafka:
# scripts/kafka-test-env.sh; the Go example's code generators:
# examples/go-consumer/build.sh, run by the feed's tests) and is safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/machine.sh
machine_setup
machine_test_tools
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi

versions="${PG_VERSIONS:-17}"
# Cross-version tests replicate from 14 and into 15 besides the suite's versions.
extra=(14)
[ "$(postgres --version | awk '{print $3}' | cut -d. -f1)" = 15 ] || extra+=(15)
# shellcheck disable=SC2086
scripts/fetch-postgres.sh "${extra[@]}" $versions
scripts/kafka-test-env.sh

cargo build --workspace --all-targets --locked
# Every version runs even when one fails; the status says whether all passed.
failed=()
echo "== tests on PostgreSQL $(postgres --version | awk '{print $3}') (system)"
cargo nextest run --workspace --locked --no-fail-fast || failed+=(system)
# On the other majors, the kafka sink's tests are left out: what they
# check lies past the log, the same whatever the publisher's version.
for v in $versions; do
  echo "== integration tests on PostgreSQL $v"
  WALBRIDGE_PG_VERSION=$v cargo nextest run --workspace --locked --no-fail-fast \
    -E 'kind(test) & !binary(/^kafka_/)' || failed+=("$v")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: failures on PostgreSQL ${failed[*]}" >&2
  exit 1
fi
