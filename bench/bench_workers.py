"""Does a second worker process cost CPU per request? `sluice proxy --workers 2` against one worker.

Issue 29's goal: with `--workers 2` on this machine, the requests served per proxy CPU-second stay
within 10 % of one worker's. Method: `bench_hot_path`'s canned broker (each small Produce v8
answered at once), Sluice with the access log on and a default client-id quota that never binds,
started with `workers: 1` and with `workers: 2`, driven by the same `--clients` concurrent clients
(each its own connection, one request at a time; the kernel spreads the connections over the
workers with SO_REUSEPORT), `--pairs` pairs each. The CPU is the whole process tree's from /proc
(the supervisor, the workers and their access-log writers). The raw forwarder runs the same way in
the same run, one process and two sharing the port (`bench.common.raw_forwarder --workers 2`): the
Python floor's own cost of a second process on this machine (two event loops each wake up for
fewer ready sockets than one does, and every process competes with the clients and the broker for
the same cores). Each round runs the raw forwarder with one and two workers, then Sluice with one
and two, `--rounds` times; the medians are compared. Each is measured from a quiet start (the
access-log writers' start-up is not counted) until it is quiet again after the clients finish (the
writers' work on the round's records is). The spread over the workers is printed (each child
process's CPU over the round): a round whose connections all landed on one worker measures one.

    .venv/bin/python -m bench.bench_workers            # about 3 minutes; bench/results/workers.json
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
from bench.common.cpu import child_pids, process_cpu_s, wait_quiet
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


def round_of(bench: SocketBench, mode: str, workers: int, clients: int, pairs: int) -> dict[str, Any]:
    proc, port = bench.start(mode, extra={"workers": workers})
    try:
        c0 = process_cpu_s(proc.pid)
        children0 = {child: process_cpu_s(child) for child in child_pids(proc.pid)}
        wall = drive(port, clients, pairs)
        wait_quiet(proc.pid)  # the writers have written this round's records
        cpu = process_cpu_s(proc.pid) - c0
        busy = [round(process_cpu_s(child) - cpu0, 2) for child, cpu0 in children0.items()]
    finally:
        proc.terminate()
        proc.wait(30)
    total = clients * pairs
    return {"proxy": "sluice" if mode == "log_on" else mode, "workers": workers, "pairs": total,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
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
            for mode in ("raw", "log_on"):
                for workers in (1, 2):
                    rows.append(round_of(bench, mode, workers, args.clients, args.pairs))
                    r = rows[-1]
                    print(f"{r['proxy']:>6} workers {workers}: {r['pairs_per_cpu_s']:>7,} pairs per CPU-s, "
                          f"{r['pairs_per_s']:>6,} pairs/s, children CPU-s {r['children_cpu_s']}", flush=True)
    median = {proxy: {w: statistics.median(r["pairs_per_cpu_s"] for r in rows
                                           if r["proxy"] == proxy and r["workers"] == w) for w in (1, 2)}
              for proxy in ("raw", "sluice")}
    ratio = {proxy: m[2] / m[1] for proxy, m in median.items()}
    for proxy, m in median.items():
        print(f"{proxy:>6}: median pairs per proxy CPU-second: 1 worker {m[1]:,.0f}, 2 workers {m[2]:,.0f} "
              f"(2 / 1 = {ratio[proxy]:.3f})")
    print(f"Sluice's 2 / 1 against the raw forwarder's: {ratio['sluice'] / ratio['raw']:.3f}; "
          f"goal, Sluice's 2 / 1 within 10 %: {'MET' if ratio['sluice'] >= 0.9 else 'MISSED'}")
    report = {"what": __doc__.split("\n")[0], "commit": commit(), "cpu_count": os.cpu_count(),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "clients": args.clients, "pairs_per_client": args.pairs, "rounds": rows,
              "median_pairs_per_cpu_s": median, "ratio_2_to_1": {p: round(r, 3) for p, r in ratio.items()},
              "sluice_ratio_over_raw_ratio": round(ratio["sluice"] / ratio["raw"], 3),
              "goal_within_10_percent": ratio["sluice"] >= 0.9}
    print(f"results: {write_json(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
