"""The CPU one small Produce request+response costs in the proxy: over sockets, and with no sockets.

`bench_proxy` measures the whole proxy process against a raw forwarder, syscalls and event loop
included; on a loaded machine its figures swing with the scheduler. This benchmark takes the
sockets away and keeps everything else of the production path: a `ProxyServer` built from a real
config (its stages, quota sensors, metrics, and with ``--access-log`` its writer process), one
`ClientConnection` over an in-memory transport and an in-memory upstream, and small Produce v8 (or,
with ``--produce-version 11``, v11: flexible, as a modern client sends it, and a response the rewrite
stage checks for KIP-951 leader endpoints) request/response pairs (one partition, a 200-byte record
batch, acks=1; a default client-id quota
that never binds, so each request is recorded and checked). The same pairs also go through the raw
forwarder's logic (`bench.common.raw_forwarder`'s data path: bytes in, bytes out) in the same run.

**Over sockets** (no Kafka: its noise stays out): a canned broker process answers each Produce at
once; one blocking client sends ``--pairs`` pairs one at a time through (a) the raw forwarder,
(b) Sluice with the access log off, (c) Sluice with it on (Parquet), each its own process started
by this benchmark. Measured: the proxy process's CPU (all threads, and for (c) the writer process
too) from /proc over the pairs, per pair, best of ``--repeats``, and its ratio to the raw
forwarder's in the same run. This is the issue-12 measure with the broker taken out.

**With no sockets**, per pair, best of ``--repeats`` rounds of ``--pairs`` pairs each:
* loop CPU: `time.thread_time` of the event-loop thread (what competes with the sockets);
* process CPU: `time.process_time` of the proxy process (the loop plus the access-log feeder thread);
* writer CPU (``--access-log``): the access-log writer process's CPU from /proc, over the same pairs,
  after it has written every record;
* Python calls per pair: the Python functions one more round enters (`sys.setprofile`), the
  working set a request runs cold over sockets (the in-memory transports' own methods included:
  3 per pair, which is the raw row's count).

**The access log's own paths**, in this process, over the pairs' in-flight entries (best of
``--repeats``, CPU per record): the loop's capture (`InFlight.produce_parts` and `LogBatch.add`), the
feeder's message of each 1,000-record batch, and the writer's Arrow record batch and Parquet file
(`to_record_batch`, `RecordFiles.write_batch`).

    .venv/bin/python -m bench.bench_hot_path                 # both halves, 20,000 pairs x 5
    .venv/bin/python -m bench.bench_hot_path --profile OUT   # cProfile of the loop, log on
    .venv/bin/python -m bench.bench_hot_path --no-sockets    # the in-memory half only, ~1 min
    .venv/bin/python -m bench.bench_hot_path --against DIR   # and another commit's Sluice, same run

``--against DIR`` runs a second Sluice from DIR, a checkout of another commit with its compiled
modules built (`bench/common/run_from.py` puts DIR first on its path), log off and on, each just
before this tree's: the change between two commits in one run, at one load. One way to make DIR:
``git worktree add /tmp/before REV && .venv/bin/pip wheel --no-deps -w /tmp/wheel /tmp/before &&
.venv/bin/python -m zipfile -e /tmp/wheel/sluice-*.whl /tmp/before-built`` (DIR=/tmp/before-built).

Writes bench/results/hot_path.json. Absolute figures depend on the machine and its load; compare
runs of the same day, and log off against log on within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.cpu import process_cpu_s, wait_quiet
from bench.common.results import write_json
from bench.common.setup import free_port
from protocol._wire import encode_uvarint
from protocol.apis import ApiKey
from proxy.config import load_config
from proxy.pumps.connection import ClientConnection
from proxy.pumps.services import Upstream
from proxy.pumps.upstreams import UpstreamTarget
from proxy.server import ProxyServer

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "hot_path.json"
CLIENT_ID = b"bench-producer"


class MemoryTransport:
    """The client socket: what Sluice writes is counted and dropped."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        self.written += len(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += len(part)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else None


class MemoryUpstream:
    """The broker socket: forwarded requests are counted and dropped."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, payload: bytes) -> None:
        self.written += len(payload)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


#: The Produce version of the pairs (``--produce-version``): 8, or 11 as a modern client sends it
#: (flexible, and a response the rewrite stage checks for KIP-951 leader endpoints).
PRODUCE_VERSION = 8


def produce_request(correlation_id: int) -> bytes:
    """A size-prefixed Produce request: one topic, one partition, a 200-byte record batch, acks=1."""
    records = b"\x00" * 200
    header = struct.pack(">hhih", ApiKey.PRODUCE, PRODUCE_VERSION, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    if PRODUCE_VERSION >= 9:  # flexible: header tags, compact lengths, tag sections
        body = (header + b"\x00"                                      # header tags
                + b"\x00" + struct.pack(">hi", 1, 30_000)              # transactional_id null, acks, timeout
                + b"\x02" + b"\x06bench"                               # topics[1]: name
                + b"\x02" + struct.pack(">i", 0)                       # partitions[1]: index 0
                + encode_uvarint(len(records) + 1) + records + b"\x00"  # records, partition tags
                + b"\x00" + b"\x00")                                   # topic tags, request tags
    else:
        body = (header + struct.pack(">h", -1)                        # transactional_id: null
                + struct.pack(">hi", 1, 30_000)                       # acks=1, timeout_ms
                + struct.pack(">i", 1) + struct.pack(">h", 5) + b"bench"   # topics[1]: name
                + struct.pack(">i", 1) + struct.pack(">i", 0)              # partitions[1]: index 0
                + struct.pack(">i", len(records)) + records)              # records
    return struct.pack(">i", len(body)) + body


def produce_response(correlation_id: int) -> bytes:
    """A Produce response payload (no size prefix): one partition, no error, throttle 0."""
    if PRODUCE_VERSION >= 9:
        return (struct.pack(">i", correlation_id) + b"\x00"                 # header tags
                + b"\x02" + b"\x06bench"                                    # responses[1]: name
                + b"\x02" + struct.pack(">ihqqq", 0, 0, 42, -1, 0)          # partition 0, base offset
                + b"\x01" + b"\x00" + b"\x00"                               # record_errors[], message, tags
                + b"\x00" + struct.pack(">i", 0) + b"\x00")                  # topic tags, throttle, tags
    return (struct.pack(">i", correlation_id)
            + struct.pack(">i", 1) + struct.pack(">h", 5) + b"bench"          # responses[1]: name
            + struct.pack(">i", 1) + struct.pack(">ihqqq", 0, 0, 42, -1, 0)  # partition 0, base offset
            + struct.pack(">i", 0) + struct.pack(">h", -1)                  # record_errors[], error_message
            + struct.pack(">i", 0))                                          # throttle_time_ms


def raw_pair(client: MemoryTransport, upstream: MemoryUpstream, request: bytes, response: bytes) -> None:
    """One pair through the raw forwarder's data path: each chunk written on as it came."""
    upstream.write(request)
    client.write(struct.pack(">i", len(response)))
    client.write(response)


def raw_pairs(pairs: list[tuple[bytes, bytes]]) -> Callable[[], None]:
    """`raw_pair` over `pairs`."""
    client, upstream = MemoryTransport(), MemoryUpstream()

    def run() -> None:
        for request, response in pairs:
            raw_pair(client, upstream, request, response)
    return run


async def sluice_connection(config: dict[str, Any]) -> tuple[ProxyServer, ClientConnection]:
    """A started `ProxyServer` and one of its connections, over an in-memory client transport and
    upstream: `data_received` takes a request, `on_upstream_frame` its response."""
    server = ProxyServer(load_config(None, overrides=config))
    await server.start()
    upstream = MemoryUpstream()

    async def connect(client: ClientConnection, target: UpstreamTarget) -> Upstream | str:
        return upstream

    assert server.services is not None
    server.services.connect_upstream = connect
    conn = ClientConnection(server.services, UpstreamTarget(None))
    conn.connection_made(MemoryTransport())  # type: ignore[arg-type]
    for _ in range(3):
        await asyncio.sleep(0)  # the upstream connects on the loop
    return server, conn


async def sluice_pairs(config: dict[str, Any],
                       pairs: list[tuple[bytes, bytes]]) -> tuple[ProxyServer, Callable[[], None]]:
    """A started `ProxyServer` and a function that sends `pairs` through one of its connections."""
    server, conn = await sluice_connection(config)

    def run() -> None:
        for request, response in pairs:
            conn.data_received(request)
            conn.on_upstream_frame(response)
    return server, run


def writer_cpu_s(server: ProxyServer) -> float:
    """CPU seconds of the access-log writer process so far (0 when there is none)."""
    writer = server.access_log
    pid = writer.writer_pid if writer is not None else None
    if not pid:
        return 0.0
    return process_cpu_s(pid, children=False)


async def wait_logged(server: ProxyServer, expected: int, timeout_s: float = 120.0) -> None:
    """Until the writer has written `expected` records (or the timeout)."""
    writer = server.access_log
    if writer is None:
        return
    deadline = time.monotonic() + timeout_s
    while writer.written + writer.dropped < expected and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)  # the counters live in shared memory written by another process


def python_calls(run: Callable[[], None]) -> int:
    """How many Python functions `run` calls (frames entered; calls of C functions not counted)."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls - 1  # run itself


def pair_config(mode: str, tmp: Path) -> dict[str, Any]:
    """The in-memory Sluice of `mode` (``log_off``, ``log_on``): a default client-id quota that never
    binds, and for ``log_on`` the access log, under `tmp`."""
    config: dict[str, Any] = {
        "upstream": {"bootstrap": "127.0.0.1:1"}, "listen": {"host": "127.0.0.1", "port": 0},
        "data_dir": str(tmp / mode),
        "quotas": {"entries": [{"client_id": "<default>", "producer_byte_rate": 10**12}]}}
    if mode == "log_on":
        config["access_log"] = {"dir": str(tmp / mode / "logs")}
    (tmp / mode).mkdir(parents=True, exist_ok=True)
    return config


async def measure(mode: str, pairs_n: int, repeats: int, tmp: Path, profile: Path | None) -> dict[str, Any]:
    pairs = [(produce_request(i % 2**31), produce_response(i % 2**31)) for i in range(pairs_n)]
    config = pair_config(mode, tmp)
    best_loop = best_process = best_writer = float("inf")
    if mode == "raw":
        run = raw_pairs(pairs)
        server = None
    else:
        server, run = await sluice_pairs(config, pairs)
    logged = 0
    try:
        for _ in range(repeats):
            w0 = writer_cpu_s(server) if server else 0.0
            t0, p0 = time.thread_time(), time.process_time()
            if profile is not None and mode == "log_on":
                prof = cProfile.Profile(time.thread_time)
                prof.runcall(run)
                prof.dump_stats(profile)
                profile = None
            else:
                run()
            loop_s, process_s = time.thread_time() - t0, time.process_time() - p0
            logged += pairs_n
            if server is not None:
                await wait_logged(server, logged)
            writer_s = (writer_cpu_s(server) - w0) if server else 0.0
            best_loop, best_process = min(best_loop, loop_s), min(best_process, process_s)
            best_writer = min(best_writer, writer_s)
            await asyncio.sleep(0)
        calls = python_calls(run) / pairs_n  # one more round, untimed, under a call counter
        logged += pairs_n
        if server is not None:
            await wait_logged(server, logged)
    finally:
        if server is not None:
            await server.drain(5.0)
    per = 1e6 / pairs_n
    return {"mode": mode, "pairs": pairs_n, "repeats": repeats,
            "python_calls_per_pair": round(calls, 1),
            "loop_us_per_pair": round(best_loop * per, 2),
            "process_us_per_pair": round(best_process * per, 2),
            "writer_us_per_pair": round(best_writer * per, 2) if mode == "log_on" else None}


# ----------------------------------------------------------------------------- over sockets

class CannedBroker(asyncio.Protocol):
    """Answers every Produce frame at once with `produce_response` (one write per read)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        while len(self.buffer) >= 4:
            (size,) = struct.unpack_from(">i", self.buffer)
            if len(self.buffer) < 4 + size:
                break
            (correlation_id,) = struct.unpack_from(">i", self.buffer, 8)
            del self.buffer[:4 + size]
            response = produce_response(correlation_id)
            out.append(struct.pack(">i", len(response)) + response)
        if out:
            self.transport.write(b"".join(out))  # type: ignore[attr-defined]


def serve_canned_broker(port: int) -> None:
    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(CannedBroker, "127.0.0.1", port)
        print("canned broker ready", file=sys.stderr, flush=True)
        await server.serve_forever()
    asyncio.run(serve())


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise SystemExit(f"port {port} never opened")


def client_pairs(port: int, n: int) -> float:
    """Send `n` Produce requests one at a time, each after the previous response; wall seconds."""
    requests = [produce_request(i) for i in range(n)]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")
        t0 = time.perf_counter()
        for request in requests:
            sock.sendall(request)
            (size,) = struct.unpack(">i", reader.read(4))
            reader.read(size)
        return time.perf_counter() - t0


class SocketBench:
    """A canned broker as a process and, one at a time, what runs in front of it: the raw forwarder
    or Sluice (log off, log on). Every process started is stopped on exit."""

    MODES = ("raw", "log_off", "log_on")

    def __init__(self, tmp: Path, pin_proxy: int | None = None) -> None:
        self.tmp = tmp
        self.python = sys.executable
        self.broker_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pin_proxy = pin_proxy  # the CPU the proxies run on (None: any); the rest run on the others

    def __enter__(self) -> SocketBench:
        broker = self._spawn([self.python, "-m", "bench.bench_hot_path", "--canned-broker",
                              str(self.broker_port), "--produce-version", str(PRODUCE_VERSION)])
        wait_port(self.broker_port, broker)
        return self

    def start(self, mode: str, sluice: list[str] | None = None,
              extra: dict[str, Any] | None = None) -> tuple[subprocess.Popen[bytes], int]:
        """The process of `mode`, listening and warmed up; `sluice` replaces `python -m proxy`, and
        `extra` is added to Sluice's configuration (`{"workers": 2}`; the raw forwarder takes its
        "workers" too)."""
        import yaml

        port = free_port()
        if mode == "raw":
            cmd = [self.python, "-m", "bench.common.raw_forwarder", "--listen", f"127.0.0.1:{port}",
                   "--upstream", f"127.0.0.1:{self.broker_port}",
                   "--workers", str((extra or {}).get("workers", 1))]
        else:
            config: dict[str, Any] = {
                "upstream": {"bootstrap": f"127.0.0.1:{self.broker_port}"},
                "listen": {"host": "127.0.0.1", "port": port}, "broker_port_base": free_port(),
                "data_dir": str(self.tmp / f"sockets-{mode}"),
                "quotas": {"entries": [{"client_id": "<default>", "producer_byte_rate": 10**12}]}}
            if mode == "log_on":
                config["access_log"] = {"dir": str(self.tmp / f"sockets-{mode}" / "logs")}
            config |= extra or {}
            path = self.tmp / f"{mode}.yaml"
            path.write_text(yaml.safe_dump(config))
            cmd = [*(sluice or [self.python, "-m", "proxy"]), "proxy", "--config", str(path)]
        proc = self._spawn(cmd, self.pin_proxy)
        wait_port(port, proc)
        for _ in range(8):  # warm-up: connections, sensors, each writer's first file; eight
            client_pairs(port, 125)  # connections, so that every worker has some (SO_REUSEPORT)
        wait_quiet(proc.pid)  # and the access-log writers' start-up, out of what is measured
        return proc, port

    def _spawn(self, cmd: list[str], cpu: int | None = None) -> subprocess.Popen[bytes]:
        # pinned: its threads and children too
        pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
        proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL, preexec_fn=pin)
        self.procs.append(proc)
        return proc

    def __exit__(self, *_: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)


def measure_sockets(pairs_n: int, repeats: int, tmp: Path, pin_proxy: int | None = None,
                    quota: bool = True, against: Path | None = None) -> list[dict[str, Any]]:
    """Raw forwarder, Sluice log off and Sluice log on, in front of one canned broker; with
    `pin_proxy`, the proxy on that CPU and the client and the canned broker on the others; without
    `quota`, Sluice has no quota configured; with `against` (another checkout), its Sluice too,
    log off and on, each run just before this tree's (rows ``against_log_off``, ``against_log_on``)."""
    rows: list[dict[str, Any]] = []
    everywhere = os.sched_getaffinity(0)
    if pin_proxy is not None:
        os.sched_setaffinity(0, everywhere - {pin_proxy})  # this process (the client) and the broker
    modes = [(m, None) for m in SocketBench.MODES]
    if against is not None:
        launcher = [sys.executable, str(REPO / "bench" / "common" / "run_from.py"), str(against)]
        modes = [("raw", None), ("log_off", launcher), ("log_off", None), ("log_on", launcher),
                 ("log_on", None)]
    with SocketBench(tmp, pin_proxy) as bench:
        for mode, sluice in modes:
            no_quota = None if quota else {"quotas": {"entries": []}}
            proc, port = bench.start(mode, sluice=sluice, extra=no_quota)
            if sluice is not None:
                mode = f"against_{mode}"
            best_cpu, best_wall = float("inf"), float("inf")
            for _ in range(repeats):
                c0 = process_cpu_s(proc.pid)
                wall = client_pairs(port, pairs_n)
                time.sleep(0.2)  # the feeder's 50 ms batches and the writer finish this round's records
                best_cpu, best_wall = min(best_cpu, process_cpu_s(proc.pid) - c0), min(best_wall, wall)
            rows.append({"mode": mode, "pairs": pairs_n, "repeats": repeats,
                         "cpu_us_per_pair": round(best_cpu * 1e6 / pairs_n, 1),
                         "wall_us_per_pair": round(best_wall * 1e6 / pairs_n, 1)})
            print(f"sockets {mode:16s} CPU {rows[-1]['cpu_us_per_pair']:6.1f} us/pair  "
                  f"round trip {rows[-1]['wall_us_per_pair']:6.1f} us", flush=True)
    os.sched_setaffinity(0, everywhere)
    raw = rows[0]["cpu_us_per_pair"]
    for row in rows:
        row["cpu_x_raw"] = round(row["cpu_us_per_pair"] / raw, 2) if raw else None
        row["pin_proxy"] = pin_proxy
        row["quota"] = quota
    return rows


def measure_writer_paths(n: int, repeats: int, tmp: Path) -> dict[str, float]:
    """CPU µs per record of the access log's paths over `n` of the benchmark's Produce pairs: the
    loop's capture (the request's partitions, then one row of the column batch from the entry and
    the broker's response), the feeder's message, and the writer process's Arrow record batch and
    Parquet file, in batches of 1,000 records."""
    from protocol.fastpath import read_request_header
    from proxy.flow.inflight import InFlight
    from proxy.flow.pipeline import ConnectionContext
    from proxy.ops.access_log_arrow import to_record_batch
    from proxy.ops.access_log_batch import LogBatch
    from proxy.ops.access_log_files import RecordFiles

    ctx = ConnectionContext(1, "127.0.0.1:50000", "bootstrap", 1)
    pairs = []
    for i in range(n):
        request, response = produce_request(i)[4:], produce_response(i)
        entry = InFlight(i, ApiKey.PRODUCE, PRODUCE_VERSION, CLIENT_ID.decode(), len(request), 1_000)
        entry.broker_response = response
        entry.upstream_response_bytes = entry.response_bytes = len(response)
        entry.response_received_ms = 1_001
        pairs.append((entry, read_request_header(request), request))
    per_batch = 1_000
    messages: list[bytes] = []

    def capture() -> None:
        batch = LogBatch()
        for k, (entry, header, request) in enumerate(pairs):
            entry.parts_walked = False
            entry.produce_parts(request, header)
            batch.add(ctx, entry, 1_767_225_600_000 + k, 1 << 20)
            if len(batch) == per_batch:
                batch = LogBatch()

    def message() -> None:
        messages.clear()
        batch = LogBatch()
        for k, (entry, _, _) in enumerate(pairs):
            batch.add(ctx, entry, 1_767_225_600_000 + k, 1 << 20)
            if len(batch) == per_batch:
                messages.append(batch.message())
                batch = LogBatch()

    def write() -> None:
        files = RecordFiles(Path(tempfile.mkdtemp(dir=tmp)), "bench", "parquet", 1 << 40, None, None)
        names: dict[bytes, str] = {}
        for data in messages:
            record_batch, _ = to_record_batch(LogBatch.from_message(data), "bench", None, names)
            files.write_batch(record_batch)
        files.close()

    def best_us(run: Callable[[], None]) -> float:
        best = float("inf")
        for _ in range(repeats):
            began = time.process_time()
            run()
            best = min(best, time.process_time() - began)
        return round(best / n * 1e6, 2)

    return {"loop_capture": best_us(capture), "loop_capture_and_message": best_us(message),
            "writer_arrow_and_parquet": best_us(write)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=Path, help="write a cProfile of one log-on round here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-sockets", action="store_true",
                        help="only the half with no sockets (and the writer's paths)")
    parser.add_argument("--pin-proxy", type=int, metavar="CPU",
                        help="over sockets, run the proxies on this CPU only and the client and the "
                             "canned broker on the others (does sharing a core with them cost the proxy?)")
    parser.add_argument("--no-quota", action="store_true",
                        help="over sockets, Sluice with no quota configured (default: a client-id "
                             "quota that never binds, so every request is recorded and checked)")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="over sockets, also run the Sluice of another checkout (DIR: its compiled "
                             "modules built), log off and on, each just before this tree's")
    parser.add_argument("--produce-version", type=int, choices=(8, 11), default=8,
                        help="the pairs' Produce version: 8, or 11 as a modern client sends (flexible; "
                             "its response passes the check for KIP-951 leader endpoints)")
    parser.add_argument("--canned-broker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global PRODUCE_VERSION
    PRODUCE_VERSION = args.produce_version
    if args.canned_broker:
        serve_canned_broker(args.canned_broker)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-hot-path-") as tmp:
        sockets_rows = [] if args.no_sockets else measure_sockets(args.pairs, args.repeats, Path(tmp),
                                                                   args.pin_proxy, not args.no_quota,
                                                                   args.against)
        writer_paths = measure_writer_paths(args.pairs, args.repeats, Path(tmp))
        print("writer paths, us/record: " + ", ".join(f"{k} {v:.2f}" for k, v in writer_paths.items()),
              flush=True)
        for mode in ("raw", "log_off", "log_on"):
            rows.append(asyncio.run(measure(mode, args.pairs, args.repeats, Path(tmp), args.profile)))
            r = rows[-1]
            writer = f"  writer {r['writer_us_per_pair']:7.2f}" if r["writer_us_per_pair"] is not None else ""
            print(f"no sockets {mode:8s} {r['python_calls_per_pair']:5.1f} Python calls/pair  "
                  f"loop {r['loop_us_per_pair']:7.2f} us/pair  "
                  f"process {r['process_us_per_pair']:7.2f}{writer}", flush=True)
    report = {"what": __doc__.split("\n")[0], "produce_version": PRODUCE_VERSION,
              "load_average": os.getloadavg(), "cpu_count": os.cpu_count(),
              "python": sys.version.split()[0], "sockets": sockets_rows, "no_sockets": rows,
              "writer_paths_us_per_record": writer_paths}
    print(f"results: {write_json(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
