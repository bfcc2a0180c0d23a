"""Property: any bytes given to any decoder that reads client or broker bytes raise nothing but
`protocol.errors.ProtocolError` (subclasses included) and return promptly (targets.py).

A short budget for CI: hypothesis draws plain bytes and mutations of valid frames (seeds.py) for
each target. The coverage-guided run of a million inputs is bench/bench_fuzz.py; every failure it
found is pinned in test_regressions.py.
"""

from __future__ import annotations

import datetime
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.seeds import seeds
from tests.fuzz.targets import TARGETS, FuzzTarget

# A hang is what `deadline` catches; 2 s per input is far above any decoder's cost even on a loaded
# machine (they take microseconds), so it cannot fail from load alone.
# derandomize: CI runs the same examples every time (kio's native reader aborts the process on an
# array length it cannot allocate, see bench/bench_fuzz.py's report: random draws could hit one).
BUDGET = settings(max_examples=150, deadline=datetime.timedelta(seconds=2), database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@cache
def _seeds(name: str) -> tuple[bytes, ...]:
    return tuple(seeds(name, 1))


@st.composite
def mutated(draw: st.DrawFn, base: tuple[bytes, ...]) -> bytes:
    """A valid seed, then a few byte-level mutations: flips, truncation, insertion, deletion."""
    data = bytearray(draw(st.sampled_from(base)) if base else b"")
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(("flip", "cut", "insert", "delete", "set")))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[at: at + draw(st.integers(1, 8))]
        elif op == "set" and data:
            data[at] = draw(st.sampled_from((0x00, 0x7F, 0x80, 0xFF)))
    return bytes(data)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_any_bytes_raise_only_protocol_errors(target: FuzzTarget) -> None:
    base = _seeds(target.name)  # drawn before: hypothesis must not nest inside a test

    @BUDGET
    @given(st.one_of(st.binary(max_size=300), mutated(base)))
    def run(data: bytes) -> None:
        target.call(data)  # anything but a ProtocolError fails the test

    run()


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_seed_is_accepted(target: FuzzTarget) -> None:
    """The seeds are real frames: a target gets past its first checks with them (else the mutation
    fuzzer would start from nothing)."""
    assert _seeds(target.name), target.name
    for data in _seeds(target.name):
        target.call(data)
