# A throwaway local PostgreSQL for the quickstart and the benchmarks.
# Sourced, not run. Sets `work` (a fresh directory) and `port` (free, on
# 127.0.0.1); `start_throwaway_postgres [extra postgresql.conf lines…]`
# starts the server; `stop_throwaway_postgres` stops it and removes `work`.

# psql and, when running as root, the OS user the server runs as.
if ! command -v psql >/dev/null; then
  apt-get update -qq && apt-get install -y -qq postgresql-client
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home postgres
fi
command -v initdb >/dev/null || { echo "initdb is not on PATH: install the PostgreSQL server binaries" >&2; exit 2; }

work=$(mktemp -d /tmp/walbridge.XXXXXX)
chmod 755 "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# The server refuses to run as root: use the postgres OS user then.
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres "$work"; fi

start_throwaway_postgres() {
  as_server initdb -D "$work/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  {
    echo "wal_level = logical"
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$work'"
    echo "port = $port"
    printf '%s\n' "$@"
  } >> "$work/data/postgresql.conf"
  as_server pg_ctl -D "$work/data" -l "$work/data/server.log" -w start >/dev/null
}

stop_throwaway_postgres() {
  as_server pg_ctl -D "$work/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
