# The two commands: `make demo` and `make test`. Both set up what they need first.
# `make check` is the inner loop: lint, types, import contracts and the tests that need no broker.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest -p no:cacheprovider
# The suite mostly waits (on brokers, windows, timeouts), so it runs on more workers than cores. The
# workers share one single-node broker (tests/harness/shared_kafka.py), so a worker costs no broker of
# its own; past 5 on this 2-core machine kind the run turns CPU-bound and a rate-bound client cannot be
# judged fairly with one core kept busy (bench/results/test-suite-timing.md has the runs).
WORKERS ?= 5
# extra options for the main pytest run, e.g. ARGS="--timing-jsonl=t.jsonl" (tests.harness.timing reads it)
ARGS ?=

.PHONY: setup demo test check lint unit cluster
setup:
	@scripts/setup

demo: setup
	$(PY) -m scripts.demo

# Test runs write the bytecode of the modules they import (pytest's assertion-rewritten tests too), so
# each xdist worker and each Sluice process started by a test reuses it instead of compiling again.
unexport PYTHONDONTWRITEBYTECODE

# The unit and differential suites on the pure-Python data plane (the main run takes the compiled one
# where it was built): contracts/compiled.py reads SLUICE_PURE_PYTHON once, at import, so they are a
# pytest run of their own. It leaves out the differential tests marked `both_twins`: they call each twin
# by name and never read the switch (tests/unit/differential/conftest.py), so they would repeat the main
# run's work exactly; the tests of what the switch selects run in both.
PURE := SLUICE_PURE_PYTHON=1 $(PYTEST) -q -n 2 --dist loadgroup --no-loadscope-reorder -m "not both_twins" tests/unit

# `make test` and `make check` run lint and the pure-Python unit run beside the main pytest run (which
# mostly waits on brokers); any of them failing fails the target. Both are niced: they only need the
# CPU the main run leaves, whose timed tests (rates over quota windows) should not wait for them.
# $(1): the main pytest command line
beside = rm -f .lint.log .pure.log; \
	(nice -n 10 $(MAKE) --no-print-directory lint > .lint.log 2>&1; echo $$? >> .lint.log) & lint=$$!; \
	(nice -n 10 env $(PURE) > .pure.log 2>&1; echo $$? >> .pure.log) & pure=$$!; \
	$(1); tests=$$?; wait $$lint $$pure; lint_rc=$$(tail -n 1 .lint.log); pure_rc=$$(tail -n 1 .pure.log); \
	if [ "$$pure_rc" != 0 ]; then sed '$$d' .pure.log; echo "unit tests on the pure-Python path FAILED"; \
	else echo "unit tests on the pure-Python path: $$(sed '$$d' .pure.log | tail -n 1)"; fi; \
	if [ "$$lint_rc" != 0 ]; then sed '$$d' .lint.log; echo "lint FAILED (ruff, mypy, import-linter, hadolint)"; \
	else echo "lint passed (ruff, mypy, import-linter, hadolint)"; fi; \
	[ "$$tests" = 0 ] && [ "$$lint_rc" = 0 ] && [ "$$pure_rc" = 0 ]

test: setup
	@$(call beside,$(PYTEST) $(ARGS) -n $(WORKERS) --dist loadgroup --no-loadscope-reorder tests)

check: setup
	@$(call beside,$(PYTEST) $(ARGS) -n $(WORKERS) --dist loadgroup --no-loadscope-reorder -m "not integration and not spark and not slow" tests)

lint:
	$(PY) -m ruff check proxy protocol quotas spark_analytics contracts tests bench scripts
	$(PY) -m mypy
	.venv/bin/lint-imports
	.venv/bin/hadolint Dockerfile

unit: setup
	$(PYTEST) -n $(WORKERS) -m "not integration and not spark and not slow" tests

cluster: setup
	$(PY) -m tests.harness.cluster up --nodes $(or $(NODES),1) --sasl
