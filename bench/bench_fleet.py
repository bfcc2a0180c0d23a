"""Fleet benchmark (issue 11): one budget across Sluice instances and workers, against real Kafka.

In one run, with the baselines in the same run (one Kafka node started here, Sluice windows of
11 x 500 ms as in tests/integration/test_fleet.py, whose helpers this reuses):

* achieved / quota, librdkafka produce (one producer per instance, one client id) for one
  instance alone and three without `fleet:` (the baselines), 1, 2 and 3 instances with `fleet:`,
  one instance with `--workers 3` (no fleet section); Java consumer fetch (a group, one consumer
  per instance) for one instance alone and three with `fleet:` (full run only). Rates over whole
  throttle cycles after the first period (`Timeline.cycle_rate`).
* convergence after a demand shift (two of three producers stop) and after a SIGKILL of one
  instance: from the event until the remaining members' `sluice_fleet_share` (sampled every 200 ms)
  settles at its new value, and until the rate delivered over the next period reaches 0.9 x quota.
* the exchange's own cost per member with no traffic: reports and report bytes per second and
  process CPU, three fleet members next to three instances without fleet over the same interval.
* workers: Produce requests per proxy CPU-second per worker for --workers 1, 2, 3 (small
  produce requests through one instance; CPU from /proc of the worker processes).

    .venv/bin/python -m bench.bench_fleet [--quick] [--out bench/results/fleet.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common.cpu import own_cpu_s
from bench.common.results import commit, load_avg, pyplot
from bench.common.setup import (
    REPO,
    KafkaCluster,
    Metrics,
    SluiceProcess,
    create_topic,
    free_port,
    kafka_cluster,
    unique_name,
)
from tests.harness import load
from tests.harness.fleet import (
    Fleet,
    filled_topic,
    flood_through,
    group_rate,
    java_consumer_progress,
    start_fleet,
    total_rate,
)
from tests.harness.quotas import PERIOD_S, RUN_S, WINDOW, MiB
from tests.harness.wait import Sampler, wait_until

DEFAULT_OUT = REPO / "bench" / "results" / "fleet.json"
QUOTA = MiB
CLIENT = "fleet-app"
ENTRY = {"client_id": CLIENT, "producer_byte_rate": QUOTA, "consumer_byte_rate": QUOTA}


def plain_sluices(kafka: KafkaCluster, workdir: Path, n: int, workers: int | None = None) -> Fleet:
    members = []
    for _ in range(n):
        port = free_port()
        members.append((SluiceProcess(kafka.bootstrap, workdir / unique_name("plain"), workers=workers,
                                      config={"metrics": {"port": port},
                                              "quotas": {"window": WINDOW, "entries": [ENTRY]}}).start(),
            Metrics(port)))
    return Fleet(members)


def cycle_total(timelines: list[load.Timeline], start_s: float, end_s: float) -> tuple[float, str]:
    """`total_rate` over whole throttle cycles; a plain rate over the range when a loaded machine
    smears the sawtooth so that fewer than two cycles show (said in the results)."""
    try:
        return total_rate(timelines, start_s, end_s), "cycles"
    except AssertionError:
        return sum(t.rate(start_s, end_s) for t in timelines), "plain"


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.value(name, **labels) or 0.0


# ------------------------------------------------------------------------------------ budgets

def produce_case(kafka: KafkaCluster, fleet: Fleet, name: str, instances: int, producers: int,
                 run_s: float, with_fleet: bool, workers: int | None = None) -> dict[str, Any]:
    topic = create_topic(kafka.bootstrap, unique_name("fb"))
    load_before = load_avg()
    spread = Fleet([fleet.members[i % len(fleet.members)] for i in range(producers)])
    timelines = flood_through(spread, topic, PERIOD_S + run_s)
    total, method = cycle_total(timelines, PERIOD_S, PERIOD_S + run_s)
    return {"rate_method": method, "name": name, "client": "librdkafka", "workload": "produce",
            "instances": instances,
            "workers": workers, "fleet": with_fleet, "producers": producers,
            "rate_bytes_per_s": round(total), "ratio": round(total / QUOTA, 4),
            "error": round(abs(total / QUOTA - 1), 4),
            "load_avg": load_before}


def fetch_case(kafka: KafkaCluster, bootstraps: list[str], name: str, with_fleet: bool, run_s: float,
               workdir: Path) -> dict[str, Any]:
    n = len(bootstraps)
    nbytes = int(QUOTA * (PERIOD_S + run_s))
    topic = filled_topic(kafka, n, nbytes)
    load_before = load_avg()
    progress = java_consumer_progress(bootstraps, topic, nbytes // 1000, unique_name("bench-jg"),
                                      QUOTA // (8 * n), workdir / unique_name("jc"))
    total, _ = group_rate(progress, PERIOD_S)
    return {"name": name, "client": "java", "workload": "fetch", "instances": n, "workers": None,
            "fleet": with_fleet, "consumers": n, "rate_bytes_per_s": round(total),
            "ratio": round(total / QUOTA, 4), "error": round(abs(total / QUOTA - 1), 4),
            "load_avg": load_before}


# ------------------------------------------------------------------------------------ convergence

def share_row(fleet: Fleet, started: float) -> tuple[float, list[float | None]]:
    """Seconds since `started` and each member's `sluice_fleet_share` of the produce quota (None
    for a member without one, or killed)."""
    row: list[float | None] = []
    for i in range(len(fleet.members)):
        try:
            row.append(fleet.metrics(i).value("sluice_fleet_share", client_id=CLIENT,
                                              kind="producer_byte_rate"))
        except OSError:
            row.append(None)
    return time.monotonic() - started, row


def share_settle_s(rows: list[tuple[float, list[float | None]]], members: list[int], event_s: float,
                   tolerance: float = 0.05) -> tuple[float | None, float | None]:
    """Seconds from the event until the members' summed share stays within `tolerance` of its
    final value (the mean of the last second of samples); and that final value."""
    series = [(t, sum(r[i] or 0.0 for i in members)) for t, r in rows if t >= event_s]
    if not series:
        return None, None
    end = series[-1][0]
    tail = [v for t, v in series if t >= end - 1.0]
    final = sum(tail) / len(tail)
    settled = None
    for t, v in reversed(series):
        if abs(v - final) > tolerance:
            break
        settled = t
    return (None if settled is None else round(settled - event_s, 2)), round(final, 3)


def rate_reach_s(timelines: list[load.Timeline], event_s: float, end_s: float) -> float | None:
    """Seconds from the event until the rate delivered over the next period (one Kafka window,
    11 x 500 ms) by the remaining producers reaches 0.9 x quota."""
    t = event_s
    while t + PERIOD_S <= end_s:
        if sum(tl.rate(t, t + PERIOD_S) for tl in timelines) >= 0.9 * QUOTA:
            return round(t - event_s, 2)
        t += 0.25
    return None


def per_second(timelines: list[load.Timeline], end_s: float) -> list[float]:
    return [round(sum(tl.rate(s, s + 1) for tl in timelines) / QUOTA, 3) for s in range(int(end_s))]


def shift_case(kafka: KafkaCluster, workdir: Path, kill: bool, after_s: float) -> dict[str, Any]:
    fleet = start_fleet(kafka, workdir / unique_name("shift"), 3, [ENTRY])
    load_before = load_avg()
    try:
        topic = create_topic(kafka.bootstrap, unique_name("fs"))
        event_s = 3 * PERIOD_S
        stops = [threading.Event() for _ in range(3)]
        sampled_from = time.monotonic()
        with Sampler(lambda: share_row(fleet, sampled_from), interval_s=0.2) as sampler:
            t0 = time.monotonic()
            if kill:
                timers = [threading.Timer(event_s, lambda: fleet.sluices[2].signal(signal.SIGKILL))]
            else:
                timers = [threading.Timer(event_s, stops[i].set) for i in (1, 2)]
            for tm in timers:
                tm.start()
            timelines = flood_through(fleet, topic, event_s + after_s, stops)
        offset = t0 - sampled_from    # sampler time of the producers' start (~0)
        remaining = [0, 1] if kill else [0]
        ev = event_s + offset
        settle, final = share_settle_s(sampler.samples, remaining, ev)
        live = [timelines[i] for i in remaining]
        before, _ = cycle_total(live, PERIOD_S, event_s)
        after, method = cycle_total(live, event_s + 3, event_s + after_s)
        return {"event": "sigkill" if kill else "demand_shift", "event_s": event_s,
                "share_settle_s": settle, "final_share_sum": final,
                "rate_reach_0_9_s": rate_reach_s(live, event_s, event_s + after_s),
                "before_ratio": round(before / QUOTA, 3),
                "after_ratio": round(after / QUOTA, 3), "rate_method": method,
                "per_second_ratio": per_second(live, event_s + after_s),
                "shares": [[round(t - offset, 2), r] for t, r in sampler.samples], "load_avg": load_before}
    finally:
        fleet.stop()


# ------------------------------------------------------------------------------------ costs

def exchange_cost(kafka: KafkaCluster, workdir: Path, idle_s: float) -> dict[str, Any]:
    fleet = start_fleet(kafka, workdir / unique_name("idle"), 3, [ENTRY])
    plain = plain_sluices(kafka, workdir, 3)
    try:
        def snap() -> tuple[list[tuple[float, float]], list[float], list[float]]:
            reports = [(counter(fleet.metrics(i), "sluice_fleet_reports_sent_total"),
                        counter(fleet.metrics(i), "sluice_fleet_report_bytes_sent_total")) for i in range(3)]
            return (reports, [own_cpu_s(s.process.pid) for s in fleet.sluices if s.process],
                    [own_cpu_s(s.process.pid) for s in plain.sluices if s.process])
        time.sleep(2)   # past start-up work
        load_before = load_avg()
        r0, f0, p0 = snap()
        t0 = time.monotonic()
        time.sleep(idle_s)
        r1, f1, p1 = snap()
        span = time.monotonic() - t0
        members = [{"reports_per_s": round((b[0] - a[0]) / span, 2),
                    "report_bytes_per_s": round((b[1] - a[1]) / span, 1),
                    "cpu_fraction": round((c1 - c0) / span, 4)}
                   for a, b, c0, c1 in zip(r0, r1, f0, f1, strict=True)]
        return {"idle_s": round(span, 1), "members": members,
                "plain_cpu_fraction": [round((b - a) / span, 4) for a, b in zip(p0, p1, strict=True)],
                "load_avg": load_before}
    finally:
        fleet.stop()
        plain.stop()


def worker_cost(kafka: KafkaCluster, workdir: Path, workers: int, run_s: float) -> dict[str, Any]:
    fleet = plain_sluices(kafka, workdir, 1, workers=workers)
    sluice, metrics = fleet.members[0]
    try:
        if workers > 1:
            wait_until(lambda: len(sluice.worker_pids()) == workers, 60, f"{workers} workers")
        pids = list(sluice.worker_pids().values()) or [sluice.process.pid] if sluice.process else []
        topic = create_topic(kafka.bootstrap, unique_name("fw"))
        load_before = load_avg()
        req0 = counter(metrics, "sluice_requests_total", api="Produce")
        cpu0 = sum(own_cpu_s(p) for p in pids)
        threads = [threading.Thread(target=load.confluent_flood, args=(sluice.bootstrap, topic, run_s),
                                    kwargs={"client_id": f"small-{i}", "record_size": 100,
                                            "config": {"linger.ms": 0, "log_level": 2}, "batch_bytes": 1024})
                   for i in range(2 * workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(run_s + 60)
        cpu = sum(own_cpu_s(p) for p in pids) - cpu0
        requests = counter(metrics, "sluice_requests_total", api="Produce") - req0
        return {"workers": workers, "producers": 2 * workers, "requests": int(requests),
                "worker_cpu_s": round(cpu, 2), "requests_per_cpu_s": round(requests / max(cpu, 1e-9)),
                "requests_per_s": round(requests / run_s), "load_avg": load_before}
    finally:
        fleet.stop()


# ------------------------------------------------------------------------------------ the run

def run_benchmark(quick: bool, java: bool, workdir: Path, log: Callable[[str], None],
                  bootstrap: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    with kafka_cluster(workdir, bootstrap) as kafka:
        log(f"broker up: {kafka.bootstrap}; load {load_avg()}")
        return measure(kafka, quick, java, workdir, log, started)


def measure(kafka: KafkaCluster, quick: bool, java: bool, workdir: Path, log: Callable[[str], None],
            started: float) -> dict[str, Any]:
    run_s = 2 * PERIOD_S if quick else RUN_S
    cases: list[dict[str, Any]] = []
    plan: list[tuple[str, int, int, bool, int | None]] = [   # name, instances, producers, fleet, workers
        ("alone", 1, 1, False, None), ("fleet-2", 2, 2, True, None)] if quick else [
        ("alone", 1, 1, False, None), ("no-fleet-3", 3, 3, False, None), ("fleet-1", 1, 1, True, None),
        ("fleet-2", 2, 2, True, None), ("fleet-3", 3, 3, True, None), ("workers-3", 1, 3, False, 3)]
    shifts: list[dict[str, Any]] = []
    cost: dict[str, Any] = {}
    scaling: list[dict[str, Any]] = []

    def produce(name: str, n: int, producers: int, with_fleet: bool, workers: int | None) -> dict[str, Any]:
        fleet = (start_fleet(kafka, workdir / unique_name(name), n, [ENTRY]) if with_fleet
                 else plain_sluices(kafka, workdir, n, workers=workers))
        try:
            if workers:
                wait_until(lambda: fleet.metrics(0).value(
                    "sluice_fleet_members", worker="0") == workers, 60, "workers to hear from each other")
            case = produce_case(kafka, fleet, name, n, producers, run_s, with_fleet, workers)
        finally:
            fleet.stop()
        log(f"{name}: {case['ratio']:.3f} x quota (load {case['load_avg'][0]})")
        return case

    after_s = 3 + (PERIOD_S if quick else RUN_S)
    if quick:
        # The smoke run's budgets and shifts run side by side: each has its own Sluice instances (a
        # fleet its own id and topics) and no broker quota is set, so none shares a budget with
        # another; only their ratios move with the load, and the quick run judges none of them.
        # The exchange's idle cost and the workers' requests per CPU-second run beside them too:
        # their figures are then not the quiet machine's, which the full run measures.
        with ThreadPoolExecutor(len(plan) + 5) as pool:
            produced = [pool.submit(produce, *p) for p in plan]
            shifted = [pool.submit(shift_case, kafka, workdir, kill, after_s) for kill in (False, True)]
            costed = pool.submit(exchange_cost, kafka, workdir, 5)
            scaled = [pool.submit(worker_cost, kafka, workdir, w, 4) for w in (1, 2)]
            cases.extend(f.result() for f in produced)
            shifts = [f.result() for f in shifted]
            cost = costed.result()
            scaling = [f.result() for f in scaled]
    else:
        cases.extend(produce(*p) for p in plan)
    if java and not quick:
        for name, n, with_fleet in (("java-alone", 1, False), ("java-fleet-3", 3, True)):
            fleet = (start_fleet(kafka, workdir / unique_name(name), n, [ENTRY]) if with_fleet
                     else plain_sluices(kafka, workdir, n))
            try:
                cases.append(fetch_case(kafka, [s.bootstrap for s in fleet.sluices], name, with_fleet,
                                        run_s, workdir))
            except Exception as exc:   # report it, keep the rest of the run
                cases.append({"name": name, "client": "java", "workload": "fetch",
                              "error_text": repr(exc)})
            finally:
                fleet.stop()
            log(f"{name}: {cases[-1].get('ratio')}")
    if not quick:
        shifts = [shift_case(kafka, workdir, kill, after_s) for kill in (False, True)]
        cost = exchange_cost(kafka, workdir, 30)
        scaling = [worker_cost(kafka, workdir, w, 15) for w in (1, 2, 3)]
    for s in shifts:
        log(f"{s['event']}: shares settle {s['share_settle_s']} s, rate 0.9 x quota after "
            f"{s['rate_reach_0_9_s']} s")
    log(f"exchange: {cost['members']} vs plain cpu {cost['plain_cpu_fraction']}")
    for w in scaling:
        log(f"workers {w['workers']}: {w['requests_per_cpu_s']} requests per CPU-second")
    return {"benchmark": "fleet", "quick": quick, "java_fetch": java and not quick, "commit": commit(),
            "cpus": os.cpu_count(),
            "quota_bytes_per_s": QUOTA, "window": WINDOW, "run_s": run_s,
            "cases": cases, "convergence": shifts, "exchange": cost, "workers": scaling,
            "load_avg_after": load_avg(), "elapsed_s": round(time.monotonic() - started, 1)}


def table(report: dict[str, Any]) -> str:
    lines = [f"{'case':<14}{'client':<12}{'workload':<9}{'inst':>5}{'fleet':>7}{'achieved/Q':>12}"
             f"{'load1':>7}"]
    for c in report["cases"]:
        ratio = f"{c['ratio']:.3f}" if "ratio" in c else "error"
        lines.append(f"{c['name']:<14}{c['client']:<12}{c['workload']:<9}{c.get('instances', ''):>5}"
                     f"{c.get('fleet', '')!s:>7}{ratio:>12}{c.get('load_avg', ['-'])[0]!s:>7}")
    lines.extend(
f"{s['event']}: shares settle in {s['share_settle_s']} s (sum {s['final_share_sum']}); "
                     f"0.9 x quota over the next period after {s['rate_reach_0_9_s']} s; "
                     f"{s['before_ratio']} -> {s['after_ratio']} x quota (load {s['load_avg'][0]})"
        for s in report["convergence"])
    ex = report["exchange"]
    lines.append(f"exchange per member over {ex['idle_s']} s idle: "
                 + "; ".join(f"{m['reports_per_s']} reports/s, {m['report_bytes_per_s']} B/s, "
                             f"CPU {m['cpu_fraction'] * 100:.2f} %" for m in ex["members"])
                 + f"; without fleet CPU {', '.join(f'{c * 100:.2f} %' for c in ex['plain_cpu_fraction'])}")
    lines.extend(f"--workers {w['workers']}: {w['requests']} Produce requests, {w['worker_cpu_s']} "
                 f"worker CPU-s: {w['requests_per_cpu_s']} requests per CPU-second (load {w['load_avg'][0]})"
                 for w in report["workers"])
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    fig, (bars, shift) = plt.subplots(1, 2, figsize=(13, 4.5))
    done = [c for c in report["cases"] if "ratio" in c]
    bars.bar([f"{c['name']}\n{c['client']}" for c in done], [c["ratio"] for c in done],
             color=["tab:gray" if (not c["fleet"] and c["instances"] > 1) or c["name"].endswith("alone")
                    else "tab:blue" for c in done])
    bars.axhline(1.0, color="black", lw=0.8)
    bars.axhspan(0.95, 1.05, color="green", alpha=0.1)
    bars.set_ylabel("achieved / quota")
    bars.set_title("one budget: fleet (blue) vs baselines (gray)")
    bars.tick_params(axis="x", labelsize=7)
    s = report["convergence"][0]
    shift.plot(range(len(s["per_second_ratio"])), s["per_second_ratio"], label="remaining producer / quota")
    times = [t for t, _ in s["shares"]]
    for i in range(3):
        shift.plot(times, [r[i] if r[i] is not None else float("nan") for _, r in s["shares"]],
                   lw=0.8, label=f"share of member {i}")
    shift.axvline(s["event_s"], color="red", ls="--", label="two producers stop")
    shift.set_xlabel("seconds")
    shift.set_title("demand shift")
    shift.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fleet", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases and shorter windows (smoke run)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON")
    parser.add_argument("--no-java", action="store_true", help="skip the Java consumer-group fetch cases")
    parser.add_argument("--workdir", type=Path, help="where Kafka and Sluice keep their files")
    parser.add_argument("--bootstrap", help="use the Kafka cluster at HOST:PORT (unique topics) instead of "
                                            "starting one")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-fleet-"))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report = run_benchmark(args.quick, not args.no_java, workdir, log, args.bootstrap)
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
