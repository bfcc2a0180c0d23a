"""The two implementations of the data plane's byte path, side by side, for the differential tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from protocol import fastpath, framing, headers, produce, throttle

PURE = SimpleNamespace(
    name="pure",
    FrameSplitter=framing.FrameSplitter,
    read_request_header=headers.read_request_header,
    read_response_correlation_id=headers.read_response_correlation_id,
    read_produce_acks=produce.read_produce_acks,
    throttle_time_offset=throttle.throttle_time_offset,
    plan_throttle_patch=throttle.plan_throttle_patch,
    patch_throttle_time=throttle.patch_throttle_time,
)


def compiled() -> Any:
    """protocol._speedups; the differential tests fail (never skip) when it was not built."""
    module = fastpath.COMPILED_MODULE
    if module is None:
        pytest.fail("protocol._speedups is not built: run `pip install -e .` with a C compiler present")
    return module


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    """('ok', result) or ('raised', (exception type, message)): what both must agree on."""
    try:
        return "ok", call(*args)
    except Exception as exc:
        return "raised", (type(exc), str(exc))
