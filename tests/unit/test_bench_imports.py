"""The benchmarks share `bench.common` and import no test module: from the tests they reach only the
harness (`tests/harness/`, real Kafka and Sluice processes) and the fuzz targets (`tests/fuzz/`, which
`bench_fuzz` runs longer)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
ALLOWED = ("tests.harness", "tests.fuzz.targets", "tests.fuzz.seeds")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_benchmark_imports_a_test_module() -> None:
    offenders = {}
    for path in sorted(BENCH.rglob("*.py")):
        bad = sorted(m for m in imported_modules(path) if m.startswith("tests.")
                     and not any(m == a or m.startswith(a + ".") for a in ALLOWED))
        if bad:
            offenders[str(path.relative_to(BENCH.parent))] = bad
    assert not offenders, offenders


def test_the_benchmarks_measure_cpu_one_way() -> None:
    """One `/proc` CPU reader, in bench.common.cpu: no benchmark reads /proc/<pid>/stat itself."""
    readers = [str(p.relative_to(BENCH.parent)) for p in sorted(BENCH.rglob("*.py"))
               if '/stat"' in p.read_text() and p.name != "cpu.py"]
    assert readers == []
