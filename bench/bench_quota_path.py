"""The quota part of one request on the hot path: what it calls, what it costs, pure vs compiled stats.

A Produce costs the quota engine one verb (`QuotaEngine.produce`), a Fetch two
(`fetch_request`, `fetch_response`). Each verb asks its manager to record and decide
(`QuotaManager.record_and_check` / `admit_fetch`), which records into the sensor's windowed rate
(`SampledRate.record`, and under ``rate_model: token_bucket`` `TokenBucket.record`) and measures
it (`SampledRate.measure_parts`, `TokenBucket.measure`). `quotas.fastpath` picks the pure-Python
stats or their compiled twins (`quotas._speedups`); everything above the stats is the same code.

Three measures, each run on both implementations in alternating rounds in this one process (the
implementation is swapped by rebinding the manager's constructors before the engine is built):

* **profile**: a cProfile of the verbs under each implementation, per call of the verb, by function
  (own time): where the quota microseconds of one request go;
* **stats**: CPU per record + measure of the stats alone, the part that is compiled;
* **verbs**: CPU (`time.thread_time`) per verb call, best and median of ``--rounds`` rounds of
  ``--calls`` calls each, windowed and token bucket, a budget far from its limit (the common case:
  every request recorded and checked, none throttled);
* **hot path**: `bench_hot_path`'s no-socket Sluice (log off) with each implementation: loop CPU
  per Produce request+response pair, best of ``--rounds``.

    .venv/bin/python -m bench.bench_quota_path            # writes bench/results/quota_path.json

Absolute figures depend on the machine and its load (stated in the results); compare the two
implementations within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from bench import bench_hot_path
from protocol import fastpath as protocol_fastpath
from quotas import fastpath, manager, stats
from quotas.clock import FakeClock
from quotas.config import QuotaConfig
from quotas.engine import QuotaEngine
from quotas.entity import ClientIdentity

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "quota_path.json"
WHO = ClientIdentity("ANONYMOUS", "bench-client")
FAR = 10**12  # a bound no request comes near: recorded and checked, never throttled
IMPLS = ("pure", "compiled")


@contextmanager
def stats_impl(impl: str) -> Iterator[None]:
    """Managers built inside record into the pure or the compiled stats."""
    module = fastpath.COMPILED_MODULE
    if impl == "compiled" and module is None:
        raise SystemExit("quotas._speedups is not built: run `pip install -e .` with a C compiler present")
    rate, bucket = ((stats.SampledRate, stats.TokenBucket) if impl == "pure"
                    else (module.SampledRate, module.TokenBucket))  # type: ignore[union-attr]
    with (mock.patch.object(manager, "SampledRateImpl", rate),
          mock.patch.object(manager, "TokenBucketImpl", bucket)):
        yield


def engine(model: str) -> tuple[QuotaEngine, FakeClock]:
    config = QuotaConfig.from_dict({"rate_model": model, "entries": [
        {"client_id": "<default>", "producer_byte_rate": FAR, "consumer_byte_rate": FAR}]})
    clock = FakeClock(1_000_000)
    return QuotaEngine(config, clock), clock


def verb_calls(verb: str, model: str, calls: int) -> Callable[[], None]:
    """`calls` calls of one verb on a fresh engine (the clock moves 1 ms every 8 calls)."""
    quotas, clock = engine(model)

    def produce() -> None:
        for i in range(calls):
            if not i & 7:
                clock.advance(1)
            quotas.produce(None, WHO, 1_000, None)

    def fetch() -> None:
        for i in range(calls):
            if not i & 7:
                clock.advance(1)
            quotas.fetch_request(None, WHO)
            quotas.fetch_response(None, WHO, 10_000, None, 0)

    run = produce if verb == "produce" else fetch
    run()  # warm: the sensors exist, the ring is full
    return run


def timed(run: Callable[[], None]) -> float:
    began = time.thread_time()
    run()
    return time.thread_time() - began


def measure_verbs(calls: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for model in ("windowed", "token_bucket"):
        for verb in ("produce", "fetch"):
            samples: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            runs = {}
            for impl in IMPLS:
                with stats_impl(impl):
                    runs[impl] = verb_calls(verb, model, calls)
            for _ in range(rounds):
                for impl in IMPLS:  # alternating: both see the same load
                    samples[impl].append(timed(runs[impl]) / calls * 1e6)
            row: dict[str, Any] = {"model": model, "verb": verb, "calls": calls, "rounds": rounds}
            for impl in IMPLS:
                row[f"{impl}_best_us"] = round(min(samples[impl]), 3)
                row[f"{impl}_median_us"] = round(statistics.median(samples[impl]), 3)
            row["saved_best_us"] = round(row["pure_best_us"] - row["compiled_best_us"], 3)
            rows.append(row)
            print(f"verbs {model:12s} {verb:8s} pure {row['pure_best_us']:6.3f} us  compiled "
                  f"{row['compiled_best_us']:6.3f} us  (medians {row['pure_median_us']:.3f} / "
                  f"{row['compiled_median_us']:.3f})", flush=True)
    return rows


def measure_stats(calls: int, rounds: int) -> list[dict[str, Any]]:
    """The stats alone, per request's worth: one record and one measure (what a verb asks of them)."""
    module = fastpath.COMPILED_MODULE
    if module is None:
        raise SystemExit("quotas._speedups is not built: run `pip install -e .` with a C compiler present")
    classes = {"pure": (stats.SampledRate, stats.TokenBucket),
               "compiled": (module.SampledRate, module.TokenBucket)}

    def windowed(cls: Any) -> Callable[[], None]:
        rate = cls(stats.RateConfig())

        def run() -> None:
            for i in range(calls):
                now = 1_000_000 + (i >> 3)
                rate.record(1_000.0, now)
                rate.measure_parts(now)
        return run

    def bucket(cls: Any) -> Callable[[], None]:
        tokens = cls()

        def run() -> None:
            for i in range(calls):
                now = 1_000_000 + (i >> 3)
                tokens.record(1_000.0, 1e12, 1.1e13, now)
                tokens.measure(1e12, 1.1e13, now)
        return run

    rows = []
    for stat, build in (("SampledRate record+measure_parts", windowed),
                        ("TokenBucket record+measure", bucket)):
        runs = {impl: build(classes[impl][0 if build is windowed else 1]) for impl in IMPLS}
        samples: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        for impl in IMPLS:
            runs[impl]()  # warm
        for _ in range(rounds):
            for impl in IMPLS:
                samples[impl].append(timed(runs[impl]) / calls * 1e6)
        row: dict[str, Any] = {"stat": stat, "calls": calls, "rounds": rounds}
        for impl in IMPLS:
            row[f"{impl}_best_us"] = round(min(samples[impl]), 3)
            row[f"{impl}_median_us"] = round(statistics.median(samples[impl]), 3)
        rows.append(row)
        print(f"stats {stat:34s} pure {row['pure_best_us']:6.3f} us  "
              f"compiled {row['compiled_best_us']:6.3f} us  "
              f"(medians {row['pure_median_us']:.3f} / {row['compiled_median_us']:.3f})", flush=True)
    return rows


def profile_verbs(calls: int) -> dict[str, dict[str, Any]]:
    """Own time per verb call by function, for the windowed produce and fetch, on each stats."""
    out: dict[str, dict[str, Any]] = {}
    for impl in IMPLS:
        for verb in ("produce", "fetch"):
            with stats_impl(impl):
                run = verb_calls(verb, "windowed", calls)
            prof = cProfile.Profile(time.thread_time)
            prof.runcall(run)
            st = pstats.Stats(prof)
            rows = []
            for (path, _line, func), (_cc, ncalls, tottime, _cum, _callers) in st.stats.items():  # type: ignore[attr-defined]
                where = Path(path).name if path != "~" else "builtin"
                rows.append({"function": f"{where}:{func}", "calls_per_verb": round(ncalls / calls, 2),
                             "own_us_per_verb": round(tottime / calls * 1e6, 3)})
            rows.sort(key=lambda r: -r["own_us_per_verb"])
            total = sum(r["own_us_per_verb"] for r in rows)
            out[f"{impl}/{verb}"] = {"profiled_us_per_verb": round(total, 3), "top": rows[:14]}
            print(f"profile {impl:8s} {verb:8s} {total:6.2f} us per verb under cProfile", flush=True)
            for r in rows[:8]:
                print(f"    {r['own_us_per_verb']:6.3f} us  x{r['calls_per_verb']:<5}  {r['function']}")
    return out


def measure_hot_path(pairs: int, rounds: int) -> list[dict[str, Any]]:
    """bench_hot_path's no-socket Sluice, log off, on each stats: loop CPU per pair."""
    best: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    with tempfile.TemporaryDirectory(prefix="sluice-quota-path-") as tmp:
        for r in range(rounds):
            for impl in IMPLS:
                with stats_impl(impl):
                    row = asyncio.run(bench_hot_path.measure("log_off", pairs, 3, Path(tmp) / f"{impl}{r}",
                                                             None))
                best[impl].append(row["loop_us_per_pair"])
    rows = [{"impl": impl, "pairs": pairs, "rounds": rounds, "loop_us_per_pair_best": min(best[impl]),
             "loop_us_per_pair_median": statistics.median(best[impl]), "per_round": best[impl]}
            for impl in IMPLS]
    for row in rows:
        print(f"hot path (no sockets, log off) {row['impl']:8s} loop best {row['loop_us_per_pair_best']:.2f} "
              f"us/pair, median {row['loop_us_per_pair_median']:.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    profile = profile_verbs(args.calls // 5)
    stat_rows = measure_stats(args.calls, args.rounds)
    verbs = measure_verbs(args.calls, args.rounds)
    hot = measure_hot_path(args.pairs, args.rounds)
    report = {"what": __doc__.split("\n")[0], "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "cpu_count": os.cpu_count(),
              "python": sys.version.split()[0], "protocol_path": protocol_fastpath.IMPLEMENTATION,
              "profile": profile, "stats": stat_rows, "verbs": verbs, "hot_path_no_sockets": hot}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average before {load_before}, after {report['load_average_after']}; results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
