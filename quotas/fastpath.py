"""The one place that picks the quota stats' implementation: compiled or pure Python.

Every request records into a sensor's windowed rate (and, under `rate_model: token_bucket`, its
bucket) and measures it. Those two stats have two implementations with one contract:

* the pure-Python reference, `quotas.stats.SampledRate` and `quotas.stats.TokenBucket` (what a
  reader reads first, and the fallback);
* their compiled twins in `quotas._speedups` (Cython, C doubles and 64-bit ms clocks), which give
  the same floats bit for bit (tests/unit/differential).

The compiled ones are used when they were built (`pip install` builds them when a C compiler is
present) and `SLUICE_PURE_PYTHON` is not set to a true value (1, true, yes), the same switch as the
byte path's (`protocol.fastpath`). The quota manager and the connection-rate limiter construct
their stats through `SampledRateImpl` and `TokenBucketImpl`; type annotations keep naming the
reference classes. `IMPLEMENTATION` says which one is in use ("compiled" or "pure").
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Final, cast

from quotas import stats

PURE_PYTHON_ENV: Final = "SLUICE_PURE_PYTHON"
"""Set to 1 (true, yes) to run the pure-Python stats even when the compiled ones are built."""

_TWINS: Final = ("SampledRate", "TokenBucket")


def _pure_requested() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes")


def _load_compiled() -> ModuleType | None:
    """quotas._speedups, or None if it is not built or was built from an older .pyx."""
    try:
        module = importlib.import_module("quotas._speedups")
    except ImportError:
        return None
    return module if all(hasattr(module, name) for name in _TWINS) else None


COMPILED_MODULE: Final = _load_compiled()
"""quotas._speedups if it was built (whatever SLUICE_PURE_PYTHON says: the tests use both), else None."""

IMPLEMENTATION: Final = "compiled" if COMPILED_MODULE is not None and not _pure_requested() else "pure"

_impl = COMPILED_MODULE if IMPLEMENTATION == "compiled" else None

# The compiled classes have the reference's constructors, methods and results (tests/unit/differential).
SampledRateImpl: Final = cast(type[stats.SampledRate],
                              stats.SampledRate if _impl is None else _impl.SampledRate)
TokenBucketImpl: Final = cast(type[stats.TokenBucket],
                              stats.TokenBucket if _impl is None else _impl.TokenBucket)


def describe() -> str:
    """One line for the start-up log: which quota stats run, and why when they are the pure ones."""
    if IMPLEMENTATION == "compiled":
        return "compiled (quotas._speedups)"
    if COMPILED_MODULE is not None:
        return "pure Python (SLUICE_PURE_PYTHON is set)"
    return ("pure Python (quotas._speedups is not built, or is older than quotas/_speedups.pyx: "
            "run `pip install -e .` with a C compiler present to use the compiled one)")
