# A throwaway local PostgreSQL for the quickstart and the benchmarks.
# Sourced, not run. Sets `work` (a fresh directory) and `port` (free, on
# 127.0.0.1); `start_throwaway_postgres [extra postgresql.conf lines…]`
# starts the server, `start_second_postgres` another one on `port2`;
# `stop_throwaway_postgres` stops them and removes `work`.

# psql, the server binaries, OpenSSL headers for building walbridge, and
# the OS user the server runs as when running as root.
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
machine_setup || exit

work=$(mktemp -d /tmp/walbridge.XXXXXX)
chmod 755 "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# The server refuses to run as root: use the postgres OS user then.
# `$EUID`, not `$(id -u)`: a command substitution is a child bash waits
# for, and a Ctrl-C arriving as that child exits normally is dropped by
# bash (it takes the child to have handled it), so the quickstart would
# go on instead of stopping.
as_server() { if [ "$EUID" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$EUID" = 0 ]; then chown postgres "$work"; fi

# Args: data directory, port, extra postgresql.conf lines…
start_postgres_in() {
  local data=$1 at_port=$2; shift 2
  as_server initdb -D "$data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  {
    echo "wal_level = logical"
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$work'"
    echo "port = $at_port"
    printf '%s\n' "$@"
  } >> "$data/postgresql.conf"
  as_server pg_ctl -D "$data" -l "$data/server.log" -w start >/dev/null
}

start_throwaway_postgres() { start_postgres_in "$work/data" "$port" "$@"; }

# A second server (a subscriber, say) in $work/data2 on `port2`.
start_second_postgres() {
  port2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  start_postgres_in "$work/data2" "$port2" "$@"
}

# Stops the servers and removes `work`, whatever state they are in: a
# server still starting (the script was stopped during `pg_ctl start`) is
# killed too, so nothing outlives the script.
stop_throwaway_postgres() {
  local data
  [ -n "${work:-}" ] || return 0
  for data in "$work/data" "$work/data2"; do
    [ -d "$data" ] || continue
    as_server pg_ctl -D "$data" -m fast -w -t 10 stop >/dev/null 2>&1 || true
    # A postmaster pg_ctl could not stop (or had not yet written its pid file).
    pkill -KILL -f -- "-D $data( |$)" 2>/dev/null || true
  done
  rm -rf "$work"
}
