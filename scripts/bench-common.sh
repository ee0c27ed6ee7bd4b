# Shared by the benchmark scripts: a throwaway PostgreSQL and a release build.
# Sourced, not run.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/scripts/throwaway-postgres.sh"

bench_cleanup() {
  [ -n "${wb_pid:-}" ] && kill -9 "$wb_pid" 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] && { echo "kept $work" >&2; work=; }; stop_throwaway_postgres
}
trap bench_cleanup EXIT

start_postgres() {
  start_throwaway_postgres "max_wal_size = 8GB" "shared_buffers = 512MB" "synchronous_commit = off" "$@"
}

psql_db() { local db=$1; shift; psql -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" "$@"; }

build_walbridge() {
  if [ -z "${WALBRIDGE_BIN:-}" ]; then
    cargo build --quiet --release -p walbridge --manifest-path "$here/Cargo.toml"
  fi
  bin="${WALBRIDGE_BIN:-$here/target/release/walbridge}"
}

# Writes $work/wb/config.toml: source `bench` reading publication
# bench_pub of database `bench`, postgres sink `replica` into database $1
# of the second server. SOURCE_EXTRA adds lines to the source's section
# (or a section of their own before the sink's: $'[log]\npreallocate = false').
write_pg_sink_config() {
  mkdir -p "$work/wb"
  cat > "$work/wb/config.toml" <<CONF
data_dir = "$work/wb/data"
[[source]]
name = "bench"
connection = "host=127.0.0.1 port=$port dbname=bench user=postgres sslmode=disable"
publications = ["bench_pub"]
${SOURCE_EXTRA:-}
[[sink]]
name = "replica"
type = "postgres"
connection = "host=127.0.0.1 port=$port2 dbname=$1 user=postgres sslmode=disable"
CONF
}

# psql on the second server's database $1.
sub() { local db=$1; shift; psql -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port2" -U postgres -d "$db" "$@"; }
now() { date +%s.%N; }
# Seconds since $1 (a `now`).
elapsed() { python3 -c "print(f'{$(now) - $1:.3f}')"; }
minus() { python3 -c "print(f'{$1 - $2:.2f}')"; }

# Returns once `condition` holds in the second server's database $1,
# asked on one connection (a psql started every few milliseconds would
# fork a backend each time, taking CPU from what is measured); fails if
# walbridge (when $wb_pid is set) exits first, showing $wb_log.
until_sub() {
  local db=$1 condition=$2
  sub "$db" -c "DO \$\$ BEGIN WHILE NOT ($condition) LOOP COMMIT; PERFORM pg_sleep(0.005); END LOOP; END \$\$" &
  local waiter=$!
  if [ -n "${wb_pid:-}" ]; then
    wait -n "$waiter" "$wb_pid" || true
    if ! kill -0 "$wb_pid" 2>/dev/null; then
      kill "$waiter" 2>/dev/null || true
      cat "${wb_log:-$work/wb/stderr.log}" >&2
      exit 1
    fi
  fi
  wait "$waiter"
}

# The benchmarks' Python (a venv with matplotlib for the plots, made when
# missing, in the cache the test tools use); prints its path.
bench_venv() {
  local cache
  if [ "$(id -u)" = 0 ]; then cache=/var/cache/walbridge; else cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
  local venv="${WALBRIDGE_BENCH_VENV:-$cache/bench-venv}" matplotlib_version=3.9.4
  if ! "$venv/bin/python" -c "import matplotlib, sys; sys.exit(matplotlib.__version__ != '$matplotlib_version')" 2>/dev/null; then
    echo "installing matplotlib $matplotlib_version into $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "matplotlib==$matplotlib_version" >&2
  fi
  echo "$venv/bin/python"
}

# CPU seconds (user + system) process $1 has used so far.
cpu_seconds() {
  awk -v tick="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / tick }' "/proc/$1/stat"
}

# CPU seconds (user + system) a server's processes have used so far,
# including exited ones (the postmaster collects their times).
server_cpu() {
  # Python, not awk over /proc/*/stat: mawk stops at a file that vanished
  # since the glob (a backend that just exited) and printed nothing.
  python3 - "$1" <<'PY'
import os, sys
postmaster = open(os.path.join(sys.argv[1], "postmaster.pid")).readline().strip()
tick = os.sysconf("SC_CLK_TCK")
total = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    # fields[0] is the state: utime, stime, cutime, cstime are fields[11:15].
    if pid == postmaster:
        total += sum(int(x) for x in fields[11:15])
    elif fields[1] == postmaster:
        total += int(fields[11]) + int(fields[12])
print(f"{total / tick:.2f}")
PY
}
# Runs walbridge on an existing slot until it has confirmed $2; prints the
# seconds taken, walbridge's peak RSS in kB and its CPU seconds.
# Args: slot end_lsn database publication output_path [sink_sections]
# (sink_sections replaces the jsonl sink writing to output_path);
# SOURCE_EXTRA adds lines to the source's section (spill_threshold = …).
walbridge_until() {
  local slot=$1 end=$2 db=$3 publication=$4 output=$5
  local sinks=${6:-"[[sink]]
name = \"out\"
type = \"jsonl\"
path = \"$output\""}
  mkdir -p "$work/wb-$slot"
  cat > "$work/wb-$slot/config.toml" <<CONF
data_dir = "$work/wb-$slot/data"
[[source]]
name = "bench"
connection = "host=127.0.0.1 port=$port dbname=$db user=postgres sslmode=disable"
publications = ["$publication"]
slot = "$slot"
create_slot = false
copy_data = false
status_interval = 1
${SOURCE_EXTRA:-}
$sinks
CONF
  local start; start=$(date +%s.%N)
  "$bin" run -c "$work/wb-$slot/config.toml" 2>"$work/wb-$slot/stderr.log" &
  wb_pid=$!
  # Done when the sink has applied everything: the walsender's replay_lsn
  # is walbridge's `apply` position (confirmed_flush_lsn only says the log
  # holds it).
  until [ "$(psql_db "$db" -c "SELECT coalesce(bool_or(replay_lsn >= '$end'), false) FROM pg_stat_replication WHERE application_name = 'bench'")" = t ]; do
    if ! kill -0 "$wb_pid" 2>/dev/null; then cat "$work/wb-$slot/stderr.log" >&2; return 1; fi
    sleep 0.02
  done
  local finish; finish=$(date +%s.%N)
  local rss; rss=$(awk '/VmHWM/ {print $2}' "/proc/$wb_pid/status")
  local cpu; cpu=$(cpu_seconds "$wb_pid")
  kill -TERM "$wb_pid"; wait "$wb_pid" || true; wb_pid=
  python3 -c "print(f'{$finish - $start:.3f} $rss $cpu')"
}
