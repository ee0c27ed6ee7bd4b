#!/usr/bin/env bash
# What the admin endpoint costs walbridge: the catch-up of the postgres
# sink (as in bench-pg-sink.sh) with the endpoint off, and on while it is
# scraped every second, counted in instructions (valgrind's callgrind)
# rather than timed.
#
# Why instructions: on a small shared machine the same catch-up varies by
# about 15% from round to round in time, far more than the 3% to be shown;
# an instruction count does not depend on what else the machine does. It
# is conservative here: under valgrind the run takes about 50 times as
# long, so the endpoint's timers (the slot poll every 5 s, the status
# page's sample every 10 s) and the scrapes fire about 50 times as often
# per transaction as in a native run.
#
# Each round makes TRANSACTIONS TPC-B transactions while walbridge is
# stopped, then counts the instructions walbridge takes from its start
# until the subscriber has a marker committed last: with the endpoint off,
# on (as deployed, where a scrape every 15-30 s is rare next to this), and
# on while scraped every second (which also gives one scrape's cost).
#
# The callgrind files are kept in target/callgrind/ (callgrind_annotate
# shows where the instructions went).
#
#   scripts/bench-admin-overhead.sh
#   TRANSACTIONS=20000 ROUNDS=2 scripts/bench-admin-overhead.sh
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
transactions=${TRANSACTIONS:-2000}
rounds=${ROUNDS:-2}
command -v valgrind >/dev/null || { echo "bench-admin-overhead: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench-admin-overhead: needs curl (apt-get install curl)" >&2; exit 1; }

# rustix (under procfs, which the process metrics read) finds the vDSO in
# a way valgrind does not follow and crashes there (rustix issue 1559):
# this build uses rustix's libc backend, in a target directory of its own.
if [ -z "${WALBRIDGE_BIN:-}" ]; then
  RUSTFLAGS="--cfg rustix_use_libc" cargo build --quiet --release -p walbridge \
    --manifest-path "$here/Cargo.toml" --target-dir "$here/target/callgrind"
fi
bin="${WALBRIDGE_BIN:-$here/target/callgrind/release/walbridge}"
start_postgres "max_wal_senders = 10" "max_replication_slots = 10"
start_second_postgres "synchronous_commit = off"
sub() { psql -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port2" -U postgres -d bench "$@"; }

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
pgbench -q -i -s 1 -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null 2>&1
psql_db bench -c "CREATE TABLE bench_marker (round int PRIMARY KEY)" >/dev/null
psql_db bench -c "CREATE PUBLICATION bench_pub FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history, bench_marker" >/dev/null
psql -X -q -h 127.0.0.1 -p "$port2" -U postgres -d postgres -c "CREATE DATABASE bench" >/dev/null
pg_dump --schema-only --no-publications -h 127.0.0.1 -p "$port" -U postgres bench | sub >/dev/null

write_pg_sink_config bench
until_marker() {
  until [ "$(sub -c "SELECT EXISTS (SELECT FROM bench_marker WHERE round = $1)")" = t ]; do
    kill -0 "$wb_pid" 2>/dev/null || { cat "$work/wb/stderr.log" >&2; exit 1; }
    sleep 0.1
  done
}
# The initial copy, natively, with a first marker.
psql_db bench -c "INSERT INTO bench_marker VALUES (0)" >/dev/null
"$bin" run -c "$work/wb/config.toml" 2>>"$work/wb/stderr.log" & wb_pid=$!
until_marker 0
kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=

# Args: round, admin listen address ("" for off), seconds between scrapes
# ("" for none). Prints the instructions and the scrapes answered.
count_catch_up() {
  local round=$1 listen=$2 every=$3 out="$work/callgrind.$1"
  pgbench -n -c 4 -j 2 -t $((transactions / 4)) -h 127.0.0.1 -p "$port" -U postgres bench >/dev/null
  psql_db bench -c "INSERT INTO bench_marker VALUES ($round)" >/dev/null
  rm -f "$work/wb/data/admin.address" "$work/scrapes"
  touch "$work/scrapes"
  WALBRIDGE_ADMIN_LISTEN=$listen valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$bin" run -c "$work/wb/config.toml" 2>>"$work/wb/stderr.log" &
  wb_pid=$!
  local scraper=
  if [ -n "$every" ]; then
    ( while sleep "$every"; do
        [ -s "$work/wb/data/admin.address" ] &&
          curl -sf "http://$(cat "$work/wb/data/admin.address")/metrics" -o /dev/null &&
          echo >> "$work/scrapes" || true
      done ) &
    scraper=$!
  fi
  until_marker "$round"
  [ -n "$scraper" ] && kill "$scraper"
  kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
  # Kept for callgrind_annotate: where the instructions went.
  cp "$out" "$here/target/callgrind/"
  echo "$(awk '/^(summary|totals):/ { print $2; exit }' "$out") $(wc -l < "$work/scrapes")"
}

results=()
for round in $(seq 1 "$rounds"); do
  # Every run opens a longer log than the one before (its recovery scans
  # more): even rounds run the variants in the opposite order.
  if [ $((round % 2)) = 1 ]; then
    read -r off _ <<<"$(count_catch_up $((3 * round - 2)) "" "")"
    read -r on _ <<<"$(count_catch_up $((3 * round - 1)) "127.0.0.1:0" "")"
    read -r scraped scrapes <<<"$(count_catch_up $((3 * round)) "127.0.0.1:0" 1)"
  else
    read -r scraped scrapes <<<"$(count_catch_up $((3 * round - 2)) "127.0.0.1:0" 1)"
    read -r on _ <<<"$(count_catch_up $((3 * round - 1)) "127.0.0.1:0" "")"
    read -r off _ <<<"$(count_catch_up $((3 * round)) "" "")"
  fi
  echo "round $round: $transactions transactions: admin off $off instructions, on $on, on and scraped $scrapes times $scraped"
  results+=("$off $on $scraped $scrapes")
done
python3 - "$transactions" "${results[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1])
rounds = [tuple(map(int, r.split())) for r in sys.argv[2:]]
off, on, scraped = (statistics.median(r[i] for r in rounds) for i in range(3))
per_scrape = statistics.median((r[2] - r[1]) / max(r[3], 1) for r in rounds)
def share(a, b): return f"{100 * (b - a) / a:+.2f}%"
print(f"catch-up of {n} TPC-B transactions, median of {len(rounds)} rounds, instructions of walbridge:")
print(f"  admin off:             {off:14,.0f} ({off / n:,.0f} per transaction)")
print(f"  admin on, not scraped: {on:14,.0f} ({on / n:,.0f} per transaction), {share(off, on)} (rounds: {', '.join(share(r[0], r[1]) for r in rounds)})")
print(f"  on, scraped each second: {scraped:12,.0f}, {share(off, scraped)}; one scrape of /metrics: about {per_scrape:,.0f} instructions")
print(f"  off, round to round: {', '.join(f'{r[0]:,}' for r in rounds)}")
PY
