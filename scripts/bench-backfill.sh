#!/usr/bin/env bash
# A table added to a publication while replication runs: the time until
# the target holds its 1,000,000 rows (pgbench scale 10's
# pgbench_accounts), for PostgreSQL's own logical replication (ALTER
# SUBSCRIPTION … REFRESH PUBLICATION's table sync) and for walbridge
# (copy while streaming, in key-ordered chunks between watermarks, from
# its start: it finds the table added while it was stopped), one after the
# other, on one machine, in one run, into the same subscriber cluster;
# idle, and with pgbench writing RATE transactions/s meanwhile.
#
#   scripts/bench-backfill.sh                  # walbridge's default chunks
#   RATE=500 CHUNK=8192 scripts/bench-backfill.sh   # backfill_chunk_rows = 8192
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
rate=${RATE:-300}
chunk=${CHUNK:-}

build_walbridge
start_postgres "max_wal_senders = 20" "max_replication_slots = 20"
start_second_postgres "max_wal_size = 8GB" "shared_buffers = 512MB" "max_logical_replication_workers = 8" "wal_retrieve_retry_interval = 100ms"

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 10 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
schema=$(pg_dump --schema-only --no-publications -h 127.0.0.1 -p "$port" -U postgres bench)
write_pg_sink_config wb
# The source's keys go in its section, before the sink's.
python3 - "$work/wb/config.toml" "$chunk" <<'PY'
import sys
path, chunk = sys.argv[1], sys.argv[2]
rows = f'\nbackfill_chunk_rows = {chunk}' if chunk else ''
text = open(path).read().replace('publications = ["bench_pub"]', f'publications = ["bench_pub"]{rows}\nrefresh_interval = 1')
open(path, "w").write(text)
PY

for load in idle "${rate} tx/s"; do
  psql_db bench -c "DROP PUBLICATION IF EXISTS bench_pub" -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_branches, pgbench_tellers, pgbench_history" >/dev/null
  for db in native wb; do
    sub postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    sub "$db" <<<"$schema" >/dev/null
  done
  rm -rf "$work/wb/data"
  psql_db bench -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null
  sub native -c "CREATE SUBSCRIPTION native_sub CONNECTION 'host=127.0.0.1 port=$port dbname=bench user=postgres' PUBLICATION bench_pub" >/dev/null 2>&1
  "$bin" run -c "$work/wb/config.toml" 2>>"$work/wb/stderr.log" & wb_pid=$!
  until_sub native "SELECT count(*) FILTER (WHERE srsubstate <> 'r') = 0 AND count(*) = 3 FROM pg_subscription_rel"
  until [ "$(psql_db bench -c "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'bench' AND state = 'streaming'")" = 1 ]; do sleep 0.05; done
  writer=
  if [ "$load" != idle ]; then
    pgbench -n -b simple-update -R "$rate" -T 600 -c 2 -j 2 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1 & writer=$!
    sleep 2
  fi
  # One after the other, each alone with the writer: walbridge stops
  # (streaming was established), and finds the table when it starts again.
  kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
  psql_db bench -c "ALTER PUBLICATION bench_pub ADD TABLE pgbench_accounts" >/dev/null
  start=$(now)
  sub native -c "ALTER SUBSCRIPTION native_sub REFRESH PUBLICATION" >/dev/null
  until_sub native "SELECT count(*) FILTER (WHERE srsubstate <> 'r') = 0 AND count(*) = 4 FROM pg_subscription_rel"
  native=$(elapsed "$start")
  : > "$work/wb/stderr.log"
  start=$(now)
  "$bin" run -c "$work/wb/config.toml" 2>>"$work/wb/stderr.log" & wb_pid=$!
  until grep -q "table copied while streaming" "$work/wb/stderr.log"; do
    kill -0 "$wb_pid" 2>/dev/null || { cat "$work/wb/stderr.log" >&2; exit 1; }
    sleep 0.01
  done
  until_sub wb "(SELECT count(*) FROM pgbench_accounts) = 1000000"
  walbridge=$(elapsed "$start")
  [ -n "$writer" ] && kill "$writer" 2>/dev/null; wait "$writer" 2>/dev/null || true
  echo "a 1,000,000-row table added to the publication ($load): native ${native}s, walbridge ${walbridge}s ($(python3 -c "print(f'{1000000/$walbridge:,.0f}')") rows/s, chunks: ${chunk:-default})"
  kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
  sub native -c "DROP SUBSCRIPTION native_sub" >/dev/null
done
