"""Where a benchmark ran and what it wrote: the commit, the machine and its load, result files
(JSON, in bench/results/ by default) and charts (matplotlib, headless)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.harness.kafka import REPO

RESULTS = REPO / "bench" / "results"


def git_describe() -> str:
    """The commit Sluice runs from, `+dirty` when proxy/, protocol/ or quotas/ have changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "proxy", "protocol", "quotas"],
                               cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def commit() -> str:
    """The short commit of the tree (no dirty mark)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "pinned": False}


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_json(report: Mapping[str, Any], path: Path, indent: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent) + "\n")
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on the headless Agg backend (a chart file, never a window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_chart(plt: Any, fig: Any, path: Path) -> bool:
    """`fig` laid out and written to `path` (its directory made), then closed; True."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
