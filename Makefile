# The commands a newcomer types. Each installs what it needs first.
.PHONY: run test test-fast bench bench-full status bootstrap

bootstrap:
	@scripts/bootstrap.sh

run:
	@scripts/run.sh

test: bootstrap
	.venv/bin/python -m pytest -q

test-fast: bootstrap
	.venv/bin/python -m pytest -q -m "not e2e"

bench: bootstrap
	.venv/bin/python -m loadtest.bench --quick

bench-full: bootstrap
	.venv/bin/python -m loadtest.bench --full

status:
	.venv/bin/supervisorctl status
