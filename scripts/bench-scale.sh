#!/usr/bin/env bash
# How walbridge's cost grows with what it is given, one run each:
#
# * tables:  a publication of 1, 100, 1,000 and 10,000 tables (one row
#            each; TABLES), from walbridge's start to streaming with the
#            initial copy in a jsonl file: start-up, planning of the copy,
#            the whole, peak RSS, RSS once streaming;
# * sources: 1, 10 and 50 sources in one process (SOURCES), each with its
#            slot and a one-table publication, into one jsonl sink: RSS and
#            CPU while idle (IDLE seconds, default 10), then under LOAD
#            inserts/s (default 1,000) spread over the sources' tables for
#            LOAD_SECONDS (default 10);
# * widths:  rows of 100 B, 10 kB and 1 MB (WIDTHS, bytes), about
#            WIDTH_MB (default 200) MB of values each, in transactions of
#            about 2 MB, streamed into a jsonl file: MB/s, peak RSS, CPU.
#
# (One transaction of 10,000,000 rows: `ROWS=10000000
# scripts/bench-large-txn.sh`.)
#
# Prints a table per part, keeps it in PLOTS (default bench-scale/ under
# the current directory) and draws it there as a PNG with matplotlib
# (scripts/bench-scale-plot.py; installed into the benchmarks' venv when
# missing).
#
#   scripts/bench-scale.sh
#   PARTS=tables TABLES="1 100" scripts/bench-scale.sh
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
parts=${PARTS:-tables sources widths}
table_counts=${TABLES:-1 100 1000 10000}
source_counts=${SOURCES:-1 10 50}
widths=${WIDTHS:-100 10000 1000000}
idle=${IDLE:-10}
load=${LOAD:-1000}
load_seconds=${LOAD_SECONDS:-10}
width_mb=${WIDTH_MB:-200}
plots=${PLOTS:-$PWD/bench-scale}
mkdir -p "$plots"
python=$(bench_venv)

build_walbridge
start_postgres "max_wal_senders = 70" "max_replication_slots = 70" "max_locks_per_transaction = 1024" "max_connections = 200"

# Resident and peak memory of process $1, kB.
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }
# Seconds from walbridge's start to its first log line containing $2 ($1: log).
log_time() { python3 - "$1" "$2" "$3" <<'PY'
import datetime, sys
path, text, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
for line in open(path):
    if text in line:
        stamp = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
        print(f"{stamp.timestamp() - start:.2f}")
        break
else:
    sys.exit(f"no line with {text!r} in {path}")
PY
}
# The `seconds` a log line with $2 reports ($1: log).
log_seconds() { grep -m1 -- "$2" "$1" | sed -E 's/.*seconds="?([0-9.]+).*/\1/'; }

# Waits until file $1 has $2 lines; fails if walbridge exits first.
until_lines() {
  until [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ]; do
    kill -0 "$wb_pid" 2>/dev/null || { cat "$wb_log" >&2; exit 1; }
    sleep 0.05
  done
}

run_walbridge() { "$bin" run -c "$1/config.toml" 2>"$1/stderr.log" & wb_pid=$!; wb_log="$1/stderr.log"; }
stop_walbridge() { kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=; }

tables_part() {
  echo "tables in the publication | start-up to copy s | planning s | start to streaming s | peak RSS MB | RSS streaming MB" > "$work/tables.txt"
  local n
  for n in $table_counts; do
    local db=tables_$n dir="$work/tables-$n"
    psql_db postgres -c "CREATE DATABASE $db" >/dev/null
    # Batches of 500 tables per transaction (each holds a lock per table).
    psql_db "$db" -c "DO \$\$ BEGIN FOR i IN 1..$n LOOP
        EXECUTE format('CREATE TABLE t%s (id int PRIMARY KEY, v text); INSERT INTO t%s VALUES (1, %L)', i, i, 'row');
        IF i % 500 = 0 THEN COMMIT; END IF;
      END LOOP; END \$\$" -c "CREATE PUBLICATION pub FOR ALL TABLES" >/dev/null
    mkdir -p "$dir"
    cat > "$dir/config.toml" <<CONF
data_dir = "$dir/data"
[[source]]
name = "src"
connection = "host=127.0.0.1 port=$port dbname=$db user=postgres sslmode=disable"
publications = ["pub"]
[[sink]]
name = "out"
type = "jsonl"
path = "$dir/out.jsonl"
CONF
    local start; start=$(now)
    run_walbridge "$dir"
    until_lines "$dir/out.jsonl" "$n"
    until grep -q "streaming changes" "$dir/stderr.log"; do sleep 0.05; done
    local to_copy planning streaming
    to_copy=$(log_time "$dir/stderr.log" "initial copy starting" "$start")
    planning=$(log_seconds "$dir/stderr.log" "planned the initial copy")
    streaming=$(log_time "$dir/stderr.log" "streaming changes" "$start")
    sleep 2
    echo "$n | $to_copy | $planning | $streaming | $(( $(hwm_kb "$wb_pid") / 1024 )) | $(( $(rss_kb "$wb_pid") / 1024 ))" >> "$work/tables.txt"
    stop_walbridge
    psql_db "$db" -c "SELECT pg_drop_replication_slot('walbridge_src')" >/dev/null
  done
}

sources_part() {
  local max; max=$(printf '%s\n' $source_counts | sort -n | tail -1)
  psql_db postgres -c "CREATE DATABASE sources" >/dev/null
  local i
  for i in $(seq 1 "$max"); do
    psql_db sources -c "CREATE TABLE s$i (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), v text)" \
      -c "CREATE PUBLICATION pub$i FOR TABLE s$i" >/dev/null
  done
  echo "sources | RSS idle MB | CPU idle % of a core | RSS under load MB | CPU under load % of a core | per source: RSS idle MB, CPU under load %" > "$work/sources.txt"
  local n
  for n in $source_counts; do
    local dir="$work/sources-$n"
    mkdir -p "$dir"
    echo "data_dir = \"$dir/data\"" > "$dir/config.toml"
    for i in $(seq 1 "$n"); do
      cat >> "$dir/config.toml" <<CONF
[[source]]
name = "src$i"
connection = "host=127.0.0.1 port=$port dbname=sources user=postgres sslmode=disable"
publications = ["pub$i"]
copy_data = false
CONF
    done
    cat >> "$dir/config.toml" <<CONF
[[sink]]
name = "out"
type = "jsonl"
path = "$dir/out.jsonl"
CONF
    run_walbridge "$dir"
    until [ "$(grep -c "streaming changes" "$dir/stderr.log" || true)" -ge "$n" ]; do
      kill -0 "$wb_pid" 2>/dev/null || { cat "$wb_log" >&2; exit 1; }
      sleep 0.1
    done
    sleep 2
    local cpu0 cpu1 cpu2 rss_idle rss_load
    cpu0=$(cpu_seconds "$wb_pid")
    sleep "$idle"
    cpu1=$(cpu_seconds "$wb_pid")
    rss_idle=$(rss_kb "$wb_pid")
    # Each insert goes to one source's table, chosen at random.
    printf '\\set t random(1, %s)\nINSERT INTO s:t (v) VALUES (repeat(%s, 100));\n' "$n" "'x'" > "$dir/load.sql"
    pgbench -n -M simple -f "$dir/load.sql" -R "$load" -T "$load_seconds" -c 4 -j 2 -h 127.0.0.1 -p "$port" -U postgres sources >/dev/null 2>&1
    local total; total=$(psql_db sources -c "SELECT $(for i in $(seq 1 "$n"); do printf '(SELECT count(*) FROM s%s) + ' "$i"; done) 0")
    until_lines "$dir/out.jsonl" "$total"
    cpu2=$(cpu_seconds "$wb_pid")
    rss_load=$(hwm_kb "$wb_pid")
    python3 - "$n" "$rss_idle" "$cpu0" "$cpu1" "$idle" "$rss_load" "$cpu2" "$load_seconds" >> "$work/sources.txt" <<'PY'
import sys
n, rss_idle, cpu0, cpu1, idle, rss_load, cpu2, secs = sys.argv[1:]
n = int(n)
idle_pct = 100 * (float(cpu1) - float(cpu0)) / float(idle)
load_pct = 100 * (float(cpu2) - float(cpu1)) / float(secs)
print(f"{n} | {int(rss_idle) / 1024:.0f} | {idle_pct:.1f} | {int(rss_load) / 1024:.0f} | {load_pct:.0f} | {int(rss_idle) / 1024 / n:.1f}, {load_pct / n:.1f}")
PY
    stop_walbridge
    for i in $(seq 1 "$n"); do
      psql_db sources -c "SELECT pg_drop_replication_slot('walbridge_src$i')" -c "TRUNCATE s$i" >/dev/null
    done
  done
}

widths_part() {
  psql_db postgres -c "CREATE DATABASE widths" >/dev/null
  echo "row width bytes | rows | MB | seconds | MB/s | peak RSS MB | CPU s" > "$work/widths.txt"
  local width
  for width in $widths; do
    # Values as they are (no compression), so the bytes moved are the width.
    psql_db widths -c "DROP TABLE IF EXISTS w" -c "DROP PUBLICATION IF EXISTS wpub" \
      -c "CREATE TABLE w (id int PRIMARY KEY, v text)" -c "ALTER TABLE w ALTER v SET STORAGE EXTERNAL" \
      -c "CREATE PUBLICATION wpub FOR TABLE w" -c "SELECT pg_create_logical_replication_slot('w$width', 'pgoutput')" >/dev/null
    local rows=$(( width_mb * 1000000 / width )) per_txn=$(( 2000000 / width ))
    [ "$per_txn" -ge 1 ] || per_txn=1
    psql_db widths -c "DO \$\$ BEGIN FOR b IN 0..$(( (rows - 1) / per_txn )) LOOP
        INSERT INTO w SELECT g, repeat('x', $width) FROM generate_series(b * $per_txn + 1, least((b + 1) * $per_txn, $rows)) g;
        COMMIT;
      END LOOP; END \$\$" >/dev/null
    local end; end=$(psql_db widths -c "SELECT pg_current_wal_lsn()")
    local seconds peak cpu
    read -r seconds peak cpu < <(walbridge_until "w$width" "$end" widths wpub "$work/w$width.jsonl")
    local lines; lines=$(wc -l < "$work/w$width.jsonl")
    [ "$lines" = "$rows" ] || { echo "widths: $lines lines for $rows rows of $width bytes" >&2; exit 1; }
    python3 -c "
w, rows, s = $width, $rows, $seconds
mb = w * rows / 1e6
print(f'{w} | {rows} | {mb:.0f} | {s:.2f} | {mb / s:.0f} | {$peak / 1024:.0f} | $cpu')" >> "$work/widths.txt"
    psql_db widths -c "SELECT pg_drop_replication_slot('w$width')" >/dev/null
  done
}

for part in $parts; do
  case $part in
    tables) tables_part ;;
    sources) sources_part ;;
    widths) widths_part ;;
    *) echo "unknown part $part (tables, sources, widths)" >&2; exit 2 ;;
  esac
  echo "== $part"
  cat "$work/$part.txt"
  cp "$work/$part.txt" "$plots/$part.txt"
  "$python" "$here/scripts/bench-scale-plot.py" "$plots/$part.txt" "$plots/$part.png" "$part"
done
