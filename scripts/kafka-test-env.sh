#!/usr/bin/env bash
# What the kafka sink's tests need besides Rust and PostgreSQL, installed
# only when missing (safe to rerun):
#
# * a real Kafka-protocol broker: tansu, built from crates.io into
#   ~/.cargo/bin (about 20 minutes on 2 cores, once);
# * third-party consumers: a Python virtualenv with confluent-kafka (the
#   official librdkafka client, its Avro/Protobuf deserializers and schema
#   registry client) in $WALBRIDGE_KAFKA_VENV, with grpcio-tools, whose
#   protoc turns the Protobuf schemas the registry holds into the message
#   classes the Protobuf deserializer needs.
#
#   scripts/kafka-test-env.sh
set -euo pipefail

tansu_version=0.6.0
confluent_kafka_version=2.16.1
grpcio_tools_version=1.85.1

if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/walbridge; else default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
venv="${WALBRIDGE_KAFKA_VENV:-$default_cache/kafka-venv}"
cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"

if ! "$cargo_bin/tansu" --version 2>/dev/null | grep -q "$tansu_version"; then
  echo "kafka-test-env: building the tansu broker $tansu_version (once; takes a while)"
  # A debug build: the tests need a correct broker, not a fast one, and it
  # compiles in a fraction of the time of an optimized one.
  cargo install --locked --debug --features dynostore tansu --version "$tansu_version"
fi

if ! "$venv/bin/python" -c "import confluent_kafka, grpc_tools, sys; sys.exit(confluent_kafka.__version__ != '$confluent_kafka_version')" 2>/dev/null; then
  echo "kafka-test-env: installing confluent-kafka $confluent_kafka_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "confluent-kafka[avro,protobuf,schemaregistry]==$confluent_kafka_version" "grpcio-tools==$grpcio_tools_version"
fi
