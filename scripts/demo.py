"""`make demo`: a local Kafka, Sluice in front of it, traffic that shows throttling, and metrics.

1. starts Apache Kafka (KRaft, one node) from the Maven Central jars;
2. starts Sluice in front of it with a quota of 1 MiB/s for client-ids `flood` (Kafka's windowed
   rate) and `flood-tb` (the token bucket, `rate_model: token_bucket`, a burst of 1 s) and
   256 KiB/s for every other client-id, Prometheus metrics and access logs on;
3. runs three producers through Sluice for 20 s: `flood` and `flood-tb` (as fast as they can) and
   `steady` (a paced 200 KiB/s, under its quota), printing their rates every second: the windowed
   rate's sawtooth beside the token bucket's even rate;
4. prints what /metrics says about them, writes a plot, reads the access log, and asks the
   Spark job for quota recommendations from it (a dry run: nothing is applied).

Everything stops at the end. Output: .cache/demo/ (rates.png, sluice.yaml, logs/, plan/).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import urllib.request

from tests.conftest import create_topic
from tests.harness import load
from tests.harness.kafka import REPO, KafkaCluster, free_port, kafka_version
from tests.harness.sluice import SluiceProcess

KiB = 1024
MiB = 1024 * 1024
SECONDS = 20
OUT = REPO / ".cache" / "demo"


def say(text: str) -> None:
    print(text, flush=True)


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    say(f"== 1. Apache Kafka {kafka_version()} (KRaft, one node) from Maven Central jars")
    with KafkaCluster(OUT / "kafka", 1) as kafka:
        say(f"   broker up in {kafka.start_seconds:.1f}s at {kafka.bootstrap}")
        metrics_port = free_port()
        config = {
            "instance": "demo",
            "metrics": {"port": metrics_port},
            "access_log": {"dir": str(OUT / "logs")},
            "quotas": {"entries": [
                {"client_id": "flood", "producer_byte_rate": 1 * MiB},
                {"client_id": "flood-tb", "producer_byte_rate": 1 * MiB, "rate_model": "token_bucket",
                 "burst_ms": 1000},
                {"client_id": "<default>", "producer_byte_rate": 256 * KiB},
            ]},
        }
        say("== 2. Sluice in front of it: client-ids flood (windowed) and flood-tb (token bucket) 1 MiB/s, "
            "every other client-id 256 KiB/s")
        with SluiceProcess(kafka.bootstrap, OUT / "sluice", config=config) as sluice:
            say(f"   clients bootstrap from {sluice.bootstrap}; metrics on "
                f"http://127.0.0.1:{metrics_port}/metrics")
            topic = create_topic(sluice.bootstrap, "demo")
            timelines = run_producers(sluice.bootstrap, topic)
            show_metrics(metrics_port)
        plot(timelines)
    summarize_access_log()
    recommend()
    say(f"== done. Everything is under {OUT}")
    return 0


def run_producers(bootstrap: str, topic: str) -> dict[str, load.Timeline]:
    say(f"== 3. three producers for {SECONDS}s: 'flood' and 'flood-tb' as fast as they can, 'steady' at "
        f"200 KiB/s")
    timelines = {"flood": load.Timeline(), "flood-tb": load.Timeline(), "steady": load.Timeline()}
    threads = [
        threading.Thread(target=load.confluent_flood, args=(bootstrap, topic, SECONDS), kwargs={
            "client_id": "flood", "batch_bytes": 64 * KiB, "timeline": timelines["flood"]}),
        threading.Thread(target=load.confluent_flood, args=(bootstrap, topic, SECONDS), kwargs={
            "client_id": "flood-tb", "batch_bytes": 64 * KiB, "timeline": timelines["flood-tb"]}),
        threading.Thread(target=load.confluent_flood, args=(bootstrap, topic, SECONDS), kwargs={
            "client_id": "steady", "rate_bytes_per_s": 200 * KiB, "batch_bytes": 16 * KiB,
            "timeline": timelines["steady"]}),
    ]
    for t in threads:
        t.start()
    say("   second   flood KiB/s   flood-tb KiB/s   steady KiB/s")
    start = time.monotonic()
    for second in range(1, SECONDS + 1):
        time.sleep(max(0.0, start + second - time.monotonic()))
        rates = [timelines[name].rate(second - 1, second) / KiB for name in ("flood", "flood-tb", "steady")]
        say(f"   {second:6d}   {rates[0]:11.0f}   {rates[1]:14.0f}   {rates[2]:12.0f}")
    for t in threads:
        t.join(60)
    for name, tl in timelines.items():
        say(f"   {name:6s}: {tl.rate_from_first(SECONDS - 1) / KiB:7.0f} KiB/s over the run "
            f"({tl.total_bytes / MiB:.1f} MiB acknowledged)")
    say("   (Kafka's windowed rate lets a fresh client burst, then holds it to the quota on average, in a "
        "sawtooth;\n    the token bucket lets flood-tb burst one second's worth once, then holds it at the "
        "quota every second)")
    return timelines


def show_metrics(port: int) -> None:
    say("== 4. what Sluice's /metrics says")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    wanted = ("sluice_quota_limit", "sluice_quota_throttle_time_avg_ms", "sluice_quota_throttled_requests",
              "sluice_quota_produce_byte_rate")
    for line in text.splitlines():
        if line.startswith(wanted):
            say(f"   {line}")


def plot(timelines: dict[str, load.Timeline]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, avg) = plt.subplots(1, 2, figsize=(12, 4))
    xs = list(range(1, SECONDS + 1))
    for name, tl in timelines.items():
        ax.plot(xs, [tl.rate(s - 1, s) / KiB for s in xs], marker="o", label=name)
        avg.plot(xs, [tl.rate(0, s) / KiB for s in xs], marker="o", label=name)
    for axis in (ax, avg):
        axis.axhline(1024, linestyle="--", color="C0", alpha=0.5, label="flood, flood-tb quota (1 MiB/s)")
        axis.axhline(256, linestyle="--", color="C1", alpha=0.5, label="default quota (256 KiB/s)")
        axis.set_xlabel("second")
        axis.legend()
    ax.set_ylabel("acknowledged KiB/s, per second")
    ax.set_title("Per second: the windowed rate bursts again and again, the token bucket does not")
    avg.set_ylabel("acknowledged KiB/s, average since start")
    avg.set_title("Average since start converges to the quota")
    avg.set_yscale("log")
    fig.tight_layout()
    fig.savefig(OUT / "rates.png", dpi=100)
    say(f"   plot: {OUT / 'rates.png'}")


def summarize_access_log() -> None:
    import json

    records = [json.loads(line) for f in sorted((OUT / "logs").rglob("*.jsonl"))
               for line in f.read_text().splitlines() if line]
    produce = [r for r in records if r["api_name"] == "Produce"]
    say(f"== 5. access log: {len(records)} records under {OUT / 'logs'}")
    for client in ("flood", "flood-tb", "steady"):
        mine = [r for r in produce if r["client_id"] == client]
        throttled = [r for r in mine if r["throttle_time_ms"] > 0]
        say(f"   {client:6s}: {len(mine)} produce requests, {len(throttled)} throttled, "
            f"quota entity {mine[0]['quota_entity'] if mine else None}")


def recommend() -> None:
    say("== 6. Spark (local mode) recommends quotas from the access log (dry run)")
    done = subprocess.run([sys.executable, "-m", "proxy", "tune", "recommend", "--logs", str(OUT / "logs"),
                           "--out", str(OUT / "plan"), "--master", "local[2]"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        say(f"   the recommendation job failed:\n{done.stderr[-2000:]}")
        return
    say("\n".join(f"   {line}" for line in done.stdout.strip().splitlines()[-15:]))
    plan = OUT / "plan" / "plan.csv"
    if plan.exists():
        import csv

        with plan.open() as f:
            for row in csv.DictReader(f):
                say(f"   {row['entity']:18s} {row['quota_key']:19s} {float(row['current']):>11,.0f} -> "
                    f"{float(row['recommended']):>11,.0f} B/s  ({row['action']}: {row['reason']})")


if __name__ == "__main__":
    sys.exit(main())
