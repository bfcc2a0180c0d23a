"""The data plane's per-request byte path, pure Python against its compiled twin (no sockets).

One "request pair" is what the proxy's pumps do per small request: feed a socket read into the
client's FrameSplitter and pull the frame, parse its header and the Produce acks, then on the way
back frame the broker's response, read its correlation id and patch its throttle_time_ms. The
stream is 2,000 pipelined Produce v9 requests (one 70-byte record batch each) fed in 16 KiB reads,
and their Produce v9 responses (one partition each).

Figures are CPU time (time.process_time) per request pair: the minimum over rounds, the rounds of
the implementations interleaved so that both see the same machine load. `--implementation
module:NAME` also times a third set of modules on the path (how the mypyc comparison was made:
the pure modules compiled by mypyc, first on PYTHONPATH). Prints JSON.

    .venv/bin/python -m bench.bench_speedups [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
from types import SimpleNamespace
from typing import Any

N_REQUESTS = 2000
READ_BYTES = 16 * 1024
I32 = struct.Struct(">i")


def _produce_request(correlation_id: int) -> bytes:
    records = b"\x00" * 70
    body = (b"\x00" + struct.pack(">hi", 1, 30000)  # transactional_id null, acks=1, timeout
            + b"\x02" + b"\x06bench" + b"\x02" + struct.pack(">i", 0)
            + bytes([len(records) + 1]) + records + b"\x00" + b"\x00" + b"\x00")
    return struct.pack(">hhih", 0, 9, correlation_id, 6) + b"client" + b"\x00" + body


def _produce_response(correlation_id: int) -> bytes:
    part = struct.pack(">ihqqq", 0, 0, 42, -1, 0) + b"\x01\x00\x00"
    return (I32.pack(correlation_id) + b"\x00" + b"\x02" + b"\x06bench" + b"\x02" + part + b"\x00"
            + I32.pack(0) + b"\x00")


def _stream(frames: list[bytes]) -> list[bytes]:
    data = b"".join(I32.pack(len(f)) + f for f in frames)
    return [data[i : i + READ_BYTES] for i in range(0, len(data), READ_BYTES)]


REQUESTS = _stream([_produce_request(i) for i in range(N_REQUESTS)])
RESPONSES = _stream([_produce_response(i) for i in range(N_REQUESTS)])


def run_once(impl: Any) -> float:
    """CPU seconds for N_REQUESTS request pairs through `impl`."""
    client, broker = impl.FrameSplitter(), impl.FrameSplitter()
    read_header, read_acks = impl.read_request_header, impl.read_produce_acks
    read_cid, patch = impl.read_response_correlation_id, impl.patch_throttle_time
    n = 0
    t0 = time.process_time()
    for chunk in REQUESTS:
        client.feed(chunk)
        while (frame := client.next_frame()) is not None:
            header = read_header(frame)
            read_acks(frame, header)
            n += 1
    for chunk in RESPONSES:
        broker.feed(chunk)
        while (frame := broker.next_frame()) is not None:
            read_cid(frame)
            patch(frame, 0, 9, 100)
            n -= 1
    elapsed = time.process_time() - t0
    assert n == 0
    return elapsed


def _reference() -> SimpleNamespace:
    from protocol import framing, headers, produce, throttle

    return SimpleNamespace(FrameSplitter=framing.FrameSplitter,
                           read_request_header=headers.read_request_header,
                           read_produce_acks=produce.read_produce_acks,
                           read_response_correlation_id=headers.read_response_correlation_id,
                           patch_throttle_time=throttle.patch_throttle_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--implementation", action="append", default=[],
                        help="module:NAME, times the reference modules as loaded (e.g. mypyc-compiled)")
    args = parser.parse_args()
    impls: dict[str, Any] = {}
    for spec in args.implementation:
        impls[spec.split(":", 1)[1]] = _reference()
    if not args.implementation:
        impls["pure"] = _reference()
        from protocol import fastpath

        if fastpath.COMPILED_MODULE is not None:
            impls["compiled"] = fastpath.COMPILED_MODULE
    best = {name: float("inf") for name in impls}
    for _ in range(args.rounds):
        for name, impl in impls.items():
            best[name] = min(best[name], run_once(impl))
    from protocol import framing

    print(json.dumps({
        "load_average_1m": os.getloadavg()[0],
        "framing_module": framing.__file__,
        "cpu_us_per_request_pair": {name: round(t / N_REQUESTS * 1e6, 3) for name, t in best.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
