"""The quota plan file (what `recommend` writes and `apply` reads), and the diff against live quotas.

Pure Python: `apply` needs no Spark. A plan is JSON:

    {"format": "sluice.quota-plan/1", "generated_at": "...", "policy": {...}, "input": {...},
     "entries": [{"entity": "user=alice", "quota_key": "producer_byte_rate", "matched_entity": ...,
                  "current": 1048576.0, "recommended": 1572864, "action": "increase",
                  "reason": "p95 ...", ...stats...}, ...]}
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_analytics.kafka_quota_client import QuotaEntry, QuotaOp

PLAN_FORMAT = "sluice.quota-plan/1"
CHANGING_ACTIONS = ("create", "increase", "decrease")


class PlanError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class PlanEntry:
    entity: str
    quota_key: str
    matched_entity: str | None
    current: float | None
    recommended: int
    action: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    generated_at: str
    policy: Mapping[str, Any]


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_plan(out_dir: Path, rows: Sequence[Mapping[str, Any]], *, policy: Mapping[str, Any],
               inputs: Mapping[str, Any]) -> Path:
    """plan.json (for apply and people) and plan.csv (for spreadsheets) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = [{k: _clean(v) for k, v in row.items()} for row in rows]
    doc = {"format": PLAN_FORMAT,
           "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "policy": dict(policy), "input": dict(inputs), "entries": entries}
    path = out_dir / "plan.json"
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    write_csv(out_dir / "plan.csv", entries)
    return path


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_plan(path: Path) -> Plan:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read plan {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{path} is not a {PLAN_FORMAT} file")
    try:
        entries = tuple(PlanEntry(e["entity"], e["quota_key"], e.get("matched_entity"), e["current"],
                                  int(e["recommended"]), e["action"], e.get("reason", ""))
                        for e in doc["entries"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{path}: bad entry: {exc}") from exc
    return Plan(entries, str(doc.get("generated_at", "")), doc.get("policy", {}))


def read_simulation(path: Path) -> dict[str, Any] | None:
    """The simulation of the plan at `path`: the one `recommend --verify` put in the plan file, else
    the simulation.json `simulate` wrote beside it for this plan; None when there is none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read plan {path}: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("simulation"), dict):
        return dict(doc["simulation"])
    beside = path.parent / "simulation.json"
    if not beside.exists():
        return None
    try:
        sim = json.loads(beside.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read {beside}: {exc}") from exc
    if not isinstance(sim, dict) or Path(str(sim.get("plan", ""))).resolve() != path.resolve():
        return None
    return sim


# ------------------------------------------------------------------------------------ diff

@dataclass(frozen=True, slots=True)
class Change:
    entity: str
    quota_key: str
    live: float | None  # the value in force now for this entity (own or inherited)
    new: int
    action: str
    reason: str


@dataclass(frozen=True, slots=True)
class Skipped:
    entity: str
    quota_key: str
    why: str


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-6 * max(1.0, abs(a))


def diff(plan: Plan, live: Sequence[QuotaEntry], *,
         force: bool = False) -> tuple[list[Change], list[Skipped]]:
    """What applying `plan` would change, given the quotas configured now.

    An entry is skipped when its action is `keep`, when the entity already has the recommended
    value, or — unless `force` — when the value in force differs from the one the plan was made
    from (someone changed it meanwhile; re-run the recommendation).
    """
    values = {e.entity: e.values for e in live}
    changes: list[Change] = []
    skipped: list[Skipped] = []
    for e in plan.entries:
        own = values.get(e.entity, {}).get(e.quota_key)
        inherited = values.get(e.matched_entity or "", {}).get(e.quota_key)
        in_force = own if own is not None else inherited
        if e.action not in CHANGING_ACTIONS:
            skipped.append(Skipped(e.entity, e.quota_key, f"action {e.action}"))
        elif _same(own, float(e.recommended)):
            skipped.append(Skipped(e.entity, e.quota_key, "already set to the recommended value"))
        elif not force and not _same(in_force, e.current):
            skipped.append(Skipped(e.entity, e.quota_key,
                                   f"changed since the plan was made (plan saw {_fmt(e.current)}, "
                                   f"now {_fmt(in_force)}); re-run recommend or use --force"))
        else:
            changes.append(Change(e.entity, e.quota_key, in_force, e.recommended, e.action, e.reason))
    return changes, skipped


def operations(changes: Sequence[Change]) -> dict[str, list[QuotaOp]]:
    ops: dict[str, list[QuotaOp]] = {}
    for c in changes:
        ops.setdefault(c.entity, []).append(QuotaOp(c.quota_key, float(c.new)))
    return ops


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:,.0f}"


def format_changes(changes: Sequence[Change], skipped: Sequence[Skipped]) -> str:
    """A table for people: one line per change, then the skipped entries."""
    lines = []
    if changes:
        width = max(len(c.entity) for c in changes)
        lines.append(f"{'ENTITY':<{width}}  {'QUOTA':<18}  {'NOW':>14}  {'NEW':>14}  CHANGE")
        for c in changes:
            pct = f"{(c.new - c.live) / c.live:+.0%}" if c.live else ""
            lines.append(f"{c.entity:<{width}}  {c.quota_key:<18}  {_fmt(c.live):>14}  {_fmt(c.new):>14}  "
                         f"{c.action} {pct}".rstrip())
            lines.append(f"{'':<{width}}  why: {c.reason}")
    else:
        lines.append("no changes")
    lines += [f"skipped {s.entity} {s.quota_key}: {s.why}" for s in skipped]
    return "\n".join(lines)
