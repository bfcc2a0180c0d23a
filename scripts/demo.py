"""`make demo`: a local Kafka, Sluice in front of it, traffic that shows throttling, and metrics.

1. starts Apache Kafka (KRaft, one node) from the Maven Central jars;
2. starts Sluice in front of it with a quota of 1 MiB/s for client-ids `flood` (Kafka's windowed
   rate) and `flood-tb` (the token bucket, `rate_model: token_bucket`, a burst of 1 s) and
   256 KiB/s for every other client-id, Prometheus metrics and access logs on;
3. runs three producers through Sluice for 20 s: `flood` and `flood-tb` (as fast as they can) and
   `steady` (a paced 200 KiB/s, under its quota), printing their rates every second: the windowed
   rate's sawtooth beside the token bucket's even rate;
   halfway, asks the running proxy what each client has left (`sluice quotas describe --usage`)
   and who is connected (`sluice connections`, with its bearer token);
4. prints what /metrics says about them, writes a plot; then opens fifteen connections at once
   from 127.0.0.2, which may open 1 per second (`connection_creation_rate`, KIP-612): Kafka's
   windowed rate lets about ten through (one 11 s window's worth), the rest are held unanswered
   and closed, while 127.0.0.1 is not affected;
5. runs a fleet: two more Sluice instances sharing one 1 MiB/s budget for client-id `shared`
   (`fleet:`), one producer through each, printing their rates and each instance's share;
6. reads the access log and asks the Spark job for quota recommendations from it (a dry run:
   nothing is applied);
7. replays the recorded traffic through that plan (`sluice tune simulate`): per entity who it
   would throttle, how often and for how long, against the quotas in force, with a plot each.

Everything stops at the end. Output: .cache/demo/ (rates.png, sluice.yaml, logs/, plan/, with
plan/simulation.json and plan/simulation/*.png).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

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
            "connections_endpoint": {"enabled": True, "token_env": "SLUICE_CONNECTIONS_TOKEN"},
            "quotas": {"entries": [
                {"ip": "127.0.0.2", "connection_creation_rate": 1},
                {"client_id": "flood", "producer_byte_rate": 1 * MiB},
                {"client_id": "flood-tb", "producer_byte_rate": 1 * MiB, "rate_model": "token_bucket",
                 "burst_ms": 1000},
                {"client_id": "<default>", "producer_byte_rate": 256 * KiB},
            ]},
        }
        say("== 2. Sluice in front of it: client-ids flood (windowed) and flood-tb (token bucket) 1 MiB/s, "
            "every other client-id 256 KiB/s")
        token = secrets.token_urlsafe(16)
        with SluiceProcess(kafka.bootstrap, OUT / "sluice", config=config,
                           env={"SLUICE_CONNECTIONS_TOKEN": token}) as sluice:
            say(f"   clients bootstrap from {sluice.bootstrap}; metrics on "
                f"http://127.0.0.1:{metrics_port}/metrics")
            topic = create_topic(sluice.bootstrap, "demo")
            timelines = run_producers(sluice.bootstrap, topic, lambda: show_live(metrics_port, token))
            show_metrics(metrics_port)
            show_connection_rate(sluice.bootstrap, metrics_port)
        plot(timelines)
        run_fleet(kafka)
    summarize_access_log()
    recommend()
    simulate()
    say(f"== done. Everything is under {OUT}")
    return 0


def run_producers(bootstrap: str, topic: str, halfway: Callable[[], None]) -> dict[str, load.Timeline]:
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
        if second == SECONDS // 2:
            halfway()
    for t in threads:
        t.join(60)
    for name, tl in timelines.items():
        say(f"   {name:6s}: {tl.rate_from_first(SECONDS - 1) / KiB:7.0f} KiB/s over the run "
            f"({tl.total_bytes / MiB:.1f} MiB acknowledged)")
    say("   (Kafka's windowed rate lets a fresh client burst, then holds it to the quota on average, in a "
        "sawtooth;\n    the token bucket lets flood-tb burst one second's worth once, then holds it at the "
        "quota every second)")
    return timelines


def sluice_cli(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The `sluice` command as an operator runs it; its output lines."""
    done = subprocess.run([sys.executable, "-m", "proxy", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **(env or {})})
    return (done.stdout or done.stderr).splitlines()


def show_live(metrics_port: int, token: str) -> None:
    url = f"http://127.0.0.1:{metrics_port}"
    say("   -- halfway: what each producer has left, from the running proxy "
        f"(sluice quotas describe --usage --url {url}):")
    for line in sluice_cli("quotas", "describe", "--usage", "--url", url):
        if line.startswith(("BROKER", "#")) or " flood" in line or " steady" in line:
            say(f"      {line}")
    say("   -- and who is connected (sluice connections, bearer token from SLUICE_CONNECTIONS_TOKEN):")
    for line in sluice_cli("connections", "--url", url, "--sort", "produce", "--reverse",
                           env={"SLUICE_CONNECTIONS_TOKEN": token})[:8]:
        say(f"      {line}")


def _answered(bootstrap: str, source_ip: str) -> bool:
    """Connect from `source_ip`, send ApiVersions v0: is it answered within a second?"""
    host, port = bootstrap.rsplit(":", 1)
    client_id = b"demo-ip"
    request = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id  # ApiVersions v0, correlation 1
    try:
        with socket.create_connection((host, int(port)), timeout=1, source_address=(source_ip, 0)) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            return len(sock.recv(4)) == 4
    except OSError:  # held past the timeout, or closed
        return False


def show_connection_rate(bootstrap: str, metrics_port: int) -> None:
    say("== 4b. 127.0.0.2 may open 1 connection per second (KIP-612's connection_creation_rate per IP): "
        "fifteen at once")
    answered = [_answered(bootstrap, "127.0.0.2") for _ in range(15)]
    say("   " + " ".join("answered" if a else "held" for a in answered))
    hits = _metric(metrics_port, "sluice_limit_hits_total", 'cause="connection_creation_rate"') or 0.0
    say(f"   sluice_limit_hits_total{{cause=\"connection_creation_rate\"}} {hits:.0f}; "
        f"127.0.0.1 still answered: {_answered(bootstrap, '127.0.0.1')}")


FLEET_SECONDS = 26   # two throttle cycles of Kafka's default 11 s window, and some


def run_fleet(kafka: KafkaCluster) -> None:
    """Two instances, one budget: a producer through each, 1 MiB/s for the two together."""
    say("== 5. a fleet: two more Sluice instances with `fleet: {id: demo-fleet}` share one 1 MiB/s budget "
        "for client-id 'shared'")
    instances: list[tuple[SluiceProcess, int]] = []
    try:
        for i in range(2):
            port = free_port()
            config = {"instance": f"demo-fleet-{i}", "metrics": {"port": port},
                      "store": {"type": "kafka", "topic": "_sluice_demo_quotas"},
                      "fleet": {"id": "demo-fleet", "topic": "_sluice_demo_fleet"},
                      "quotas": {"entries": [{"client_id": "shared", "producer_byte_rate": 1 * MiB}]}}
            sluice = SluiceProcess(kafka.bootstrap, OUT / f"fleet-{i}", config=config).start()
            instances.append((sluice, port))
        deadline = time.monotonic() + 30
        while not all(_metric(port, "sluice_fleet_members") == 2 for _, port in instances):
            if time.monotonic() > deadline:
                say("   (the instances did not find each other within 30 s)")
                return
            time.sleep(0.2)
        topic = create_topic(kafka.bootstrap, "demo-fleet")
        timelines = [load.Timeline(), load.Timeline()]
        threads = [threading.Thread(target=load.confluent_flood, args=(s.bootstrap, topic, FLEET_SECONDS),
                                    kwargs={"client_id": "shared", "batch_bytes": 64 * KiB, "timeline": tl})
                   for (s, _), tl in zip(instances, timelines, strict=True)]
        for th in threads:
            th.start()
        say("   second   via instance 0 KiB/s   via instance 1 KiB/s   together   shares")
        start = time.monotonic()
        for second in range(1, FLEET_SECONDS + 1):
            time.sleep(max(0.0, start + second - time.monotonic()))
            rates = [tl.rate(second - 1, second) / KiB for tl in timelines]
            shares = [_metric(port, "sluice_fleet_share", 'client_id="shared"') for _, port in instances]
            shown = " / ".join("-" if s is None else f"{s:.2f}" for s in shares)
            say(f"   {second:6d}   {rates[0]:20.0f}   {rates[1]:20.0f}   {sum(rates):8.0f}   {shown}")
        for th in threads:
            th.join(60)
        try:
            together = sum(tl.cycle_rate(0, FLEET_SECONDS, bin_s=1.0) for tl in timelines)
            over = "over whole throttle cycles"
        except AssertionError:  # fewer than two cycles seen (a slow machine): the plain rate
            together = sum(tl.rate(0, FLEET_SECONDS) for tl in timelines)
            over = f"over {FLEET_SECONDS} s, the first burst included"
        say(f"   together: {together / MiB:.2f} MiB/s {over}, for one 1 MiB/s budget;\n"
            "   without `fleet:` each instance would admit its own 1 MiB/s")
    finally:
        for sluice, _ in instances:
            sluice.stop()


def _metric(port: int, name: str, label: str = "") -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return None


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

    import pyarrow.parquet as pq

    records = [json.loads(line) for f in sorted((OUT / "logs").rglob("*.jsonl"))
               for line in f.read_text().splitlines() if line]
    for f in sorted((OUT / "logs").rglob("*.parquet")):   # the default format
        records += pq.read_table(f).to_pylist()
    produce = [r for r in records if r["api_name"] == "Produce"]
    say(f"== 6. access log: {len(records)} records under {OUT / 'logs'}")
    for client in ("flood", "flood-tb", "steady"):
        mine = [r for r in produce if r["client_id"] == client]
        throttled = [r for r in mine if r["throttle_time_ms"] > 0]
        say(f"   {client:6s}: {len(mine)} produce requests, {len(throttled)} throttled, "
            f"quota entity {mine[0]['quota_entity'] if mine else None}")


def recommend() -> None:
    say("== 7. Spark (local mode) recommends quotas from the access log (dry run)")
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



def simulate() -> None:
    plan = OUT / "plan" / "plan.json"
    if not plan.exists():
        return
    say("== 8. What would that plan do? The recorded traffic replayed through it (tune simulate)")
    done = subprocess.run([sys.executable, "-m", "proxy", "tune", "simulate", "--logs", str(OUT / "logs"),
                           "--plan", str(plan), "--master", "local[2]", "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        say(f"   the simulation failed:\n{done.stderr[-2000:]}")
        return
    say("\n".join(f"   {line}" for line in done.stdout.strip().splitlines()))
    say("   (active seconds are those with a request or a mute, so throttled seconds never exceed them; a\n"
        "   second admitted far above the quota under the windowed rate is Kafka's window: once a burst's\n"
        "   samples are older than samples x size, a client with a backlog is admitted up to\n"
        "   (samples - 1) x size of quota at once, and over the whole run it gets the quota)")
    for png in sorted((OUT / "plan" / "simulation").glob("*.png")):
        say(f"   plot: {png}")


if __name__ == "__main__":
    sys.exit(main())
