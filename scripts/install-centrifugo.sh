#!/usr/bin/env bash
# Builds Centrifugo v5.4.9 from the Go module proxy into .cache/centrifugo/bin/centrifugo,
# the peer system the benchmarks run beside ours (loadtest/clients/centrifugo.py starts it).
# Idempotent: a second run with the binary and its VERSION stamp present returns at once.
set -euo pipefail
# An exact version: the proxy answers for a pinned version but refuses to list versions.
version=v5.4.9
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.cache/centrifugo"
bin="$out/bin/centrifugo"
if [ -x "$bin" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "install-centrifugo: Go is required (apt-get install golang or use the machine's Go)" >&2; exit 1; }
echo "install-centrifugo: building Centrifugo $version (about two minutes the first time)"
build="$out/build"
rm -rf "$build"; mkdir -p "$build" "$out/bin"
cd "$build"
# Centrifugo's main package is the module root; a throwaway tools module that
# requires it lets `go mod tidy` resolve the whole dependency graph from the proxy.
cat > go.mod <<GOMOD
module centrifugo-build

go 1.22

require github.com/centrifugal/centrifugo/v5 $version
GOMOD
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/centrifugal/centrifugo/v5"\n' > tools.go
go mod download "github.com/centrifugal/centrifugo/v5@$version"
GOFLAGS=-mod=mod go mod tidy
# Without -X the binary reports version 0.0.0 (the release pipeline sets it the same way).
go build -trimpath -ldflags "-X github.com/centrifugal/centrifugo/v5/internal/build.Version=${version#v}" \
  -o "$bin.tmp" github.com/centrifugal/centrifugo/v5
mv "$bin.tmp" "$bin"
echo "$version" > "$out/VERSION"
cd "$root"; rm -rf "$build"
echo "install-centrifugo: built $bin"
