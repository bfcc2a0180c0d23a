"""The `both_twins` marker: a differential test that runs the readable and the compiled twin by name.

Such a test never reads the switch (contracts/compiled.py, SLUICE_PURE_PYTHON): it takes the
readable functions and classes from their modules and the compiled ones from the built extension
(loaded whatever the switch says), so its outcome is the same in the main run and in the pure-Python
run. The Makefile's pure-Python run of tests/unit deselects it (`-m "not both_twins"`): there it
would repeat the main run's work exactly. Tests that check what the switch selects are not marked.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_twins: compares the two twins by name, never through the switch; the pure-Python "
        "run deselects it as an exact repeat of the main run")
