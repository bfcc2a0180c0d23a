"""`tune simulate`'s table: every number it shows per entity is the baseline's and the plan's."""

from __future__ import annotations

from typing import Any

from spark_analytics.simulate import format_table


def _side(active_s: int, throttled_s: int) -> dict[str, Any]:
    return {"active_seconds": active_s, "throttled_seconds": throttled_s, "throttle_total_ms": 0,
            "throttle_p99_ms": None, "admitted_per_s": 1.0, "demand_per_s": 1.0, "deferred": 0.0,
            "max_backlog": 0.0}


def test_active_seconds_are_shown_for_the_baseline_and_the_plan() -> None:
    """A client muted into a second in which it sent nothing has that second active under the
    baseline (21: 20 seconds with a request + 1 muted) and not under a plan that never mutes it
    (20): the table shows both, so throttled seconds (21 -> 0) never read as more than active."""
    doc = {"plan": "plan.json", "baseline": "current", "rate_model": "windowed",
           "window": {"samples": 11, "size_ms": 1000},
           "entities": [{"entity": "client-id=flood", "quota_key": "producer_byte_rate", "broker_id": 1,
                         "baseline": _side(21, 21), "plan": _side(20, 0), "censored": False}]}
    row = format_table(doc).splitlines()[2]
    assert row.split()[3:9] == ["21", "->", "20", "21", "->", "0"], row
