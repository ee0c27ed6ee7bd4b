#!/usr/bin/env bash
# One transaction of ROWS rows (default 2,000,000), streamed by the
# publisher and spilled by walbridge: the time until walbridge has written
# and confirmed it, its peak RSS, the most its spill files held, and that
# every row arrived.
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
rows=${ROWS:-2000000}

build_walbridge
start_postgres "logical_decoding_work_mem = 64MB"
psql_db postgres -c "CREATE TABLE big (id int PRIMARY KEY, payload text)" >/dev/null
psql_db postgres -c "CREATE PUBLICATION big_pub FOR TABLE big" >/dev/null
psql_db postgres -c "SELECT pg_create_logical_replication_slot('big_slot', 'pgoutput')" >/dev/null
psql_db postgres -c "INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, $rows) g" >/dev/null
end=$(psql_db postgres -c "SELECT pg_current_wal_lsn()")
# The most the spill directory held, sampled every 100 ms.
spill_dir="$work/wb-big_slot/data/sources/bench/spill"
( peak=0; while :; do
    size=$(du -sb "$spill_dir" 2>/dev/null | cut -f1 || true); size=${size:-0}
    [ "$size" -gt "$peak" ] && { peak=$size; echo "$peak" > "$work/spill-peak"; }
    sleep 0.1
  done ) & sampler=$!
read -r seconds peak_rss_kb _ < <(walbridge_until big_slot "$end" postgres big_pub "$work/out.jsonl")
kill "$sampler" 2>/dev/null || true
spilled=$(cat "$work/spill-peak" 2>/dev/null || echo 0)
lines=$(wc -l < "$work/out.jsonl")
echo "rows: $rows, lines written: $lines, time: ${seconds}s, peak RSS: $((peak_rss_kb / 1024)) MB, spilled at most: $((spilled / 1000000)) MB"
[ "$lines" = "$rows" ] || { echo "bench-large-txn: expected $rows lines" >&2; exit 1; }
