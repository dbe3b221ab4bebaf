# The commands a newcomer types. Each installs what it needs first.
.PHONY: run test test-fast lint conformance bench bench-full status bootstrap cluster cluster-down bench-cluster

bootstrap:
	@scripts/bootstrap.sh

run:
	@scripts/run.sh

# Two pytest-xdist workers, a test file each at a time (its module fixtures stay whole):
# most end-to-end tests wait on processes and sockets, and two at once halve the
# wall time on two cores (docs/testing.md). The slowest tests are printed in every
# run. CHAT_TESTS_TIMEOUT_FACTOR=2 doubles every wait of the tests on a slow machine.
test: bootstrap lint
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=15

# ruff and mypy, configured in pyproject.toml; `make test` runs it first.
lint: bootstrap
	.venv/bin/ruff check . && .venv/bin/mypy

test-fast: bootstrap
	.venv/bin/python -m pytest -q -m "not e2e"

# RFC 6455 conformance (Autobahn|Testsuite, docs/conformance.md). Unlike `make test`,
# which skips it when the suite cannot be installed, this fails.
conformance: bootstrap
	scripts/autobahn-setup.sh
	.venv/bin/python -m pytest -q tests/e2e/test_autobahn.py

# A quick run into var/bench/ (git-ignored), its tables printed; `make bench-full` publishes:
# it rewrites loadtest/results/ and docs/benchmarks.md.
bench: bootstrap
	.venv/bin/python -m loadtest.bench --quick

bench-full: bootstrap
	.venv/bin/python -m loadtest.bench --full --publish

status:
	.venv/bin/supervisorctl status

# The system as 3 hosts + databases + nginx in network namespaces, as root (docs/cluster.md); Ctrl-C removes it.
cluster: bootstrap
	scripts/cluster/install-toxiproxy.sh
	.venv/bin/python -m cluster up

# Removes what a crashed `make cluster` or `make bench-cluster` left (namespaces, veths, processes); idempotent.
cluster-down:
	.venv/bin/python -m cluster down

# The cluster under load, P = 1, 2, 4 and the global lock, three faults, then a grow to 8 partitions online (under 12 min, as root).
bench-cluster: bootstrap
	scripts/cluster/install-toxiproxy.sh
	.venv/bin/python -m loadtest.cluster.bench
