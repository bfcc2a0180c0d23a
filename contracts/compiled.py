"""The one switch between a compiled twin and its readable reference, and the one loader.

Sluice's compiled modules (``protocol._speedups``, ``quotas._speedups``, ``quotas._replay_speedups``)
are faster twins of readable Python, never the only copy. Each is used when it was built (``pip
install`` builds it when a C compiler is present), is as new as its ``.pyx`` (it has every name its
chooser needs), and ``SLUICE_PURE_PYTHON`` is not set to a true value (1, true, yes).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Final

PURE_PYTHON_ENV: Final = "SLUICE_PURE_PYTHON"
"""Set to 1 (true, yes) to run every pure-Python reference even where the compiled twin is built."""


def pure_requested() -> bool:
    """Whether ``SLUICE_PURE_PYTHON`` asks for the pure-Python references."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True, slots=True)
class TwinChoice:
    """Which implementation one compiled module's callers use."""

    module_name: str
    #: the module if it was built and is current (whatever SLUICE_PURE_PYTHON says: tests use both)
    compiled_module: ModuleType | None
    #: ``"compiled"`` or ``"pure"``
    implementation: str

    @property
    def active(self) -> ModuleType | None:
        """The compiled module when it is the one in use, else None."""
        return self.compiled_module if self.implementation == "compiled" else None

    def describe(self) -> str:
        """One line for the start-up log: which one runs, and why when it is the pure one."""
        if self.implementation == "compiled":
            return f"compiled ({self.module_name})"
        if self.compiled_module is not None:
            return f"pure Python ({PURE_PYTHON_ENV} is set)"
        source = self.module_name.replace(".", "/") + ".pyx"
        return (f"pure Python ({self.module_name} is not built, or is older than {source}: "
                "run `pip install -e .` with a C compiler present to use the compiled one)")


def choose(module_name: str, names: Sequence[str] = ()) -> TwinChoice:
    """Load `module_name` if it is built and has every one of `names` (a stale build lacks a new
    twin: the pure path runs until ``pip install -e .`` rebuilds it), and pick the implementation."""
    try:
        module: ModuleType | None = importlib.import_module(module_name)
    except ImportError:
        module = None
    if module is not None and not all(hasattr(module, name) for name in names):
        module = None
    implementation = "compiled" if module is not None and not pure_requested() else "pure"
    return TwinChoice(module_name, module, implementation)
