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

# `make test` and `make check` run lint beside the tests (both mostly wait); either failing fails them.
# $(1): the pytest command line
beside_lint = rm -f .lint.log; ($(MAKE) --no-print-directory lint > .lint.log 2>&1; echo $$? >> .lint.log) & \
	lint=$$!; $(1); tests=$$?; wait $$lint; lint_rc=$$(tail -n 1 .lint.log); \
	if [ "$$lint_rc" != 0 ]; then sed '$$d' .lint.log; echo "lint FAILED (ruff, mypy, import-linter, hadolint)"; \
	else echo "lint passed (ruff, mypy, import-linter, hadolint)"; fi; [ "$$tests" = 0 ] && [ "$$lint_rc" = 0 ]

test: setup
	@$(call beside_lint,$(PYTEST) -n $(WORKERS) --dist loadgroup --no-loadscope-reorder tests)

check: setup
	@$(call beside_lint,$(PYTEST) -n $(WORKERS) -m "not integration and not spark and not slow" tests)

lint:
	$(PY) -m ruff check proxy protocol quotas spark_analytics contracts tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports
	.venv/bin/hadolint Dockerfile

unit: setup
	$(PYTEST) -n $(WORKERS) -m "not integration and not spark and not slow" tests

cluster: setup
	$(PY) -m tests.harness.cluster up --nodes $(or $(NODES),1) --sasl
