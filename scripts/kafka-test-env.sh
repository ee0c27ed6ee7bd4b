#!/usr/bin/env bash
# What the kafka sink's tests need besides Rust and PostgreSQL, installed
# only when missing (safe to rerun):
#
# * a real broker: Apache Kafka, its jars resolved from Maven Central once
#   by scripts/throwaway-kafka.sh (Java and Maven installed when missing),
#   and what tests/kafka/connect-check needs (Kafka Connect's JsonConverter,
#   Debezium's PostgreSQL connector for ExtractNewRecordState);
# * third-party consumers: a Python virtualenv with confluent-kafka (the
#   official librdkafka client, its Avro/Protobuf deserializers and schema
#   registry client) in $WALBRIDGE_KAFKA_VENV, with grpcio-tools, whose
#   protoc turns the Protobuf schemas the registry holds into the message
#   classes the Protobuf deserializer needs and the gRPC feed's client
#   stubs (tests/grpc/feed_client.py), with grpcio-health-checking and
#   grpcio-reflection, the standard clients of the feed's health and
#   reflection services; and, for the operating
#   surface's tests, prometheus-client, whose parser reads the admin
#   endpoint's /metrics, and kubernetes-validate, which checks
#   deploy/kubernetes against Kubernetes' own schemas.
#
#   scripts/kafka-test-env.sh
set -euo pipefail

confluent_kafka_version=2.16.1
grpcio_version=1.85.1
prometheus_client_version=0.22.1
kubernetes_validate_version=1.31.0

if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/walbridge; else default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
venv="${WALBRIDGE_KAFKA_VENV:-$default_cache/kafka-venv}"
here=$(cd "$(dirname "$0")" && pwd)

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  source "$here/machine.sh"
  machine_apt_install openjdk-17-jre-headless maven
fi
"$here/throwaway-kafka.sh" install
# Kafka Connect's JsonConverter and Debezium's ExtractNewRecordState for the
# check that Debezium's tooling reads our topics (built by the tests).
mvn -q -B -f "$here/../tests/kafka/connect-check/pom.xml" dependency:resolve dependency:resolve-plugins >/dev/null

if ! "$venv/bin/python" -c "import confluent_kafka, grpc_tools, grpc_health, grpc_reflection, prometheus_client, kubernetes_validate, sys; sys.exit(confluent_kafka.__version__ != '$confluent_kafka_version')" 2>/dev/null; then
  echo "kafka-test-env: installing confluent-kafka $confluent_kafka_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "confluent-kafka[avro,protobuf,schemaregistry]==$confluent_kafka_version" "grpcio-tools==$grpcio_version" "grpcio-health-checking==$grpcio_version" "grpcio-reflection==$grpcio_version" "prometheus-client==$prometheus_client_version" "kubernetes-validate==$kubernetes_validate_version"
fi
