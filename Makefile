# The two commands: `make demo` and `make test`. Both set up what they need first.
# `make check` is the inner loop: lint, types, import contracts and the tests that need no broker.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest -p no:cacheprovider
# The suite mostly waits (on brokers, windows, timeouts), so it runs on more workers than cores.
WORKERS ?= 4

.PHONY: setup demo test check lint unit cluster
setup:
	@scripts/setup

demo: setup
	$(PY) -m scripts.demo

test: setup lint
	$(PYTEST) -n $(WORKERS) --dist loadgroup --no-loadscope-reorder tests

check: setup lint
	$(PYTEST) -n $(WORKERS) -m "not integration and not spark and not slow" tests

lint:
	$(PY) -m ruff check proxy protocol quotas spark_analytics contracts tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports
	.venv/bin/hadolint Dockerfile

unit: setup
	$(PYTEST) -n $(WORKERS) -m "not integration and not spark and not slow" tests

cluster: setup
	$(PY) -m tests.harness.cluster up --nodes $(or $(NODES),1) --sasl
