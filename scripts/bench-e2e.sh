#!/usr/bin/env bash
# End-to-end throughput: walbridge → jsonl (to /dev/null) against
# pg_recvlogical decoding the same WAL range with pgoutput — the walsender's
# ceiling. Both start from slots created at the same point, after a pgbench
# TPC-B run has produced the WAL.
#
#   scripts/bench-e2e.sh                 # 50,000 transactions
#   TRANSACTIONS=200000 scripts/bench-e2e.sh
#   OUTPUT=/tmp/out.jsonl scripts/bench-e2e.sh   # keep the lines, count them
#   BASELINE_BIN=/path/to/walbridge scripts/bench-e2e.sh
#       # also run another build (an older commit, say) on the same WAL
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
transactions=${TRANSACTIONS:-50000}
clients=4

build_walbridge
start_postgres
psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history" >/dev/null
psql_db bench -c "SELECT pg_create_logical_replication_slot('recv_slot', 'pgoutput')" >/dev/null
psql_db bench -c "SELECT pg_create_logical_replication_slot('wb_slot', 'pgoutput')" >/dev/null
if [ -n "${BASELINE_BIN:-}" ]; then
  psql_db bench -c "SELECT pg_create_logical_replication_slot('base_slot', 'pgoutput')" >/dev/null
fi
pgbench -n -c $clients -j 2 -t $((transactions / clients)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
wal=$(psql_db bench -c "SELECT pg_size_pretty(pg_wal_lsn_diff('$end', confirmed_flush_lsn)) FROM pg_replication_slots WHERE slot_name = 'recv_slot'")
echo "WAL to decode: $wal, $transactions pgbench transactions (end $end)"

start=$(date +%s.%N)
pg_recvlogical -h 127.0.0.1 -p "$port" -U postgres -d bench -S recv_slot --start -E "$end" \
  -o proto_version=1 -o publication_names=bench_pub -f /dev/null
recv=$(python3 -c "print(f'{$(date +%s.%N) - $start:.3f}')")

output=${OUTPUT:-/dev/null}
read -r wb peak_rss_kb _ < <(walbridge_until wb_slot "$end" bench bench_pub "$output")
if [ "$output" != /dev/null ]; then
  echo "walbridge wrote $(wc -l < "$output") lines (4 changes per transaction expected)"
  rm -f "$output"
fi
base=0 base_rss_kb=0
if [ -n "${BASELINE_BIN:-}" ]; then
  main_bin=$bin bin=$BASELINE_BIN
  read -r base base_rss_kb _ < <(walbridge_until base_slot "$end" bench bench_pub "$output")
  bin=$main_bin
  [ "$output" != /dev/null ] && rm -f "$output"
fi
python3 - "$transactions" "$recv" "$wb" "$peak_rss_kb" "$base" "$base_rss_kb" <<'PY'
import sys
n, recv, wb, rss, base, base_rss = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
print(f"pg_recvlogical (ceiling): {recv:7.2f} s  {n / recv:9.0f} transactions/s")
print(f"walbridge -> jsonl:      {wb:7.2f} s  {n / wb:9.0f} transactions/s  ({100 * recv / wb:.0f}% of the ceiling, peak RSS {rss / 1024:.0f} MB)")
if base:
    print(f"baseline build:          {base:7.2f} s  {n / base:9.0f} transactions/s  ({100 * recv / base:.0f}% of the ceiling, peak RSS {base_rss / 1024:.0f} MB); this build runs at {100 * base / wb:.0f}% of it")
PY
