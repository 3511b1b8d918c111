"""The figures: goodput against scale per strategy, goodput against the storage checkpoint
interval, and where the time went at the largest scale. PNG files, drawn with matplotlib's
non-interactive backend (no display needed)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlrover.master.goodput import BUCKETS

from .results import STOPPED, STRAGGLING, Result

__all__ = ["plot_breakdown", "plot_interval", "plot_scale"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _goodput_lines(
    points: Sequence[tuple[float, Result]], path: Path, title: str, xlabel: str, log_base: float
) -> Path:
    """Goodput (%) against the x of each (x, result) on a log axis, one line per strategy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.strategy for _, r in points):
        mine = sorted(((x, r) for x, r in points if r.strategy == name), key=lambda point: point[0])
        ax.plot([x for x, _ in mine], [100 * r.goodput for _, r in mine], marker="o", label=name)
    ax.set_xscale("log", base=log_base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_scale(results: Sequence[Result], path: Path, title: str) -> Path:
    """Goodput (%) against accelerators (log scale), one line per strategy."""
    return _goodput_lines([(r.accelerators, r) for r in results], path, title, "accelerators", 2)


def plot_interval(points: Sequence[tuple[float, Result]], path: Path, title: str) -> Path:
    """Goodput (%) against the storage checkpoint interval (minutes), one line per strategy."""
    return _goodput_lines(points, path, title, "storage checkpoint interval (minutes)", 10)


def plot_breakdown(results: Sequence[Result], path: Path, title: str) -> Path:
    """Where the lost time went (% of the run), stacked by bucket, one horizontal bar per strategy."""
    plt = _pyplot()
    buckets = [b for b in (*BUCKETS, STRAGGLING, STOPPED) if any(r.buckets.get(b, 0.0) > 0 for r in results)]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.9 * len(results)))
    names = [textwrap.fill(r.strategy, 28) for r in results]
    lefts = [0.0] * len(results)
    for bucket in buckets:
        shares = [100 * r.buckets.get(bucket, 0.0) / (r.days * 86400.0) for r in results]
        ax.barh(names, shares, left=lefts, label=bucket)
        lefts = [b + s for b, s in zip(lefts, shares, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("time lost (% of the run)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
