"""Soak: many client connections through Sluice for a long time; its memory and descriptors stay flat.

    .venv/bin/python -m bench.bench_soak [--connections 1000] [--minutes 10] [--sample-s 5]

A one-node Kafka and Sluice (access log on, metrics on, a 32 KiB/s produce quota for client ids
`throttled-*`) start locally. Then `--connections` client connections through Sluice: librdkafka
producers (a quarter of them throttled) and consumers, each holding a bootstrap and a broker
connection, and the rest idle Kafka connections that send a Metadata request every 4 minutes and
nothing else (as a client's metadata refresh does: Sluice, like a broker, closes a connection idle
for `limits.idle_timeout_ms`, 10 minutes). All connections come from 127.0.0.1, so the soak raises
`limits.max_connections_per_ip` (1,000 by default, Kafka's `max.connections.per.ip`) to 5,000.
Every `--sample-s` Sluice's RSS, open file descriptors and `sluice_open_connections` are sampled.
At the end: RSS and fds after warm-up must stay within 10 % of their post-warm-up median. The
warm-up (`--warmup-s`) is by default a fifth of the run, but at least until every periodic part
of the load has happened once: the idle clients' first metadata refresh (at 4 minutes, all of
them within a few seconds) and a minute more for the throttled producers' request timeouts
(60 s) and reconnects. Before that the process has not yet seen its steady load. Sluice's log
must have no ERROR or traceback, and the access-log records written must equal the requests Sluice
counted. Not in CI. Writes bench/results/soak.json and bench/results/soak.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common.results import commit, pyplot

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def metric_sum(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def proc_sample(pid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))  # type: ignore[union-attr]
    return rss_kb * 1024, len(os.listdir(f"/proc/{pid}/fd"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=None,
                        help="seconds before RSS and fds are judged (default: see the module's docstring)")
    parser.add_argument("--producers", type=int, default=40, help="each holds 2 connections")
    parser.add_argument("--consumers", type=int, default=20, help="each holds 2-3 connections")
    args = parser.parse_args(argv)

    from confluent_kafka import Consumer, Producer

    from bench.common.setup import KafkaCluster, SluiceProcess, create_topic, free_port
    from tests.harness.rawclient import RawKafkaSocket, metadata_request

    work = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    cluster = KafkaCluster(work / "kafka", 1, quick_start=False).start()  # pushed for minutes
    metrics_port = free_port()
    config = {"metrics": {"port": metrics_port}, "access_log": {"dir": str(work / "access-log")},
              "quotas": {"entries": [{"client_id": "throttled", "producer_byte_rate": 32 * 1024}]},
              "limits": {"max_connections_per_ip": 5000},  # every client here is 127.0.0.1
              "log_level": "INFO"}
    sluice = SluiceProcess(cluster.bootstrap, work / "sluice", config=config).start()
    assert sluice.process is not None
    pid = sluice.process.pid
    stop = threading.Event()
    threads: list[threading.Thread] = []
    idle: list[Any] = []
    samples: list[dict[str, float]] = []
    produced = [0]
    consumed = [0]
    try:
        topic = create_topic(cluster.bootstrap, "soak", partitions=4)

        def produce(i: int) -> None:
            throttled = i % 4 == 0
            p = Producer({"bootstrap.servers": sluice.bootstrap, "linger.ms": 20,
                          "client.id": "throttled" if throttled else f"producer-{i}"})
            value = b"s" * 500

            def delivered(err: object, _msg: object) -> None:
                if err is None:
                    produced[0] += 1

            while not stop.is_set():
                with contextlib.suppress(BufferError):
                    p.produce(topic, value, on_delivery=delivered)
                p.poll(0.05 if throttled else 0.1)
            p.flush(30)

        def consume(i: int) -> None:
            c = Consumer({"bootstrap.servers": sluice.bootstrap, "group.id": f"soak-{i}",
                          "auto.offset.reset": "earliest", "client.id": f"consumer-{i}"})
            c.subscribe([topic])
            while not stop.is_set():
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    consumed[0] += 1
            c.close()

        threads += [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(args.producers)]
        threads += [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(args.consumers)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while metric_sum(scrape(metrics_port), "sluice_open_connections") < 2 * args.producers:
            assert time.monotonic() < deadline, "the clients did not connect"
            time.sleep(1)
        active = int(metric_sum(scrape(metrics_port), "sluice_open_connections"))
        refreshed: list[float] = []  # when each idle connection last sent its Metadata request
        for n in range(max(0, args.connections - active)):
            raw = RawKafkaSocket(sluice.bootstrap, timeout_s=30)
            raw.send(metadata_request())
            raw.recv_frame()
            idle.append(raw)
            refreshed.append(time.monotonic())
            if n % 100 == 99:
                print(f"{n + 1} idle connections open", flush=True)
        started = time.monotonic()
        end = started + args.minutes * 60
        while time.monotonic() < end:
            for i, raw in enumerate(idle):  # the metadata refresh of an otherwise idle client
                if time.monotonic() - refreshed[i] >= IDLE_REFRESH_S:
                    raw.send(metadata_request())
                    raw.recv_frame()
                    refreshed[i] = time.monotonic()
            rss, fds = proc_sample(pid)
            text = scrape(metrics_port)
            samples.append({"t_s": round(time.monotonic() - started, 1), "rss_bytes": rss, "fds": fds,
                            "connections": metric_sum(text, "sluice_open_connections"),
                            "requests": metric_sum(text, "sluice_requests_total")})
            print(f"{samples[-1]['t_s']:7.1f} s  rss {rss / 2**20:7.1f} MiB  fds {fds}  "
                  f"connections {samples[-1]['connections']:.0f}", flush=True)
            time.sleep(args.sample_s)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for raw in idle:
            raw.close()
    # every request Sluice counted ends up in the access log (it flushes every second)
    # (and stays so for 3 s: clients that were told to stop may still send a last request as they close)
    requests = written = 0.0
    settled: list[float] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = scrape(metrics_port)
        requests = metric_sum(text, "sluice_requests_total")
        written = metric_sum(text, "sluice_access_log_records_written_total")
        if requests == written and metric_sum(text, "sluice_access_log_queue_depth") == 0:
            settled.append(requests)
            if len(settled) >= 4 and len(set(settled[-4:])) == 1:
                break
        else:
            settled.clear()
        time.sleep(1)
    sluice.stop()  # closes the access-log files
    log_lines = _access_log_rows(work / "access-log")
    cluster.stop()
    errors = [ln for ln in sluice.log().splitlines() if " ERROR " in ln or "Traceback" in ln]

    warm_s = args.warmup_s if args.warmup_s is not None else max(args.minutes * 60 / 5, IDLE_REFRESH_S + 60)
    warm = [s for s in samples if s["t_s"] >= warm_s]
    old_rule = [s for s in samples if s["t_s"] >= args.minutes * 60 / 5]
    def spread(key: str, within: list[dict[str, float]] = warm) -> dict[str, float]:
        values = [s[key] for s in within]
        mid = statistics.median(values)
        return {"median": mid, "min": min(values), "max": max(values),
                "max_dev_pct": round(100 * max(abs(v - mid) for v in values) / mid, 2)}
    report = {
        "commit": commit(), "connections_target": args.connections, "minutes": args.minutes,
        "producers": args.producers,
        "consumers": args.consumers, "idle_connections": len(idle),
        "peak_open_connections": max(s["connections"] for s in samples),
        "warmup_s": warm_s, "rss": spread("rss_bytes"), "fds": spread("fds"),
        "rss_after_a_fifth": spread("rss_bytes", old_rule),  # the warm-up rule of earlier runs
        "requests_counted": requests, "access_log_records_written": written,
        "access_log_lines_on_disk": log_lines, "log_errors": errors[:20],
        "records_produced": produced[0], "records_consumed": consumed[0],
        "load_average_at_end": os.getloadavg(), "cpu_count": os.cpu_count(), "samples": samples,
    }
    report["flat_within_10pct"] = report["rss"]["max_dev_pct"] <= 10 and report["fds"]["max_dev_pct"] <= 10
    report["access_log_equals_requests"] = requests == written == log_lines
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(samples, warm_s, RESULTS / "soak.png")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    ok = report["flat_within_10pct"] and report["access_log_equals_requests"] and not errors
    return 0 if ok else 1


IDLE_REFRESH_S = 240.0  # under librdkafka's and Java's 5-minute metadata.max.age.ms


def _access_log_rows(root: Path) -> int:
    """Records on disk: JSON lines, or Parquet rows (the default format when pyarrow is installed)."""
    rows = sum(sum(1 for _ in f.open()) for f in root.rglob("*.jsonl"))
    parquet = list(root.rglob("*.parquet"))
    if parquet:
        import pyarrow.parquet as pq

        rows += sum(pq.read_metadata(f).num_rows for f in parquet)
    return rows


def _plot(samples: list[dict[str, float]], warm_s: float, out: Path) -> None:
    plt = pyplot()

    t = [s["t_s"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for ax, key, label, scale in ((axes[0], "rss_bytes", "RSS (MiB)", 2**20), (axes[1], "fds", "open fds", 1),
                                  (axes[2], "connections", "open connections", 1)):
        ax.plot(t, [s[key] / scale for s in samples])
        ax.axvline(warm_s, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[2].set_xlabel("seconds (dashed: end of warm-up)")
    fig.suptitle("Sluice soak: memory and descriptors over time")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
