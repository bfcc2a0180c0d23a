"""The memory one small Produce request+response touches when it runs cold, counted exactly.

Over sockets a small request costs Sluice several times what it costs without them
(`bench_hot_path`: a few µs a pair back to back, tens of µs a pair over sockets). Between two
wake-ups the broker and the client run, and the caches no longer hold what the next request needs.
What the request costs then is what it touches: its code and its objects. Wall-clock figures of
that on a shared VM move by tens of percent from run to run; this benchmark counts it instead.

It runs the in-memory pair of `bench_hot_path` (a real `ProxyServer` from a real config, one
`ClientConnection` over an in-memory transport and upstream, a small Produce and its response, a
default client-id quota that never binds) under Valgrind's callgrind with its cache simulation:
a 32 KiB L1 for instructions and one for data, and a 2 MiB last-level cache. Before each pair,
4 MiB of memory is written, so every pair starts with the caches full of other work, as it does
over sockets. Only the pair itself is counted (callgrind's collection is switched on and off
around it). Per pair:

* ``Ir``: instructions executed;
* ``I_misses``: last-level misses for instructions (code that had to come from memory);
* ``D_misses``: last-level misses for data, reads and writes;
* the misses by where the code is: CPython itself, each compiled Sluice module, the C library.

The paths, in one run: ``raw`` (the raw forwarder's data path: bytes in, bytes out),
``log_off`` and ``log_on`` (Sluice without and with the access log), and with ``--pure`` the
same two on the pure-Python path (SLUICE_PURE_PYTHON=1). ``--against DIR`` adds Sluice run from DIR (another
commit's tree, built): the two commits' counts in one run. ``--hot`` leaves the caches warm.

The counts are exact and the same from run to run; what a miss costs in time depends on the
machine (a simulated cache has no prefetcher, so sequential code is counted more heavily than a
CPU pays for it). Compare paths and commits within a run.

    .venv/bin/python -m bench.bench_cold_path            # ~4 min; bench/results/cold_path.json
    .venv/bin/python -m bench.bench_cold_path --pure     # and the pure-Python path
    .venv/bin/python -m bench.bench_cold_path --against DIR

Needs `valgrind` (its callgrind tool and its `valgrind/callgrind.h`) and a C compiler.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: the simulated caches: L1 for instructions, L1 for data, last level (bytes, bytes a line, ways)
CACHES = {"I1": (32768, 64, 8), "D1": (32768, 64, 8), "LL": (2 * 1024 * 1024, 64, 16)}
#: memory written before each cold pair: twice the last-level cache
EVICT_BYTES = 2 * CACHES["LL"][0]
WARMUP_PAIRS = 50

_TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid sluice_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"


def toggle_library(directory: Path) -> Path:
    """A shared library whose one function switches callgrind's collection on or off."""
    source, library = directory / "toggle.c", directory / "toggle.so"
    source.write_text(_TOGGLE_C)
    done = subprocess.run(["cc", "-shared", "-fPIC", "-O2", str(source), "-o", str(library)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("cannot build the callgrind toggle (a C compiler and valgrind's headers are"
                         f" needed):\n{done.stderr}")
    return library


# ----------------------------------------------------------------------------- the child, under valgrind

async def child(mode: str, pairs_n: int, hot: bool, toggle: Path, tmp: Path) -> None:
    from bench import bench_hot_path as h

    pairs = [(h.produce_request(i), h.produce_response(i)) for i in range(pairs_n + WARMUP_PAIRS)]
    flip = ctypes.CDLL(str(toggle)).sluice_toggle
    evict = bytearray(EVICT_BYTES)
    zeros = bytes(len(range(0, EVICT_BYTES, 64)))
    if mode == "raw":
        client, upstream = h.MemoryTransport(), h.MemoryUpstream()

        def step(request: bytes, response: bytes) -> None:
            h.raw_pair(client, upstream, request, response)
        server = None
    else:
        server, conn = await h.sluice_connection(h.pair_config(mode, tmp))
        data_received, on_upstream_frame = conn.data_received, conn.on_upstream_frame

        def step(request: bytes, response: bytes) -> None:
            data_received(request)
            on_upstream_frame(response)
    for request, response in pairs[:WARMUP_PAIRS]:
        step(request, response)
    for request, response in pairs[WARMUP_PAIRS:]:
        if not hot:
            evict[::64] = zeros  # one write per cache line
        flip()
        step(request, response)
        flip()
    if server is not None:
        await server.drain(5.0)


# ----------------------------------------------------------------------------- the parent

def where(obj: str) -> str:
    """The group a function's costs are counted in: by the object its code is in."""
    name = Path(obj).name
    if name.startswith("libpython") or name.startswith("python"):
        return "CPython"
    if name.startswith("_") and ".cpython-" in name:  # a compiled Sluice module: its package
        return str(Path(obj).parent.name) + "/" + name.split(".cpython-")[0]
    if name.startswith("libc") or name.startswith("ld-linux"):
        return "C library"
    return "other"


def self_costs(path: Path) -> tuple[list[str], dict[str, list[int]]]:
    """The events and each group's self cost (calls' inclusive costs not added) from a callgrind
    file, one count per event (a cost line leaves out its trailing zeros)."""
    events: list[str] = []
    groups: dict[str, list[int]] = defaultdict(lambda: [0] * len(events))
    objects: dict[str, str] = {}  # an object's compressed id -> its name ("ob=(3) /lib/x.so", then "ob=(3)")
    obj = ""
    skip_next = False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
            continue
        m = re.match(r"^(c?)ob=(?:\((\d+)\))?\s*(.*)$", line)
        if m:
            called, ident, name = m.groups()
            if ident is not None:
                name = objects.setdefault(ident, name)
            if not called:
                obj = name
            continue
        if line.startswith("calls="):
            skip_next = True  # the next cost line is the call's inclusive cost
            continue
        if line and (line[0].isdigit() or line[0] in "+-*"):
            if skip_next:
                skip_next = False
                continue
            row = groups[where(obj)]
            for i, v in enumerate(line.split()[1:]):
                row[i] += int(v)
    return events, groups


def run_path(label: str, mode: str, pairs_n: int, hot: bool, tree: Path, pure: bool, toggle: Path,
             tmp: Path) -> dict[str, Any]:
    out = tmp / f"callgrind-{label}.out"
    caches = [f"--{name}={size},{ways},{line}" for name, (size, line, ways) in CACHES.items()]
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("SLUICE_PURE_PYTHON", None)
    if pure:
        env["SLUICE_PURE_PYTHON"] = "1"
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--cache-sim=yes", *caches,
               f"--callgrind-out-file={out}", sys.executable, "-c",
               "import sys, runpy; root = sys.argv[1]; sys.path.insert(0, root); sys.argv = sys.argv[1:];"
               " runpy.run_path(root + '/bench/bench_cold_path.py', run_name='__main__')",
               str(tree), "--child", mode, "--pairs", str(pairs_n), "--toggle", str(toggle),
               "--tmp", str(tmp / label)] + (["--hot"] if hot else [])
    print(f"  {label}: under callgrind ...", flush=True)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"{label}: the child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    events, groups = self_costs(out)
    total = [sum(column) for column in zip(*groups.values(), strict=True)]

    def per_pair(row: list[int], name: str) -> float:
        return row[events.index(name)] / pairs_n

    def summary(row: list[int]) -> dict[str, float]:
        return {"Ir": round(per_pair(row, "Ir"), 1),
                "I_misses": round(per_pair(row, "ILmr"), 1),
                "D_misses": round(per_pair(row, "DLmr") + per_pair(row, "DLmw"), 1)}
    return {"label": label, "mode": mode, "pure_python": pure, "tree": str(tree), **summary(total),
            "by_group": {g: summary(row) for g, row in sorted(groups.items())}}


def chart(report: dict[str, Any], path: Path) -> bool:
    from bench.common.results import pyplot, save_chart
    try:
        plt = pyplot()
    except ImportError:
        return False
    paths = report["paths"]
    groups = sorted({g for p in paths for g in p["by_group"]},
                    key=lambda g: -max(p["by_group"].get(g, {}).get("I_misses", 0)
                                       + p["by_group"].get(g, {}).get("D_misses", 0) for p in paths))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottoms = [0.0] * len(paths)
    colors = plt.get_cmap("tab20").colors
    for i, g in enumerate(groups):
        heights = [p["by_group"].get(g, {}).get("I_misses", 0) + p["by_group"].get(g, {}).get("D_misses", 0)
                   for p in paths]
        ax.bar([p["label"] for p in paths], heights, bottom=bottoms, label=g, color=colors[i % len(colors)])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("last-level cache misses per pair")
    state = "warm" if report["hot"] else "cold"
    ax.set_title(f"One small Produce pair, {state} (callgrind, {report['commit']})")
    ax.legend(fontsize=7, ncol=2)
    return save_chart(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--hot", action="store_true", help="no eviction between pairs")
    parser.add_argument("--pure", action="store_true", help="also the pure-Python path")
    parser.add_argument("--against", type=Path, help="also Sluice from this tree (another commit, built)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cold_path.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--toggle", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import uvloop
        args.tmp.mkdir(parents=True, exist_ok=True)
        uvloop.run(child(args.child, args.pairs, args.hot, args.toggle, args.tmp))
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_cold_path needs valgrind (Debian/Ubuntu: apt-get install valgrind)")
    from bench.common.results import commit, load_avg, machine, write_json

    with tempfile.TemporaryDirectory(prefix="sluice-cold-") as name:
        tmp = Path(name)
        toggle = toggle_library(tmp)
        plan = [("raw", "raw", REPO, False), ("log_off", "log_off", REPO, False),
                ("log_on", "log_on", REPO, False)]
        if args.pure:
            plan += [("log_off pure", "log_off", REPO, True), ("log_on pure", "log_on", REPO, True)]
        if args.against is not None:
            plan += [(f"log_off {args.against.name}", "log_off", args.against.resolve(), False),
                     (f"log_on {args.against.name}", "log_on", args.against.resolve(), False)]
        print(f"bench_cold_path: {len(plan)} paths x {args.pairs} pairs, {'warm' if args.hot else 'cold'}")
        paths = [run_path(label, mode, args.pairs, args.hot, tree, pure, toggle, tmp)
                 for label, mode, tree, pure in plan]
    raw = paths[0]
    state = "warm" if args.hot else "cold"
    print(f"\nper pair, {state}     instructions   LL misses: code    data   ÷ raw (misses)")
    for p in paths:
        misses = p["I_misses"] + p["D_misses"]
        p["misses_vs_raw"] = round(misses / max(1.0, raw["I_misses"] + raw["D_misses"]), 2)
        print(f"  {p['label']:<22} {p['Ir']:>12,.0f} {p['I_misses']:>15,.1f} {p['D_misses']:>7,.1f}"
              f" {p['misses_vs_raw']:>8.2f}")
        for g, s in sorted(p["by_group"].items(), key=lambda kv: -(kv[1]["I_misses"] + kv[1]["D_misses"])):
            if s["I_misses"] + s["D_misses"] >= 1:
                print(f"      {g:<26} {s['Ir']:>8,.0f} {s['I_misses']:>15,.1f} {s['D_misses']:>7,.1f}")
    report = {"benchmark": "cold_path", "commit": commit(), "machine": machine(), "load": load_avg(),
              "pairs": args.pairs, "hot": args.hot, "caches": CACHES, "evict_bytes": EVICT_BYTES,
              "paths": paths}
    write_json(report, args.out)
    drawn = chart(report, args.out.with_suffix(".png"))
    print(f"\nresults: {args.out}" + (f"\nchart:   {args.out.with_suffix('.png')}" if drawn else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
