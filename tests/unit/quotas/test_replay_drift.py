"""The replay loop ends when its client's queue sum has drifted below the head's remainder
(both twins).

The loop keeps, per client, the running float sum of what its queue still wants (`queued`), and a
fetch asks for all of it. The sum is rounded at every addition, so it can end up below what its
arrivals still want: by up to half an ulp of the sum per addition, where an arrival counts as
admitted once less than 1e-9 of it is left. A loop that asks for `queued` alone then asks for
nothing, is given nothing (a piece of 0 bytes is under any quota, so not throttled either) and
decides again at the same instant for ever: no later arrival is fed, since each is later than
that instant. Both twins ask for at least the head's remainder.

The arrivals: a consumer's backlog of 100,000,000 bytes and 3,071.1 bytes more (3 records of
1023.7 bytes, the shape of a retimed consumer demand's rows) at the same instant, under a
consumer_byte_rate far above them. In doubles 100,000,000 + 3,071.1 = 100,003,071.1 rounds to a
multiple of 2^-26 (~1.49e-8, the ulp of numbers in [2^26, 2^27)): to 5.96e-9 below the exact sum.
The one decision delivers that sum: the first arrival's 1e8, then 3,071.1 - 5.96e-9 of the
second, whose remainder, 5.96e-9, is over 1e-9: it stays at the head, and `queued` is 0.
The next decision must ask for the 5.96e-9 and admit it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from quotas import RateConfig
from quotas import replay as replay_module
from quotas.entity import QuotaKind
from quotas.replay_loop import SensorDecider, SensorModel, run_loop
from tests.unit.differential.impls import built

BACKLOG, MORE = 100_000_000.0, 3 * 1023.7
T0 = 1_767_225_600_000
# 1 GiB/s: a padded window of 10 x 500 ms holds 5.4 GB, far above the 100 MB asked (never throttled;
# the fetch cap, (11 - 1) x 0.5 s of quota, is 5.4 GB too: one piece delivers the whole queue)
MODEL = SensorModel(QuotaKind.FETCH, float(1 << 30), RateConfig(11, 500), None)


def test_the_arithmetic_of_the_drift() -> None:
    queued = BACKLOG + MORE
    left = MORE - (queued - BACKLOG)  # what the head still wants after one decision delivered `queued`
    assert 1e-9 < left < 2.0 ** -26 / 2 + 1e-12  # within half an ulp of the sum, above the 1e-9 slack


def test_the_readable_loop_admits_a_head_the_queue_sum_drifted_below() -> None:
    decider = SensorDecider(MODEL)
    decisions = 0

    def decide(now_ms: int, client: int, head: int, asked: float) -> tuple[int, float]:
        # a step bound: the loop needs 2 decisions; one that spins at one instant fails here
        # instead of hanging the test run
        nonlocal decisions
        decisions += 1
        assert decisions <= 10, f"decision {decisions} at {now_ms}: asked {asked!r}, the loop spins"
        return decider.decide(now_ms, client, head, asked)

    out = run_loop([T0, T0], [0, 0], [BACKLOG, MORE], [0, 0], T0 + 1, from_response=False, coalesce=True,
                   decide=decide)
    assert list(out.admitted_ms) == [T0, T0] and list(out.remaining) == [0.0, 0.0]
    assert decisions == 2 and list(out.throttle_ms) == []


# The compiled twin holds the GIL in C: a spinning call can only be stopped from outside, so it runs
# in a child process with a deadline. The child's work is an interpreter start, the imports and a
# two-decision replay: about a second; 120 s is a deadline for a spin, not a measure of speed, and
# holds on a loaded machine.
_CHILD = """
from array import array
from quotas import RateConfig, replay
from quotas.entity import QuotaKind
from quotas.replay_loop import SensorModel
model = SensorModel(QuotaKind.FETCH, float(1 << 30), RateConfig(11, 500), None)
t0 = {t0}
out = replay.COMPILED_MODULE.replay_sensor(array("q", [t0, t0]), array("i", [0, 0]),
                                           array("d", [{backlog!r}, {more!r}]), array("q", [0, 0]),
                                           t0 + 1, False, True, model)
print(list(out.admitted_ms), list(out.remaining), list(out.throttle_ms))
"""


def test_the_compiled_loop_admits_a_head_the_queue_sum_drifted_below() -> None:
    built(replay_module.COMPILED_MODULE, "quotas._replay_speedups")
    code = _CHILD.format(t0=T0, backlog=BACKLOG, more=MORE)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the compiled replay_sensor spun for 120 s on a two-arrival replay")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == f"{[T0, T0]} [0.0, 0.0] []"
