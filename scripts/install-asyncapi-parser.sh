#!/usr/bin/env bash
# The AsyncAPI project's parser (@asyncapi/parser, pinned with its lock file in
# tests/asyncapi/), which the tests validate the push side's AsyncAPI document
# with, into .cache/asyncapi/. Reinstalled only when the lock file changes.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/asyncapi
stamp="$dest/.installed-$(sha256sum tests/asyncapi/package-lock.json | cut -c1-16)"
[ -f "$stamp" ] && exit 0
echo "install-asyncapi-parser: installing @asyncapi/parser (about 20 s the first time)"
rm -rf "$dest"
mkdir -p "$dest"
cp tests/asyncapi/package.json tests/asyncapi/package-lock.json "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
touch "$stamp"
