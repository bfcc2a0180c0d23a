"""The per-request counters of /metrics: the compiled twin (`protocol._speedups.RequestCounters`,
C integers) counts what the readable reference (`protocol.counters.RequestCounters`) counts, for
any sequence of completed requests: Kafka's API keys (in the C arrays) and any other int16 key a
client may send (in the twin's dictionary), with any sizes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import counters
from tests.unit.differential.impls import compiled


@dataclass
class Done:
    api_key: int
    request_bytes: int
    response_bytes: int


completed = st.lists(st.builds(Done, st.one_of(st.integers(0, 127), st.integers(-(2**15), 2**15 - 1)),
                               st.integers(0, 2**40), st.integers(0, 2**40)), max_size=200)


@pytest.mark.both_twins
@settings(max_examples=150, deadline=None)
@given(requests=completed)
def test_the_twins_count_alike(requests: list[Done]) -> None:
    pure, fast = counters.RequestCounters(), compiled().RequestCounters()
    for i, done in enumerate(requests):
        pure.on_complete(None, done, i)
        fast.on_complete(None, done, i)
        if i % 50 == 0:  # a scrape in between changes nothing
            assert fast.snapshot() == pure.snapshot()
    assert fast.snapshot() == pure.snapshot()


@pytest.mark.both_twins
def test_a_miscount_is_caught() -> None:
    fast = compiled().RequestCounters()
    fast.on_complete(None, Done(0, 100, 7), 0)
    fast.on_complete(None, Done(300, 1, 2), 0)
    assert fast.snapshot() == {0: (1, 100, 7), 300: (1, 1, 2)}
    assert fast.snapshot() != {0: (1, 100, 8), 300: (1, 1, 2)}
