#!/usr/bin/env bash
# The initial copy: walbridge's postgres sink against a native
# subscription's table sync, on one machine, into one subscriber cluster
# (default settings but for memory and WAL size), both from nothing each
# round: no subscription, slot, origin, log or rows.
#
# Cases (CASES, default all three), each table shaped like
# pgbench_accounts (an int primary key, a secondary index on bid, 84
# bytes of filler):
#
# * accounts: 1,000,000 rows in one table, ROUNDS rounds (default 5);
# * tables10: 10 tables of 100,000 rows, BIG_ROUNDS rounds (default 1);
# * big:      5,000,000 rows in one table, BIG_ROUNDS rounds.
#
# A copy is done when the target holds every row with every index:
# native, once every table is `ready`; walbridge, once its position is
# stored (after the deferred indexes are built). Reports per case the
# median time of each and the ratio, every round's ratio, rows/s and MB/s
# (MB of the publisher's tables, heap only), and the CPU each side took.
#
# And the floor: the same copy made by the two servers alone, nothing
# between them but pipes — each table's pages in LANES ctid ranges
# (default 2, as walbridge's copy_connections), `COPY … TO STDOUT` on the
# publisher piped by psql into `COPY … FROM STDIN` on the subscriber, the
# lanes side by side, into the table without its indexes, then its
# indexes and constraints built LANES at a time (without parallel
# maintenance workers; a constraint's index first, then the constraint
# on it; the rows committed with synchronous_commit off: as walbridge
# builds them and as its sink commits by default). What any tool loading
# through COPY makes the servers do, without the tool's own work: on a
# machine whose cores the servers fill, no such tool copies faster. Only
# for one table (with many, psql's start-ups, a pair per table and lane,
# would be measured too).
#
#   scripts/bench-initial-copy.sh
#   CASES=accounts ROUNDS=3 scripts/bench-initial-copy.sh
#   SINK_EXTRA='defer_indexes = false' CASES=accounts scripts/bench-initial-copy.sh
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
cases=${CASES:-accounts tables10 big}
rounds=${ROUNDS:-5}
big_rounds=${BIG_ROUNDS:-1}

build_walbridge
start_postgres "max_wal_senders = 40" "max_replication_slots = 40"
# A short retry interval: a new subscription starts its workers at once.
start_second_postgres "max_wal_size = 16GB" "shared_buffers = 512MB" "max_logical_replication_workers = 8" "wal_retrieve_retry_interval = 100ms"

declare -A table_pages
# Creates database $1 on the publisher with tables $2… of $rows rows each.
make_source() {
  local db=$1 rows=$2; shift 2
  psql_db postgres -c "CREATE DATABASE $db" >/dev/null
  local table
  for table in "$@"; do
    psql_db "$db" -c "CREATE TABLE $table (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84))" \
      -c "INSERT INTO $table SELECT g, (g - 1) / 100000 + 1, 0, '' FROM generate_series(1, $rows) g" \
      -c "CREATE INDEX ${table}_bid ON $table (bid)" -c "VACUUM ANALYZE $table" >/dev/null
    table_pages[$table]=$(psql_db "$db" -c "SELECT pg_relation_size('$table') / current_setting('block_size')::int")
  done
  psql_db "$db" -c "CREATE PUBLICATION pub FOR TABLE $(IFS=,; echo "$*")" >/dev/null
  local schema; schema=$(pg_dump --schema-only --no-publications -h 127.0.0.1 -p "$port" -U postgres "$db")
  local side
  for side in native wb; do
    sub postgres -c "CREATE DATABASE ${db}_$side" >/dev/null
    sub "${db}_$side" <<<"$schema" >/dev/null
  done
  # The floor (one table only, see above): its tables are made without
  # indexes each round.
  if [ $# -eq 1 ]; then
    pg_dump --section=pre-data --no-publications -h 127.0.0.1 -p "$port" -U postgres "$db" > "$work/$db.pre.sql"
    # Its indexes, one per line, built as walbridge builds them: a
    # constraint's as a unique index that then becomes the constraint, so
    # that it takes only a SHARE lock and the table's other indexes are built
    # beside it.
    sub "${db}_native" > "$work/$db.post.sql" <<'SQL'
SELECT pg_get_indexdef(i.indexrelid)
       || CASE WHEN c.oid IS NULL THEN '' ELSE format('; ALTER TABLE %s ADD CONSTRAINT %I %s USING INDEX %I',
            i.indrelid::regclass, c.conname, CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' ELSE 'UNIQUE' END, ic.relname) END
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = ic.relnamespace AND n.nspname = 'public'
LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.contype IN ('p', 'u')
SQL
  fi
}

lanes=${LANES:-2}
# One lane of the floor: `floor_lane db lane table…` pipes the lane's
# ctid range of each table from the publisher to the subscriber.
floor_lane() {
  local db=$1 lane=$2; shift 2
  local table pages lo hi
  for table in "$@"; do
    pages=${table_pages[$table]}
    lo=$(( pages * lane / lanes )) hi=$(( pages * (lane + 1) / lanes ))
    # The last lane to the end, should the table have grown.
    [ "$lane" -eq $(( lanes - 1 )) ] && hi=4294967295
    psql_db "$db" -c "COPY (SELECT * FROM $table WHERE ctid >= '($lo,0)'::tid AND ctid < '($hi,0)'::tid) TO STDOUT" \
      | PGOPTIONS="-c synchronous_commit=off" sub "${db}_floor" -c "COPY $table FROM STDIN" || return
  done
}

# The floor's copy of database $1's tables $2…, from empty tables without
# indexes to every row and index.
floor_copy() {
  local db=$1; shift
  local lane pid pids=()
  for lane in $(seq 0 $(( lanes - 1 ))); do
    floor_lane "$db" "$lane" "$@" & pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { echo "the floor's copy failed" >&2; exit 1; }
  done
  PGOPTIONS="-c max_parallel_maintenance_workers=0" xargs -d '\n' -P "$lanes" -I{} \
    psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port2" -U postgres -d "${db}_floor" -c {} < "$work/$db.post.sql" >/dev/null
}

# One case: `copy_case name db rounds table…`; adds its result line to
# $work/summary.
copy_case() {
  local name=$1 db=$2 n=$3; shift 3
  local tables; tables=$(IFS=,; echo "$*")
  local rows mb
  local count_rows; count_rows="SELECT sum(n) FROM (VALUES $(printf "((SELECT count(*) FROM %s)), " "$@" | sed 's/, $//')) c(n)"
  rows=$(psql_db "$db" -c "$count_rows")
  mb=$(psql_db "$db" -c "SELECT round(sum(pg_table_size(relid)) / 1e6) FROM pg_stat_user_tables")
  mkdir -p "$work/$name"
  wb_log="$work/$name/stderr.log"
  cat > "$work/$name/config.toml" <<CONF
data_dir = "$work/$name/data"

[[source]]
name = "src"
connection = "host=127.0.0.1 port=$port dbname=$db user=postgres sslmode=disable"
publications = ["pub"]
${SOURCE_EXTRA:-}
[[sink]]
name = "replica"
type = "postgres"
connection = "host=127.0.0.1 port=$port2 dbname=${db}_wb user=postgres sslmode=disable"
${SINK_EXTRA:-}
CONF
  local stored="EXISTS (SELECT FROM pg_replication_origin_status s JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = 'walbridge_replica_src' AND s.remote_lsn > '0/0')"
  local ready="SELECT count(*) FILTER (WHERE srsubstate <> 'r') = 0 AND count(*) = $# FROM pg_subscription_rel"
  local round start pub_cpu sub_cpu native wb results=()
  for round in $(seq 1 "$n"); do
    sub "${db}_native" -c CHECKPOINT >/dev/null
    start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
    sub "${db}_native" -c "CREATE SUBSCRIPTION native_$db CONNECTION 'host=127.0.0.1 port=$port dbname=$db user=postgres' PUBLICATION pub" >/dev/null 2>&1
    until_sub "${db}_native" "$ready"
    native=$(elapsed "$start")
    local native_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s"
    sub "${db}_native" -c "DROP SUBSCRIPTION native_$db" -c "TRUNCATE $tables" -c CHECKPOINT >/dev/null 2>&1

    start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
    "$bin" run -c "$work/$name/config.toml" 2>>"$wb_log" & wb_pid=$!
    until_sub "${db}_wb" "$stored"
    wb=$(elapsed "$start")
    local wb_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s, walbridge $(cpu_seconds "$wb_pid") s"
    kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
    local got; got=$(sub "${db}_wb" -c "$count_rows")
    [ "$got" = "$rows" ] || { echo "$name: walbridge copied $got rows, not $rows" >&2; cat "$wb_log" >&2; exit 1; }
    local indexes="SELECT string_agg(indexdef, ';' ORDER BY indexdef) FROM pg_indexes WHERE schemaname = 'public' AND tablename NOT LIKE 'walbridge%'"
    [ "$(sub "${db}_wb" -c "$indexes")" = "$(sub "${db}_native" -c "$indexes")" ] \
      || { echo "$name: the indexes differ after walbridge's copy" >&2; exit 1; }
    echo "$name round $round: native ${native}s ($native_cpu); walbridge ${wb}s ($wb_cpu)"
    local floor=-
    if [ $# -eq 1 ]; then
      sub postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS ${db}_floor" -c "CREATE DATABASE ${db}_floor" >/dev/null
      sub "${db}_floor" < "$work/$db.pre.sql" >/dev/null
      sub "${db}_floor" -c CHECKPOINT >/dev/null
      start=$(now) pub_cpu=$(server_cpu "$work/data") sub_cpu=$(server_cpu "$work/data2")
      floor_copy "$db" "$@"
      floor=$(elapsed "$start")
      local floor_cpu="publisher $(minus "$(server_cpu "$work/data")" "$pub_cpu") s, subscriber $(minus "$(server_cpu "$work/data2")" "$sub_cpu") s"
      got=$(sub "${db}_floor" -c "$count_rows")
      [ "$got" = "$rows" ] || { echo "$name: the floor copied $got rows, not $rows" >&2; exit 1; }
      [ "$(sub "${db}_floor" -c "$indexes")" = "$(sub "${db}_native" -c "$indexes")" ] \
        || { echo "$name: the indexes differ after the floor's copy" >&2; exit 1; }
      echo "$name round $round: floor ${floor}s ($floor_cpu)"
    fi
    results+=("$native $wb $floor")
    psql_db "$db" -c "SELECT pg_drop_replication_slot('walbridge_src')" >/dev/null
    rm -rf "$work/$name/data"
    sub "${db}_wb" -c "TRUNCATE $tables" -c "SELECT pg_replication_origin_drop('walbridge_replica_src')" -c CHECKPOINT >/dev/null
  done
  python3 - "$name" "$rows" "$mb" "${results[@]}" >> "$work/summary" <<'PY'
import statistics, sys
name, rows, mb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rounds = [(float(n), float(w), f) for n, w, f in (r.split() for r in sys.argv[4:])]
native = statistics.median(r[0] for r in rounds)
wb = statistics.median(r[1] for r in rounds)
ratios = ", ".join(f"{n / w:.2f}x" for n, w, _ in rounds)
line = (f"{name}: {rows:,} rows, {mb:.0f} MB, median of {len(rounds)}: "
        f"native {native:.2f} s ({rows / native:,.0f} rows/s, {mb / native:.0f} MB/s), "
        f"walbridge {wb:.2f} s ({rows / wb:,.0f} rows/s, {mb / wb:.0f} MB/s) = {native / wb:.2f}x native (rounds: {ratios})")
if rounds[0][2] != "-":
    floor = statistics.median(float(r[2]) for r in rounds)
    floors = ", ".join(f"{n / float(f):.2f}x" for n, _, f in rounds)
    line += f"; floor {floor:.2f} s = {native / floor:.2f}x native (rounds: {floors}), walbridge at {floor / wb:.0%} of the floor's speed"
print(line)
PY
}

for case in $cases; do
  case $case in
    accounts)
      make_source accounts 1000000 accounts
      copy_case accounts accounts "$rounds" accounts ;;
    tables10)
      make_source tables10 100000 t01 t02 t03 t04 t05 t06 t07 t08 t09 t10
      copy_case tables10 tables10 "$big_rounds" t01 t02 t03 t04 t05 t06 t07 t08 t09 t10 ;;
    big)
      make_source big 5000000 big
      copy_case big big "$big_rounds" big ;;
    *) echo "unknown case $case (accounts, tables10, big)" >&2; exit 2 ;;
  esac
done
cat "$work/summary"
