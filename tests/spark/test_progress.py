"""Progress lines for long runs: per-step log lines and the SparkStatusTracker status line."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

from spark_analytics.session import Progress, _local_cores


@dataclass
class _Stage:
    numTasks: int
    numCompletedTasks: int
    numActiveTasks: int


class _Tracker:
    def __init__(self) -> None:
        self.stages = {3: _Stage(40, 12, 2), 4: _Stage(8, 0, 0)}

    def getActiveStageIds(self) -> list[int]:
        return list(self.stages)

    def getStageInfo(self, stage_id: int) -> _Stage | None:
        return self.stages.get(stage_id)


class _Context:
    def __init__(self) -> None:
        self.tracker = _Tracker()

    def statusTracker(self) -> _Tracker:
        return self.tracker


class _Spark:
    def __init__(self) -> None:
        self.sparkContext = _Context()


def test_steps_and_status_lines() -> None:
    out = io.StringIO()
    fake: Any = _Spark()
    with Progress(fake, "recommend", interval_s=0.05, stream=out) as progress:
        progress.step("reading the logs")
        deadline = time.monotonic() + 5
        while "tasks" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        progress.step("writing the plan")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[recommend] reading the logs ..."
    assert lines[1] == ("[recommend] reading the logs: stage 3 12/40 tasks (2 running); "
                        "stage 4 0/8 tasks (0 running)")
    assert lines[2].startswith("[recommend] reading the logs: done in ")
    assert lines[3] == "[recommend] writing the plan ..."
    assert lines[4].startswith("[recommend] writing the plan: done in ")
    assert lines[5].startswith("[recommend] finished in ")
    assert len(lines) == 6  # an unchanged status line is not repeated


def test_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    with Progress(None, "report", enabled=False, stream=out) as progress:
        progress.step("x")
    assert out.getvalue() == ""


def test_local_cores() -> None:
    assert [_local_cores(m) for m in ("local", "local[4]", "local[2,3]", "local[0]")] == [1, 4, 2, 1]
    assert _local_cores("local[*]") >= 1
