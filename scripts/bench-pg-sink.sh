#!/usr/bin/env bash
# The postgres sink against PostgreSQL's own logical replication, on one
# machine, in one run, into the same subscriber cluster:
#
# * initial sync of pgbench scale 10 (1,000,000-row pgbench_accounts, with
#   its primary key and a secondary index on bid):
#   CREATE SUBSCRIPTION's table sync vs walbridge's copy, until the target
#   holds every row, in SYNC_ROUNDS rounds (default 3) from nothing;
# * catch-up: 20,000 TPC-B transactions (4 clients) made while replication
#   is paused (subscription disabled, walbridge stopped), then the time
#   until a marker committed last is on the subscriber — for the native
#   subscription and for walbridge — and the time pg_recvlogical takes to
#   decode the same WAL from a slot created at the same point: the
#   walsender's ceiling, which no client of one slot can pass.
#
# The benchmark waits on one connection per measurement (a psql started
# every few milliseconds would fork a backend each time, taking CPU from
# what is measured on a small machine), and reports the CPU time the
# publisher's and the subscriber's servers and walbridge took in each
# catch-up round.
#
#   scripts/bench-pg-sink.sh
#   TRANSACTIONS=50000 ROUNDS=5 SYNC_ROUNDS=5 scripts/bench-pg-sink.sh
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
transactions=${TRANSACTIONS:-20000}
rounds=${ROUNDS:-3}
sync_rounds=${SYNC_ROUNDS:-3}
clients=4
# The catch-up rounds go on from the subscriptions the initial sync makes.
[ "$sync_rounds" -ge 1 ] || { echo "bench-pg-sink: SYNC_ROUNDS must be at least 1 (the catch-up rounds start from the initial sync's subscriptions)" >&2; exit 2; }

build_walbridge
start_postgres "max_wal_senders = 20" "max_replication_slots = 20"
# A short retry interval: a re-created subscription starts its workers at once.
start_second_postgres "max_wal_size = 8GB" "shared_buffers = 512MB" "max_logical_replication_workers = 8" "wal_retrieve_retry_interval = 100ms"

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
# A secondary index besides the primary key, as most tables have: the
# subscribers get it with the schema, and the copies maintain both.
psql_db bench -c "CREATE INDEX pgbench_accounts_bid ON pgbench_accounts (bid)" >/dev/null
psql_db bench -c "CREATE TABLE bench_marker (round int PRIMARY KEY)" >/dev/null
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history, bench_marker" >/dev/null
schema=$(pg_dump --schema-only --no-publications -h 127.0.0.1 -p "$port" -U postgres bench)
for db in native wb; do
  sub postgres -c "CREATE DATABASE $db" >/dev/null
  sub "$db" <<<"$schema" >/dev/null
done

write_pg_sink_config wb
copied="EXISTS (SELECT FROM pg_replication_origin_status s JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = 'walbridge_replica_bench' AND s.remote_lsn > '0/0')"
start_walbridge() { "$bin" run -c "$work/wb/config.toml" 2>>"$work/wb/stderr.log" & wb_pid=$!; }
stop_walbridge() { kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=; }
tables="pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history, bench_marker"

# Initial sync, SYNC_ROUNDS times: each round starts both from nothing
# (no subscription, slot, origin, log or rows).
syncs=()
for round in $(seq 1 "$sync_rounds"); do
  if [ "$round" -gt 1 ]; then
    sub native -c "DROP SUBSCRIPTION native_sub" >/dev/null
    sub native -c "TRUNCATE $tables" >/dev/null
    stop_walbridge
    until [ "$(psql_db bench -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'walbridge_bench' AND active")" = 0 ]; do sleep 0.02; done
    psql_db bench -c "SELECT pg_drop_replication_slot('walbridge_bench')" >/dev/null
    rm -rf "$work/wb/data"
    sub wb -c "TRUNCATE $tables" >/dev/null
    sub wb -c "SELECT pg_replication_origin_drop('walbridge_replica_bench')" >/dev/null
    sub wb -c "CHECKPOINT" >/dev/null
  fi
  start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
  sub native -c "CREATE SUBSCRIPTION native_sub CONNECTION 'host=127.0.0.1 port=$port dbname=bench user=postgres' PUBLICATION bench_pub" >/dev/null 2>&1
  until_sub native "SELECT count(*) FILTER (WHERE srsubstate <> 'r') = 0 AND count(*) = 5 FROM pg_subscription_rel"
  native_sync=$(elapsed "$start")
  native_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s"

  start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
  start_walbridge
  # The source's position appears once every copy connection has committed.
  until_sub wb "$copied"
  wb_sync=$(elapsed "$start")
  wb_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s, walbridge $(cpu_seconds "$wb_pid") s"
  accounts=$(sub wb -c "SELECT count(*) FROM pgbench_accounts")
  [ "$accounts" = 1000000 ] || { echo "walbridge copied $accounts rows, not 1000000" >&2; cat "$work/wb/stderr.log" >&2; exit 1; }
  echo "initial sync $round of 1,000,000 pgbench_accounts rows: native ${native_sync}s, walbridge ${wb_sync}s"
  echo "  CPU: native: $native_cpu; walbridge: $wb_cpu"
  syncs+=("$native_sync $wb_sync")
done

# Both slots settle before a pause: the publisher moves a slot's restart
# point (where decoding starts again) only once its subscriber confirms
# past a record of the running transactions, which a CHECKPOINT writes. A
# side paused sooner after its catch-up than the other would decode part
# of the last round again in the next; a subscriber that keeps running
# never does.
settle_slots() {
  local from; from=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
  local behind="SELECT string_agg(slot_name, ', ') FROM pg_replication_slots WHERE slot_name IN ('native_sub', 'walbridge_bench') AND restart_lsn < '$from'"
  local tries=0 left
  while :; do
    psql_db bench -c "CHECKPOINT" >/dev/null
    sleep 1
    left=$(psql_db bench -c "$behind")
    [ -n "$left" ] || return 0
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
      echo "bench-pg-sink: the restart point of $left did not pass $from in 60 s; going on" >&2
      return 0
    fi
  done
}

results=()
for round in $(seq 1 "$rounds"); do
  settle_slots
  # Pause both; a third slot for pg_recvlogical at the same point.
  sub native -c "ALTER SUBSCRIPTION native_sub DISABLE" >/dev/null
  stop_walbridge
  until [ "$(psql_db bench -c "SELECT count(*) FROM pg_stat_replication")" = 0 ]; do sleep 0.02; done
  psql_db bench -c "SELECT pg_create_logical_replication_slot('recv_slot', 'pgoutput')" >/dev/null
  pgbench -n -c $clients -j 2 -t $((transactions / clients)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
  psql_db bench -c "INSERT INTO bench_marker VALUES ($round)" >/dev/null
  end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
  # Settle the publisher first: autovacuum of what pgbench changed and
  # dirty buffers would otherwise share the CPU with whichever measurement
  # comes first (pg_recvlogical's).
  psql_db bench -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
  sub native -c "CHECKPOINT" >/dev/null

  start=$(now) pub_cpu=$(server_cpu "$work/data")
  pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d bench -S recv_slot --start -E "$end" \
    -o proto_version=1 -o publication_names=bench_pub -f /dev/null
  recv=$(elapsed "$start")
  recv_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s"
  psql_db bench -c "SELECT pg_drop_replication_slot('recv_slot')" >/dev/null

  marker="EXISTS (SELECT FROM bench_marker WHERE round = $round)"
  start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
  sub native -c "ALTER SUBSCRIPTION native_sub ENABLE" >/dev/null
  until_sub native "$marker"
  native=$(elapsed "$start")
  native_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s"

  start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
  start_walbridge
  until_sub wb "$marker"
  wb=$(elapsed "$start")
  wb_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s, walbridge $(cpu_seconds "$wb_pid") s"
  echo "round $round: $transactions transactions: pg_recvlogical ${recv}s, native ${native}s, walbridge ${wb}s ($(python3 -c "print(f'{$native / $wb:.2f}')")x native)"
  echo "  CPU: pg_recvlogical: $recv_cpu; native: $native_cpu; walbridge: $wb_cpu"
  results+=("$recv $native $wb")
done
rss=$(awk '/VmHWM/ {print $2}' "/proc/$wb_pid/status")
stop_walbridge

# Same data on both subscribers.
for table in pgbench_accounts pgbench_branches pgbench_tellers pgbench_history; do
  q="SELECT count(*) || ':' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM $table t"
  [ "$(sub native -c "$q")" = "$(sub wb -c "$q")" ] || { echo "bench-pg-sink: $table differs between the subscribers" >&2; exit 1; }
done

python3 - "$transactions" "$rss" "${syncs[*]}" "${results[@]}" <<'PY'
import statistics, sys
n, rss = int(sys.argv[1]), int(sys.argv[2])
pairs = list(map(float, sys.argv[3].split()))
native_sync, wb_sync = statistics.median(pairs[0::2]), statistics.median(pairs[1::2])
rounds = [tuple(map(float, r.split())) for r in sys.argv[4:]]
recv, native, wb = (statistics.median(r[i] for r in rounds) for i in range(3))
print(f"catch-up, median of {len(rounds)} rounds of {n} TPC-B transactions:")
print(f"  pg_recvlogical (ceiling): {recv:6.2f} s {n / recv:8.0f} transactions/s")
print(f"  native subscription:      {native:6.2f} s {n / native:8.0f} transactions/s  ({100 * recv / native:.0f}% of the ceiling)")
print(f"  walbridge postgres sink:  {wb:6.2f} s {n / wb:8.0f} transactions/s  ({100 * recv / wb:.0f}% of the ceiling, {native / wb:.2f}x native, peak RSS {rss / 1024:.0f} MB)")
ratios = sorted(r[1] / r[2] for r in rounds)
print(f"  walbridge against native, round by round: {statistics.median(ratios):.2f}x median, {ratios[0]:.2f}x-{ratios[-1]:.2f}x")
print(f"initial sync, median of {len(pairs) // 2}: native {native_sync:.2f} s, walbridge {wb_sync:.2f} s ({native_sync / wb_sync:.2f}x native)")
PY
