#!/usr/bin/env bash
# Builds the Go consumer of the change feed: generates the Go code of
# proto/walbridge/feed/v1/feed.proto (protoc from Python's grpcio-tools,
# which scripts/kafka-test-env.sh installs; protoc-gen-go and
# protoc-gen-go-grpc installed with `go install` when missing) into
# feedv1/, then `go build`. Safe to rerun.
#
#   examples/go-consumer/build.sh [OUTPUT]     # default: ./go-consumer
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
output="${1:-$here/go-consumer}"

protoc_gen_go_version=v1.36.12
protoc_gen_go_grpc_version=v1.6.0

if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/walbridge; else default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/walbridge"; fi
python="${WALBRIDGE_KAFKA_VENV:-$default_cache/kafka-venv}/bin/python"
export GOBIN="$default_cache/go-bin"
export PATH="$GOBIN:$PATH"
# Each plugin at its pinned version: the version is part of the file name
# it is checked by.
if [ ! -x "$GOBIN/protoc-gen-go-$protoc_gen_go_version" ]; then
  go install "google.golang.org/protobuf/cmd/protoc-gen-go@$protoc_gen_go_version"
  cp "$GOBIN/protoc-gen-go" "$GOBIN/protoc-gen-go-$protoc_gen_go_version"
fi
if [ ! -x "$GOBIN/protoc-gen-go-grpc-$protoc_gen_go_grpc_version" ]; then
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$protoc_gen_go_grpc_version"
  cp "$GOBIN/protoc-gen-go-grpc" "$GOBIN/protoc-gen-go-grpc-$protoc_gen_go_grpc_version"
fi

# The proto names no Go package (it is the API of every language): the
# mapping is given here instead.
package=walbridge/feed/v1/feed.proto=walbridge.example/go-consumer/feedv1
rm -rf "$here/feedv1"
mkdir -p "$here/feedv1"
"$python" -m grpc_tools.protoc -I"$root/proto" \
  --go_out="$here/feedv1" --go_opt=paths=source_relative,M"$package" \
  --go-grpc_out="$here/feedv1" --go-grpc_opt=paths=source_relative,M"$package" \
  walbridge/feed/v1/feed.proto
mv "$here"/feedv1/walbridge/feed/v1/*.go "$here/feedv1/"
rm -rf "$here/feedv1/walbridge"
cd "$here"
go build -o "$output" .
