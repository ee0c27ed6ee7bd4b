#!/usr/bin/env bash
# The gRPC change feed (`type = "grpc"`) against pg_recvlogical.
#
# For each of SIZES (default "20000 100000"): pgbench TPC-B transactions
# are made while nothing reads them, from slots created at the same point;
# then, on that WAL, pg_recvlogical decodes it to /dev/null (the
# walsender's ceiling), and walbridge reads it into its log and serves it
# to one consumer (crates/walbridge-sink-grpc/examples/feed-bench.rs, which
# acknowledges every transaction as it arrives) — timed from walbridge's
# start until the consumer has the last transaction. With the log then
# holding that WAL, one consumer and CONSUMERS (default 10) concurrent
# consumers read it all again from the log: their total events/s and
# walbridge's CPU meanwhile.
#
# Then latency: a consumer subscribed at `latest` while pgbench makes
# RATE (default 2000) TPC-B transactions/s for DURATION seconds (default
# 30, committed with synchronous_commit = on); each transaction's delay
# from its commit on the publisher to its `commit` reaching the consumer
# (one machine, one clock), with walbridge's log fsynced before anything
# is sent (its default).
#
#   scripts/bench-feed.sh
#   SIZES=20000 CONSUMERS=4 RATE=1000 DURATION=10 scripts/bench-feed.sh
#
# Events are changes: 4 per TPC-B transaction (3 updates, 1 insert).
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
sizes=${SIZES:-"20000 100000"}
consumers=${CONSUMERS:-10}
rate=${RATE:-2000}
duration=${DURATION:-30}
clients=4

build_walbridge
cargo build --quiet --release -p walbridge-sink-grpc --example feed-bench --manifest-path "$here/Cargo.toml"
consumer_bin="$here/target/release/examples/feed-bench"
start_postgres
psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history" >/dev/null

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Starts walbridge reading slot $1 (made beforehand) into a feed on a free
# port, its log kept whole; sets wb_pid and feed.
start_feed() {
  local slot=$1 feed_port; feed_port=$(free_port)
  mkdir -p "$work/wb-$slot"
  cat > "$work/wb-$slot/config.toml" <<CONF
data_dir = "$work/wb-$slot/data"
[admin]
listen = ""
[[source]]
name = "bench"
connection = "host=127.0.0.1 port=$port dbname=bench user=postgres sslmode=disable"
publications = ["bench_pub"]
slot = "$slot"
create_slot = false
copy_data = false
[[sink]]
name = "feed"
type = "grpc"
listen = "127.0.0.1:$feed_port"
# Never reads: keeps the log for the consumers reading it again.
consumers = ["keep"]
CONF
  "$bin" run -c "$work/wb-$slot/config.toml" 2>"$work/wb-$slot/stderr.log" &
  wb_pid=$!
  feed="http://127.0.0.1:$feed_port"
}

stop_feed() { kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=; }

# Runs the consumer with arguments $@ against $feed; prints its summary.
consume() {
  "$consumer_bin" --address "$feed" "$@" || { cat "$work"/wb-*/stderr.log >&2; return 1; }
}

field() { python3 -c "import json, sys; print(json.loads(sys.argv[1])$2)" "$1"; }

rows=()
for n in $sizes; do
  psql_db bench -c "SELECT pg_create_logical_replication_slot('recv_$n', 'pgoutput')" >/dev/null
  psql_db bench -c "SELECT pg_create_logical_replication_slot('feed_$n', 'pgoutput')" >/dev/null
  pgbench -n -c $clients -j 2 -t $((n / clients)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
  end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
  events=$((4 * n))
  wal=$(psql_db bench -c "SELECT pg_size_pretty(pg_wal_lsn_diff('$end', confirmed_flush_lsn)) FROM pg_replication_slots WHERE slot_name = 'recv_$n'")
  echo "$n TPC-B transactions ($events events, $wal of WAL)"

  start=$(date +%s.%N)
  pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d bench -S "recv_$n" --start -E "$end" \
    -o proto_version=1 -o publication_names=bench_pub -f /dev/null
  recv=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  rows+=("$n|pg_recvlogical (ceiling)|1|$recv|$events||")

  start=$(date +%s.%N)
  start_feed "feed_$n"
  summary=$(consume --transactions "$n")
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  got=$(field "$summary" "['events']")
  [ "$got" = "$events" ] || { echo "the consumer received $got events of $events" >&2; exit 1; }
  rows+=("$n|walbridge: publisher → log → feed → consumer|1|$took|$events|$(cpu_seconds "$wb_pid")|")

  # The log now holds the WAL: the feed alone.
  summary=$(consume --transactions "$n")
  rows+=("$n|from walbridge's log, 1 consumer|1|$(field "$summary" "['seconds']")|$(field "$summary" "['events']")||")
  cpu_before=$(cpu_seconds "$wb_pid")
  start=$(date +%s.%N)
  summary=$(consume --transactions "$n" --consumers "$consumers")
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")
  cpu=$(python3 -c "print(f'{$(cpu_seconds "$wb_pid") - $cpu_before:.2f}')")
  got=$(field "$summary" "['events']")
  [ "$got" = "$((consumers * events))" ] || { echo "$consumers consumers received $got events of $((consumers * events))" >&2; exit 1; }
  rows+=("$n|from walbridge's log, $consumers concurrent consumers|$consumers|$(field "$summary" "['seconds']")|$got|$cpu|$took")
  stop_feed
done

python3 - "${rows[@]}" <<'PY'
import sys
print()
print("| transactions | reader | consumers | seconds | events/s | walbridge CPU s |")
print("|---|---|---|---|---|---|")
ceiling = {}
for row in sys.argv[1:]:
    n, reader, consumers, seconds, events, cpu, wall = row.split("|")
    seconds, events = float(seconds), int(events)
    rate = events / seconds
    if reader.startswith("pg_recvlogical"):
        ceiling[n] = rate
        shown = f"{rate:,.0f}"
    else:
        shown = f"{rate:,.0f} ({100 * rate / ceiling[n]:.0f}% of the ceiling)"
    if wall:
        cpu = f"{cpu} ({100 * float(cpu) / float(wall):.0f}% of a core over {float(wall):.1f} s)"
    print(f"| {int(n):,} | {reader} | {consumers} | {seconds:.2f} | {shown} | {cpu} |")
PY

echo
echo "Latency: $rate TPC-B transactions/s for $duration s, commit on the publisher → commit at the consumer"
psql_db bench -c "SELECT pg_create_logical_replication_slot('feed_latency', 'pgoutput')" >/dev/null
start_feed feed_latency
# Subscribed once the feed answers; the consumer then waits for the load.
"$consumer_bin" --address "$feed" --start latest --latency --idle 5 > "$work/latency.json" &
consumer_pid=$!
until grep -q "subscriber connected" "$work/wb-feed_latency/stderr.log"; do
  kill -0 "$wb_pid" 2>/dev/null || { cat "$work/wb-feed_latency/stderr.log" >&2; exit 1; }
  sleep 0.1
done
cpu_before=$(cpu_seconds "$wb_pid")
# synchronous_commit on for these: off (the server's setting here, for the
# bulk runs) leaves flushing the WAL to the WAL writer every
# wal_writer_delay (200 ms), and the walsender sends only flushed WAL.
PGOPTIONS="-c synchronous_commit=on" pgbench -n -c $clients -j 2 -R "$rate" -T "$duration" -h 127.0.0.1 -p "$port" -U postgres bench > "$work/pgbench.out"
cpu=$(python3 -c "print(f'{$(cpu_seconds "$wb_pid") - $cpu_before:.2f}')")
wait "$consumer_pid"
stop_feed
tps=$(awk '/^tps/ {print $3; exit}' "$work/pgbench.out")
python3 - "$(cat "$work/latency.json")" "$tps" "$cpu" "$duration" <<'PY'
import json, sys
s, tps, cpu, duration = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
l = s["latency_ms"]
print(f"pgbench: {tps:,.0f} transactions/s; the consumer received {s['transactions']:,} transactions")
print(f"| p50 | p95 | p99 | max | walbridge CPU |")
print(f"|---|---|---|---|---|")
print(f"| {l['p50']:.1f} ms | {l['p95']:.1f} ms | {l['p99']:.1f} ms | {l['max']:.1f} ms | {100 * cpu / duration:.0f}% of a core |")
PY
