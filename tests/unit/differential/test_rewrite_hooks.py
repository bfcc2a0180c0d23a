"""The rewrite stage's compiled response hook (`proxy.stages._speedups.RewriteHooks`) against the
stage's own `RewriteStage.on_response`, the readable reference it stands in for.

Both get the same responses: Produce v9-v13 and Fetch v15-v18 built by kio with and without
KIP-951 leader endpoints, whole or as the head of a streamed response, cut short or with a byte
too many, and responses of other APIs (Metadata, ApiVersions, one the stage does not rewrite).
Both must say the same: nothing (None), or an outcome with the same bytes, throttle and tail; for
ApiVersions, whichever of the two reads an answer first (the other then finds it capped in the
rewriter's cache).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema

from protocol.apis import ApiKey
from proxy.flow.inflight import InFlight
from proxy.flow.pipeline import ConnectionContext
from proxy.stages import addresses
from proxy.stages.addresses import ResponseRewriter, RewriteStage
from tests.unit.differential.impls import built
from tests.unit.protocol.kio_support import KIO_EXAMPLES, kio_entities, response_payload
from tests.unit.protocol.test_rewrite import body_with_endpoints
from tests.unit.proxy.test_kafka4_stages import FakeRegistry

CTX = ConnectionContext(1, "127.0.0.1:5000", "broker 1", 1)


def hooks(stage: RewriteStage) -> Any:
    module = built(addresses._CHOICE.compiled_module, "proxy.stages._speedups")
    return module.RewriteHooks(stage, RewriteStage).on_response


def said(outcome: Any) -> Any:
    return None if outcome is None else (outcome.payload, outcome.throttle_time_ms, type(outcome.tail))


CASES = [*[(ApiKey.PRODUCE, v) for v in range(9, 14)], *[(ApiKey.FETCH, v) for v in range(15, 19)],
         (ApiKey.METADATA, 12), (ApiKey.API_VERSIONS, 3), (ApiKey.LIST_OFFSETS, 8)]


@pytest.mark.both_twins
@pytest.mark.parametrize(("api_key", "api_version"), CASES)
@settings(KIO_EXAMPLES, max_examples=20)
@given(data=st.data())
def test_the_compiled_hook_says_what_the_stage_says(api_key: int, api_version: int,
                                                    data: st.DataObject) -> None:
    schema = load_response_schema(api_key, api_version)
    if "node_endpoints" in schema.__dataclass_fields__:
        body = body_with_endpoints(api_key, api_version, data)
    else:
        body = data.draw(kio_entities(schema))
    payload = response_payload(body)
    shape = data.draw(st.sampled_from(["whole", "whole", "head", "cut", "longer"]))
    size = len(payload)
    if shape == "head":    # the head of a streamed response: the stage sees its first bytes
        size = len(payload) + data.draw(st.integers(1, 1000))
    elif shape == "cut":
        payload = payload[:data.draw(st.integers(0, len(payload) - 1))]
        size = len(payload)
    elif shape == "longer":
        payload += b"\x00"
        size = len(payload)
    stage = RewriteStage(ResponseRewriter(FakeRegistry()))
    fast = hooks(stage)
    entry = InFlight(7, int(api_key), api_version, "c", 50, 0)
    entry.upstream_response_bytes = size
    if data.draw(st.booleans()):  # the compiled hook first: an ApiVersions answer not yet in the cache
        got = said(fast(CTX, entry, payload))
        expected = said(RewriteStage.on_response(stage, CTX, entry, payload))
    else:                         # the reference first: the compiled hook then answers from the cache
        expected = said(RewriteStage.on_response(stage, CTX, entry, payload))
        got = said(fast(CTX, entry, payload))
    assert got == expected
    if shape == "whole" and hasattr(body, "node_endpoints") and not body.node_endpoints:
        assert expected is None  # the usual response of Produce v10+ or Fetch v16+: left alone by both


def test_the_stage_installs_the_compiled_hook_when_built() -> None:
    stage = RewriteStage(ResponseRewriter(FakeRegistry()))
    if addresses.RewriteHooksImpl is None:
        assert stage.on_response.__func__ is RewriteStage.on_response  # type: ignore[attr-defined]
    else:
        assert type(stage.on_response.__self__) is addresses.RewriteHooksImpl  # type: ignore[attr-defined]
