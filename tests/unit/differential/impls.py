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


def built(module: Any, name: str) -> Any:
    """A compiled twin's module; the differential tests fail (never skip) when it was not built."""
    if module is None:
        pytest.fail(f"{name} is not built: run `pip install -e .` with a C compiler present")
    return module


def compiled() -> Any:
    """protocol._speedups."""
    return built(fastpath.COMPILED_MODULE, "protocol._speedups")


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    """('ok', result) or ('raised', (exception type, message)): what both must agree on."""
    try:
        return "ok", call(*args)
    except Exception as exc:
        return "raised", (type(exc), str(exc))


class Loose:
    """An object with another's fields as plain attributes (no slots). The compiled hooks read and
    write `InFlight`, `RequestHeader`, `ConnectionContext` and `QuotaNote` at their slots'
    offsets, so an object of any other class must go to the reference, never be read as one."""

    def __init__(self, like: Any) -> None:
        for name in type(like).__slots__:
            object.__setattr__(self, name, getattr(like, name))
