#!/usr/bin/env bash
# The kafka sink side by side with Debezium, into a real Apache Kafka.
#
# pgbench TPC-B transactions are made while nothing reads them, from slots
# created at the same point; then, one at a time on the same WAL and the
# same broker: pg_recvlogical decoding it (the walsender's ceiling),
# walbridge → Kafka in each format, and Debezium's PostgreSQL connector in
# Kafka Connect standalone (JSON without schemas, its default mode; Connect
# 4.3.0, the Kafka Debezium 3.6.1 is built against: in 4.4.0 its task dies
# on a class 4.4 moved, see tests/kafka/debezium/pom.xml). Then
# the initial snapshot of pgbench_accounts by both.
#
#   scripts/bench-kafka-sink.sh                     # 100,000 transactions
#   TRANSACTIONS=20000 FORMATS="json" DEBEZIUM=0 scripts/bench-kafka-sink.sh
#
# Each run ends when the last event is in Kafka: for walbridge when its
# sink has acknowledged the end of that WAL (deliveries acknowledged by the
# broker), for Debezium when its topics hold every event. Reported per
# run: seconds, events/s, the CPU seconds of the tool's process and of the
# broker's during the run, and the tool's peak RSS.
#
# The broker is a real Apache Kafka on this machine
# (scripts/throwaway-kafka.sh); Kafka Connect and Debezium 3.6.1.Final
# come from Maven Central (tests/kafka/debezium/pom.xml).
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
transactions=${TRANSACTIONS:-100000}
formats=${FORMATS:-"json avro protobuf"}
debezium=${DEBEZIUM:-1}
clients=4
events=$((4 * transactions))

"$here/scripts/kafka-test-env.sh" >/dev/null
if [ "$(id -u)" = 0 ]; then cache=/var/cache/walbridge; else cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
python="${WALBRIDGE_KAFKA_VENV:-$cache/kafka-venv}/bin/python"
connect_libs="$cache/connect-4.3.0-debezium-3.6.1.Final/libs"
if [ "$debezium" = 1 ] && [ ! -f "$connect_libs/.complete" ]; then
  echo "bench-kafka-sink: resolving Kafka Connect and Debezium from Maven Central" >&2
  rm -rf "$connect_libs"
  mvn -q -B -f "$here/tests/kafka/debezium/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$connect_libs" >&2
  touch "$connect_libs/.complete"
fi

build_walbridge
start_postgres
"$here/scripts/throwaway-kafka.sh" run > "$work/kafka.out" 2> "$work/kafka.log" &
kafka_pid=$!
connect_pid=
trap 'kill $connect_pid 2>/dev/null || true; kill $kafka_pid 2>/dev/null || true; wait $kafka_pid 2>/dev/null || true; bench_cleanup' EXIT
until [ -s "$work/kafka.out" ]; do
  kill -0 $kafka_pid 2>/dev/null || { cat "$work/kafka.log" >&2; exit 1; }
  sleep 0.1
done
brokers=$(head -1 "$work/kafka.out")
broker_pid=$(pgrep -P "$kafka_pid" -f kafka.Kafka)

# Waits until topics starting with $1 hold $2 messages (at most 15 min);
# prints the seconds. On failure shows the end of log $3.
wait_for_messages() {
  "$python" "$here/tests/kafka/wait_count.py" "$brokers" "$1" "$2" 900 \
    || { tail -20 "$3" >&2; return 1; }
}

# One line of results. Args: label seconds tool_cpu broker_cpu rss_kb
report() {
  python3 -c "
label, took, cpu, broker, rss = '$1', $2, $3, $4, $5
print(f'{label:26}: {took:8.2f} s {$events / took:9.0f} events/s  CPU {cpu:6.1f} s (broker {broker:5.1f} s)  peak RSS {rss / 1024:5.0f} MB')"
}

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history" >/dev/null
psql_db bench -c "CREATE PUBLICATION snap_pub FOR TABLE pgbench_accounts" >/dev/null
for slot in recv_slot debezium_slot $(for f in $formats; do echo "${f}_slot"; done); do
  psql_db bench -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
done
pgbench -n -c $clients -j 2 -t $((transactions / clients)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
echo "$transactions pgbench transactions ($events change events), broker: Apache Kafka 4.4.0 at $brokers"

start=$(date +%s.%N)
pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d bench -S recv_slot --start -E "$end" \
  -o proto_version=1 -o publication_names=bench_pub -f /dev/null
recv=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
python3 -c "print(f'{\"pg_recvlogical (ceiling)\":26}: {$recv:8.2f} s {$events / $recv:9.0f} events/s')"

for format in $formats; do
  registry_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  sinks="[schema_registry]
listen = \"127.0.0.1:$registry_port\"
[[sink]]
name = \"events\"
type = \"kafka\"
brokers = \"$brokers\"
format = \"$format\"
topic = \"$format.{table}\""
  broker_before=$(cpu_seconds "$broker_pid")
  read -r took rss_kb cpu < <(walbridge_until "${format}_slot" "$end" bench bench_pub /dev/null "$sinks")
  broker_cpu=$(python3 -c "print($(cpu_seconds "$broker_pid") - $broker_before)")
  report "walbridge -> kafka $format" "$took" "$cpu" "$broker_cpu" "$rss_kb"
  python3 -c "print(f'{\"\":26}  {100 * $recv / $took:.0f}% of the pg_recvlogical figure')"
done

# Kafka Connect standalone with Debezium's PostgreSQL connector.
# Args: name, connector properties (appended); the worker's own in $work/$1.
run_connect() {
  local name=$1 connector=$2 dir="$work/$1"
  mkdir -p "$dir"
  local rest_port; rest_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cat > "$dir/worker.properties" <<PROPS
bootstrap.servers=$brokers
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=false
offset.storage.file.filename=$dir/offsets
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:$rest_port
plugin.discovery=only_scan
PROPS
  cat > "$dir/connector.properties" <<PROPS
name=$name
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=$port
database.user=postgres
database.dbname=bench
plugin.name=pgoutput
publication.autocreate.mode=disabled
$connector
PROPS
  java -Xms256m -Xmx2g "-Dlog4j2.configurationFile=$here/tests/kafka/log4j2.properties" -cp "$connect_libs/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" "$dir/connector.properties" \
    2> "$dir/connect.log" &
  connect_pid=$!
}

# Stops Connect; prints its CPU seconds and peak RSS (kB).
stop_connect() {
  local cpu rss
  cpu=$(cpu_seconds "$connect_pid")
  rss=$(awk '/VmHWM/ {print $2}' "/proc/$connect_pid/status")
  kill -TERM "$connect_pid"; wait "$connect_pid" 2>/dev/null || true; connect_pid=
  echo "$cpu $rss"
}

if [ "$debezium" = 1 ]; then
  broker_before=$(cpu_seconds "$broker_pid")
  start=$(date +%s.%N)
  run_connect debezium "topic.prefix=dbz
slot.name=debezium_slot
publication.name=bench_pub
snapshot.mode=no_data"
  wait_for_messages dbz. "$events" "$work/debezium/connect.log" >/dev/null
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  read -r cpu rss_kb < <(stop_connect)
  broker_cpu=$(python3 -c "print($(cpu_seconds "$broker_pid") - $broker_before)")
  report "Debezium 3.6.1 (Connect)" "$took" "$cpu" "$broker_cpu" "$rss_kb"
fi

# The initial snapshot of pgbench_accounts (1,000,000 rows at scale 10):
# until every row is in Kafka.
rows=$(psql_db bench -c "SELECT count(*) FROM pgbench_accounts")
snapshot_report() {
  python3 -c "print(f'{\"$1\":26}: {$2:8.2f} s {$rows / $2:9.0f} rows/s  CPU {$3:6.1f} s  peak RSS {$4 / 1024:5.0f} MB')"
}
echo "initial snapshot of $rows pgbench_accounts rows"
mkdir -p "$work/wb-snapshot"
cat > "$work/wb-snapshot/config.toml" <<CONF
data_dir = "$work/wb-snapshot/data"
[[source]]
name = "bench"
connection = "host=127.0.0.1 port=$port dbname=bench user=postgres sslmode=disable"
publications = ["snap_pub"]
slot = "wb_snapshot"
[[sink]]
name = "events"
type = "kafka"
brokers = "$brokers"
topic = "snap.{table}"
CONF
start=$(date +%s.%N)
"$bin" run -c "$work/wb-snapshot/config.toml" 2> "$work/wb-snapshot/stderr.log" &
wb_pid=$!
wait_for_messages snap. "$rows" "$work/wb-snapshot/stderr.log" >/dev/null
took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
cpu=$(cpu_seconds "$wb_pid")
rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$wb_pid/status")
kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
snapshot_report "walbridge -> kafka json" "$took" "$cpu" "$rss_kb"
if [ "$debezium" = 1 ]; then
  start=$(date +%s.%N)
  run_connect debezium-snapshot "topic.prefix=dbzsnap
slot.name=debezium_snapshot
publication.name=snap_pub
snapshot.mode=initial"
  wait_for_messages dbzsnap. "$rows" "$work/debezium-snapshot/connect.log" >/dev/null
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  read -r cpu rss_kb < <(stop_connect)
  snapshot_report "Debezium 3.6.1 (Connect)" "$took" "$cpu" "$rss_kb"
fi
