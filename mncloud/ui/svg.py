"""Charts drawn on the server as SVG: a run's timeline and its goodput breakdown.

Every text that reaches the SVG passes through `markupsafe.escape`; the result is `Markup`, so
the templates (autoescape on) insert it as it is. Nothing is fetched: no script, no font.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from mncloud.records.goodput import part_label
from mncloud.ui.views import Timeline

WIDTH = 900
LEFT, RIGHT = 10, 10
SPOT, ON_DEMAND, UNKNOWN = "#3b82f6", "#f59e0b", "#9ca3af"
#: A colour per goodput part (records/goodput.py PARTS).
PART_COLOURS = {
    "useful": "#16a34a",
    "redone": "#dc2626",
    "unsaved": "#f97316",
    "startup": "#c4b5fd",
    "recovery": "#8b5cf6",
    "checkpoint_stall": "#0ea5e9",
    "waiting": "#a3a3a3",
    "idle": "#facc15",
    "unknown": "#6b7280",
}


def _market_colour(spot: bool | None) -> str:
    return UNKNOWN if spot is None else SPOT if spot else ON_DEMAND


def _market_word(spot: bool | None) -> str:
    return "market unknown" if spot is None else "spot" if spot else "on-demand"


def _svg(height: int, body: list[str], label: str) -> Markup:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="{escape(label)}" '
        'font-family="sans-serif" font-size="11">'
    )
    return Markup(head + "".join(body) + "</svg>")


def timeline_svg(timeline: Timeline) -> Markup:
    """One bar per launch, coloured by market; preemptions and switches as marks (a line and
    a label), checkpoint steps as ticks (complete: solid, incomplete: hollow), the deadline
    as a dashed line."""
    start = timeline.start
    span = max(timeline.end - start, 1e-9)
    scale = (WIDTH - LEFT - RIGHT) / span

    def x(t: float) -> float:
        return round(LEFT + (min(max(t, start), timeline.end) - start) * scale, 2)

    body: list[str] = [f'<line x1="{LEFT}" y1="60" x2="{WIDTH - RIGHT}" y2="60" stroke="#d1d5db"/>']
    for i, bar in enumerate(timeline.bars):
        x0, x1 = x(bar.start), x(bar.end)
        title = f"launch {i + 1} ({bar.kind}, {_market_word(bar.spot)}): {bar.detail}"
        body.append(
            f'<rect class="launch" data-market="{_market_word(bar.spot)}" x="{x0}" y="40" '
            f'width="{max(x1 - x0, 1.0):.2f}" height="20" fill="{_market_colour(bar.spot)}" '
            f'stroke="#fff"><title>{escape(title)}</title></rect>'
        )
    for mark in timeline.marks:
        colour = "#dc2626" if mark.kind == "preemption" else "#111827"
        mx = x(mark.time)
        body.append(
            f'<g class="mark {escape(mark.kind)}"><line x1="{mx}" y1="22" x2="{mx}" y2="66" '
            f'stroke="{colour}" stroke-width="2"/><text x="{mx + 2}" y="20" fill="{colour}">'
            f"{escape(mark.label)}</text><title>{escape(mark.label)}</title></g>"
        )
    for tick in timeline.ticks:
        tx = x(tick.time)
        fill = "#111827" if tick.complete else "none"
        state = "complete" if tick.complete else "incomplete"
        body.append(
            f'<rect class="tick {state}" x="{tx - 2}" y="66" width="4" height="8" '
            f'fill="{fill}" stroke="#111827"><title>step {tick.step} ({state})</title></rect>'
        )
    if timeline.deadline is not None:
        dx = x(timeline.deadline)
        body.append(
            f'<g class="deadline"><line x1="{dx}" y1="10" x2="{dx}" y2="80" stroke="#111827" '
            f'stroke-dasharray="4 3"/><text x="{dx - 4}" y="92" text-anchor="end">deadline'
            "</text></g>"
        )
    body.append(
        f'<text x="{LEFT}" y="92">{escape(timeline.start_label)}</text>'
        f'<text x="{WIDTH - RIGHT}" y="92" text-anchor="end">{escape(timeline.end_label)}</text>'
    )
    return _svg(100, body, "timeline of the run's launches")


def breakdown_svg(parts: dict[str, float], total: float, unit: str = "node-s") -> Markup:
    """A horizontal bar per part (its share of `total`), with its value and percentage."""
    shown = [(name, value) for name, value in parts.items() if value > 0]
    height = 24 * max(len(shown), 1) + 8
    body: list[str] = []
    if not shown:
        body.append('<text x="10" y="20">nothing billed yet</text>')
    for row, (name, value) in enumerate(shown):
        y = 4 + 24 * row
        share = value / total if total > 0 else 0.0
        width = round(max(share, 0.0) * (WIDTH - 360), 2)
        colour = PART_COLOURS.get(name, "#6b7280")
        label = f"{value:,.1f} {unit} ({share:.1%})"
        body.append(
            f'<g class="part" data-part="{escape(name)}" data-value="{value!r}">'
            f'<text x="10" y="{y + 14}">{escape(part_label(name))}</text>'
            f'<rect x="140" y="{y}" width="{width}" height="18" fill="{colour}"/>'
            f'<text x="{146 + width}" y="{y + 14}">{escape(label)}</text></g>'
        )
    return _svg(height, body, "goodput breakdown")
