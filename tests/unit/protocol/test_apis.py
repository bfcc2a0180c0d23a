"""API keys, names and header versions, checked against kio's schema index."""

from __future__ import annotations

import re

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map

from protocol.apis import (
    FLEXIBLE_SINCE,
    ApiKey,
    api_name,
    is_flexible,
    request_header_version,
    response_header_version,
)
from tests.unit.protocol.kio_support import kio_api_keys, kio_versions


def test_key_numbers_the_proxy_relies_on() -> None:
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA) == (0, 1, 2, 3)
    assert ApiKey.FIND_COORDINATOR == 10
    assert (ApiKey.SASL_HANDSHAKE, ApiKey.API_VERSIONS) == (17, 18)
    assert (ApiKey.DESCRIBE_LOG_DIRS, ApiKey.SASL_AUTHENTICATE) == (35, 36)
    assert (ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS) == (48, 49)
    assert ApiKey.DESCRIBE_CLUSTER == 60
    assert [key.value for key in ApiKey] == list(range(93))  # 0..92, no gaps


def test_every_kio_key_is_named_like_kio() -> None:
    for key, snake in api_key_map.items():
        assert ApiKey(key).name == snake.upper()
        assert re.sub(r"(?<!^)(?=[A-Z])", "_", api_name(key)).lower() == snake


def test_api_name() -> None:
    assert api_name(0) == "Produce"
    assert api_name(ApiKey.API_VERSIONS) == "ApiVersions"
    assert api_name(60) == "DescribeCluster"
    assert api_name(123) == "Unknown(123)"
    assert api_name(-1) == "Unknown(-1)"


def test_flexible_table_covers_every_key() -> None:
    assert set(FLEXIBLE_SINCE) == {key.value for key in ApiKey}


@pytest.mark.parametrize("api_key", kio_api_keys())
def test_header_versions_match_kio(api_key: int) -> None:
    for version in kio_versions(api_key):
        request_cls = load_request_schema(api_key, version)
        response_cls = load_response_schema(api_key, version)
        assert is_flexible(api_key, version) == request_cls.__flexible__, version
        assert request_header_version(api_key, version) == request_cls.__header_schema__.__version__
        assert response_header_version(api_key, version) == response_cls.__header_schema__.__version__


def test_flexible_boundaries() -> None:
    assert (request_header_version(0, 8), request_header_version(0, 9)) == (1, 2)
    assert (response_header_version(1, 11), response_header_version(1, 12)) == (0, 1)
    assert request_header_version(ApiKey.SASL_HANDSHAKE, 1) == 1  # never flexible
    assert request_header_version(ApiKey.DESCRIBE_CLUSTER, 0) == 2  # flexible from v0


def test_controlled_shutdown_v0_has_request_header_v0() -> None:
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 0) == 0
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 1) == 1
    assert request_header_version(ApiKey.CONTROLLED_SHUTDOWN, 3) == 2
    assert response_header_version(ApiKey.CONTROLLED_SHUTDOWN, 0) == 0


def test_api_versions_response_header_is_always_v0() -> None:
    assert [response_header_version(ApiKey.API_VERSIONS, v) for v in range(6)] == [0] * 6
    assert [request_header_version(ApiKey.API_VERSIONS, v) for v in range(5)] == [1, 1, 1, 2, 2]


def test_unknown_key_is_assumed_non_flexible() -> None:
    assert not is_flexible(1000, 7)
    assert request_header_version(1000, 7) == 1
    assert response_header_version(1000, 7) == 0
