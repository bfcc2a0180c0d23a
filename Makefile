# The two commands: `make demo` and `make test`. Both set up what they need first.
PY := .venv/bin/python

.PHONY: setup demo test lint unit cluster
setup:
	@scripts/setup

demo: setup
	$(PY) -m scripts.demo

test: setup lint
	$(PY) -m pytest -p no:cacheprovider tests

lint:
	$(PY) -m ruff check proxy protocol quotas spark_analytics contracts tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports
	.venv/bin/hadolint Dockerfile

unit: setup
	$(PY) -m pytest -m "not integration and not spark and not slow" tests

cluster: setup
	$(PY) -m tests.harness.cluster up --nodes $(or $(NODES),1) --sasl
