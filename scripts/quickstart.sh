#!/usr/bin/env bash
# Quickstart: starts a throwaway local PostgreSQL with wal_level=logical,
# creates a table with sample rows and a publication, and runs walbridge
# printing every change as a JSON line on stdout. A background writer makes
# a few changes so you can watch them stream. Ctrl-C stops everything and
# removes the throwaway server.
#
#   scripts/quickstart.sh            # uses initdb/pg_ctl/postgres from PATH
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/throwaway-postgres.sh"

# Every way out (Ctrl-C, SIGTERM, SIGHUP, an error, walbridge exiting)
# stops walbridge and the writer, then the throwaway server.
cleanup() {
  trap - EXIT INT TERM HUP
  if [ -n "${walbridge_pid:-}" ]; then
    kill -TERM "$walbridge_pid" 2>/dev/null || true
    wait "$walbridge_pid" 2>/dev/null || true
  fi
  if [ -n "${writer:-}" ]; then
    pkill -P "$writer" 2>/dev/null || true
    kill "$writer" 2>/dev/null || true
  fi
  stop_throwaway_postgres
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if [ -z "${WALBRIDGE_BIN:-}" ]; then
  echo "quickstart: building walbridge (release)" >&2
  cargo build --quiet --release -p walbridge --manifest-path "$here/Cargo.toml"
fi
bin="${WALBRIDGE_BIN:-$here/target/release/walbridge}"

echo "quickstart: starting PostgreSQL on 127.0.0.1:$port (data in $work)" >&2
start_throwaway_postgres

sql() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d shop "$@"; }
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "CREATE DATABASE shop"
sql <<'SQL'
CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, total numeric(10,2), items jsonb, placed_at timestamptz DEFAULT now());
INSERT INTO orders (customer, total, items) VALUES
  ('ada', 12.50, '[{"sku": "tea", "qty": 2}]'),
  ('grace', 99.00, '[{"sku": "book", "qty": 1}]'),
  ('linus', 5.25, '[]');
CREATE PUBLICATION shop_pub FOR TABLE orders;
SQL

mkdir -p "$work/walbridge"
cat > "$work/walbridge.toml" <<CONF
data_dir = "$work/walbridge"

[[source]]
name = "shop"
connection = "host=127.0.0.1 port=$port dbname=shop user=postgres"
publications = ["shop_pub"]

[[sink]]
name = "stdout"
type = "jsonl"
path = "-"
CONF
echo "quickstart: configuration in $work/walbridge.toml; Ctrl-C to stop" >&2

(
  sleep 3
  for i in $(seq 1 20); do
    sql -c "INSERT INTO orders (customer, total) VALUES ('customer$i', $i.99)" \
        -c "UPDATE orders SET total = total + 1 WHERE id = 1" >/dev/null 2>&1 || exit 0
    [ $((i % 5)) = 0 ] && sql -c "DELETE FROM orders WHERE customer = 'customer$((i - 1))'" >/dev/null 2>&1
    sleep 2
  done
) &
writer=$!

# In the background so that a signal reaches the traps at once (bash runs
# them only after a foreground command ends); walbridge stops on SIGTERM.
"$bin" run -c "$work/walbridge.toml" &
walbridge_pid=$!
status=0
wait "$walbridge_pid" || status=$?
walbridge_pid=
exit "$status"
