#!/usr/bin/env bash
# Builds the compiled load client (loadtest/clients/go, its module pinned in go.mod/go.sum,
# github.com/gobwas/ws from the Go module proxy) into .cache/loadclient/bin/loadclient.
# Idempotent: a binary built from the same sources (a hash of them in SOURCES) is kept.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/loadtest/clients/go"
out="$root/.cache/loadclient"
bin="$out/bin/loadclient"
command -v go >/dev/null || { echo "install-loadclient: Go is required (apt-get install golang or use the machine's Go)" >&2; exit 1; }
# The sources and the Go that builds them: a new Go may build different code from the same files.
hash="$(cd "$src" && { cat go.mod go.sum $(ls *.go | grep -v '_test\.go$' | sort); go version; } | sha256sum | cut -d' ' -f1)"
if [ -x "$bin" ] && [ "$(cat "$out/SOURCES" 2>/dev/null)" = "$hash" ]; then
  exit 0
fi
echo "install-loadclient: building $bin"
mkdir -p "$out/bin"
cd "$src"
go mod download
go build -trimpath -o "$bin.tmp" .
mv "$bin.tmp" "$bin"
echo "$hash" > "$out/SOURCES"
echo "install-loadclient: built $bin"
