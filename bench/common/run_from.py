"""Run Sluice's `proxy` command from another checkout: ``python bench/common/run_from.py DIR ARGS...``.

DIR (a checkout of another commit, or an unpacked wheel of one, with its compiled modules built)
goes first on `sys.path`, so `proxy`, `protocol` and `quotas` are imported from there and not from
this tree; ARGS are the `proxy` command's. `bench_hot_path --against DIR` starts its second Sluice
this way, to measure two commits in one run.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 2 or not (Path(sys.argv[1]) / "proxy" / "__main__.py").is_file():
        raise SystemExit("usage: run_from.py DIR ARGS...  (DIR holds proxy/__main__.py)")
    root = str(Path(sys.argv[1]).resolve())
    sys.path[0] = root  # this script's own directory is not wanted on the path
    sys.argv = ["proxy", *sys.argv[2:]]
    runpy.run_module("proxy", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
