"""The simulation's columnar service time equals the readable `quotas.replay.service_time_ms`."""

from __future__ import annotations

import random

import numpy as np

from quotas.replay import service_time_ms
from spark_analytics.simulate import service_ms_of


def test_the_columnar_service_time_is_the_readable_one() -> None:
    rng = random.Random(7)
    for n in (1, 2, 5, 40, 500):
        for _ in range(20):
            # bursts of pipelined produces (queued waits) among lone ones, ties in ts included
            pairs = [(rng.randrange(0, 3000), float(rng.choice([1, 2, 3, rng.randrange(0, 800)])))
                     for _ in range(n)]
            ts = np.array([t for t, _ in pairs], dtype=np.int64)
            wait = np.array([w for _, w in pairs], dtype=np.float64)
            assert service_ms_of(ts, wait) == service_time_ms(pairs), pairs
    assert service_ms_of(np.zeros(0, dtype=np.int64), np.zeros(0)) == 0 == service_time_ms([])
