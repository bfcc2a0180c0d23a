"""Picks the access log's Produce walks: compiled (`protocol._log_speedups`) or pure Python
(`protocol.log_walks`), by the one switch every compiled twin follows (`contracts.compiled`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from contracts.compiled import choose
from protocol import log_walks
from protocol.headers import RequestHeader

_CHOICE: Final = choose("protocol._log_speedups", ("produce_log_parts", "produce_log_summary"))
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""protocol._log_speedups if it was built (whatever SLUICE_PURE_PYTHON says: tests use both), else None."""
IMPLEMENTATION: Final = _CHOICE.implementation
describe: Final = _CHOICE.describe
"""One line for the start-up log: which access-log walks run, and why when they are the pure ones."""

_impl = _CHOICE.active

produce_log_parts: Final = cast(
    Callable[[bytes, RequestHeader], tuple[log_walks.LogPart, ...] | None],
    log_walks.produce_log_parts if _impl is None else _impl.produce_log_parts)
produce_log_summary: Final = cast(
    Callable[[bytes, int], tuple[tuple[int, ...], int]],
    log_walks.produce_log_summary if _impl is None else _impl.produce_log_summary)
