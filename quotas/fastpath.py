"""The one place that picks the quota stats' implementation: compiled or pure Python.

Every request records into a sensor's windowed rate (and, under `rate_model: token_bucket`, its
bucket) and measures it. Those two stats have two implementations with one contract:

* the pure-Python reference, `quotas.stats.SampledRate` and `quotas.stats.TokenBucket` (what a
  reader reads first, and the fallback);
* their compiled twins in `quotas._speedups` (Cython, C doubles and 64-bit ms clocks), which give
  the same floats bit for bit (tests/unit/differential).

The clock every request reads (`quotas.clock.SystemClock`, ``time.monotonic_ns() // 1_000_000``)
has a compiled twin too, `SystemClockImpl`, on Linux (where both read CLOCK_MONOTONIC).

The engine's common case has a compiled form too, `QuickChargeImpl` (`quotas._speedups.QuickCharge`):
`QuotaEngine.produce` (without per-topic usage), `QuotaEngine.request`, and a Fetch's
`QuotaEngine.fetch_request` (its ``request_rate`` and its max_bytes cap, with no topics to cap by)
and `QuotaEngine.fetch_response` (its bytes admitted, not read whole) recorded and decided in one
call while nothing throttles, handing every budget that is not the common case to the manager's
own Python; and those verbs and `response` whole (`produce_verdict`, `request_verdict`,
`response_verdict`, `fetch_request_verdict`, `fetch_response_verdict`: that, or the engine's
Python verb), for the quota stage's compiled hooks (`proxy.stages._speedups`). Its readable reference is
the engine's Python verbs themselves (which run when it is None); tests/unit/differential/
test_quick_charge.py and test_quota_hooks.py hold the two equal.

The compiled ones are used when they were built (`pip install` builds them when a C compiler is
present) and `SLUICE_PURE_PYTHON` is not set to a true value (1, true, yes), the same switch as the
byte path's (`protocol.fastpath`). The quota manager and the connection-rate limiter construct
their stats through `SampledRateImpl` and `TokenBucketImpl`; type annotations keep naming the
reference classes. `IMPLEMENTATION` says which one is in use ("compiled" or "pure").
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Final, Protocol, cast

from contracts.compiled import choose
from quotas import clock, stats

if TYPE_CHECKING:
    from quotas.engine import RequestVerdict, ResponseVerdict
    from quotas.entity import ClientIdentity

_TWINS: Final = ("SampledRate", "TokenBucket", "SystemClock", "QuickCharge")

_CHOICE: Final = choose("quotas._speedups", _TWINS)
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""quotas._speedups if it was built (whatever SLUICE_PURE_PYTHON says: the tests use both), else None."""
IMPLEMENTATION: Final = _CHOICE.implementation
describe: Final = _CHOICE.describe
"""One line for the start-up log: which quota stats run, and why when they are the pure ones."""

_impl = _CHOICE.active

# The compiled classes have the reference's constructors, methods and results (tests/unit/differential).
SampledRateImpl: Final = cast(type[stats.SampledRate],
                              stats.SampledRate if _impl is None else _impl.SampledRate)
TokenBucketImpl: Final = cast(type[stats.TokenBucket],
                              stats.TokenBucket if _impl is None else _impl.TokenBucket)

SystemClockImpl: Final = cast(type[clock.SystemClock],
                              clock.SystemClock if _impl is None or not sys.platform.startswith("linux")
                              else _impl.SystemClock)


class QuickCharge(Protocol):
    """`quotas._speedups.QuickCharge`: the engine's verb, or None when it did nothing."""

    def produce(self, broker_id: int | None, identity: ClientIdentity,
                size_bytes: int) -> RequestVerdict | None: ...

    def request(self, broker_id: int | None, identity: ClientIdentity) -> RequestVerdict | None: ...

    def produce_verdict(self, broker_id: int | None, identity: ClientIdentity,
                        size_bytes: int) -> RequestVerdict: ...

    def request_verdict(self, broker_id: int | None, identity: ClientIdentity,
                        rated: bool) -> RequestVerdict: ...

    def response_verdict(self, broker_id: int | None, identity: ClientIdentity,
                         elapsed_ms: int) -> ResponseVerdict: ...

    def fetch_request(self, broker_id: int | None, identity: ClientIdentity) -> RequestVerdict | None: ...

    def fetch_response(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                       request_throttle_ms: int) -> ResponseVerdict | None: ...

    def fetch_request_verdict(self, broker_id: int | None, identity: ClientIdentity) -> RequestVerdict: ...

    def fetch_response_verdict(self, broker_id: int | None, identity: ClientIdentity, size_bytes: int,
                               request_throttle_ms: int) -> ResponseVerdict: ...


QuickChargeImpl: Final = None if _impl is None else _impl.QuickCharge
"""The compiled class (constructed by `QuotaEngine` with its types), or None: the engine's Python verbs."""
