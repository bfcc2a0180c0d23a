"""Pure-Python parts of tuning: policy validation and files, plan files, and the apply diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_analytics.kafka_quota_client import QuotaEntry, QuotaOp
from spark_analytics.plan import (
    PLAN_FORMAT,
    Change,
    Plan,
    PlanEntry,
    PlanError,
    Skipped,
    diff,
    format_changes,
    operations,
    read_plan,
    write_plan,
)
from spark_analytics.policy import PolicyError, QuotaPolicy, parse_byte_rate


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"percentile": 0}, "percentile must be in (0, 1], got 0"),
    ({"headroom": 0}, "headroom must be positive, got 0"),
    ({"floor": 10.0, "ceiling": 5.0}, "floor 10.0 is above ceiling 5.0"),
    ({"max_change": 0}, "max_change must be positive, got 0"),
    ({"round_to": 0}, "round_to must be at least 1, got 0"),
    ({"capacity": {"request_percentage": 5.0}},
     "capacity for 'request_percentage', which is not among keys "
     "('producer_byte_rate', 'consumer_byte_rate')"),
    ({"weights": {"user": 1.0}}, "weights: bad quota entity 'user': expected type=name[,type=name]"),
    ({"weights": {"user=a": -1.0}}, "weight for 'user=a' must be positive, got -1.0"),
    ({"unmatched": "group"}, "unmatched must be one of ('user', 'client-id', 'user-client-id', 'skip'), "
                             "got 'group'"),
])
def test_policy_rejects(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        QuotaPolicy(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_policy_from_yaml_and_json_files(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("percentile: 0.99\nheadroom: 2\ncapacity:\n  producer_byte_rate: 1000\n"
                                     "keys: [producer_byte_rate]\n")
    expected = QuotaPolicy(percentile=0.99, headroom=2, capacity={"producer_byte_rate": 1000},
                           keys=("producer_byte_rate",))
    assert QuotaPolicy.from_file(tmp_path / "p.yaml") == expected
    (tmp_path / "p.json").write_text(json.dumps(expected.to_dict()))
    assert QuotaPolicy.from_file(tmp_path / "p.json") == expected
    (tmp_path / "bad.json").write_text('{"percentle": 0.9}')
    with pytest.raises(PolicyError, match=r"unknown policy settings \['percentle'\]"):
        QuotaPolicy.from_file(tmp_path / "bad.json")


@pytest.mark.parametrize(("p", "label"), [(0.95, "p95"), (0.5, "p50"), (0.999, "p99.9"), (1.0, "max")])
def test_percentile_label(p: float, label: str) -> None:
    assert QuotaPolicy(percentile=p).percentile_label == label


@pytest.mark.parametrize(("text", "rate"), [
    ("1048576", 1048576.0), ("512KiB", 524288.0), ("10MB", 10e6), ("1.5 GiB/s", 1.5 * 1024**3),
    ("2k", 2000.0)])
def test_parse_byte_rate(text: str, rate: float) -> None:
    assert parse_byte_rate(text) == rate


@pytest.mark.parametrize("text", ["", "MB", "10 parsecs", "1.2.3MB"])
def test_parse_byte_rate_rejects(text: str) -> None:
    with pytest.raises(PolicyError, match="bad byte rate"):
        parse_byte_rate(text)


# ------------------------------------------------------------------------------ plans

def _entry(entity: str, current: float | None, recommended: int, action: str,
           matched: str | None = None, key: str = "producer_byte_rate") -> PlanEntry:
    return PlanEntry(entity, key, matched, current, recommended, action, f"because {entity}")


def test_plan_file_round_trip(tmp_path: Path) -> None:
    rows = [{"entity": "user=a", "quota_key": "producer_byte_rate", "matched_entity": "user=<default>",
             "current": 1000.0, "recommended": 1500, "action": "increase", "reason": "r",
             "p95": float("nan")}]
    path = write_plan(tmp_path / "out", rows, policy={"headroom": 1.5}, inputs={"logs": ["x"]})
    doc = json.loads(path.read_text())
    assert doc["format"] == PLAN_FORMAT and doc["entries"][0]["p95"] is None  # NaN is not JSON
    assert (tmp_path / "out" / "plan.csv").read_text().splitlines()[0] == (
        "entity,quota_key,matched_entity,current,recommended,action,reason,p95")
    plan = read_plan(path)
    assert plan.entries == (PlanEntry("user=a", "producer_byte_rate", "user=<default>", 1000.0, 1500,
                                      "increase", "r"),)
    assert plan.policy == {"headroom": 1.5}


def test_read_plan_rejects_other_files(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"entries": []}')
    with pytest.raises(PlanError, match=r"is not a sluice\.quota-plan/1 file"):
        read_plan(tmp_path / "x.json")
    with pytest.raises(PlanError, match="cannot read plan"):
        read_plan(tmp_path / "missing.json")


def test_diff_applies_skips_and_guards_against_drift() -> None:
    plan = Plan((
        _entry("user=new", None, 5000, "create"),
        _entry("user=inh", 1000.0, 1500, "increase", matched="user=<default>"),
        _entry("user=same", 2000.0, 2000, "keep"),
        _entry("user=done", 2000.0, 3000, "increase"),
        _entry("user=drift", 2000.0, 1000, "decrease"),
        _entry("user=inh", 4000.0, 4200, "increase", matched="user=<default>", key="consumer_byte_rate"),
    ), "now", {})
    live = [QuotaEntry("user=<default>", {"producer_byte_rate": 1000.0, "consumer_byte_rate": 4000.0}),
            QuotaEntry("user=done", {"producer_byte_rate": 3000.0}),
            QuotaEntry("user=drift", {"producer_byte_rate": 2500.0})]
    changes, skipped = diff(plan, live)
    assert changes == [
        Change("user=new", "producer_byte_rate", None, 5000, "create", "because user=new"),
        Change("user=inh", "producer_byte_rate", 1000.0, 1500, "increase", "because user=inh"),
        Change("user=inh", "consumer_byte_rate", 4000.0, 4200, "increase", "because user=inh"),
    ]
    assert skipped == [
        Skipped("user=same", "producer_byte_rate", "action keep"),
        Skipped("user=done", "producer_byte_rate", "already set to the recommended value"),
        Skipped("user=drift", "producer_byte_rate",
                "changed since the plan was made (plan saw 2,000, now 2,500); "
                "re-run recommend or use --force"),
    ]
    assert operations(changes) == {
        "user=new": [QuotaOp("producer_byte_rate", 5000.0)],
        "user=inh": [QuotaOp("producer_byte_rate", 1500.0), QuotaOp("consumer_byte_rate", 4200.0)]}
    forced, _ = diff(plan, live, force=True)
    drift = Change("user=drift", "producer_byte_rate", 2500.0, 1000, "decrease", "because user=drift")
    assert drift in forced


def test_format_changes() -> None:
    text = format_changes([Change("user=a", "producer_byte_rate", 1000.0, 1500, "increase", "p95 ..."),
                           Change("user=bb", "consumer_byte_rate", None, 10, "create", "new")],
                          [Skipped("user=c", "producer_byte_rate", "action keep")])
    assert text.splitlines() == [
        "ENTITY   QUOTA                          NOW             NEW  CHANGE",
        "user=a   producer_byte_rate           1,000           1,500  increase +50%",
        "         why: p95 ...",
        "user=bb  consumer_byte_rate            none              10  create",
        "         why: new",
        "skipped user=c producer_byte_rate: action keep",
    ]
    assert format_changes([], []) == "no changes"
