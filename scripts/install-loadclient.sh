#!/usr/bin/env bash
# Builds the compiled load client (loadtest/clients/go, its module pinned in go.mod/go.sum,
# github.com/gobwas/ws from the Go module proxy) into .cache/loadclient/<hash>/loadclient,
# <hash> that of its sources and the Go that builds them, and prints that path last on stdout.
# A build per hash, not one path rewritten: checkouts that share .cache, at other sources,
# each run their own binary, and one that is running is never replaced under another.
# Idempotent: a binary already built from the same sources is kept.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/loadtest/clients/go"
command -v go >/dev/null || { echo "install-loadclient: Go is required (apt-get install golang or use the machine's Go)" >&2; exit 1; }
# The sources and the Go that builds them: a new Go may build different code from the same files.
hash="$(cd "$src" && { cat go.mod go.sum $(ls *.go | grep -v '_test\.go$' | sort); go version; } | sha256sum | cut -c1-16)"
out="$root/.cache/loadclient/$hash"
bin="$out/loadclient"
if [ ! -x "$bin" ]; then
  echo "install-loadclient: building $bin" >&2
  mkdir -p "$out"
  cd "$src"
  go mod download >&2
  go build -trimpath -o "$bin.tmp.$$" . >&2
  mv "$bin.tmp.$$" "$bin"
  echo "install-loadclient: built $bin" >&2
fi
echo "$bin"
