"""A job's timeline as an SVG picture: nodes against time, with steps, failures, restarts,
resizes and checkpoints, the goodput breakdown as a bar below, and goodput in the title.

Drawn from events (the event log read back, or a running master's events): nothing but the
standard library. Every mark carries a ``class`` naming what it is (``node``, ``train``,
``step``, ``failure``, ``restart``, ``resize``, ``checkpoint``, ``bucket``) and a ``<title>``
that a browser shows on hover. A failure the master let wait for its cause is a hollow dot
(``failure awaiting``), followed by a filled one where it was charged in the end or a small grey
one (``failure excused``) where a peer's failure explained it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from dlrover.master.goodput import (
    FAILURE_EVENT,
    RESIZE_EVENT,
    STEPS_EVENT,
    AttemptReport,
    GoodputAccountant,
    GoodputBreakdown,
)

__all__ = ["render_timeline"]

_WIDTH = 1000
_LEFT = 110
_RIGHT = 20
_TOP = 50
_ROW = 28
_COLORS = {
    "useful": "#2e7d32",
    "startup": "#9e9e9e",
    "failure_detection": "#c62828",
    "restart": "#ef6c00",
    "rendezvous": "#6a1b9a",
    "checkpoint_load": "#1565c0",
    "steps_redone": "#f9a825",
    "checkpoint_save": "#42a5f5",
    "resize": "#00838f",
    "shutdown": "#bdbdbd",
    "in_progress": "#e0e0e0",
}
_RESTART_KINDS = frozenset({"process_restart", "consequence_restart", "relaunch"})
# A failure that waited for its cause ends charged or excused (see the master's lifecycle).
_CHARGED_EVENT = "failure_charged"
_EXCUSED_EVENT = "failure_excused"


def _awaits_its_cause(event: Mapping[str, Any]) -> bool:
    data = event.get("data")
    return isinstance(data, Mapping) and data.get("charge") == "awaiting_cause"


def _attr(**values: Any) -> str:
    return " ".join(f"{k.rstrip('_').replace('_', '-')}={quoteattr(str(v))}" for k, v in values.items())


class _Canvas:
    """Maps time and nodes to coordinates and collects the SVG elements."""

    def __init__(self, t0: float, t_end: float, nodes: Sequence[int]) -> None:
        self.t0, self.t_end = t0, t_end
        self.span = max(t_end - t0, 1e-9)
        self.rows = {n: i for i, n in enumerate(nodes)}
        self.plot_w = _WIDTH - _LEFT - _RIGHT
        self.rows_h = max(len(nodes), 1) * _ROW
        self.height = _TOP + self.rows_h + 120
        self.out: list[str] = []

    def x(self, t: float) -> float:
        return round(_LEFT + (min(max(t, self.t0), self.t_end) - self.t0) / self.span * self.plot_w, 2)

    def y(self, node: Any) -> float:
        return _TOP + (self.rows.get(int(node), 0) if node is not None else 0) * _ROW

    def add(self, element: str) -> None:
        self.out.append(element)


def _nodes(events: Sequence[Mapping[str, Any]]) -> list[int]:
    named = {int(e["node_id"]) for e in events if e.get("node_id") is not None}
    for e in events:
        if e.get("kind") == STEPS_EVENT:
            named |= {int(a["node_id"]) for a in (e.get("data") or {}).get("attempts", [])}
    return sorted(named)


def _draw_rows(c: _Canvas) -> None:
    for node, row in c.rows.items():
        yy = _TOP + row * _ROW
        band = _attr(x=_LEFT, y=yy + 4, width=c.plot_w, height=_ROW - 8)
        c.add(
            f'<g {_attr(class_="node", data_node=node)}><rect {band} fill="#f5f5f5"/>'
            f"<text {_attr(x=8, y=yy + _ROW / 2 + 4, font_size=12)}>node {node}</text></g>"
        )


def _draw_steps(c: _Canvas, events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each attempt's training span and a tick per step mark, on its node's row."""
    chains: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    ready: dict[tuple[int, int], float] = {}
    for event in events:
        if event.get("kind") != STEPS_EVENT:
            continue
        for raw in (event.get("data") or {}).get("attempts", []):
            report = AttemptReport.from_dict(raw)
            key = (report.node_id, report.attempt)
            if report.ready_time is not None:
                ready.setdefault(key, report.ready_time)
            chain = chains.setdefault(key, [])
            for mark in report.marks:
                start = chain[-1][1] if chain else ready.get(key, mark.end_time)
                chain.append((start, mark.end_time, mark.step))
    for (node, attempt), chain in sorted(chains.items()):
        if not chain:
            continue
        yy = c.y(node)
        first, last = c.x(chain[0][0]), c.x(chain[-1][1])
        tip = escape(f"node {node} attempt {attempt}: steps {chain[0][2]}..{chain[-1][2]}")
        span = _attr(class_="train", x=first, y=yy + 8, width=max(last - first, 1), height=_ROW - 16)
        c.add(f'<rect {span} fill="#a5d6a7"><title>{tip}</title></rect>')
        for _start, end, step in chain:
            tick = _attr(class_="step", x1=c.x(end), x2=c.x(end), y1=yy + 8, y2=yy + _ROW - 8, data_step=step)
            c.add(f'<line {tick} stroke="#1b5e20" stroke-width="1"><title>step {step}</title></line>')
    return sorted(chain[0][0] for chain in chains.values() if chain)


def _draw_resizes(c: _Canvas, events: Sequence[Mapping[str, Any]], chain_starts: Sequence[float]) -> None:
    """Resize windows shade every row: from the resize until training resumes (the first stretch of
    steps that starts after it), as the goodput accounting counts them."""
    for event in events:
        if event.get("kind") != RESIZE_EVENT:
            continue
        began = float(event["wall_time"])
        ended = min((t for t in chain_starts if t > began), default=c.t_end)
        tip = str(event.get("message", "")) or "resize"
        box = _attr(class_="resize", x=c.x(began), y=_TOP, width=max(c.x(ended) - c.x(began), 1), height=c.rows_h)
        c.add(f'<rect {box} fill="#00838f" fill-opacity="0.2"><title>{escape(tip)}</title></rect>')


def _draw_points(c: _Canvas, events: Sequence[Mapping[str, Any]]) -> None:
    """Failures, restarts and checkpoints where and when they happened."""
    for event in events:
        kind, t = event.get("kind"), float(event["wall_time"])
        message = escape(str(event.get("message", "")))
        if kind == FAILURE_EVENT and _awaits_its_cause(event):
            # Not charged yet: the workers restarted while the master waits for a peer's failure
            # that explains it; a later mark says which way it went.
            dot = _attr(class_="failure awaiting", cx=c.x(t), cy=c.y(event.get("node_id")) + _ROW / 2, r=6)
            c.add(f'<circle {dot} fill="none" stroke="#c62828" stroke-width="2"><title>{message}</title></circle>')
        elif kind in (FAILURE_EVENT, _CHARGED_EVENT):
            dot = _attr(class_="failure", cx=c.x(t), cy=c.y(event.get("node_id")) + _ROW / 2, r=6)
            c.add(f'<circle {dot} fill="#c62828"><title>{message}</title></circle>')
        elif kind == _EXCUSED_EVENT:
            dot = _attr(class_="failure excused", cx=c.x(t), cy=c.y(event.get("node_id")) + _ROW / 2, r=4)
            c.add(f'<circle {dot} fill="#9e9e9e"><title>{message}</title></circle>')
        elif kind in _RESTART_KINDS:
            xx, yy = c.x(t), c.y(event.get("node_id"))
            points = f"{xx},{yy + 4} {xx - 5},{yy + _ROW - 4} {xx + 5},{yy + _ROW - 4}"
            c.add(
                f'<polygon {_attr(class_="restart", points=points)} fill="#ef6c00"><title>{message}</title></polygon>'
            )
        elif kind == "checkpoint":
            xx = c.x(t)
            points = f"{xx},{_TOP - 14} {xx - 5},{_TOP - 8} {xx},{_TOP - 2} {xx + 5},{_TOP - 8}"
            data = json.dumps(event.get("data") or {}, sort_keys=True)
            diamond = _attr(class_="checkpoint", points=points, data_checkpoint=data)
            c.add(f'<polygon {diamond} fill="#1565c0"><title>{message}</title></polygon>')


def _draw_axis_and_bar(c: _Canvas, breakdown: GoodputBreakdown) -> None:
    axis_y = _TOP + c.rows_h + 16
    c.add(f'<line {_attr(x1=_LEFT, x2=_LEFT + c.plot_w, y1=axis_y, y2=axis_y)} stroke="#000"/>')
    for i in range(6):
        t = c.t0 + c.span * i / 5
        c.add(f"<text {_attr(x=c.x(t), y=axis_y + 14, font_size=10, class_='tick')}>{t - c.t0:.0f} s</text>")
    bar_y = axis_y + 30
    parts = [(b, s) for b, s in (("useful", breakdown.useful_s), *breakdown.buckets.items()) if s > 0]
    cursor = float(_LEFT)
    for bucket, seconds in parts if breakdown.elapsed_s > 0 else []:
        width = seconds / breakdown.elapsed_s * c.plot_w
        tip = escape(f"{bucket}: {seconds:.1f} s ({seconds / breakdown.elapsed_s:.1%})")
        box = _attr(class_="bucket", data_bucket=bucket, x=round(cursor, 2), y=bar_y, width=round(width, 2), height=16)
        c.add(f"<rect {box} fill={quoteattr(_COLORS[bucket])}><title>{tip}</title></rect>")
        cursor += width
    legend_y, lx = bar_y + 34, float(_LEFT)
    for bucket, seconds in parts:
        label = f"{bucket} {seconds:.1f}s"
        c.add(f"<rect {_attr(x=lx, y=legend_y - 9, width=10, height=10)} fill={quoteattr(_COLORS[bucket])}/>")
        c.add(f"<text {_attr(x=lx + 13, y=legend_y, font_size=10)}>{escape(label)}</text>")
        lx += 18 + 6 * len(label)


def render_timeline(events: Iterable[Mapping[str, Any]], *, title: str = "", now_wall: float | None = None) -> str:
    """The SVG text of a job's timeline.

    Args:
        events: the job's events, oldest first (`read_event_log`'s dicts or the journal's).
        title: the job's name for the title.
        now_wall: the end of a running job's timeline (the newest event when None).

    Raises:
        GoodputInputError: a `steps` event cannot be parsed.
    """
    events = list(events)
    accountant = GoodputAccountant()
    for event in events:
        accountant.add_event(event)
    breakdown = accountant.breakdown(now_wall)
    times = [float(e["wall_time"]) for e in events]
    t0 = next((float(e["wall_time"]) for e in events if e.get("kind") == "job_start"), min(times, default=0.0))
    t_end = t0 + breakdown.elapsed_s if breakdown.elapsed_s > 0 else max(times, default=t0)
    c = _Canvas(t0, t_end, _nodes(events))
    heading = (
        f"{title + ': ' if title else ''}goodput {breakdown.ratio:.1%} of {breakdown.elapsed_s:.1f} s "
        f"(useful {breakdown.useful_s:.1f} s)"
    )
    c.add(f'<svg xmlns="http://www.w3.org/2000/svg" {_attr(width=_WIDTH, height=c.height)} font-family="sans-serif">')
    c.add(f"<title>{escape(heading)}</title>")
    c.add(f"<text {_attr(x=_LEFT, y=24, font_size=16, class_='heading')}>{escape(heading)}</text>")
    _draw_rows(c)
    chain_starts = _draw_steps(c, events)
    _draw_resizes(c, events, chain_starts)
    _draw_points(c, events)
    _draw_axis_and_bar(c, breakdown)
    c.add("</svg>")
    return "\n".join(c.out) + "\n"
