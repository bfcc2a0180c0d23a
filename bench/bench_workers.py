"""Does a second worker process cost CPU per request? `sluice proxy --workers 2` against one worker.

Issue 29's goal: with `--workers 2` on this machine, the requests served per proxy CPU-second stay
within 10 % of one worker's. Method: `bench_hot_path`'s canned broker (each small Produce v8
answered at once), Sluice with the access log on and a default client-id quota that never binds,
started with `workers: 1` and with `workers: 2`, driven by the same `--clients` concurrent clients
(each its own connection, one request at a time; the kernel spreads the connections over the
workers with SO_REUSEPORT), `--pairs` pairs each. The CPU is the whole process tree's from /proc
(the supervisor, the workers and their access-log writers). Rounds alternate one worker and two,
`--rounds` times; the medians are compared. The connections' spread over the workers is printed:
with two workers, a round whose connections all landed on one worker measures one worker.

    .venv/bin/python -m bench.bench_workers            # under a minute; bench/results/workers.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_hot_path import SocketBench, client_pairs
from bench.common.cpu import child_pids, process_cpu_s
from bench.common.results import commit, write_json

RESULTS = Path(__file__).resolve().parent / "results" / "workers.json"


def drive(port: int, clients: int, pairs: int) -> float:
    """`clients` connections at once, `pairs` pairs each; wall seconds."""
    threads = [threading.Thread(target=client_pairs, args=(port, pairs)) for _ in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def round_of(bench: SocketBench, workers: int, clients: int, pairs: int) -> dict[str, Any]:
    proc, port = bench.start("log_on", extra={"workers": workers})
    try:
        c0 = process_cpu_s(proc.pid)
        wall = drive(port, clients, pairs)
        time.sleep(0.3)  # the writers finish this round's records (a benchmark: no test waits so)
        cpu = process_cpu_s(proc.pid) - c0
        busy = [round(process_cpu_s(child), 2) for child in child_pids(proc.pid)]
    finally:
        proc.terminate()
        proc.wait(30)
    total = clients * pairs
    return {"workers": workers, "pairs": total, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "pairs_per_cpu_s": round(total / cpu), "pairs_per_s": round(total / wall),
            "children_cpu_s": busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=15_000, help="per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sluice-workers-") as tmp, SocketBench(Path(tmp)) as bench:
        for _ in range(args.rounds):
            for workers in (1, 2):
                rows.append(round_of(bench, workers, args.clients, args.pairs))
                r = rows[-1]
                print(f"workers {workers}: {r['pairs_per_cpu_s']:>7,} pairs per CPU-s, "
                      f"{r['pairs_per_s']:>6,} pairs/s, children CPU-s {r['children_cpu_s']}", flush=True)
    median = {w: statistics.median(r["pairs_per_cpu_s"] for r in rows if r["workers"] == w) for w in (1, 2)}
    ratio = median[2] / median[1]
    print(f"median pairs per proxy CPU-second: 1 worker {median[1]:,.0f}, 2 workers {median[2]:,.0f} "
          f"(2 / 1 = {ratio:.3f}; goal within 10 %: {'MET' if ratio >= 0.9 else 'MISSED'})")
    report = {"what": __doc__.split("\n")[0], "commit": commit(), "cpu_count": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "clients": args.clients, "pairs_per_client": args.pairs, "rounds": rows,
              "median_pairs_per_cpu_s": median, "ratio_2_to_1": round(ratio, 3),
              "goal_within_10_percent": ratio >= 0.9}
    print(f"results: {write_json(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
