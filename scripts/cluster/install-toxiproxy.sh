#!/usr/bin/env bash
# Builds Toxiproxy's server (exact version) into .cache/toxiproxy/bin/toxiproxy-server
# with the machine's Go (about 25 s the first time). Idempotent: with the binary
# present at this version it returns at once.
set -euo pipefail
version=v2.9.0
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/.cache/toxiproxy"
bin="$out/bin/toxiproxy-server"
if [ -x "$bin" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
go=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$go" ] || { echo "install-toxiproxy: Go is required (/usr/local/go/bin/go)" >&2; exit 1; }
echo "install-toxiproxy: building Toxiproxy $version"
mkdir -p "$out/bin" "$out/gopath"
# GOBIN points the install at the cache; GOPATH/GOCACHE keep the module and
# build caches beside it, out of the user's home.
GOBIN="$out/bin.tmp" GOPATH="$out/gopath" GOCACHE="$out/gocache" GOFLAGS=-modcacherw \
  "$go" install "github.com/Shopify/toxiproxy/v2/cmd/server@$version"
mv "$out/bin.tmp/server" "$bin"
rmdir "$out/bin.tmp"
echo "$version" > "$out/VERSION"
echo "install-toxiproxy: built $bin"
