"""PNG plots for people, drawn from small collected results with matplotlib's Agg backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _human(rate: float, _pos: object = None) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(rate) >= size:
            return f"{rate / size:.3g} {unit}"
    return f"{rate:.3g} B/s"


def plot_timeline(rows: Sequence[Mapping[str, Any]], path: Path, *, bucket_s: int) -> Path:
    """One panel per quota key, one line per entity: mean bytes/s per bucket (all instances)."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    keys = sorted({r["quota_key"] for r in rows}) or ["(no traffic)"]
    fig, axes = plt.subplots(len(keys), 1, figsize=(11, 3.2 * len(keys)), squeeze=False, sharex=True)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r["quota_key"] == key:
                series.setdefault(r["entity"], []).append((r["bucket_start_s"], r["rate"]))
        if not series:
            ax.text(0.5, 0.5, "no traffic", ha="center", va="center", transform=ax.transAxes)
        t0 = min((p[0] for pts in series.values() for p in pts), default=0)
        for entity, points in sorted(series.items()):
            points.sort()
            ax.plot([(t - t0) / 60 for t, _ in points], [v for _, v in points], label=entity, linewidth=1.2)
        ax.set_title(f"{key} ({bucket_s}s buckets)")
        ax.yaxis.set_major_formatter(FuncFormatter(_human))
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("minutes from the start of the window")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_top_talkers(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Horizontal bars: produce and fetch bytes per client, biggest first."""
    plt = _pyplot()
    labels = [f"{r['principal']} / {'(null)' if r['client_id'] is None else r['client_id']}" for r in rows]
    produce = [r["produce_bytes"] / 1e6 for r in rows]
    fetch = [r["fetch_bytes"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(len(rows), 2) + 1.2))
    y = list(range(len(rows)))
    ax.barh(y, produce, label="produce", color="#4C72B0")
    ax.barh(y, fetch, left=produce, label="fetch", color="#DD8452")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("MB in the window")
    ax.set_title("Top talkers (principal / client-id)")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_plan(rows: Sequence[Mapping[str, Any]], path: Path, *, percentile_label: str) -> Path:
    """Per (entity, key): measured percentile rate, current quota and recommended quota."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    labels = [f"{r['entity']}\n{r['quota_key']}" for r in rows]
    measured = [r["rate_at_percentile"] or 0.0 for r in rows]
    current = [r["current"] or 0.0 for r in rows]
    recommended = [float(r["recommended"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows) + 2), 4.5))
    x = list(range(len(rows)))
    width = 0.27
    ax.bar([i - width for i in x], measured, width, label=f"{percentile_label} rate", color="#8C8C8C")
    ax.bar(x, current, width, label="current quota (no bar: none)", color="#4C72B0")
    ax.bar([i + width for i in x], recommended, width, label="recommended", color="#55A868")
    for i, r in enumerate(rows):
        ax.annotate(r["action"], (i + width, recommended[i]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=7, rotation=30, ha="right")
    if max(measured + current + recommended, default=0) > 0:
        ax.set_yscale("log")  # quotas of very different sizes side by side; a missing quota draws no bar
    ax.yaxis.set_major_formatter(FuncFormatter(_human))
    ax.set_title("Quota plan (log scale)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_simulation(points: Sequence[Sequence[float]], path: Path, *, title: str,
                    censored: bool = False) -> Path:
    """One sharing group's replay, per whole second (every second of the span; a second with
    nothing is 0): the demand, what the baseline and the plan admitted (top), and the share of
    the second its clients spent muted under each (bottom, 0 to 1). `points` rows are [second,
    demand, admitted under the plan, admitted under the baseline, plan muted ms, baseline muted
    ms]. Steps, not lines: a value holds for its whole second. Under Kafka's windowed rate a
    client idle (or its burst's samples expired) for a whole window is admitted up to
    (samples - 1) x window of quota at once, so a second far above the quota is expected there."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    t0 = points[0][0] if points else 0
    x = [p[0] - t0 for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, height_ratios=(2, 1))
    step: dict[str, Any] = {"where": "post", "linewidth": 1.2}
    top.step(x, [p[1] for p in points], label="demand (recorded)", color="#8C8C8C", **step)
    top.step(x, [p[3] for p in points], label="admitted, baseline", color="#4C72B0", **step)
    top.step(x, [p[2] for p in points], label="admitted, plan", color="#55A868", **step)
    top.yaxis.set_major_formatter(FuncFormatter(_human))
    top.set_title(title + (" (censored: demand is a lower bound)" if censored else ""))
    top.legend(fontsize=8, loc="upper right")
    top.grid(alpha=0.3)
    bottom.step(x, [p[5] / 1000 for p in points], label="muted, baseline", color="#4C72B0", where="post",
                linewidth=1)
    bottom.step(x, [p[4] / 1000 for p in points], label="muted, plan", color="#C44E52", where="post",
                linewidth=1)
    bottom.set_ylabel("share of the second muted")
    bottom.set_ylim(-0.05, 1.05)
    bottom.set_xlabel("seconds from the first request")
    bottom.legend(fontsize=8, loc="upper right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
