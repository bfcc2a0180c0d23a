"""Coverage-guided fuzzing of every decoder that reads client or broker bytes (issue 16).

    .venv/bin/python -m bench.bench_fuzz [--inputs 1000000] [--targets framing,rewrite,...]

atheris (libFuzzer for Python, coverage-guided: `protocol` is instrumented) runs each target of
tests/fuzz/targets.py in its own process, starting from the target's seeds (valid frames drawn from
kio's schemas, tests/fuzz/seeds.py), for an equal share of `--inputs`. The property is the one the
CI tests check with hypothesis (tests/fuzz/test_decoders.py): any input raises nothing but
`protocol.errors.ProtocolError`. Reported per target: inputs run, crashes (anything else raised;
the first input of each distinct crash site is kept), slow inputs (over 1 ms on the best of three
re-runs, so that a pause of a loaded machine is not counted) and the corpus' coverage growth.
Writes bench/results/fuzz.json. A crash becomes a regression test in tests/fuzz/test_regressions.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "fuzz.json"
SLOW_MS = 1.0
MAX_LEN = 4096


# ----------------------------------------------------------------------------- worker (one target)

def worker(name: str, runs: int, workdir: Path, seed: int) -> None:
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=["protocol"]):
        from protocol.errors import ProtocolError
        from tests.fuzz.seeds import seeds
        from tests.fuzz.targets import BY_NAME

    target = BY_NAME[name]
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    seed_inputs = seeds(name, 2)
    for i, data in enumerate(seed_inputs):
        (corpus / f"seed-{i}").write_bytes(data[:MAX_LEN])
    stats: dict[str, Any] = {"target": name, "inputs": 0, "seeds": len(seed_inputs), "crashes": {},
                             "slow": [], "max_ms": 0.0, "first_over_1ms": 0}
    out = workdir / "stats.json"
    started = time.monotonic()

    def save() -> None:
        stats["seconds"] = round(time.monotonic() - started, 1)
        out.write_text(json.dumps(stats))

    def one(data: bytes) -> None:
        stats["inputs"] += 1
        t0 = time.perf_counter()
        try:
            target.run(data)
        except ProtocolError:
            pass
        except Exception as exc:  # a finding: record it and go on fuzzing
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            site = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
            if site not in stats["crashes"]:
                stats["crashes"][site] = {"error": f"{type(exc).__name__}: {exc}"[:300],
                                          "input_hex": data[:512].hex(), "count": 0}
                save()
            stats["crashes"][site]["count"] += 1
        elapsed_ms = (time.perf_counter() - t0) * 1000
        if elapsed_ms > SLOW_MS:
            stats["first_over_1ms"] += 1
            best_ms = min(_timed_ms(target.call, data) for _ in range(3))
            stats["max_ms"] = max(stats["max_ms"], best_ms)
            if best_ms > SLOW_MS:  # keep the 20 slowest, whole (MAX_LEN bounds them)
                stats["slow"].append({"ms": round(best_ms, 3), "len": len(data), "input_hex": data.hex()})
                stats["slow"] = sorted(stats["slow"], key=lambda s: -s["ms"])[:20]
        if stats["inputs"] % 5000 == 0:
            save()
        if stats["inputs"] >= runs:
            save()

    save()
    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-max_len={MAX_LEN}", f"-seed={seed}",
                   "-print_final_stats=1", "-timeout=10", str(corpus)], one)
    atheris.Fuzz()


def _timed_ms(fn: Any, data: bytes) -> float:
    t0 = time.perf_counter()
    with contextlib.suppress(Exception):  # a crash was recorded already; here only the time counts
        fn(data)
    return (time.perf_counter() - t0) * 1000


# ----------------------------------------------------------------------------- driver

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000, help="total, shared equally by the targets")
    parser.add_argument("--targets", default="", help="comma-separated names (default: all)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON [bench/results/fuzz.json]")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.runs, args.workdir, args.seed)
        return 0

    from tests.fuzz.targets import TARGETS

    names = [t.name for t in TARGETS if not args.targets or t.name in args.targets.split(",")]
    per_target = -(-args.inputs // len(names))
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-fuzz-") as tmp:
        for name in names:
            workdir = Path(tmp) / name
            workdir.mkdir()
            t0 = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "bench.bench_fuzz", "--worker", name, "--runs", str(per_target),
                 "--workdir", str(workdir), "--seed", str(args.seed)],
                cwd=REPO, capture_output=True, text=True, check=False,
                env={**os.environ, "PYTHONHASHSEED": "0"})
            stats = json.loads((workdir / "stats.json").read_text())
            stats["exit_code"] = done.returncode
            stats["wall_seconds"] = round(time.monotonic() - t0, 1)
            stats["coverage"] = _libfuzzer_stat(done.stderr, "cov:")
            stats["features"] = _libfuzzer_stat(done.stderr, "ft:")
            stats["corpus_files"] = len(list((workdir / "corpus").iterdir()))
            stats["slow_uninstrumented_ms"] = _uninstrumented_worst_ms(name, stats["slow"])
            if done.returncode != 0:
                stats["stderr_tail"] = done.stderr[-2000:]
            results.append(stats)
            print(f"{name:22s} {stats['inputs']:>8d} inputs {stats['wall_seconds']:>6.1f} s  "
                  f"crashes {len(stats['crashes'])}  slow {len(stats['slow'])}  "
                  f"max {stats['max_ms']:.2f} ms (uninstrumented {stats['slow_uninstrumented_ms']} ms)  "
                  f"cov {stats['coverage']}  corpus {stats['corpus_files']}  "
                  f"exit {done.returncode}", flush=True)
    total = sum(r["inputs"] for r in results)
    report = {
        "what": "atheris (libFuzzer) coverage-guided fuzzing of protocol/ decoders; property: only "
                "ProtocolError escapes; slow = over 1 ms on the best of three re-runs (instrumented code)",
        "atheris": _version("atheris"), "python": sys.version.split()[0], "inputs_total": total,
        "wall_seconds": round(time.monotonic() - started, 1), "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(), "crashes_total": sum(len(r["crashes"]) for r in results),
        "slow_total": sum(len(r["slow"]) for r in results), "targets": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"total {total} inputs, {report['crashes_total']} crash sites, {report['slow_total']} slow inputs; "
          f"{args.out}")
    return 1 if report["crashes_total"] else 0


def _uninstrumented_worst_ms(name: str, slow: list[dict[str, Any]]) -> float | None:
    """The slowest of the recorded slow inputs re-run here, without coverage instrumentation (best
    of three): what a decoder costs in production on that input."""
    from tests.fuzz.targets import BY_NAME

    target = BY_NAME[name]
    times = [min(_timed_ms(target.call, bytes.fromhex(s["input_hex"])) for _ in range(3)) for s in slow]
    return round(max(times), 3) if times else None


def _libfuzzer_stat(stderr: str, key: str) -> int | None:
    """The last `cov:`/`ft:` figure libFuzzer printed."""
    found = re.findall(re.escape(key) + r" (\d+)", stderr)
    return int(found[-1]) if found else None


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
