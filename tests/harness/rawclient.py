"""A blocking raw Kafka-protocol socket for tests that need exact control over frames."""

from __future__ import annotations

import datetime as dt
import socket
import struct
from typing import Any

from protocol.encode import decode_response_body, encode_request
from protocol.headers import RequestHeader


class RawKafkaSocket:
    def __init__(self, address: str, timeout_s: float = 10.0, source_host: str | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s,
                                             source_address=None if source_host is None else (source_host, 0))
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafkaSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, body: Any, client_id: str | None = "raw-test") -> int:
        """Encode a kio request entity with the right header and send it; returns its correlation id."""
        self._correlation += 1
        header_version = 2 if type(body).__flexible__ else 1
        header = RequestHeader(type(body).__api_key__, type(body).__version__, self._correlation, client_id,
                               header_version, 0)
        payload = encode_request(header, body)
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        return self._correlation

    def recv_frame(self) -> bytes:
        """One response payload (no size prefix); raises ConnectionError on EOF."""
        size = struct.unpack(">i", self._recv_exactly(4))[0]
        return self._recv_exactly(size)

    def recv(self, api_key: int, api_version: int) -> tuple[int, Any]:
        payload = self.recv_frame()
        correlation_id = struct.unpack_from(">i", payload, 0)[0]
        return correlation_id, decode_response_body(payload, api_key, api_version)

    def at_eof(self, timeout_s: float) -> bool:
        """True if the peer closes the connection within timeout_s (data read meanwhile is dropped)."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def _recv_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by peer")
            buf += chunk
        return bytes(buf)


def metadata_request(topics: list[str] | None = None, version: int = 12) -> Any:
    import importlib

    mod = importlib.import_module(f"kio.schema.metadata.v{version}.request")
    topic_list = None if topics is None else tuple(
        mod.MetadataRequestTopic(topic_id=None, name=t) if version >= 10 else mod.MetadataRequestTopic(name=t)
        for t in topics)
    kwargs: dict[str, Any] = {"topics": topic_list, "allow_auto_topic_creation": False}
    if version >= 8 and version <= 10:
        kwargs["include_cluster_authorized_operations"] = False
    if version >= 8:
        kwargs["include_topic_authorized_operations"] = False
    return mod.MetadataRequest(**kwargs)


def fetch_request_v12(topic: str, partition: int = 0, offset: int = 0, max_wait_ms: int = 500,
                      min_bytes: int = 1) -> Any:
    from kio.schema.fetch.v12 import request as r

    return r.FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=dt.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(r.FetchTopic(topic=topic, partitions=(
            r.FetchPartition(partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                             last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")
