# The commands a newcomer types. Each installs what it needs first.
.PHONY: run test test-fast lint conformance bench bench-full status bootstrap

bootstrap:
	@scripts/bootstrap.sh

run:
	@scripts/run.sh

test: bootstrap lint
	.venv/bin/python -m pytest -q

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

bench: bootstrap
	.venv/bin/python -m loadtest.bench --quick

bench-full: bootstrap
	.venv/bin/python -m loadtest.bench --full

status:
	.venv/bin/supervisorctl status
