"""The length guard in front of kio's native reader: it must accept every valid payload of every
schema kio knows (ending exactly where kio's writer ended), and refuse the counts that would make
kio's reader abort the process."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
from typing import Any

import pytest
from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_writer

from protocol.apis import ApiKey
from protocol.encode import decode_request_body, decode_response_body
from protocol.errors import DecodeError
from protocol.headers import RequestHeader
from protocol.kio_guard import check_entity
from tests.fuzz.seeds import _draw


def schemas() -> list[tuple[str, Any]]:
    out = []
    for api_key in range(0, 100):
        for version in range(0, 25):
            for side, load in (("request", load_request_schema), ("response", load_response_schema)):
                try:
                    out.append((f"{side} {api_key} v{version}", load(api_key, version)))
                except (UnknownAPIKey, UnknownEntity, KeyError, ValueError):
                    continue
    return out


SCHEMAS = schemas()


def test_kio_knows_many_schemas() -> None:
    assert len(SCHEMAS) > 400


@pytest.mark.parametrize(("name", "cls"), SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_valid_payloads_of_every_schema_pass_and_end_where_the_writer_ended(name: str, cls: Any) -> None:
    for entity in _draw(cls, 1):
        buf = io.BytesIO()
        entity_writer(cls)(buf, entity)
        payload = b"\x00\x01" + buf.getvalue()
        assert check_entity(cls, payload, 2) == len(payload), name


def test_a_huge_array_count_is_refused_before_kio_sees_it() -> None:
    cls = load_request_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0)
    # components: int32 count 2**31-1, then 4 bytes: cannot be 2 billion components
    payload = struct.pack(">i", 2**31 - 1) + b"\x00" * 4
    with pytest.raises(DecodeError, match="cannot fit"):
        check_entity(cls, payload, 0)


def test_a_hostile_admin_request_does_not_kill_the_process() -> None:
    """Through the public decoder, in a child process: before the guard, kio's reader aborted it
    (SIGABRT, exit -6) on this request; now it is a DecodeError like any bad frame."""
    code = (
        "import struct\n"
        "from protocol.encode import decode_request_body\n"
        "from protocol.errors import DecodeError\n"
        "from protocol.headers import read_request_header\n"
        "hdr = struct.pack('>hhih', 48, 1, 7, 1) + b'x' + b'\\x00'\n"   # DescribeClientQuotas v1
        "body = b'\\xff\\xff\\xff\\xff\\x07' + b'\\x00' * 8\n"          # components: 2**31 items
        "payload = hdr + body\n"
        "try:\n"
        "    decode_request_body(payload, read_request_header(payload))\n"
        "except DecodeError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "refused:" in done.stdout


def test_the_public_decoders_still_decode() -> None:
    from protocol.encode import encode_request, encode_response, request_schema, response_schema

    req_cls = request_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1)
    (request,) = _draw(req_cls, 1)
    header = RequestHeader(api_key=ApiKey.DESCRIBE_CLIENT_QUOTAS, api_version=1, correlation_id=3,
                           client_id="c", header_version=2, body_offset=0)
    payload = encode_request(header, request)
    from protocol.headers import read_request_header

    assert decode_request_body(payload, read_request_header(payload)) == request
    resp_cls = response_schema(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1)
    (response,) = _draw(resp_cls, 1)
    assert decode_response_body(encode_response(1, 3, response), ApiKey.DESCRIBE_CLIENT_QUOTAS, 1) == response
