#!/usr/bin/env bash
# Installs everything `make run` and `make test` need, idempotently:
# Debian packages, the venv with pinned deps, FerretDB 1.24 and the AsyncAPI parser;
# as root also Toxiproxy, for the cluster test (tests/e2e/test_cluster_signals.py).
# A second run does no network work and returns in about a second.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

need_pkgs=()
for p in mariadb-server libmariadb-dev pkg-config apache2-utils build-essential nginx-light chromium redis-server iproute2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
# Node.js runs the web client's pure tests and the AsyncAPI parser; Debian's if the machine has none.
command -v npm >/dev/null || need_pkgs+=(nodejs npm)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_pkgs[*]}"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
fi

# The venv is rebuilt only when pyproject.toml changes (stamp holds its hash).
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "bootstrap: creating the venv with the pinned dependencies"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  rm -f .venv/.installed-*; touch "$stamp"
fi

scripts/install-ferretdb.sh
scripts/install-asyncapi-parser.sh
# The cluster test runs only as root (network namespaces) and is skipped otherwise:
# only then is Toxiproxy built (with Go, about 25 s the first time; docs/cluster.md).
if [ "$(id -u)" = 0 ]; then
  scripts/cluster/install-toxiproxy.sh
fi
