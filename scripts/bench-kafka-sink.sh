#!/usr/bin/env bash
# The kafka sink's throughput: pgbench TPC-B transactions made while
# nothing reads them, then walbridge → Kafka in each format, against
# pg_recvlogical decoding the same WAL range (the walsender's ceiling).
# Every run starts from a slot created at the same point.
#
#   scripts/bench-kafka-sink.sh                     # 20,000 transactions
#   TRANSACTIONS=100000 FORMATS="json avro protobuf" scripts/bench-kafka-sink.sh
#
# The broker is a real Apache Kafka on loopback (scripts/throwaway-kafka.sh,
# one KRaft node on this machine): the figures include what producing to
# it costs, on the same two cores.
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
transactions=${TRANSACTIONS:-20000}
formats=${FORMATS:-"json avro protobuf"}
clients=4

build_walbridge
start_postgres
"$here/scripts/throwaway-kafka.sh" run > "$work/kafka.out" 2> "$work/kafka.log" &
kafka_pid=$!
trap 'kill $kafka_pid 2>/dev/null || true; wait $kafka_pid 2>/dev/null || true; bench_cleanup' EXIT
until [ -s "$work/kafka.out" ]; do
  kill -0 $kafka_pid 2>/dev/null || { cat "$work/kafka.log" >&2; exit 1; }
  sleep 0.1
done
brokers=$(head -1 "$work/kafka.out")

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history" >/dev/null
psql_db bench -c "SELECT pg_create_logical_replication_slot('recv_slot', 'pgoutput')" >/dev/null
for format in $formats; do
  psql_db bench -c "SELECT pg_create_logical_replication_slot('${format}_slot', 'pgoutput')" >/dev/null
done
pgbench -n -c $clients -j 2 -t $((transactions / clients)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
echo "$transactions pgbench transactions ($((4 * transactions)) change events), broker: Apache Kafka at $brokers"

start=$(date +%s.%N)
pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d bench -S recv_slot --start -E "$end" \
  -o proto_version=1 -o publication_names=bench_pub -f /dev/null
recv=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
python3 -c "print(f'pg_recvlogical (ceiling): {$recv:7.2f} s  {4 * $transactions / $recv:9.0f} events/s')"

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
  read -r took rss_kb < <(walbridge_until "${format}_slot" "$end" bench bench_pub /dev/null "$sinks")
  python3 -c "print(f'walbridge -> kafka {\"$format\":8}: {$took:7.2f} s  {4 * $transactions / $took:9.0f} events/s  ({100 * $recv / $took:.0f}% of the ceiling, peak RSS {$rss_kb / 1024:.0f} MB)')"
done
