#!/usr/bin/env bash
# A throwaway Apache Kafka broker (KRaft, one node that is broker and
# controller) on free loopback ports, for the tests, the benchmarks and a
# person trying the kafka sink.
#
#   scripts/throwaway-kafka.sh install        # resolve the jars once (idempotent)
#   scripts/throwaway-kafka.sh run [PORT]     # start; print the bootstrap address
#                                             # when it answers; run until SIGINT/
#                                             # SIGTERM, then stop and remove it
#   scripts/throwaway-kafka.sh run PORT DIR   # the same, its data in DIR, which is
#                                             # kept: run again with DIR to start the
#                                             # same broker again (a broker outage)
#   scripts/throwaway-kafka.sh run --sasl-ssl [PORT [DIR]]
#                                             # clients must use SASL_SSL with
#                                             # SCRAM-SHA-512; prints, after the
#                                             # address, `ca=`, `username=`,
#                                             # `password=` and `admin_password=`
#                                             # lines
#
# `install` resolves Apache Kafka (tests/kafka/pom.xml) from Maven Central
# with `mvn dependency:copy-dependencies` into $WALBRIDGE_KAFKA_HOME
# (default /var/cache/walbridge/kafka-<version> as root, else
# ~/.cache/walbridge/kafka-<version>). `run` formats a new cluster with a
# random id in a temporary directory, starts it on PORT (default: a free
# port) with its controller on another free port, waits until the broker
# has started, prints `127.0.0.1:PORT` on stdout, and removes the
# directory when it stops. The broker's own log goes to stderr.
#
# With --sasl-ssl the client listener takes only SASL_SSL: a certificate
# for 127.0.0.1/localhost signed by a throwaway CA made for this broker
# (`DIR/tls/ca.pem`, which clients must trust: verification stays on),
# and SCRAM-SHA-512 with the user `walbridge`, created when the cluster is
# formatted, its password $KAFKA_SCRAM_PASSWORD or a random one. ACLs
# are enforced (KRaft's StandardAuthorizer) but allow what no ACL names,
# so the user may do anything until an ACL says otherwise; the user
# `admin` (a random password) is a super user who can set them. The
# broker talks to itself over a second, plaintext listener on loopback.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$here/tests/kafka/pom.xml")
if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/walbridge; else default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
home="${WALBRIDGE_KAFKA_HOME:-$default_cache/kafka-$version}"

install() {
  if [ -f "$home/.complete" ]; then
    return
  fi
  if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    echo "throwaway-kafka: java and mvn are needed (apt-get install openjdk-17-jre-headless maven)" >&2
    exit 2
  fi
  echo "throwaway-kafka: resolving Apache Kafka $version from Maven Central into $home" >&2
  rm -rf "$home"
  mkdir -p "$home"
  mvn -q -B -f "$here/tests/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$home/libs" >&2
  touch "$home/.complete"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Makes the throwaway CA and the broker's certificate and key (PKCS#8 PEM,
# as Kafka's PEM key store wants) in $1.
make_certificates() {
  local tls=$1
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=walbridge throwaway Kafka CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls/broker.key" -out "$tls/broker.csr" 2>/dev/null
  openssl x509 -req -days 7 -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost') -out "$tls/broker.pem" 2>/dev/null
  openssl pkcs8 -topk8 -nocrypt -in "$tls/broker.key" -out "$tls/broker.p8"
  cat "$tls/broker.p8" "$tls/broker.pem" > "$tls/keystore.pem"
}

run() {
  install
  local sasl_ssl=
  if [ "${1:-}" = --sasl-ssl ]; then
    sasl_ssl=yes
    shift
  fi
  local port=${1:-} controller_port internal_port
  # Global: the EXIT trap reads them after the function's scope is gone.
  keep=${2:-} work= java_pid=
  if [ -n "$keep" ]; then
    work=$keep
    mkdir -p "$work"
  else
    work=$(mktemp -d "${TMPDIR:-/tmp}/walbridge-kafka.XXXXXX")
  fi
  stop() {
    trap - EXIT INT TERM HUP
    if [ -n "$java_pid" ]; then
      kill -TERM "$java_pid" 2>/dev/null || true
      # A controlled shutdown takes a few seconds; a throwaway broker need not wait.
      for _ in $(seq 1 50); do kill -0 "$java_pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$java_pid" 2>/dev/null || true
      wait "$java_pid" 2>/dev/null || true
    fi
    [ -n "$keep" ] || rm -rf "$work"
  }
  trap stop EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP

  local formatted=
  if [ -f "$work/server.properties" ]; then
    # The same broker again: its ports and its data.
    formatted=yes
    port=$(sed -n 's|^advertised.listeners=[A-Z_]*://127.0.0.1:\([0-9]*\).*$|\1|p' "$work/server.properties")
    [ -f "$work/tls/ca.pem" ] && sasl_ssl=yes
  else
    port=${port:-$(free_port)}
    controller_port=$(free_port)
    if [ -n "$sasl_ssl" ]; then
      internal_port=$(free_port)
      make_certificates "$work/tls"
      cat > "$work/server.properties" <<PROPS
listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$internal_port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=SASL_SSL://127.0.0.1:$port,INTERNAL://127.0.0.1:$internal_port
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=$work/tls/keystore.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
super.users=User:admin;User:ANONYMOUS
PROPS
    else
      cat > "$work/server.properties" <<PROPS
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
PROPS
    fi
    cat >> "$work/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
controller.listener.names=CONTROLLER
log.dirs=$work/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
  fi
  local java_opts=(-Xms256m -Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1
    -Djava.awt.headless=true "-Dlog4j2.configurationFile=$here/tests/kafka/log4j2.properties")
  if [ -z "$formatted" ]; then
    local cluster_id scram=()
    cluster_id=$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')
    if [ -n "$sasl_ssl" ]; then
      python3 -c 'import secrets; print(secrets.token_urlsafe(18))' > "$work/tls/password"
      [ -z "${KAFKA_SCRAM_PASSWORD:-}" ] || printf '%s\n' "$KAFKA_SCRAM_PASSWORD" > "$work/tls/password"
      python3 -c 'import secrets; print(secrets.token_urlsafe(18))' > "$work/tls/admin_password"
      scram=(--add-scram "SCRAM-SHA-512=[name=walbridge,password=$(cat "$work/tls/password")]"
        --add-scram "SCRAM-SHA-512=[name=admin,password=$(cat "$work/tls/admin_password")]")
    fi
    java "${java_opts[@]}" -cp "$home/libs/*" kafka.tools.StorageTool format \
      "--cluster-id=$cluster_id" -c "$work/server.properties" "${scram[@]}" >/dev/null
  fi
  : > "$work/broker.log"
  java "${java_opts[@]}" -cp "$home/libs/*" kafka.Kafka "$work/server.properties" \
    2> >(tee -a "$work/broker.log" >&2) &
  java_pid=$!
  for _ in $(seq 1 600); do
    if grep -q "Kafka Server started" "$work/broker.log" 2>/dev/null; then
      echo "127.0.0.1:$port"
      if [ -n "$sasl_ssl" ]; then
        echo "ca=$work/tls/ca.pem"
        echo "username=walbridge"
        echo "password=$(cat "$work/tls/password")"
        echo "admin_password=$(cat "$work/tls/admin_password")"
      fi
      wait "$java_pid"
      echo "throwaway-kafka: the broker exited" >&2
      exit 1
    fi
    kill -0 "$java_pid" 2>/dev/null || { echo "throwaway-kafka: the broker did not start" >&2; exit 1; }
    sleep 0.1
  done
  echo "throwaway-kafka: the broker did not start within 60 s" >&2
  exit 1
}

case "${1:-}" in
  install) install ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 install | run [--sasl-ssl] [PORT [DIR]]" >&2; exit 2 ;;
esac
