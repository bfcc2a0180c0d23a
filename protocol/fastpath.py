"""The one place that picks the data plane's implementation: compiled or pure Python.

The per-request byte path (framing, the request header, Produce acks, the response's correlation
id, the throttle_time_ms patch, the Fetch response walk with its record counts, and the check that
a Produce or Fetch response carries no KIP-951 leader endpoints to rewrite, and the finder of a
streamed Fetch response's top-level tag section) has two
implementations with one contract:

* the pure-Python reference: `protocol.framing`, `protocol.headers`, `protocol.produce`,
  `protocol.throttle`, `protocol.records`, `protocol.rewrite`, `protocol.fetch_tail`, and the
  per-request counters of /metrics,
  `protocol.counters` (what a reader reads first, and the fallback);
* its compiled twin, `protocol._speedups` (Cython), which handles the common, well-formed case in C
  and hands everything else to the reference, so both answer and raise alike (tests/unit/differential).

The compiled one is used when it was built (`pip install` builds it when a C compiler is present)
and `SLUICE_PURE_PYTHON` is not set to a true value (1, true, yes). Callers import the names from
here; `IMPLEMENTATION` says which one is in use ("compiled" or "pure").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from contracts.compiled import PURE_PYTHON_ENV, choose
from protocol import counters, fetch_tail, framing, headers, produce, records, rewrite, throttle
from protocol.headers import RequestHeader

__all__ = ["PURE_PYTHON_ENV"]  # re-exported: the switch's name, for the config's list of known variables

_TWINS: Final = ("FrameSplitter", "read_request_header", "read_response_correlation_id", "read_produce_acks",
                  "throttle_time_offset", "plan_throttle_patch", "patch_throttle_time",
                  "fetch_response_partitions", "count_records", "RequestCounters", "node_endpoints_absent",
                  "FetchTailFinder")


_CHOICE: Final = choose("protocol._speedups", _TWINS)
COMPILED_MODULE: Final = _CHOICE.compiled_module
"""protocol._speedups if it was built (whatever SLUICE_PURE_PYTHON says: the tests use both), else None."""
IMPLEMENTATION: Final = _CHOICE.implementation
describe: Final = _CHOICE.describe
"""One line for the start-up log: which data plane runs, and why when it is the pure one."""

_impl = _CHOICE.active

# The compiled callables have the reference's signatures and behaviour (tests/unit/differential).
FrameSplitter: Final = cast(type[framing.FrameSplitter],
                            framing.FrameSplitter if _impl is None else _impl.FrameSplitter)
read_request_header: Final = cast(Callable[[bytes], RequestHeader],
                                  headers.read_request_header if _impl is None else _impl.read_request_header)
read_response_correlation_id: Final = cast(
    Callable[[bytes], int],
    headers.read_response_correlation_id if _impl is None else _impl.read_response_correlation_id)
read_produce_acks: Final = cast(Callable[[bytes, RequestHeader], int],
                                produce.read_produce_acks if _impl is None else _impl.read_produce_acks)
throttle_time_offset: Final = cast(
    Callable[[bytes, int, int], int | None],
    throttle.throttle_time_offset if _impl is None else _impl.throttle_time_offset)
plan_throttle_patch: Final = cast(
    Callable[[bytes, int, int, int], tuple[int, bytes] | None],
    throttle.plan_throttle_patch if _impl is None else _impl.plan_throttle_patch)
patch_throttle_time: Final = cast(
    Callable[[bytes, int, int, int], bytes],
    throttle.patch_throttle_time if _impl is None else _impl.patch_throttle_time)
fetch_response_partitions: Final = cast(
    Callable[[bytes, int], tuple[int, list[records.PartitionTraffic]]],
    records.fetch_response_partitions if _impl is None else _impl.fetch_response_partitions)
count_records: Final = cast(Callable[[bytes, int, int], int | None],
                            records.count_records if _impl is None else _impl.count_records)

node_endpoints_absent: Final = cast(
    Callable[[bytes, int, int], bool],
    rewrite.node_endpoints_absent if _impl is None else _impl.node_endpoints_absent)

# the per-request counters of /metrics (`protocol.counters`): C integers, no Python frame per request
RequestCounters: Final = cast(type[counters.RequestCounters],
                              counters.RequestCounters if _impl is None else _impl.RequestCounters)

# a streamed Fetch v12+ response's walk to its top-level tag section, chunk by chunk
FetchTailFinder: Final = cast(type[fetch_tail.FetchTailFinder],
                              fetch_tail.FetchTailFinder if _impl is None else _impl.FetchTailFinder)
