#!/usr/bin/env bash
# Latency under steady load: a native subscription against walbridge's
# postgres sink, jsonl sink and gRPC feed, on one machine, in one run.
#
# pgbench inserts one row per transaction into `lat` at RATES (default
# "1000 3000") transactions/s for DURATION seconds (default 20), committed
# with synchronous_commit = on (off leaves flushing the WAL to the WAL
# writer every wal_writer_delay, and a walsender sends only flushed WAL).
# Each row's delay, one clock:
#
# * native and postgres sink: from `created` (clock_timestamp() when the
#   row was inserted on the publisher) to `seen` (a target-only column
#   defaulting to clock_timestamp(), so the moment the row was applied);
# * jsonl (to standard output, read by a pipe): from the commit time the
#   line carries (`ts_us`) to the moment the reader has the line;
# * gRPC feed: from the commit time to the consumer receiving the
#   transaction's commit (crates/walbridge-sink-grpc/examples/feed-bench.rs).
#
# ROUNDS (default 5) rounds per rate, interleaved (native, then each of
# KINDS, default "postgres jsonl feed", then the next round), each waiting
# first until every reader has caught up with what the others made. Per
# rate and reader: the median over the rounds of each percentile, with the
# lowest and highest round's p99, and CPU seconds per round; for walbridge,
# each stage's mean delay (the first, "sent", is the publisher's share:
# from the commit to the walsender's sending it) and the share of
# transactions later than TAIL_BUCKET seconds there (default 0.002; one of
# the delay histogram's buckets, crates/walbridge-sink/src/delay.rs:
# 0.0005, 0.001, 0.002, …).
#
# BASELINE_BIN (another walbridge build, say of the previous commit) adds
# a reader per kind run by that build, right after the one it is compared
# with in every round: on a machine whose noise moves the p99 between runs
# more than a change does, only readers of the same run compare.
# BASELINE_DATA_DIR puts those readers' data_dir (their log) under another
# directory: with BASELINE_BIN the same build and BASELINE_DATA_DIR=/dev/shm,
# the pair shows what the log's fsync costs at each stage.
# CONFIG_EXTRA and BASELINE_CONFIG_EXTRA end the configuration of the
# readers and of the baseline readers (say '[log]' and 'preallocate =
# false'): with BASELINE_BIN the same build, the pair compares a setting.
#
#   scripts/bench-latency.sh
#   RATES=1000 ROUNDS=3 DURATION=10 KINDS=postgres scripts/bench-latency.sh
#   BASELINE_BIN=/tmp/old/target/release/walbridge KINDS=jsonl scripts/bench-latency.sh
#   BASELINE_BIN=target/release/walbridge CONFIG_EXTRA=$'[log]\npreallocate = true' \
#     BASELINE_CONFIG_EXTRA=$'[log]\npreallocate = false' scripts/bench-latency.sh
set -euo pipefail
source "$(dirname "$0")/bench-common.sh"
rates=${RATES:-"1000 3000"}
rounds=${ROUNDS:-5}
duration=${DURATION:-20}
kinds=${KINDS:-"postgres jsonl feed"}
# Readers run by walbridge: a kind, or a kind followed by -base (run by BASELINE_BIN).
readers=$(for kind in $kinds; do echo "$kind"; [ -z "${BASELINE_BIN:-}" ] || echo "$kind-base"; done)
clients=4
baseline_data=
if [ -n "${BASELINE_DATA_DIR:-}" ]; then
  baseline_data=$(mktemp -d "$BASELINE_DATA_DIR/walbridge-bench.XXXXXX")
  trap 'rm -rf "$baseline_data"; bench_cleanup' EXIT
fi

build_walbridge
if [[ " $kinds " == *" feed "* ]]; then
  cargo build --quiet --release -p walbridge-sink-grpc --example feed-bench --manifest-path "$here/Cargo.toml"
fi
consumer_bin="$here/target/release/examples/feed-bench"
start_postgres "max_wal_senders = 20" "max_replication_slots = 20"
start_second_postgres "shared_buffers = 512MB" "max_logical_replication_workers = 8" "wal_retrieve_retry_interval = 100ms"
sub() { local db=$1; shift; psql -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port2" -U postgres -d "$db" "$@"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

psql_db postgres -c "CREATE DATABASE bench" >/dev/null
psql_db bench -c "CREATE TABLE lat (id bigserial PRIMARY KEY, created timestamptz NOT NULL DEFAULT clock_timestamp(), payload text NOT NULL)" >/dev/null
psql_db bench -c "CREATE PUBLICATION lat_pub FOR TABLE lat" >/dev/null
for db in native wb wb_base; do
  sub postgres -c "CREATE DATABASE $db" >/dev/null
  sub "$db" -c "CREATE TABLE lat (id bigint PRIMARY KEY, created timestamptz NOT NULL, payload text NOT NULL, seen timestamptz NOT NULL DEFAULT clock_timestamp())" >/dev/null
done
sub native -c "CREATE SUBSCRIPTION native_sub CONNECTION 'host=127.0.0.1 port=$port dbname=bench user=postgres' PUBLICATION lat_pub WITH (copy_data = false, enabled = false)" >/dev/null 2>&1
echo "INSERT INTO lat (payload) VALUES (repeat('x', 100));" > "$work/insert.sql"

# Reader $1's slot, and the database its postgres sink writes into.
slot() { echo "wb_${1//-/_}"; }
target_db() { [ "$1" = postgres ] && echo wb || echo wb_base; }
# Reader $1's sink name: the two postgres sinks' replication origins
# (named after sink and source) are the subscriber cluster's, not a
# database's, so each needs its own.
sink_name() { echo "out_${1//-/_}"; }

# Slots for walbridge, made now so that every reader starts from here.
for reader in $readers; do
  psql_db bench -c "SELECT pg_create_logical_replication_slot('$(slot "$reader")', 'pgoutput')" >/dev/null
done

# walbridge as reader $1 (a kind, or a kind-base run by BASELINE_BIN);
# sets wb_pid (and feed for a feed).
start_walbridge() {
  local kind=${1%-base} dir="$work/wb-$1" sink binary=$bin data extra=${CONFIG_EXTRA:-}
  data="$dir/data"
  if [ "$1" != "$kind" ]; then
    binary=$BASELINE_BIN
    extra=${BASELINE_CONFIG_EXTRA:-}
    if [ -n "$baseline_data" ]; then data="$baseline_data/wb-$1"; fi
  fi
  mkdir -p "$dir"
  case $kind in
    postgres) sink="type = \"postgres\"
connection = \"host=127.0.0.1 port=$port2 dbname=$(target_db "$1") user=postgres sslmode=disable\"" ;;
    jsonl) sink="type = \"jsonl\"" ;;
    feed)
      local feed_port; feed_port=$(free_port)
      feed="http://127.0.0.1:$feed_port"
      sink="type = \"grpc\"
listen = \"127.0.0.1:$feed_port\"" ;;
  esac
  admin="127.0.0.1:$(free_port)"
  cat > "$dir/config.toml" <<CONF
data_dir = "$data"
[admin]
listen = "$admin"
[[source]]
name = "bench"
connection = "host=127.0.0.1 port=$port dbname=bench user=postgres sslmode=disable"
publications = ["lat_pub"]
slot = "$(slot "$1")"
create_slot = false
copy_data = false
[[sink]]
name = "$(sink_name "$1")"
$sink
$extra
CONF
  if [ "$kind" = jsonl ]; then
    # The reader notes each insert's id and delay; the pipe is its stdin.
    "$binary" run -c "$dir/config.toml" 2>>"$dir/stderr.log" | python3 -u -c '
import json, sys, time
out = open(sys.argv[1], "a", buffering=1)
for line in sys.stdin.buffer:
    now = time.time()
    event = json.loads(line)
    if event["op"] == "c":
        row, commit = event["after"]["id"], event["source"]["ts_us"] / 1e6
        out.write(f"{row} {(now - commit) * 1000:.3f}\n")
' "$dir/delays" &
    # $! is the reader; walbridge is the pipe's other process.
    wb_reader=$!
    until wb_pid=$(pgrep -f -- "run -c $dir/config.toml"); do sleep 0.05; done
  else
    "$binary" run -c "$dir/config.toml" 2>>"$dir/stderr.log" &
    wb_pid=$!
  fi
}

stop_walbridge() {
  kill -TERM "$wb_pid"
  while kill -0 "$wb_pid" 2>/dev/null; do sleep 0.05; done
  wb_pid=
  if [ -n "${wb_reader:-}" ]; then wait "$wb_reader" || true; wb_reader=; fi
}

# Waits until slot $1 has confirmed the publisher's current end of WAL.
caught_up() {
  local end; end=$(psql_db bench -c "SELECT pg_current_wal_lsn()")
  psql_db bench -c "DO \$\$ BEGIN WHILE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = '$1' AND confirmed_flush_lsn >= '$end') LOOP PERFORM pg_sleep(0.01); END LOOP; END \$\$"
}

# Waits until the subscriber database $1 holds row $2 of lat.
has_row() { [ "$2" = 0 ] || sub "$1" -c "DO \$\$ BEGIN WHILE NOT EXISTS (SELECT FROM lat WHERE id = $2) LOOP PERFORM pg_sleep(0.005); END LOOP; END \$\$"; }

# Waits until jsonl reader $1 has had row $2 of lat (none for 0).
jsonl_has() {
  [ "$2" = 0 ] && return
  until awk -v id="$2" '$1 == id { found = 1 } END { exit !found }' "$work/wb-$1/delays"; do
    kill -0 "$wb_reader" 2>/dev/null || { echo "the jsonl reader ended" >&2; exit 1; }
    sleep 0.05
  done
}

last_id() { psql_db bench -c "SELECT coalesce(max(id), 0) FROM lat"; }

# pgbench at rate $1 for the round's duration; prints the rate achieved.
load() {
  PGOPTIONS="-c synchronous_commit=on" pgbench -n -f "$work/insert.sql" -c $clients -j 2 -R "$1" -T "$duration" \
    -h 127.0.0.1 -p "$port" -U postgres bench > "$work/pgbench.out"
  awk '/^tps/ {print $3; exit}' "$work/pgbench.out"
}

# "count p50 p95 p99 max" of the delays (ms) on standard input, one per
# line (nearest rank, as feed-bench computes them).
percentiles() {
  python3 -c '
import math, sys
d = sorted(float(x) for x in sys.stdin if x.strip())
at = lambda p: d[min(max(math.ceil(p / 100 * len(d)), 1), len(d)) - 1]
print(len(d), *(f"{at(p):.3f}" for p in (50, 95, 99, 100)))'
}

# Delays (ms) of rows lo < id <= hi in subscriber database $1, one per line.
sub_delays() { sub "$1" -c "SELECT extract(epoch FROM seen - created) * 1000 FROM lat WHERE id > $2 AND id <= $3"; }

# walbridge's transaction delays so far: "stage sum count within" per
# stage, `within` counting those that reached it within TAIL_BUCKET
# seconds (walbridge_transaction_delay_seconds, see
# crates/walbridge-sink/src/delay.rs; one of its buckets), and as stage
# "sent" the publisher's share before them
# (walbridge_publisher_send_delay_seconds: from the commit to the
# walsender's sending it, crates/walbridge-source/src/send_delay.rs).
TAIL_BUCKET=${TAIL_BUCKET:-0.002}
delays_now() {
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://$admin/metrics" | awk -v le="le=\"$TAIL_BUCKET\"" -v CONVFMT=%.17g '
    /^walbridge_((transaction|publisher_send)_delay|log_sync)_seconds_(sum|count|bucket)\{/ {
      if ($1 ~ /^walbridge_publisher_send/) stage = "sent"
      else if ($1 ~ /^walbridge_log_sync/) stage = "fsync"
      else { match($0, /stage="[a-z]+"/); stage = substr($0, RSTART + 7, RLENGTH - 8) }
      if ($1 ~ /_sum\{/) kind = "sum"
      else if ($1 ~ /_count\{/) kind = "count"
      else if (index($1, le)) kind = "within"
      else next
      # The fsyncs come by who made them: added up (CONVFMT keeps every
      # digit of a sum when it is printed back).
      v[stage, kind] += $2; stages[stage] = 1
    }
    END { for (s in stages) printf "%s %s %s %s\n", s, v[s, "sum"], v[s, "count"], v[s, "within"] }'
}
# Between two delays_now readings, in the order a transaction passes the
# stages, "sent/received/read/delivered/applied": the mean delay (ms) at each,
# then (after a space) the share (%) of transactions later than
# TAIL_BUCKET there — where a tail begins, which means cannot show. Each
# list ends with the log's fsyncs (walbridge_log_sync_seconds): their mean
# time and the share slower than TAIL_BUCKET; last (after a space), the
# fsyncs per transaction received.
stage_delays() {
  python3 -c '
import sys
def parse(text):
    return {f[0]: tuple(float(x) for x in f[1:]) for f in (l.split() for l in text.splitlines()) if len(f) == 4}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
means, late = [], []
for stage in ("sent", "received", "read", "delivered", "applied", "fsync"):
    (s0, c0, w0), (s1, c1, w1) = a.get(stage, (0, 0, 0)), b.get(stage, (0, 0, 0))
    means.append(f"{1000 * (s1 - s0) / (c1 - c0):.3f}" if c1 > c0 else "-")
    late.append(f"{100 * (1 - (w1 - w0) / (c1 - c0)):.2f}" if c1 > c0 else "-")
fsyncs, received = (b.get(k, (0, 0, 0))[1] - a.get(k, (0, 0, 0))[1] for k in ("fsync", "received"))
# A build without the fsync times counts none.
print("/".join(means), "/".join(late), f"{fsyncs / received:.2f}" if received > 0 and fsyncs > 0 else "-")' "$1" "$2"
}

# CPU seconds of walbridge ($1, or - for none), the publisher and the
# subscriber so far: "wb pub sub".
cpu_now() {
  local wb=-
  [ "$1" != - ] && wb=$(cpu_seconds "$1")
  echo "$wb $(server_cpu "$work/data") $(server_cpu "$work/data2")"
}
# What each used between two cpu_now readings.
cpu_used() {
  python3 -c 'import sys; a, b = sys.argv[1].split(), sys.argv[2].split()
print(*("-" if x == "-" else f"{float(y) - float(x):.2f}" for x, y in zip(a, b)))' "$1" "$2"
}

results="$work/results"
: > "$results"
for rate in $rates; do
  for round in $(seq 1 "$rounds"); do
    # Native.
    sub native -c "ALTER SUBSCRIPTION native_sub ENABLE" >/dev/null
    caught_up native_sub
    lo=$(last_id)
    has_row native "$lo"
    before=$(cpu_now -)
    tps=$(load "$rate"); hi=$(last_id)
    has_row native "$hi"
    cpu=$(cpu_used "$before" "$(cpu_now -)")
    sub_delays native "$lo" "$hi" > "$work/delays"
    echo "native $rate $round $tps $cpu $(percentiles < "$work/delays") - -" | tee -a "$results"
    sub native -c "ALTER SUBSCRIPTION native_sub DISABLE" >/dev/null
    until [ "$(psql_db bench -c "SELECT count(*) FROM pg_stat_replication")" = 0 ]; do sleep 0.02; done

    for reader in $readers; do
      kind=${reader%-base}
      start_walbridge "$reader"
      caught_up "$(slot "$reader")"
      lo=$(last_id)
      # The sink too has what the other readers' rounds made.
      case $kind in
        postgres) has_row "$(target_db "$reader")" "$lo" ;;
        jsonl) jsonl_has "$reader" "$lo" ;;
        feed)
          "$consumer_bin" --address "$feed" --start latest --latency --idle 3 > "$work/feed.json" &
          consumer_pid=$!
          until grep -q "subscriber connected" "$work/wb-$reader/stderr.log"; do sleep 0.05; done ;;
      esac
      before=$(cpu_now "$wb_pid") stages_before=$(delays_now)
      tps=$(load "$rate"); hi=$(last_id)
      case $kind in
        postgres) has_row "$(target_db "$reader")" "$hi" ;;
        jsonl) jsonl_has "$reader" "$hi" ;;
        feed) wait "$consumer_pid" ;;
      esac
      cpu=$(cpu_used "$before" "$(cpu_now "$wb_pid")")
      stages=$(stage_delays "$stages_before" "$(delays_now)")
      case $kind in
        postgres) summary=$(sub_delays "$(target_db "$reader")" "$lo" "$hi" | percentiles) ;;
        jsonl) summary=$(awk -v lo="$lo" -v hi="$hi" '$1 > lo && $1 <= hi { print $2 }' "$work/wb-$reader/delays" | percentiles) ;;
        feed) summary=$(python3 -c 'import json, sys; l = json.load(open(sys.argv[1]))["latency_ms"]; print(l["count"], *(l[p] for p in ("p50", "p95", "p99", "max")))' "$work/feed.json") ;;
      esac
      echo "$reader $rate $round $tps $cpu $summary $stages" | tee -a "$results"
      stop_walbridge
    done
  done
done

# Columns: reader rate round tps walbridge-cpu publisher-cpu subscriber-cpu
# count p50 p95 p99 max stage-means stage-late-shares fsyncs-per-transaction.
python3 - "$results" "$duration" "$TAIL_BUCKET" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
duration = float(sys.argv[2])
tail_ms = 1000 * float(sys.argv[3])
names = {"native": "native subscription", "postgres": "walbridge postgres sink",
         "jsonl": "walbridge jsonl sink", "feed": "walbridge gRPC feed"}
names.update({f"{k}-base": f"{v} (BASELINE_BIN)" for k, v in names.items()})
print()
stages = []
print("| rate | reader | rounds | rows/round | p50 | p95 | p99 (lowest-highest round) | max | CPU: walbridge / publisher / subscriber |")
print("|---|---|---|---|---|---|---|---|---|")
for rate in dict.fromkeys(r[1] for r in rows):
    for kind in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == kind and r[1] == rate]
        if not mine:
            continue
        med = lambda i: statistics.median(float(r[i]) for r in mine)
        share = lambda i: "-" if mine[0][i] == "-" else f"{100 * med(i) / duration:.0f}%"
        p99 = [float(r[10]) for r in mine]
        print(f"| {float(rate):,.0f}/s (achieved {med(3):,.0f}) | {names[kind]} | {len(mine)} | {med(7):,.0f} "
              f"| {med(8):.2f} ms | {med(9):.2f} ms | {med(10):.2f} ms ({min(p99):.2f}-{max(p99):.2f}) | {med(11):.1f} ms "
              f"| {share(4)} / {share(5)} / {share(6)} of a core |")
        if kind != "native":
            stages.append((rate, names[kind], [r[12].split("/") for r in mine], [r[13].split("/") for r in mine],
                           [r[14] for r in mine]))

# Each stage's share of the mean delay: the mean time from the commit on
# the publisher to each stage, median over the rounds, and the differences.
print()
print("| rate | reader | mean delay | publisher → sent (its commit, the walsender) | → received (walbridge's source) | → read (log fsync) | → delivered (sink queue) | → applied (sink) |")
print("|---|---|---|---|---|---|---|---|")
def values_at(rounds, i):
    """Column i of each round, where it has one."""
    return [float(r[i]) for r in rounds if r[i] != "-"]
def median_at(rounds, i):
    values = values_at(rounds, i)
    return statistics.median(values) if values else None
for rate, name, rounds, *_ in stages:
    points = [median_at(rounds, i) for i in range(5)]
    cells, last = [], 0.0
    for point in points:
        if point is None:
            cells.append("-")
            continue
        cells.append(f"{point - last:.2f} ms")
        last = point
    print(f"| {float(rate):,.0f}/s | {name} | {last:.2f} ms | " + " | ".join(cells) + " |")

# Where the tail begins: the share of transactions later than the tail
# bucket at each stage (median over the rounds, lowest-highest round). A
# stage that raises it adds to the p99; one that leaves it adds only to
# the mean.
print()
print(f"| rate | reader | later than {tail_ms:g} ms at: sent | received | read | delivered | applied |")
print("|---|---|---|---|---|---|---|")
def spread(values, unit, digits):
    """The median over the rounds (lowest-highest)."""
    if not values:
        return "-"
    median, low, high = statistics.median(values), min(values), max(values)
    return f"{median:.{digits}f}{unit} ({low:.{digits}f}-{high:.{digits}f})"
for rate, name, _, late, _ in stages:
    cells = [spread(values_at(late, i), "%", 1) for i in range(5)]
    print(f"| {float(rate):,.0f}/s | {name} | " + " | ".join(cells) + " |")

# The log's fsyncs (the wait of the readers of durable records: jsonl,
# the feed): how many per transaction, their mean time, and the share
# slower than the tail bucket (median over the rounds, lowest-highest).
print()
print(f"| rate | reader | log fsyncs per transaction | mean fsync | fsyncs slower than {tail_ms:g} ms |")
print("|---|---|---|---|---|")
for rate, name, rounds, late, per_txn in stages:
    per_txn = [float(x) for x in per_txn if x != "-"]
    print(f"| {float(rate):,.0f}/s | {name} | {spread(per_txn, '', 2)} | {spread(values_at(rounds, 5), ' ms', 3)} "
          f"| {spread(values_at(late, 5), '%', 1)} |")
PY
