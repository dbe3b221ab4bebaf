#!/usr/bin/env bash
# Builds FerretDB 1.24 from the Go module proxy into .cache/ferretdb/bin/ferretdb.
# Idempotent: a second run with the binary present returns at once.
# Why vendor + version.txt: the module zip lacks build/version/version.txt and
# a plain build panics at start-up (see docs/ferretdb.md).
set -euo pipefail
version=v1.24.0
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.cache/ferretdb"
bin="$out/bin/ferretdb"
if [ -x "$bin" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "install-ferretdb: Go is required (apt-get install golang or use the machine's Go)" >&2; exit 1; }
echo "install-ferretdb: building FerretDB $version (about a minute the first time)"
build="$out/build"
rm -rf "$build"; mkdir -p "$build" "$out/bin"
cd "$build"
cat > go.mod <<GOMOD
module ferretdb-build

go 1.22

require github.com/FerretDB/FerretDB $version
GOMOD
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/FerretDB/FerretDB/cmd/ferretdb"\n' > tools.go
GOFLAGS=-mod=mod go mod tidy
go mod vendor
echo "$version" > vendor/github.com/FerretDB/FerretDB/build/version/version.txt
go build -mod=vendor -trimpath -o "$bin.tmp" github.com/FerretDB/FerretDB/cmd/ferretdb
mv "$bin.tmp" "$bin"
echo "$version" > "$out/VERSION"
cd "$root"; rm -rf "$build"
echo "install-ferretdb: built $bin"
