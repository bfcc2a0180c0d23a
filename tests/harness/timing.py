"""Sums a SLUICE_TEST_TIMING file (one JSON line per test phase, written by tests/conftest.py) into
where a `make test` run's time went: per module (tests, summed set-up + call + teardown, the CPU
seconds they cost with the children they reaped, the worker(s) it ran on) and per xdist worker
(first start, last stop, busy time, CPU, the modules in the order it ran them). The worker that stops
last is the critical path.

    python -m tests.harness.timing timing.jsonl [--estimates tests/durations.json]

With --estimates it also writes the seconds tests/conftest.py orders the work by (longest first):
per test for the tests of a second or more, and per module the mean of its tests.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ModuleTime:
    tests: set[str] = field(default_factory=set)
    seconds: float = 0.0
    cpu_s: float = 0.0   # the worker's CPU and its reaped children's (Sluice processes, Java tools, ...)
    first_start: float = float("inf")
    last_stop: float = 0.0
    workers: set[str] = field(default_factory=set)


@dataclass
class WorkerTime:
    first_start: float = float("inf")
    last_stop: float = 0.0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    modules: list[tuple[str, float, float]] = field(default_factory=list)  # (module, seconds, started at)


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def plain_id(nodeid: str) -> str:
    """The node id without the ``@group`` suffix xdist's loadgroup adds."""
    return nodeid.split("@")[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid


def estimates(path: Path) -> dict[str, dict[str, float]]:
    per_test: dict[str, float] = defaultdict(float)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            per_test[plain_id(row["nodeid"])] += row["duration"]
    per_module: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in per_test.items():
        per_module[module_of(nodeid)].append(seconds)
    return {"tests": {k: round(v, 1) for k, v in sorted(per_test.items()) if v >= 1.0},
            "modules": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_module.items())}}


def summarize(path: Path) -> tuple[dict[str, ModuleTime], dict[str, WorkerTime], float]:
    modules: dict[str, ModuleTime] = defaultdict(ModuleTime)
    workers: dict[str, WorkerTime] = defaultdict(WorkerTime)
    t0 = float("inf")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows.sort(key=lambda r: r["start"])
    for row in rows:
        t0 = min(t0, row["start"])
        mod = modules[module_of(plain_id(row["nodeid"]))]
        mod.tests.add(row["nodeid"])
        mod.seconds += row["duration"]
        mod.cpu_s += row.get("cpu_s", 0.0)
        mod.first_start = min(mod.first_start, row["start"])
        mod.last_stop = max(mod.last_stop, row["stop"])
        mod.workers.add(row["worker"])
        w = workers[row["worker"]]
        w.first_start = min(w.first_start, row["start"])
        w.last_stop = max(w.last_stop, row["stop"])
        w.busy_s += row["duration"]
        w.cpu_s += row.get("cpu_s", 0.0)
        name = module_of(plain_id(row["nodeid"]))
        if w.modules and w.modules[-1][0] == name:
            last = w.modules[-1]
            w.modules[-1] = (name, last[1] + row["duration"], last[2])
        else:
            w.modules.append((name, row["duration"], row["start"]))
    return modules, workers, t0


def compare(before: dict[str, ModuleTime], after: dict[str, ModuleTime]) -> None:
    print("| module | tests | before, s | after, s |")
    print("|---|---:|---:|---:|")
    names = sorted(set(before) | set(after), key=lambda n: -max(before[n].seconds if n in before else 0,
                                                                 after[n].seconds if n in after else 0))
    for name in names:
        b, a = before.get(name), after.get(name)
        either = a if a is not None else b
        tests = len(either.tests) if either is not None else 0
        cells = [f"{m.seconds:.0f}" if m is not None else "-" for m in (b, a)]
        print(f"| `{name}` | {tests} | {cells[0]} | {cells[1]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=12, help="modules listed per worker (longest)")
    parser.add_argument("--estimates", type=Path, help="write the per-test and per-module seconds here")
    parser.add_argument("--before", type=Path, help="an earlier run's file: one table, before and after")
    args = parser.parse_args()
    if args.before is not None:
        compare(summarize(args.before)[0], summarize(args.file)[0])
        return
    if args.estimates is not None:
        args.estimates.write_text(json.dumps(estimates(args.file), indent=0) + "\n", encoding="utf-8")
    modules, workers, t0 = summarize(args.file)
    print("| module | tests | test time, s | CPU, s | ran at, s from start | worker(s) |")
    print("|---|---:|---:|---:|---|---|")
    for name, mod in sorted(modules.items(), key=lambda kv: -kv[1].seconds):
        print(f"| `{name}` | {len(mod.tests)} | {mod.seconds:.0f} | {mod.cpu_s:.0f} | "
              f"{mod.first_start - t0:.0f}-{mod.last_stop - t0:.0f} | {', '.join(sorted(mod.workers))} |")
    print()
    print("| worker | first start, s | last stop, s | busy, s | CPU, s | longest modules (s, started at s) |")
    print("|---|---:|---:|---:|---:|---|")
    for name, w in sorted(workers.items(), key=lambda kv: kv[1].last_stop):
        top = sorted(w.modules, key=lambda m: -m[1])[: args.top]
        listed = "; ".join(f"{m.split('/')[-1]} {s:.0f} @{start - t0:.0f}" for m, s, start in top)
        print(f"| {name} | {w.first_start - t0:.0f} | {w.last_stop - t0:.0f} | {w.busy_s:.0f} | "
              f"{w.cpu_s:.0f} | {listed} |")


if __name__ == "__main__":
    main()
