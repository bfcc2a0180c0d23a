"""Where Sluice's CPU goes over sockets: its Python callbacks, their writes, and the rest.

`bench_hot_path` shows Sluice's loop costing ~16 µs per small Produce request+response when its
Python runs back to back with no sockets, yet ~64 µs more than the raw forwarder over sockets. This
benchmark splits the socket figure. The raw forwarder and Sluice (log off, log on) run in front of
the same canned broker as in `bench_hot_path`; Sluice runs with its two `data_received` callbacks
(client side and broker side) and its upstream write wrapped in `time.thread_time_ns`, so per pair
it reports:

* process CPU (all threads and the writer process, from /proc), as in `bench_hot_path`;
* the event-loop thread's user and system CPU, and its minor page faults;
* CPU inside the two callbacks (Sluice's Python plus the `writev` to each peer, which happens in
  them), and inside the upstream write alone (one of the two `writev`s).

What is outside the callbacks is uvloop's reading and waiting (`read`, `epoll_wait`), the same
system calls the raw forwarder makes. The wrapping adds two clock reads per callback (well under
1 µs). Best of ``--repeats`` rounds of ``--pairs`` pairs each.

    .venv/bin/python -m bench.bench_callbacks                # 20,000 pairs x 5

Writes bench/results/callbacks.json. Compare within a run; absolute figures move with the load.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_hot_path import SocketBench, client_pairs
from bench.common.cpu import process_cpu_s, thread_times

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "callbacks.json"


def run_instrumented(out: str, args: list[str]) -> None:
    """Sluice (`python -m proxy <args>`) with its callbacks timed; SIGUSR2 writes the totals to `out`."""
    from proxy.cli import main as cli
    from proxy.pumps import connection, upstream

    totals = {"client_ns": 0, "upstream_ns": 0, "upstream_write_ns": 0}
    clock = time.thread_time_ns

    def timed(cls: Any, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def wrapper(self: Any, data: bytes) -> None:
            began = clock()
            try:
                inner(self, data)
            finally:
                totals[key] += clock() - began
        setattr(cls, name, wrapper)

    def timed_per_connection(cls: Any, name: str, key: str) -> None:
        """`timed` for a method a connection may replace on itself (the compiled `RequestReader`'s
        `data_received`, installed by `ClientConnection.__init__`): wrapped on each new instance."""
        init = cls.__init__

        def initialized(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            inner = getattr(self, name)

            def wrapper(data: bytes) -> None:
                began = clock()
                try:
                    inner(data)
                finally:
                    totals[key] += clock() - began
            setattr(self, name, wrapper)
        cls.__init__ = initialized

    timed_per_connection(connection.ClientConnection, "data_received", "client_ns")
    timed(upstream.UpstreamConnection, "data_received", "upstream_ns")
    timed(upstream.UpstreamConnection, "write", "upstream_write_ns")

    def dump(*_: object) -> None:
        Path(out).write_text(repr(totals))
    signal.signal(signal.SIGUSR2, dump)
    cli.main(args=args, prog_name="sluice")


def main_thread(pid: int) -> tuple[float, float, int]:
    """(user s, system s, minor faults) of the process's first thread: the event loop."""
    return thread_times(pid)


def read_totals(proc: subprocess.Popen[bytes], path: Path) -> dict[str, int]:
    before = path.stat().st_mtime_ns if path.exists() else 0
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before and path.read_text():
            return dict(ast.literal_eval(path.read_text()))
        time.sleep(0.02)
    raise SystemExit("the instrumented Sluice did not write its totals")


def measure(pairs_n: int, repeats: int, tmp: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with SocketBench(tmp) as bench:
        for mode in bench.MODES:
            totals_path = tmp / f"{mode}.totals"
            launcher = [bench.python, "-m", "bench.bench_callbacks", "--instrumented", str(totals_path), "--"]
            proc, port = bench.start(mode, sluice=launcher)
            best: dict[str, Any] | None = None
            for _ in range(repeats):
                t0 = read_totals(proc, totals_path) if mode != "raw" else {}
                u0, s0, f0 = main_thread(proc.pid)
                c0 = process_cpu_s(proc.pid)
                client_pairs(port, pairs_n)
                time.sleep(0.2)  # the log's feeder and writer finish the round's records
                c1 = process_cpu_s(proc.pid)
                u1, s1, f1 = main_thread(proc.pid)
                t1 = read_totals(proc, totals_path) if mode != "raw" else {}
                per = 1e6 / pairs_n
                row = {"mode": mode, "process_us": round((c1 - c0) * per, 1),
                       "loop_user_us": round((u1 - u0) * per, 1), "loop_system_us": round((s1 - s0) * per, 1),
                       "loop_minor_faults": round((f1 - f0) / pairs_n, 3)}
                for key in t1:
                    row[key.removesuffix("_ns") + "_us"] = round((t1[key] - t0[key]) / 1e3 / pairs_n, 1)
                if best is None or row["process_us"] < best["process_us"]:
                    best = row
            assert best is not None
            rows.append(best)
            print("  ".join(f"{k} {v}" for k, v in best.items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--instrumented"]:
        run_instrumented(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sluice-callbacks-") as tmp:
        rows = measure(args.pairs, args.repeats, Path(tmp))
    raw = rows[0]["process_us"]
    for row in rows:
        row["process_x_raw"] = round(row["process_us"] / raw, 2) if raw else None
        if "client_us" in row:
            writes_us = 2 * row["upstream_write_us"]  # the client-side writev costs about the same
            row["python_in_callbacks_us"] = round(row["client_us"] + row["upstream_us"] - writes_us, 1)
    result = {"what": "Per small Produce request+response over sockets: where Sluice's CPU goes.",
              "load_average": list(os.getloadavg()), "cpu_count": os.cpu_count(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
