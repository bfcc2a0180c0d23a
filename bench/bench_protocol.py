"""Micro-benchmarks of the `protocol` package (pure CPU, no sockets).

* Metadata v12 broker rewrite at 100 / 1,000 / 10,000 partitions: kio full rewrite (decode,
  replace brokers, encode) against the splice in `protocol.rewrite` (the outputs are checked equal);
* the hot-path helpers: request header parse, Produce acks peek, Fetch and Produce throttle patches,
  ApiVersions capping, and FrameSplitter throughput.

Each figure is the median over 7 repeats of the mean time per call within a repeat (each repeat
runs for at least ~50 ms). Results go to bench/results/protocol.json.

    .venv/bin/python -m bench.bench_protocol
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import platform
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v17 import response as fetch_v17
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.produce.v9 import response as produce_v9
from kio.serial import entity_writer
from kio.static.primitive import Records

from protocol import (
    ApiKey,
    BrokerAddress,
    FrameSplitter,
    cap_api_versions_response,
    decode_response_body,
    encode_response,
    patch_throttle_time,
    plan_throttle_patch,
    read_produce_acks,
    read_request_header,
    rewrite_metadata_response,
)
from protocol.rewrite import PARSEABLE_MAX_VERSIONS

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "protocol.json"


def per_call_us(fn: Callable[[], object], repeats: int = 7, min_seconds: float = 0.05) -> float:
    loops = 1
    while True:  # calibrate: enough loops for min_seconds
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            break
        loops = max(loops * 2, int(loops * min_seconds / max(elapsed, 1e-9) * 1.2))
    samples = [elapsed / loops]
    for _ in range(repeats - 1):
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - started) / loops)
    return statistics.median(samples) * 1e6


def to_proxy(address: BrokerAddress) -> BrokerAddress:
    return BrokerAddress(address.node_id, "sluice.proxy.example", 30000 + address.node_id)


def metadata_payload(partitions: int) -> bytes:
    brokers = tuple(metadata_v12.MetadataResponseBroker(node_id=i, host=f"kafka-{i}.internal", port=9092,
                                                        rack=f"rack-{i}") for i in range(3))
    per_topic = 100
    topics = tuple(
        metadata_v12.MetadataResponseTopic(
            error_code=ErrorCode.none, name=f"topic-{t}", topic_id=None, is_internal=False,
            partitions=tuple(metadata_v12.MetadataResponsePartition(
                error_code=ErrorCode.none, partition_index=p, leader_id=p % 3, leader_epoch=1,
                replica_nodes=(p % 3, (p + 1) % 3, (p + 2) % 3), isr_nodes=(p % 3, (p + 1) % 3),
                offline_replicas=()) for p in range(per_topic)))
        for t in range(partitions // per_topic))
    body = metadata_v12.MetadataResponse(throttle_time=datetime.timedelta(0), brokers=brokers,
                                         cluster_id="cluster", controller_id=1, topics=topics)
    return encode_response(1, 1, body)


def kio_full_rewrite(payload: bytes) -> bytes:
    body = decode_response_body(payload, ApiKey.METADATA, 12)
    brokers = tuple(dataclasses.replace(b, host=m.host, port=m.port)
                    for b in body.brokers for m in [to_proxy(BrokerAddress(b.node_id, b.host, b.port))])
    return encode_response(1, 1, dataclasses.replace(body, brokers=brokers))


def bench_metadata() -> list[dict[str, Any]]:
    rows = []
    for partitions in (100, 1_000, 10_000):
        payload = metadata_payload(partitions)
        assert rewrite_metadata_response(payload, 12, to_proxy)[0] == kio_full_rewrite(payload)
        full = per_call_us(lambda p=payload: kio_full_rewrite(p), repeats=5)
        splice = per_call_us(lambda p=payload: rewrite_metadata_response(p, 12, to_proxy))
        rows.append({"partitions": partitions, "payload_bytes": len(payload),
                     "kio_full_rewrite_us": round(full, 1), "splice_us": round(splice, 2),
                     "speedup": round(full / splice, 1)})
        print(f"metadata v12 {partitions:>6} partitions ({len(payload):>8} B): "
              f"kio full rewrite {full:>10.1f} µs   splice {splice:>7.2f} µs   x{full / splice:,.0f}")
    return rows


def bench_hot_path() -> dict[str, float]:
    results: dict[str, float] = {}

    def record(name: str, fn: Callable[[], object]) -> None:
        results[name] = round(per_call_us(fn), 3)
        print(f"{name:<48} {results[name]:>9.3f} µs")

    produce_request = b"".join([struct.pack(">hhih", 0, 9, 1, 10), b"producer-1", b"\x00", b"\x00",
                                struct.pack(">hi", -1, 30000), b"\x01", b"\x00"]) + b"\x00" * 16384
    header = read_request_header(produce_request)
    record("read_request_header (Produce v9, 16 KiB)", lambda: read_request_header(produce_request))
    record("read_produce_acks (Produce v9)", lambda: read_produce_acks(produce_request, header))

    records = fetch_v17.PartitionData(partition_index=0, error_code=ErrorCode.none, high_watermark=0,
                                      aborted_transactions=(), preferred_read_replica=-1,
                                      records=Records(b"\x00" * 65536))
    fetch_body = fetch_v17.FetchResponse(
        throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
        responses=(fetch_v17.FetchableTopicResponse(topic_id=uuid.UUID(int=1),
                                                    partitions=(records,) * 10),))
    fetch_payload = encode_response(1, 1, fetch_body)
    record(f"plan_throttle_patch (Fetch v17, {len(fetch_payload) // 1024} KiB)",
           lambda: plan_throttle_patch(fetch_payload, 1, 17, 100))
    record(f"patch_throttle_time (Fetch v17, {len(fetch_payload) // 1024} KiB, copies)",
           lambda: patch_throttle_time(fetch_payload, 1, 17, 100))

    for partitions in (1, 10, 100):
        body = produce_v9.ProduceResponse(
            responses=(produce_v9.TopicProduceResponse(name="t", partition_responses=tuple(
                produce_v9.PartitionProduceResponse(index=p, error_code=ErrorCode.none, base_offset=0,
                                                    log_append_time=None, log_start_offset=0,
                                                    record_errors=(), error_message=None)
                for p in range(partitions))),),
            throttle_time=datetime.timedelta(0))
        buf = io.BytesIO()
        buf.write(b"\x00\x00\x00\x01\x00")
        entity_writer(type(body))(buf, body)
        payload = buf.getvalue()
        record(f"patch_throttle_time (Produce v9, {partitions} partitions)",
               lambda p=payload: patch_throttle_time(p, 0, 9, 100))

    entries = [(k, 0, 20) for k in range(80)]
    api_versions = b"".join([struct.pack(">ihb", 1, 0, len(entries) + 1),
                             *(struct.pack(">hhhb", *e, 0) for e in entries), struct.pack(">ib", 0, 0)])
    record("cap_api_versions_response (v3, 80 APIs)",
           lambda: cap_api_versions_response(api_versions, 3, PARSEABLE_MAX_VERSIONS))

    frame = struct.pack(">i", 16384) + b"\x00" * 16384
    stream = frame * 64
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]

    def split() -> None:
        splitter = FrameSplitter()
        for chunk in chunks:
            splitter.feed(chunk)
            while splitter.next_frame() is not None:
                pass

    per_stream = per_call_us(split)
    results["frame_splitter_us_per_16KiB_frame"] = round(per_stream / 64, 3)
    results["frame_splitter_MB_per_s"] = round(len(stream) / per_stream, 1)
    print(f"{'FrameSplitter, 16 KiB frames in 64 KiB chunks':<48} {per_stream / 64:>9.3f} µs/frame "
          f"({len(stream) / per_stream:,.0f} MB/s)")
    return results


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True, check=False).stdout.strip()
    print(f"python {platform.python_version()}, kio {version('kio')}, commit {commit}\n")
    report = {
        "python": platform.python_version(),
        "kio": version("kio"),
        "machine": platform.machine(),
        "commit": commit,
        "metadata_rewrite": bench_metadata(),
        "hot_path_us": bench_hot_path(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
