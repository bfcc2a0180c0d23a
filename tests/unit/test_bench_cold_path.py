"""bench_cold_path's reading of a callgrind file: each function's self cost, counted in the group of
the object its code is in; a call's inclusive cost is not added again."""

from __future__ import annotations

from pathlib import Path

from bench.bench_cold_path import self_costs, where

# A callgrind file as callgrind writes one: names compressed to "(id)" after their first use, a
# cost line "<line> <Ir> <ILmr>" per source line, and after "calls=" the call's inclusive cost.
CALLGRIND = """\
version: 1
creator: callgrind-3.19.0
events: Ir ILmr
ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) Objects/object.c
fn=(1) PyObject_GenericGetAttr
10 100 3
+2 20 1
ob=(2) /repo/proxy/pumps/_speedups.cpython-311-x86_64-linux-gnu.so
fl=(2) proxy/pumps/_speedups.c
fn=(2) RequestReader__request
5 400 12
cob=(1)
cfi=(1)
cfn=(1)
calls=3 10
7 9999 999
* 50 2
ob=(1)
fl=(1)
fn=(1)
12 5 0
summary: 575 18
"""


def test_self_costs_are_counted_per_object_without_calls_inclusive_costs(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out"
    path.write_text(CALLGRIND)
    events, groups = self_costs(path)
    assert events == ["Ir", "ILmr"]
    # CPython: 100 + 20 + 5 instructions, 3 + 1 + 0 misses (the "(1)" reused after the pumps' lines)
    assert groups["CPython"] == [125, 4]
    # the pumps: 400 + 50 and 12 + 2; the call's inclusive 9999 / 999 is CPython's, counted there
    assert groups["pumps/_speedups"] == [450, 14]
    assert set(groups) == {"CPython", "pumps/_speedups"}


def test_objects_are_grouped_by_what_they_are() -> None:
    assert where("/usr/lib/libpython3.11.so.1.0") == "CPython"
    assert where("/repo/quotas/_speedups.cpython-311-x86_64-linux-gnu.so") == "quotas/_speedups"
    assert where("/lib/x86_64-linux-gnu/libc.so.6") == "C library"
    assert where("/usr/lib/x86_64-linux-gnu/libffi.so.8") == "other"
