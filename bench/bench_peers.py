"""Peer proxies benchmark (issue 29): the CPU a proxy spends per unit of Kafka traffic, for Sluice,
two established Kafka proxies and the raw Python forwarder, measured in one run.

One run starts one real Kafka 4.x node (the harness's, with the extra ``RAW`` listener of
``bench.bench_proxy.BenchCluster``) and, once each, for the whole run, these proxies in front of it:

* ``raw``: ``bench.common.raw_forwarder`` (uvloop, bytes in and bytes out: the Python floor),
  on the ``RAW`` listener, whose advertised address is the forwarder's own;
* ``kroxylicious``: Kroxylicious 0.12.0 (Java, Netty), port-per-node gateway, no filters;
* ``kafka-proxy``: grepplabs kafka-proxy v0.4.3 (Go), one bootstrap mapping, no auth or plugins;
* ``sluice``: ``python -m proxy proxy`` with its access log on and a quota for every client (the
  configuration issue 29 compares; started by ``bench.bench_proxy.start_environment``).

The peers are pure passthrough. They come from ``bench/peers/`` (``bench/peers/setup.sh`` builds them
into ``bench/peers/build/``, ``--peers-dir``). A peer that is not built, or that does not start, gets
its reason in its row and the run goes on without it. Every proxy must answer Metadata with its own
address (checked at start), so librdkafka stays behind it.

Workloads, each through every proxy:

* ``small``: one connection, a pipelined stream of small requests (a fixed number in flight),
  alternating ApiVersions v3 and a one-record Produce v8 (acks=1, 100 B value): proxy CPU µs per
  request;
* ``bulk``: one connection, pipelined Produce v8 requests (acks=1) of one record batch of 64 x 1 KiB
  records: proxy CPU ms per MiB of record values;
* ``librdkafka``: a confluent_kafka Producer (linger.ms 5, acks=1, 1 KiB values) producing M MiB,
  every record's delivery confirmed: proxy CPU ms per MiB of values. The producer is connected and
  has produced once before the measured span starts.

CPU is the proxy process's and its children's (Sluice's access-log writer), all threads, from
``/proc`` (``bench.common.cpu``), from a quiet proxy (``wait_quiet``) before the workload to a quiet
proxy after it, so that the access-log writer's and the JVM's deferred work (GC, JIT) of this
workload is counted and none of the previous one's. Before the rounds each proxy runs every workload
once at a fraction of its size (connections, Kroxylicious's JIT, Sluice's first records and writer
start-up). Then come the rounds (4 by default): in each, each workload runs through each proxy in
turn, and the order of the proxies rotates from round to round. Reported: the median over rounds of
each proxy's figure, and the median over rounds of its ratio to the raw forwarder *of the same
round*; the issue's goal is judged on Sluice's ratio (Sluice <= 1.5 x raw).

Results: ``bench/results/peers.json`` (``--quick``: ``peers-quick.json``) with every round's figures,
the medians and ratios, the load average at start and end, the commit and the machine; a PNG next to
it. The machine is unpinned: on a shared 2-vCPU box the CPU figures are far steadier than
throughput, but still noisy.

Run:  ``.venv/bin/python -m bench.bench_peers`` (4 rounds, ~15-20 min), or ``--quick`` (1 round
with small sizes, ~2 min; too little CPU per measurement to mean much).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from bench.bench_proxy import (
    ACCESS_LOG,
    QUOTA_BYTES_PER_S,
    QUOTA_ENTRIES,
    QUOTAS,
    SLUICE_FROM,
    Environment,
    advertised_brokers,
    api_versions_request,
    check_api_versions_response,
    check_produce_response,
    produce_request,
    record_batch,
    rotated,
    start_environment,
    stop_environment,
)
from bench.common.cpu import process_cpu_s, wait_quiet
from bench.common.results import RESULTS, git_describe, load_avg, machine, pyplot, save_chart, write_json
from bench.common.setup import REPO, create_topic, die_with_parent
from tests.harness.clients import produce_when_queued
from tests.harness.kafka import _ephemeral_range_start, kafka_version, stop_process
from tests.harness.topics import metadata_with_leaders

PROXIES: tuple[str, ...] = ("raw", "kroxylicious", "kafka-proxy", "sluice")
PEERS: tuple[str, ...] = ("kroxylicious", "kafka-proxy")
LABELS = {"raw": "raw uvloop forwarder (the Python floor)",
          "kroxylicious": "Kroxylicious 0.12.0 (Java, Netty)",
          "kafka-proxy": "grepplabs kafka-proxy v0.4.3 (Go)", "sluice": "Sluice"}
WORKLOADS: tuple[str, ...] = ("small", "bulk", "librdkafka")
UNITS = {"small": "CPU µs per small request", "bulk": "CPU ms per MB, bulk produce",
         "librdkafka": "CPU ms per MB, librdkafka"}
DEFAULT_OUT = RESULTS / "peers.json"
DEFAULT_PEERS_DIR = REPO / "bench" / "peers" / "build"
NOT_BUILT = "not built: run bench/peers/setup.sh"
TARGET_SLUICE_VS_RAW = 1.5
MIB = 2**20


@dataclass(frozen=True)
class Params:
    rounds: int
    small_requests: int      # per small run, ApiVersions and Produce alternating
    inflight: int            # requests in flight on the pipelined connection
    bulk_mb: int             # MiB of record values per bulk run
    bulk_records: int        # records per bulk Produce request (one batch)
    record_size: int         # bytes per bulk and librdkafka record value
    librdkafka_mb: int       # MiB of record values per librdkafka run: at about 0.4 ms of the raw
                             # forwarder's CPU per MiB, enough for a run to be ~0.2 CPU-s, not a
                             # few scheduler slices
    warmup_share: float      # warm-up: each workload once at this share of its size

    @classmethod
    def full(cls) -> Params:
        return cls(rounds=4, small_requests=40_000, inflight=16, bulk_mb=256, bulk_records=64,
                   record_size=1024, librdkafka_mb=512, warmup_share=0.5)

    @classmethod
    def quick(cls) -> Params:
        return cls(rounds=1, small_requests=6_000, inflight=16, bulk_mb=32, bulk_records=64,
                   record_size=1024, librdkafka_mb=16, warmup_share=0.34)


# --------------------------------------------------------------------------- peer processes


def _ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_block(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now, below the ephemeral range."""
    import random

    top = _ephemeral_range_start()
    for _ in range(1000):
        base = random.randrange(max(1024, top - 20_000), top - count)
        if _ports_free(base, count):
            return base
    raise RuntimeError(f"no {count} consecutive free ports")


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.25)  # a benchmark waiting for a JVM to bind, not a test's wait
    raise RuntimeError(f"not listening on {port} after {timeout_s:g} s")


class PeerProcess:
    """A peer's `start.sh` (it `exec`s the proxy: the child's pid is the proxy's), output to a file."""

    # Kroxylicious serves node N on LISTEN_PORT+1+N (node ids 0..5): 7 consecutive ports
    PORTS: ClassVar[dict[str, int]] = {"kroxylicious": 7, "kafka-proxy": 1}

    def __init__(self, name: str, peers_dir: Path, workdir: Path) -> None:
        self.name = name
        self.script = peers_dir / name / "start.sh"
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def built(self) -> bool:
        d = self.script.parent
        if self.name == "kroxylicious":
            return (self.script.is_file() and (d / "classes" / "peers" / "KroxyliciousMain.class").is_file()
                    and any((d / "lib").glob("kroxylicious-runtime-*.jar")))
        return self.script.is_file() and os.access(d / "kafka-proxy", os.X_OK)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, kafka_bootstrap: str) -> PeerProcess:
        self.port = free_port_block(self.PORTS[self.name])
        env = {**os.environ, "LISTEN_PORT": str(self.port), "KAFKA_BOOTSTRAP": kafka_bootstrap,
               "KAFKA_PROXY_ARGS": "--log-level=warning"}
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen([str(self.script)], cwd=self.script.parent, stdout=out,
                                            stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)
        try:
            wait_listening(self.port, self.process, timeout_s=90)
        except RuntimeError as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{self.name} did not start: {exc}\n{tail}") from None
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        stop_process(self.process.pid, timeout_s)
        self.process.wait(timeout=10)


def start_peers(env: Environment, peers_dir: Path, status: dict[str, str],
                log: Callable[[str], None]) -> None:
    """Start the built peers in front of the broker's PLAINTEXT listener, adding them to `env`."""
    kafka = env.cluster.bootstrap
    for name in PEERS:
        peer = PeerProcess(name, peers_dir, env.workdir)
        if not peer.built():
            status[name] = NOT_BUILT
            log(f"{name}: {NOT_BUILT} (no build under {peers_dir / name})")
            continue
        t0 = time.monotonic()
        try:
            peer.start(kafka)
            env.stop.append(peer.stop)
            seen = advertised_brokers(peer.address)
            if len(seen) != 1 or seen[0] == kafka or not seen[0].startswith("127.0.0.1:"):
                raise RuntimeError(f"{name} at {peer.address} advertises {seen}, not itself")
        except Exception as exc:
            status[name] = f"failed to start: {exc}".splitlines()[0]
            log(f"{name}: {status[name]}")
            peer.stop()
            continue
        env.addresses[name], env.proxy_pids[name] = peer.address, peer.pid
        status[name] = "ok"
        log(f"{name:>12}: bootstrap {peer.address} (pid {peer.pid}), up in {time.monotonic() - t0:.1f}s, "
            f"Metadata advertises {seen[0]}")


# --------------------------------------------------------------------------- workloads


def _read_exact(reader: Any, n: int) -> bytes:
    data = reader.read(n)
    if data is None or len(data) != n:
        raise ConnectionError("connection closed mid-response")
    return bytes(data)


def pipelined(address: str, frame: Callable[[int], bytes], check: Callable[[bytes, int], None],
              requests: int, inflight: int) -> float:
    """Send `requests` frames on one connection with up to `inflight` unanswered, checking each
    response (in order, by correlation id); the wall seconds."""
    host, _, port = address.rpartition(":")
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb", buffering=1 << 16)
        try:
            sent = 0
            for received in range(requests):
                while sent < requests and sent - received < inflight:
                    sock.sendall(frame(sent))
                    sent += 1
                size = struct.unpack(">i", _read_exact(reader, 4))[0]
                check(_read_exact(reader, size)[:64], received)
        finally:
            reader.close()
    return time.monotonic() - t0


def small_workload(address: str, topic: str, requests: int, inflight: int) -> dict[str, float]:
    batch = record_batch(b"x" * 100, int(time.time() * 1000))

    def frame(i: int) -> bytes:
        return api_versions_request(i) if i % 2 == 0 else produce_request(i, topic, batch)

    def check(payload: bytes, i: int) -> None:
        (check_api_versions_response if i % 2 == 0 else check_produce_response)(payload, i)

    wall = pipelined(address, frame, check, requests, inflight)
    return {"requests": float(requests), "wall_s": wall}


def bulk_workload(address: str, topic: str, mb: float, params: Params) -> dict[str, float]:
    batch = record_batch(b"b" * params.record_size, int(time.time() * 1000), params.bulk_records)
    per_request = params.bulk_records * params.record_size
    requests = max(1, round(mb * MIB / per_request))
    wall = pipelined(address, lambda i: produce_request(i, topic, batch), check_produce_response,
                     requests, params.inflight)
    return {"requests": float(requests), "mb": requests * per_request / MIB, "wall_s": wall}


def librdkafka_producer(address: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": address, "linger.ms": 5, "acks": 1, "enable.idempotence": False,
                     "client.id": "peers-bench", "queue.buffering.max.kbytes": 64 * 1024})


def librdkafka_workload(address: str, topic: str, mb: float,
                        params: Params) -> Callable[[], dict[str, float]]:
    """Connect a producer and produce once (outside the measured span); the returned function
    produces `mb` MiB and waits for every delivery report."""
    producer = librdkafka_producer(address)
    producer.list_topics(topic, timeout=30)
    producer.produce(topic, b"w" * params.record_size)
    if producer.flush(30) != 0:
        raise RuntimeError("librdkafka warm-up record not delivered")
    records = max(1, round(mb * MIB / params.record_size))
    value = b"l" * params.record_size

    def run() -> dict[str, float]:
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        t0 = time.monotonic()
        for _ in range(records):
            produce_when_queued(producer, topic, value, delivered, poll_s=0.05)
            producer.poll(0)
        left = producer.flush(120)
        wall = time.monotonic() - t0
        if left or errors:
            raise RuntimeError(f"librdkafka: {left} records undelivered, {len(errors)} errors: {errors[:3]}")
        return {"records": float(records), "mb": records * params.record_size / MIB, "wall_s": wall}

    return run


# --------------------------------------------------------------------------- measuring


def settle(pid: int, log: Callable[[str], None]) -> None:
    try:
        wait_quiet(pid)
    except TimeoutError as exc:
        log(f"warning: {exc}; measuring anyway")


def measure(pid: int, fn: Callable[[], dict[str, float]], log: Callable[[str], None]) -> dict[str, float]:
    """`fn`'s figures plus the proxy tree's CPU seconds, from a quiet proxy to a quiet proxy."""
    settle(pid, log)
    c0 = process_cpu_s(pid, children=True)
    result = fn()
    settle(pid, log)  # Sluice's access-log writer, the JVM's GC and JIT: this workload's work
    result["proxy_cpu_s"] = process_cpu_s(pid, children=True) - c0
    return result


def per_unit(workload: str, r: Mapping[str, float]) -> float:
    if workload == "small":
        return 1e6 * r["proxy_cpu_s"] / r["requests"]  # µs per request
    return 1e3 * r["proxy_cpu_s"] / r["mb"]  # ms per MiB


def run_workload(workload: str, address: str, topic: str, params: Params,
                 share: float = 1.0) -> Callable[[], dict[str, float]]:
    if workload == "small":
        n = max(2 * params.inflight, int(params.small_requests * share))
        return lambda: small_workload(address, topic, n, params.inflight)
    if workload == "bulk":
        return lambda: bulk_workload(address, topic, params.bulk_mb * share, params)
    return librdkafka_workload(address, topic, params.librdkafka_mb * share, params)


def run_benchmark(params: Params, peers_dir: Path, workloads: Sequence[str], workdir: Path,
                  log: Callable[[str], None]) -> dict[str, Any]:
    started = time.monotonic()
    load_before = load_avg()
    status: dict[str, str] = {}
    env = start_environment(workdir, ["direct", "sluice", "raw"], None, log)
    status |= {"raw": "ok", "sluice": "ok"}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {w: {} for w in workloads}
    try:
        start_peers(env, peers_dir, status, log)
        proxies = [p for p in PROXIES if status.get(p) == "ok"]
        direct = env.addresses["direct"]
        topic = create_topic(direct, "bench-peers", config={
            "retention.bytes": str(256 * MIB), "segment.bytes": str(64 * MIB)})
        metadata_with_leaders(direct, topic, 1)
        time.sleep(1.0)  # kafka-proxy does not rewrite leaders in Produce errors: no NOT_LEADER wanted
        log(f"topic {topic} has its leader; proxies {proxies}")

        for name in proxies:  # warm-up, outside the measured rounds
            t0 = time.monotonic()
            for w in workloads:
                run_workload(w, env.addresses[name], topic, params, params.warmup_share)()
            log(f"warm-up {name:>12}: {time.monotonic() - t0:.1f}s")

        for rnd in range(params.rounds):
            order = rotated(proxies, rnd)
            for w in workloads:
                for name in order:
                    pid = env.proxy_pids[name]
                    assert pid is not None
                    # no reference kept: a librdkafka producer goes when its run is done
                    r = measure(pid, run_workload(w, env.addresses[name], topic, params), log)
                    r["per_unit"] = per_unit(w, r)
                    runs[w].setdefault(name, []).append(r)
                    log(f"round {rnd + 1} {w:<10} {name:>12}: {r['per_unit']:8.2f} "
                        f"{'µs/request' if w == 'small' else 'ms/MB'}  (CPU {r['proxy_cpu_s']:.2f}s "
                        f"in {r['wall_s']:.1f}s wall)")
    finally:
        stop_environment(env)
    return summarize(params, status, runs, {
        "load_avg_before": load_before, "load_avg_after": load_avg(),
        "duration_s": round(time.monotonic() - started, 1)})


# --------------------------------------------------------------------------- summary


def summarize(params: Params, status: Mapping[str, str],
              runs: Mapping[str, Mapping[str, list[dict[str, float]]]],
              extra: Mapping[str, Any]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for w, by_proxy in runs.items():
        raw = by_proxy.get("raw", [])
        entry: dict[str, Any] = {"unit": UNITS[w], "median": {}, "ratio_to_raw_per_round": {},
                                 "ratio_to_raw_median": {}}
        for name, rs in by_proxy.items():
            entry["median"][name] = round(statistics.median(r["per_unit"] for r in rs), 3)
            if raw:
                ratios = [r["per_unit"] / b["per_unit"] for r, b in zip(rs, raw, strict=True)]
                entry["ratio_to_raw_per_round"][name] = [round(x, 3) for x in ratios]
                entry["ratio_to_raw_median"][name] = round(statistics.median(ratios), 3)
        entry["runs"] = by_proxy
        results[w] = entry
    targets = [{"name": f"{w} sluice/raw CPU", "value": v, "op": "<=", "threshold": TARGET_SLUICE_VS_RAW,
                "met": v <= TARGET_SLUICE_VS_RAW}
               for w in runs if (v := results[w]["ratio_to_raw_median"].get("sluice")) is not None]
    return {
        "benchmark": "peers",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sluice_commit": git_describe(),
        "machine": machine(),
        "kafka_version": kafka_version(),
        "params": asdict(params),
        "proxies": {p: {"label": LABELS[p], "status": status.get(p, "not run")} for p in PROXIES},
        "sluice_config": {"access_log": True, "quotas": QUOTA_ENTRIES},
        "started_per": "run (each proxy once, kept up for every round)",
        **extra,
        "results": results,
        "targets": targets,
    }


def format_table(report: Mapping[str, Any]) -> str:
    res = report["results"]
    workloads = [w for w in WORKLOADS if w in res]
    lines = [f"Peer proxies: proxy CPU per unit, medians of {report['params']['rounds']} round(s), "
             f"(x raw: median of per-round ratios); Kafka {report['kafka_version']}, "
             f"{report['machine']['cpu_count']} CPUs, load {report['load_avg_before'][0]:.1f} -> "
             f"{report['load_avg_after'][0]:.1f}; commit {report['sluice_commit']}", ""]
    lines.append("| | " + " | ".join(UNITS[w] for w in workloads) + " |")
    lines.append("|---|" + "---|" * len(workloads))
    for p in PROXIES:
        st = report["proxies"][p]["status"]
        if st != "ok":
            cells = [st] + [""] * (len(workloads) - 1)
        else:
            cells = []
            for w in workloads:
                v = res[w]["median"].get(p)
                ratio = res[w]["ratio_to_raw_median"].get(p)
                shown = "-" if v is None else f"{v:.1f}"
                cells.append(shown + (f" ({ratio:.2f}x raw)" if ratio and p != "raw" else ""))
        lines.append(f"| {LABELS[p]} | " + " | ".join(cells) + " |")
    if report["targets"]:
        lines += ["", f"issue 29 goal, Sluice <= {TARGET_SLUICE_VS_RAW} x raw CPU:"]
        lines += [f"  {'MET ' if t['met'] else 'MISS'} {t['name']}: {t['value']}" for t in report["targets"]]
    return "\n".join(lines)


def write_chart(report: Mapping[str, Any], path: Path) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    res = report["results"]
    workloads = [w for w in WORKLOADS if w in res and res[w]["median"]]
    if not workloads:
        return False
    colors = {"raw": "#55a868", "kroxylicious": "#4c72b0", "kafka-proxy": "#8172b2", "sluice": "#dd8452"}
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.4 * len(workloads), 3.8))
    axes = [axes] if len(workloads) == 1 else list(axes)
    for ax, w in zip(axes, workloads, strict=True):
        names = [p for p in PROXIES if p in res[w]["median"]]
        vals = [res[w]["median"][p] for p in names]
        bars = ax.bar(names, vals, color=[colors[p] for p in names])
        ratios = res[w]["ratio_to_raw_median"]
        ax.bar_label(bars, labels=[f"{v:.1f}\n{ratios[p]:.2f}x" if p in ratios else f"{v:.1f}"
                                   for p, v in zip(names, vals, strict=True)], fontsize=8)
        if "raw" in res[w]["median"]:
            ax.axhline(res[w]["median"]["raw"], color=colors["raw"], linestyle="--", linewidth=1,
                       label="raw forwarder")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_ylim(0, max(vals) * 1.3)
        ax.set_title(UNITS[w], fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"Proxy CPU per unit, x raw forwarder ({report['machine']['cpu_count']} CPUs, medians of "
                 f"{report['params']['rounds']} round(s), commit {report['sluice_commit']})", fontsize=10)
    return save_chart(plt, fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round, small sizes (~2 min smoke run)")
    parser.add_argument("--repeats", type=int, help="override the number of rounds [4; --quick: 1]")
    parser.add_argument("--out", type=Path,
                        help=f"results JSON [{DEFAULT_OUT.relative_to(REPO)}; --quick: peers-quick.json]")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG next to the JSON")
    parser.add_argument("--peers-dir", type=Path, default=DEFAULT_PEERS_DIR,
                        help=f"where the built peers are [{DEFAULT_PEERS_DIR.relative_to(REPO)}]")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="subset of small,bulk,librdkafka")
    parser.add_argument("--workdir", type=Path, help="broker data, proxy logs (default: a temp dir, removed)")
    parser.add_argument("--sluice-from", type=Path, metavar="DIR",
                        help="run the Sluice of DIR, a built checkout of another commit (as bench_proxy's "
                             "--sluice-from), to compare two commits beside the same peers")
    args = parser.parse_args(argv)

    params = Params.quick() if args.quick else Params.full()
    if args.repeats:
        params = Params(**(asdict(params) | {"rounds": args.repeats}))
    workloads = [w for w in WORKLOADS if w in args.workloads.split(",")]
    out: Path = args.out or (DEFAULT_OUT.with_name("peers-quick.json") if args.quick else DEFAULT_OUT)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # Sluice as issue 29 runs it: access log on, a quota for every client
    ACCESS_LOG["enabled"] = True
    QUOTAS["enabled"] = True
    QUOTAS["entries"] = QUOTA_ENTRIES
    SLUICE_FROM["dir"] = args.sluice_from.resolve() if args.sluice_from else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sluice-peers-"))
    log(f"workdir {workdir}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; peers {args.peers_dir}; "
        f"params {asdict(params)}")
    try:
        report = run_benchmark(params, args.peers_dir.resolve(), workloads, workdir, log)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report["quick"] = args.quick
    report["peers_dir"] = str(args.peers_dir)
    report["sluice_from"] = None if SLUICE_FROM["dir"] is None else str(SLUICE_FROM["dir"])
    report["access_log"] = dict(ACCESS_LOG)
    report["quotas"] = dict(QUOTAS)
    write_json(report, out)
    print(format_table(report))
    print(f"access log: {ACCESS_LOG.get('written')} records written, {ACCESS_LOG.get('dropped')} dropped; "
          f"quotas: default client-id quota of {QUOTA_BYTES_PER_S:.0e} B/s, {QUOTAS.get('sensors')} live "
          f"sensors, {QUOTAS.get('throttled_requests')} requests throttled")
    print(f"\nresults: {out}")
    if not args.no_chart and write_chart(report, out.with_suffix(".png")):
        print(f"chart:   {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
